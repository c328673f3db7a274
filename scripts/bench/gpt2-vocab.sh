#!/usr/bin/env bash
# GPT-2 step time and memory for several duet binaries side by side in one call on the GPU
# machine (issue 30: the padded vocabulary, the fused classifier):
#   bash scripts/bench/gpt2-vocab.sh OUT_DIR DUET... [-- MEDIUM_DUET]
# For each binary: GPT-2 124M (B 32, T 1024, 12 layers, d 768) at vocab 50257, bf16 and fp8
# in one `duet bench`; after `--`, a binary also runs GPT-2 medium (B 16, d 1024, 24 layers,
# 16 heads). Same flags for every binary (old ones have no gpt2 preset). Writes <label>.json
# (duet bench --json) and <label>.log per run, and the device memory in use at the run's peak
# as nvidia-smi samples it every 200 ms (what llm.c's cudaMemGetInfo figure compares with,
# beside duet's allocator peak).
set -uo pipefail
OUT=$1; shift
mkdir -p "$OUT"
GPT2=(--layers 12 --d-model 768 --heads 12 --ffn 3072 --batch 32)
MEDIUM=(--layers 24 --d-model 1024 --heads 16 --ffn 4096 --batch 16)
COMMON=(bench --backend cuda --seq 1024 --max-seq 1024 --vocab 50257 --precision bf16,fp8
        --warmup-steps 3 --iters 10)
bench() { # label bin model-args...
  local label=$1 bin=$2; shift 2
  echo "== $label: $("$bin" --version)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$OUT/$label.mem" &
  local smi=$!
  "$bin" "${COMMON[@]}" "$@" --json "$OUT/$label.json" > "$OUT/$label.log" 2>&1
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "   exit $rc; device memory in use at the peak (nvidia-smi): $(sort -n "$OUT/$label.mem" | tail -1) MiB"
  grep -A3 "precision  ms/step" "$OUT/$label.log" | sed 's/^/   /'
}
medium=0
for b in "$@"; do
  if [ "$b" = "--" ]; then medium=1; continue; fi
  name=$(basename "$b")
  if [ $medium = 0 ]; then bench "$name-gpt2" "$b" "${GPT2[@]}"
  else bench "$name-gpt2-medium" "$b" "${MEDIUM[@]}"; fi
done
