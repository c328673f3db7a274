//! hipBLASLt (`libhipblaslt`, ROCm 6: .so.0, ROCm 7: .so.1), used for FP8 GEMMs and the 16-bit
//! GEMM epilogues: `sys` (HAND-WRITTEN, no Debian headers), `result` (status → `Result`), `safe`
//! (RAII descriptors).
pub mod result;
pub mod safe;
pub mod sys;
