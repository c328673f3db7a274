use super::LN_EPS;
use super::fp8_codes::{Fp8Bufs, LINEARS};
use crate::Result;
use crate::fp8::{Fp8State, Operand};
use duet_device::{
    BiasAdd, BiasBackward, Buffer, Device, DeviceError, Epilogue, GeluForward, Gemm, GemmDesc,
    GemmEpilogue, GemmFp8, GemmFp8Epilogue, LayerNormForwardFp8, QuantizeFp8, QuantizeFp8Gelu,
    QuantizeFp8Grad,
};

/// `out = residual + x · Wᵀ + bias` (no residual: `x · Wᵀ + bias`) for `x` (`n × k`), `W`
/// (`m × k`), `out` and `residual` (`n × m`). With
/// `q8` (FP8 buffers and the linear layer's index) the GEMM runs on FP8 copies of `x` and `W`
/// quantised with their current scales (recording their amaxes); the transposed copies are kept
/// for the backward pass. Bias (and GELU, see [`linear_gelu_forward`]) are fused into the GEMM
/// where the backend offers the epilogue, else separate ops.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_forward<D: Device>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    x: &D::Buffer,
    w: &D::Buffer,
    bias: &D::Buffer,
    out: &mut D::Buffer,
    residual: Option<&D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    linear_act_forward(
        dev,
        q8,
        record,
        LinearInput::Plain(x),
        w,
        bias,
        out,
        residual,
        None,
        n,
        k,
        m,
    )
}

/// [`linear_forward`] into `pre` followed by `out = gelu(pre)`: one GEMM with a fused
/// bias + GELU epilogue where the backend has one (16-bit and FP8 GEMMs).
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_gelu_forward<D: Device>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    x: &D::Buffer,
    w: &D::Buffer,
    bias: &D::Buffer,
    pre: &mut D::Buffer,
    out: &mut D::Buffer,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    linear_act_forward(
        dev,
        q8,
        record,
        LinearInput::Plain(x),
        w,
        bias,
        out,
        None,
        Some(pre),
        n,
        k,
        m,
    )
}

/// The input of a linear layer: a tensor, or (FP8 only, computed inside the quantisation of
/// the layer's input, never written) the GELU or the LayerNorm of one.
pub(super) enum LinearInput<'a, B> {
    Plain(&'a B),
    /// `gelu(pre)` ([`duet_device::Fp8Ops::quantize_fp8_gelu`]).
    GeluOf(&'a B),
    /// `layernorm(x)`, whose statistics are written to `mean` and `rstd`
    /// ([`duet_device::Fp8Ops::layernorm_forward_fp8`]).
    LayerNormOf {
        x: &'a B,
        gamma: &'a B,
        beta: &'a B,
        mean: &'a mut B,
        rstd: &'a mut B,
    },
}

/// A linear layer's GEMM operands: its 16-bit input, or the FP8 input and weight with the
/// inverse scales and the two scale slots.
pub(super) enum Operands<'a, B> {
    Plain(&'a B),
    Fp8(&'a B, &'a B, &'a B, usize, usize),
}

/// FP8: the input's codes, quantised from `input` (with a GELU or a LayerNorm riding on the
/// quantisation), and the weight's, with their inverse scales and scale slots.
fn fp8_operands<'a, D: Device>(
    dev: &D,
    q: &'a mut Fp8Bufs<D>,
    id: usize,
    record: bool,
    input: LinearInput<'_, D::Buffer>,
    n: usize,
    k: usize,
) -> Result<Operands<'a, D::Buffer>> {
    let st = &mut q.state;
    let (sx, sw) = (
        Fp8State::<D>::slot(id, Operand::Input),
        Fp8State::<D>::slot(id, Operand::Weight),
    );
    let amax = if record {
        &mut st.amax
    } else {
        &mut q.amax_discard
    };
    let kind = id % LINEARS.len();
    let (x8, x8t) = (&mut q.x8[kind], Some(&mut q.x8t[id]));
    match input {
        LinearInput::Plain(x) => dev.exec(QuantizeFp8 {
            src: x,
            dst: x8,
            dst_t: x8t,
            rows: n,
            cols: k,
            scale: &st.scale,
            amax,
            slot: sx,
        })?,
        LinearInput::GeluOf(pre) => dev.exec(QuantizeFp8Gelu {
            pre,
            dst: x8,
            dst_t: x8t,
            rows: n,
            cols: k,
            scale: &st.scale,
            amax,
            slot: sx,
        })?,
        LinearInput::LayerNormOf {
            x,
            gamma,
            beta,
            mean,
            rstd,
        } => dev.exec(LayerNormForwardFp8 {
            x,
            gamma,
            beta,
            mean,
            rstd,
            dst: x8,
            dst_t: x8t,
            n,
            c: k,
            eps: LN_EPS,
            scale: &st.scale,
            amax,
            slot: sx,
        })?,
    }
    // The weight's codes come from the start of the forward pass
    // (Gpt::quantize_fp8_weights).
    Ok(Operands::Fp8(
        &q.x8[kind],
        &q.w8[id],
        &st.scale_inv,
        st.inv(sx),
        st.inv(sw),
    ))
}

/// The body of [`linear_forward`] (`gelu_pre` None) and [`linear_gelu_forward`] (no
/// residual); FP8 layers also take their input as a GELU or LayerNorm ([`LinearInput`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_act_forward<D: Device>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    input: LinearInput<'_, D::Buffer>,
    w: &D::Buffer,
    bias: &D::Buffer,
    out: &mut D::Buffer,
    residual: Option<&D::Buffer>,
    gelu_pre: Option<&mut D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    let fast = q8
        .as_ref()
        .is_some_and(|(q, _)| q.state.cfg.fast_accum.forward());
    let desc = GemmDesc::new(false, true, n, m, k).fp8_fast_accum(fast);
    // FP8: the operands' FP8 copies, inverse scales and scale slots.
    // The GEMM's operands: the 16-bit input (with `w`), or the FP8 copies of both.
    let operands = match (q8, input) {
        (None, LinearInput::Plain(x)) => Operands::Plain(x),
        (None, _) => {
            return Err(DeviceError::InvalidArgument(
                "linear_forward: a GELU or LayerNorm on the input rides on the FP8 quantisation \
                 only"
                    .into(),
            )
            .into());
        }
        (Some((q, id)), input) => fp8_operands(dev, q, id, record, input, n, k)?,
    };
    let fused = match operands {
        Operands::Plain(_) => dev.capabilities().gemm_epilogue(out.dtype()),
        Operands::Fp8(..) => dev.capabilities().fp8_gemm_epilogue(out.dtype()),
    };
    if fused {
        let epi = linear_epilogue(bias, residual, gelu_pre);
        match operands {
            Operands::Plain(x) => dev.exec(GemmEpilogue {
                desc: &desc,
                a: x,
                b: w,
                c: out,
                epilogue: epi,
            })?,
            Operands::Fp8(x8, w8, si, sx, sw) => dev.exec(GemmFp8Epilogue {
                desc: &desc,
                a: x8,
                b: w8,
                c: out,
                scale_inv: si,
                a_slot: sx,
                b_slot: sw,
                epilogue: epi,
            })?,
        }
        return Ok(());
    }
    // The separate ops: the residual is copied into the GEMM's output, which adds onto it.
    let (target, gelu_out) = match gelu_pre {
        Some(pre) => (pre, Some(out)),
        None => (out, None),
    };
    let unfused_desc = match residual {
        Some(r) => {
            dev.copy(r, 0, target, 0, n * m)?;
            desc.beta(1.0)
        }
        None => desc,
    };
    match operands {
        Operands::Plain(x) => dev.exec(Gemm {
            desc: &unfused_desc,
            a: x,
            b: w,
            c: target,
        })?,
        Operands::Fp8(x8, w8, si, sx, sw) => dev.exec(GemmFp8 {
            desc: &unfused_desc,
            a: x8,
            b: w8,
            c: target,
            scale_inv: si,
            a_slot: sx,
            b_slot: sw,
        })?,
    }
    dev.exec(BiasAdd {
        x: target,
        bias,
        rows: n,
        c: m,
    })?;
    if let Some(out) = gelu_out {
        dev.exec(GeluForward { x: target, out })?;
    }
    Ok(())
}

/// The fused epilogue of a linear layer's GEMM: bias, and GELU or a residual.
pub(super) fn linear_epilogue<'a, B>(
    bias: &'a B,
    residual: Option<&'a B>,
    gelu_pre: Option<&'a mut B>,
) -> Epilogue<'a, B> {
    match (gelu_pre, residual) {
        (Some(pre), _) => Epilogue::BiasGelu { bias, pre },
        (None, Some(residual)) => Epilogue::BiasResidual { bias, residual },
        (None, None) => Epilogue::Bias(bias),
    }
}

/// Where a linear layer's backward pass finds its input `x` and puts the input gradient `dx`.
pub(super) enum GradIo<'a, B> {
    Split {
        x: &'a B,
        dx: &'a mut B,
    },
    /// One buffer holds `x` on entry and `dx` on return: the weight gradient (which reads `x`)
    /// runs before the input gradient overwrites it.
    Shared(&'a mut B),
}

impl<'a, B> GradIo<'a, B> {
    fn x(&self) -> &B {
        match self {
            Self::Split { x, .. } => x,
            Self::Shared(buf) => buf,
        }
    }

    fn into_dx(self) -> &'a mut B {
        match self {
            Self::Split { dx, .. } => dx,
            Self::Shared(buf) => buf,
        }
    }
}

/// Backward of [`linear_forward`]: `dW = doutᵀ · x` (written: [`Gpt::zero_grads`] leaves
/// these gradients alone), `dbias += Σ_rows dout` (unless `dbias` is None: a LayerNorm
/// backward computed it already, [`duet_device::NormOps::layernorm_backward_colsum`]; FP8 layers always
/// compute their own), then
/// `dx = dout · W` (overwrites). With `q8`, `dout` is quantised (E5M2 in the HYBRID recipe) and
/// both GEMMs run in FP8 on the copies the forward pass made, in the K-major layout FP8 GEMMs
/// need.
///
/// GELU: with `dgelu_pre` (the pre-activation of a GELU whose output was this layer's input
/// `x`), `dx` becomes the gradient of that pre-activation where the backend fuses the GELU
/// backward into the 16-bit GEMM; returns whether it did (else the caller applies
/// `gelu_backward`, or passes `dout_gelu_pre` to the next layer). With `dout_gelu_pre` (FP8
/// only), `dout` is the gradient of `gelu(dout_gelu_pre)`, this layer's output: the GELU
/// backward runs inside the quantisation ([`duet_device::Fp8Ops::quantize_fp8_grad`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_backward<D: Device>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    dout: &D::Buffer,
    io: GradIo<'_, D::Buffer>,
    w: &D::Buffer,
    dw: &mut D::Buffer,
    dbias: Option<&mut D::Buffer>,
    dgelu_pre: Option<&D::Buffer>,
    dout_gelu_pre: Option<&D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<bool> {
    match q8 {
        None => {
            if dout_gelu_pre.is_some() {
                return Err(DeviceError::InvalidArgument(
                    "linear_backward: the GELU backward rides on the FP8 quantisation only".into(),
                )
                .into());
            }
            let x = io.x();
            // Written, not added: a linear layer's weight is used once per step.
            let dw_desc = GemmDesc::new(true, false, m, k, n);
            match dbias {
                // The bias gradient comes out of the weight-gradient GEMM (written, not added:
                // it is the bias's only contribution in a step, onto zeroed gradients).
                Some(dbias) if dev.capabilities().gemm_epilogue(dout.dtype()) => {
                    dev.exec(GemmEpilogue {
                        desc: &dw_desc,
                        a: dout,
                        b: x,
                        c: dw,
                        epilogue: Epilogue::BiasGradA { dbias },
                    })?
                }
                Some(dbias) => {
                    dev.exec(Gemm {
                        desc: &dw_desc,
                        a: dout,
                        b: x,
                        c: dw,
                    })?;
                    dev.exec(BiasBackward {
                        dout,
                        dbias,
                        rows: n,
                        c: m,
                    })?;
                }
                None => dev.exec(Gemm {
                    desc: &dw_desc,
                    a: dout,
                    b: x,
                    c: dw,
                })?,
            }
            let dx = io.into_dx();
            let desc = GemmDesc::new(false, false, n, k, m);
            match dgelu_pre {
                Some(pre) if dev.capabilities().gemm_epilogue(dx.dtype()) => {
                    dev.exec(GemmEpilogue {
                        desc: &desc,
                        a: dout,
                        b: w,
                        c: dx,
                        epilogue: Epilogue::DGelu { pre },
                    })?;
                    Ok(true)
                }
                _ => {
                    dev.exec(Gemm {
                        desc: &desc,
                        a: dout,
                        b: w,
                        c: dx,
                    })?;
                    Ok(false)
                }
            }
        }
        Some((q, id)) => {
            let kind = id % LINEARS.len();
            let st = &mut q.state;
            let sy = Fp8State::<D>::slot(id, Operand::GradOutput);
            let (sx, sw) = (
                Fp8State::<D>::slot(id, Operand::Input),
                Fp8State::<D>::slot(id, Operand::Weight),
            );
            // The bias gradient (of the GELU backward's result, where there is one) comes
            // out of the quantisation pass.
            let dbias = dbias.ok_or_else(|| {
                DeviceError::InvalidArgument(
                    "linear_backward: an FP8 layer computes its own bias gradient".into(),
                )
            })?;
            let (dy8, dy8t) = (&mut q.dy8[kind], Some(&mut q.dy8t[kind]));
            dev.exec(QuantizeFp8Grad {
                dout,
                gelu_pre: dout_gelu_pre,
                dst: dy8,
                dst_t: dy8t,
                dbias,
                rows: n,
                cols: m,
                scale: &st.scale,
                amax: &mut st.amax,
                slot: sy,
            })?;
            // dW (m × k) = dyᵀ (stored m × n) · x = dyᵀ · (xᵀ stored k × n)ᵀ.
            let fast = st.cfg.fast_accum.backward();
            dev.exec(GemmFp8 {
                desc: &GemmDesc::new(false, true, m, k, n).fp8_fast_accum(fast),
                a: &q.dy8t[kind],
                b: &q.x8t[id],
                c: dw,
                scale_inv: &st.scale_inv,
                a_slot: st.inv(sy),
                b_slot: st.inv(sx),
            })?;
            let dx = io.into_dx();
            // dx (n × k) = dy (n × m) · W (m × k) = dy · (Wᵀ stored k × m)ᵀ.
            dev.exec(GemmFp8 {
                desc: &GemmDesc::new(false, true, n, k, m).fp8_fast_accum(fast),
                a: &q.dy8[kind],
                b: &q.w8t[id],
                c: dx,
                scale_inv: &st.scale_inv,
                a_slot: st.inv(sy),
                b_slot: st.inv(sw),
            })?;
            Ok(false)
        }
    }
}
