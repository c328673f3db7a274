#!/usr/bin/env python3
"""Writes crates/engine/tests/fixtures/hf/: a tiny model exported by duet for Hugging Face, and
transformers' own logits and greedy continuations for it.

Steps:
1. `duet train --preset tiny --steps 1000 --seed 7 --lr 3e-3 --out RUN` trains a tiny GPT (vocab 96, d_model
   32, 4 heads, ffn 64, 2 layers, context 16) on duet's arithmetic-progression task on the CPU;
2. `duet export --format hf FIXTURE --checkpoint RUN` writes config.json and model.safetensors;
3. transformers loads the folder with `GPT2LMHeadModel.from_pretrained` (checking that no weight
   is missing, unexpected or mismatched, and that the LM head is the token embedding), and this
   script writes `reference.safetensors`: the logits (float32) of a few fixed token sequences
   and the greedy continuation (argmax of a full forward pass per new token) of two prompts.
   It also re-saves the model with `save_pretrained` and checks that transformers writes the same
   tensors under the same names as duet's exporter.

crates/engine/tests/hf_fixture.rs then checks, without PyTorch, that duet's `--init-from` loader
reads the folder, reproduces transformers' logits and greedy tokens on the CPU backend, and that
duet's exporter writes the same bytes again.

Usage (needs torch, transformers, safetensors; CPU only):
    cargo build --release --no-default-features
    python3 tests/reference/make_hf_fixture.py [--duet target/release/duet]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(ROOT, "crates", "engine", "tests", "fixtures", "hf")
# Full-context sequences (16 tokens) of the arithmetic task and of no pattern at all.
SEQUENCES = [
    [(3 + 5 * i) % 96 for i in range(16)],
    [(90 + 7 * i) % 96 for i in range(16)],
    [(i * 37 + 11) % 96 for i in range(16)],
]
PROMPTS = [[4, 8, 12, 16], [50, 53, 56]]
NEW_TOKENS = 10


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duet", default=os.path.join(ROOT, "target", "release", "duet"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        run([args.duet, "train", "--preset", "tiny", "--steps", "1000", "--seed", "7",
             "--lr", "3e-3", "--log-every", "0", "--out", run_dir])
        os.makedirs(FIXTURE, exist_ok=True)
        run([args.duet, "export", "--format", "hf", FIXTURE, "--checkpoint", run_dir, "--overwrite"])

    model, info = GPT2LMHeadModel.from_pretrained(FIXTURE, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info[kind], (kind, info[kind])
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "untied"
    assert model.config.activation_function == "gelu_new"

    # What transformers itself writes for this model: the same names and values as duet's file.
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        theirs = load_file(os.path.join(tmp, "model.safetensors"))
    ours = load_file(os.path.join(FIXTURE, "model.safetensors"))
    assert sorted(theirs) == sorted(ours), (sorted(set(theirs) ^ set(ours)))
    for k in ours:
        assert torch.equal(theirs[k], ours[k]), k

    out = {}
    with torch.no_grad():
        for i, seq in enumerate(SEQUENCES):
            ids = torch.tensor([seq])
            out[f"tokens.{i}"] = ids[0].to(torch.int32)
            out[f"logits.{i}"] = model(ids).logits[0].float().contiguous()
        margins = []
        for i, prompt in enumerate(PROMPTS):
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                logits = model(torch.tensor([ids])).logits[0, -1]
                top = torch.topk(logits, 2).values
                margins.append(float(top[0] - top[1]))
                ids.append(int(logits.argmax()))
            out[f"prompt.{i}"] = torch.tensor(prompt, dtype=torch.int32)
            out[f"greedy.{i}"] = torch.tensor(ids[len(prompt):], dtype=torch.int32)
            print(f"prompt {prompt} -> {ids[len(prompt):]}")
    # Greedy tokens are compared exactly: the top two logits must be far apart compared with
    # f32 rounding, or the fixture would test ties.
    print(f"smallest top-2 logit margin in the greedy runs: {min(margins):.4f}")
    assert min(margins) > 1e-3, margins

    meta = {
        "sequences": str(len(SEQUENCES)),
        "prompts": str(len(PROMPTS)),
        "new_tokens": str(NEW_TOKENS),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python": sys.version.split()[0],
    }
    path = os.path.join(FIXTURE, "reference.safetensors")
    save_file(out, path, metadata=meta)
    print(f"wrote {path} (transformers {transformers.__version__}, torch {torch.__version__})")
    with open(os.path.join(FIXTURE, "config.json")) as f:
        print(json.dumps(json.load(f)))


if __name__ == "__main__":
    main()
