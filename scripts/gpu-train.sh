#!/usr/bin/env bash
# Packs the duet binary and the whole-model GPU tests for the GPU machine, next to the backend
# tests that scripts/gpu-test.sh packs.
#
#   scripts/gpu-train.sh            # builds here, writes .carry/duet, .carry/gpu-tests/gpu_training
#                                   # and .carry/run-gpu-train.sh
# Then, with the device tool:  run(command="bash .carry/run-gpu-train.sh", carry=[".carry"])
#
# The runner runs the CPU-vs-CUDA training-parity test, CPU vs CUDA traces through `duet parity`,
# trains the seed preset on CUDA (ms/step, greedy accuracy) and benches it; logs go to $OUT.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
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
cp scripts/run-gpu-train.sh scripts/run-gpu-report.sh .carry/
du -sh .carry
