//! The trait's default of the fused FP8 LayerNorm forward (`Fused::layernorm_forward_fp8`, which
//! the CPU backend does not override): it must give exactly what `layernorm_forward` followed by
//! `quantize_fp8` of its output give (codes, transposed codes, mean, rstd, amax bit for bit) and
//! the same argument errors. Also the default of `Fused::quantize_fp8_many`: exactly the
//! per-job `quantize_fp8` calls, and its argument checks (before any job runs). And the default
//! of `Fused::fp8_scaling_update` with strided inverse scales.

mod common;

use common::*;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::Fused;
use duet_device::{Buffer, DType, Device, DeviceError, Fp8QuantJob};

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

// ------------------------------------------------------------------ quantize_fp8_many

/// One job of the multi-matrix tests: shape, source dtype, FP8 dtype, transposed copy, slot.
type Spec = (usize, usize, DType, DType, bool, usize);

/// Job sources: values of a wide range with a few beyond every FP8 maximum once scaled, zeros
/// and a NaN.
fn many_src(d: &CpuDevice, rng: &mut Rng, (rows, cols, src, ..): Spec) -> CpuBuffer {
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| match i % 53 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NAN,
            3 => 3.0e4,
            _ => (rng.uniform(-1.0, 1.0) * 2f64.powf(rng.uniform(-10.0, 10.0))) as f32,
        })
        .collect();
    up_as(d, &x, src)
}

/// Every job's codes and transposed codes, and the amax bits.
type ManyOutcome = (Vec<(Vec<u8>, Vec<u8>)>, Vec<u32>);

/// `quantize_fp8_many` (`many`) or one `quantize_fp8` per job.
fn run_many(
    d: &CpuDevice,
    specs: &[Spec],
    srcs: &[CpuBuffer],
    scale: &CpuBuffer,
    many: bool,
) -> ManyOutcome {
    let mut dsts: Vec<CpuBuffer> = specs.iter().map(|s| zeros(d, s.3, s.0 * s.1)).collect();
    let mut dts: Vec<CpuBuffer> = specs.iter().map(|s| zeros(d, s.3, s.0 * s.1)).collect();
    let mut amax = up(d, &[0.0, 0.5, 0.0, 2.0]);
    if many {
        let mut jobs: Vec<Fp8QuantJob<'_, CpuBuffer>> = specs
            .iter()
            .zip(srcs)
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
            .map(|((s, src), (dst, dt))| Fp8QuantJob {
                src,
                dst,
                dst_t: s.4.then_some(dt),
                rows: s.0,
                cols: s.1,
                slot: s.5,
            })
            .collect();
        d.quantize_fp8_many(&mut jobs, scale, &mut amax).unwrap();
    } else {
        for ((s, src), (dst, dt)) in specs
            .iter()
            .zip(srcs)
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
        {
            d.quantize_fp8(src, dst, s.4.then_some(dt), s.0, s.1, scale, &mut amax, s.5)
                .unwrap();
        }
    }
    let codes = dsts
        .iter()
        .zip(&dts)
        .map(|(a, b)| {
            (
                d.download_bytes(a, 0, a.len()).unwrap(),
                d.download_bytes(b, 0, b.len()).unwrap(),
            )
        })
        .collect();
    let amax = down(d, &amax).iter().map(|v| v.to_bits()).collect();
    (codes, amax)
}

#[test]
fn quantize_fp8_many_default_equals_the_per_job_calls() {
    let d = dev();
    let mut rng = Rng::new(11);
    let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
    // Slots 1 and 3 are shared by several jobs, slot 2 by none; slot 0 is never named.
    let specs: Vec<Spec> = vec![
        (64, 48, DType::BF16, e4, true, 1),
        (48, 64, DType::BF16, e4, false, 1),
        (37, 45, DType::F32, e5, true, 3),
        (8, 1, DType::F16, e4, true, 3),
        (130, 24, DType::F16, DType::F8E4M3Fnuz, true, 1),
        (0, 16, DType::BF16, e5, true, 3),
        (5, 9, DType::BF16, DType::F8E5M2Fnuz, false, 3),
    ];
    let srcs: Vec<CpuBuffer> = specs.iter().map(|&s| many_src(&d, &mut rng, s)).collect();
    for scales in [[1.0f32, 0.25, 1.0, 37.5], [1.0, 300.0, 1.0, 1.0e-3]] {
        let scale = up(&d, &scales);
        let many = run_many(&d, &specs, &srcs, &scale, true);
        let each = run_many(&d, &specs, &srcs, &scale, false);
        assert_eq!(many, each, "scales {scales:?}");
        assert_eq!((many.1[0], many.1[2]), (0, 0), "unnamed slots untouched");
        assert!(
            f32::from_bits(many.1[1]) >= 3.0e4,
            "slot 1 saw the large values"
        );
        for ((_, dt), s) in many.0.iter().zip(&specs) {
            if !s.4 {
                assert!(dt.iter().all(|&b| b == 0), "dst_t untouched: {s:?}");
            }
        }
    }
    // No jobs: nothing to do.
    let scale = up(&d, &[1.0]);
    let mut amax = up(&d, &[0.5]);
    d.quantize_fp8_many(&mut [], &scale, &mut amax).unwrap();
    assert_eq!(down(&d, &amax), vec![0.5]);
}

#[test]
fn quantize_fp8_many_default_checks_every_job_first() {
    let d = dev();
    let (rows, cols) = (8, 16);
    let n = rows * cols;
    let src = up_as(&d, &vec![1.5; n], DType::BF16);
    let short = zeros(&d, DType::BF16, n - 1);
    let int_src = up_i32(&d, &vec![1; n]);
    let scale = up(&d, &[1.0, 1.0]);
    let mut amax = up(&d, &[0.0, 0.0]);
    let mut first = zeros(&d, DType::F8E4M3, n);
    // The second job is bad in each case; the first (valid) must not have run.
    let mut check = |src2: &CpuBuffer,
                     dst2: DType,
                     dt2: Option<(DType, usize)>,
                     slot2: usize,
                     scale: &CpuBuffer,
                     want: fn(&DeviceError) -> bool| {
        let mut dst = zeros(&d, dst2, n);
        let mut dt = dt2.map(|(t, len)| zeros(&d, t, len));
        let mut jobs = [
            Fp8QuantJob {
                src: &src,
                dst: &mut first,
                dst_t: None,
                rows,
                cols,
                slot: 0,
            },
            Fp8QuantJob {
                src: src2,
                dst: &mut dst,
                dst_t: dt.as_mut(),
                rows,
                cols,
                slot: slot2,
            },
        ];
        let err = d
            .quantize_fp8_many(&mut jobs, scale, &mut amax)
            .unwrap_err();
        assert!(want(&err), "{err}");
        assert!(
            d.download_bytes(&first, 0, n)
                .unwrap()
                .iter()
                .all(|&b| b == 0),
            "first job ran before the error: {err}"
        );
        assert_eq!(down(&d, &amax), vec![0.0, 0.0], "amax changed: {err}");
    };
    let shape = |e: &DeviceError| matches!(e, DeviceError::Shape { .. });
    let unsupported = |e: &DeviceError| matches!(e, DeviceError::Unsupported { .. });
    let mismatch = |e: &DeviceError| matches!(e, DeviceError::DTypeMismatch { .. });
    check(&short, DType::F8E4M3, None, 1, &scale, shape);
    check(
        &src,
        DType::F8E4M3,
        Some((DType::F8E4M3, n + 8)),
        1,
        &scale,
        shape,
    );
    check(
        &src,
        DType::F8E4M3,
        Some((DType::F8E5M2, n)),
        1,
        &scale,
        mismatch,
    );
    check(&src, DType::BF16, None, 1, &scale, unsupported);
    check(&int_src, DType::F8E4M3, None, 1, &scale, unsupported);
    check(&src, DType::F8E4M3, None, 2, &scale, shape);
    let short_scale = up(&d, &[1.0]);
    check(&src, DType::F8E4M3, None, 1, &short_scale, shape);
    let bf16_scale = up_as(&d, &[1.0, 1.0], DType::BF16);
    check(&src, DType::F8E4M3, None, 0, &bf16_scale, mismatch);
}

/// The trait's default of `Fused::fp8_scaling_update` with the inverse scales `inv_stride`
/// apart: the same scales and histories as packed, each inverse at `i · inv_stride` (1/scale
/// rounded once), the elements in between untouched; a zero stride or a `scale_inv` of the
/// wrong length is refused before anything is written.
#[test]
fn fp8_scaling_update_strided_inverses() {
    let d = dev();
    let ops = 5;
    let len = 3;
    let amax = [2.0f32, 0.0, 448.0, f32::NAN, 0.5];
    let maxes = [448.0f32, 448.0, 57344.0, 448.0, 240.0];
    let run = |stride: usize| {
        let mut a = up(&d, &amax);
        let mut h = up(&d, &vec![1.0f32; ops * len]);
        let mut s = up(&d, &[1.0f32, 2.0, 4.0, 8.0, 16.0]);
        let inv0: Vec<f32> = (0..ops * stride).map(|i| -(i as f32)).collect();
        let mut inv = up(&d, &inv0);
        let inv0: Vec<u32> = inv0.iter().map(|x| x.to_bits()).collect();
        let m = up(&d, &maxes);
        d.fp8_scaling_update(&mut a, &mut h, &mut s, &mut inv, stride, &m, len, false, 0)
            .unwrap();
        // Bits, so that the NaN history entry compares equal.
        let f = |b: &CpuBuffer| -> Vec<u32> { down(&d, b).iter().map(|x| x.to_bits()).collect() };
        (f(&s), f(&h), f(&inv), inv0, f(&a))
    };
    let (s1, h1, inv1, _, a1) = run(1);
    for stride in [1, 3, 64] {
        let (s, h, inv, inv0, a) = run(stride);
        assert_eq!((&s, &h, &a), (&s1, &h1, &a1), "stride {stride}");
        for (i, (&x, &x0)) in inv.iter().zip(&inv0).enumerate() {
            let want = if i % stride == 0 {
                duet_device::fp8_scale_inv(f32::from_bits(s[i / stride])).to_bits()
            } else {
                x0
            };
            assert_eq!(x, want, "stride {stride}: element {i}");
            if i % stride == 0 {
                assert_eq!(x, inv1[i / stride], "stride {stride}: as packed");
            }
        }
    }
    let mut a = up(&d, &amax);
    let mut h = up(&d, &vec![1.0f32; ops * len]);
    let mut s = up(&d, &[1.0f32; 5]);
    let m = up(&d, &maxes);
    let mut inv = up(&d, &vec![7.0f32; ops * 2]);
    let e = d
        .fp8_scaling_update(&mut a, &mut h, &mut s, &mut inv, 0, &m, len, false, 0)
        .unwrap_err();
    assert!(
        e.to_string().contains("inv_stride must be at least 1"),
        "{e}"
    );
    let e = d
        .fp8_scaling_update(&mut a, &mut h, &mut s, &mut inv, 3, &m, len, false, 0)
        .unwrap_err();
    assert!(matches!(e, DeviceError::Shape { .. }), "{e}");
    assert_eq!(down(&d, &inv), vec![7.0; ops * 2]);
    assert_eq!(down(&d, &a)[0], 2.0, "amax untouched");
}
