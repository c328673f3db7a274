#!/usr/bin/env bash
# Quick A/B timings of duet on the GPU machine (one device call; the side-by-side with PyTorch
# is side_by_side.sh). Pack here with `bash scripts/bench/dev_bench.sh --pack` (the duet binary
# and this script into .carry-dev/, git-ignored), then with the device tool:
#   run(command="bash .carry-dev/dev_bench.sh", carry=[".carry-dev"])
# Environment: CASES (default below; one case per line: `<preset> <precision> [duet bench args]`),
# ITERS (default 30), NCU="<preset> <precision> [args]" adds an ncu kernel-time summary of about
# one step of that case, NCU_SKIP/NCU_COUNT the launches skipped/profiled, NCU_EXTRA more ncu
# options (e.g. "--cache-control none": kernels see the L2 as the step leaves it), NCU_SEQ=1 also
# prints that step's launches in order with their grid and block sizes.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${1:-}" = "--pack" ]; then
    ROOT="$(cd "$HERE/../.." && pwd)"
    cd "$ROOT"
    grep -qx "/.carry-dev/" .git/info/exclude 2>/dev/null || echo /.carry-dev/ >>.git/info/exclude
    cargo build --release --bin duet
    mkdir -p .carry-dev
    cp target/release/duet .carry-dev/duet && strip .carry-dev/duet
    cp scripts/bench/dev_bench.sh .carry-dev/
    du -sh .carry-dev
    exit 0
fi
dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && dirs="$dirs:$d"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
export DUET_CUDA_CACHE_DIR="${DUET_CUDA_CACHE_DIR:-/tmp/duet-cache}"
ITERS="${ITERS:-30}"
CASES="${CASES:-seed bf16
seed bf16 --gemm-autotune
seed fp8
seed fp8 --gemm-autotune
large bf16
large fp8}"
printf '%-44s %10s %10s %12s\n' case ms_median ms_min peak_GiB
while read -r preset precision args; do
    [ -z "$preset" ] && continue
    iters=$ITERS
    [ "$preset" = large ] && iters=$(( ITERS / 3 > 5 ? ITERS / 3 : 5 ))
    # shellcheck disable=SC2086
    json=$("$HERE/duet" bench --backend cuda --preset "$preset" --precision "$precision" \
        --warmup-steps 5 --iters "$iters" $args 2>/tmp/dev-bench.err)
    if [ -z "$json" ]; then
        printf '%-44s failed: %s\n' "$preset $precision $args" "$(tail -2 /tmp/dev-bench.err | tr '\n' ' ')"
        continue
    fi
    python3 - "$preset $precision $args" "$json" <<'PY'
import json, sys
d = json.loads(sys.argv[2]); d = d[0] if isinstance(d, list) else d
t = d.get("telemetry") or {}
tel = (f"  {t['sm_clock_mhz_median']:.0f} MHz {t['power_w_median']:.0f} W"
       + ("" if t.get('power_instant_share', 0.0) == 1.0 else " (1 s average)")) if t else ""
print(f"{sys.argv[1]:44s} {d['ms_per_step_median']:10.3f} {d['ms_per_step_min']:10.3f} "
      f"{d['peak_memory_bytes'] / 2**30:12.3f}{tel}")
PY
    grep -i "warning" /tmp/dev-bench.err | head -3
done <<<"$CASES"
# NCU: one or more cases separated by ';'.
if [ -n "${NCU:-}" ] && command -v ncu >/dev/null; then
  IFS=';' read -ra NCU_CASES <<<"$NCU"
  for ncase in "${NCU_CASES[@]}"; do
    read -r preset precision args <<<"$ncase"
    # shellcheck disable=SC2086
    timeout 300 ncu --clock-control none ${NCU_EXTRA:-} --csv \
        --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
        --launch-skip "${NCU_SKIP:-500}" --launch-count "${NCU_COUNT:-400}" \
        "$HERE/duet" bench --backend cuda --preset "$preset" --precision "$precision" \
        --no-graphs --warmup-steps 6 --iters 2 $args >/tmp/ncu.csv 2>/tmp/ncu.err
    echo "ncu exit $? ($ncase, unrecorded steps)"
    python3 - /tmp/ncu.csv <<'PY'
import csv, sys, collections, os
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
ii = h.index("ID"); mi = h.index("Metric Name")
launches = {}
for r in rows[1:]:
    l = launches.setdefault(r[ii], {"name": r[ki].split("(")[0][:70]})
    if r[mi] == "gpu__time_duration.sum":
        l["us"] = float(r[vi].replace(",", "")) * {"ns": 1e-3, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}.get(r[ui], 1.0)
    else:
        l[r[mi]] = r[vi].replace(",", "")
order = sorted(launches, key=int)
seq = [(launches[i]["name"], launches[i].get("us", 0.0)) for i in order]
grids = [(launches[i].get("launch__grid_size", "?"), launches[i].get("launch__block_size", "?")) for i in order]
# One step: from one embedding_forward to the next.
starts = [i for i, (k, _) in enumerate(seq) if k.startswith("embedding_forward")]
if len(starts) >= 2: seq, grids = seq[starts[0]:starts[1]], grids[starts[0]:starts[1]]
else: print(f"(no full step between embedding_forward launches: {len(seq)} kernels)")
tot = collections.Counter(); cnt = collections.Counter()
for k, v in seq: tot[k] += v; cnt[k] += 1
print(f"one step: kernels {len(seq)}, GPU time {sum(tot.values())/1e3:.3f} ms (us below)")
for k, v in tot.most_common(45): print(f"{v:10.1f} {cnt[k]:5d}  {k}")
if os.environ.get("NCU_SEQ"):
    print("launch sequence (us, grid, block, kernel):")
    for (k, v), (g, b) in zip(seq, grids): print(f"{v:9.1f} {g:>7s} {b:>5s}  {k}")
PY
    tail -3 /tmp/ncu.err | grep -v "^==PROF==" | head -3
  done
fi
