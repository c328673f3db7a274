//! [`GemmOps`] for [`CudaDevice`]: GEMMs (cuBLAS, or cuBLASLt when autotuned) and their epilogues.
//!
//! GEMMs with fused epilogues through cuBLASLt (bias, bias + GELU with the pre-activation kept,
//! GELU backward): see [`duet_device::GemmOps::gemm_epilogue`]; and the FP8 GEMMs' bias and
//! bias + GELU epilogues ([`duet_device::Fp8Ops::gemm_fp8_epilogue`]).

use super::prelude::*;
use crate::blaslt::{self, LtEpilogue, float_type};
use duet_device::{Epilogue, GemmDesc, composed};

const OP: &str = "gemm_epilogue";

/// Bits of `CudaDevice::lt_refused`: epilogues this cuBLASLt refused once.
const REFUSED_BGRAD: u8 = 1;
pub(crate) const REFUSED_FP8_BIAS: u8 = 2;
pub(crate) const REFUSED_FP8_GELU: u8 = 4;
const REFUSED_BGRAD_F32_OUT: u8 = 8;

impl CudaDevice {
    pub(crate) fn epilogue_supported(&self, dtype: DType) -> bool {
        self.cc >= 80 && matches!(dtype, DType::BF16 | DType::F16)
    }

    /// One 16-bit cuBLASLt matmul (A and B of A's dtype, no scales) with `epi`.
    pub(crate) fn lt_matmul(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        epi: LtEpilogue,
    ) -> Result<()> {
        let ty = float_type(a.dtype()).expect("bf16/f16");
        self.with_lt(OP, |lt| {
            lt.matmul(&self.stream, desc, a, b, c, (ty, ty), None, epi)
        })
    }

    /// The weight-gradient GEMM with cuBLASLt's BGRADB epilogue writing the f32 bias gradient;
    /// where this cuBLASLt refuses it (remembered after the first refusal), the plain GEMM and a
    /// column sum. (CUDA 13.0's cuBLASLt refuses an f32 bias gradient beside a 16-bit weight
    /// gradient. It accepts a 16-bit one, but ran that as a separate kernel slower than the
    /// column sum, and it would round the bias gradient to 16 bits: not taken. H100 profile,
    /// results/2026-12-07-h100-gpt2-side-by-side.)
    fn gemm_bias_grad(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        dbias: &mut CudaBuffer,
    ) -> Result<()> {
        let epi = LtEpilogue::BGradB {
            bias: dbias.ptr(),
            dtype: DType::F32,
        };
        // (Refusals are remembered per C dtype: an f32 bias gradient may be refused for a
        // 16-bit weight gradient and not for an f32 one.)
        let (bit, what) = if c.dtype() == DType::F32 {
            (
                REFUSED_BGRAD_F32_OUT,
                "the bias-gradient epilogue (BGRADB) with an f32 bias gradient and weight gradient",
            )
        } else {
            (
                REFUSED_BGRAD,
                "the bias-gradient epilogue (BGRADB) with an f32 bias gradient and a 16-bit weight gradient",
            )
        };
        if self.lt_unless_refused(bit, what, || self.lt_matmul(desc, a, b, c, epi)) {
            return Ok(());
        }
        self.exec(Gemm { desc, a, b, c })?;
        self.fill(dbias, 0.0)?;
        // A is stored k × m: the bias gradient is its column sum.
        self.exec(BiasBackward {
            dout: a,
            dbias,
            rows: desc.k,
            c: desc.m,
        })
    }

    /// Runs `matmul` (a cuBLASLt epilogue) unless cuBLASLt refused `bit` before; an error is
    /// remembered as a refusal, so the caller's separate ops run from then on (the same
    /// results, slower), and said once on stderr with the library's error, so that a profile
    /// showing the separate ops can be explained. Whether it ran.
    pub(crate) fn lt_unless_refused(
        &self,
        bit: u8,
        what: &str,
        matmul: impl FnOnce() -> Result<()>,
    ) -> bool {
        use std::sync::atomic::Ordering;
        if self.lt_refused.load(Ordering::Relaxed) & bit != 0 {
            return false;
        }
        match matmul() {
            Ok(()) => true,
            Err(e) => {
                if self.lt_refused.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                    eprintln!(
                        "duet-cuda: cuBLASLt refused {what}: {e}; the separate ops run from now on (the same results)"
                    );
                }
                false
            }
        }
    }
}

impl GemmOps for CudaDevice {
    fn gemm(&self, args: Checked<Gemm<'_, Self::Buffer>>) -> Result<()> {
        let Gemm { desc, a, b, c } = args.into_inner();
        // Autotuned 16-bit GEMMs go through cuBLASLt, where the algorithm can be chosen.
        let lt_ok = matches!(a.dtype(), DType::BF16 | DType::F16)
            && b.dtype() == a.dtype()
            && c.dtype() == a.dtype()
            && desc.batch == 1;
        if lt_ok && self.gemm_autotune() && self.fused_ops() {
            return self.lt_matmul(desc, a, b, c, blaslt::LtEpilogue::None);
        }
        self.blas.gemm(desc, a, b, c)
    }

    fn set_gemm_autotune(&self, on: bool) -> bool {
        self.autotune
            .store(on, std::sync::atomic::Ordering::Relaxed);
        true
    }

    fn gemm_epilogue(&self, args: Checked<GemmEpilogue<'_, Self::Buffer>>) -> Result<()> {
        if !self.capabilities().gemm_epilogue(args.a.dtype()) {
            return composed::gemm_epilogue(self, args);
        }
        let GemmEpilogue {
            desc,
            a,
            b,
            c,
            epilogue,
        } = args.into_inner();
        // A and B share the 16-bit dtype; C is that dtype, or f32 for the epilogues that
        // allow it (bias, bias gradient).
        let dt = a.dtype();
        if !self.epilogue_supported(dt) {
            return Err(DeviceError::Unsupported {
                op: format!("{OP} on sm_{}", self.cc),
                dtype: dt,
            });
        }
        duet_gpu::validate_lt_epilogue(OP, desc, a, b, c, &epilogue)?;
        // The pre-activation shares C's layout (cuBLASLt wants its leading dimension a
        // multiple of 8 and its address 16-byte aligned: checked above).
        let aux = |pre: &CudaBuffer| (pre.ptr_at(desc.c_offset), desc.ldc as i64);
        let (lt_epi, bias) = match epilogue {
            Epilogue::BiasResidual { bias, residual } => (
                LtEpilogue::BiasResidual {
                    bias: bias.ptr(),
                    dtype: bias.dtype(),
                    residual: residual.ptr_at(desc.c_offset),
                },
                Some(bias),
            ),
            Epilogue::Bias(bias) => (
                LtEpilogue::Bias {
                    bias: bias.ptr(),
                    dtype: bias.dtype(),
                },
                Some(bias),
            ),
            Epilogue::BiasGelu { bias, pre } => {
                let (aux, ld) = aux(&*pre);
                (
                    LtEpilogue::GeluAuxBias {
                        bias: bias.ptr(),
                        dtype: bias.dtype(),
                        aux,
                        ld,
                    },
                    Some(bias),
                )
            }
            Epilogue::DGelu { pre } => {
                let (aux, ld) = aux(pre);
                (LtEpilogue::DGelu { aux, ld }, None)
            }
            Epilogue::BiasGradA { dbias } => return self.gemm_bias_grad(desc, a, b, c, dbias),
        };
        let first = self.lt_matmul(desc, a, b, c, lt_epi);
        match (first, bias) {
            (Ok(()), _) => Ok(()),
            // cuBLASLt versions without f32 bias for 16-bit outputs: the bias goes in C's dtype.
            (Err(_), Some(bias)) if bias.dtype() == DType::F32 => {
                let mut low = self.alloc(dt, desc.n)?;
                self.cast(bias, &mut low, 1.0)?;
                let lt_epi = match lt_epi {
                    LtEpilogue::Bias { .. } => LtEpilogue::Bias {
                        bias: low.ptr(),
                        dtype: dt,
                    },
                    LtEpilogue::BiasResidual { residual, .. } => LtEpilogue::BiasResidual {
                        bias: low.ptr(),
                        dtype: dt,
                        residual,
                    },
                    LtEpilogue::GeluAuxBias { aux, ld, .. } => LtEpilogue::GeluAuxBias {
                        bias: low.ptr(),
                        dtype: dt,
                        aux,
                        ld,
                    },
                    other => other,
                };
                self.lt_matmul(desc, a, b, c, lt_epi)
            }
            (Err(e), _) => Err(e),
        }
    }
}
