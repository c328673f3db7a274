//! `Fused::layernorm_backward_colsum` on the CPU backend (the trait's default): bit for bit
//! `layernorm_backward` followed by `bias_backward` of the updated `dx`, for every activation /
//! parameter / dsum dtype combination, accumulating into non-zero gradients; and `dsum` equals
//! its starting value plus the column sums of the stored `dx`.

mod common;

use common::*;
use duet_cpu::CpuDevice;
use duet_device::Fused;
use duet_device::{DType, Device};

#[allow(clippy::too_many_arguments)]
fn check(d: &CpuDevice, rng: &mut Rng, act: DType, pdt: DType, sdt: DType, n: usize, c: usize) {
    let what = format!("layernorm_backward_colsum {act}/{pdt}/dsum {sdt} {n}x{c}");
    let x: Vec<f32> = (0..n * c)
        .map(|i| (i / c) as f32 * 0.1 + rng.uniform(-1.0, 1.0) as f32)
        .collect();
    let gamma: Vec<f32> = (0..c).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
    let beta = rng.vec(c);
    let dout = rng.vec(n * c);
    let dx0 = rng.vec(n * c);
    let (dg0, db0, ds0) = (rng.vec(c), rng.vec(c), rng.vec(c));
    let (ux, ug, ub) = (
        up_as(d, &x, act),
        up_as(d, &gamma, pdt),
        up_as(d, &beta, pdt),
    );
    let mut out = zeros(d, act, n * c);
    let mut mean = zeros(d, DType::F32, n);
    let mut rstd = zeros(d, DType::F32, n);
    d.layernorm_forward(&ux, &ug, &ub, &mut out, &mut mean, &mut rstd, n, c, 1e-5)
        .unwrap();
    let ud = up_as(d, &dout, act);
    let start = || {
        (
            up_as(d, &dx0, act),
            up_as(d, &dg0, pdt),
            up_as(d, &db0, pdt),
            up_as(d, &ds0, sdt),
        )
    };
    // Separate ops.
    let (mut rdx, mut rdg, mut rdb, mut rds) = start();
    d.layernorm_backward(
        &ud, &ux, &ug, &mean, &rstd, &mut rdx, &mut rdg, &mut rdb, n, c,
    )
    .unwrap();
    d.bias_backward(&rdx, &mut rds, n, c).unwrap();
    // The combined op.
    let (mut fdx, mut fdg, mut fdb, mut fds) = start();
    d.layernorm_backward_colsum(
        &ud, &ux, &ug, &mean, &rstd, &mut fdx, &mut fdg, &mut fdb, &mut fds, n, c,
    )
    .unwrap();
    for (name, a, b) in [
        ("dx", &fdx, &rdx),
        ("dgamma", &fdg, &rdg),
        ("dbeta", &fdb, &rdb),
        ("dsum", &fds, &rds),
    ] {
        let (a, b) = (down(d, a), down(d, b));
        assert!(
            a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{what}: {name} differs from the separate ops"
        );
    }
    // dsum = ds0 + Σ_rows dx (the stored, rounded dx).
    let dx = down(d, &fdx);
    let mut want: Vec<f64> = round_to(&ds0, sdt).iter().map(|&v| v as f64).collect();
    for r in 0..n {
        for (w, &v) in want.iter_mut().zip(&dx[r * c..(r + 1) * c]) {
            *w += v as f64;
        }
    }
    let rtol = match sdt {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1e-2,
    };
    assert_close_norm(&format!("{what} dsum"), &down(d, &fds), &want, rtol);
}

#[test]
fn layernorm_backward_colsum_is_the_separate_ops() {
    let d = dev();
    let mut rng = Rng::new(0x1a7e_c015);
    let dtypes = [
        (DType::F32, DType::F32, DType::F32),
        (DType::BF16, DType::F32, DType::F32),
        (DType::BF16, DType::BF16, DType::BF16),
        (DType::F16, DType::F32, DType::F32),
        (DType::F16, DType::F16, DType::F16),
        (DType::BF16, DType::F32, DType::F16),
    ];
    for (act, pdt, sdt) in dtypes {
        for (n, c) in [(1usize, 64usize), (65, 130), (37, 300), (256, 768)] {
            check(&d, &mut rng, act, pdt, sdt, n, c);
        }
    }
}

#[test]
fn layernorm_backward_colsum_rejects_a_short_dsum() {
    let d = dev();
    let a = |dtype, len| zeros(&d, dtype, len);
    let x = a(DType::F32, 16);
    let (mean, rstd) = (a(DType::F32, 2), up(&d, &[1.0, 1.0]));
    let dout = up(&d, &(0..16).map(|i| i as f32).collect::<Vec<_>>());
    let gamma = up(&d, &[1.0; 8]);
    let (mut dx, mut dg, mut db) = (a(DType::F32, 16), a(DType::F32, 8), a(DType::F32, 8));
    let mut short = a(DType::F32, 4);
    assert!(
        d.layernorm_backward_colsum(
            &dout, &x, &gamma, &mean, &rstd, &mut dx, &mut dg, &mut db, &mut short, 2, 8,
        )
        .is_err()
    );
    // Nothing was written before the error.
    assert!(down(&d, &dx).iter().all(|&v| v == 0.0));
}
