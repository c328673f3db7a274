#!/usr/bin/env bash
# The duet binary and the whole-model GPU tests: packed here for the GPU machine (next to the
# backend tests that `scripts/gpu-test.sh pack` packs), run there.
#
#   scripts/gpu-train.sh pack     # here: builds, writes .carry/duet and .carry/gpu-tests/gpu_training
#   scripts/gpu-train.sh run      # on the GPU machine: the CPU-vs-CUDA training-parity test, CPU vs
#                                 #   CUDA traces through `duet parity`, trains the seed preset on
#                                 #   CUDA (ms/step, greedy accuracy) and benches it; log and
#                                 #   traces to $OUT (gpu-train.log). TRAIN_QUICK=1 stops after
#                                 #   the traces; SEED_ARGS adds flags to the seed training run.
#   scripts/gpu-train.sh report   # on the GPU machine: the measurements the precision,
#                                 #   checkpointing and parity issues report (precisions of the
#                                 #   seed model, activation checkpointing off / every 4 / every 1,
#                                 #   CPU vs CUDA bf16 traces, greedy accuracy per precision), in
#                                 #   one call; logs and JSON to $OUT (gpu-report.log)
#
# Then, with the device tool:  run(command="bash scripts/gpu-train.sh run", carry=[".carry"])
# (or "... report"). Without $OUT the runners write into a fresh temporary folder.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CARRY="$ROOT/.carry"

usage() {
  sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

cmd_pack() {
  mkdir -p .carry/gpu-tests
  cargo build --release --bin duet
  cp target/release/duet .carry/duet
  bin=$(cargo test --release --test gpu_training --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="gpu_training": print(m["executable"])')
  cp "$bin" .carry/gpu-tests/gpu_training
  strip .carry/duet .carry/gpu-tests/gpu_training 2>/dev/null || true
  du -sh .carry
}

# Both runners: no -e (every measurement runs), the packed duet, $OUT (or a fresh folder).
runner_setup() {
  set +e
  [ -x "$CARRY/duet" ] || { echo "error: run '$0 pack' first (and carry .carry)" >&2; exit 2; }
  OUT="${OUT:-$(mktemp -d)}"
}

# The training runner (formerly .carry/run-gpu-train.sh).
cmd_run() {
  runner_setup
  exec > >(tee "$OUT/gpu-train.log") 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  export RUST_BACKTRACE=1
  D="$CARRY/duet"
  echo "== duet info"; "$D" info
  echo "== training parity test (CPU vs CUDA, FP32, 20 steps)"
  "$CARRY/gpu-tests/gpu_training" --nocapture
  echo "== traces: CPU vs CUDA (default model, 30 steps) and CUDA twice"
  "$D" train --backend cpu  --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cpu.jsonl"
  "$D" train --backend cuda --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda.jsonl"
  "$D" train --backend cuda --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda2.jsonl"
  "$D" parity "$OUT/cpu.jsonl" "$OUT/cuda.jsonl"; echo "parity cpu-vs-cuda exit $?"
  "$D" parity "$OUT/cuda.jsonl" "$OUT/cuda2.jsonl"; echo "parity cuda-vs-cuda exit $?"
  cmp <(tail -n +2 "$OUT/cuda.jsonl") <(tail -n +2 "$OUT/cuda2.jsonl") && echo "cuda run twice: step records byte-identical"
  if [ -n "${TRAIN_QUICK:-}" ]; then echo "== TRAIN_QUICK: seed training and benches skipped"; exit 0; fi
  echo "== seed preset on CUDA (FP32)"
  # shellcheck disable=SC2086 # SEED_ARGS: several flags on purpose
  "$D" train --backend cuda --preset seed --log-every 25 --metrics "$OUT/seed-cuda.jsonl" ${SEED_ARGS:-}
  echo "== bench seed preset on CUDA"
  "$D" bench --backend cuda --preset seed --json "$OUT/bench-seed-cuda.json"
  echo "== CPU backend on this host (seed preset, 2 steps timed)"
  "$D" bench --backend cpu --preset seed --warmup-steps 1 --iters 2
}

# The report runner (formerly .carry/run-gpu-report.sh).
cmd_report() {
  runner_setup
  exec > >(tee "$OUT/gpu-report.log") 2>&1
  D="$CARRY/duet"
  export RUST_BACKTRACE=1
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader

  echo "== precisions: seed model, one run (ms/step, peak memory)"
  "$D" bench --backend cuda --preset seed --precision all --iters 20 --json "$OUT/bench-seed-precisions.json"

  echo "== activation checkpointing: seed and large models, bf16, off / every 4 / every 1"
  for preset in seed large; do
    for ck in 0 4 1; do
      echo "-- $preset checkpoint_every=$ck"
      "$D" bench --backend cuda --preset "$preset" --precision bf16 --checkpoint-every "$ck" --warmup-steps 2 --iters 8 \
        --json "$OUT/bench-ckpt-$preset-$ck.json" | grep -E '"(ms_per_step_median|peak_memory_bytes|precision)"'
    done
  done

  echo "== traces: CPU vs CUDA in bf16 (default model, 30 steps)"
  "$D" train --backend cpu  --precision bf16 --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cpu-bf16.jsonl"
  "$D" train --backend cuda --precision bf16 --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda-bf16.jsonl"
  "$D" parity "$OUT/cpu-bf16.jsonl" "$OUT/cuda-bf16.jsonl"; echo "parity cpu-vs-cuda bf16 exit $?"
  "$D" train --backend cuda --precision bf16 --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda-bf16-2.jsonl"
  cmp <(tail -n +2 "$OUT/cuda-bf16.jsonl") <(tail -n +2 "$OUT/cuda-bf16-2.jsonl") && echo "cuda bf16 run twice: byte-identical"

  echo "== seed preset on CUDA in each precision: greedy accuracy after the same 100 steps"
  for p in fp32 bf16 fp16 fp8; do
    "$D" train --backend cuda --preset seed --precision "$p" --steps 100 --log-every 0 2>&1 | grep -E "trained|greedy|loss scale|warning"
  done
}

case "${1:-}" in
pack) cmd_pack ;;
run) cmd_run ;;
report) cmd_report ;;
help | -h | --help) usage ;;
*)
  usage >&2
  exit 2
  ;;
esac
