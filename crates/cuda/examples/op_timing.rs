//! Times the CUDA backend's ops at the seed model's shapes (B=32, T=256, C=768, 12 heads,
//! FFN 3072, vocab 96): `cargo run -p duet-cuda --release --example op_timing [f32|bf16]`.
//! Each op is warmed up, then run 20 times between two synchronisations; the table gives the
//! mean time per call and the bytes it must move at least, over that time.

use duet_cuda::CudaDevice;
use duet_device::{
    AdamWStep, AdamWUpdate, CrossEntropy, DType, DeviceExt, EmbeddingBackward, EmbeddingForward,
    GeluBackward, GeluForward, Gemm, GemmDesc, LayerNormBackward, LayerNormForward, Runtime,
    SoftmaxCausalBackward, SoftmaxCausalForward, SplitHeads, SumSquares,
};
use std::time::Instant;

fn time<F: FnMut()>(dev: &CudaDevice, mut f: F) -> f64 {
    for _ in 0..3 {
        f();
    }
    dev.synchronize().unwrap();
    let n = 20;
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    dev.synchronize().unwrap();
    t.elapsed().as_secs_f64() / n as f64
}

fn main() {
    let act = match std::env::args().nth(1).as_deref() {
        Some("bf16") => DType::BF16,
        _ => DType::F32,
    };
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("op_timing: no CUDA device: {e}");
            return;
        }
    };
    let info = dev.info();
    println!("{} {} — activations {act}", info.name, info.arch);
    let (b, t, c, nh, f, v) = (32usize, 256usize, 768usize, 12usize, 3072usize, 96usize);
    let hs = c / nh;
    let n = b * t;
    let es = act.size_bytes() as f64;
    let a = |dtype: DType, len: usize| {
        let mut buf = dev.alloc(dtype, len).unwrap();
        dev.fill(&mut buf, 0.01).unwrap();
        buf
    };
    let toks: Vec<i32> = (0..n).map(|i| (i * 7 % v) as i32).collect();
    let tokens = dev.upload_new(&toks).unwrap();
    let (wte, wpe) = (a(act, v * c), a(act, t * c));
    let (mut x, mut y) = (a(act, n * c), a(act, n * c));
    let (mut mean, mut rstd) = (a(DType::F32, n), a(DType::F32, n));
    let (gamma, beta) = (a(act, c), a(act, c));
    let (mut dgamma, mut dbeta) = (a(DType::F32, c), a(DType::F32, c));
    let (mut dwte, mut dwpe) = (a(DType::F32, v * c), a(DType::F32, t * c));
    let qkv = a(act, 3 * n * c);
    let (mut q, mut k, mut vv) = (a(act, n * c), a(act, n * c), a(act, n * c));
    let mut scores = a(act, b * nh * t * t);
    let mut probs = a(act, b * nh * t * t);
    let dprobs = a(act, b * nh * t * t);
    let (mut h, mut h2) = (a(act, n * f), a(act, n * f));
    let w = a(act, f * c);
    let logits = a(act, n * v);
    let mut dlogits = a(act, n * v);
    let mut losses = a(DType::F32, n);
    let mut param = a(DType::F32, 7_000_000);
    let grad = a(DType::F32, 7_000_000);
    let (mut m, mut vm) = (a(DType::F32, 7_000_000), a(DType::F32, 7_000_000));
    let mut sq = a(DType::F32, 1);

    let mut rows: Vec<(&str, f64, f64)> = Vec::new();
    let mut add = |name: &'static str, secs: f64, bytes: f64| rows.push((name, secs, bytes));
    let nc = (n * c) as f64;
    add(
        "embedding_forward",
        time(&dev, || {
            dev.exec(EmbeddingForward {
                tokens: &tokens,
                wte: &wte,
                wpe: &wpe,
                out: &mut x,
                b,
                t,
                c,
            })
            .unwrap()
        }),
        2.0 * nc * es,
    );
    add(
        "embedding_backward",
        time(&dev, || {
            dev.exec(EmbeddingBackward {
                tokens: &tokens,
                dout: &x,
                dwte: &mut dwte,
                dwpe: &mut dwpe,
                b,
                t,
                c,
            })
            .unwrap()
        }),
        nc * es,
    );
    add(
        "layernorm_forward",
        time(&dev, || {
            dev.exec(LayerNormForward {
                x: &x,
                gamma: &gamma,
                beta: &beta,
                out: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
                n,
                c,
                eps: 1e-5,
            })
            .unwrap()
        }),
        2.0 * nc * es,
    );
    let dy = a(act, n * c);
    add(
        "layernorm_backward",
        time(&dev, || {
            dev.exec(LayerNormBackward {
                dout: &dy,
                x: &x,
                gamma: &gamma,
                mean: &mean,
                rstd: &rstd,
                dx: &mut y,
                dgamma: &mut dgamma,
                dbeta: &mut dbeta,
                n,
                c,
            })
            .unwrap()
        }),
        4.0 * nc * es,
    );
    add(
        "split_heads",
        time(&dev, || {
            dev.exec(SplitHeads {
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
        }),
        6.0 * nc * es,
    );
    let sc = (b * nh * t * t) as f64;
    let scale = 1.0 / (hs as f32).sqrt();
    add(
        "softmax_causal_forward",
        time(&dev, || {
            dev.exec(SoftmaxCausalForward {
                scores: &scores,
                probs: &mut probs,
                batch: b * nh,
                t,
                scale,
            })
            .unwrap()
        }),
        2.0 * sc * es,
    );
    add(
        "softmax_causal_backward",
        time(&dev, || {
            dev.exec(SoftmaxCausalBackward {
                probs: &probs,
                dprobs: &dprobs,
                dscores: &mut scores,
                batch: b * nh,
                t,
                scale,
            })
            .unwrap()
        }),
        3.0 * sc * es,
    );
    add(
        "gelu_forward",
        time(&dev, || {
            dev.exec(GeluForward {
                x: &h,
                out: &mut h2,
            })
            .unwrap()
        }),
        2.0 * (n * f) as f64 * es,
    );
    add(
        "gelu_backward",
        time(&dev, || {
            dev.exec(GeluBackward {
                x: &h2,
                dout: &h2,
                dx: &mut h,
            })
            .unwrap()
        }),
        3.0 * (n * f) as f64 * es,
    );
    add(
        "cross_entropy (+grad)",
        time(&dev, || {
            dev.exec(CrossEntropy {
                logits: &logits,
                targets: &tokens,
                losses: &mut losses,
                dlogits: Some(&mut dlogits),
                n,
                v,
                grad_scale: 1.0,
            })
            .unwrap()
        }),
        2.0 * (n * v) as f64 * es,
    );
    let mut fch = a(act, n * f);
    add(
        "gemm fc (8192x3072x768)",
        time(&dev, || {
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, n, f, c),
                a: &x,
                b: &w,
                c: &mut fch,
            })
            .unwrap()
        }),
        0.0,
    );
    add(
        "gemm scores (batched q·kᵀ)",
        time(&dev, || {
            dev.exec(Gemm {
                desc: &GemmDesc::batched(false, true, t, t, hs, b * nh),
                a: &q,
                b: &k,
                c: &mut scores,
            })
            .unwrap()
        }),
        0.0,
    );
    let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, 1);
    let step = AdamWStep {
        lr: 3e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        bias_correction1: bc1,
        bias_correction2: bc2,
        grad_scale: 1.0,
    };
    add(
        "adamw (7M params)",
        time(&dev, || {
            dev.exec(AdamWUpdate {
                param: &mut param,
                grad: &grad,
                m: &mut m,
                v: &mut vm,
                step: &step,
                param_copy: None,
            })
            .unwrap()
        }),
        7e6 * 4.0 * 7.0,
    );
    add(
        "sum_squares (7M)",
        time(&dev, || {
            dev.exec(SumSquares {
                x: &grad,
                out: &mut sq,
                slot: 0,
            })
            .unwrap()
        }),
        7e6 * 4.0,
    );
    println!("{:<28} {:>10} {:>10}", "op", "µs/call", "GB/s");
    for (name, secs, bytes) in rows {
        let gbs = if bytes > 0.0 {
            format!("{:.0}", bytes / secs / 1e9)
        } else {
            "-".into()
        };
        println!("{name:<28} {:>10.1} {gbs:>10}", secs * 1e6);
    }
    let _ = (&mut h2, &mut fch);
}
