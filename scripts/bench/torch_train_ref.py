#!/usr/bin/env python3
"""PyTorch reference trainer for issue 31: duet's loss curve next to PyTorch's, from the same
initial weights and the same batches.

How the pieces are used together (the duet side writes the checkpoint and the batches):

    # 1. duet: the step-0 weights, then the real run with every step's batch recorded
    duet train --preset gpt2 --data corpus.bin --steps 300 --precision bf16 \
        --out runs/init --stop-after 0            # runs/init/checkpoint-00000000.safetensors
    duet train --preset gpt2 --data corpus.bin --steps 300 --precision bf16 \
        --out runs/duet-bf16 --record-batches runs/batches.bin --loss-every 1
    #    (the same seed gives the same step-0 weights; runs/duet-bf16/metrics.jsonl is the curve)
    # 2. PyTorch from the same weights on the same batches, in bf16 and in fp32
    python3 scripts/bench/torch_train_ref.py --checkpoint runs/init/checkpoint-00000000.safetensors \
        --batches runs/batches.bin --precision bf16 --json runs/torch-bf16.jsonl
    python3 scripts/bench/torch_train_ref.py --checkpoint runs/init/checkpoint-00000000.safetensors \
        --batches runs/batches.bin --precision fp32 --json runs/torch-fp32.jsonl
    # 3. the tolerance check (see compare_curves.py for the band and its justification)
    python3 scripts/bench/compare_curves.py --duet runs/duet-bf16/metrics.jsonl \
        --torch runs/torch-bf16.jsonl --torch-fp32 runs/torch-fp32.jsonl

Only torch, numpy and the standard library: the safetensors file (8-byte LE header length, JSON
header, raw little-endian data; F32/BF16/F16) and the config TOML in its metadata (`config`) are
read here.

The model is GPT-2 as duet computes it (crates/engine/src/model): token + position embeddings,
pre-LN blocks (LayerNorm eps 1e-5 = duet's LN_EPS), causal self-attention with the fused c_attn
(q, k, v in that order, heads split as nanoGPT), MLP with GELU tanh (duet's CPU kernel
elementwise.rs computes the tanh form as x·σ(2u)), final LayerNorm, LM head tied to wte, no
dropout. Loss: mean cross-entropy over the targets ≥ 0, the softmax over f32 logits.
Optimizer: AdamW (fused on CUDA) with weight decay on the 2-D tensors only (wte, wpe and the
linear layers' matrices; duet's ParamSpec::decay), betas/eps/weight decay from the config;
clipping of the global norm as clip_grad_norm_ (duet's AdamWConfig::plan: coef =
clip / (norm + 1e-6) when < 1); the learning rate of step s (0-based) is duet's Config::lr_at
ported below, rounded to f32 as duet hands it to its kernel.

Step numbering follows duet's metrics.jsonl: the line `step: s` is the s-th update (1-based);
its loss is the forward loss of the s-th batch before that update, lr = lr_at(s - 1), and
grad_norm is the global norm before clipping.

Precision:
  fp32  everything FP32, TF32 off in matmuls and cuDNN (duet's fp32 is true FP32).
  tf32  FP32 with TF32 matmuls: a faster high-precision reference for the bf16 band (its
        rounding, 2^-11 relative, is 8x finer than bf16's 2^-8).
  bf16  FP32 master weights, torch.autocast(bfloat16): the linear layers' GEMMs and attention in
        bf16 with FP32 accumulation, LayerNorm, softmax/cross-entropy and the optimizer in FP32,
        the weight gradients rounded to bf16 by their GEMM then held as FP32 .grad — as duet's
        bf16 (precision.rs). Differences autocast cannot remove: duet stores *all* activations in
        bf16, the residual stream included, and keeps bf16 working copies of the embeddings and
        linear biases (params.rs), whereas under autocast the residual stream, the embedding sum
        and the bias adds stay FP32 (an FP32 tensor + a bf16 GEMM output promotes to FP32), and
        LayerNorm reads an FP32 input. duet's bf16 is therefore, if anything, a little further
        from FP32 than autocast; compare_curves.py measures the bf16 band on torch's side.
Vocabulary padding (--pad-vocab, default 128 on CUDA as duet does on the device): wte gets zero
rows up to a multiple, the logits are sliced back to the real vocabulary before the loss, so the
padded rows get zero gradients, zero AdamW updates and stay exactly zero: the same numbers, a
faster LM-head GEMM.
"""

import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LN_EPS = 1e-5  # duet: crates/engine/src/model/mod.rs LN_EPS
BATCH_MAGIC = b"DUETBAT1"


def die(msg):
    print(f"torch_train_ref: error: {msg}", file=sys.stderr)
    sys.exit(2)


# --------------------------------------------------------------------------------------------
# safetensors and TOML


def read_safetensors(path):
    """(tensors: name -> float32 numpy array, metadata: dict of str)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        die(f"cannot read checkpoint {path}: {e}")
    if len(raw) < 8:
        die(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        die(f"{path}: header length {n} past the end of the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        die(f"{path}: unreadable safetensors header: {e}")
    meta = header.pop("__metadata__", None) or {}
    data = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        dt, shape, (a, b) = info["dtype"], info["shape"], info["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        buf = data[a:b]
        if dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4", count=count)
        elif dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2", count=count).astype(np.float32)
        elif dt == "BF16":
            u = np.frombuffer(buf, dtype="<u2", count=count).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            die(f"{path}: tensor {name} has dtype {dt} (only F32, BF16, F16 are read)")
        if arr.nbytes // arr.itemsize != count or (b - a) != count * {"F32": 4}.get(dt, 2):
            die(f"{path}: tensor {name}: {b - a} bytes for shape {shape} in {dt}")
        out[name] = arr.reshape(shape).astype(np.float32, copy=True)
    return out, meta


def parse_toml(text):
    try:
        import tomllib  # Python 3.11+

        return tomllib.loads(text)
    except ImportError:
        pass
    # Minimal fallback for duet's flat config: [section] and key = scalar lines.
    res, cur = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            cur = res.setdefault(line[1:-1].strip(), {})
            continue
        k, _, v = line.partition("=")
        k, v = k.strip(), v.strip()
        if v.startswith('"'):
            val = v.strip('"')
        elif v in ("true", "false"):
            val = v == "true"
        else:
            try:
                val = int(v)
            except ValueError:
                val = float(v)
        (cur if cur is not None else res)[k] = val
    return res


# --------------------------------------------------------------------------------------------
# duet's learning-rate schedule (crates/engine/src/config.rs Config::lr_at), 0-based step


def f32(x):
    return float(np.float32(x))


def lr_at(step, tcfg):
    lr = f32(tcfg["lr"])  # duet's optimizer fields are f32, widened to f64 here
    warmup = int(tcfg.get("warmup", 0))
    steps = int(tcfg["steps"])
    sched = int(tcfg.get("schedule_steps", 0) or 0) or steps
    if step < warmup:
        v = lr * (step + 1) / warmup
    else:
        decay_steps = max(sched - warmup, 0)
        decay_steps = max(decay_steps, 1)
        progress = min((step - warmup) / decay_steps, 1.0)
        min_lr = lr * f32(tcfg.get("min_lr_ratio", 0.0))
        coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
        v = min_lr + coeff * (lr - min_lr)
    return float(np.float32(v))  # duet casts the f64 result to f32


# --------------------------------------------------------------------------------------------
# the batch file


def open_batches(path):
    """(B, T, memmap of shape (steps, 2, B, T) int32)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        die(f"cannot read batch file {path}: {e}")
    if len(head) < 16 or head[:8] != BATCH_MAGIC:
        die(f"{path}: not a duet batch file (magic {head[:8]!r}, expected {BATCH_MAGIC!r})")
    b, t = struct.unpack("<II", head[8:16])
    if b == 0 or t == 0:
        die(f"{path}: header says batch {b}, seq {t}")
    per = 2 * b * t * 4
    body = size - 16
    if body % per:
        die(f"{path}: {body} bytes of records is not a whole number of steps of {per} bytes "
            f"(batch {b} x seq {t}, inputs + targets as i32); truncated?")
    n = body // per
    if n == 0:
        die(f"{path}: no steps recorded")
    mm = np.memmap(path, dtype="<i4", mode="r", offset=16, shape=(n, 2, b, t))
    return b, t, mm


# --------------------------------------------------------------------------------------------
# the model (nanoGPT names, so the checkpoint loads by name)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q = q.view(b, t, self.nh, d // self.nh).transpose(1, 2)
        k = k.view(b, t, self.nh, d // self.nh).transpose(1, 2)
        v = v.view(b, t, self.nh, d // self.nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.c_fc = nn.Linear(d, f)
        self.c_proj = nn.Linear(f, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, nh, f):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=LN_EPS)
        self.attn = CausalSelfAttention(d, nh)
        self.ln_2 = nn.LayerNorm(d, eps=LN_EPS)
        self.mlp = MLP(d, f)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_rows, d, nh, f, layers, max_seq, vocab):
        super().__init__()
        self.vocab = vocab
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_rows, d),
            wpe=nn.Embedding(max_seq, d),
            h=nn.ModuleList([Block(d, nh, f) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d, eps=LN_EPS),
        ))
        self.lm_head = nn.Linear(d, vocab_rows, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if logits.shape[-1] != self.vocab:
            logits = logits[..., : self.vocab]  # padded rows take no part in the loss
        return logits


def expected_shapes(m):
    d, f, v, s = m["d_model"], m["ffn"], m["vocab"], m["max_seq"]
    sh = {"transformer.wte.weight": [v, d], "transformer.wpe.weight": [s, d],
          "transformer.ln_f.weight": [d], "transformer.ln_f.bias": [d], "lm_head.weight": [v, d]}
    for i in range(m["layers"]):
        p = f"transformer.h.{i}."
        sh.update({
            p + "ln_1.weight": [d], p + "ln_1.bias": [d],
            p + "attn.c_attn.weight": [3 * d, d], p + "attn.c_attn.bias": [3 * d],
            p + "attn.c_proj.weight": [d, d], p + "attn.c_proj.bias": [d],
            p + "ln_2.weight": [d], p + "ln_2.bias": [d],
            p + "mlp.c_fc.weight": [f, d], p + "mlp.c_fc.bias": [f],
            p + "mlp.c_proj.weight": [d, f], p + "mlp.c_proj.bias": [d],
        })
    return sh


def load_weights(model, tensors, mcfg, rows, prefix=""):
    """Copies the checkpoint's tensors (named `prefix + nanoGPT name`) into the model."""
    sd = model.state_dict()
    for name, shape in expected_shapes(mcfg).items():
        key = prefix + name
        if key not in tensors:
            if name == "lm_head.weight" and not prefix:
                continue  # tied: wte is enough
            die(f"checkpoint has no tensor {key}")
        arr = tensors[key]
        if list(arr.shape) != shape:
            die(f"checkpoint tensor {key} has shape {list(arr.shape)}, the config says {shape}")
        if name == "lm_head.weight":
            if not prefix and not np.array_equal(arr, tensors["transformer.wte.weight"]):
                die("checkpoint's lm_head.weight differs from transformer.wte.weight "
                    "(duet's head is tied)")
            continue
        dst = sd[name]
        with torch.no_grad():
            src = torch.from_numpy(arr)
            if name == "transformer.wte.weight" and rows != shape[0]:
                dst.zero_()
                dst[: shape[0]].copy_(src)
            else:
                dst.copy_(src)


# --------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="duet checkpoint (step 0 for issue 31)")
    ap.add_argument("--batches", required=True, help="file from duet train --record-batches")
    ap.add_argument("--steps", type=int, default=0, help="steps to train (default: all recorded)")
    ap.add_argument("--skip-batches", type=int, default=0,
                    help="recorded batches to skip first (when the checkpoint is at a later step "
                         "of the recorded run than its start)")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default=None,
                    help="default: the checkpoint config's precision (fp8/fp16 -> error)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--json", help="write one JSON line per step: step, loss, lr, grad_norm")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--pad-vocab", type=int, default=None,
                    help="pad wte rows to a multiple of this (exact; default 128 on CUDA, 1 on CPU)")
    ap.add_argument("--accum", type=int, default=1,
                    help="split each batch into this many micro-batches (same loss: sums over "
                         "the whole batch's valid targets); for memory only")
    ap.add_argument("--resume-optimizer", action="store_true",
                    help="also load the checkpoint's AdamW moments (optim.m.*, optim.v.*) and "
                         "step count, and continue the schedule at the checkpoint's step")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()

    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        die("--device cuda but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)

    tensors, meta = read_safetensors(args.checkpoint)
    if "config" not in meta:
        die(f"{args.checkpoint}: no `config` in the safetensors metadata (not a duet checkpoint?)")
    cfg = parse_toml(meta["config"])
    try:
        mcfg = {k: int(cfg["model"][k]) for k in
                ("vocab", "d_model", "heads", "ffn", "layers", "max_seq")}
        tcfg = cfg["train"]
        batch, seq = int(tcfg["batch"]), int(tcfg["seq"])
        _ = (tcfg["lr"], tcfg["steps"])
    except KeyError as e:
        die(f"{args.checkpoint}: config lacks {e}")
    if mcfg["d_model"] % mcfg["heads"]:
        die(f"heads {mcfg['heads']} do not divide d_model {mcfg['d_model']}")
    ck_step = int(meta.get("step", "0"))
    adam_steps = int(meta.get("adam_steps", str(ck_step)))

    precision = args.precision or str(tcfg.get("precision", "fp32"))
    if precision not in ("fp32", "tf32", "bf16"):
        die(f"precision {precision!r}: this reference runs fp32 or bf16 (give --precision)")

    b, t, recs = open_batches(args.batches)
    if (b, t) != (batch, seq):
        die(f"batch file {args.batches} holds batch {b} x seq {t}, the checkpoint's config "
            f"says batch {batch} x seq {seq}: not the same run")
    if t > mcfg["max_seq"]:
        die(f"seq {t} longer than the model's max_seq {mcfg['max_seq']}")
    avail = recs.shape[0] - args.skip_batches
    if avail <= 0:
        die(f"{args.batches}: {recs.shape[0]} steps recorded, --skip-batches {args.skip_batches}")
    steps = args.steps or avail
    if steps > avail:
        die(f"--steps {steps} but only {avail} batches recorded (after skipping "
            f"{args.skip_batches})")
    if batch % args.accum:
        die(f"--accum {args.accum} does not divide batch {batch}")
    recs = recs[args.skip_batches: args.skip_batches + steps]
    lo, hi = int(recs[:, 0].min()), int(recs[:, 0].max())
    if lo < 0 or hi >= mcfg["vocab"]:
        die(f"input tokens span [{lo}, {hi}], outside the vocabulary [0, {mcfg['vocab']})")
    if int(recs[:, 1].max()) >= mcfg["vocab"]:
        die(f"a target token is >= vocab {mcfg['vocab']}")
    start = ck_step if args.resume_optimizer else 0
    if not args.resume_optimizer and ck_step != 0:
        print(f"torch_train_ref: note: checkpoint is at step {ck_step}; the schedule starts at "
              f"step 0 (give --resume-optimizer to continue it)", file=sys.stderr)

    if precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    elif precision == "tf32":
        # FP32 with TF32 tensor-core matmuls (10 mantissa bits against bf16's 7): the
        # high-precision side of the bf16 band where true FP32 would take too long (GPT-2 at
        # B 32 is about 7x slower in FP32 than in TF32 on an H200).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")

    pad = args.pad_vocab or (128 if dev == "cuda" else 1)
    rows = -(-mcfg["vocab"] // pad) * pad
    torch.manual_seed(0)  # initial values are overwritten by the checkpoint
    model = GPT(rows, mcfg["d_model"], mcfg["heads"], mcfg["ffn"], mcfg["layers"],
                mcfg["max_seq"], mcfg["vocab"])
    load_weights(model, tensors, mcfg, rows)
    model.to(dev)
    assert model.lm_head.weight is model.transformer.wte.weight

    named = [(n, p) for n, p in model.named_parameters()]  # the tied weight appears once
    decay = [p for n, p in named if p.dim() >= 2]
    no_decay = [p for n, p in named if p.dim() < 2]
    # duet holds these as f32
    wd = f32(tcfg.get("weight_decay", 0.0))
    betas = (f32(tcfg.get("beta1", 0.9)), f32(tcfg.get("beta2", 0.999)))
    eps = f32(tcfg.get("eps", 1e-8))
    clip = f32(tcfg.get("grad_clip", 0.0))
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr_at(start, tcfg), betas=betas, eps=eps, fused=(dev == "cuda"))

    if args.resume_optimizer:
        sd_names = {id(p): n for n, p in named}
        for p in decay + no_decay:
            n = sd_names[id(p)]
            st = {}
            for kind, key in (("m", "exp_avg"), ("v", "exp_avg_sq")):
                name = f"optim.{kind}.{n}"
                if name not in tensors:
                    die(f"--resume-optimizer: checkpoint has no {name}")
                arr = torch.from_numpy(tensors[name])
                z = torch.zeros_like(p, memory_format=torch.preserve_format)
                if arr.shape != p.shape:
                    z[: arr.shape[0]].copy_(arr)
                else:
                    z.copy_(arr)
                st[key] = z
            st["step"] = torch.tensor(float(adam_steps), dtype=torch.float32,
                                      device=dev if dev == "cuda" else "cpu")
            opt.state[p] = st

    fwd = torch.compile(model) if args.compile else model
    amp = (torch.autocast(device_type=dev, dtype=torch.bfloat16) if precision == "bf16"
           else None)
    params = [p for _, p in named]
    out = open(args.json, "w") if args.json else None
    if not args.quiet:
        print(f"torch_train_ref: {mcfg} batch {batch} seq {seq}, {steps} steps from step {start}, "
              f"{precision} on {dev}, lr {tcfg['lr']} warmup {tcfg.get('warmup')} "
              f"clip {clip} wd {wd}, torch {torch.__version__}", file=sys.stderr)

    mb = batch // args.accum
    pending = []
    t0 = time.time()

    def flush():
        for s, lr, loss, gn in pending:
            rec = {"step": s, "loss": float(loss), "lr": lr, "grad_norm": float(gn)}
            if out:
                out.write(json.dumps(rec) + "\n")
            if not args.quiet and (s <= start + 3 or s % 10 == 0 or s == start + steps):
                print(f"step {s:6d} loss {rec['loss']:.6f} lr {lr:.4e} grad_norm "
                      f"{rec['grad_norm']:.4f} ({time.time() - t0:.1f}s)", file=sys.stderr)
        if out:
            out.flush()
        pending.clear()

    for i in range(steps):
        s0 = start + i  # 0-based step index, as lr_at takes it
        lr = lr_at(s0, tcfg)
        for g in opt.param_groups:
            g["lr"] = lr
        x_all = torch.from_numpy(np.array(recs[i, 0])).to(dev, torch.long)
        y_all = torch.from_numpy(np.array(recs[i, 1])).to(dev, torch.long)
        y_all = torch.where(y_all < 0, torch.full_like(y_all, -100), y_all)
        count = (y_all >= 0).sum().clamp(min=1).float()
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=dev)
        for a in range(args.accum):
            x, y = x_all[a * mb:(a + 1) * mb], y_all[a * mb:(a + 1) * mb]
            if amp is not None:
                with amp:
                    logits = fwd(x)
            else:
                logits = fwd(x)
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                                   ignore_index=-100, reduction="sum") / count
            loss.backward()
            total = total + loss.detach()
        if clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            gn = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))
        opt.step()
        pending.append((s0 + 1, lr, total, gn.detach()))
        if len(pending) >= 10:
            flush()
    flush()
    if out:
        out.close()
    if not args.quiet:
        print(f"torch_train_ref: {steps} steps in {time.time() - t0:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
