#!/usr/bin/env bash
# GPT-2 (124M) step time at its real vocabulary (50257) and padded (50304), for two duet
# binaries side by side in one call on the GPU machine (issue 30: the padded vocabulary):
#   bash scripts/bench/gpt2-vocab.sh OLD_DUET NEW_DUET OUT_DIR
# B 32, T 1024, 12 layers, d 768; bf16 and fp8 each (one `duet bench` per binary and vocab,
# both precisions in it). Writes <label>.json (duet bench --json) and <label>.log per run and
# prints a table of ms/step and peak memory. Same flags for both binaries (the old one has no
# gpt2 preset).
set -uo pipefail
OLD=$1; NEW=$2; OUT=$3
mkdir -p "$OUT"
ARGS=(bench --backend cuda --layers 12 --d-model 768 --heads 12 --ffn 3072 --seq 1024
      --max-seq 1024 --batch 32 --precision bf16,fp8 --warmup-steps 3 --iters 10)
for vocab in 50257 50304; do
  for which in old new; do
    bin=$OLD; [ "$which" = new ] && bin=$NEW
    label="$which-v$vocab"
    echo "== $label: $("$bin" --version)"
    "$bin" "${ARGS[@]}" --vocab "$vocab" --json "$OUT/$label.json" > "$OUT/$label.log" 2>&1
    echo "   exit $?"
    grep -E "ms/step|peak|memory|error" "$OUT/$label.log" | head -8 | sed 's/^/   /'
  done
done
