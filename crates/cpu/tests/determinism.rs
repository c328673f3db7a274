//! Results must be bit-identical for any thread count. Shapes are chosen to span several
//! parallel tasks and reduction blocks, so a scheduling-dependent reduction would show.

mod common;

use common::*;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{
    AdamWUpdate, BiasBackward, CrossEntropy, DType, EmbeddingBackward, LayerNormBackward,
    LayerNormForward, Runtime, SoftmaxCausalBackward, SoftmaxCausalForward, SumSquares,
};

const THREADS: [usize; 3] = [2, 3, 4];

/// Runs `f` on a fresh device with each thread count; all byte outputs must match 1 thread.
fn same_for_all_threads(what: &str, f: impl Fn(&CpuDevice) -> Vec<Vec<u8>>) {
    let one = f(&CpuDevice::new(Some(1)).unwrap());
    for threads in THREADS {
        let other = f(&CpuDevice::new(Some(threads)).unwrap());
        assert!(
            one == other,
            "{what}: {threads} threads differ from 1 thread"
        );
    }
}

fn bytes(d: &CpuDevice, b: &CpuBuffer) -> Vec<u8> {
    d.download_bytes(b, 0, duet_device::Buffer::len(b)).unwrap()
}

#[test]
fn layernorm_backward_deterministic() {
    let (n, c) = (600, 96);
    same_for_all_threads("layernorm_backward", |d| {
        let mut rng = Rng::new(1);
        let x = up(d, &rng.vec(n * c));
        let gamma = up(d, &rng.vec(c));
        let beta = up(d, &rng.vec(c));
        let mut out = zeros(d, DType::F32, n * c);
        let mut mean = zeros(d, DType::F32, n);
        let mut rstd = zeros(d, DType::F32, n);
        d.exec(LayerNormForward {
            x: &x,
            gamma: &gamma,
            beta: &beta,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps: 1e-5,
        })
        .unwrap();
        let dout = up(d, &rng.vec(n * c));
        let mut dx = up(d, &rng.vec(n * c));
        let mut dg = up(d, &rng.vec(c));
        let mut db = up(d, &rng.vec(c));
        d.exec(LayerNormBackward {
            dout: &dout,
            x: &x,
            gamma: &gamma,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dgamma: &mut dg,
            dbeta: &mut db,
            n,
            c,
        })
        .unwrap();
        vec![bytes(d, &out), bytes(d, &dx), bytes(d, &dg), bytes(d, &db)]
    });
}

#[test]
fn bias_backward_deterministic() {
    let (rows, c) = (1000, 48);
    same_for_all_threads("bias_backward", |d| {
        let mut rng = Rng::new(2);
        let dout = up(d, &rng.vec(rows * c));
        let mut db = up(d, &rng.vec(c));
        d.exec(BiasBackward {
            dout: &dout,
            dbias: &mut db,
            rows,
            c,
        })
        .unwrap();
        // bf16 dout accumulating into f32 too.
        let dout16 = up_as(d, &rng.vec(rows * c), DType::BF16);
        d.exec(BiasBackward {
            dout: &dout16,
            dbias: &mut db,
            rows,
            c,
        })
        .unwrap();
        vec![bytes(d, &db)]
    });
}

#[test]
fn embedding_backward_deterministic() {
    let (b, t, c, vocab) = (8, 64, 40, 50);
    same_for_all_threads("embedding_backward", |d| {
        let mut rng = Rng::new(3);
        // Few distinct tokens: many positions accumulate into each row.
        let tokens: Vec<i32> = (0..b * t).map(|_| rng.below(vocab) as i32).collect();
        let dout = up(d, &rng.vec(b * t * c));
        let mut dwte = up(d, &rng.vec(vocab * c));
        let mut dwpe = up(d, &rng.vec(t * c));
        d.exec(EmbeddingBackward {
            tokens: &up_i32(d, &tokens),
            dout: &dout,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            b,
            t,
            c,
        })
        .unwrap();
        vec![bytes(d, &dwte), bytes(d, &dwpe)]
    });
}

#[test]
fn sum_squares_deterministic() {
    same_for_all_threads("sum_squares", |d| {
        let mut rng = Rng::new(4);
        let x: Vec<f32> = rng.vec(1_000_003).iter().map(|v| v * 37.0).collect();
        let mut out = zeros(d, DType::F32, 2);
        d.exec(SumSquares {
            x: &up(d, &x),
            out: &mut out,
            slot: 1,
        })
        .unwrap();
        d.exec(SumSquares {
            x: &up_as(d, &x, DType::BF16),
            out: &mut out,
            slot: 0,
        })
        .unwrap();
        vec![bytes(d, &out)]
    });
}

#[test]
fn cross_entropy_deterministic() {
    let (n, v) = (64, 1000);
    same_for_all_threads("cross_entropy", |d| {
        let mut rng = Rng::new(5);
        let logits = up(d, &rng.vec(n * v));
        let targets: Vec<i32> = (0..n)
            .map(|i| if i % 7 == 3 { -1 } else { rng.below(v) as i32 })
            .collect();
        let mut losses = zeros(d, DType::F32, n);
        let mut dl = zeros(d, DType::BF16, n * v);
        d.exec(CrossEntropy {
            logits: &logits,
            targets: &up_i32(d, &targets),
            losses: &mut losses,
            dlogits: Some(&mut dl),
            n,
            v,
            grad_scale: 0.25,
        })
        .unwrap();
        vec![bytes(d, &losses), bytes(d, &dl)]
    });
}

#[test]
fn softmax_and_adamw_deterministic() {
    same_for_all_threads("softmax/adamw", |d| {
        let mut rng = Rng::new(6);
        let (rows, t) = (12, 64);
        let s = up(d, &rng.vec(rows * t * t));
        let mut p = zeros(d, DType::F32, rows * t * t);
        d.exec(SoftmaxCausalForward {
            scores: &s,
            probs: &mut p,
            batch: rows,
            t,
            scale: 0.125,
        })
        .unwrap();
        let mut ds = zeros(d, DType::F32, rows * t * t);
        d.exec(SoftmaxCausalBackward {
            probs: &p,
            dprobs: &s,
            dscores: &mut ds,
            batch: rows,
            t,
            scale: 0.125,
        })
        .unwrap();
        let n = 100_000;
        let mut param = up(d, &rng.vec(n));
        let mut m = zeros(d, DType::F32, n);
        let mut v = zeros(d, DType::F32, n);
        let step = duet_device::AdamWStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            bias_correction1: 0.1,
            bias_correction2: 0.05,
            grad_scale: 1.0,
        };
        d.exec(AdamWUpdate {
            param: &mut param,
            grad: &up(d, &rng.vec(n)),
            m: &mut m,
            v: &mut v,
            step: &step,
            param_copy: None,
        })
        .unwrap();
        vec![bytes(d, &p), bytes(d, &ds), bytes(d, &param)]
    });
}
