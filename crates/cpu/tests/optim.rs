//! AdamW against the update formula evaluated in f64.

mod common;

use common::*;
use duet_device::{AdamWStep, DType, Device, DeviceExt};
use half::bf16;

#[allow(clippy::too_many_arguments)]
fn reference_step(
    p: &mut [f64],
    m: &mut [f64],
    v: &mut [f64],
    g: &[f64],
    lr: f64,
    (b1, b2): (f64, f64),
    eps: f64,
    wd: f64,
    grad_scale: f64,
    t: i32,
) {
    let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for i in 0..p.len() {
        let g = g[i] * grad_scale;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        let update = (m[i] / bc1) / ((v[i] / bc2).sqrt() + eps) + wd * p[i];
        p[i] -= lr * update;
    }
}

fn run(grad_dtype: DType, seed: u64) {
    let d = dev();
    let mut rng = Rng::new(seed);
    let n = 70_001; // several parallel chunks and a ragged tail
    let (lr, b1, b2, eps, wd, gs) = (3e-3f32, 0.9f32, 0.95f32, 1e-8f32, 0.1f32, 0.5f32);
    let p0 = rng.vec(n);
    let mut param = up(&d, &p0);
    let mut m = zeros(&d, DType::F32, n);
    let mut v = zeros(&d, DType::F32, n);
    let mut copy = zeros(&d, DType::BF16, n);
    let (mut rp, mut rm, mut rv) = (to64(&p0), vec![0.0; n], vec![0.0; n]);
    for t in 1..=3u64 {
        let g = round_to(&rng.vec(n), grad_dtype);
        let (bc1, bc2) = AdamWStep::bias_corrections(b1, b2, t);
        let step = AdamWStep {
            lr,
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: wd,
            bias_correction1: bc1,
            bias_correction2: bc2,
            grad_scale: gs,
        };
        d.adamw(
            &mut param,
            &up_as(&d, &g, grad_dtype),
            &mut m,
            &mut v,
            &step,
            Some(&mut copy),
        )
        .unwrap();
        reference_step(
            &mut rp,
            &mut rm,
            &mut rv,
            &to64(&g),
            lr as f64,
            (b1 as f64, b2 as f64),
            eps as f64,
            wd as f64,
            gs as f64,
            t as i32,
        );
    }
    // Each step moves a parameter by ≤ lr·(1 + wd); f32 rounding of the update is relative
    // 1e-6 of that, plus the parameter's own rounding (~6e-8 of |p| ≤ 1).
    let got = down(&d, &param);
    assert_close("param", &got, &rp, 1e-6, 1e-7);
    assert_close("m", &down(&d, &m), &rm, 1e-5, 1e-8);
    assert_close("v", &down(&d, &v), &rv, 1e-5, 1e-9);
    // The bf16 working copy is exactly the rounded f32 master weights.
    let copy_bits: Vec<bf16> = d.download(&copy).unwrap();
    let want: Vec<bf16> = got.iter().map(|&x| bf16::from_f32(x)).collect();
    assert!(copy_bits == want, "param_copy is not bf16(param)");
}

#[test]
fn adamw_three_steps_f32_grad() {
    run(DType::F32, 1);
}

#[test]
fn adamw_three_steps_bf16_grad() {
    run(DType::BF16, 2);
}

#[test]
fn adamw_f16_grad_and_fp8_copy() {
    let d = dev();
    let p0 = [0.5f32, -1.0, 2.0, 300.0];
    let mut param = up(&d, &p0);
    let mut m = zeros(&d, DType::F32, 4);
    let mut v = zeros(&d, DType::F32, 4);
    let mut copy = zeros(&d, DType::F8E4M3, 4);
    let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.999, 1);
    let step = AdamWStep {
        lr: 0.0, // no movement: the copy must be the fp8 encoding of p0
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        bias_correction1: bc1,
        bias_correction2: bc2,
        grad_scale: 1.0,
    };
    let g = up_as(&d, &[1.0, 1.0, 1.0, 1.0], DType::F16);
    d.adamw(&mut param, &g, &mut m, &mut v, &step, Some(&mut copy))
        .unwrap();
    assert_eq!(down(&d, &copy), vec![0.5, -1.0, 2.0, 288.0]);
    assert_close("m", &down(&d, &m), &[0.1; 4], 1e-6, 0.0);
}
