//! What a backend runs natively, reported once when the device opens.

use crate::DType;

/// The paths a device has of its own, read once ([`crate::Runtime::capabilities`]) instead of
/// probed op by op.
///
/// Every op of [`crate::Device`] runs on every backend: where other ops can express it, its
/// default body composes them (see [`crate::ops`]). A capability says the backend has its own (fused, faster) path for it,
/// which callers may plan around — the engine sizes its memory plan for flash attention or the
/// composed attention, and records a step as a graph only where the device can replay one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Activation dtypes (A, B and C) of the native [`crate::GemmOps::gemm_epilogue`].
    pub gemm_epilogue: Vec<DType>,
    /// C dtypes of the native [`crate::Fp8Ops::gemm_fp8_epilogue`].
    pub fp8_gemm_epilogue: Vec<DType>,
    /// (activation dtype, head size) pairs of the native flash attention
    /// ([`crate::AttentionOps::flash_attention_forward`] and `_backward`).
    pub flash_attention: Vec<(DType, usize)>,
    /// Steps can be recorded and replayed ([`crate::Runtime::capture_begin`]).
    pub graphs: bool,
    /// GEMMs can time their algorithms and keep the fastest ([`crate::GemmOps::set_gemm_autotune`]).
    pub gemm_autotune: bool,
    /// The element distance at which FP8 GEMMs best read their inverse scales: the engine
    /// keeps operand `i`'s inverse scale at `scale_inv[i · stride]` (the `inv_stride` of
    /// [`crate::Fp8Ops::fp8_scaling_update`]). 1 (packed) unless the backend says otherwise; CUDA
    /// answers 64 (256 bytes), the alignment at which cuBLASLt reads a scale in place instead
    /// of from a copy made before each GEMM.
    pub fp8_scale_inv_stride: usize,
}

impl Capabilities {
    /// No native path: every fused op composes the core ops (the CPU backend).
    pub fn composed() -> Self {
        Capabilities {
            fp8_scale_inv_stride: 1,
            ..Default::default()
        }
    }

    /// Whether [`crate::GemmOps::gemm_epilogue`] is native for operands of `dtype`.
    pub fn gemm_epilogue(&self, dtype: DType) -> bool {
        self.gemm_epilogue.contains(&dtype)
    }

    /// Whether [`crate::Fp8Ops::gemm_fp8_epilogue`] is native for C of `dtype`.
    pub fn fp8_gemm_epilogue(&self, dtype: DType) -> bool {
        self.fp8_gemm_epilogue.contains(&dtype)
    }

    /// Whether flash attention is native for activations of `dtype` and head size `hs`.
    pub fn flash_attention(&self, dtype: DType, hs: usize) -> bool {
        self.flash_attention.contains(&(dtype, hs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let c = Capabilities::composed();
        assert!(!c.gemm_epilogue(DType::BF16));
        assert_eq!(c.fp8_scale_inv_stride, 1);
        let g = Capabilities {
            gemm_epilogue: vec![DType::BF16, DType::F16],
            fp8_gemm_epilogue: vec![DType::BF16],
            flash_attention: vec![(DType::BF16, 64), (DType::BF16, 128), (DType::F16, 64)],
            graphs: true,
            gemm_autotune: true,
            fp8_scale_inv_stride: 64,
        };
        assert!(g.gemm_epilogue(DType::F16) && !g.gemm_epilogue(DType::F32));
        assert!(g.flash_attention(DType::F16, 64) && !g.flash_attention(DType::F16, 128));
    }
}
