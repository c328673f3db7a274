//! Times the fused causal attention (kernel versions 3, 2 and 1, and version 4's backward for
//! head size 64, see crates/cuda/src/ops/attention.rs) against the unfused CUDA composition
//! (split heads, batched GEMMs, causal softmax, merge heads) at the seed (b=32, t=256, nh=12,
//! hs=64), large (b=32, t=256, nh=16, hs=128), t512 (b=32, t=512, nh=12, hs=64) and gpt2
//! (b=32, t=1024, nh=12, hs=64) shapes:
//! `cargo run -p duet-cuda --release --example flash_bench [bf16|f16]`. Each variant is
//! warmed up, then run 50 times inside one `Runtime::time_ms` (device events); the table gives
//! the mean time per call and the causal TFLOP/s (forward 2·2·b·nh·t²·hs/2 FLOPs, backward
//! 2.5× that). No pass/fail.

use duet_cuda::CudaDevice;
use duet_device::{
    DType, DeviceError, FlashAttentionBackward, FlashAttentionForward, Gemm, GemmDesc, MergeHeads,
    Runtime, SoftmaxCausalBackward, SoftmaxCausalForward, SplitHeads, SplitHeadsBackward,
};

const ITERS: usize = 50;

/// Mean µs per call of `f` over ITERS calls, after a warm-up.
fn time<F: FnMut()>(dev: &CudaDevice, mut f: F) -> f64 {
    for _ in 0..3 {
        f();
    }
    dev.synchronize().unwrap();
    let ms = dev
        .time_ms(|| {
            for _ in 0..ITERS {
                f();
            }
            Ok::<(), DeviceError>(())
        })
        .unwrap();
    ms * 1e3 / ITERS as f64
}

fn bench(dev: &CudaDevice, dtype: DType, name: &str, b: usize, t: usize, nh: usize, hs: usize) {
    let n = b * t * nh * hs;
    let heads = b * nh;
    let scale = 1.0 / (hs as f32).sqrt();
    let a = |dtype: DType, len: usize, v: f32| {
        let mut buf = dev.alloc(dtype, len).unwrap();
        dev.fill(&mut buf, v).unwrap();
        buf
    };
    let qkv = a(dtype, 3 * n, 0.02);
    let dout = a(dtype, n, 0.01);
    let mut out = a(dtype, n, 0.0);
    let mut lse = a(DType::F32, heads * t, 0.0);
    let mut dqkv = a(dtype, 3 * n, 0.0);

    // Causal FLOPs: the forward's two products over the lower triangle; the backward 2.5×.
    let fwd_flop = 2.0 * 2.0 * (b * nh) as f64 * (t * t) as f64 * hs as f64 / 2.0;
    let bwd_flop = 2.5 * fwd_flop;
    let tflops = |flop: f64, us: f64| flop / (us * 1e-6) / 1e12;
    let mut flash = Vec::new();
    let mut versions = vec![
        ("v3", false, true, false),
        ("v2", false, false, false),
        ("v1", true, false, false),
    ];
    if hs == 64 {
        versions.push(("v4", false, false, true));
    }
    for (version, v1, v3, v4) in versions {
        CudaDevice::flash_attention_v1_on_this_thread(Some(v1));
        CudaDevice::flash_backward_v3_on_this_thread(Some(v3));
        CudaDevice::flash_backward_v4_on_this_thread(Some(v4));
        let fwd = time(dev, || {
            dev.exec(FlashAttentionForward {
                qkv: &qkv,
                out: &mut out,
                lse: &mut lse,
                b,
                t,
                nh,
                hs,
                scale,
            })
            .unwrap()
        });
        let bwd = time(dev, || {
            dev.exec(FlashAttentionBackward {
                qkv: &qkv,
                out: &out,
                dout: &dout,
                lse: &lse,
                dqkv: &mut dqkv,
                b,
                t,
                nh,
                hs,
                scale,
            })
            .unwrap()
        });
        println!(
            "{name:<6} {dtype:<5} b={b} t={t} nh={nh} hs={hs:<4} | flash {version} fwd {fwd:8.1} µs {:6.1} TFLOP/s  bwd {bwd:8.1} µs {:6.1} TFLOP/s",
            tflops(fwd_flop, fwd),
            tflops(bwd_flop, bwd)
        );
        flash.push((fwd, bwd));
    }
    CudaDevice::flash_attention_v1_on_this_thread(None);
    CudaDevice::flash_backward_v3_on_this_thread(None);
    CudaDevice::flash_backward_v4_on_this_thread(None);
    if let Some(&(_, v4_bwd)) = flash.get(3) {
        println!(
            "{name:<6} {dtype:<5} version 4 backward vs version 2's: {:4.2}x",
            flash[1].1 / v4_bwd
        );
    }
    let (flash_fwd, flash_bwd) = flash[0];
    let (v2_bwd, (v1_fwd, v1_bwd)) = (flash[1].1, flash[2]);

    // The unfused composition, all heads at once.
    let (mut q, mut k, mut v) = (a(dtype, n, 0.0), a(dtype, n, 0.0), a(dtype, n, 0.0));
    let mut scores = a(dtype, heads * t * t, 0.0);
    let mut probs = a(dtype, heads * t * t, 0.0);
    let mut dprobs = a(dtype, heads * t * t, 0.0);
    let (mut y, mut dy) = (a(dtype, n, 0.0), a(dtype, n, 0.0));
    let (mut dq, mut dk, mut dv) = (a(dtype, n, 0.0), a(dtype, n, 0.0), a(dtype, n, 0.0));
    let qk = GemmDesc::batched(false, true, t, t, hs, heads);
    let pv = GemmDesc::batched(false, false, t, hs, t, heads);
    let dpd = GemmDesc::batched(false, true, t, t, hs, heads);
    let tn = GemmDesc::batched(true, false, t, hs, t, heads);
    let unf_fwd = time(dev, || {
        dev.exec(SplitHeads {
            qkv: &qkv,
            q: &mut q,
            k: &mut k,
            v: &mut v,
            b,
            t,
            nh,
            hs,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &qk,
            a: &q,
            b: &k,
            c: &mut scores,
        })
        .unwrap();
        dev.exec(SoftmaxCausalForward {
            scores: &scores,
            probs: &mut probs,
            batch: heads,
            t,
            scale,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &pv,
            a: &probs,
            b: &v,
            c: &mut y,
        })
        .unwrap();
        dev.exec(MergeHeads {
            y: &y,
            out: &mut out,
            b,
            t,
            nh,
            hs,
            backward: false,
        })
        .unwrap();
    });
    let unf_bwd = time(dev, || {
        dev.exec(MergeHeads {
            y: &dout,
            out: &mut dy,
            b,
            t,
            nh,
            hs,
            backward: true,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &dpd,
            a: &dy,
            b: &v,
            c: &mut dprobs,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &tn,
            a: &probs,
            b: &dy,
            c: &mut dv,
        })
        .unwrap();
        dev.exec(SoftmaxCausalBackward {
            probs: &probs,
            dprobs: &dprobs,
            dscores: &mut scores,
            batch: heads,
            t,
            scale,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &pv,
            a: &scores,
            b: &k,
            c: &mut dq,
        })
        .unwrap();
        dev.exec(Gemm {
            desc: &tn,
            a: &scores,
            b: &q,
            c: &mut dk,
        })
        .unwrap();
        dev.exec(SplitHeadsBackward {
            dq: &dq,
            dk: &dk,
            dv: &dv,
            dqkv: &mut dqkv,
            b,
            t,
            nh,
            hs,
        })
        .unwrap();
    });
    println!(
        "{name:<6} {dtype:<5} b={b} t={t} nh={nh} hs={hs:<4} | unfused fwd {unf_fwd:8.1} µs {:6.1} TFLOP/s  bwd {unf_bwd:8.1} µs {:6.1} TFLOP/s",
        tflops(fwd_flop, unf_fwd),
        tflops(bwd_flop, unf_bwd)
    );
    println!(
        "{name:<6} {dtype:<5} speed-up of v3 (v2 forward): bwd vs v2 {:4.2}x | vs v1 fwd {:4.2}x bwd {:4.2}x | vs unfused fwd {:4.1}x bwd {:4.1}x",
        v2_bwd / flash_bwd,
        v1_fwd / flash_fwd,
        v1_bwd / flash_bwd,
        unf_fwd / flash_fwd,
        unf_bwd / flash_bwd
    );
}

fn main() {
    let dtypes: Vec<DType> = match std::env::args().nth(1).as_deref() {
        Some("bf16") => vec![DType::BF16],
        Some("f16") => vec![DType::F16],
        _ => vec![DType::BF16, DType::F16],
    };
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("flash_bench: no CUDA device: {e}");
            return;
        }
    };
    let info = dev.info();
    println!(
        "{} {} — {ITERS} calls per timing ({}), µs per call",
        info.name,
        info.arch,
        dev.timer_kind()
    );
    for dtype in dtypes {
        bench(&dev, dtype, "seed", 32, 256, 12, 64);
        bench(&dev, dtype, "large", 32, 256, 16, 128);
        bench(&dev, dtype, "t512", 32, 512, 12, 64);
        bench(&dev, dtype, "gpt2", 32, 1024, 12, 64);
    }
}
