#!/usr/bin/env bash
# A/B of duet binaries or flags on the GPU machine, interleaved so that clock and power drift
# fall on both sides: each RUN is `label|binary|duet bench flags`, run ROUNDS times in turn
# (A B A B ...), each its own process with nvidia-smi's device memory sampled every 200 ms.
# Prints one line per run (median ms/step, tokens/s, allocator peak, memory plan, device
# memory peak, logits chunk rows, GELU recompute) and a per-label summary (median of its
# rounds); writes each run's `duet bench --json` to OUT_DIR/<label>.<round>.json.
#   ROUNDS=2 bash scripts/bench/ab.sh OUT_DIR 'new|.carry/duet|--preset gpt2 --precision bf16' \
#       'old|.carry/duet-old|--preset gpt2 --precision bf16'
# BACKEND (default cuda), WARMUP, ITERS, RUN_TIMEOUT narrow a run. Needs python3 (no
# packages). A run that fails prints its error log's name.
set -uo pipefail
OUT=$1; shift
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-2}
for r in $(seq 1 "$ROUNDS"); do
    for spec in "$@"; do
        IFS='|' read -r label bin flags <<<"$spec"
        json="$OUT/$label.$r.json"
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/.mem" 2>/dev/null &
        smi=$!
        # shellcheck disable=SC2086  # flags are words
        timeout "${RUN_TIMEOUT:-180}" "$bin" bench --backend "${BACKEND:-cuda}" --warmup-steps "${WARMUP:-3}" \
            --iters "${ITERS:-10}" --json "$json" $flags >"$OUT/$label.$r.log" 2>&1
        kill "$smi" 2>/dev/null
        mem=$(sort -n "$OUT/.mem" 2>/dev/null | tail -1)
        python3 - "$json" "$label" "$r" "${mem:-?}" "$flags" <<'PY'
import json, sys
path, label, r, mem, flags = sys.argv[1:6]
try:
    d = json.load(open(path))
    print(f"{label:<20} round {r}  {d['ms_per_step_median']:8.2f} ms  {d['tokens_per_s']/1e3:6.0f} K tok/s  "
          f"alloc {d['peak_memory_bytes']/2**30:6.2f} GiB  plan {d['memory_plan_bytes']}  device {mem} MiB  "
          f"chunk {d.get('logits_chunk_rows')}  recompute_gelu {d.get('recompute_gelu')}  [{flags}]")
except Exception as e:
    print(f"{label:<20} round {r}  no result ({e}); see {path[:-5]}.log")
PY
    done
done
rm -f "$OUT/.mem"
python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    label = os.path.basename(p).rsplit(".", 2)[0]
    try:
        runs.setdefault(label, []).append(json.load(open(p))["ms_per_step_median"])
    except Exception:
        pass
for label, ms in runs.items():
    print(f"# {label:<20} median of {len(ms)} rounds: {statistics.median(ms):8.2f} ms")
PY
