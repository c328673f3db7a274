//! rocBLAS calls with their status turned into `Result<_, HipError>`.

use super::sys::{self, RocblasLib};
use crate::error::HipError;
use crate::loader;

pub struct RocblasApi {
    pub lib: RocblasLib,
    pub name: String,
    /// The file the library was mapped from, when known.
    pub file: Option<std::path::PathBuf>,
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
        Ok(unsafe { Self::from_library(opened.lib, &opened.name) }?)
    }

    /// The API over an opened library (`name` for messages), failing with the names of any
    /// missing symbols.
    ///
    /// # Safety
    /// `lib` must export each symbol of [`RocblasLib`] with the signature declared there.
    pub unsafe fn from_library(lib: libloading::Library, name: &str) -> Result<Self, HipError> {
        let file = crate::toolchain::library_file(&lib, c"rocblas_create_handle");
        // SAFETY: guaranteed by the caller.
        let lib = unsafe { RocblasLib::load(lib, name) }?;
        Ok(Self {
            lib,
            name: name.to_string(),
            file,
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

    /// Forbids atomics on `h` (`rocblas_set_atomics_mode(h, rocblas_atomics_not_allowed)`) and
    /// reads the mode back: without this, rocBLAS 4.x (ROCm 6) may pick split-K GEMM kernels
    /// that accumulate with atomics, so two runs of a weight-gradient GEMM differ in the last
    /// bits. An error (rather than a silently non-reproducible backend) when either call fails
    /// or the mode did not stick.
    ///
    /// # Safety
    /// `h` must be live.
    pub unsafe fn forbid_atomics(&self, h: sys::rocblas_handle) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller; the mode is a plain enum value.
        check("rocblas_set_atomics_mode", unsafe {
            (self.lib.rocblas_set_atomics_mode)(h, sys::rocblas_atomics_not_allowed)
        })?;
        let mut mode = sys::rocblas_atomics_allowed;
        // SAFETY: guaranteed by the caller; writes one enum value.
        check("rocblas_get_atomics_mode", unsafe {
            (self.lib.rocblas_get_atomics_mode)(h, &mut mode)
        })?;
        if mode != sys::rocblas_atomics_not_allowed {
            return Err(HipError::Rocblas {
                call: "rocblas_set_atomics_mode (mode read back is still atomics_allowed)",
                status: sys::rocblas_status_invalid_value,
            });
        }
        Ok(())
    }

    /// rocBLAS's version string (`rocblas_get_version_string`, e.g. `4.4.0.f9b6d1a4`).
    pub fn version(&self) -> Result<String, HipError> {
        let mut len = 0usize;
        // SAFETY: writes one size_t.
        check("rocblas_get_version_string_size", unsafe {
            (self.lib.rocblas_get_version_string_size)(&mut len)
        })?;
        let mut buf = vec![0u8; len.clamp(1, 4096)];
        // SAFETY: the buffer holds `buf.len()` bytes, which rocBLAS writes at most (NUL included).
        check("rocblas_get_version_string", unsafe {
            (self.lib.rocblas_get_version_string)(buf.as_mut_ptr().cast(), buf.len())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
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
