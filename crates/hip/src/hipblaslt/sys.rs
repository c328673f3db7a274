//! HAND-WRITTEN hipBLASLt bindings (Debian ships no hipBLASLt headers, and `hipblaslt.h` is C++).
//!
//! Verified against hipBLASLt `library/include/hipblaslt.h` (rocm-6.2.x) and
//! `library/include/hipblaslt/hipblaslt.h` (ROCm 7.x): the signatures and the enum values used
//! here are identical in both. `hipDataType` values are HIP's `library_types.h`; `hipblasStatus_t`,
//! `hipblasOperation_t` and `hipblasComputeType_t` come from hipBLAS-common `hipblas-common.h`.
#![allow(non_camel_case_types, non_upper_case_globals)]

use crate::dynlib::dyn_api;
use crate::hip::sys::hipStream_t;
use std::ffi::c_void;

pub type hipblasStatus_t = u32;
pub type hipblasLtHandle_t = *mut c_void;
pub type hipblasLtMatmulDesc_t = *mut c_void;
pub type hipblasLtMatrixLayout_t = *mut c_void;
pub type hipblasLtMatmulPreference_t = *mut c_void;
pub type hipDataType = u32;
pub type hipblasComputeType_t = u32;

pub const HIPBLAS_STATUS_SUCCESS: hipblasStatus_t = 0;
/// What `hipblasLtMatmul` returns for an algorithm it refuses at launch (nothing enqueued).
pub const HIPBLAS_STATUS_NOT_SUPPORTED: hipblasStatus_t = 7;
pub const HIPBLAS_OP_N: i32 = 111;
pub const HIPBLAS_OP_T: i32 = 112;
pub const HIPBLAS_COMPUTE_32F: hipblasComputeType_t = 2;

pub const HIP_R_32F: hipDataType = 0;
pub const HIP_R_16F: hipDataType = 2;
pub const HIP_R_16BF: hipDataType = 14;
/// OCP FP8 (gfx950, gfx12); HIP 6.3+.
pub const HIP_R_8F_E4M3: hipDataType = 28;
pub const HIP_R_8F_E5M2: hipDataType = 29;
/// FNUZ FP8 (gfx942); HIP 6.0+.
pub const HIP_R_8F_E4M3_FNUZ: hipDataType = 1000;
pub const HIP_R_8F_E5M2_FNUZ: hipDataType = 1001;

// hipblasLtMatmulDescAttributes_t
pub const HIPBLASLT_MATMUL_DESC_TRANSA: u32 = 0;
pub const HIPBLASLT_MATMUL_DESC_TRANSB: u32 = 1;
/// uint32 `hipblasLtEpilogue_t`.
pub const HIPBLASLT_MATMUL_DESC_EPILOGUE: u32 = 2;
/// The bias (or, for the BGRAD epilogues, the bias gradient) as a device address by value.
pub const HIPBLASLT_MATMUL_DESC_BIAS_POINTER: u32 = 3;
/// int32 `hipDataType` of the bias: D's type or the scale type (f32).
pub const HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: u32 = 4;
pub const HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER: u32 = 5;
pub const HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER: u32 = 6;
/// The epilogue's auxiliary matrix (the GELU pre-activation) as a device address by value.
pub const HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: u32 = 10;
/// int64 leading dimension of the auxiliary matrix (its type is D's).
pub const HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: u32 = 11;
// hipblasLtEpilogue_t (the values are cuBLASLt's)
pub const HIPBLASLT_EPILOGUE_DEFAULT: u32 = 1;
/// `D = alpha·op(A)op(B) + beta·C + bias` (the bias has one value per row of D).
pub const HIPBLASLT_EPILOGUE_BIAS: u32 = 4;
/// As BIAS, the sum written to the auxiliary matrix, and `D = gelu(sum)` (tanh approximation).
pub const HIPBLASLT_EPILOGUE_GELU_AUX_BIAS: u32 = 164;
/// `D = (alpha·op(A)op(B) + beta·C) ⊙ gelu'(aux)`, the auxiliary matrix read.
pub const HIPBLASLT_EPILOGUE_DGELU: u32 = 192;
/// The product as DEFAULT, and the bias pointer written with op(B)'s column sums (over k).
pub const HIPBLASLT_EPILOGUE_BGRADB: u32 = 512;
/// `hipblasLtMatmulMatrixScale_t` (7.x): one f32 scalar per matrix, the only mode 6.x has.
pub const HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: u32 = 0;
// hipblasLtMatrixLayoutAttribute_t
pub const HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT: u32 = 0;
pub const HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: u32 = 1;
// hipblasLtMatmulPreferenceAttributes_t
pub const HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: u32 = 1;

/// `hipblasLtMatmulAlgo_t` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct hipblasLtMatmulAlgo_t {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t` (56 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct hipblasLtMatmulHeuristicResult_t {
    pub algo: hipblasLtMatmulAlgo_t,
    pub workspace_size: usize,
    pub state: hipblasStatus_t,
    pub waves_count: f32,
    pub reserved: [i32; 4],
}

/// `hipblasStatus_t hipblasLtGetVersion(hipblasLtHandle_t, int*)`: resolved optionally (only
/// `duet info` uses it), outside the required table.
pub type GetVersionFn = unsafe extern "C" fn(hipblasLtHandle_t, *mut i32) -> hipblasStatus_t;

dyn_api! {
    /// The hipBLASLt functions the backend calls.
    pub struct HipblasLtLib {
        pub fn hipblasLtCreate(handle: *mut hipblasLtHandle_t) -> hipblasStatus_t;
        pub fn hipblasLtDestroy(handle: hipblasLtHandle_t) -> hipblasStatus_t;
        pub fn hipblasLtMatrixLayoutCreate(
            layout: *mut hipblasLtMatrixLayout_t,
            ty: hipDataType,
            rows: u64,
            cols: u64,
            ld: i64,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatrixLayoutDestroy(layout: hipblasLtMatrixLayout_t) -> hipblasStatus_t;
        pub fn hipblasLtMatrixLayoutSetAttribute(
            layout: hipblasLtMatrixLayout_t,
            attr: u32,
            buf: *const c_void,
            size: usize,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescCreate(
            desc: *mut hipblasLtMatmulDesc_t,
            compute: hipblasComputeType_t,
            scale_type: hipDataType,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescDestroy(desc: hipblasLtMatmulDesc_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulDescSetAttribute(
            desc: hipblasLtMatmulDesc_t,
            attr: u32,
            buf: *const c_void,
            size: usize,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceCreate(pref: *mut hipblasLtMatmulPreference_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceDestroy(pref: hipblasLtMatmulPreference_t) -> hipblasStatus_t;
        pub fn hipblasLtMatmulPreferenceSetAttribute(
            pref: hipblasLtMatmulPreference_t,
            attr: u32,
            buf: *const c_void,
            size: usize,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatmulAlgoGetHeuristic(
            handle: hipblasLtHandle_t,
            desc: hipblasLtMatmulDesc_t,
            a: hipblasLtMatrixLayout_t,
            b: hipblasLtMatrixLayout_t,
            c: hipblasLtMatrixLayout_t,
            d: hipblasLtMatrixLayout_t,
            pref: hipblasLtMatmulPreference_t,
            requested: i32,
            results: *mut hipblasLtMatmulHeuristicResult_t,
            returned: *mut i32,
        ) -> hipblasStatus_t;
        pub fn hipblasLtMatmul(
            handle: hipblasLtHandle_t,
            desc: hipblasLtMatmulDesc_t,
            alpha: *const c_void,
            a: *const c_void,
            a_layout: hipblasLtMatrixLayout_t,
            b: *const c_void,
            b_layout: hipblasLtMatrixLayout_t,
            beta: *const c_void,
            c: *const c_void,
            c_layout: hipblasLtMatrixLayout_t,
            d: *mut c_void,
            d_layout: hipblasLtMatrixLayout_t,
            algo: *const hipblasLtMatmulAlgo_t,
            workspace: *mut c_void,
            workspace_size: usize,
            stream: hipStream_t,
        ) -> hipblasStatus_t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_header() {
        assert_eq!(std::mem::size_of::<hipblasLtMatmulAlgo_t>(), 24);
        assert_eq!(std::mem::size_of::<hipblasLtMatmulHeuristicResult_t>(), 56);
    }
}
