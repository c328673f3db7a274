//! GEMMs: rocBLAS `gemm_strided_batched_ex` (f32 compute) for f32/f16/bf16 operands, hipBLASLt for
//! FP8 operands (FNUZ on gfx942, OCP on gfx950) with device scale pointers.

use crate::conv;
use crate::hipblaslt::safe::{Fp8Ptrs, LtHandle, Operand};
use crate::memory::{HipBuffer, MemShared};
use crate::rocblas::safe::RocblasHandle;
use duet_device::{Buffer, DType, DeviceError, GemmDesc, Result};
use std::ffi::c_void;
use std::sync::Arc;

/// hipBLASLt state: the handle, device scales of 1.0 for A and B, and a workspace.
pub struct Lt {
    pub handle: LtHandle,
    pub ones: HipBuffer,
    pub workspace: HipBuffer,
}

pub const LT_WORKSPACE: usize = 32 << 20;

impl Lt {
    pub fn new(handle: LtHandle, mem: &Arc<MemShared>) -> Result<Self> {
        let ones = HipBuffer::new(mem, DType::F32, 2)?;
        let (bits, width) = conv::fill_pattern(DType::F32, 1.0);
        // SAFETY: `ones` holds 2 f32 on this device.
        unsafe {
            mem.stream
                .api()
                .memset_async(ones.ptr(), bits, width, 2, mem.stream.raw())
        }?;
        let workspace = HipBuffer::new(mem, DType::U8, LT_WORKSPACE)?;
        Ok(Self {
            handle,
            ones,
            workspace,
        })
    }
}

/// Validates and runs `desc` on rocBLAS.
pub fn gemm(
    blas: &RocblasHandle,
    desc: &GemmDesc,
    a: &HipBuffer,
    b: &HipBuffer,
    c: &mut HipBuffer,
) -> Result<()> {
    let ab = conv::rocblas_type(a.dtype()).ok_or_else(|| DeviceError::Unsupported {
        op: "gemm".into(),
        dtype: a.dtype(),
    })?;
    let ct =
        conv::rocblas_type(c.dtype()).filter(|_| c.dtype() == a.dtype() || c.dtype() == DType::F32);
    let ct = ct.ok_or_else(|| DeviceError::Unsupported {
        op: format!(
            "gemm with {} inputs (C must be {} or f32)",
            a.dtype(),
            a.dtype()
        ),
        dtype: c.dtype(),
    })?;
    let g = conv::col_major(desc)?;
    // SAFETY: `desc.validate` (called by the device) checked that every batch of A, B and C lies
    // inside the buffers; the pointers are offset inside their allocations.
    unsafe {
        blas.api.gemm_strided_batched(
            blas.raw,
            &g,
            desc.alpha,
            b.ptr_at(desc.b_offset),
            ab,
            a.ptr_at(desc.a_offset),
            desc.beta,
            c.ptr_at(desc.c_offset),
            ct,
        )
    }?;
    Ok(())
}

/// Runs an FP8 `desc` on hipBLASLt. `Unsupported` when the GPU lacks this FP8 format or
/// hipBLASLt has no kernel for the combination. `scales` are device pointers to the f32 factors
/// of A and B (`scale_inv` of delayed scaling); `None` uses ones.
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp8(
    lt: &Lt,
    arch_base: &str,
    stream: crate::hip::sys::hipStream_t,
    desc: &GemmDesc,
    a: &HipBuffer,
    b: &HipBuffer,
    c: &mut HipBuffer,
    scales: Option<(*mut c_void, *mut c_void)>,
) -> Result<()> {
    let unsupported = |what: String, dtype| DeviceError::Unsupported { op: what, dtype };
    if !conv::fp8_supported(arch_base, a.dtype()) {
        return Err(unsupported(
            format!("gemm with {} operands on {arch_base}", a.dtype()),
            a.dtype(),
        ));
    }
    if !matches!(c.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(unsupported(
            "fp8 gemm output (C must be f32, f16 or bf16)".into(),
            c.dtype(),
        ));
    }
    let g = conv::col_major(desc)?;
    let ty = |d: DType| conv::hip_data_type(d).ok_or_else(|| unsupported("gemm".into(), d));
    // Column-major operands: the BLAS "A" is our B, stored (rows, cols) = our (cols, rows).
    let (br, bc) = desc.b_stored();
    let (ar, ac) = desc.a_stored();
    let oa = Operand {
        ty: ty(b.dtype())?,
        rows: bc as u64,
        cols: br as u64,
        ld: g.lda as i64,
        stride: g.stride_a,
    };
    let ob = Operand {
        ty: ty(a.dtype())?,
        rows: ac as u64,
        cols: ar as u64,
        ld: g.ldb as i64,
        stride: g.stride_b,
    };
    let oc = Operand {
        ty: ty(c.dtype())?,
        rows: g.m as u64,
        cols: g.n as u64,
        ld: g.ldc as i64,
        stride: g.stride_c,
    };
    let ptrs = Fp8Ptrs {
        a: b.ptr_at(desc.b_offset),
        b: a.ptr_at(desc.a_offset),
        c: c.ptr_at(desc.c_offset),
        // hipBLASLt's A is our B and vice versa.
        a_scale: scales.map_or(lt.ones.ptr_at(0), |(_, sb)| sb),
        b_scale: scales.map_or(lt.ones.ptr_at(1), |(sa, _)| sa),
        workspace: lt.workspace.ptr(),
        workspace_size: LT_WORKSPACE,
    };
    // SAFETY: `desc.validate` checked every batch lies inside the buffers; the scales and the
    // workspace are live device buffers of the sizes given.
    let ran = unsafe {
        lt.handle.matmul(
            g.trans_a, g.trans_b, &oa, &ob, &oc, g.batch, desc.alpha, desc.beta, &ptrs, stream,
        )
    }?;
    if ran {
        Ok(())
    } else {
        Err(unsupported(
            format!(
                "gemm: hipBLASLt has no algorithm for {} x {} -> {} on {arch_base}",
                a.dtype(),
                b.dtype(),
                c.dtype()
            ),
            a.dtype(),
        ))
    }
}
