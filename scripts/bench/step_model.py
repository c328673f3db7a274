#!/usr/bin/env python3
"""A model of duet's training step: FLOPs and bytes moved per kernel against a device's peak
figures, so a step time can be put on paper for a GPU that has not run it (MI300X).

    scripts/bench/step_model.py --device mi300x --preset seed --precision bf16,fp8
    scripts/bench/step_model.py --device h200 --validate BENCH.json [BENCH.json ...]
    scripts/bench/step_model.py --device h200 --preset large --kernels      # the kernel table

The step is the one the CUDA backend runs (and the HIP backend will once its fused paths exist,
issue 29): per block LayerNorm, the QKV GEMM with its bias epilogue, flash attention (no T x T
matrix), the projection with bias + residual, LayerNorm, the MLP GEMMs with bias + GELU (keeping
the pre-activation) and bias + residual epilogues; the backward with the GELU recomputed for the
weight gradient, LayerNorm backward fused with the bias column sums, deterministic flash
attention backward; the LM head, the fused classifier; the multi-tensor norm and AdamW. FP8
(HYBRID delayed scaling) runs all three GEMMs of a linear layer in FP8 with the quantisation
fused into LayerNorm, GELU and the gradient side, and AdamW writing the weight codes.

Each kernel takes max(FLOPs / compute, bytes / bandwidth) plus a fixed cost per launch:
  compute   = peak (bf16 or FP8 dense) x gemm_efficiency x wave efficiency x clock ratio
  bandwidth = peak HBM bandwidth x memory_efficiency
The efficiencies are the model's only fitted numbers, and they are the same for every device:
gemm_efficiency is what cuBLASLt reaches at 8192^3 on the H200 (duet bench's GEMM ceiling:
808 of 989 TFLOP/s bf16, 1505 of 1979 FP8), memory_efficiency what a streaming kernel reaches
(about 85 % of HBM peak on Hopper and CDNA3), the launch cost that of a kernel in a recorded
graph. The wave efficiency counts the last, partly filled wave of 128 x 128 output tiles over
the device's compute units. The clock ratio is 1 (boost clock) unless a bench JSON's telemetry
gives the median SM clock of the measured run (the H200 is power-capped on large models).

--validate reads `duet bench --json` files (model, batch, seq, precision, measured ms, telemetry)
and prints the modelled step next to the measured one; it exits 1 if any is off by more than
--tolerance (default 20 %).
"""

import argparse
import json
import math
import sys

DEVICES = {
    # peak dense TFLOP/s (bf16, fp8), HBM TB/s, compute units, boost SM clock (MHz)
    # and fp32: the peak of scalar f32 FMAs on the vector units (not packed: MI300X's 163.4
    # TFLOP/s needs packed FP32, which the portable kernels' scalar FMAs do not use)
    "h200": dict(name="NVIDIA H200 SXM", bf16=989.4, fp8=1978.9, bw=4.8, cus=132, clock=1980,
                 fp32=66.9),
    "h100": dict(name="NVIDIA H100 SXM", bf16=989.4, fp8=1978.9, bw=3.35, cus=132, clock=1980,
                 fp32=66.9),
    "mi300x": dict(name="AMD MI300X", bf16=1307.4, fp8=2614.9, bw=5.3, cus=304, clock=2100,
                   fp32=81.7),
}

PRESETS = {
    # d_model, layers, heads, ffn, vocab, batch, seq (duet's presets at their default batch)
    "seed": dict(d_model=768, layers=4, heads=12, ffn=3072, vocab=96, batch=32, seq=256),
    "large": dict(d_model=2048, layers=12, heads=16, ffn=8192, vocab=96, batch=32, seq=256),
    "gpt2": dict(d_model=768, layers=12, heads=12, ffn=3072, vocab=50257, batch=32, seq=1024),
    "gpt2-medium": dict(d_model=1024, layers=24, heads=16, ffn=4096, vocab=50257, batch=16, seq=1024),
}

GEMM_EFFICIENCY = {"bf16": 0.82, "fp8": 0.76}
# The fraction of the fp32 peak the flash-attention kernels' scalar inner products reach (HIP's
# portable path), a guess: their inner loops are an FMA and a
# shared-memory load per two elements.
VECTOR_EFFICIENCY = 0.5
# Which flash attention (--attention): "tensor" (CUDA's mma.sync kernels: every product on the
# matrix units), "portable" (HIP's default: every product scalar FMAs, whole tiles up to the
# diagonal, the backward recomputing S and dP in both kernels: 2 + 7 products instead of 2 + 5),
# "mfma" (HIP's opt-in: the same tiles and products on the matrix units).
ATTENTION = ("tensor", "portable", "mfma")
MEMORY_EFFICIENCY = 0.85
LAUNCH_US = 2.5
TILE = 128
K_FILL = 128


def kernels(m, precision, attention="tensor"):
    """The step's kernels: (name, count, kind, flops, bytes, gemm shape (m, n) or None)."""
    d, L, f, B, T = m["d_model"], m["layers"], m["ffn"], m["batch"], m["seq"]
    V = math.ceil(m["vocab"] / 128) * 128  # held padded to a multiple of 128 rows
    N = B * T
    a = 2  # bf16 activations
    fp8 = precision == "fp8"
    q = 1 if fp8 else a  # GEMM operand bytes
    g = "gemm8" if fp8 else "gemm"
    heads = m["heads"]
    ks = []

    def k(name, kind, flops, nbytes, shape=None, count=L):
        ks.append((name, count, kind, flops, nbytes, shape))

    def linear(name, n_in, n_out, epilogue_bytes):
        # forward: y = x W + b (+ epilogue); x is N x n_in; W is n_in x n_out
        k(f"{name} fwd", g, 2 * N * n_in * n_out, (N * n_in + n_in * n_out) * q + epilogue_bytes,
          (N, n_out, n_in))

    def linear_bwd(name, n_in, n_out, dgrad_extra):
        k(f"{name} dgrad", g, 2 * N * n_in * n_out, (N * n_out + n_in * n_out) * q + N * n_in * a
          + dgrad_extra, (N, n_in, n_out))
        k(f"{name} wgrad", g, 2 * N * n_in * n_out, (N * n_out + N * n_in) * q + n_in * n_out * a,
          (n_in, n_out, N))
        if fp8:
            # the gradient side quantised (and its transpose) with the bias sum, one pass
            k(f"{name} quantize grad", "mem", 0, N * n_out * (a + 2))

    # ---- forward, per block
    ln_out = N * d * (2 if fp8 else a)  # FP8: codes and transposed codes, no bf16 output
    k("ln_1 fwd", "mem", 0, N * d * a + ln_out + 8 * N)
    linear("qkv", d, 3 * d, N * 3 * d * a)
    hs = d // heads
    # A product of the causal attention (e.g. Q.K^T over j <= i) is N.T.d FLOPs; HIP's kernels
    # compute whole tiles up to the diagonal: (n + 1) / n of that with n query tiles of BR rows.
    n_tiles = math.ceil(T / (64 if hs <= 64 else 32))
    tiled = (n_tiles + 1) / n_tiles
    fwd_bytes = 4 * N * d * a + 4 * B * heads * T
    bwd_bytes = 10 * N * d * a + 8 * B * heads * T

    def attention_kernel(name, products, nbytes):
        if attention == "tensor":
            k(name, "attn", products * N * T * d, nbytes, (N, d, hs))
        elif attention == "portable":
            k(name, "vec", products * N * T * d * tiled, nbytes)
        else:
            k(name, "attn", products * N * T * d * tiled, nbytes, (N, d, hs))

    attention_kernel("flash attention fwd", 2, fwd_bytes)
    if fp8:
        k("quantize attn out", "mem", 0, N * d * (a + 2))
    linear("proj", d, d, 2 * N * d * a)  # + residual (read and write)
    k("ln_2 fwd", "mem", 0, N * d * a + ln_out + 8 * N)
    # bias + GELU epilogue: writes the pre-activation (kept) and, in bf16, gelu(pre)
    linear("fc", d, f, N * f * a * (1 if fp8 else 2))
    if fp8:
        k("quantize gelu", "mem", 0, N * f * (a + 2))
    linear("fc2", f, d, 2 * N * d * a)
    # ---- backward, per block
    linear_bwd("fc2", f, d, 0)
    if not fp8:
        k("gelu recompute", "mem", 0, 2 * N * f * a)
    linear_bwd("fc", d, f, N * f * a)  # the dGELU epilogue reads the pre-activation
    k("fc bias grad", "mem", 0, N * f * a)
    k("ln_2 bwd + colsum", "mem", 0, 4 * N * d * a)
    linear_bwd("proj", d, d, 0)
    if attention == "tensor":
        attention_kernel("flash attention bwd", 5, bwd_bytes)
    else:
        attention_kernel("flash attention bwd", 7, bwd_bytes)
    linear_bwd("qkv", d, 3 * d, 0)
    k("qkv bias grad", "mem", 0, N * 3 * d * a)
    k("ln_1 bwd + colsum", "mem", 0, 4 * N * d * a)
    # ---- embedding, final LayerNorm, LM head, classifier (once)
    k("embedding fwd", "mem", 0, 2 * N * d * a, count=1)
    k("ln_f fwd", "mem", 0, 2 * N * d * a, count=1)
    k("lm head fwd", "gemm", 2 * N * d * V, (N * d + V * d + N * V) * a, (N, V, d), count=1)
    k("classifier (in place)", "mem", 0, 2 * N * V * a, count=1)
    k("lm head dgrad", "gemm", 2 * N * d * V, (N * V + V * d + N * d) * a, (N, d, V), count=1)
    k("lm head wgrad", "gemm", 2 * N * d * V, (N * V + N * d + V * d) * a, (V, d, N), count=1)
    k("ln_f bwd", "mem", 0, 4 * N * d * a, count=1)
    k("embedding bwd", "mem", 0, 2 * N * d * a + V * d * 4, count=1)
    # ---- optimizer: f32 masters, moments; the grads in bf16; the working copy
    P = L * (4 * d * d + 2 * d * f + 9 * d + f) + V * d + T * d + 2 * d
    lin = L * (4 * d * d + 2 * d * f)
    k("zero grads", "mem", 0, (P - lin) * 4, count=1)
    k("grad sum of squares", "mem", 0, P * a, count=1)
    k("adamw", "mem", 0, P * (4 + a + 4 + 4 + 12 + a) + (2 * lin if fp8 else 0), count=1)
    if fp8:
        k("fp8 scaling update", "mem", 0, 0, count=1)
    return ks, P


def wave_efficiency(shape, cus):
    """The share of the compute units' time a GEMM of output m x n and depth k keeps busy: the
    last wave of output tiles is partly filled, and each tile's pipeline fill and epilogue cost
    about K_FILL of depth (so shallow GEMMs run below the 8192^3 rate)."""
    if shape is None:
        return 1.0
    m, n, k = shape
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE)
    return tiles / (math.ceil(tiles / cus) * cus) * k / (k + K_FILL)


def model_step(m, precision, dev, clock_ratio=1.0, table=None, attention="tensor"):
    ks, params = kernels(m, precision, attention)
    total = 0.0
    for name, count, kind, flops, nbytes, shape in ks:
        if kind == "gemm8":
            peak = dev["fp8"] * GEMM_EFFICIENCY["fp8"]
        elif kind in ("gemm", "attn"):
            # attention's matmuls run at bf16 rate in both recipes (flash attention in bf16)
            peak = dev["bf16"] * GEMM_EFFICIENCY["bf16"] * (0.6 if kind == "attn" else 1.0)
        elif kind == "vec":
            peak = dev["fp32"] * VECTOR_EFFICIENCY
        else:
            peak = None
        t_c = 0.0
        if peak:
            t_c = flops / (peak * 1e12 * wave_efficiency(shape, dev["cus"]) * clock_ratio)
        t_m = nbytes / (dev["bw"] * 1e12 * MEMORY_EFFICIENCY)
        t = (max(t_c, t_m) + LAUNCH_US * 1e-6) * count
        total += t
        if table is not None:
            table.append((name, count, kind, flops * count, nbytes * count, t * 1e3,
                          "compute" if t_c >= t_m else "memory"))
    return total * 1e3, params


def runs_of(x):
    if isinstance(x, dict):
        if "ms_per_step_median" in x:
            yield x
        for v in x.values():
            yield from runs_of(v)
    elif isinstance(x, list):
        for v in x:
            yield from runs_of(v)


def main():
    global MEMORY_EFFICIENCY
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="h200", choices=sorted(DEVICES))
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS))
    ap.add_argument("--precision", default="bf16,fp8")
    ap.add_argument("--kernels", action="store_true", help="print the per-kernel table")
    ap.add_argument("--validate", nargs="+", metavar="BENCH_JSON")
    ap.add_argument("--tolerance", type=float, default=0.20)
    ap.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    ap.add_argument("--gemm-efficiency", metavar="BF16,FP8",
                    help="the GEMM library's fraction of peak at 8192^3 (default: cuBLASLt's on "
                         "the H200, 0.82,0.76); e.g. a measured hipBLASLt figure for the MI300X")
    ap.add_argument("--attention", choices=ATTENTION, default="tensor",
                    help="which flash attention the step runs (see ATTENTION; default tensor: "
                         "CUDA's; HIP runs portable by default, mfma with DUET_HIP_FLASH_MFMA)")
    ap.add_argument("--memory-efficiency", type=float, metavar="F",
                    help=f"the fraction of HBM peak a streaming kernel reaches ({MEMORY_EFFICIENCY})")
    args = ap.parse_args()
    if args.gemm_efficiency:
        bf, f8 = (float(x) for x in args.gemm_efficiency.split(","))
        GEMM_EFFICIENCY.update(bf16=bf, fp8=f8)
    if args.memory_efficiency:
        MEMORY_EFFICIENCY = args.memory_efficiency
    dev = DEVICES[args.device]
    rows = []
    bad = 0
    if args.validate:
        for path in args.validate:
            with open(path) as fh:
                text = fh.read()
            try:
                docs = [json.loads(text)]
            except json.JSONDecodeError:
                docs = [json.loads(line) for line in text.splitlines() if line.strip()]
            for doc in docs:
                for r in runs_of(doc):
                    m = dict(r["model"], batch=r["batch"], seq=r["seq"])
                    prec = r["precision"]
                    if prec not in ("bf16", "fp8"):
                        continue
                    tel = r.get("telemetry") or {}
                    clk = tel.get("sm_clock_mhz_median")
                    ratio = min(1.0, clk / dev["clock"]) if clk else 1.0
                    ms, _ = model_step(m, prec, dev, ratio)
                    ms_boost, _ = model_step(m, prec, dev, 1.0)
                    meas = r["ms_per_step_median"]
                    err = ms / meas - 1
                    ok = abs(err) <= args.tolerance
                    bad += not ok
                    rows.append(dict(file=path, d_model=m["d_model"], layers=m["layers"],
                                     precision=prec, measured_ms=meas, model_ms=ms,
                                     model_ms_boost_clock=ms_boost, clock_ratio=ratio,
                                     error=err, within=ok, git_rev=r.get("git_rev")))
                    print(f"{m['d_model']:>5} x {m['layers']:>2} B{m['batch']} T{m['seq']} {prec:5} "
                          f"measured {meas:8.3f} ms  model {ms:8.3f} ms (clock x{ratio:.3f}; "
                          f"{ms_boost:.3f} at boost)  {100 * err:+6.1f} %  {'ok' if ok else 'OFF'}")
    else:
        for p in args.preset or ["seed", "large"]:
            for prec in args.precision.split(","):
                table = [] if args.kernels else None
                ms, params = model_step(PRESETS[p], prec, dev, 1.0, table, args.attention)
                m = PRESETS[p]
                tokens = m["batch"] * m["seq"]
                rows.append(dict(device=args.device, preset=p, precision=prec,
                                 attention=args.attention, model_ms=ms,
                                 tokens_per_s=tokens / (ms / 1e3), params=params))
                print(f"{dev['name']}: {p} {prec} ({args.attention} attention): modelled step {ms:.2f} ms "
                      f"({tokens / (ms / 1e3) / 1e3:.0f} K tokens/s, {params / 1e6:.1f} M parameters)")
                if table is not None:
                    print(f"  {'kernel':28} {'n':>3} {'GFLOP':>9} {'MB':>9} {'ms':>8}  bound")
                    for name, n, kind, fl, nb, t, bound in table:
                        print(f"  {name:28} {n:>3} {fl / 1e9:9.1f} {nb / 1e6:9.1f} {t:8.3f}  {bound}")
    print(f"(model: gemm efficiency {GEMM_EFFICIENCY}, memory efficiency {MEMORY_EFFICIENCY}, "
          f"scalar attention products at {VECTOR_EFFICIENCY} of the fp32 peak, "
          f"{LAUNCH_US} us per launch, {TILE}x{TILE} tiles over {dev['cus']} compute units, "
          f"{K_FILL} of depth per tile for fill and epilogue)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=args.device, rows=rows), fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
