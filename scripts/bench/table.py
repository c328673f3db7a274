#!/usr/bin/env python3
"""Side-by-side table from side_by_side.sh's results folder (duet-*.json, torch-*.jsonl)."""
import glob
import json
import os
import sys


def rows(folder):
    out = []
    for f in sorted(glob.glob(os.path.join(folder, "duet-*.json"))):
        # duet-<preset>.json, or duet-<preset>-<variant>.json for runs with extra flags.
        preset, _, variant = os.path.basename(f)[5:-5].partition("-")
        data = json.load(open(f))
        for r in data if isinstance(data, list) else [data]:
            # The variant label is the precision and flags with non-alphanumerics as '_'.
            label = f" ({variant.split('_', 1)[1].replace('_', '-')})" if "_" in variant else ""
            out.append((preset, f"duet {r['precision']}{label}", r))
    for f in sorted(glob.glob(os.path.join(folder, "torch-*.jsonl"))):
        preset = os.path.basename(f)[6:-6]
        for line in open(f):
            r = json.loads(line)
            out.append((preset, f"torch {r['mode']}", r))
    return out


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    print("| preset | run | ms/step median | ms/step min | tokens/s | TFLOP/s | MFU | peak memory GiB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for preset, name, r in rows(folder):
        if "error" in r:
            print(f"| {preset} | {name} | error: {r['error'][:60]} | | | | | |")
            continue
        mfu = r.get("mfu")
        print(
            f"| {preset} | {name} | {r['ms_per_step_median']:.2f} | {r['ms_per_step_min']:.2f} | "
            f"{r['tokens_per_s']:.0f} | {r.get('model_tflops', float('nan')):.1f} | "
            f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | {r['peak_memory_bytes'] / 2**30:.2f} |"
        )


if __name__ == "__main__":
    main()
