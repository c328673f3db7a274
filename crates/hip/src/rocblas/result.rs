//! rocBLAS calls with their status turned into `Result<_, HipError>`.

use super::sys::{self, RocblasLib};
use crate::error::HipError;
use crate::loader;

pub struct RocblasApi {
    pub lib: RocblasLib,
    pub name: String,
}

fn check(call: &'static str, status: sys::rocblas_status) -> Result<(), HipError> {
    if status == sys::rocblas_status_success {
        Ok(())
    } else {
        Err(HipError::Rocblas { call, status })
    }
}

/// Arguments of one strided-batched GEMM, already in rocBLAS's column-major terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ColMajorGemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    pub batch: i32,
}

impl RocblasApi {
    pub fn load() -> Result<Self, duet_device::DeviceError> {
        let opened = loader::open(&loader::ROCBLAS).map_err(|tried| {
            crate::error::unavailable("rocBLAS (librocblas, ROCm 6/7) not found", tried)
        })?;
        // SAFETY: the declarations in `sys` match rocBLAS 4.x/5.x (see its module docs).
        let lib = unsafe { RocblasLib::load(opened.lib, &opened.name) }?;
        Ok(Self {
            lib,
            name: opened.name,
        })
    }

    pub fn create_handle(&self) -> Result<sys::rocblas_handle, HipError> {
        let mut h = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("rocblas_create_handle", unsafe {
            (self.lib.rocblas_create_handle)(&mut h)
        })?;
        Ok(h)
    }

    /// # Safety
    /// `h` must be a live handle, not used afterwards.
    pub unsafe fn destroy_handle(&self, h: sys::rocblas_handle) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        check("rocblas_destroy_handle", unsafe {
            (self.lib.rocblas_destroy_handle)(h)
        })
    }

    /// # Safety
    /// `h` and `s` must be live.
    pub unsafe fn set_stream(
        &self,
        h: sys::rocblas_handle,
        s: crate::hip::sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        check("rocblas_set_stream", unsafe {
            (self.lib.rocblas_set_stream)(h, s)
        })
    }

    /// `C = alpha op(A) op(B) + beta C` (column-major), f32 compute, D = C in place.
    ///
    /// # Safety
    /// `h` must be live; `a`, `b`, `c` must be device memory holding every batch the shape,
    /// leading dimensions and strides address, in the dtypes given.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_strided_batched(
        &self,
        h: sys::rocblas_handle,
        g: &ColMajorGemm,
        alpha: f32,
        a: *const std::ffi::c_void,
        ab_type: sys::rocblas_datatype,
        b: *const std::ffi::c_void,
        beta: f32,
        c: *mut std::ffi::c_void,
        c_type: sys::rocblas_datatype,
    ) -> Result<(), HipError> {
        let op = |t: bool| {
            if t {
                sys::rocblas_operation_transpose
            } else {
                sys::rocblas_operation_none
            }
        };
        // SAFETY: guaranteed by the caller; alpha/beta are host f32 (the compute type) and the
        // default host pointer mode is in effect.
        check("rocblas_gemm_strided_batched_ex", unsafe {
            (self.lib.rocblas_gemm_strided_batched_ex)(
                h,
                op(g.trans_a),
                op(g.trans_b),
                g.m,
                g.n,
                g.k,
                (&alpha as *const f32).cast(),
                a,
                ab_type,
                g.lda,
                g.stride_a,
                b,
                ab_type,
                g.ldb,
                g.stride_b,
                (&beta as *const f32).cast(),
                c,
                c_type,
                g.ldc,
                g.stride_c,
                c,
                c_type,
                g.ldc,
                g.stride_c,
                g.batch,
                sys::rocblas_datatype_f32_r,
                sys::rocblas_gemm_algo_standard,
                0,
                sys::rocblas_gemm_flags_none,
            )
        })
    }
}
