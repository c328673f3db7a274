//! The trait's default of the fused FP8 LayerNorm forward (`Device::layernorm_forward_fp8`, which
//! the CPU backend does not override): it must give exactly what `layernorm_forward` followed by
//! `quantize_fp8` of its output give (codes, transposed codes, mean, rstd, amax bit for bit) and
//! the same argument errors.

mod common;

use common::*;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{Buffer, DType, Device, DeviceError};

const FP8: [DType; 4] = [
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];

/// Everything the op writes, as bits.
#[derive(Debug, PartialEq)]
struct Out {
    dst: Vec<u8>,
    dst_t: Vec<u8>,
    mean: Vec<u32>,
    rstd: Vec<u32>,
    amax: Vec<u32>,
}

/// Rows of different offsets and spreads; row 1 constant, row 2 with a NaN, row 3 with large
/// values (γ up to 40 pushes some outputs past every FP8 maximum once scaled).
fn inputs(rng: &mut Rng, n: usize, c: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut x: Vec<f32> = (0..n * c)
        .map(|i| (i / c % 5) as f32 - 2.0 + rng.uniform(-1.0, 1.0) as f32 * 2.5)
        .collect();
    for j in 0..c {
        if n > 1 {
            x[c + j] = 3.0;
        }
        if n > 2 && j == c / 2 {
            x[2 * c + j] = f32::NAN;
        }
        if n > 3 {
            x[3 * c + j] = 1.0e4 + (j % 7) as f32;
        }
    }
    let gamma = (0..c)
        .map(|j| {
            if j % 17 == 3 {
                40.0
            } else {
                rng.uniform(0.5, 1.5) as f32
            }
        })
        .collect();
    let beta = (0..c).map(|_| rng.uniform(-0.5, 0.5) as f32).collect();
    (x, gamma, beta)
}

/// The fused op (`fused`) or the two separate ops on `d`; scale and amax slot 1 (amax starting
/// at 0.5, the other slots at 0).
#[allow(clippy::too_many_arguments)]
fn run(
    d: &CpuDevice,
    (x, gamma, beta): (&CpuBuffer, &CpuBuffer, &CpuBuffer),
    fmt: DType,
    n: usize,
    c: usize,
    transposed: bool,
    fused: bool,
) -> Out {
    let mut mean = zeros(d, DType::F32, n);
    let mut rstd = zeros(d, DType::F32, n);
    let mut dst = zeros(d, fmt, n * c);
    let mut dt = zeros(d, fmt, n * c);
    let scale = up(d, &[1.0, 37.25, 3.0e-3]);
    let mut amax = up(d, &[0.0, 0.5, 0.0]);
    if fused {
        d.layernorm_forward_fp8(
            x,
            gamma,
            beta,
            &mut mean,
            &mut rstd,
            &mut dst,
            transposed.then_some(&mut dt),
            n,
            c,
            1e-5,
            &scale,
            &mut amax,
            1,
        )
        .unwrap();
    } else {
        let mut out = zeros(d, x.dtype(), n * c);
        d.layernorm_forward(x, gamma, beta, &mut out, &mut mean, &mut rstd, n, c, 1e-5)
            .unwrap();
        d.quantize_fp8(
            &out,
            &mut dst,
            transposed.then_some(&mut dt),
            n,
            c,
            &scale,
            &mut amax,
            1,
        )
        .unwrap();
    }
    let bits = |b: &CpuBuffer| -> Vec<u32> { down(d, b).iter().map(|v| v.to_bits()).collect() };
    Out {
        dst: d.download_bytes(&dst, 0, n * c).unwrap(),
        dst_t: d.download_bytes(&dt, 0, n * c).unwrap(),
        mean: bits(&mean),
        rstd: bits(&rstd),
        amax: bits(&amax),
    }
}

#[test]
fn layernorm_forward_fp8_default_equals_the_separate_ops() {
    let d = dev();
    let mut rng = Rng::new(7);
    let mut checked = 0;
    for (n, c) in [(1, 64), (65, 130), (37, 45), (8, 1), (130, 1000)] {
        let (x, gamma, beta) = inputs(&mut rng, n, c);
        for (act, param) in [
            (DType::F32, DType::F32),
            (DType::BF16, DType::BF16),
            (DType::BF16, DType::F32),
            (DType::F16, DType::F16),
            (DType::F16, DType::F32),
        ] {
            let bufs = (
                up_as(&d, &x, act),
                up_as(&d, &gamma, param),
                up_as(&d, &beta, param),
            );
            let bufs = (&bufs.0, &bufs.1, &bufs.2);
            for fmt in FP8 {
                for transposed in [false, true] {
                    let fused = run(&d, bufs, fmt, n, c, transposed, true);
                    let separate = run(&d, bufs, fmt, n, c, transposed, false);
                    let what = format!("{n}x{c} {act}/{param} -> {fmt} transposed {transposed}");
                    assert_eq!(fused, separate, "{what}");
                    if !transposed {
                        assert!(
                            fused.dst_t.iter().all(|&b| b == 0),
                            "dst_t untouched: {what}"
                        );
                    }
                    // c = 1: every output is β (|β| < 0.5); elsewhere γ = 40 columns.
                    let a = f32::from_bits(fused.amax[1]);
                    assert!(a >= 0.5 && (c == 1 || a > 0.5), "amax {a}: {what}");
                    assert_eq!(
                        (fused.amax[0], fused.amax[2]),
                        (0, 0),
                        "other slots: {what}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 5 * 5 * 4 * 2);
}

#[test]
fn layernorm_forward_fp8_default_reports_the_separate_ops_errors() {
    let d = dev();
    let (n, c) = (4, 16);
    let x = zeros(&d, DType::BF16, n * c);
    let gamma = zeros(&d, DType::BF16, c);
    let short = zeros(&d, DType::BF16, c - 1);
    let scale = up(&d, &[1.0]);
    let mut amax = up(&d, &[0.0]);
    let mut mean = zeros(&d, DType::F32, n);
    let mut rstd = zeros(&d, DType::F32, n);
    let mut run = |beta: &CpuBuffer, fmt: DType, slot: usize| -> Result<(), DeviceError> {
        let mut dst = zeros(&d, fmt, n * c);
        d.layernorm_forward_fp8(
            &x, &gamma, beta, &mut mean, &mut rstd, &mut dst, None, n, c, 1e-5, &scale, &mut amax,
            slot,
        )
    };
    let err = run(&short, DType::F8E4M3, 0).unwrap_err();
    assert!(matches!(err, DeviceError::Shape { .. }), "{err}");
    let err = run(&gamma, DType::BF16, 0).unwrap_err();
    assert!(matches!(err, DeviceError::Unsupported { .. }), "{err}");
    let err = run(&gamma, DType::F8E4M3, 1).unwrap_err();
    assert!(matches!(err, DeviceError::Shape { .. }), "{err}");
    run(&gamma, DType::F8E4M3, 0).unwrap();
}
