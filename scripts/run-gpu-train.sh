#!/usr/bin/env bash
# Runs on the GPU machine (copied into .carry/ by scripts/gpu-train.sh).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$(mktemp -d)}"
exec > >(tee "$OUT/gpu-train.log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
export RUST_BACKTRACE=1
D="$HERE/duet"
echo "== duet info"; "$D" info
echo "== training parity test (CPU vs CUDA, FP32, 20 steps)"
"$HERE/gpu-tests/gpu_training" --nocapture
echo "== traces: CPU vs CUDA (default model, 30 steps) and CUDA twice"
"$D" train --backend cpu  --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cpu.jsonl"
"$D" train --backend cuda --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda.jsonl"
"$D" train --backend cuda --steps 30 --eval-sequences 0 --log-every 0 --trace "$OUT/cuda2.jsonl"
"$D" parity "$OUT/cpu.jsonl" "$OUT/cuda.jsonl"; echo "parity cpu-vs-cuda exit $?"
"$D" parity "$OUT/cuda.jsonl" "$OUT/cuda2.jsonl"; echo "parity cuda-vs-cuda exit $?"
cmp <(tail -n +2 "$OUT/cuda.jsonl") <(tail -n +2 "$OUT/cuda2.jsonl") && echo "cuda run twice: step records byte-identical"
if [ -n "${TRAIN_QUICK:-}" ]; then echo "== TRAIN_QUICK: seed training and benches skipped"; exit 0; fi
echo "== seed preset on CUDA (FP32)"
"$D" train --backend cuda --preset seed --log-every 25 --metrics "$OUT/seed-cuda.jsonl" ${SEED_ARGS:-}
echo "== bench seed preset on CUDA"
"$D" bench --backend cuda --preset seed --json "$OUT/bench-seed-cuda.json"
echo "== CPU backend on this host (seed preset, 2 steps timed)"
"$D" bench --backend cpu --preset seed --warmup-steps 1 --iters 2
