//! Shared helpers for the CPU backend's own tests: a seeded RNG, buffer shortcuts and a
//! comparison (the conformance suite's harness underneath).
#![allow(dead_code)]

/// The f64 reference the conformance suite checks the CPU backend against.
#[allow(unused_imports)]
pub use duet_conformance::reference;

use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{DType, DeviceExt, Runtime};

/// The conformance suite's seeded RNG with the draws these tests use: values uniform in
/// [-1, 1) and indices.
pub struct Rng(duet_conformance::harness::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(duet_conformance::harness::Rng::new(seed))
    }

    /// `n` values uniform in [-1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        self.0.vec(n, -1.0, 1.0)
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
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

/// Uploads `x` rounded to `dtype` (on the host, as the conformance suite does).
pub fn up_as(d: &CpuDevice, x: &[f32], dtype: DType) -> CpuBuffer {
    duet_conformance::harness::put(d, dtype, x)
}

/// The values `x` takes after rounding to `dtype` and back.
pub fn round_to(x: &[f32], dtype: DType) -> Vec<f32> {
    duet_conformance::harness::rounded(dtype, x)
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
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let tol = atol + rtol * w.abs();
        assert!(
            err <= tol && g.is_finite(),
            "{what}[{i}]: got {g}, want {w} (error {err:e}, tolerance {tol:e})"
        );
    }
}
