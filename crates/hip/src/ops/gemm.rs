//! GEMMs through rocBLAS (and FP8 GEMMs through hipBLASLt, see fp8.rs), and GEMMs with fused
//! epilogues through hipBLASLt (bias, bias + residual, bias + GELU with the pre-activation
//! kept, GELU backward, the bias gradient): see [`duet_device::GemmOps::gemm_epilogue`]. As on
//! CUDA, plain 16-bit GEMMs stay on the vendor BLAS (rocBLAS here, cuBLAS there); CUDA moves
//! them to cuBLASLt only to autotune them, which HIP does not offer.

use super::prelude::*;
use crate::blas;
use crate::blaslt::{self, LtEpilogue, Outcome};
use duet_device::{Epilogue, GemmDesc, composed};

const OP: &str = "gemm_epilogue";

impl GemmOps for HipDevice {
    fn gemm(&self, args: Checked<Gemm<'_, Self::Buffer>>) -> Result<()> {
        let Gemm { desc, a, b, c } = args.into_inner();
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        if a.dtype().is_fp8() {
            blas::fp8_check(&self.arch_base, a.dtype(), c.dtype())?;
            return self.with_lt("gemm (fp8)", a.dtype(), |lt| {
                blas::gemm_fp8(lt, &self.arch_base, self.stream.raw(), desc, a, b, c, None)
            });
        }
        let h = self
            .blas
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("rocBLAS lock poisoned".into()))?;
        blas::gemm(&h, desc, a, b, c)
    }

    /// [`duet_device::GemmOps::gemm_epilogue`] on hipBLASLt, with CUDA's semantics and checks
    /// ([`duet_gpu::validate_lt_epilogue`], shared with crates/cuda ops/gemm.rs). Where hipBLASLt cannot run it (its handle could not be
    /// created, or it has no algorithm for the shape and epilogue, remembered per plan key) the
    /// composition of the core ops runs instead, which computes the same result; so it does for
    /// a dtype the capabilities list no epilogue for (`HipDevice::epilogue_dtypes`).
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
        if !matches!(dt, DType::BF16 | DType::F16) {
            return Err(DeviceError::Unsupported {
                op: format!("{OP} on hipBLASLt"),
                dtype: dt,
            });
        }
        duet_gpu::validate_lt_epilogue(OP, desc, a, b, c, &epilogue)?;
        // The pre-activation shares C's layout (its leading dimension and offset multiples of
        // 8, as on CUDA: checked above).
        let aux = |pre: &HipBuffer| (pre.ptr_at(desc.c_offset), desc.ldc as i64);
        let lt_epi = match &epilogue {
            Epilogue::BiasResidual { bias, residual } => LtEpilogue::BiasResidual {
                bias: bias.ptr(),
                dtype: bias.dtype(),
                residual: residual.ptr_at(desc.c_offset),
            },
            Epilogue::Bias(bias) => LtEpilogue::Bias {
                bias: bias.ptr(),
                dtype: bias.dtype(),
            },
            Epilogue::BiasGelu { bias, pre } => {
                let (aux, ld) = aux(pre);
                LtEpilogue::GeluAuxBias {
                    bias: bias.ptr(),
                    dtype: bias.dtype(),
                    aux,
                    ld,
                }
            }
            Epilogue::DGelu { pre } => {
                let (aux, ld) = aux(pre);
                LtEpilogue::DGelu { aux, ld }
            }
            Epilogue::BiasGradA { dbias } => LtEpilogue::BGradB {
                bias: dbias.ptr(),
                dtype: DType::F32,
            },
        };
        match self.lt_matmul(desc, a, b, c, lt_epi)? {
            Outcome::Ran => Ok(()),
            Outcome::NoAlgorithm => composed::gemm_epilogue(
                self,
                GemmEpilogue {
                    desc,
                    a,
                    b,
                    c,
                    epilogue,
                }
                .check()?,
            ),
        }
    }
}

impl HipDevice {
    /// The dtypes whose GEMM epilogues run on hipBLASLt: bf16 and f16 when the library was
    /// found at open and `DUET_HIP_UNFUSED` is not set (the capabilities list them).
    pub(crate) fn epilogue_dtypes(lt_found: bool, unfused: bool) -> Vec<DType> {
        if lt_found && !unfused {
            vec![DType::BF16, DType::F16]
        } else {
            Vec::new()
        }
    }

    /// One 16-bit hipBLASLt matmul with `epi`; [`Outcome::NoAlgorithm`] also when hipBLASLt is
    /// unavailable (its handle not created: the cause is in `duet info`).
    fn lt_matmul(
        &self,
        desc: &GemmDesc,
        a: &HipBuffer,
        b: &HipBuffer,
        c: &mut HipBuffer,
        epi: LtEpilogue,
    ) -> Result<Outcome> {
        let mut reached = false;
        let r = self.with_lt(OP, a.dtype(), |lt| {
            reached = true;
            blaslt::matmul(lt, self.stream.raw(), desc, a, b, c, epi)
        });
        match r {
            Err(DeviceError::Unsupported { .. }) if !reached => Ok(Outcome::NoAlgorithm),
            other => other,
        }
    }
}
