#!/usr/bin/env python3
"""PyTorch reference for `duet bench`: the identical GPT trained with PyTorch on the GPU.

Same model as duet (nanoGPT layout: token + position embedding, pre-LN blocks with fused
c_attn, GELU tanh MLP, final LayerNorm, LM head tied to the token embedding), same shapes,
same data (arithmetic progressions x_i = (s + i*k) mod vocab, k in 1..=max_stride), AdamW
(fused) with weight decay on matrices/embeddings only, global grad-norm clipping at 1.0.

Modes (--modes, comma list):
  eager-fp32         no autocast, TF32 off (duet's FP32 is true FP32)
  eager-bf16         autocast bf16
  eager-fp16         autocast fp16 + GradScaler
  compile-bf16       torch.compile(mode="default"), autocast bf16
  compile-bf16-ro    torch.compile(mode="reduce-overhead")
  compile-bf16-ma    torch.compile(mode="max-autotune")
  fp8-torchao        torchao float8 training (tensorwise), autocast bf16, eager
  fp8-torchao-compile  the same + torch.compile(mode="default")

Each mode warms up, then times --iters steps with CUDA events around every step (no host sync
between steps; the loss is never read inside the timed region) and prints one JSON object per
line with the same fields as `duet bench` (ms_per_step_median/min, tokens_per_s, model_tflops,
mfu, peak_memory_bytes). Peak memory is torch.cuda.max_memory_allocated over the timed steps
(not comparable under CUDA graphs, whose pools are allocated at capture). "telemetry" holds the
GPU's SM clock, power and temperature sampled through NVML while the timed steps run, as
`duet bench` does (null where NVML does not load).
"""

import argparse
import json
import math
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    "seed": dict(vocab=96, d_model=768, heads=12, ffn=3072, layers=4, seq=256, batch=32),
    "large": dict(vocab=96, d_model=2048, heads=16, ffn=8192, layers=12, seq=256, batch=32),
    "tiny": dict(vocab=96, d_model=32, heads=4, ffn=64, layers=2, seq=16, batch=4),
    # GPT-2's sizes with PyTorch at its best: the vocabulary padded to 50304 (nanoGPT's
    # choice; the data's tokens stay below 50257), the loss inside the compiled graph.
    "gpt2": dict(vocab=50304, d_model=768, heads=12, ffn=3072, layers=12, seq=1024, batch=32,
                 data_vocab=50257),
    "gpt2-medium": dict(vocab=50304, d_model=1024, heads=16, ffn=4096, layers=24, seq=1024,
                        batch=16, data_vocab=50257),
}


class Block(nn.Module):
    def __init__(self, c, nh, f):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.attn_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, f)
        self.mlp_proj = nn.Linear(f, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        k = k.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        v = v.view(b, t, self.nh, c // self.nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.attn_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, c, nh, f, layers, max_seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(max_seq, c)
        self.h = nn.ModuleList([Block(c, nh, f) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, proj_std if name.endswith("proj.weight") else std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def batches(vocab, b, t, max_stride, n, device, seed=1337):
    """n batches of progressions x_i = (s + i*k) mod vocab (inputs, next-token targets)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    i = torch.arange(t + 1)
    for _ in range(n):
        s = torch.randint(0, vocab, (b, 1), generator=g)
        k = torch.randint(1, max_stride + 1, (b, 1), generator=g)
        x = (s + i * k) % vocab
        out.append((x[:, :-1].contiguous().to(device), x[:, 1:].contiguous().to(device)))
    return out


def train_flops(p):
    """Dense matmul FLOPs of one training step (forward x3), counting the full T x T attention."""
    b, t, c, f, v, L, nh = p["batch"], p["seq"], p["d_model"], p["ffn"], p["vocab"], p["layers"], p["heads"]
    n = b * t
    per_layer = 2 * n * c * 3 * c + 2 * n * c * c + 2 * n * c * f * 2 + 2 * 2 * b * t * t * c
    return 3 * (L * per_layer + 2 * n * c * v)


def gemm_ceiling(dtype, size=8192, reps=20):
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    bb = torch.randn(size, size, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ bb
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for _ in range(reps):
        a @ bb
    e.record()
    torch.cuda.synchronize()
    return 2 * size**3 * reps / (s.elapsed_time(e) / 1e3) / 1e12


# The NVML sampler, run as its own process (no GIL shared with the timed steps): prints one line
# "sm_clock_mhz power_mw power_limit_mw temperature_c reasons instant" every PERIOD_MS until its
# stdin closes; exits 3 at once if NVML does not load or does not know the GPU (argv[1], its PCI
# bus id). Power as duet's loader reads it (crates/cuda/src/nvml.rs): the instantaneous board
# power (field NVML_FI_DEV_POWER_INSTANT; instant = 1) where the driver answers it, else
# nvmlDeviceGetPowerUsage, a trailing average of about a second (instant = 0).
SAMPLER = r"""
import ctypes, select, sys, time
n = ctypes.CDLL("libnvidia-ml.so.1")
d = ctypes.c_void_p()
if n.nvmlInit_v2() != 0 or n.nvmlDeviceGetHandleByPciBusId_v2(sys.argv[1].encode(), ctypes.byref(d)) != 0:
    sys.exit(3)
try:
    reasons = n.nvmlDeviceGetCurrentClocksEventReasons
except AttributeError:
    reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons


class Field(ctypes.Structure):  # nvmlFieldValue_t
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint),
                ("timestamp", ctypes.c_longlong), ("latencyUsec", ctypes.c_longlong),
                ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", ctypes.c_ulonglong)]


def instant_mw():
    f = Field(fieldId=186)  # NVML_FI_DEV_POWER_INSTANT
    if getattr(n, "nvmlDeviceGetFieldValues", None) is None:
        return None
    if n.nvmlDeviceGetFieldValues(d, 1, ctypes.byref(f)) != 0 or f.nvmlReturn != 0:
        return None
    # nvmlValueType_t, as duet's loader decodes it: unsigned int 1 and signed int 5 (the union's
    # low 4 bytes), unsigned long (long) 2, 3, signed long long 4; negative is no reading.
    low = f.value & 0xFFFFFFFF
    v = {1: low, 2: f.value, 3: f.value, 4: f.value - (1 << 64) if f.value >> 63 else f.value,
         5: low - (1 << 32) if low >> 31 else low}.get(f.valueType)
    return v if v is not None and v >= 0 else None


use_instant = instant_mw() is not None
u = [ctypes.c_uint() for _ in range(4)]
r = ctypes.c_ulonglong()
period = float(sys.argv[2]) / 1e3
while not select.select([sys.stdin], [], [], 0)[0]:
    p = instant_mw() if use_instant else None
    if (n.nvmlDeviceGetClockInfo(d, 1, ctypes.byref(u[0])) == 0  # NVML_CLOCK_SM
            and (p is not None or n.nvmlDeviceGetPowerUsage(d, ctypes.byref(u[1])) == 0)
            and n.nvmlDeviceGetEnforcedPowerLimit(d, ctypes.byref(u[2])) == 0
            and n.nvmlDeviceGetTemperature(d, 0, ctypes.byref(u[3])) == 0  # NVML_TEMPERATURE_GPU
            and reasons(d, ctypes.byref(r)) == 0):
        print(u[0].value, u[1].value if p is None else p, u[2].value, u[3].value, r.value,
              int(p is not None), flush=True)
    time.sleep(period)
"""


class Telemetry:
    """The GPU's SM clock, power and temperature through NVML (libnvidia-ml), sampled every
    5 ms by a separate process while the timed steps run; summary() gives the fields
    `duet bench` writes (src/cli_train.rs, telemetry_summary), or None without readings."""

    PERIOD_MS = 5
    # nvmlClocksEventReasons: software power cap, hardware power brake; thermal slowdowns.
    POWER, THERMAL = 0x4 | 0x80, 0x20 | 0x40

    def __init__(self):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.bus = f"{props.pci_domain_id:x}:{props.pci_bus_id:x}:{props.pci_device_id:x}.0"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SAMPLER, self.bus, str(self.PERIOD_MS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )

    def summary(self):
        if self.proc is None:
            return None
        try:
            out, _ = self.proc.communicate(input="stop\n", timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out = ""
        self.proc = None
        s = []
        for line in out.splitlines():
            f = line.split()
            if len(f) == 6:
                s.append((int(f[0]), int(f[1]) / 1e3, int(f[2]) / 1e3, int(f[3]), int(f[4]),
                          f[5] == "1"))
        if not s:
            return None
        n = len(s)
        med = lambda i: sorted(x[i] for x in s)[n // 2]
        return {
            "samples": n,
            "period_ms": self.PERIOD_MS,
            "sm_clock_mhz_median": float(med(0)),
            "sm_clock_mhz_min": float(min(x[0] for x in s)),
            "sm_clock_mhz_max": float(max(x[0] for x in s)),
            "power_w_median": med(1),
            "power_w_max": max(x[1] for x in s),
            "power_instant_share": sum(1 for x in s if x[5]) / n,
            "power_limit_w": med(2),
            "temperature_c_max": float(max(x[3] for x in s)),
            "power_capped_share": sum(1 for x in s if x[4] & self.POWER) / n,
            "thermal_slowdown_share": sum(1 for x in s if x[4] & self.THERMAL) / n,
        }


def run_mode(mode, p, args, ceilings, telemetry):
    torch.manual_seed(1337)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = GPT(p["vocab"], p["d_model"], p["heads"], p["ffn"], p["layers"], p["seq"]).to(dev)
    autocast_dtype = {"fp32": None, "fp16": torch.float16}.get(mode.split("-")[1], torch.bfloat16)
    if mode.startswith("fp8"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        cfg = Float8LinearConfig.from_recipe_name("tensorwise")
        convert_to_float8_training(
            model,
            config=cfg,
            module_filter_fn=lambda m, fqn: fqn != "lm_head"
            and m.in_features % 16 == 0
            and m.out_features % 16 == 0,
        )
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    scaler = torch.amp.GradScaler("cuda") if autocast_dtype == torch.float16 else None
    fwd = model
    if "compile" in mode:
        cmode = {"ro": "reduce-overhead", "ma": "max-autotune"}.get(mode.split("-")[-1], "default")
        fwd = torch.compile(model, mode=cmode)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is None:
            loss = fwd(x, y)
        else:
            with torch.autocast("cuda", dtype=autocast_dtype):
                loss = fwd(x, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        return loss

    data = batches(p.get("data_vocab", p["vocab"]), p["batch"], p["seq"], 8, 8, dev)
    t0 = time.time()
    for i in range(args.warmup):
        loss = step(*data[i % len(data)])
    first_loss = loss.item()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.iters)]
    telemetry.start()
    for i in range(args.iters):
        ev[i][0].record()
        loss = step(*data[i % len(data)])
        ev[i][1].record()
    torch.cuda.synchronize()
    tel = telemetry.summary()
    if args.profile:
        # Kernel time by kernel name over a few steps (torch.profiler; CUDA activity only), for
        # comparing each framework's attention, LayerNorm, classifier and optimizer kernels.
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                step(*data[i % len(data)])
            torch.cuda.synchronize()
        with open(args.profile, "a") as fh:
            fh.write(f"## {args.preset} {mode}: CUDA time over 3 steps\n")
            fh.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=45, max_name_column_width=70))
            fh.write("\n")
    times = sorted(s.elapsed_time(e) for s, e in ev)
    med = times[len(times) // 2]
    tokens = p["batch"] * p["seq"]
    flops = train_flops(p)
    tflops = flops / (med / 1e3) / 1e12
    ceil = ceilings["fp32" if autocast_dtype is None else "bf16"]
    return {
        "backend": "pytorch",
        "framework": f"torch {torch.__version__}",
        "device": torch.cuda.get_device_name(),
        "mode": mode,
        "precision": {None: "fp32", torch.float16: "fp16"}.get(autocast_dtype, "fp8" if mode.startswith("fp8") else "bf16"),
        "preset": args.preset,
        "batch": p["batch"],
        "seq": p["seq"],
        "ms_per_step_median": med,
        "ms_per_step_min": times[0],
        "tokens_per_s": tokens / (med / 1e3),
        "model_tflops": tflops,
        "gemm_ceiling_tflops": ceil,
        "mfu": tflops / ceil,
        "flops_per_step": flops,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "warmup_s": warm_s,
        "loss_after_warmup": first_loss,
        "loss_final": loss.item(),
        "timing": "CUDA events around each step",
        "telemetry": tel,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="seed", choices=sorted(PRESETS))
    ap.add_argument("--modes", default="eager-fp32,eager-bf16,eager-fp16,compile-bf16,compile-bf16-ro,compile-bf16-ma,fp8-torchao,fp8-torchao-compile")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", help="append one JSON line per mode to this file")
    ap.add_argument("--profile", help="append a torch.profiler kernel table (3 steps) per mode to this file")
    args = ap.parse_args()
    p = PRESETS[args.preset]
    ceilings = {"bf16": gemm_ceiling(torch.bfloat16), "fp32": gemm_ceiling(torch.float32, 4096, 5)}
    print(f"# gemm ceilings (TFLOP/s): {ceilings}", file=sys.stderr)
    telemetry = Telemetry()
    for mode in args.modes.split(","):
        try:
            r = run_mode(mode, p, args, ceilings, telemetry)
        except Exception as e:  # a failing mode (e.g. torchao missing) must not stop the others
            traceback.print_exc()
            r = {"backend": "pytorch", "mode": mode, "preset": args.preset, "error": f"{type(e).__name__}: {e}"}
        line = json.dumps(r)
        print(line, flush=True)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(line + "\n")
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
