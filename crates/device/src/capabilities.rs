//! What a backend runs natively, reported once when the device opens.

use crate::DType;

/// The paths a device has of its own, read once ([`crate::Device::capabilities`]) instead of
/// probed op by op.
///
/// Every op of [`crate::Fused`] runs on every backend: its default body composes the core ops
/// of [`crate::Device`]. A capability says the backend has its own (fused, faster) path for it,
/// which callers may plan around — the engine sizes its memory plan for flash attention or the
/// composed attention, and records a step as a graph only where the device can replay one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Activation dtypes (A, B and C) of the native [`crate::Fused::gemm_epilogue`].
    pub gemm_epilogue: Vec<DType>,
    /// C dtypes of the native [`crate::Fused::gemm_fp8_epilogue`].
    pub fp8_gemm_epilogue: Vec<DType>,
    /// (activation dtype, head size) pairs of the native flash attention
    /// ([`crate::Fused::flash_attention_forward`] and `_backward`).
    pub flash_attention: Vec<(DType, usize)>,
    /// Steps can be recorded and replayed ([`crate::Device::capture_begin`]).
    pub graphs: bool,
    /// GEMMs can time their algorithms and keep the fastest ([`crate::Device::set_gemm_autotune`]).
    pub gemm_autotune: bool,
    /// The element distance at which FP8 GEMMs best read their inverse scales: the engine
    /// keeps operand `i`'s inverse scale at `scale_inv[i · stride]` (the `inv_stride` of
    /// [`crate::Fused::fp8_scaling_update`]). 1 (packed) unless the backend says otherwise; CUDA
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

    /// Whether [`crate::Fused::gemm_epilogue`] is native for operands of `dtype`.
    pub fn gemm_epilogue(&self, dtype: DType) -> bool {
        self.gemm_epilogue.contains(&dtype)
    }

    /// Whether [`crate::Fused::gemm_fp8_epilogue`] is native for C of `dtype`.
    pub fn fp8_gemm_epilogue(&self, dtype: DType) -> bool {
        self.fp8_gemm_epilogue.contains(&dtype)
    }

    /// Whether flash attention is native for activations of `dtype` and head size `hs`.
    pub fn flash_attention(&self, dtype: DType, hs: usize) -> bool {
        self.flash_attention.contains(&(dtype, hs))
    }

    /// One line for `duet info`: the native paths, or "none (composed from the core ops)".
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let names = |v: &[DType]| v.iter().map(|d| d.name()).collect::<Vec<_>>().join("/");
        if !self.gemm_epilogue.is_empty() {
            parts.push(format!("GEMM epilogues ({})", names(&self.gemm_epilogue)));
        }
        if !self.fp8_gemm_epilogue.is_empty() {
            parts.push(format!(
                "FP8 GEMM epilogues ({})",
                names(&self.fp8_gemm_epilogue)
            ));
        }
        if !self.flash_attention.is_empty() {
            let mut hs: Vec<usize> = self.flash_attention.iter().map(|p| p.1).collect();
            hs.sort_unstable();
            hs.dedup();
            let mut dts: Vec<DType> = Vec::new();
            for (d, _) in &self.flash_attention {
                if !dts.contains(d) {
                    dts.push(*d);
                }
            }
            let hs: Vec<String> = hs.iter().map(|h| h.to_string()).collect();
            parts.push(format!(
                "flash attention ({}, head sizes {})",
                names(&dts),
                hs.join("/")
            ));
        }
        if self.graphs {
            parts.push("graphs".into());
        }
        if self.gemm_autotune {
            parts.push("GEMM autotuning".into());
        }
        if parts.is_empty() {
            "none (every fused op composed from the core ops)".into()
        } else {
            parts.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_summary() {
        let c = Capabilities::composed();
        assert!(!c.gemm_epilogue(DType::BF16));
        assert_eq!(c.fp8_scale_inv_stride, 1);
        assert!(c.summary().starts_with("none"));
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
        assert_eq!(
            g.summary(),
            "GEMM epilogues (bf16/f16), FP8 GEMM epilogues (bf16), flash attention (bf16/f16, \
             head sizes 64/128), graphs, GEMM autotuning"
        );
    }
}
