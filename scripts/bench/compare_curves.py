#!/usr/bin/env python3
"""Compares duet's loss curve with PyTorch's (issue 31) and checks a bf16 tolerance.

Usage (after the duet and torch_train_ref.py runs described at the top of torch_train_ref.py):

    python3 scripts/bench/compare_curves.py --duet runs/duet-bf16/metrics.jsonl \
        --torch runs/torch-bf16.jsonl --torch-fp32 runs/torch-fp32.jsonl [--k 2] [--window 10]
    # two curves only (e.g. duet fp32 against torch fp32), with an absolute tolerance:
    python3 scripts/bench/compare_curves.py --duet runs/duet-fp32/metrics.jsonl \
        --torch runs/torch-fp32.jsonl --tol 1e-3

Each file holds one JSON object per line with `step` (1-based, duet's numbering), `loss`, `lr`
and `grad_norm` (duet's metrics.jsonl and torch_train_ref.py --json both do; other keys and lines
without a loss are ignored). Only the steps present in every curve are compared.

Reported: per step |Δloss| (max, mean, the worst step) and the same on the trailing moving
average of each curve over `--window` steps (10); grad-norm differences for information; and
the learning rate of every step, which must agree to 1e-6 relative between all curves — it
depends only on the step and the config, so a mismatch means the two schedules (or the step
numbering) differ and is reported as an error whatever the losses say.

The tolerance (with --torch-fp32) and why:
  band = max over steps of |MA(torch bf16) − MA(torch fp32)|, MA the moving average.
  pass when max over steps of |MA(duet bf16) − MA(torch bf16)| ≤ k · band   (k = 2)
       and  mean over steps of the same            ≤ k · mean band.
  Both runs start from the same weights and see the same batches, so the data noise is common to
  all curves and what separates them is arithmetic only. The rounding of bf16 perturbs every step
  and training amplifies the perturbations (the trajectories diverge slowly), so a correct bf16
  implementation cannot be expected to follow another one more closely than either follows FP32.
  torch bf16 − torch fp32 measures that effect on this very model, corpus and schedule. Two
  correct bf16 implementations are each FP32 plus a rounding perturbation of that size; if the
  perturbations are independent their difference is about √2 times one of them, and if they
  are correlated less. k = 2 covers √2 with room for the estimate's own noise (the band is one
  sample of a random quantity) and for duet's bf16 storing a little more in bf16 than autocast
  does (the residual stream, embeddings and biases: see torch_train_ref.py). A real discrepancy
  (a different schedule, LayerNorm eps, GELU form, weight-decay set, clipping rule, a missed
  gradient) moves the curve systematically and grows with the steps, well past this band.
  The comparison is made on the moving average because single steps' losses cross and re-cross
  (the per-step band is near zero at the crossings and says nothing there); the average removes
  the step-to-step jitter, not the drift a bug causes. A scalar band (its max over the run, and
  its mean for the mean) is used for the same reason. --floor sets a least band (default 0) for
  the case where the fp32 and bf16 curves happen to agree almost exactly over a short run.
  With --duet-fp32 the report adds duet's own bf16-vs-fp32 band and duet fp32 vs torch fp32
  (informative: FP32 against FP32 should agree far more closely than the bf16 band).

Exit status: 0 pass (or only a report without a tolerance), 1 out of tolerance or a learning
rate mismatch, 2 unreadable input.
"""

import argparse
import json
import math
import sys


def load(path):
    try:
        f = open(path)
    except OSError as e:
        print(f"compare_curves: error: cannot read {path}: {e}", file=sys.stderr)
        sys.exit(2)
    out = {}
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"compare_curves: error: {path}:{n}: not JSON: {e}", file=sys.stderr)
                sys.exit(2)
            if not isinstance(r, dict) or "step" not in r or r.get("loss") is None:
                continue
            out[int(r["step"])] = r
    if not out:
        print(f"compare_curves: error: {path}: no step with a loss", file=sys.stderr)
        sys.exit(2)
    return out


def moving_average(xs, w):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= w:
            acc -= xs[i - w]
        out.append(acc / min(i + 1, w))
    return out


def diff_stats(steps, a, b):
    d = [abs(x - y) for x, y in zip(a, b)]
    i = max(range(len(d)), key=d.__getitem__)
    return {"max": d[i], "mean": sum(d) / len(d), "at": steps[i], "last": d[-1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duet", required=True, help="duet's metrics.jsonl (bf16 for the check)")
    ap.add_argument("--torch", required=True, help="torch_train_ref.py --json, same precision")
    ap.add_argument("--torch-fp32", help="torch_train_ref.py --json at fp32: gives the bf16 band")
    ap.add_argument("--duet-fp32", help="duet's metrics.jsonl at fp32 (informative)")
    ap.add_argument("--k", type=float, default=2.0, help="multiple of the band allowed (2)")
    ap.add_argument("--window", type=int, default=10, help="moving-average window (10)")
    ap.add_argument("--floor", type=float, default=0.0, help="least band (0)")
    ap.add_argument("--tol", type=float, default=None,
                    help="without --torch-fp32: absolute tolerance on the moving average's max")
    ap.add_argument("--lr-rtol", type=float, default=1e-6)
    ap.add_argument("--json", help="also write the numbers as one JSON object here")
    args = ap.parse_args()

    curves = {"duet": load(args.duet), "torch": load(args.torch)}
    if args.torch_fp32:
        curves["torch_fp32"] = load(args.torch_fp32)
    if args.duet_fp32:
        curves["duet_fp32"] = load(args.duet_fp32)
    common = set.intersection(*(set(c) for c in curves.values()))
    if not common:
        print("compare_curves: error: no step is present in every curve", file=sys.stderr)
        sys.exit(2)
    steps = sorted(common)
    for name, c in curves.items():
        missing = len(c) - len(steps)
        if missing:
            print(f"note: {name}: {missing} steps not in every curve are left out")
    if steps != list(range(steps[0], steps[-1] + 1)):
        print(f"note: the common steps are not contiguous ({len(steps)} steps in "
              f"{steps[0]}..{steps[-1]}); the moving average runs over them as listed")

    ok = True
    res = {"steps": len(steps), "first": steps[0], "last": steps[-1]}

    # learning rates: the schedule depends on the step only
    bad = []
    names = list(curves)
    for s in steps:
        lrs = {n: curves[n][s].get("lr") for n in names}
        if any(v is None for v in lrs.values()):
            continue
        ref = lrs[names[0]]
        for n in names[1:]:
            if abs(lrs[n] - ref) > args.lr_rtol * max(abs(ref), 1e-30):
                bad.append((s, names[0], ref, n, lrs[n]))
    res["lr_mismatches"] = len(bad)
    if bad:
        ok = False
        print(f"ERROR: learning rates differ at {len({x[0] for x in bad})} steps (the "
              f"schedules or the step "
              f"numbering differ); first: step {bad[0][0]}: {bad[0][1]} {bad[0][2]!r} vs "
              f"{bad[0][3]} {bad[0][4]!r}")
    else:
        print(f"lr: equal to {args.lr_rtol:g} relative at all {len(steps)} steps")

    loss = {n: [float(curves[n][s]["loss"]) for s in steps] for n in names}
    ma = {n: moving_average(v, args.window) for n, v in loss.items()}
    for n, v in loss.items():
        if not all(math.isfinite(x) for x in v):
            ok = False
            print(f"ERROR: {n} has a non-finite loss")

    pairs = [("duet", "torch")]
    if "torch_fp32" in curves:
        pairs.append(("torch", "torch_fp32"))
    if "duet_fp32" in curves:
        pairs.append(("duet", "duet_fp32"))
        if "torch_fp32" in curves:
            pairs.append(("duet_fp32", "torch_fp32"))
    print(f"\n{len(steps)} steps ({steps[0]}..{steps[-1]}), moving average window {args.window}")
    hdr = f"{'pair':<24} {'max|Δ|':>10} {'mean|Δ|':>10} {'at':>6} {'MA max':>10} " \
          f"{'MA mean':>10} {'MA at':>6} {'last MA':>10} {'max|Δgn|/gn':>12}"
    print(hdr)
    print("-" * len(hdr))
    for a, b in pairs:
        raw = diff_stats(steps, loss[a], loss[b])
        sm = diff_stats(steps, ma[a], ma[b])
        gn = [(curves[a][s].get("grad_norm"), curves[b][s].get("grad_norm")) for s in steps]
        gn = [abs(x - y) / max(abs(y), 1e-30) for x, y in gn if x is not None and y is not None]
        gmax = max(gn) if gn else float("nan")
        res[f"{a}-{b}"] = {"raw": raw, "ma": sm, "grad_norm_rel_max": gmax}
        print(f"{a + ' - ' + b:<24} {raw['max']:10.3e} {raw['mean']:10.3e} {raw['at']:6d} "
              f"{sm['max']:10.3e} {sm['mean']:10.3e} {sm['at']:6d} {sm['last']:10.3e} "
              f"{gmax:12.3e}")
    print(f"\nlosses at the last step {steps[-1]}: " +
          ", ".join(f"{n} {loss[n][-1]:.5f}" for n in names))

    d = res["duet-torch"]["ma"]
    if "torch_fp32" in curves:
        band = res["torch-torch_fp32"]["ma"]
        bmax, bmean = max(band["max"], args.floor), max(band["mean"], args.floor)
        lim_max, lim_mean = args.k * bmax, args.k * bmean
        pass_max, pass_mean = d["max"] <= lim_max, d["mean"] <= lim_mean
        res["tolerance"] = {"k": args.k, "band_max": bmax, "band_mean": bmean,
                            "pass": pass_max and pass_mean}
        print(f"\ntolerance: |MA(duet) - MA(torch)| within {args.k:g} x the bf16 band "
              f"|MA(torch) - MA(torch fp32)|")
        print(f"  max : {d['max']:.3e} <= {args.k:g} x {bmax:.3e} = {lim_max:.3e}  "
              f"{'ok' if pass_max else 'FAIL'}")
        print(f"  mean: {d['mean']:.3e} <= {args.k:g} x {bmean:.3e} = {lim_mean:.3e}  "
              f"{'ok' if pass_mean else 'FAIL'}")
        ok = ok and pass_max and pass_mean
    elif args.tol is not None:
        p = d["max"] <= args.tol
        res["tolerance"] = {"tol": args.tol, "pass": p}
        print(f"\ntolerance: MA max {d['max']:.3e} <= {args.tol:g}  {'ok' if p else 'FAIL'}")
        ok = ok and p
    else:
        print("\n(no tolerance: give --torch-fp32 or --tol)")
    res["pass"] = ok
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
            f.write("\n")
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
