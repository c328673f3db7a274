#!/usr/bin/env bash
# Runs a fixed set of small CPU training runs with --trace and writes each trace's step records
# (every line after the header) to OUTDIR/<name>.steps. Comparing two OUTDIRs byte for byte
# (`diff -r before after`) checks that a change kept what the CPU backend computes.
#
# Usage: scripts/trace-fixed-runs.sh OUTDIR [path/to/duet]
set -euo pipefail
OUT="${1:?usage: trace-fixed-runs.sh OUTDIR [duet]}"
DUET="${2:-target/release/duet}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
DUET="$(cd "$(dirname "$DUET")" && pwd)/$(basename "$DUET")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Runs on --data without --out save into ./runs/: keep them in the work folder.
cd "$WORK"
# A small UTF-8 corpus (byte tokens) for the text-data run.
python3 - "$WORK/corpus.txt" <<'PY'
import sys
words = "the quick brown fox jumps over the lazy dog while seven wizards quietly hex jumbo pies".split()
lines = []
x = 12345
for i in range(3000):
    x = (x * 1103515245 + 12345) % (1 << 31)
    lines.append(" ".join(words[(x >> (3 * k)) % len(words)] for k in range(8)))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
common=(--backend cpu --threads 2 --eval-sequences 0 --log-every 0 --seed 7)
run() {
    local name="$1"; shift
    "$DUET" train "${common[@]}" "$@" --trace "$WORK/$name.jsonl" >"$WORK/$name.log" 2>&1 || {
        cat "$WORK/$name.log" >&2; echo "trace-fixed-runs: $name failed" >&2; exit 1; }
    tail -n +2 "$WORK/$name.jsonl" >"$OUT/$name.steps"
    echo "trace-fixed-runs: $name $(wc -l <"$OUT/$name.steps") steps $(sha256sum "$OUT/$name.steps" | cut -c1-16)"
}
run fp32 --preset tiny --steps 12 --precision fp32
run bf16 --preset tiny --steps 12 --precision bf16
run fp16 --preset tiny --steps 12 --precision fp16
run fp8 --preset tiny --steps 12 --precision fp8
run fp8-e4m3 --preset tiny --steps 12 --precision fp8 --fp8-format e4m3 --fp8-amax-compute-algo most_recent
run checkpointing --preset tiny --steps 12 --precision bf16 --checkpoint-every 1 --layers 2
run keep-gelu --preset tiny --steps 12 --precision bf16 --keep-gelu
run text --preset tiny --steps 12 --precision fp32 --data "$WORK/corpus.txt" --seq 32 --vocab 256 --max-seq 32
run text-bf16 --preset tiny --steps 12 --precision bf16 --data "$WORK/corpus.txt" --seq 32 --vocab 256 --max-seq 32
run default-fp32 --preset default --steps 4 --precision fp32
run default-fp8 --preset default --steps 4 --precision fp8 --checkpoint
