//! The device contract: the one interface every duet backend (CPU, CUDA, HIP) implements.
//!
//! It is one small [`Runtime`] trait (buffers, copies, synchronisation, graphs, timing) and one
//! trait per op family in [`ops`]: [`ElementwiseOps`], [`GemmOps`], [`EmbeddingOps`],
//! [`NormOps`], [`AttentionOps`], [`LossOps`], [`OptimOps`] and [`Fp8Ops`]. [`Device`] is their
//! union, implemented for every type that implements them all; generic code writes `D: Device`.
//! A backend implements each family in its own `ops/<family>.rs`.
//!
//! Conventions shared by every op:
//! - Matrices are row-major. A "rows × cols" tensor has `cols` contiguous elements per row.
//! - Buffers carry a runtime [`DType`]. Arithmetic is always done in f32 (GEMMs accumulate in f32);
//!   f16/bf16/fp8 are storage formats. An op given a dtype it cannot handle returns
//!   [`DeviceError::Unsupported`], never a wrong answer.
//! - Ops are enqueued on the device's stream in call order; [`Runtime::synchronize`] waits for them.
//!   Host reads ([`DeviceExt::download`]) synchronise implicitly.
//! - "accumulate" in an op's doc means the result is added to the output (`+=`); everything else
//!   overwrites its output.
#![forbid(unsafe_code)]

pub mod args;
mod capabilities;
mod checked;
mod collective;
pub mod composed;
mod device;
mod dtype;
mod error;
mod gemm;
mod host_memory;
pub mod knobs;
pub mod ops;
mod runtime;

pub use args::{HeadsDesc, RowsDesc, SoftmaxDesc, TokensDesc};
pub use capabilities::Capabilities;
pub use checked::{Check, Checked, Op};
pub use collective::{Collective, ReduceOp, check_collective_lens};
pub use device::Device;
pub use dtype::{DType, Fp8Format, Fp8Kind, HostType};
pub use error::human_bytes;
pub use error::{DeviceError, Result};
pub use gemm::GemmDesc;
pub use host_memory::{HostMemory, host_memory, host_memory_report};
pub use ops::attention::{
    AttentionOps, FlashAttentionBackward, FlashAttentionForward, MergeHeads, SoftmaxCausalBackward,
    SoftmaxCausalForward, SplitHeads, SplitHeadsBackward,
};
pub use ops::elementwise::{
    Add, AddAssign, BiasAdd, BiasBackward, ElementwiseOps, GeluBackward, GeluForward, Scale,
};
pub use ops::embedding::{EmbeddingBackward, EmbeddingForward, EmbeddingOps};
pub use ops::fp8::{
    AdamWClippedFp8, AdamWFp8Out, Fp8Ops, Fp8QuantJob, Fp8ScalingUpdate, GemmFp8, GemmFp8Epilogue,
    LayerNormForwardFp8, QuantizeFp8, QuantizeFp8Gelu, QuantizeFp8Grad, QuantizeFp8Many,
    check_adamw_fp8_outs, check_fp8_quant_jobs, check_fp8_scaling_args, fp8_delayed_scale,
    fp8_history_scale, fp8_history_step, fp8_scale_inv,
};
pub use ops::gemm::{Epilogue, Gemm, GemmEpilogue, GemmOps, epilogue_shape};
pub use ops::loss::{CrossEntropy, CrossEntropyInPlace, CrossEntropyPadded, LossOps};
pub use ops::norm::{LayerNormBackward, LayerNormBackwardColsum, LayerNormForward, NormOps};
pub use ops::optim::{
    ADAMW_SCALARS, AdamWClipStep, AdamWClipped, AdamWStep, AdamWTensor, AdamWUpdate, OptimOps,
    SumSquares, SumSquaresMany, clip_grad_scale,
};
pub use runtime::{
    Buffer, DeviceExt, DeviceInfo, MemoryStats, Runtime, Telemetry, time_ms_host_clock,
};

use std::fmt;

/// Which backend to run on. `Auto` picks the first GPU backend that loads, else the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Cpu,
    Cuda,
    Hip,
    Auto,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Cpu, Self::Cuda, Self::Hip, Self::Auto];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Hip => "hip",
            Self::Auto => "auto",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "hip" | "rocm" => Ok(Self::Hip),
            "auto" => Ok(Self::Auto),
            other => Err(DeviceError::InvalidArgument(format!(
                "unknown backend '{other}' (expected one of: cpu, cuda, hip, auto)"
            ))),
        }
    }
}

/// Checks that `[offset, offset + len)` lies inside a buffer of `cap` elements.
pub fn check_range(op: &'static str, offset: usize, len: usize, cap: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= cap => Ok(()),
        _ => Err(DeviceError::Shape {
            op,
            detail: format!("range {offset}..{offset}+{len} exceeds buffer of {cap} elements"),
        }),
    }
}

/// Checks a buffer's length against what an op expects.
pub fn check_len<B: Buffer>(op: &'static str, what: &str, buf: &B, expected: usize) -> Result<()> {
    if buf.len() == expected {
        Ok(())
    } else {
        Err(DeviceError::Shape {
            op,
            detail: format!("{what} has {} elements, expected {expected}", buf.len()),
        })
    }
}

/// Checks that a buffer is at least `expected` long.
pub fn check_min_len<B: Buffer>(
    op: &'static str,
    what: &str,
    buf: &B,
    expected: usize,
) -> Result<()> {
    if buf.len() >= expected {
        Ok(())
    } else {
        Err(DeviceError::Shape {
            op,
            detail: format!(
                "{what} has {} elements, needs at least {expected}",
                buf.len()
            ),
        })
    }
}

/// Checks a buffer's dtype.
pub fn check_dtype<B: Buffer>(op: &'static str, buf: &B, expected: DType) -> Result<()> {
    if buf.dtype() == expected {
        Ok(())
    } else {
        Err(DeviceError::DTypeMismatch {
            op,
            expected,
            got: buf.dtype(),
        })
    }
}

/// Checks that a buffer holds a float type usable for activations (f32, f16, bf16).
pub fn check_float<B: Buffer>(op: &'static str, buf: &B) -> Result<()> {
    match buf.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        dtype => Err(DeviceError::Unsupported {
            op: op.to_string(),
            dtype,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::clip_grad_scale;

    #[test]
    fn clip_grad_scale_follows_clip_grad_norm() {
        // No clipping below the threshold, or with clipping off.
        assert_eq!(clip_grad_scale(0.25, 1.0, 1.0), 1.0);
        assert_eq!(clip_grad_scale(100.0, 0.0, 1.0), 1.0);
        // Norm 2 clipped to 1: max_norm / (norm + 1e-6).
        assert_eq!(clip_grad_scale(4.0, 1.0, 1.0), 1.0 / (2.0 + 1e-6));
        // Loss-scaled gradients: the norm is unscaled first, the factor carries 1/scale.
        let s = clip_grad_scale(16.0, 1.0, 2.0);
        assert_eq!(s, ((1.0f32 / (2.0 + 1e-6)) as f64 / 2.0) as f32);
        assert_eq!(clip_grad_scale(0.25, 1.0, 4.0), 0.25);
        // Non-finite norms give no clipping factor (the step then fails or is skipped).
        assert_eq!(clip_grad_scale(f32::NAN, 1.0, 1.0), 1.0);
    }
}
