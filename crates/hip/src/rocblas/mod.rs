//! rocBLAS (`librocblas`, ROCm 6: .so.4, ROCm 7: .so.5): `sys` (HAND-WRITTEN, no Debian headers),
//! `result` (status → `Result`), `safe` (RAII handle). rocBLAS's `gemm_ex` ABI is unchanged from
//! ROCm 6 to 7, unlike hipBLAS's (which switched `hipblasGemmEx` to hipDataType in 7.0).
pub mod result;
pub mod safe;
pub mod sys;
