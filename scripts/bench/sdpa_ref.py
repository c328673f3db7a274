"""PyTorch's attention backends at the presets' attention shapes (reference for duet's
flash_bench): `python3 scripts/bench/sdpa_ref.py` on the GPU machine (torch only).

Causal scaled_dot_product_attention in bf16 for each backend (flash, cuDNN, memory-efficient);
50 calls after 5 warm-up calls between two CUDA events. "bwd" is forward+backward minus forward.
TF/s counts the causal half: forward 4·B·H·T²·D/2 FLOPs, backward 2.5 times that.
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"seed": (32, 12, 256, 64), "large": (32, 16, 256, 128)}  # B, H, T, D


def time_us(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3


def main():
    torch.manual_seed(0)
    for name, (b, h, t, d) in SHAPES.items():
        q, k, v = [torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3)]
        flops = 4 * b * h * t * t * d / 2
        for be in [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                   SDPBackend.EFFICIENT_ATTENTION]:
            try:
                with sdpa_kernel([be]):
                    g = torch.randn_like(F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    fwd = time_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

                    def fwd_bwd():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

                    bwd = time_us(fwd_bwd) - fwd
                print(f"{name} {be.name:22s} fwd {fwd:7.1f} us ({flops / fwd / 1e6:6.1f} TF/s)  "
                      f"bwd {bwd:7.1f} us ({2.5 * flops / bwd / 1e6:6.1f} TF/s)")
            except Exception as ex:  # a backend that does not support the shape
                print(name, be.name, "failed:", str(ex)[:100])


if __name__ == "__main__":
    main()
