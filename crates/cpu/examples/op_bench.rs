//! Times the non-GEMM kernels at the default preset's shapes (B 32, T 48, C 128, 4 heads,
//! FFN 512, vocab 96): `cargo run -p duet-cpu --release --example op_bench [threads]`.

use duet_cpu::CpuDevice;
use duet_device::{
    AdamWStep, AttentionOps, DType, DeviceExt, ElementwiseOps, EmbeddingOps, LossOps, NormOps,
    OptimOps, Runtime,
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
        d.embedding_forward(&tokens, &wte, &wpe, &mut x, b, t, c)
            .unwrap()
    });
    time("embedding_backward", || {
        d.embedding_backward(&tokens, &x, &mut dwte, &mut dwpe, b, t, c)
            .unwrap()
    });
    let (g, be) = (f(c)?, f(c)?);
    let mut out = f(n * c)?;
    let (mut mean, mut rstd) = (d.alloc(DType::F32, n)?, d.alloc(DType::F32, n)?);
    time("layernorm_forward", || {
        d.layernorm_forward(&x, &g, &be, &mut out, &mut mean, &mut rstd, n, c, 1e-5)
            .unwrap()
    });
    let (mut dx, mut dg, mut db) = (f(n * c)?, f(c)?, f(c)?);
    time("layernorm_backward", || {
        d.layernorm_backward(&out, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut db, n, c)
            .unwrap()
    });
    let h = f(n * ffn)?;
    let mut hg = f(n * ffn)?;
    time("gelu_forward", || d.gelu_forward(&h, &mut hg).unwrap());
    let mut dh = f(n * ffn)?;
    time("gelu_backward", || {
        d.gelu_backward(&h, &hg, &mut dh).unwrap()
    });
    let mut bias_t = f(n * ffn)?;
    let bias = f(ffn)?;
    time("bias_add", || {
        d.bias_add(&mut bias_t, &bias, n, ffn).unwrap()
    });
    let mut dbias = f(ffn)?;
    time("bias_backward", || {
        d.bias_backward(&h, &mut dbias, n, ffn).unwrap()
    });
    let qkv = f(n * 3 * c)?;
    let (mut q, mut k, mut vv) = (f(n * c)?, f(n * c)?, f(n * c)?);
    time("split_heads", || {
        d.split_heads(&qkv, &mut q, &mut k, &mut vv, b, t, nh, hs)
            .unwrap()
    });
    let mut dqkv = f(n * 3 * c)?;
    time("split_heads_backward", || {
        d.split_heads_backward(&q, &k, &vv, &mut dqkv, b, t, nh, hs)
            .unwrap()
    });
    let mut merged = f(n * c)?;
    time("merge_heads", || {
        d.merge_heads(&q, &mut merged, b, t, nh, hs, false).unwrap()
    });
    let rows = b * nh;
    let s = f(rows * t * t)?;
    let mut p = f(rows * t * t)?;
    time("softmax_causal_forward", || {
        d.softmax_causal_forward(&s, &mut p, rows, t, 0.17).unwrap()
    });
    let mut ds = f(rows * t * t)?;
    time("softmax_causal_backward", || {
        d.softmax_causal_backward(&p, &s, &mut ds, rows, t, 0.17)
            .unwrap()
    });
    let logits = f(n * v)?;
    let mut losses = d.alloc(DType::F32, n)?;
    let mut dl = f(n * v)?;
    time("cross_entropy", || {
        d.cross_entropy(
            &logits,
            &tokens,
            &mut losses,
            Some(&mut dl),
            n,
            v,
            1.0 / n as f32,
        )
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
        d.adamw(&mut param, &grad, &mut m, &mut mv, &step, None)
            .unwrap()
    });
    let mut sq = d.alloc(DType::F32, 1)?;
    time("sum_squares (all params)", || {
        d.sum_squares(&grad, &mut sq, 0).unwrap()
    });
    let mut res = f(n * c)?;
    time("add", || d.add(&x, &out, &mut res).unwrap());
    time("add_assign", || d.add_assign(&mut res, &x).unwrap());
    Ok(())
}
