//! FP8 with delayed scaling: quantisation, FP8 GEMMs and the fused FP8 paths.

use crate::args::*;
use crate::*;

/// The FP8 codes [`Fp8Ops::adamw_clipped_fp8`] writes for one updated weight matrix.
pub struct AdamWFp8Out<'a, B> {
    /// Index of the weight in the update's tensors; the codes are those of its working copy
    /// (of its `param` when it has none) after the update.
    pub tensor: usize,
    /// FP8 codes, `rows × cols`.
    pub dst: &'a mut B,
    /// The same codes transposed (`cols × rows`, `dst`'s dtype), if wanted.
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    /// The weight's entry of `scale` and `amax`.
    pub slot: usize,
}

impl<B> AdamWFp8Out<'_, B> {
    /// The [`Fp8Ops::quantize_fp8_many`] job that writes these codes from tensor `t`'s updated
    /// weight (its working copy, else its `param`): what [`Fp8Ops::adamw_clipped_fp8`] computes.
    pub fn job<'b>(&'b mut self, t: &'b AdamWTensor<'_, B>) -> Fp8QuantJob<'b, B> {
        Fp8QuantJob {
            src: t.copy.as_deref().unwrap_or(&*t.param),
            dst: &mut *self.dst,
            dst_t: self.dst_t.as_deref_mut(),
            rows: self.rows,
            cols: self.cols,
            slot: self.slot,
        }
    }
}

/// One matrix of a multi-tensor FP8 quantisation ([`Fp8Ops::quantize_fp8_many`]): the operands of
/// one [`Fp8Ops::quantize_fp8`] call but the `scale` and `amax` buffers, which every job of a
/// call shares (each job reads and updates its own `slot` of them).
pub struct Fp8QuantJob<'a, B> {
    /// `rows × cols`, f32, f16 or bf16.
    pub src: &'a B,
    /// FP8 codes of `src`, `rows × cols`.
    pub dst: &'a mut B,
    /// The same codes transposed (`cols × rows`, `dst`'s dtype), if wanted.
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    /// The entry of `scale` this job multiplies by and of `amax` it records into.
    pub slot: usize,
}

impl<B: Buffer> Fp8QuantJob<'_, B> {
    /// Runs this job as one [`Fp8Ops::quantize_fp8`] call on `d`.
    pub fn quantize<D: Fp8Ops<Buffer = B>>(
        &mut self,
        d: &D,
        scale: &B,
        amax: &mut B,
    ) -> Result<()> {
        d.exec(QuantizeFp8 {
            src: self.src,
            dst: self.dst,
            dst_t: self.dst_t.as_deref_mut(),
            rows: self.rows,
            cols: self.cols,
            scale,
            amax,
            slot: self.slot,
        })
    }
}

/// FP8 delayed scaling: the scale for an amax (`fp8_max / amax / 2^margin`, computed in f64,
/// saturating at f32::MAX), or `prev` when `amax` is not a finite positive number (no data,
/// overflow, NaN). What [`Fp8Ops::fp8_scaling_update`] computes on every backend.
pub fn fp8_delayed_scale(amax: f32, prev: f32, fp8_max: f32, margin: i32) -> f32 {
    if !(amax.is_finite() && amax > 0.0) {
        return prev;
    }
    let s = (fp8_max as f64 / amax as f64) / 2f64.powi(margin);
    if s >= f32::MAX as f64 {
        f32::MAX
    } else {
        s as f32
    }
}

/// The inverse scale the FP8 GEMMs take: `1/scale` rounded once from f64.
pub fn fp8_scale_inv(scale: f32) -> f32 {
    (1.0f64 / scale as f64) as f32
}

/// One operand's delayed-scaling step on host values: pushes `amax` onto `history` (newest
/// first; the oldest entry falls off), then [`fp8_history_scale`].
pub fn fp8_history_step(
    history: &mut [f32],
    amax: f32,
    prev: f32,
    fp8_max: f32,
    most_recent: bool,
    margin: i32,
) -> f32 {
    if !history.is_empty() {
        history.rotate_right(1);
        history[0] = amax;
    }
    fp8_history_scale(history, amax, prev, fp8_max, most_recent, margin)
}

/// The scale after an amax history (newest first, `newest` its first entry): from the
/// history's max (a NaN entry makes it NaN, so the scale is kept) or, with `most_recent`, from
/// `newest` ([`fp8_delayed_scale`]).
pub fn fp8_history_scale(
    history: &[f32],
    newest: f32,
    prev: f32,
    fp8_max: f32,
    most_recent: bool,
    margin: i32,
) -> f32 {
    let a = if most_recent {
        newest
    } else {
        history.iter().copied().fold(0.0f32, |m, x| {
            if x.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(x)
            }
        })
    };
    fp8_delayed_scale(a, prev, fp8_max, margin)
}

/// The arguments of [`Fp8Ops::quantize_fp8`]; [`Check::check`] validates them.
pub struct QuantizeFp8<'a, B> {
    pub src: &'a B,
    pub dst: &'a mut B,
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    pub scale: &'a B,
    pub amax: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for QuantizeFp8<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("quantize_fp8", self.rows, self.cols)?.validate_quantize_fp8(
            Some(self.src),
            &*self.dst,
            self.dst_t.as_deref(),
            self.scale,
            &*self.amax,
            self.slot,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::gemm_fp8`]; [`Check::check`] validates them.
pub struct GemmFp8<'a, B> {
    pub desc: &'a GemmDesc,
    pub a: &'a B,
    pub b: &'a B,
    pub c: &'a mut B,
    pub scale_inv: &'a B,
    pub a_slot: usize,
    pub b_slot: usize,
}

impl<B: Buffer> Check for GemmFp8<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_gemm_fp8(
            self.desc,
            self.a,
            self.b,
            &*self.c,
            self.scale_inv,
            self.a_slot,
            self.b_slot,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::quantize_fp8_many`]; [`Check::check`] validates them.
pub struct QuantizeFp8Many<'a, 'j, B> {
    pub jobs: &'a mut [Fp8QuantJob<'j, B>],
    pub scale: &'a B,
    pub amax: &'a mut B,
}

impl<B: Buffer> Check for QuantizeFp8Many<'_, '_, B> {
    fn check(self) -> Result<Checked<Self>> {
        check_fp8_quant_jobs("quantize_fp8_many", self.jobs, self.scale, &*self.amax)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::quantize_fp8_grad`]; [`Check::check`] validates them.
pub struct QuantizeFp8Grad<'a, B> {
    pub dout: &'a B,
    pub gelu_pre: Option<&'a B>,
    pub dst: &'a mut B,
    pub dst_t: Option<&'a mut B>,
    pub dbias: &'a mut B,
    pub rows: usize,
    pub cols: usize,
    pub scale: &'a B,
    pub amax: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for QuantizeFp8Grad<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("quantize_fp8_grad", self.rows, self.cols)?.validate_quantize_fp8_grad(
            self.dout,
            self.gelu_pre,
            &*self.dst,
            self.dst_t.as_deref(),
            &*self.dbias,
            self.scale,
            &*self.amax,
            self.slot,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::quantize_fp8_gelu`]; [`Check::check`] validates them.
pub struct QuantizeFp8Gelu<'a, B> {
    pub pre: &'a B,
    pub dst: &'a mut B,
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    pub scale: &'a B,
    pub amax: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for QuantizeFp8Gelu<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("quantize_fp8_gelu", self.rows, self.cols)?.validate_quantize_fp8(
            Some(self.pre),
            &*self.dst,
            self.dst_t.as_deref(),
            self.scale,
            &*self.amax,
            self.slot,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::layernorm_forward_fp8`]; [`Check::check`] validates them.
pub struct LayerNormForwardFp8<'a, B> {
    pub x: &'a B,
    pub gamma: &'a B,
    pub beta: &'a B,
    pub mean: &'a mut B,
    pub rstd: &'a mut B,
    pub dst: &'a mut B,
    pub dst_t: Option<&'a mut B>,
    pub n: usize,
    pub c: usize,
    pub eps: f32,
    pub scale: &'a B,
    pub amax: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for LayerNormForwardFp8<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("layernorm_forward_fp8", self.n, self.c)?.validate_layernorm_forward_fp8(
            self.x,
            self.gamma,
            self.beta,
            &*self.mean,
            &*self.rstd,
            &*self.dst,
            self.dst_t.as_deref(),
            self.scale,
            &*self.amax,
            self.slot,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::gemm_fp8_epilogue`]; [`Check::check`] validates them.
pub struct GemmFp8Epilogue<'a, B> {
    pub desc: &'a GemmDesc,
    pub a: &'a B,
    pub b: &'a B,
    pub c: &'a mut B,
    pub scale_inv: &'a B,
    pub a_slot: usize,
    pub b_slot: usize,
    pub epilogue: Epilogue<'a, B>,
}

impl<B: Buffer> Check for GemmFp8Epilogue<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_gemm_fp8(
            self.desc,
            self.a,
            self.b,
            &*self.c,
            self.scale_inv,
            self.a_slot,
            self.b_slot,
        )?;
        epilogue_shape("gemm_fp8_epilogue", self.desc, &self.epilogue, self.c.len())?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::fp8_scaling_update`]; [`Check::check`] validates them.
pub struct Fp8ScalingUpdate<'a, B> {
    pub amax: &'a mut B,
    pub history: &'a mut B,
    pub scale: &'a mut B,
    pub scale_inv: &'a mut B,
    pub inv_stride: usize,
    pub fp8_max: &'a B,
    pub len: usize,
    pub most_recent: bool,
    pub margin: i32,
}

impl<B: Buffer> Check for Fp8ScalingUpdate<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        check_fp8_scaling_args(
            &*self.amax,
            &*self.history,
            &*self.scale,
            &*self.scale_inv,
            self.inv_stride,
            self.fp8_max,
            self.len,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`Fp8Ops::adamw_clipped_fp8`]; [`Check::check`] validates them.
pub struct AdamWClippedFp8<'a, 'j, B> {
    pub tensors: &'a mut [AdamWTensor<'j, B>],
    pub step: &'a AdamWClipStep,
    pub scalars: &'a B,
    pub outs: &'a mut [AdamWFp8Out<'j, B>],
    pub scale: &'a B,
    pub amax: &'a mut B,
}

impl<B: Buffer> Check for AdamWClippedFp8<'_, '_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_adamw_clipped(self.tensors, self.scalars)?;
        check_adamw_fp8_outs(
            "adamw_clipped_fp8",
            self.tensors,
            self.outs,
            self.scale,
            &*self.amax,
        )?;
        Ok(Checked::new(self))
    }
}

pub trait Fp8Ops: NormOps + GemmOps + OptimOps {
    /// FP8 quantisation with a device-resident scale, recording the amax in the same pass:
    /// `dst = encode(src · scale[slot])` (round to nearest even, saturating to ±max; NaN stays
    /// NaN) and `amax[slot] = max(amax[slot], max |src|)` (NaN elements are ignored).
    /// `src` is a `rows × cols` f32/f16/bf16 matrix, `dst` an FP8 buffer of the same length,
    /// and `dst_t`, when given, receives the same codes transposed (`cols × rows`, same dtype as
    /// `dst`) for GEMM layouts that need the other operand order. `scale` and `amax` are f32.
    ///
    /// A backend or GPU without FP8 support returns [`DeviceError::Unsupported`].
    fn quantize_fp8(&self, args: Checked<QuantizeFp8<'_, Self::Buffer>>) -> Result<()>;

    /// FP8 GEMM: `C = alpha · (op(A)·sa) · (op(B)·sb) + beta · C` with `sa = scale_inv[a_slot]`,
    /// `sb = scale_inv[b_slot]` (f32, on the device), A and B FP8 (each E4M3 or E5M2 of one
    /// family, OCP or FNUZ), C f32, bf16 or f16; FP32 accumulation. Backends may restrict the
    /// layout to what their FP8 GEMM supports (cuBLASLt on sm_90: `trans_a = false`,
    /// `trans_b = true`, i.e. both operands K-major, one matrix, leading dimensions multiples of
    /// 16, not both operands E5M2) and return [`DeviceError::Unsupported`] or
    /// [`DeviceError::InvalidArgument`] otherwise.
    fn gemm_fp8(&self, args: Checked<GemmFp8<'_, Self::Buffer>>) -> Result<()>;

    /// [`Fp8Ops::quantize_fp8`] of every job, sharing `scale` and `amax` (job `j` uses entry
    /// `j.slot` of both): the results are exactly those of calling `quantize_fp8` on the jobs
    /// in order, codes and transposed codes bit for bit and every
    /// `amax[slot] = max(amax[slot], max |src|)`. Jobs may share a slot: the amax update is a
    /// max, so it does not depend on the order (or on how a backend interleaves the jobs). A
    /// GPU backend quantises the jobs in one launch (the weights of a whole model at the start
    /// of a step). Every job is checked before any is run (the errors `quantize_fp8` gives, see
    /// [`check_fp8_quant_jobs`]), so a refused call changes nothing. The default calls
    /// `quantize_fp8` per job.
    fn quantize_fp8_many(
        &self,
        args: Checked<QuantizeFp8Many<'_, '_, Self::Buffer>>,
    ) -> Result<()> {
        quantize_fp8_many(self, args)
    }

    /// The gradient side of an FP8 linear layer in one pass, as Transformer Engine fuses it:
    /// `g = dout` or, with `gelu_pre`, `g = gelu'(gelu_pre) ⊙ dout` rounded to `dout`'s dtype
    /// (exactly [`ElementwiseOps::gelu_backward`]); then `dbias[c] += Σ_rows g[r, c]` (f32, `cols`
    /// values) and [`Fp8Ops::quantize_fp8`] of `g` into `dst` and `dst_t`, recording its amax.
    /// `g` itself is not written. The default runs the separate ops (with a temporary for `g`
    /// when `gelu_pre` is given); the codes equal the separate ops' bit for bit, `dbias` up to
    /// the summation order.
    fn quantize_fp8_grad(&self, args: Checked<QuantizeFp8Grad<'_, Self::Buffer>>) -> Result<()> {
        quantize_fp8_grad(self, args)
    }

    /// The forward side of an FP8 linear layer whose input is `gelu(pre)`: [`Fp8Ops::quantize_fp8`]
    /// of `gelu(pre)` (exactly [`ElementwiseOps::gelu_forward`], rounded to `pre`'s dtype) without
    /// writing the activation itself. The default runs the separate ops with a temporary; the
    /// codes equal the separate ops' bit for bit.
    fn quantize_fp8_gelu(&self, args: Checked<QuantizeFp8Gelu<'_, Self::Buffer>>) -> Result<()> {
        quantize_fp8_gelu(self, args)
    }

    /// The forward side of an FP8 linear layer whose input is a LayerNorm, in one pass:
    /// [`NormOps::layernorm_forward`] of `x` (`n × c`, with `gamma`, `beta`, `eps`), writing `mean`
    /// and `rstd` exactly as it does, and [`Fp8Ops::quantize_fp8`] of its output
    /// `out = (x − μ)·rstd·γ + β` rounded to `x`'s dtype (exactly `layernorm_forward`'s `out`)
    /// into `dst` and `dst_t` (`n` rows, `c` cols), recording
    /// `amax[slot] = max(amax[slot], max |out|)` (NaN ignored). `out` itself is not written. The
    /// default runs the separate ops with a temporary; mean, rstd, the codes and the amax equal
    /// the separate ops' bit for bit.
    fn layernorm_forward_fp8(
        &self,
        args: Checked<LayerNormForwardFp8<'_, Self::Buffer>>,
    ) -> Result<()> {
        layernorm_forward_fp8(self, args)
    }

    /// [`Fp8Ops::gemm_fp8`] with a fused [`Epilogue::Bias`], [`Epilogue::BiasResidual`] or
    /// [`Epilogue::BiasGelu`] (bias, residual and `pre` in C's dtype); other epilogues are
    /// refused. The result equals `gemm_fp8` followed by the separate ops up to rounding; the
    /// default is that sequence, on a dense C.
    fn gemm_fp8_epilogue(&self, args: Checked<GemmFp8Epilogue<'_, Self::Buffer>>) -> Result<()> {
        gemm_fp8_epilogue(self, args)
    }

    /// FP8 delayed scaling for every operand `i < amax.len()`, on the device so a recorded step
    /// can include it: [`fp8_history_step`] on `history[i·len .. (i+1)·len]` (newest first;
    /// entries never written are 0) with `amax[i]`, `scale[i]` (the previous scale, replaced)
    /// and `fp8_max[i]`; then `scale_inv[i · inv_stride] = fp8_scale_inv(scale[i])` (the
    /// elements in between are left alone) and `amax[i] = 0`. All buffers f32; `scale_inv`
    /// holds `ops · inv_stride` elements. The default runs it on the host (downloads and
    /// uploads).
    fn fp8_scaling_update(&self, args: Checked<Fp8ScalingUpdate<'_, Self::Buffer>>) -> Result<()> {
        fp8_scaling_update(self, args)
    }

    /// [`OptimOps::adamw_clipped`], then the FP8 codes of some of the updated weights: for each
    /// `out`, exactly [`Fp8Ops::quantize_fp8_many`] of the job with `src` the working copy of
    /// tensor `out.tensor` (its `param` when it has none) and `out`'s `dst`, `dst_t`, `rows`,
    /// `cols` and `slot` (codes bit for bit, `amax[slot] = max(amax[slot], max |src|)`).
    /// Delayed scaling quantises the weights of step k + 1 with the scale set after step k, so
    /// an FP8 model can take its weight codes from the optimizer once its scaling update has
    /// run, instead of quantising the copies at the start of the next forward pass. A GPU
    /// backend writes the codes in the update's pass (the copy is not read back). The codes'
    /// operands are checked before anything runs ([`check_adamw_fp8_outs`]). The default runs
    /// the two ops one after the other.
    fn adamw_clipped_fp8(
        &self,
        args: Checked<AdamWClippedFp8<'_, '_, Self::Buffer>>,
    ) -> Result<()> {
        adamw_clipped_fp8(self, args)
    }
}

/// [`crate::Fp8Ops::quantize_fp8_many`] composed of the core ops (its default).
pub fn quantize_fp8_many<D: Fp8Ops>(
    d: &D,
    args: Checked<QuantizeFp8Many<'_, '_, D::Buffer>>,
) -> Result<()> {
    let QuantizeFp8Many { jobs, scale, amax } = args.into_inner();
    for j in jobs.iter_mut() {
        j.quantize(d, scale, amax)?;
    }
    Ok(())
}

/// [`crate::Fp8Ops::quantize_fp8_grad`] composed of the core ops (its default).
pub fn quantize_fp8_grad<D: Fp8Ops>(
    d: &D,
    args: Checked<QuantizeFp8Grad<'_, D::Buffer>>,
) -> Result<()> {
    let QuantizeFp8Grad {
        dout,
        gelu_pre,
        dst,
        dst_t,
        dbias,
        rows,
        cols,
        scale,
        amax,
        slot,
    } = args.into_inner();
    let tmp;
    let g = match gelu_pre {
        Some(pre) => {
            let mut t = d.alloc(dout.dtype(), dout.len())?;
            d.exec(GeluBackward {
                x: pre,
                dout,
                dx: &mut t,
            })?;
            tmp = t;
            &tmp
        }
        None => dout,
    };
    d.exec(BiasBackward {
        dout: g,
        dbias,
        rows,
        c: cols,
    })?;
    d.exec(QuantizeFp8 {
        src: g,
        dst,
        dst_t,
        rows,
        cols,
        scale,
        amax,
        slot,
    })
}

/// [`crate::Fp8Ops::quantize_fp8_gelu`] composed of the core ops (its default).
pub fn quantize_fp8_gelu<D: Fp8Ops>(
    d: &D,
    args: Checked<QuantizeFp8Gelu<'_, D::Buffer>>,
) -> Result<()> {
    let QuantizeFp8Gelu {
        pre,
        dst,
        dst_t,
        rows,
        cols,
        scale,
        amax,
        slot,
    } = args.into_inner();
    let mut h = d.alloc(pre.dtype(), pre.len())?;
    d.exec(GeluForward {
        x: pre,
        out: &mut h,
    })?;
    d.exec(QuantizeFp8 {
        src: &h,
        dst,
        dst_t,
        rows,
        cols,
        scale,
        amax,
        slot,
    })
}

/// [`crate::Fp8Ops::layernorm_forward_fp8`] composed of the core ops (its default).
pub fn layernorm_forward_fp8<D: Fp8Ops>(
    d: &D,
    args: Checked<LayerNormForwardFp8<'_, D::Buffer>>,
) -> Result<()> {
    let LayerNormForwardFp8 {
        x,
        gamma,
        beta,
        mean,
        rstd,
        dst,
        dst_t,
        n,
        c,
        eps,
        scale,
        amax,
        slot,
    } = args.into_inner();
    let mut out = d.alloc(x.dtype(), x.len())?;
    d.exec(LayerNormForward {
        x,
        gamma,
        beta,
        out: &mut out,
        mean,
        rstd,
        n,
        c,
        eps,
    })?;
    d.exec(QuantizeFp8 {
        src: &out,
        dst,
        dst_t,
        rows: n,
        cols: c,
        scale,
        amax,
        slot,
    })
}

/// [`crate::Fp8Ops::gemm_fp8_epilogue`] composed of the core ops (its default).
pub fn gemm_fp8_epilogue<D: Fp8Ops>(
    d: &D,
    args: Checked<GemmFp8Epilogue<'_, D::Buffer>>,
) -> Result<()> {
    let GemmFp8Epilogue {
        desc,
        a,
        b,
        c,
        scale_inv,
        a_slot,
        b_slot,
        epilogue,
    } = args.into_inner();
    let bias = match &epilogue {
        Epilogue::Bias(b)
        | Epilogue::BiasResidual { bias: b, .. }
        | Epilogue::BiasGelu { bias: b, .. } => Some(*b),
        _ => None,
    };
    if let Some(b) = bias {
        check_dtype("gemm_fp8_epilogue", b, c.dtype())?;
    }
    let (m, n) = (desc.m, desc.n);
    match epilogue {
        Epilogue::Bias(bias) => {
            d.exec(GemmFp8 {
                desc,
                a,
                b,
                c,
                scale_inv,
                a_slot,
                b_slot,
            })?;
            d.exec(BiasAdd {
                x: c,
                bias,
                rows: m,
                c: n,
            })
        }
        Epilogue::BiasResidual { bias, residual } => {
            d.exec(GemmFp8 {
                desc,
                a,
                b,
                c,
                scale_inv,
                a_slot,
                b_slot,
            })?;
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
            d.exec(GemmFp8 {
                desc,
                a,
                b,
                c: pre,
                scale_inv,
                a_slot,
                b_slot,
            })?;
            d.exec(BiasAdd {
                x: pre,
                bias,
                rows: m,
                c: n,
            })?;
            d.exec(GeluForward { x: pre, out: c })
        }
        Epilogue::DGelu { .. } | Epilogue::BiasGradA { .. } => Err(DeviceError::InvalidArgument(
            "gemm_fp8_epilogue: only Bias, BiasResidual and BiasGelu are fused into FP8 GEMMs"
                .into(),
        )),
    }
}

/// [`crate::Fp8Ops::fp8_scaling_update`] composed of the core ops (its default).
pub fn fp8_scaling_update<D: Fp8Ops>(
    d: &D,
    args: Checked<Fp8ScalingUpdate<'_, D::Buffer>>,
) -> Result<()> {
    let Fp8ScalingUpdate {
        amax,
        history,
        scale,
        scale_inv,
        inv_stride,
        fp8_max,
        len,
        most_recent,
        margin,
    } = args.into_inner();
    let ops = amax.len();
    let to_f32 = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let a = to_f32(d.download_bytes(amax, 0, ops)?);
    let mut h = to_f32(d.download_bytes(history, 0, ops * len)?);
    let mut s = to_f32(d.download_bytes(scale, 0, ops)?);
    let m = to_f32(d.download_bytes(fp8_max, 0, ops)?);
    for i in 0..ops {
        let hist = &mut h[i * len..(i + 1) * len];
        s[i] = fp8_history_step(hist, a[i], s[i], m[i], most_recent, margin);
    }
    let mut inv = to_f32(d.download_bytes(scale_inv, 0, ops * inv_stride)?);
    for (i, &x) in s.iter().enumerate() {
        inv[i * inv_stride] = fp8_scale_inv(x);
    }
    d.upload_bytes(&bytes(&h), history, 0)?;
    d.upload_bytes(&bytes(&s), scale, 0)?;
    d.upload_bytes(&bytes(&inv), scale_inv, 0)?;
    d.fill(amax, 0.0)
}

/// [`crate::Fp8Ops::adamw_clipped_fp8`] composed of the core ops (its default).
pub fn adamw_clipped_fp8<D: Fp8Ops>(
    d: &D,
    args: Checked<AdamWClippedFp8<'_, '_, D::Buffer>>,
) -> Result<()> {
    let AdamWClippedFp8 {
        tensors,
        step,
        scalars,
        outs,
        scale,
        amax,
    } = args.into_inner();
    d.exec(AdamWClipped {
        tensors,
        step,
        scalars,
    })?;
    let mut jobs: Vec<Fp8QuantJob<'_, D::Buffer>> = outs
        .iter_mut()
        .map(|o| {
            let t = &tensors[o.tensor];
            o.job(t)
        })
        .collect();
    d.exec(QuantizeFp8Many {
        jobs: &mut jobs,
        scale,
        amax,
    })
}

/// Checks the buffers of [`Fp8Ops::fp8_scaling_update`] (all f32; `history` holds `len` entries
/// per operand, `scale_inv` `inv_stride` ≥ 1, the others one) and returns the number of
/// operands.
pub fn check_fp8_scaling_args<B: Buffer>(
    amax: &B,
    history: &B,
    scale: &B,
    scale_inv: &B,
    inv_stride: usize,
    fp8_max: &B,
    len: usize,
) -> Result<usize> {
    const OP: &str = "fp8_scaling_update";
    let ops = amax.len();
    check_dtype(OP, amax, DType::F32)?;
    if inv_stride == 0 {
        return Err(DeviceError::InvalidArgument(format!(
            "{OP}: inv_stride must be at least 1"
        )));
    }
    let inv_len = ops.checked_mul(inv_stride).ok_or_else(|| {
        DeviceError::InvalidArgument(format!(
            "{OP}: {ops} operands × inv_stride {inv_stride} overflow"
        ))
    })?;
    for (b, what, n) in [
        (history, "history", ops * len),
        (scale, "scale", ops),
        (scale_inv, "scale_inv", inv_len),
        (fp8_max, "fp8_max", ops),
    ] {
        check_dtype(OP, b, DType::F32)?;
        check_len(OP, what, b, n)?;
    }
    Ok(ops)
}

/// Checks the jobs of [`Fp8Ops::quantize_fp8_many`] as [`Fp8Ops::quantize_fp8`] checks its
/// operands: `src` f32, f16 or bf16 with `rows · cols` elements, `dst` an FP8 buffer of the same
/// length, `dst_t` (if any) of `dst`'s dtype and length, `scale` and `amax` f32 holding every
/// job's `slot`. Several jobs may name the same slot.
pub fn check_fp8_quant_jobs<B: Buffer>(
    op: &'static str,
    jobs: &[Fp8QuantJob<'_, B>],
    scale: &B,
    amax: &B,
) -> Result<()> {
    check_dtype(op, scale, DType::F32)?;
    check_dtype(op, amax, DType::F32)?;
    for (i, j) in jobs.iter().enumerate() {
        check_float(op, j.src)?;
        if !j.dst.dtype().is_fp8() {
            return Err(DeviceError::Unsupported {
                op: op.to_string(),
                dtype: j.dst.dtype(),
            });
        }
        let n = j
            .rows
            .checked_mul(j.cols)
            .ok_or_else(|| DeviceError::Shape {
                op,
                detail: format!("job {i}: {} × {} overflows", j.rows, j.cols),
            })?;
        check_len(op, &format!("job {i} src"), j.src, n)?;
        check_len(op, &format!("job {i} dst"), &*j.dst, n)?;
        if let Some(t) = j.dst_t.as_deref() {
            check_dtype(op, t, j.dst.dtype())?;
            check_len(op, &format!("job {i} dst_t"), t, n)?;
        }
        check_range(op, j.slot, 1, scale.len())?;
        check_range(op, j.slot, 1, amax.len())?;
    }
    Ok(())
}

/// The checks of [`Fp8Ops::adamw_clipped_fp8`]'s codes: each `out` names one of `tensors`,
/// whose working copy (or f32 `param`) is a float `rows × cols` matrix, and passes
/// [`check_fp8_quant_jobs`] as the job quantising it. (The update's own operands are checked by
/// [`OptimOps::adamw_clipped`] before it writes anything.)
pub fn check_adamw_fp8_outs<B: Buffer>(
    op: &'static str,
    tensors: &[AdamWTensor<'_, B>],
    outs: &mut [AdamWFp8Out<'_, B>],
    scale: &B,
    amax: &B,
) -> Result<()> {
    let mut jobs = Vec::with_capacity(outs.len());
    for (i, o) in outs.iter_mut().enumerate() {
        let t = tensors.get(o.tensor).ok_or_else(|| DeviceError::Shape {
            op,
            detail: format!("output {i} names tensor {} of {}", o.tensor, tensors.len()),
        })?;
        jobs.push(o.job(t));
    }
    check_fp8_quant_jobs(op, &jobs, scale, amax)
}

crate::checked::op_impls! {
    Fp8Ops:
    QuantizeFp8<'a> => quantize_fp8,
    GemmFp8<'a> => gemm_fp8,
    QuantizeFp8Many<'a, 'j> => quantize_fp8_many,
    QuantizeFp8Grad<'a> => quantize_fp8_grad,
    QuantizeFp8Gelu<'a> => quantize_fp8_gelu,
    LayerNormForwardFp8<'a> => layernorm_forward_fp8,
    GemmFp8Epilogue<'a> => gemm_fp8_epilogue,
    Fp8ScalingUpdate<'a> => fp8_scaling_update,
    AdamWClippedFp8<'a, 'j> => adamw_clipped_fp8,
}
