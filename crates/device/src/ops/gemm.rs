//! GEMMs: plain, batched and with fused epilogues.

use crate::*;

/// What a fused GEMM epilogue does after `op(A)·op(B)` ([`GemmOps::gemm_epilogue`]).
pub enum Epilogue<'a, B> {
    /// `C = alpha·op(A)·op(B) + beta·C + bias`: `bias` holds one value per column of C (f32
    /// or C's dtype).
    Bias(&'a B),
    /// `C = residual + op(A)·op(B) + bias`: a linear layer on a residual stream in one pass
    /// (C is only written; `residual` has C's shape and dtype, `bias` C's dtype). Needs
    /// alpha = 1, beta = 0.
    BiasResidual { bias: &'a B, residual: &'a B },
    /// `pre = op(A)·op(B) + bias` and `C = gelu(pre)` (tanh approximation); `pre` has C's
    /// shape and dtype. Needs alpha = 1, beta = 0.
    BiasGelu { bias: &'a B, pre: &'a mut B },
    /// `C = (op(A)·op(B)) ⊙ gelu'(pre)`: the GELU backward fused into the GEMM that produces
    /// the gradient of the GELU's output. Needs alpha = 1, beta = 0.
    DGelu { pre: &'a B },
    /// The usual `C = alpha·op(A)·op(B) + beta·C`, and `dbias[i] = Σ_k op(A)[i, k]` (one f32
    /// value per row of C, overwritten): a linear layer's bias gradient computed in its
    /// weight-gradient GEMM, where A is the output gradient stored `k × m` (`trans_a`).
    BiasGradA { dbias: &'a mut B },
}

/// The arguments of [`GemmOps::gemm`]; [`Check::check`] validates them.
pub struct Gemm<'a, B> {
    pub desc: &'a GemmDesc,
    pub a: &'a B,
    pub b: &'a B,
    pub c: &'a mut B,
}

impl<B: Buffer> Check for Gemm<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        check_dtype("gemm", self.b, self.a.dtype())?;
        self.desc
            .validate(self.a.len(), self.b.len(), self.c.len())?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`GemmOps::gemm_epilogue`]; [`Check::check`] validates them.
pub struct GemmEpilogue<'a, B> {
    pub desc: &'a GemmDesc,
    pub a: &'a B,
    pub b: &'a B,
    pub c: &'a mut B,
    pub epilogue: Epilogue<'a, B>,
}

impl<B: Buffer> Check for GemmEpilogue<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        self.desc
            .validate(self.a.len(), self.b.len(), self.c.len())?;
        epilogue_shape("gemm_epilogue", self.desc, &self.epilogue, self.c.len())?;
        Ok(Checked::new(self))
    }
}

pub trait GemmOps: ElementwiseOps {
    /// `C = alpha · op(A) · op(B) + beta · C`, batched per [`GemmDesc`], FP32 accumulation.
    /// A and B share a dtype (f32, f16 or bf16); C is that dtype or f32.
    fn gemm(&self, args: Checked<Gemm<'_, Self::Buffer>>) -> Result<()>;

    /// Turns GEMM autotuning on or off where the backend has it (CUDA: each new cuBLASLt GEMM
    /// shape times the heuristic's candidates once and keeps the fastest, as PyTorch's
    /// max-autotune does). The choice depends on timings, so two runs may pick different
    /// algorithms and differ in the last bits. Returns whether the backend autotunes.
    fn set_gemm_autotune(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// A single (unbatched) GEMM with a fused epilogue (see [`Epilogue`]); same conventions as
    /// [`GemmOps::gemm`]. The result equals the unfused sequence up to rounding. The default
    /// composes the core ops on a dense C (`ldc = n`, no offset): [`GemmOps::gemm`], then
    /// [`ElementwiseOps::bias_add`], [`ElementwiseOps::add_assign`], [`ElementwiseOps::gelu_forward`],
    /// [`ElementwiseOps::gelu_backward`] (through a temporary) or [`ElementwiseOps::bias_backward`]; the
    /// bias gradient of [`Epilogue::BiasGradA`] needs `trans_a` (A stored `k × m`).
    fn gemm_epilogue(&self, args: Checked<GemmEpilogue<'_, Self::Buffer>>) -> Result<()> {
        gemm_epilogue(self, args)
    }
}

/// [`crate::GemmOps::gemm_epilogue`] composed of the core ops (its default).
pub fn gemm_epilogue<D: GemmOps>(d: &D, args: Checked<GemmEpilogue<'_, D::Buffer>>) -> Result<()> {
    let GemmEpilogue {
        desc,
        a,
        b,
        c,
        epilogue,
    } = args.into_inner();
    let (m, n) = (desc.m, desc.n);
    match epilogue {
        Epilogue::Bias(bias) => {
            d.exec(Gemm { desc, a, b, c })?;
            d.exec(BiasAdd {
                x: c,
                bias,
                rows: m,
                c: n,
            })
        }
        Epilogue::BiasResidual { bias, residual } => {
            d.exec(Gemm { desc, a, b, c })?;
            d.exec(BiasAdd {
                x: c,
                bias,
                rows: m,
                c: n,
            })?;
            d.exec(AddAssign {
                dst: c,
                src: residual,
            })
        }
        Epilogue::BiasGelu { bias, pre } => {
            d.exec(Gemm { desc, a, b, c: pre })?;
            d.exec(BiasAdd {
                x: pre,
                bias,
                rows: m,
                c: n,
            })?;
            d.exec(GeluForward { x: pre, out: c })
        }
        Epilogue::DGelu { pre } => {
            let mut prod = d.alloc(c.dtype(), c.len())?;
            d.exec(Gemm {
                desc,
                a,
                b,
                c: &mut prod,
            })?;
            d.exec(GeluBackward {
                x: pre,
                dout: &prod,
                dx: c,
            })
        }
        Epilogue::BiasGradA { dbias } => {
            if !desc.trans_a || desc.lda != m || desc.a_offset != 0 {
                return Err(DeviceError::InvalidArgument(
                    "gemm_epilogue: BiasGradA needs a dense A stored k × m (trans_a)".into(),
                ));
            }
            check_dtype("gemm_epilogue", dbias, DType::F32)?;
            check_len("gemm_epilogue", "dbias", dbias, m)?;
            d.exec(Gemm { desc, a, b, c })?;
            d.fill(dbias, 0.0)?;
            d.exec(BiasBackward {
                dout: a,
                dbias,
                rows: desc.k,
                c: m,
            })
        }
    }
}

/// The shape rules of the composed [`GemmOps::gemm_epilogue`] and [`Fp8Ops::gemm_fp8_epilogue`]:
/// one dense matrix C (`ldc = n`, no offset, `m × n` elements), and alpha = 1, beta = 0 for
/// the epilogues that need them, with `pre` and `residual` of C's length.
pub fn epilogue_shape<B: Buffer>(
    op: &'static str,
    desc: &GemmDesc,
    epilogue: &Epilogue<'_, B>,
    c_len: usize,
) -> Result<()> {
    let mn = desc.m.checked_mul(desc.n).ok_or(DeviceError::Shape {
        op,
        detail: "m × n overflows".into(),
    })?;
    if desc.batch != 1 || desc.ldc != desc.n || desc.c_offset != 0 || c_len != mn {
        return Err(DeviceError::InvalidArgument(format!(
            "{op}: an epilogue needs one dense C of m × n = {mn} elements (batch 1, ldc = n, no offset)"
        )));
    }
    let exact = |what: &str, len: usize| -> Result<()> {
        if desc.alpha != 1.0 || desc.beta != 0.0 {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: the {what} epilogue needs alpha = 1 and beta = 0"
            )));
        }
        if len != mn {
            return Err(DeviceError::Shape {
                op,
                detail: format!("the {what} epilogue's operand has {len} elements, expected {mn}"),
            });
        }
        Ok(())
    };
    match epilogue {
        Epilogue::BiasResidual { residual, .. } => exact("bias + residual", residual.len()),
        Epilogue::BiasGelu { pre, .. } => exact("bias + GELU", pre.len()),
        Epilogue::DGelu { pre } => exact("GELU backward", pre.len()),
        Epilogue::Bias(_) | Epilogue::BiasGradA { .. } => Ok(()),
    }
}

crate::checked::op_impls! {
    GemmOps:
    Gemm<'a> => gemm,
    GemmEpilogue<'a> => gemm_epilogue,
}
