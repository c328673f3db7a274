//! What the CUDA and HIP backends share beside the device contract: the launch limits and kernel
//! names of their kernels ([`launch`]), how the fast LayerNorm kernels split a row
//! ([`layernorm_plan`], which fixes the summation order so both compute the same bits), and the
//! rules of a native fused GEMM epilogue ([`lt_epilogue`]), and the math both vendors' kernels
//! share, pasted into each backend's header ([`shared_math`]). Nothing here touches a GPU.
#![forbid(unsafe_code)]

pub mod launch;
pub mod layernorm_plan;
pub mod lt_epilogue;
pub mod shared_math;

pub use launch::{
    cross_entropy_threads, float_code, float_suffix, kernel_grid_dim, kernel_int, kernel_too_large,
    wide_suffix,
};
pub use lt_epilogue::validate_lt_epilogue;
