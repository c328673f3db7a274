//! duet's conformance suite: one set of test bodies, generic over `D: Device`, that every
//! backend runs.
//!
//! - **Oracles.** A GPU backend is compared with the CPU backend on the same inputs; the CPU
//!   backend itself is compared with the plain f64 loops of [`mod@reference`], so the suite can fail
//!   in CI, where only the CPU runs. Fused paths are also compared with their plain composition
//!   on the device under test.
//! - **Inputs** come from one seeded RNG ([`harness::Rng`]): the seed is printed once per run
//!   (`conformance: DUET_TEST_SEED=…`) and every failure repeats it; set `DUET_TEST_SEED` to
//!   replay. Each case draws from its own stream, derived from its name.
//! - **Outputs** an op writes are prefilled with NaN ([`harness::nan`]), so an element never
//!   written cannot pass.
//! - **Tolerances**: one type, [`Tol`]: `Bits` for permutations, casts, fills and FP8 codes;
//!   `Rel` per storage dtype otherwise.
//! - **Skips**: a backend that cannot open (no GPU, no driver) prints
//!   `SKIP <test>: <reason>` for every case instead of passing silently; so does a case whose
//!   path the backend does not have (its [`duet_device::Device`] capabilities say so).
//!
//! Instantiate it in a backend's `tests/conformance.rs`:
//!
//! ```ignore
//! duet_conformance::conformance_suite!(duet_cpu::CpuDevice, || {
//!     duet_cpu::CpuDevice::new(None).map_err(|e| e.to_string())
//! });
//! ```
#![forbid(unsafe_code)]

pub mod cases;
pub mod harness;
pub mod reference;
pub mod threads;

pub use harness::{Harness, Tensor, Tol, Want};

/// Expands to one `#[test]` per case of the suite for the backend type `$dev`, opened once
/// (shared by the cases) by `$open: fn() -> Result<$dev, String>`.
#[macro_export]
macro_rules! conformance_suite {
    ($dev:ty, $open:expr) => {
        fn __conformance_harness(test: &str) -> Option<&'static $crate::Harness<$dev>> {
            static H: std::sync::OnceLock<Result<$crate::Harness<$dev>, String>> =
                std::sync::OnceLock::new();
            let open: fn() -> Result<$dev, String> = $open;
            match H.get_or_init(|| open().map(|d| $crate::Harness::new(d, open))) {
                Ok(h) => Some(h),
                Err(e) => {
                    $crate::harness::skip(test, &format!("backend not available: {e}"));
                    None
                }
            }
        }
        $crate::__conformance_cases!(
            upload_download_copy_fill,
            zero_many_matches_composition,
            graph_replay_matches_unrecorded,
            gemm_transposes_dtypes_strides,
            gemm_errors,
            gemm_epilogue_matches_composition,
            cast_every_pair_bit_exact,
            scale_add_add_assign,
            gelu_forward_backward,
            bias_add_and_backward,
            embedding_forward_backward,
            embedding_bad_token_is_an_error,
            embedding_backward_bits_follow_position_order,
            embedding_backward_bad_tokens_contribute_nothing,
            layernorm_forward_backward,
            layernorm_backward_colsum_matches_composition,
            layernorm_every_row_path_accumulates,
            layernorm_backward_colsum_every_path_and_dsum_dtype,
            layernorm_rejects_bad_shapes,
            head_permutations_exact,
            softmax_causal_forward_backward,
            flash_attention_matches_composition,
            flash_attention_matches_f64_reference,
            flash_attention_is_deterministic,
            flash_attention_refuses_what_it_does_not_support,
            cross_entropy_losses_and_gradients,
            cross_entropy_padded_rows_ignore_the_padding,
            cross_entropy_in_place_matches_padded,
            unsupported_dtypes_are_typed_errors,
            adamw_all_grad_and_copy_dtypes,
            sum_squares_matches_and_is_deterministic,
            sum_squares_many_matches_composition,
            adamw_clipped_matches_composition,
            adamw_clipped_fp8_matches_composition,
            reductions_from_many_threads_are_exact,
            quantize_fp8_codes_amax_transpose,
            quantize_fp8_many_matches_composition,
            quantize_fp8_grad_matches_composition,
            quantize_fp8_gelu_matches_composition,
            layernorm_forward_fp8_matches_composition,
            gemm_fp8_matches_reference,
            gemm_fp8_epilogue_matches_composition,
            fp8_scaling_update_matches_host,
        );
    };
}

/// One `#[test]` per listed case (internal to [`conformance_suite!`]); also a test that the
/// list names every case of [`cases::ALL`].
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                if let Some(h) = __conformance_harness(stringify!($case)) {
                    $crate::cases::$case(h);
                }
            }
        )*
        #[test]
        fn suite_instantiates_every_case() {
            let listed: &[&str] = &[$(stringify!($case)),*];
            let mut a = listed.to_vec();
            let mut b = $crate::cases::ALL.to_vec();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "conformance_suite! and cases::ALL list different cases");
        }
    };
}
