//! The compositions of the ops that other ops can express: each family's default bodies (they
//! live in [`crate::ops`], beside their trait), gathered here for a backend whose native kernel
//! does not cover some inputs and calls the composition for those, so every op works on every
//! backend with every input the contract allows.

pub use crate::ops::attention::{flash_attention_backward, flash_attention_forward};
pub use crate::ops::fp8::{
    adamw_clipped_fp8, fp8_scaling_update, gemm_fp8_epilogue, layernorm_forward_fp8,
    quantize_fp8_gelu, quantize_fp8_grad, quantize_fp8_many,
};
pub use crate::ops::gemm::gemm_epilogue;
pub use crate::ops::loss::cross_entropy_in_place;
pub use crate::ops::norm::layernorm_backward_colsum;
pub use crate::ops::optim::{adamw_clipped, sum_squares_many};
pub use crate::runtime::zero_many;
