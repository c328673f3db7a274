#!/usr/bin/env bash
# Runs on the GPU machine (copied into .carry/ by scripts/gpu-train.sh): the measurements the
# precision, checkpointing and parity issues report, in one call. Logs and JSON go to $OUT.
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$(mktemp -d)}"
exec > >(tee "$OUT/gpu-report.log") 2>&1
D="$HERE/duet"
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
