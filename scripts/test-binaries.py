#!/usr/bin/env python3
"""Prints the test executables of `cargo test --no-run --message-format=json` (read on stdin),
one per line (used by `scripts/gpu-test.sh pack` and `scripts/hip-nvidia.sh standins pack` to pack
test binaries)."""
import json
import sys

for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
