#!/usr/bin/env python3
"""Side-by-side table from side_by_side.sh's results folder (duet-*.json, torch-*.jsonl)."""
import glob
import json
import os
import sys


PRESETS = ["default", "tiny", "seed", "large", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]


def split_name(stem):
    """duet-<preset>.json, duet-<preset>.<precision>.json (one precision per process: the GPT-2
    presets) or duet-<preset>-<variant>.json (runs with extra flags): the preset (the longest
    known one the name starts with) and the rest."""
    stem = stem.split(".")[0]
    preset = max((p for p in PRESETS if stem == p or stem.startswith(p + "-")), key=len, default=None)
    if preset is None:
        preset, _, variant = stem.partition("-")
        return preset, variant
    return preset, stem[len(preset) + 1:]


def device_memory(folder):
    """Run key -> peak device memory in use (MiB), from device-memory-peak-mib.txt's "KEY MIB"
    lines: a duet run's key is its JSON file's name without .json, a PyTorch mode's
    torch-<preset>-<mode>."""
    out = {}
    path = os.path.join(folder, "device-memory-peak-mib.txt")
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
    return out


def rows(folder):
    out = []
    for f in sorted(glob.glob(os.path.join(folder, "duet-*.json"))):
        stem = os.path.basename(f)[:-5]
        preset, variant = split_name(stem[5:])
        data = json.load(open(f))
        for r in data if isinstance(data, list) else [data]:
            # The variant label is the precision and flags with non-alphanumerics as '_'.
            label = f" ({variant.split('_', 1)[1].replace('_', '-')})" if "_" in variant else ""
            out.append((preset, f"duet {r['precision']}{label}", dict(r, mem_key=stem)))
    for f in sorted(glob.glob(os.path.join(folder, "torch-*.jsonl"))):
        preset = os.path.basename(f)[6:-6]
        for line in open(f):
            r = json.loads(line)
            out.append((preset, f"torch {r['mode']}", dict(r, mem_key=f"torch-{preset}-{r['mode']}")))
    return out


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    print(
        "| preset | run | ms/step median | ms/step min | tokens/s | TFLOP/s | MFU | peak memory GiB "
        "| device memory in use, peak MiB | SM clock, power (timed steps) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    found = rows(folder)
    mem = device_memory(folder)
    for preset, name, r in found:
        if "error" in r:
            print(f"| {preset} | {name} | error: {r['error'][:60]} | | | | | | | |")
            continue
        mfu = r.get("mfu")
        print(
            f"| {preset} | {name} | {r['ms_per_step_median']:.2f} | {r['ms_per_step_min']:.2f} | "
            f"{r['tokens_per_s']:.0f} | {r.get('model_tflops', float('nan')):.1f} | "
            f"{'' if mfu is None else f'{100 * mfu:.1f}%'} | {r['peak_memory_bytes'] / 2**30:.2f} | "
            f"{mem.get(r['mem_key'], '')} | {telemetry(r.get('telemetry'))} |"
        )
    targets(found, mem)


def telemetry(t):
    """Median SM clock and power over the timed steps, and how often the power limit held the
    clocks down (`duet bench` and torch_ref.py sample them through NVML). Power readings that
    are the driver's trailing average (about 1 s, so a short run repeats one value) are marked;
    results written before the field existed are marked too."""
    if not t:
        return ""
    capped = t.get("power_capped_share", 0.0)
    cap = f", power-capped {100 * capped:.0f}%" if capped > 0 else ""
    avg = "" if t.get("power_instant_share", 0.0) == 1.0 else " (1 s average)"
    return (
        f"{t['sm_clock_mhz_median']:.0f} MHz, {t['power_w_median']:.0f}{avg} of "
        f"{t['power_limit_w']:.0f} W{cap}"
    )


# Issue #11's targets: (preset, what, numerator run, denominator run(s), limit). A denominator
# list takes the fastest of the runs present (the best torch.compile mode).
COMPILE = ["torch compile-bf16", "torch compile-bf16-ro", "torch compile-bf16-ma"]
TARGETS = [
    ("seed", "bf16 vs best torch.compile", "duet bf16", COMPILE, 0.8),
    ("seed", "fp8 vs duet bf16", "duet fp8", ["duet bf16"], 0.85),
    ("large", "bf16 vs best torch.compile", "duet bf16", COMPILE, 0.8),
    ("large", "fp8 vs torchao fp8 + compile", "duet fp8", ["torch fp8-torchao-compile"], 0.7),
    # Issue #30's (GPT-2 at vocab 50257, B 32 / medium B 16).
    ("gpt2", "bf16 vs best torch.compile", "duet bf16", COMPILE, 0.8),
    ("gpt2", "fp8 vs best torch.compile", "duet fp8", COMPILE, 0.65),
    ("gpt2-medium", "bf16 vs best torch.compile", "duet bf16", COMPILE, 0.8),
    ("gpt2-medium", "fp8 vs best torch.compile", "duet fp8", COMPILE, 0.65),
]
# Issue #30's memory target: device memory in use at the peak (MiB) against llm.c's own report
# for gpt2 at B 32 (its cudaMemGetInfo, from the run; medium's figure for reference).
LLMC_DEVICE_MIB = {"gpt2": 13084, "gpt2-medium": 17160}


def targets(all_rows, mem=None):
    """Prints the step-time ratios against the targets, and duet bf16's peak memory against
    torch eager bf16's, for the runs the folder holds (a target whose runs are missing is left
    out)."""
    ok = {(p, n): r for p, n, r in all_rows if "error" not in r}
    lines = []
    for preset, what, num, dens, limit in TARGETS:
        d = [ok[(preset, n)] for n in dens if (preset, n) in ok]
        if (preset, num) not in ok or not d:
            continue
        den = min(r["ms_per_step_median"] for r in d)
        ratio = ok[(preset, num)]["ms_per_step_median"] / den
        met = "yes" if ratio <= limit else "no"
        lines.append(f"| {preset} | {what} | {ratio:.3f} × | ≤ {limit} × | {met} |")
    for preset in ("seed", "large"):
        a, b = ok.get((preset, "duet bf16")), ok.get((preset, "torch eager-bf16"))
        if a and b:
            ratio = a["peak_memory_bytes"] / b["peak_memory_bytes"]
            met = "yes" if ratio <= 1 else "no"
            what = "peak memory, duet bf16 vs torch eager bf16"
            lines.append(f"| {preset} | {what} | {ratio:.3f} × | ≤ 1 × | {met} |")
    for preset, limit in LLMC_DEVICE_MIB.items():
        for prec in ("bf16", "fp8"):
            r = ok.get((preset, f"duet {prec}"))
            got = (mem or {}).get(r["mem_key"]) if r else None
            if got is not None:
                met = "yes" if got <= limit else "no"
                what = f"device memory in use, duet {prec} vs llm.c's {limit} MiB"
                lines.append(f"| {preset} | {what} | {got / limit:.3f} × ({got} MiB) | ≤ 1 × | {met} |")
    if lines:
        print()
        print("| preset | target (median step times) | ratio | limit | met |")
        print("|---|---|---:|---:|---|")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
