//! Casts between every pair of float dtypes, FP8 saturation and scaling.

mod common;

use common::*;
use duet_device::{DType, Device, DeviceExt, Fp8Format};
use half::{bf16, f16};

const FP8: [DType; 4] = [
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];

/// What one value becomes after casting to `dtype` (the codec under test is the device's).
fn expected(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        fp8 => {
            let f = Fp8Format::of(fp8).unwrap();
            f.decode(f.encode(x))
        }
    }
}

fn same(a: f32, b: f32) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

#[test]
fn f32_to_every_dtype_and_back() {
    let d = dev();
    let mut rng = Rng::new(1);
    let mut x: Vec<f32> = rng.vec(40_000).iter().map(|v| v * 1000.0).collect();
    x.extend([
        0.0,
        -0.0,
        1e-9,
        -3e-6,
        1e6,
        -1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let src = up(&d, &x);
    for dtype in [DType::F32, DType::F16, DType::BF16].into_iter().chain(FP8) {
        let mut dst = zeros(&d, dtype, x.len());
        d.cast(&src, &mut dst, 1.0).unwrap();
        let mut back = zeros(&d, DType::F32, x.len());
        d.cast(&dst, &mut back, 1.0).unwrap();
        let got = down(&d, &back);
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            assert!(same(g, expected(v, dtype)), "{dtype}[{i}]: {v} -> {g}");
        }
    }
}

#[test]
fn fp8_saturates_instead_of_overflowing() {
    let d = dev();
    let x = [
        1e6f32,
        -1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        500.0,
        -250.0,
    ];
    for dtype in FP8 {
        let max = dtype.max_finite().unwrap();
        let mut dst = zeros(&d, dtype, x.len());
        d.cast(&up(&d, &x), &mut dst, 1.0).unwrap();
        let got = down(&d, &dst);
        assert_eq!(got[0], max, "{dtype}");
        assert_eq!(got[1], -max, "{dtype}");
        assert_eq!(got[2], max, "{dtype}: +inf saturates");
        assert_eq!(got[3], -max, "{dtype}: -inf saturates");
        assert_eq!(got[4], expected(500.0, dtype), "{dtype}");
        assert!(got.iter().all(|v| v.is_finite()), "{dtype}: {got:?}");
    }
    // E4M3 (max 448) saturates 500 and the FNUZ variant (max 240) saturates -250.
    let mut e4 = zeros(&d, DType::F8E4M3, x.len());
    d.cast(&up(&d, &x), &mut e4, 1.0).unwrap();
    assert_eq!(down(&d, &e4)[4], 448.0);
    let mut e4 = zeros(&d, DType::F8E4M3Fnuz, x.len());
    d.cast(&up(&d, &x), &mut e4, 1.0).unwrap();
    assert_eq!(down(&d, &e4)[5], -240.0);
}

#[test]
fn every_fp8_code_decodes_and_reencodes() {
    let d = dev();
    let codes: Vec<u8> = (0..=255).collect();
    for dtype in FP8 {
        let f = Fp8Format::of(dtype).unwrap();
        let mut b = zeros(&d, dtype, 256);
        d.upload(&codes, &mut b, 0).unwrap();
        let mut wide = zeros(&d, DType::F32, 256);
        d.cast(&b, &mut wide, 1.0).unwrap();
        let vals = down(&d, &wide);
        for (c, &v) in vals.iter().enumerate() {
            assert!(same(v, f.decode(c as u8)), "{dtype} code {c:#x}");
        }
        // bf16 holds every fp8 value exactly, so fp8 → bf16 → fp8 is the identity on non-NaN
        // codes (infinities saturate; OCP -0 keeps its sign).
        let mut mid = zeros(&d, DType::BF16, 256);
        d.cast(&b, &mut mid, 1.0).unwrap();
        let mut again = zeros(&d, dtype, 256);
        d.cast(&mid, &mut again, 1.0).unwrap();
        let back: Vec<u8> = d.download(&again).unwrap();
        for c in 0..=255u8 {
            let v = f.decode(c);
            if v.is_finite() {
                assert_eq!(back[c as usize], c, "{dtype} code {c:#x} through bf16");
            }
        }
    }
}

#[test]
fn cast_applies_scale_before_rounding() {
    let d = dev();
    let x = [1.0f32, 100.0, -3.0, 1000.0];
    let mut dst = zeros(&d, DType::F8E4M3, 4);
    d.cast(&up(&d, &x), &mut dst, 0.5).unwrap();
    assert_eq!(down(&d, &dst), vec![0.5, 48.0, -1.5, 448.0]);
    let mut h = zeros(&d, DType::BF16, 4);
    d.cast(&up_as(&d, &x, DType::F16), &mut h, -2.0).unwrap();
    assert_eq!(down(&d, &h), vec![-2.0, -200.0, 6.0, -2000.0]);
}
