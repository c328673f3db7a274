//! Results must be bit-identical for any thread count. Shapes are chosen to span several
//! parallel tasks and reduction blocks, so a scheduling-dependent reduction would show.

mod common;

use common::*;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{
    AttentionOps, DType, ElementwiseOps, EmbeddingOps, LossOps, NormOps, OptimOps, Runtime,
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
        d.layernorm_forward(
            &x, &gamma, &beta, &mut out, &mut mean, &mut rstd, n, c, 1e-5,
        )
        .unwrap();
        let dout = up(d, &rng.vec(n * c));
        let mut dx = up(d, &rng.vec(n * c));
        let mut dg = up(d, &rng.vec(c));
        let mut db = up(d, &rng.vec(c));
        d.layernorm_backward(
            &dout, &x, &gamma, &mean, &rstd, &mut dx, &mut dg, &mut db, n, c,
        )
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
        d.bias_backward(&dout, &mut db, rows, c).unwrap();
        // bf16 dout accumulating into f32 too.
        let dout16 = up_as(d, &rng.vec(rows * c), DType::BF16);
        d.bias_backward(&dout16, &mut db, rows, c).unwrap();
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
        d.embedding_backward(&up_i32(d, &tokens), &dout, &mut dwte, &mut dwpe, b, t, c)
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
        d.sum_squares(&up(d, &x), &mut out, 1).unwrap();
        d.sum_squares(&up_as(d, &x, DType::BF16), &mut out, 0)
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
        d.cross_entropy(
            &logits,
            &up_i32(d, &targets),
            &mut losses,
            Some(&mut dl),
            n,
            v,
            0.25,
        )
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
        d.softmax_causal_forward(&s, &mut p, rows, t, 0.125)
            .unwrap();
        let mut ds = zeros(d, DType::F32, rows * t * t);
        d.softmax_causal_backward(&p, &s, &mut ds, rows, t, 0.125)
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
        d.adamw(&mut param, &up(d, &rng.vec(n)), &mut m, &mut v, &step, None)
            .unwrap();
        vec![bytes(d, &p), bytes(d, &ds), bytes(d, &param)]
    });
}
