#!/usr/bin/env python3
"""The per-kernel table of the HIP-on-CPU platform (scripts/hip-cpu.sh table).

usage: kernel_table.py CASES_DIR

Reads, from CASES_DIR (scripts/hip-cpu.sh table's $OUT/cases):
  <case>-<wave>.trace   the kernels each conformance case launched alone at wave 64 / 32
                        (HIP_ON_CPU_TRACE: name, launches, blocks)
  <case>-<wave>.status  ok or FAILED: the case against the CPU backend, the suite's tolerances
  <case>-<wave>.kdig    after every launch, the digest of each buffer it was passed
                        (HIP_ON_CPU_KERNEL_DIGESTS: kernel, argument, bytes, FNV-1a 64)
  digests-64.tsv, digests-32.tsv   every checked output's digest (DUET_CONFORMANCE_DIGESTS)
and the exceptions file beside this script. Prints markdown: one row per kernel (entry points
grouped by name less their dtype / variant suffixes) with the cases that launched it, how many of
them pass against the CPU at wave 64 and at wave 32, how many of its launches' buffers are
bit-identical between wave 64 and wave 32 (every launch, compared as multisets per kernel so that
a case's thread interleaving does not matter), and over those cases' recorded outputs how many are
identical between the waves and which differences are listed exceptions. Then one row per case.
"""
import collections
import os
import re
import sys

SUFFIXES = {"f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz", "v1", "v2", "v3"}


def family(name):
    parts = name.split("_")
    while len(parts) > 1 and parts[-1] in SUFFIXES:
        parts.pop()
    return "_".join(parts)


def load_digests(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) != 9:
                continue
            case, name, cpu, occ, _be, _dt, _len, dev, same_cpu = p
            rows[(case, name, cpu, occ)] = (dev, same_cpu == "true")
    return rows


def base(case):
    return case.split(":")[0].split(" ")[0]


def main():
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    exceptions = set()
    with open(os.path.join(here, "wave-exceptions.txt")) as f:
        for l in f:
            p = l.split("#")[0].split()
            if len(p) == 2:
                exceptions.add((p[0], p[1]))
    launch_exc = {}
    with open(os.path.join(here, "launch-exceptions.txt")) as f:
        for l in f:
            p = l.split("#")[0].split()
            if len(p) == 3:
                launch_exc[tuple(p)] = True
    d64 = load_digests(os.path.join(out, "digests-64.tsv"))
    d32 = load_digests(os.path.join(out, "digests-32.tsv"))
    cases_dir = out
    # Per case: outputs recorded, identical 64 vs 32, differing, excepted, bit-equal to the CPU.
    per_case = collections.defaultdict(lambda: collections.Counter())
    for k in set(d64) | set(d32):
        c = per_case[base(k[0])]
        if k in d64 and k in d32:
            c["paired"] += 1
            if d64[k][0] == d32[k][0]:
                c["identical"] += 1
            else:
                c["differ"] += 1
                if (base(k[0]), k[1]) in exceptions or (base(k[0]), "*") in exceptions:
                    c["excepted"] += 1
            c["cpu64"] += d64[k][1]
            c["cpu32"] += d32[k][1]
        else:
            c["unpaired"] += 1
    status = {}
    kdig = collections.defaultdict(collections.Counter)  # (family, wave) -> Counter of lines
    kernels = collections.defaultdict(set)  # family -> cases
    entries = collections.defaultdict(set)  # family -> entry names
    for fn in sorted(os.listdir(cases_dir)):
        m = re.match(r"(.+)-(64|32)\.(status|trace|kdig)$", fn)
        if not m:
            continue
        case, wave, kind = m.groups()
        path = os.path.join(cases_dir, fn)
        if kind == "status":
            status[(case, wave)] = open(path).read().strip()
        elif kind == "kdig":
            for line in open(path):
                p = line.rstrip("\n").split("\t")
                if len(p) == 4:
                    kdig[(family(p[0]), wave)][(case, p[0], p[1], p[2], p[3])] += 1
        else:
            for line in open(path):
                p = line.split("\t")
                if p and p[0]:
                    kernels[family(p[0])].add(case)
                    entries[family(p[0])].add(p[0])
    print("| kernel | entry points | cases | wave 64 vs CPU | wave 32 vs CPU | launch buffers identical 64 vs 32 | recorded outputs identical 64 vs 32 | differing (listed exceptions) |")
    print("|---|---|---|---|---|---|---|---|")
    for fam in sorted(kernels):
        cs = sorted(kernels[fam])
        ok64 = sum(status.get((c, "64")) == "ok" for c in cs)
        ok32 = sum(status.get((c, "32")) == "ok" for c in cs)
        tot = collections.Counter()
        for c in cs:
            tot.update(per_case[c])
        a, b = kdig[(fam, "64")], kdig[(fam, "32")]
        same = sum((a & b).values())
        total = max(sum(a.values()), sum(b.values()))
        print(f"| {fam} | {len(entries[fam])} | {len(cs)} | {ok64}/{len(cs)} pass | {ok32}/{len(cs)} pass | "
              f"{same}/{total} | {tot['identical']}/{tot['paired']} | {tot['differ']} ({tot['excepted']}) |")
    # Launch buffers that differ between the waves, per case and kernel.
    diffs = []
    for (fam, wave), cnt in kdig.items():
        if wave != "64":
            continue
        other = kdig[(fam, "32")]
        by = collections.Counter()
        for key, n in (cnt - other).items():
            by[(key[0], key[1], key[2])] += n
        for key, n in (other - cnt).items():
            by[(key[0], key[1], key[2])] += n
        diffs += [(c, k, a, n) for (c, k, a), n in by.items()]
    print()
    unexplained = [d for d in diffs if (d[0], d[1], d[2]) not in launch_exc]
    if diffs:
        print("Launch buffers differing between wave 64 and wave 32 (case, kernel, argument, count):")
        for c, k, a, n in sorted(diffs):
            listed = "listed in launch-exceptions.txt" if (c, k, a) in launch_exc else "NOT LISTED"
            print(f"- {c} {k} arg {a}: {n} ({listed})")
    print(f"Launch buffers differing: {sum(d[3] for d in diffs)}, unlisted: {sum(d[3] for d in unexplained)}.")
    print()
    print("| case | wave 64 vs CPU | wave 32 vs CPU | outputs recorded | identical 64 vs 32 | bit-equal to CPU at 64 / 32 | differing (listed exceptions) | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    all_cases = sorted({c for c, _ in status})
    for c in all_cases:
        t = per_case[c]
        nk = sum(1 for fam in kernels if c in kernels[fam])
        print(f"| {c} | {status.get((c, '64'), '-')} | {status.get((c, '32'), '-')} | {t['paired']} | "
              f"{t['identical']} | {t['cpu64']} / {t['cpu32']} | {t['differ']} ({t['excepted']}) | {nk} |")


if __name__ == "__main__":
    main()
