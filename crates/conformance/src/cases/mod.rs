//! The suite's cases, one module per op family (the backends' `ops/` module names).
//!
//! Every case is `pub fn <case><D: Device>(h: &Harness<D>)`. A case runs the op on `h.dev`
//! through a generic helper and hands the same helper the CPU backend as the oracle
//! ([`Harness::verify`]); fused paths are compared with their composition ([`Harness::same`]).

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod errors;
pub mod fp8;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod norm;
pub mod optim;

pub use attention::*;
pub use elementwise::*;
pub use embedding::*;
pub use errors::*;
pub use fp8::*;
pub use gemm::*;
pub use loss::*;
pub use memory::*;
pub use norm::*;
pub use optim::*;

#[allow(unused_imports)]
pub(crate) use crate::harness::{
    FLOATS, FLOATS_AND_FP8, FP8S, HALVES, Harness, Rng, Tensor, Tol, Want, compare, encode, get,
    nan, put, put_i32, rounded, rounded64, skip, want,
};

/// Every case, by name (checked against the instantiation macro's list by each suite).
pub const ALL: &[&str] = &[
    "upload_download_copy_fill",
    "zero_many_matches_composition",
    "graph_replay_matches_unrecorded",
    "gemm_transposes_dtypes_strides",
    "gemm_errors",
    "gemm_epilogue_matches_composition",
    "cast_every_pair_bit_exact",
    "scale_add_add_assign",
    "gelu_forward_backward",
    "bias_add_and_backward",
    "embedding_forward_backward",
    "embedding_bad_token_is_an_error",
    "embedding_backward_bits_follow_position_order",
    "embedding_backward_bad_tokens_contribute_nothing",
    "layernorm_forward_backward",
    "layernorm_backward_colsum_matches_composition",
    "layernorm_every_row_path_accumulates",
    "layernorm_backward_colsum_every_path_and_dsum_dtype",
    "layernorm_rejects_bad_shapes",
    "head_permutations_exact",
    "softmax_causal_forward_backward",
    "flash_attention_matches_composition",
    "flash_attention_matches_f64_reference",
    "flash_attention_is_deterministic",
    "flash_attention_refuses_what_it_does_not_support",
    "cross_entropy_losses_and_gradients",
    "cross_entropy_padded_rows_ignore_the_padding",
    "cross_entropy_in_place_matches_padded",
    "unsupported_dtypes_are_typed_errors",
    "adamw_all_grad_and_copy_dtypes",
    "sum_squares_matches_and_is_deterministic",
    "sum_squares_many_matches_composition",
    "adamw_clipped_matches_composition",
    "adamw_clipped_fp8_matches_composition",
    "reductions_from_many_threads_are_exact",
    "quantize_fp8_codes_amax_transpose",
    "quantize_fp8_many_matches_composition",
    "quantize_fp8_grad_matches_composition",
    "quantize_fp8_gelu_matches_composition",
    "layernorm_forward_fp8_matches_composition",
    "gemm_fp8_matches_reference",
    "gemm_fp8_epilogue_matches_composition",
    "fp8_scaling_update_matches_host",
];
