#!/usr/bin/env python3
"""CPU self-test of torch_train_ref.py and compare_curves.py against the duet binary.

    /work/venv-hf/bin/python scripts/bench/test_torch_train_ref.py [--duet target/release/duet]

Needs torch + numpy and a built duet (it runs `duet train` / `duet generate` on the CPU, a few
seconds each, in a temporary folder). What it checks:

1. lr schedule: torch_train_ref.lr_at against the `lr` column of duet's metrics.jsonl for runs
   with warm-up + cosine (every step, exact f32 equality).
2. Training against duet, exactly: a corpus of one repeated byte makes every batch duet samples
   the same known batch (all inputs and targets = that byte), whatever its sampling RNG. duet
   trains 20 steps; a second duet run stops after step 1 and saves its checkpoint (weights and
   AdamW moments). torch_train_ref --resume-optimizer from that checkpoint, on a generated batch
   file of that batch, must reproduce duet's steps 2..20 (loss, grad norm, lr) at fp32: this
   covers the forward, the backward, clipping (the grad norm is ~5 > clip 1) and AdamW. Also
   with --pad-vocab 128 and --accum 2, which must give the same numbers.
3. The forward on varied tokens: greedy generation from a trained tiny arithmetic checkpoint,
   duet generate against argmax of torch_train_ref's model.
4. The batch-file reader and its errors: a header that disagrees with the config's batch/seq,
   a truncated file, a bad magic are refused with exit status 2.
5. Training a repeated random batch from a checkpoint lowers the loss, in fp32 and bf16
   (autocast on the CPU), and step 1's bf16 loss is close to fp32's.
6. compare_curves.py: passes duet fp32 vs torch fp32 with --tol, runs the band check on
   torch bf16/fp32, and fails (exit 1) on a curve whose lr differs.

`--cuda-smoke` instead runs, without duet (for the GPU machine, which has no duet build by
default), a synthetic GPT-2-vocabulary checkpoint written here (d 64, 2 layers, vocab 50257,
batch 8 x 128) through torch_train_ref on CUDA: fp32, bf16 with --resume-optimizer, bf16
--compile, bf16 --pad-vocab 1, then compare_curves on them.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, HERE)
import torch_train_ref as ref  # noqa: E402

PY = sys.executable
FAILS = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return r


def duet_train(duet, *args):
    r = sh([duet, "train", "--threads", "1", *args])
    if r.returncode:
        print(r.stdout, r.stderr)
        sys.exit(f"duet train {' '.join(args)} failed")
    return r


def metrics(path):
    return {int(r["step"]): r for r in map(json.loads, open(path)) if "loss" in r}


def write_batches(path, b, t, steps, magic=b"DUETBAT1"):
    """steps: list of (inputs, targets) int arrays of shape (b, t)."""
    with open(path, "wb") as f:
        f.write(magic + struct.pack("<II", b, t))
        for x, y in steps:
            f.write(np.asarray(x, "<i4").tobytes())
            f.write(np.asarray(y, "<i4").tobytes())


def trainer(*args):
    return sh([PY, os.path.join(HERE, "torch_train_ref.py"), "--device", "cpu", "--quiet",
               "--threads", "2", *args])


def write_checkpoint(path, tensors, meta):
    h, off, blobs = {}, 0, []
    for n, a in tensors.items():
        b = np.ascontiguousarray(a, "<f4").tobytes()
        h[n] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h["__metadata__"] = meta
    hb = json.dumps(h).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def cuda_smoke(tmp, dev="cuda"):
    cfg = ("[model]\nvocab = 50257\nd_model = 64\nheads = 4\nffn = 256\nlayers = 2\n"
           "max_seq = 128\n[train]\nsteps = 20\nbatch = 8\nseq = 128\nlr = 0.0006\n"
           "warmup = 5\nmin_lr_ratio = 0.1\nweight_decay = 0.1\nbeta1 = 0.9\nbeta2 = 0.95\n"
           "eps = 1e-8\ngrad_clip = 1.0\nprecision = \"bf16\"\n")
    mc = {k: int(v) for k, v in ref.parse_toml(cfg)["model"].items()}
    rng = np.random.default_rng(0)
    T = {}
    for n, s in ref.expected_shapes(mc).items():
        T[n] = (rng.standard_normal(s) * 0.02 if len(s) == 2 else
                np.ones(s) if n.endswith(".weight") else np.zeros(s)).astype(np.float32)
    T["lm_head.weight"] = T["transformer.wte.weight"]
    for n in list(T):
        if n != "lm_head.weight":
            T["optim.m." + n] = np.zeros_like(T[n])
            T["optim.v." + n] = np.zeros_like(T[n])
    ck = os.path.join(tmp, "ck.safetensors")
    write_checkpoint(ck, T, {"config": cfg, "step": "0", "adam_steps": "0"})
    steps = []
    for _ in range(20):
        x = rng.integers(0, 50257, (8, 129))
        steps.append((x[:, :-1], x[:, 1:]))
    bat = os.path.join(tmp, "b.bat")
    write_batches(bat, 8, 128, steps)
    runs = {"fp32": ["--precision", "fp32"], "bf16": ["--resume-optimizer"],
            "compile": ["--compile"], "pad1": ["--pad-vocab", "1"]}
    js = {}
    for name, extra in runs.items():
        js[name] = os.path.join(tmp, name + ".jsonl")
        r = sh([PY, os.path.join(HERE, "torch_train_ref.py"), "--device", dev,
                "--checkpoint", ck, "--batches", bat, "--json", js[name], *extra])
        print(r.stderr[-1500:])
        check(r.returncode == 0 and len(metrics(js[name])) == 20, f"{dev} {name}: 20 steps")
    cc = os.path.join(HERE, "compare_curves.py")
    for a, extra in (("compile", ["--torch-fp32", js["fp32"]]), ("pad1", ["--tol", "1e-2"])):
        r = sh([PY, cc, "--duet", js[a], "--torch", js["bf16"], *extra])
        print(r.stdout)
        check(r.returncode == 0, f"compare_curves {a} vs bf16 passes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-smoke", action="store_true",
                    help="only the synthetic CUDA run (no duet needed)")
    ap.add_argument("--duet", default=os.path.join(ROOT, "target", "release", "duet"))
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    a = ap.parse_args()
    duet = a.duet
    tmp = tempfile.mkdtemp(prefix="torch_train_ref_test.")
    print(f"work folder {tmp}")
    if a.cuda_smoke:
        cuda_smoke(tmp, os.environ.get("SMOKE_DEVICE", "cuda"))
        print(f"\n{len(FAILS)} failure(s)" if FAILS else "\nall checks passed")
        sys.exit(1 if FAILS else 0)

    # 1. lr schedule ---------------------------------------------------------------------------
    for extra in (["--steps", "40", "--warmup", "7", "--lr", "6e-4", "--min-lr-ratio", "0.1"],
                  ["--steps", "3"]):
        out = os.path.join(tmp, "lr" + extra[1])
        duet_train(duet, "--preset", "tiny", "--out", out, "--loss-every", "1", *extra)
        ck, meta = ref.read_safetensors(os.path.join(out, "checkpoint.safetensors"))
        tcfg = ref.parse_toml(meta["config"])["train"]
        m = metrics(os.path.join(out, "metrics.jsonl"))
        bad = [s for s, r in m.items() if ref.lr_at(s - 1, tcfg) != r["lr"]]
        check(not bad and len(m) == tcfg["steps"],
              f"lr_at equals duet's lr at all {len(m)} steps ({' '.join(extra)}); bad: {bad[:5]}")
        # the fallback TOML parser reads the same values
        sys_toml = ref.parse_toml(meta["config"])
        import builtins
        real_import = builtins.__import__

        def no_tomllib(name, *args, **kw):
            if name == "tomllib":
                raise ImportError
            return real_import(name, *args, **kw)
        builtins.__import__ = no_tomllib
        try:
            fb = ref.parse_toml(meta["config"])
        finally:
            builtins.__import__ = real_import
        check(fb == sys_toml, "fallback TOML parser reads duet's config as tomllib does")
        # shapes and the tied head as the checkpoint has them
        mc = sys_toml["model"]
        shapes = ref.expected_shapes({k: int(mc[k]) for k in
                                      ("vocab", "d_model", "heads", "ffn", "layers", "max_seq")})
        check(all(list(ck[n].shape) == s for n, s in shapes.items()),
              "checkpoint tensor shapes as expected_shapes (torch Linear layout)")
        check(np.array_equal(ck["lm_head.weight"], ck["transformer.wte.weight"]),
              "checkpoint's lm_head.weight == wte (tied)")

    # 2. exact training against duet on a one-byte corpus ------------------------------------
    corpus = os.path.join(tmp, "aaa.txt")
    with open(corpus, "w") as f:
        f.write("a" * 20000)
    full, one = os.path.join(tmp, "full"), os.path.join(tmp, "one")
    common = ["--preset", "tiny", "--data", corpus, "--steps", "20", "--loss-every", "1"]
    duet_train(duet, *common, "--out", full)
    duet_train(duet, *common, "--out", one, "--stop-after", "1")
    dm = metrics(os.path.join(full, "metrics.jsonl"))
    _, meta = ref.read_safetensors(os.path.join(one, "checkpoint.safetensors"))
    cfg = ref.parse_toml(meta["config"])
    b, t = cfg["train"]["batch"], cfg["train"]["seq"]
    tok = np.full((b, t), ord("a"))
    bat = os.path.join(tmp, "aaa.bat")
    write_batches(bat, b, t, [(tok, tok)] * 19)
    for extra in ([], ["--pad-vocab", "128"], ["--accum", "2"]):
        js = os.path.join(tmp, "t_aaa.jsonl")
        r = trainer("--checkpoint", os.path.join(one, "checkpoint.safetensors"),
                    "--batches", bat, "--precision", "fp32", "--resume-optimizer",
                    "--json", js, *extra)
        if r.returncode:
            print(r.stderr)
        tm = metrics(js)
        dl = max(abs(tm[s]["loss"] - dm[s]["loss"]) for s in tm)
        dg = max(abs(tm[s]["grad_norm"] - dm[s]["grad_norm"]) / dm[s]["grad_norm"] for s in tm)
        lr_eq = all(tm[s]["lr"] == dm[s]["lr"] for s in tm)
        check(r.returncode == 0 and sorted(tm) == list(range(2, 21)) and dl < 1e-5
              and dg < 1e-5 and lr_eq,
              f"fp32 steps 2..20 from duet's step-1 checkpoint {' '.join(extra) or '(plain)'}: "
              f"max |Δloss| {dl:.2e}, max rel Δgrad_norm {dg:.2e}, lr equal {lr_eq}")
        if not extra:
            fp32_js = os.path.join(tmp, "t_aaa_fp32.jsonl")
            os.replace(js, fp32_js)
    # the same through compare_curves (two curves, --tol)
    cc = os.path.join(HERE, "compare_curves.py")
    r = sh([PY, cc, "--duet", os.path.join(full, "metrics.jsonl"), "--torch", fp32_js,
            "--tol", "1e-4"])
    check(r.returncode == 0, "compare_curves: duet fp32 vs torch fp32 within 1e-4 (exit 0)")
    print(r.stdout)

    # 3. greedy generation from a trained arithmetic checkpoint ------------------------------
    ar = os.path.join(tmp, "arith")
    duet_train(duet, "--preset", "tiny", "--steps", "300", "--lr", "3e-3", "--out", ar)
    prompt = [3, 7, 11, 15, 19]
    r = sh([duet, "generate", "--checkpoint", ar, "--tokens", ",".join(map(str, prompt)),
            "--max-new", "10", "--threads", "1"])
    duet_gen = [int(x) for x in r.stdout.strip().split(",")]
    import torch
    tens, meta = ref.read_safetensors(os.path.join(ar, "checkpoint.safetensors"))
    mc = {k: int(v) for k, v in ref.parse_toml(meta["config"])["model"].items()}
    model = ref.GPT(mc["vocab"], mc["d_model"], mc["heads"], mc["ffn"], mc["layers"],
                    mc["max_seq"], mc["vocab"])
    ref.load_weights(model, tens, mc, mc["vocab"])
    seq = list(prompt)
    margins = []
    with torch.no_grad():
        for _ in range(10):
            lg = model(torch.tensor([seq]))[0, -1]
            top = torch.topk(lg, 2).values
            margins.append(float(top[0] - top[1]))
            seq.append(int(lg.argmax()))
    check(seq[len(prompt):] == duet_gen,
          f"greedy continuation of {prompt}: torch {seq[len(prompt):]} duet {duet_gen} "
          f"(least top-2 logit margin {min(margins):.3f})")

    # 4. batch-file errors -----------------------------------------------------------------
    ck0 = os.path.join(ar, "checkpoint.safetensors")
    bcfg = ref.parse_toml(meta["config"])["train"]
    b, t = bcfg["batch"], bcfg["seq"]
    rng = np.random.default_rng(0)
    x = rng.integers(0, mc["vocab"], (b, t))
    y = np.roll(x, -1, axis=1)
    y[:, -1] = -1  # an ignored target
    wrong = os.path.join(tmp, "wrong.bat")
    write_batches(wrong, b + 1, t, [(np.zeros((b + 1, t)), np.zeros((b + 1, t)))])
    r = trainer("--checkpoint", ck0, "--batches", wrong)
    check(r.returncode == 2 and "batch" in r.stderr and "not the same run" in r.stderr,
          f"batch/seq mismatch refused: {r.stderr.strip()}")
    good = os.path.join(tmp, "rand.bat")
    write_batches(good, b, t, [(x, y)] * 30)
    trunc = os.path.join(tmp, "trunc.bat")
    with open(good, "rb") as f, open(trunc, "wb") as g:
        g.write(f.read()[:-4])
    r = trainer("--checkpoint", ck0, "--batches", trunc)
    check(r.returncode == 2 and "truncated" in r.stderr, f"truncated file refused: "
          f"{r.stderr.strip()}")
    bad = os.path.join(tmp, "magic.bat")
    write_batches(bad, b, t, [(x, y)], magic=b"DUETBATX")
    r = trainer("--checkpoint", ck0, "--batches", bad)
    check(r.returncode == 2 and "magic" in r.stderr, f"bad magic refused: {r.stderr.strip()}")
    r = trainer("--checkpoint", ck0, "--batches", good, "--steps", "31")
    check(r.returncode == 2 and "only 30" in r.stderr, f"too many steps refused: "
          f"{r.stderr.strip()}")

    # 5. a repeated batch is learnt, fp32 and bf16 ------------------------------------------
    curves = {}
    for prec in ("fp32", "bf16"):
        js = os.path.join(tmp, f"rand_{prec}.jsonl")
        r = trainer("--checkpoint", ck0, "--batches", good, "--precision", prec, "--json", js)
        curves[prec] = js
        m = metrics(js)
        check(r.returncode == 0 and len(m) == 30 and m[30]["loss"] < 0.7 * m[1]["loss"],
              f"{prec}: repeated batch loss {m[1]['loss']:.4f} -> {m[30]['loss']:.4f}")
    m32, m16 = metrics(curves["fp32"]), metrics(curves["bf16"])
    d1 = abs(m32[1]["loss"] - m16[1]["loss"])
    check(0 < d1 < 0.05, f"step-1 loss bf16 vs fp32 differ by {d1:.2e} (nonzero, < 0.05)")
    # the ignored target: loss = mean CE over targets >= 0, checked by hand
    with torch.no_grad():
        lg = model(torch.tensor(x))
        yy = torch.tensor(y)
        ce = torch.nn.functional.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]),
                                               yy[:, :-1].reshape(-1))
    check(abs(float(ce) - m32[1]["loss"]) < 1e-5,
          f"step-1 loss is the mean CE over targets >= 0 ({float(ce):.6f} vs "
          f"{m32[1]['loss']:.6f})")

    # 6. compare_curves band check and lr mismatch ------------------------------------------
    r = sh([PY, cc, "--duet", curves["bf16"], "--torch", curves["bf16"],
            "--torch-fp32", curves["fp32"]])
    check(r.returncode == 0 and "PASS" in r.stdout, "compare_curves: identical bf16 curves pass")
    shifted = os.path.join(tmp, "shifted.jsonl")
    with open(shifted, "w") as f:
        for s, rr in sorted(m16.items()):
            f.write(json.dumps(dict(rr, loss=rr["loss"] + 1.0)) + "\n")
    r = sh([PY, cc, "--duet", shifted, "--torch", curves["bf16"], "--torch-fp32",
            curves["fp32"]])
    check(r.returncode == 1 and "FAIL" in r.stdout, "compare_curves: a curve 1.0 off fails")
    badlr = os.path.join(tmp, "badlr.jsonl")
    with open(badlr, "w") as f:
        for s, rr in sorted(m16.items()):
            f.write(json.dumps(dict(rr, lr=rr["lr"] * (1.01 if s == 5 else 1))) + "\n")
    r = sh([PY, cc, "--duet", badlr, "--torch", curves["bf16"], "--torch-fp32", curves["fp32"]])
    check(r.returncode == 1 and "learning rates differ" in r.stdout,
          "compare_curves: an lr mismatch is an error (exit 1)")
    print(r.stdout)

    if not a.keep:
        import shutil
        shutil.rmtree(tmp)
    print(f"\n{len(FAILS)} failure(s)" if FAILS else "\nall checks passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
