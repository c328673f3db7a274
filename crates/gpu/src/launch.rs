//! Launch limits and kernel names shared by the CUDA and HIP backends: the dtype suffixes of the
//! kernels' entry points, the dtype codes of their job tables, the 32-bit limits of their
//! arguments and grids, and the classifier's block size.

use duet_device::{DType, DeviceError, Result};

/// The f32/f16/bf16 suffix of an activation-type buffer in a GPU kernel's name (`add_bf16`; the
/// kernels' `DUET_FOR_ACT`), or [`DeviceError::Unsupported`].
pub fn float_suffix(op: &'static str, d: DType) -> Result<&'static str> {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Ok(d.name()),
        dtype => Err(DeviceError::Unsupported {
            op: op.into(),
            dtype,
        }),
    }
}

/// The dtype code of a float buffer in a GPU kernel's chunk or job table (the multi-tensor
/// kernels of both GPU backends): 0 f32, 1 bf16, 2 f16, or [`DeviceError::Unsupported`].
pub fn float_code(op: &'static str, d: DType) -> Result<i32> {
    match d {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F16 => Ok(2),
        dtype => Err(DeviceError::Unsupported {
            op: op.into(),
            dtype,
        }),
    }
}

/// The kernel-name suffix of a parameter or gradient buffer (`what`) that must be either the
/// activation dtype `act` or f32 (the `<act>_<param>` kernels, `DUET_FOR_ACT_AND_WIDE`).
pub fn wide_suffix(op: &'static str, act: DType, what: &str, d: DType) -> Result<&'static str> {
    if d == act || d == DType::F32 {
        float_suffix(op, d)
    } else {
        Err(DeviceError::Unsupported {
            op: format!("{op} ({what} must be {act} or f32 with {act} activations)"),
            dtype: d,
        })
    }
}

/// A value the GPU kernels of `backend` ("CUDA", "HIP") cannot take (e.g. a dimension beyond 32
/// bits): [`DeviceError::InvalidArgument`].
pub fn kernel_too_large(backend: &str, op: &'static str, what: &str, v: usize) -> DeviceError {
    DeviceError::InvalidArgument(format!(
        "{op}: {what} = {v} is beyond what the {backend} kernels index"
    ))
}

/// A dimension as the `int` a kernel of `backend` takes, or [`kernel_too_large`].
pub fn kernel_int(backend: &str, op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| kernel_too_large(backend, op, what, v))
}

/// A grid dimension of `blocks` blocks (at most `i32::MAX`) for a kernel of `backend`, or
/// [`kernel_too_large`].
pub fn kernel_grid_dim(backend: &str, op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| kernel_too_large(backend, op, "grid", blocks))
}

/// Threads per row of the GPU cross-entropy kernels (kernels-cuda/cross_entropy.cu and
/// kernels-hip/cross_entropy.hip): one per group of 8 logits, in whole 32-lane groups, 32 to
/// 1024. It fixes which thread sums which logits, so both vendors use it to get the same bits.
pub fn cross_entropy_threads(v: usize) -> u32 {
    (v.div_ceil(8).div_ceil(32) * 32).clamp(32, 1024) as u32
}
