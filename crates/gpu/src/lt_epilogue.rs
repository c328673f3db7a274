//! The rules of a native (cuBLASLt / hipBLASLt) fused GEMM epilogue, checked the same way by both
//! GPU backends before they map an [`Epilogue`] onto their library.

use duet_device::{Buffer, DType, DeviceError, Epilogue, GemmDesc, Result, check_dtype, check_len};

/// The rules of a native (cuBLASLt / hipBLASLt) [`duet_device::GemmOps::gemm_epilogue`] for A of the 16-bit
/// dtype `a.dtype()`, checked the same way by both backends before they map the epilogue onto
/// their library: B in A's dtype; C in A's dtype, or f32 for Bias and BiasGradA; the shape
/// ([`GemmDesc::validate`]); batch 1; alpha 1 and beta 0 for bias + residual, bias + GELU and
/// GELU backward; a bias of `n` values in f32 or A's dtype; the residual in C's dtype and
/// length; the pre-activation in A's dtype and C's length, with `ldc` and C's offset multiples of
/// 8 (16-byte aligned rows); the bias gradient `m` f32 values with `trans_a`.
pub fn validate_lt_epilogue<B: Buffer>(
    op: &'static str,
    desc: &GemmDesc,
    a: &B,
    b: &B,
    c: &B,
    epilogue: &Epilogue<'_, B>,
) -> Result<()> {
    let dt = a.dtype();
    check_dtype(op, b, dt)?;
    let f32_out_ok = matches!(epilogue, Epilogue::Bias(_) | Epilogue::BiasGradA { .. });
    if c.dtype() != dt && !(f32_out_ok && c.dtype() == DType::F32) {
        return Err(DeviceError::DTypeMismatch {
            op,
            expected: dt,
            got: c.dtype(),
        });
    }
    desc.validate(a.len(), b.len(), c.len())?;
    if desc.batch != 1 {
        return Err(DeviceError::InvalidArgument(format!(
            "{op}: batched GEMMs have no epilogue (batch {})",
            desc.batch
        )));
    }
    let fused_only = |what: &str| -> Result<()> {
        if desc.alpha != 1.0 || desc.beta != 0.0 {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: the {what} epilogue needs alpha 1 and beta 0"
            )));
        }
        Ok(())
    };
    let aux = |pre: &B| -> Result<()> {
        check_dtype(op, pre, dt)?;
        check_len(op, "pre", pre, c.len())?;
        if !(desc.ldc.is_multiple_of(8) && desc.c_offset.is_multiple_of(8)) {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: ldc {} and the C offset {} must be multiples of 8 for a GELU epilogue",
                desc.ldc, desc.c_offset
            )));
        }
        Ok(())
    };
    let check_bias = |bias: &B| -> Result<()> {
        check_len(op, "bias", bias, desc.n)?;
        if bias.dtype() != DType::F32 && bias.dtype() != dt {
            return Err(DeviceError::DTypeMismatch {
                op,
                expected: dt,
                got: bias.dtype(),
            });
        }
        Ok(())
    };
    match epilogue {
        Epilogue::BiasResidual { bias, residual } => {
            fused_only("bias + residual")?;
            check_bias(bias)?;
            check_dtype(op, *residual, c.dtype())?;
            check_len(op, "residual", *residual, c.len())
        }
        Epilogue::Bias(bias) => check_bias(bias),
        Epilogue::BiasGelu { bias, pre } => {
            fused_only("bias + GELU")?;
            check_bias(bias)?;
            aux(pre)
        }
        Epilogue::DGelu { pre } => {
            fused_only("GELU backward")?;
            aux(pre)
        }
        Epilogue::BiasGradA { dbias } => {
            check_dtype(op, &**dbias, DType::F32)?;
            check_len(op, "dbias", &**dbias, desc.m)?;
            if !desc.trans_a {
                return Err(DeviceError::InvalidArgument(format!(
                    "{op}: the bias-gradient epilogue needs trans_a (A stored k × m)"
                )));
            }
            Ok(())
        }
    }
}
