//! The HIP runtime (`libamdhip64`): `sys` (bindgen), `result` (status → `Result`), `safe` (RAII).
pub mod result;
pub mod safe;
pub mod sys;
