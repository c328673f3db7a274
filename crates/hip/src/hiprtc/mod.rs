//! hiprtc (`libhiprtc`, ROCm 6/7): `sys` (bindgen), `result` (status → `Result`), `safe` (RAII).
pub mod result;
pub mod safe;
pub mod sys;
