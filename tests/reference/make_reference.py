#!/usr/bin/env python3
"""Writes tests/reference/tiny_gpt.safetensors: a PyTorch (CPU, float32) reference for duet's GPT.

The model is written independently of duet, in plain PyTorch, following nanoGPT: token + position
embedding, pre-LN blocks (LN -> QKV -> causal multi-head attention -> projection -> residual,
LN -> FC -> GELU(tanh) -> FC -> residual), final LN, LM head tied to the token embedding.
Weights are initialised by PyTorch's own RNG (not duet's), so the Rust test checks the maths, not
the initialiser.

The fixture holds, for a fixed batch: the initial weights (`init.<name>`), the logits, the loss,
every gradient (`grad.<name>`), the weights after two AdamW steps with global-norm clipping
(`step2.<name>`) and the two losses. Metadata carries the config.

Usage (needs torch, numpy, safetensors):  python3 tests/reference/make_reference.py

With --check-duet it instead loads tests/reference/duet_checkpoint.safetensors (written by duet,
see tests/checkpoint_torch.rs) into this PyTorch model with load_state_dict(strict=True) and
compares its logits on the fixed batch of duet_logits.safetensors with duet's.
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

CFG = dict(vocab=96, d_model=32, heads=4, ffn=64, layers=2, max_seq=16)
BATCH, SEQ = 4, 16
# eps 1e-6 (not 1e-8): the key bias has a gradient that is zero in exact arithmetic (softmax ignores
# a per-row constant), so both sides hold only rounding noise there (~1e-9), and Adam turns noise into
# updates of size lr·g/(|g|+eps). With eps 1e-6 those stay far below the 1e-5 tolerance.
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.95), 1e-6, 0.1


class Block(nn.Module):
    def __init__(self, c, nh, f):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, f)
        self.mlp.c_proj = nn.Linear(f, c)

    def attention(self, x):
        b, t, c = x.shape
        hs = c // self.nh
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, hs).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.attn.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class GPT(nn.Module):
    def __init__(self, vocab, d_model, heads, ffn, layers, max_seq):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, d_model)
        self.transformer.wpe = nn.Embedding(max_seq, d_model)
        self.transformer.h = nn.ModuleList(Block(d_model, heads, ffn) for _ in range(layers))
        self.transformer.ln_f = nn.LayerNorm(d_model)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return x @ self.transformer.wte.weight.T  # tied LM head


def main():
    torch.manual_seed(0)
    model = GPT(**CFG)
    # Non-trivial LayerNorm affine parameters and biases, so their gradients are exercised.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight") else 0.0))
            else:
                p.copy_(torch.randn_like(p) * 0.1)

    g = torch.Generator().manual_seed(1)
    s = torch.randint(0, CFG["vocab"], (BATCH, 1), generator=g)
    k = torch.randint(1, CFG["vocab"], (BATCH, 1), generator=g)
    seq = (s + k * torch.arange(SEQ + 1)) % CFG["vocab"]
    inputs, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    targets[0, 0] = -1  # one ignored target

    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )

    out = {}
    losses, norms = [], []
    grad_clip = None
    for step in range(2):
        opt.zero_grad(set_to_none=False)
        logits = model(inputs)
        loss = F.cross_entropy(logits.view(-1, CFG["vocab"]), targets.view(-1), ignore_index=-1)
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().reshape(BATCH * SEQ, CFG["vocab"]).clone()
            for n, p in model.named_parameters():
                out[f"grad.{n}"] = p.grad.detach().clone()
            norm0 = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
            grad_clip = float(0.5 * norm0)  # make clipping active
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)))
        losses.append(float(loss.detach()))
        opt.step()

    for n, p in init.items():
        out[f"init.{n}"] = p
    for n, p in model.named_parameters():
        out[f"step2.{n}"] = p.detach().clone()
    out["input_ids"] = inputs.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float32)

    meta = {
        "model": json.dumps(CFG),
        "batch": str(BATCH),
        "seq": str(SEQ),
        "lr": repr(LR),
        "beta1": repr(BETAS[0]),
        "beta2": repr(BETAS[1]),
        "eps": repr(EPS),
        "weight_decay": repr(WD),
        "grad_clip": repr(grad_clip),
        "torch_version": torch.__version__,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_gpt.safetensors")
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    print(f"wrote {path}: losses {losses}, grad norms {norms}, clip {grad_clip}")


def check_duet_checkpoint():
    import tomllib

    from safetensors import safe_open
    from safetensors.torch import load_file

    here = os.path.dirname(os.path.abspath(__file__))
    ck_path = os.path.join(here, "duet_checkpoint.safetensors")
    with safe_open(ck_path, "pt") as f:
        meta = f.metadata()
    cfg = tomllib.loads(meta["config"])["model"]
    model = GPT(cfg["vocab"], cfg["d_model"], cfg["heads"], cfg["ffn"], cfg["layers"], cfg["max_seq"])
    tensors = load_file(ck_path)
    state = {k: v for k, v in tensors.items() if not k.startswith("optim.")}
    # nanoGPT ties lm_head.weight to the token embedding; duet stores a copy under both names.
    assert torch.equal(state.pop("lm_head.weight"), state["transformer.wte.weight"])
    model.load_state_dict(state, strict=True)
    ref = load_file(os.path.join(here, "duet_logits.safetensors"))
    with torch.no_grad():
        logits = model(ref["input_ids"].long()).reshape(-1, cfg["vocab"])
    err = ((logits - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
    print(f"loaded {len(state)} tensors with strict=True; logits vs duet: relative error {err:.2e}")
    assert err < 1e-5, err


if __name__ == "__main__":
    import sys

    if "--check-duet" in sys.argv:
        check_duet_checkpoint()
    else:
        main()
