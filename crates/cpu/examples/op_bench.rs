//! Times the non-GEMM kernels at the default preset's shapes (B 32, T 48, C 128, 4 heads,
//! FFN 512, vocab 96): `cargo run -p duet-cpu --release --example op_bench [threads]`.

use duet_cpu::CpuDevice;
use duet_device::{
    AdamWStep, AdamWUpdate, Add, AddAssign, BiasAdd, BiasBackward, CrossEntropy, DType, DeviceExt,
    EmbeddingBackward, EmbeddingForward, GeluBackward, GeluForward, LayerNormBackward,
    LayerNormForward, MergeHeads, Runtime, SoftmaxCausalBackward, SoftmaxCausalForward, SplitHeads,
    SplitHeadsBackward, SumSquares,
};
use std::time::Instant;

fn time(name: &str, mut f: impl FnMut()) {
    f();
    let reps = 50;
    let start = Instant::now();
    for _ in 0..reps {
        f();
    }
    let us = start.elapsed().as_secs_f64() / reps as f64 * 1e6;
    println!("{name:<28} {us:>9.1} µs");
}

fn main() -> duet_device::Result<()> {
    let threads = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("thread count"));
    let d = CpuDevice::new(threads)?;
    let (b, t, c, nh, ffn, v) = (32usize, 48usize, 128usize, 4usize, 512usize, 96usize);
    let n = b * t;
    let hs = c / nh;
    let f = |len: usize| -> duet_device::Result<_> {
        let data: Vec<f32> = (0..len)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        d.upload_new(&data)
    };
    let tokens: Vec<i32> = (0..n).map(|i| (i % v) as i32).collect();
    let tokens = d.upload_new(&tokens)?;
    let (wte, wpe) = (f(v * c)?, f(64 * c)?);
    let mut x = f(n * c)?;
    let (mut dwte, mut dwpe) = (f(v * c)?, f(64 * c)?);
    time("embedding_forward", || {
        d.exec(EmbeddingForward {
            tokens: &tokens,
            wte: &wte,
            wpe: &wpe,
            out: &mut x,
            b,
            t,
            c,
        })
        .unwrap()
    });
    time("embedding_backward", || {
        d.exec(EmbeddingBackward {
            tokens: &tokens,
            dout: &x,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            b,
            t,
            c,
        })
        .unwrap()
    });
    let (g, be) = (f(c)?, f(c)?);
    let mut out = f(n * c)?;
    let (mut mean, mut rstd) = (d.alloc(DType::F32, n)?, d.alloc(DType::F32, n)?);
    time("layernorm_forward", || {
        d.exec(LayerNormForward {
            x: &x,
            gamma: &g,
            beta: &be,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps: 1e-5,
        })
        .unwrap()
    });
    let (mut dx, mut dg, mut db) = (f(n * c)?, f(c)?, f(c)?);
    time("layernorm_backward", || {
        d.exec(LayerNormBackward {
            dout: &out,
            x: &x,
            gamma: &g,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dgamma: &mut dg,
            dbeta: &mut db,
            n,
            c,
        })
        .unwrap()
    });
    let h = f(n * ffn)?;
    let mut hg = f(n * ffn)?;
    time("gelu_forward", || {
        d.exec(GeluForward {
            x: &h,
            out: &mut hg,
        })
        .unwrap()
    });
    let mut dh = f(n * ffn)?;
    time("gelu_backward", || {
        d.exec(GeluBackward {
            x: &h,
            dout: &hg,
            dx: &mut dh,
        })
        .unwrap()
    });
    let mut bias_t = f(n * ffn)?;
    let bias = f(ffn)?;
    time("bias_add", || {
        d.exec(BiasAdd {
            x: &mut bias_t,
            bias: &bias,
            rows: n,
            c: ffn,
        })
        .unwrap()
    });
    let mut dbias = f(ffn)?;
    time("bias_backward", || {
        d.exec(BiasBackward {
            dout: &h,
            dbias: &mut dbias,
            rows: n,
            c: ffn,
        })
        .unwrap()
    });
    let qkv = f(n * 3 * c)?;
    let (mut q, mut k, mut vv) = (f(n * c)?, f(n * c)?, f(n * c)?);
    time("split_heads", || {
        d.exec(SplitHeads {
            qkv: &qkv,
            q: &mut q,
            k: &mut k,
            v: &mut vv,
            b,
            t,
            nh,
            hs,
        })
        .unwrap()
    });
    let mut dqkv = f(n * 3 * c)?;
    time("split_heads_backward", || {
        d.exec(SplitHeadsBackward {
            dq: &q,
            dk: &k,
            dv: &vv,
            dqkv: &mut dqkv,
            b,
            t,
            nh,
            hs,
        })
        .unwrap()
    });
    let mut merged = f(n * c)?;
    time("merge_heads", || {
        d.exec(MergeHeads {
            y: &q,
            out: &mut merged,
            b,
            t,
            nh,
            hs,
            backward: false,
        })
        .unwrap()
    });
    let rows = b * nh;
    let s = f(rows * t * t)?;
    let mut p = f(rows * t * t)?;
    time("softmax_causal_forward", || {
        d.exec(SoftmaxCausalForward {
            scores: &s,
            probs: &mut p,
            batch: rows,
            t,
            scale: 0.17,
        })
        .unwrap()
    });
    let mut ds = f(rows * t * t)?;
    time("softmax_causal_backward", || {
        d.exec(SoftmaxCausalBackward {
            probs: &p,
            dprobs: &s,
            dscores: &mut ds,
            batch: rows,
            t,
            scale: 0.17,
        })
        .unwrap()
    });
    let logits = f(n * v)?;
    let mut losses = d.alloc(DType::F32, n)?;
    let mut dl = f(n * v)?;
    time("cross_entropy", || {
        d.exec(CrossEntropy {
            logits: &logits,
            targets: &tokens,
            losses: &mut losses,
            dlogits: Some(&mut dl),
            n,
            v,
            grad_scale: 1.0 / n as f32,
        })
        .unwrap()
    });
    let np = 2 * (4 * c * c + 2 * c * ffn) + v * c;
    let (mut param, grad, mut m, mut mv) = (f(np)?, f(np)?, f(np)?, f(np)?);
    let step = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.01,
        bias_correction1: 0.1,
        bias_correction2: 0.05,
        grad_scale: 1.0,
    };
    time("adamw (all params)", || {
        d.exec(AdamWUpdate {
            param: &mut param,
            grad: &grad,
            m: &mut m,
            v: &mut mv,
            step: &step,
            param_copy: None,
        })
        .unwrap()
    });
    let mut sq = d.alloc(DType::F32, 1)?;
    time("sum_squares (all params)", || {
        d.exec(SumSquares {
            x: &grad,
            out: &mut sq,
            slot: 0,
        })
        .unwrap()
    });
    let mut res = f(n * c)?;
    time("add", || {
        d.exec(Add {
            a: &x,
            b: &out,
            out: &mut res,
        })
        .unwrap()
    });
    time("add_assign", || {
        d.exec(AddAssign {
            dst: &mut res,
            src: &x,
        })
        .unwrap()
    });
    Ok(())
}
