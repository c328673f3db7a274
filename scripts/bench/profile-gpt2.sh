#!/usr/bin/env bash
# Where the GPT-2 step's time goes, duet and PyTorch in one call on the GPU machine (issue 30):
# kernel time by kernel name for duet bench (bf16 and fp8, B 32, T 1024, vocab 50257) under
# Nsight Systems (graph nodes traced one by one) or, without nsys, Nsight Compute with graphs
# off; and torch.profiler's kernel table for PyTorch's torch.compile bf16 run of the same model.
#   [PRECISIONS="bf16 fp8"] bash scripts/bench/profile-gpt2.sh OUT_DIR DUET_BINARY [TORCH_REF_PY]
# Writes OUT_DIR/duet-<precision>-kernels.txt (per-step microseconds by kernel, largest first,
# with a category total: GEMM, attention, LayerNorm, classifier, optimizer, other) and
# OUT_DIR/torch-profile.txt. Under nsys: 2 warm-up + 3 timed steps, per-step figures are totals
# / 5. Under ncu (kernels in launch order): the second step, from its embedding_forward launch
# to the next one (the bench's GEMM-ceiling kernels at the end are left out).
set -uo pipefail
OUT=$1 DUET=$2 TORCH_REF=${3:-}
mkdir -p "$OUT"
PRESET=(--preset gpt2 --vocab 50257)
summarise() { # csv-file steps label
    python3 - "$@" <<'PY'
import csv, sys, collections, re
path, steps, label = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [r for r in csv.reader(open(path)) if r]
# nsys cuda_gpu_kern_sum: "Total Time (ns)" and "Name"; ncu: "Kernel Name", "Metric Value", "Metric Unit".
hi = next(i for i, r in enumerate(rows) if "Name" in r or "Kernel Name" in r)
h = rows[hi]
body = [r for r in rows[hi + 1:] if len(r) >= len(h)]
if "Kernel Name" in h:
    # ncu: one row per launch, in launch order; keep one whole step (the second).
    ki = h.index("Kernel Name")
    starts = [i for i, r in enumerate(body) if r[ki].startswith("embedding_forward")]
    if len(starts) < 3:
        sys.exit(f"{path}: {len(starts)} embedding_forward launches, need 3 (steps) to cut one out")
    body = body[starts[1]:starts[2]]
    steps = 1.0
tot = collections.Counter(); cnt = collections.Counter()
for r in body:
    if "Total Time (ns)" in h:
        name = r[h.index("Name")]; us = float(r[h.index("Total Time (ns)")].replace(",", "")) / 1e3
        n = int(r[h.index("Instances")].replace(",", ""))
    else:
        name = r[h.index("Kernel Name")]; unit = r[h.index("Metric Unit")]
        us = float(r[h.index("Metric Value")].replace(",", "")) * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        n = 1
    k = name.split("(")[0][:80]; tot[k] += us; cnt[k] += n
def cat(k):
    l = k.lower()
    if re.search(r"gemm|cutlass|sm90_|sm80_|nvjet|xmma|cublas", l): return "GEMM"
    if "attention" in l or "flash" in l or "softmax" in l and "cross" not in l: return "attention"
    if "layernorm" in l or "layer_norm" in l: return "LayerNorm"
    if "cross_entropy" in l or "classifier" in l: return "classifier"
    if "adamw" in l or "norm_sq" in l or "multi_tensor" in l or "grad_norm" in l: return "optimizer"
    if "embed" in l or "encoder" in l: return "embedding"
    if "fp8" in l or "quant" in l or "amax" in l or "cast" in l: return "fp8 casts"
    return "other"
s = sum(tot.values()) / steps
cats = collections.Counter()
for k, v in tot.items(): cats[cat(k)] += v / steps
print(f"# {label}: {sum(cnt.values())/steps:.0f} kernels and {s/1e3:.2f} ms of kernel time per step")
for c, v in cats.most_common(): print(f"{c:>12} {v/1e3:8.2f} ms  {100*v/s:5.1f}%")
print("# by kernel (us per step, launches per step)")
for k, v in tot.most_common(40): print(f"{v/steps:10.1f} {cnt[k]/steps:6.1f}  {k}")
PY
}
for prec in ${PRECISIONS:-bf16 fp8}; do
    if command -v nsys >/dev/null; then
        timeout 240 nsys profile --cuda-graph-trace=node --trace=cuda -o "$OUT/duet-$prec" -f true \
            "$DUET" bench --backend cuda "${PRESET[@]}" --precision $prec --warmup-steps 2 --iters 3 \
            >"$OUT/duet-$prec.log" 2>&1
        nsys stats --report cuda_gpu_kern_sum --format csv -o "$OUT/duet-$prec" "$OUT/duet-$prec.nsys-rep" >/dev/null 2>&1
        csv=$(ls "$OUT"/duet-$prec*kern_sum*.csv | head -1); steps=5
    else
        timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            "$DUET" bench --backend cuda "${PRESET[@]}" --precision $prec --no-graphs --warmup-steps 1 --iters 1 \
            >"$OUT/duet-$prec.csv" 2>"$OUT/duet-$prec.log"
        csv="$OUT/duet-$prec.csv"; steps=1
    fi
    grep -A3 "precision  ms/step" "$OUT/duet-$prec.log"
    summarise "$csv" $steps "duet $prec" | tee "$OUT/duet-$prec-kernels.txt"
done
if [ -n "$TORCH_REF" ]; then
    python3 "$TORCH_REF" --preset gpt2 --modes compile-bf16 --warmup 8 --iters 5 \
        --profile "$OUT/torch-profile.txt" >"$OUT/torch.jsonl" 2>"$OUT/torch.err" || tail -5 "$OUT/torch.err"
    head -60 "$OUT/torch-profile.txt"
fi
