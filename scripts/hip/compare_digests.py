#!/usr/bin/env python3
"""Compares two conformance digest files (DUET_CONFORMANCE_DIGESTS, crates/conformance/src/harness.rs)
written by two backends run with the same DUET_TEST_SEED: which checked outputs are bit-identical.

usage: compare_digests.py A.tsv B.tsv [--exceptions FILE]

Prints per case: outputs identical / differing / without a partner (a sub-case only one side ran,
e.g. FP8 formats the other's hardware lacks), then the differing outputs. With --exceptions, FILE
lists (one per line, '#' comments) `<case> <output|*>` pairs allowed to differ, <case> being the
case name before its first ':' or space: exit 1 if any other paired output differs. Exit 2 on
unreadable input.
"""
import collections
import sys


def load(path):
    rows = {}
    backend = None
    try:
        with open(path) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) != 9:
                    sys.exit(f"compare_digests: {path}: malformed line: {line!r}")
                case, name, cpu, occ, be, dtype, length, dev, same_cpu = p
                backend = be
                rows[(case, name, cpu, occ)] = (dtype, length, dev, same_cpu == "true")
    except OSError as e:
        print(f"compare_digests: {e}", file=sys.stderr)
        sys.exit(2)
    return backend, rows


def main():
    args = sys.argv[1:]
    exceptions = None
    if "--exceptions" in args:
        i = args.index("--exceptions")
        path = args[i + 1]
        del args[i : i + 2]
        exceptions = set()
        try:
            with open(path) as f:
                for l in f:
                    p = l.split("#")[0].split()
                    if len(p) == 2:
                        exceptions.add((p[0], p[1]))
                    elif p:
                        print(f"compare_digests: {path}: malformed line {l!r}", file=sys.stderr)
                        sys.exit(2)
        except OSError as e:
            print(f"compare_digests: {e}", file=sys.stderr)
            sys.exit(2)
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    ba, a = load(args[0])
    bb, b = load(args[1])
    per_case = collections.defaultdict(lambda: [0, 0, 0, 0])  # identical, differ, only a, only b
    differing = []
    for k in sorted(set(a) | set(b)):
        c = per_case[k[0]]
        if k in a and k in b:
            if a[k][2] == b[k][2]:
                c[0] += 1
            else:
                c[1] += 1
                differing.append(k)
        elif k in a:
            c[2] += 1
        else:
            c[3] += 1
    print(f"{'case':58} {'identical':>9} {'differ':>7} {'only ' + str(ba):>10} {'only ' + str(bb):>10}")
    tot = [0, 0, 0, 0]
    for case in sorted(per_case):
        c = per_case[case]
        tot = [x + y for x, y in zip(tot, c)]
        print(f"{case:58} {c[0]:9} {c[1]:7} {c[2]:10} {c[3]:10}")
    print(f"{'total':58} {tot[0]:9} {tot[1]:7} {tot[2]:10} {tot[3]:10}")
    cases_identical = sum(1 for c in per_case.values() if c[1] == 0 and c[0] > 0)
    print(f"cases with every paired output identical: {cases_identical} of {len(per_case)}")
    for k in differing:
        print(f"differs: {k[0]} {k[1]} ({a[k][0]}, {a[k][1]} bytes; {ba} equals cpu: {a[k][3]}, {bb}: {b[k][3]})")
    if exceptions is not None:
        def base(case):
            return case.split(":")[0].split(" ")[0]

        unexpected = [
            k for k in differing
            if (base(k[0]), k[1]) not in exceptions and (base(k[0]), "*") not in exceptions
        ]
        allowed = len(differing) - len(unexpected)
        for k in unexpected:
            print(f"FAIL {k[0]} {k[1]}: differs between {ba} and {bb} and is not a listed exception")
        print(f"differing outputs: {len(differing)}, all in listed exceptions: {allowed}, unexpected: {len(unexpected)}")
        if tot[0] == 0:
            print("FAIL no paired output was recorded")
            sys.exit(1)
        if unexpected:
            sys.exit(1)


if __name__ == "__main__":
    main()
