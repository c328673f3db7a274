//! Shared helpers for the CPU backend tests: a seeded RNG, buffer shortcuts and comparisons.
#![allow(dead_code)]

/// The f64 reference the conformance suite checks the CPU backend against.
#[allow(unused_imports)]
pub use duet_conformance::reference;

use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{DType, Device, DeviceExt};
use half::{bf16, f16};

/// SplitMix64: tiny, seeded, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }

    /// `n` values uniform in [-1, 1), already representable in f32.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform(-1.0, 1.0) as f32).collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn dev() -> CpuDevice {
    CpuDevice::new(Some(2)).expect("cpu device")
}

pub fn up(d: &CpuDevice, x: &[f32]) -> CpuBuffer {
    d.upload_new(x).expect("upload")
}

pub fn up_i32(d: &CpuDevice, x: &[i32]) -> CpuBuffer {
    d.upload_new(x).expect("upload")
}

/// Uploads `x` rounded to `dtype` (f32, f16 or bf16).
pub fn up_as(d: &CpuDevice, x: &[f32], dtype: DType) -> CpuBuffer {
    match dtype {
        DType::F32 => d.upload_new(x),
        DType::F16 => d.upload_new(&x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()),
        DType::BF16 => d.upload_new(&x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>()),
        other => panic!("up_as: {other}"),
    }
    .expect("upload")
}

/// The values `x` takes after rounding to `dtype` and back.
pub fn round_to(x: &[f32], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => x.to_vec(),
        DType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        DType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        other => panic!("round_to: {other}"),
    }
}

pub fn zeros(d: &CpuDevice, dtype: DType, n: usize) -> CpuBuffer {
    d.alloc(dtype, n).expect("alloc")
}

pub fn down(d: &CpuDevice, b: &CpuBuffer) -> Vec<f32> {
    d.download_f32(b).expect("download")
}

pub fn to64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Asserts `|got − want| ≤ atol + rtol·|want|` element-wise.
#[track_caller]
pub fn assert_close(what: &str, got: &[f32], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let tol = atol + rtol * w.abs();
        assert!(
            err <= tol && g.is_finite(),
            "{what}[{i}]: got {g}, want {w} (error {err:e}, tolerance {tol:e})"
        );
        if err > worst.1 {
            worst = (i, err);
        }
    }
}

/// Max-norm relative comparison: `max|got − want| ≤ rtol · max(max|want|, floor)`.
/// Used for gradients, where individual entries may be near zero.
#[track_caller]
pub fn assert_close_norm(what: &str, got: &[f32], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-6f64, |m, &w| m.max(w.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= rtol * scale && g.is_finite(),
            "{what}[{i}]: got {g}, want {w} (error {err:e} > {rtol} × {scale:e})"
        );
    }
}

#[allow(unused_imports)]
pub use duet_conformance::reference::naive_gemm;
