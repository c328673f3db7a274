//! HAND-WRITTEN rocBLAS bindings (Debian ships no rocBLAS headers, so bindgen cannot be used).
//!
//! Verified against rocBLAS `library/include/internal/rocblas-types.h` and
//! `rocblas-functions.h` (rocm-6.2.x; `gemm_ex`/`gemm_strided_batched_ex` are unchanged in
//! rocBLAS 5.0 / ROCm 7). Only the calls and constants the backend uses are declared.
#![allow(non_camel_case_types, non_upper_case_globals)]

use crate::dynlib::dyn_api;
use crate::hip::sys::hipStream_t;
use std::ffi::c_void;

pub type rocblas_handle = *mut c_void;
pub type rocblas_status = u32;
pub type rocblas_operation = u32;
pub type rocblas_datatype = u32;
pub type rocblas_gemm_algo = u32;
pub type rocblas_int = i32;
pub type rocblas_stride = i64;

pub const rocblas_status_success: rocblas_status = 0;
pub const rocblas_status_invalid_value: rocblas_status = 11;
pub const rocblas_operation_none: rocblas_operation = 111;
pub const rocblas_operation_transpose: rocblas_operation = 112;
pub const rocblas_datatype_f16_r: rocblas_datatype = 150;
pub const rocblas_datatype_f32_r: rocblas_datatype = 151;
pub const rocblas_datatype_bf16_r: rocblas_datatype = 168;
pub const rocblas_gemm_algo_standard: rocblas_gemm_algo = 0;
/// `rocblas_gemm_flags_none`.
pub const rocblas_gemm_flags_none: u32 = 0;
/// `rocblas_atomics_mode` (`rocblas-types.h`): `rocblas_atomics_not_allowed = 0`,
/// `rocblas_atomics_allowed = 1`. rocBLAS 4.x (ROCm 6) defaults to allowed, which lets Tensile
/// pick split-K kernels that accumulate with atomics (not bit-wise reproducible); rocBLAS 5.x
/// (ROCm 7) defaults to not allowed. duet sets it explicitly on every handle.
pub type rocblas_atomics_mode = u32;
pub const rocblas_atomics_not_allowed: rocblas_atomics_mode = 0;
pub const rocblas_atomics_allowed: rocblas_atomics_mode = 1;

dyn_api! {
    /// The rocBLAS functions the backend calls.
    pub struct RocblasLib {
        pub fn rocblas_create_handle(handle: *mut rocblas_handle) -> rocblas_status;
        pub fn rocblas_destroy_handle(handle: rocblas_handle) -> rocblas_status;
        pub fn rocblas_set_stream(handle: rocblas_handle, stream: hipStream_t) -> rocblas_status;
        pub fn rocblas_set_atomics_mode(
            handle: rocblas_handle,
            mode: rocblas_atomics_mode,
        ) -> rocblas_status;
        pub fn rocblas_get_atomics_mode(
            handle: rocblas_handle,
            mode: *mut rocblas_atomics_mode,
        ) -> rocblas_status;
        pub fn rocblas_get_version_string_size(len: *mut usize) -> rocblas_status;
        pub fn rocblas_get_version_string(buf: *mut std::ffi::c_char, len: usize) -> rocblas_status;
        pub fn rocblas_gemm_strided_batched_ex(
            handle: rocblas_handle,
            trans_a: rocblas_operation,
            trans_b: rocblas_operation,
            m: rocblas_int,
            n: rocblas_int,
            k: rocblas_int,
            alpha: *const c_void,
            a: *const c_void,
            a_type: rocblas_datatype,
            lda: rocblas_int,
            stride_a: rocblas_stride,
            b: *const c_void,
            b_type: rocblas_datatype,
            ldb: rocblas_int,
            stride_b: rocblas_stride,
            beta: *const c_void,
            c: *const c_void,
            c_type: rocblas_datatype,
            ldc: rocblas_int,
            stride_c: rocblas_stride,
            d: *mut c_void,
            d_type: rocblas_datatype,
            ldd: rocblas_int,
            stride_d: rocblas_stride,
            batch_count: rocblas_int,
            compute_type: rocblas_datatype,
            algo: rocblas_gemm_algo,
            solution_index: i32,
            flags: u32,
        ) -> rocblas_status;
    }
}
