//! GEMMs with fused epilogues through cuBLASLt (bias, bias + GELU with the pre-activation kept,
//! GELU backward): see [`duet_device::Device::gemm_epilogue`].

use super::{CudaDevice, lock};
use crate::blaslt::{BlasLt, LtEpilogue, float_type};
use crate::memory::CudaBuffer;
use duet_device::{Buffer, DType, Device, DeviceError, Epilogue, GemmDesc, Result};

const OP: &str = "gemm_epilogue";

impl CudaDevice {
    pub(super) fn epilogue_supported(&self, dtype: DType) -> bool {
        self.cc >= 80 && matches!(dtype, DType::BF16 | DType::F16)
    }

    pub(super) fn gemm_epilogue_impl(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        epilogue: Epilogue<'_, CudaBuffer>,
    ) -> Result<()> {
        let dt = c.dtype();
        if !self.epilogue_supported(dt) {
            return Err(DeviceError::Unsupported {
                op: format!("{OP} on sm_{}", self.cc),
                dtype: dt,
            });
        }
        duet_device::check_dtype(OP, a, dt)?;
        duet_device::check_dtype(OP, b, dt)?;
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch != 1 {
            return Err(DeviceError::InvalidArgument(format!(
                "{OP}: batched GEMMs have no epilogue (batch {})",
                desc.batch
            )));
        }
        let fused_only = |what: &str| -> Result<()> {
            if desc.alpha != 1.0 || desc.beta != 0.0 {
                return Err(DeviceError::InvalidArgument(format!(
                    "{OP}: the {what} epilogue needs alpha 1 and beta 0"
                )));
            }
            Ok(())
        };
        // The pre-activation shares C's layout; cuBLASLt wants its leading dimension a
        // multiple of 8 and its address 16-byte aligned.
        let aux = |pre: &CudaBuffer| -> Result<(u64, i64)> {
            duet_device::check_dtype(OP, pre, dt)?;
            duet_device::check_len(OP, "pre", pre, c.len())?;
            if !(desc.ldc.is_multiple_of(8) && desc.c_offset.is_multiple_of(8)) {
                return Err(DeviceError::InvalidArgument(format!(
                    "{OP}: ldc {} and the C offset {} must be multiples of 8 for a GELU epilogue",
                    desc.ldc, desc.c_offset
                )));
            }
            Ok((pre.ptr_at(desc.c_offset), desc.ldc as i64))
        };
        let check_bias = |bias: &CudaBuffer| -> Result<()> {
            duet_device::check_len(OP, "bias", bias, desc.n)?;
            if bias.dtype() != DType::F32 && bias.dtype() != dt {
                return Err(DeviceError::DTypeMismatch {
                    op: OP,
                    expected: dt,
                    got: bias.dtype(),
                });
            }
            Ok(())
        };
        let (lt_epi, bias) = match &epilogue {
            Epilogue::Bias(bias) => {
                check_bias(bias)?;
                (
                    LtEpilogue::Bias {
                        bias: bias.ptr(),
                        dtype: bias.dtype(),
                    },
                    Some(*bias),
                )
            }
            Epilogue::BiasGelu { bias, pre } => {
                fused_only("bias + GELU")?;
                check_bias(bias)?;
                let (aux, ld) = aux(pre)?;
                (
                    LtEpilogue::GeluAuxBias {
                        bias: bias.ptr(),
                        dtype: bias.dtype(),
                        aux,
                        ld,
                    },
                    Some(*bias),
                )
            }
            Epilogue::DGelu { pre } => {
                fused_only("GELU backward")?;
                let (aux, ld) = aux(pre)?;
                (LtEpilogue::DGelu { aux, ld }, None)
            }
        };
        let ty = float_type(dt).expect("bf16/f16");
        self.bind()?;
        let first = {
            let mut lt = lock(&self.blas_lt, OP)?;
            if lt.is_none() {
                *lt = Some(BlasLt::new(&self.ctx, &self.stream, self.cc, &self.mem)?);
            }
            lt.as_mut().expect("created above").matmul(
                &self.stream,
                desc,
                a,
                b,
                c,
                (ty, ty),
                None,
                lt_epi,
            )
        };
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
                    LtEpilogue::GeluAuxBias { aux, ld, .. } => LtEpilogue::GeluAuxBias {
                        bias: low.ptr(),
                        dtype: dt,
                        aux,
                        ld,
                    },
                    other => other,
                };
                let mut lt = lock(&self.blas_lt, OP)?;
                lt.as_mut().expect("created above").matmul(
                    &self.stream,
                    desc,
                    a,
                    b,
                    c,
                    (ty, ty),
                    None,
                    lt_epi,
                )
            }
            (Err(e), _) => Err(e),
        }
    }
}
