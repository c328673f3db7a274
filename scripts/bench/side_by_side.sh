#!/usr/bin/env bash
# duet bench and the PyTorch reference (scripts/bench/torch_ref.py) side by side, in ONE call on
# the GPU machine. Prepare here with `bash scripts/bench/side_by_side.sh --pack` (builds the duet
# binary into .carry-bench/, git-ignored through .git/info/exclude; the torchao wheel must be in
# .whl/, see scripts/bench/README.md), then with the device tool:
#   run(command="bash .carry-bench/side_by_side.sh", carry=[".carry-bench", ".whl"])
# Results: $OUT/duet-<preset>.json, $OUT/torch-<preset>.jsonl, $OUT/table.md (also printed last).
# PRESETS may name the GPT-2 presets (gpt2, gpt2-medium, ...): there duet runs once per precision
# (duet-<preset>.<precision>.json; the device tool brings back no file name holding an @),
# PyTorch once per mode of TORCH_GPT2_MODES (default eager-bf16, compile-bf16, compile-bf16-ro),
# each in its own process with nvidia-smi's device memory in use sampled
# ($OUT/device-memory-peak-mib.txt, a column of the table). Keep $OUT to a few dozen files: the
# device tool brings back only so many.
# Environment: PRESETS (default "seed large"), TORCH_SEED_MODES / TORCH_LARGE_MODES (comma
# lists of torch_ref.py modes), DUET_ITERS (default 20), TORCH_ITERS (default 30),
# DUET_PRECISIONS (default all; a comma list for duet bench --precision). DUET_VARIANTS adds duet
# runs with extra flags, `;`-separated `preset precision flags...` (e.g. "seed bf16 --keep-gelu"),
# written to duet-<preset>-<flags>.json and labelled with their flags in the table.
# With SAVE_CACHES=1 the compile caches (NVRTC cubins, TorchInductor/Triton) are saved to
# $OUT/caches.tar.gz; copy it to .carry-bench/caches.tar.gz to start the next call warm.
# PROFILE=bf16 adds an ncu kernel-time summary of about one seed step ($OUT/ncu-summary.txt).
# The GPU tests packed into .carry-bench/tests run first (NO_TESTS=1 skips them).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${1:-}" = "--pack" ]; then
    ROOT="$(cd "$HERE/../.." && pwd)"
    cd "$ROOT"
    grep -qx "/.carry-bench/" .git/info/exclude 2>/dev/null || echo /.carry-bench/ >>.git/info/exclude
    cargo build --release --bin duet
    mkdir -p .carry-bench/tests
    cp target/release/duet .carry-bench/duet && strip .carry-bench/duet
    cp scripts/bench/side_by_side.sh scripts/bench/torch_ref.py scripts/bench/table.py .carry-bench/
    # The GPU checks that must pass before the numbers count: the CPU-vs-CUDA training parity
    # and the chunked attention on the GPU.
    for spec in "duet gpu_training" "duet-cuda chunked_attention"; do
        set -- $spec
        bin=$(cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
            python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable"): print(m["executable"])' | tail -1)
        [ -n "$bin" ] && cp "$bin" ".carry-bench/tests/$2" && strip ".carry-bench/tests/$2"
    done
    du -sh .carry-bench .whl 2>/dev/null
    exit 0
fi
OUT="${OUT:-$(mktemp -d)}"
exec > >(tee "$OUT/side_by_side.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.sm --format=csv,noheader
dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
         /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib; do
    [ -d "$d" ] && dirs="$dirs:$d"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export DUET_CUDA_CACHE_DIR=/tmp/caches/duet TORCHINDUCTOR_CACHE_DIR=/tmp/caches/inductor
export PYTHONUNBUFFERED=1
mkdir -p /tmp/caches
[ -f "$HERE/caches.tar.gz" ] && tar -xzf "$HERE/caches.tar.gz" -C /tmp/caches && echo "warm caches restored"
if ls "$HERE"/../.whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$HERE"/../.whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -c 'import torch; print("torch", torch.__version__)'
python3 -c 'import torchao; print("torchao", torchao.__version__)' || echo "torchao missing: fp8 modes will report an error"
if [ -z "${NO_TESTS:-}" ]; then
    for t in "$HERE"/tests/*; do
        [ -x "$t" ] || continue
        echo "== test $(basename "$t")"
        "$t" 2>&1 | grep -E "^test |test result|panicked|SKIP" | tail -15
    done
fi
ITERS="${DUET_ITERS:-20}"
# max-autotune is off by default: its GEMM autotuning took 363 s of compilation on the seed model
# (2026-11-29) and it ran no faster than reduce-overhead (4.57 vs 4.41 ms/step). TORCH_MAX_AUTOTUNE=1
# adds it (last, so a time-out loses nothing else).
SEED_MODES="${TORCH_SEED_MODES:-eager-fp32,eager-bf16,eager-fp16,compile-bf16,compile-bf16-ro,fp8-torchao,fp8-torchao-compile}"
[ -n "${TORCH_MAX_AUTOTUNE:-}" ] && SEED_MODES="$SEED_MODES,compile-bf16-ma"
LARGE_MODES="${TORCH_LARGE_MODES:-eager-bf16,compile-bf16-ro,fp8-torchao-compile}"
# GPT-2 presets (issue 30): PyTorch's eager, compile and compile reduce-overhead bf16 (vocab padded
# to 50304, loss in the graph, fused AdamW), each mode in its own process, and duet per precision,
# so that each run's device memory in use (nvidia-smi, sampled every 200 ms) is its own.
GPT2_MODES="${TORCH_GPT2_MODES:-eager-bf16,compile-bf16,compile-bf16-ro}"
# sampled KEY COMMAND...: runs COMMAND with nvidia-smi's memory.used sampled; the peak (MiB)
# goes to $OUT/device-memory-peak-mib.txt as "KEY PEAK" (KEY: a duet run's JSON name without
# .json, torch-<preset>-<mode> for PyTorch; table.py reads them).
sampled() {
    local label=$1; shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"/tmp/mem-$label.txt" &
    local smi=$!
    "$@"
    local rc=$?
    kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
    echo "$label $(sort -n "/tmp/mem-$label.txt" | tail -1)" >>"$OUT/device-memory-peak-mib.txt"
    return $rc
}
for p in ${PRESETS:-seed large}; do
    case "$p" in
    gpt2*)
        for prec in $(echo "${DUET_PRECISIONS:-bf16,fp8}" | tr ',' ' '); do
            echo "== duet bench --preset $p --precision $prec"
            t0=$(date +%s)
            sampled "duet-$p.$prec" "$HERE/duet" bench --backend cuda --preset "$p" --precision "$prec" \
                --warmup-steps 5 --iters "$ITERS" --json "$OUT/duet-$p.$prec.json" >/dev/null 2>"/tmp/duet-$p.err"
            cat "/tmp/duet-$p.err"
            echo "== duet $p $prec: $(( $(date +%s) - t0 )) s"
        done
        for mode in $(echo "$GPT2_MODES" | tr ',' ' '); do
            echo "== torch_ref.py --preset $p --modes $mode"
            t0=$(date +%s)
            sampled "torch-$p-$mode" python3 "$HERE/torch_ref.py" --preset "$p" --modes "$mode" --warmup 8 \
                --iters "${TORCH_ITERS:-30}" --json "$OUT/torch-$p.jsonl" >/dev/null 2>"/tmp/torch-$p.err" || true
            grep -E "Error|error|Traceback" "/tmp/torch-$p.err" | grep -v "autotun\|select_algorithm\|triton configs" | tail -5
            echo "== torch $p $mode: $(( $(date +%s) - t0 )) s"
        done
        continue
        ;;
    esac
    echo "== duet bench --preset $p --precision ${DUET_PRECISIONS:-all}"
    t0=$(date +%s)
    "$HERE/duet" bench --backend cuda --preset "$p" --precision "${DUET_PRECISIONS:-all}" --warmup-steps 5 --iters "$ITERS" \
        --json "$OUT/duet-$p.json" >/dev/null 2>"/tmp/duet-$p.err"; cat "/tmp/duet-$p.err"
    echo "== duet $p: $(( $(date +%s) - t0 )) s"
    IFS=';' read -ra VARIANTS <<<"${DUET_VARIANTS:-}"
    for v in "${VARIANTS[@]}"; do
        read -r vp vprec vargs <<<"$v"
        [ "$vp" = "$p" ] || continue
        label=$(echo "$vprec $vargs" | tr -c 'A-Za-z0-9\n' '_' | sed 's/__*/_/g; s/_$//')
        echo "== duet bench --preset $p --precision $vprec $vargs"
        # shellcheck disable=SC2086
        "$HERE/duet" bench --backend cuda --preset "$p" --precision "$vprec" --warmup-steps 5 \
            --iters "$ITERS" $vargs --json "$OUT/duet-$p-$label.json" >/dev/null 2>"/tmp/duet-v.err"
        cat /tmp/duet-v.err
    done
    modes=$SEED_MODES; [ "$p" = large ] && modes=$LARGE_MODES
    echo "== torch_ref.py --preset $p --modes $modes"
    t0=$(date +%s)
    python3 "$HERE/torch_ref.py" --preset "$p" --modes "$modes" --warmup 8 --iters "${TORCH_ITERS:-30}" \
        --json "$OUT/torch-$p.jsonl" >/dev/null 2>"/tmp/torch-$p.err" || true
    grep -E "Error|error|Traceback" "/tmp/torch-$p.err" | grep -v "autotun\|select_algorithm\|triton configs" | tail -5
    echo "== torch $p: $(( $(date +%s) - t0 )) s"
done
[ -n "${SAVE_CACHES:-}" ] && tar -czf "$OUT/caches.tar.gz" -C /tmp/caches . 2>/dev/null
ls -la "$OUT"
python3 "$HERE/table.py" "$OUT" | tee "$OUT/table.md"
if [ -n "${PROFILE:-}" ] && command -v ncu >/dev/null; then
    # Kernel time of one bf16 step (kernels ~ one step after warm-up): GPU-bound vs host-bound.
    timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
        --launch-skip "${PROFILE_SKIP:-1500}" --launch-count "${PROFILE_COUNT:-700}" \
        "$HERE/duet" bench --backend cuda --preset seed --precision "${PROFILE:-bf16}" \
        --warmup-steps 4 --iters 1 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    echo "ncu exit $?"
    python3 - "$OUT/ncu.csv" <<'PY' | tee "$OUT/ncu-summary.txt"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.Counter(); cnt = collections.Counter()
for r in rows[1:]:
    # to microseconds (ncu 2025+ writes "ns"/"us"/"ms", older versions "nsecond"/...)
    v = float(r[vi].replace(",", "")) * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(r[ui], 1.0)
    k = r[ki].split("(")[0][:60]; tot[k] += v; cnt[k] += 1
s = sum(tot.values())
print(f"kernels {sum(cnt.values())}, GPU time {s/1e3:.2f} ms (us below)")
for k, v in tot.most_common(30): print(f"{v:10.1f} {cnt[k]:5d}  {k}")
PY
fi
