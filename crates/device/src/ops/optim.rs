//! The optimizer: AdamW, single and multi-tensor, and the gradient-norm sums.

use crate::args::*;
use crate::*;

/// Hyper-parameters of one fused AdamW step (see [`OptimOps::adamw`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1 − β1^t for the step number t ≥ 1.
    pub bias_correction1: f32,
    /// 1 − β2^t.
    pub bias_correction2: f32,
    /// Multiplies the gradient before use: folds in 1/loss-scale and the clipping factor.
    pub grad_scale: f32,
}

impl AdamWStep {
    /// Bias corrections for step `t` (1-based) computed in f64, then rounded once.
    pub fn bias_corrections(beta1: f32, beta2: f32, t: u64) -> (f32, f32) {
        let t = t.min(i32::MAX as u64) as i32;
        (
            (1.0 - (beta1 as f64).powi(t)) as f32,
            (1.0 - (beta2 as f64).powi(t)) as f32,
        )
    }
}

/// One tensor of a multi-tensor AdamW update ([`OptimOps::adamw_clipped`]).
pub struct AdamWTensor<'a, B> {
    /// f32 (master) weights, updated in place.
    pub param: &'a mut B,
    pub grad: &'a B,
    pub m: &'a mut B,
    pub v: &'a mut B,
    /// The low-precision working copy written with the updated weights, if any.
    pub copy: Option<&'a mut B>,
    pub weight_decay: f32,
}

/// The run-wide values of [`OptimOps::adamw_clipped`]. The per-step values (learning rate, bias
/// corrections) live in a device buffer, see [`ADAMW_SCALARS`], and the gradient factor is
/// derived on the device from the global gradient norm (clipping and loss-scale unscaling), so
/// one queued (or recorded) update serves every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWClipStep {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Clip the global gradient norm to this value (0 disables clipping).
    pub max_norm: f32,
    /// The factor the gradients carry (1 without loss scaling).
    pub loss_scale: f32,
}

/// Layout of the f32 scalar buffer of [`OptimOps::adamw_clipped`]: the sum of squares of all the
/// gradients (slot 0, accumulated by [`OptimOps::sum_squares_many`]), the learning rate, and the
/// bias corrections 1 − β1^t and 1 − β2^t.
pub const ADAMW_SCALARS: usize = 4;

/// AdamW's gradient factor from the sum of squares of the (loss-scaled) gradients:
/// PyTorch's `clip_grad_norm_` coefficient `max_norm / (norm + 1e-6)` where it is below 1,
/// divided by the loss scale. Every backend computes exactly this (f32 square root, the
/// unscaling in f64, rounded once), on the host or on the device.
pub fn clip_grad_scale(norm_sq: f32, max_norm: f32, loss_scale: f32) -> f32 {
    let raw = norm_sq.sqrt();
    let norm = (raw as f64 / loss_scale as f64) as f32;
    let coef = max_norm / (norm + 1e-6);
    let clip = if max_norm > 0.0 && coef < 1.0 {
        coef
    } else {
        1.0
    };
    if loss_scale == 1.0 {
        clip
    } else {
        (clip as f64 / loss_scale as f64) as f32
    }
}

/// The arguments of [`OptimOps::adamw`]; [`Check::check`] validates them.
pub struct AdamWUpdate<'a, B> {
    pub param: &'a mut B,
    pub grad: &'a B,
    pub m: &'a mut B,
    pub v: &'a mut B,
    pub step: &'a AdamWStep,
    pub param_copy: Option<&'a mut B>,
}

impl<B: Buffer> Check for AdamWUpdate<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_adamw(
            &*self.param,
            self.grad,
            &*self.m,
            &*self.v,
            self.param_copy.as_deref(),
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`OptimOps::sum_squares`]; [`Check::check`] validates them.
pub struct SumSquares<'a, B> {
    pub x: &'a B,
    pub out: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for SumSquares<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_sum_squares(self.x, &*self.out, self.slot)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`OptimOps::sum_squares_many`]; [`Check::check`] validates them.
pub struct SumSquaresMany<'a, B> {
    pub xs: &'a [&'a B],
    pub out: &'a mut B,
    pub slot: usize,
}

impl<B: Buffer> Check for SumSquaresMany<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_sum_squares_many(self.xs, &*self.out, self.slot)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`OptimOps::adamw_clipped`]; [`Check::check`] validates them.
pub struct AdamWClipped<'a, 'j, B> {
    pub tensors: &'a mut [AdamWTensor<'j, B>],
    pub step: &'a AdamWClipStep,
    pub scalars: &'a B,
}

impl<B: Buffer> Check for AdamWClipped<'_, '_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_adamw_clipped(self.tensors, self.scalars)?;
        Ok(Checked::new(self))
    }
}

pub trait OptimOps: Runtime {
    /// Fused AdamW on f32 master weights `param` with f32 moments `m`, `v`:
    /// `g = grad·grad_scale; m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²;`
    /// `param −= lr·(m/bc1 / (√(v/bc2) + ε) + wd·param)`. When `param_copy` is given, the updated
    /// weights are also written there in its dtype (the low-precision working copy).
    fn adamw(&self, args: Checked<AdamWUpdate<'_, Self::Buffer>>) -> Result<()>;

    /// Accumulates `out[slot] += Σ x²` (in f32) for the global gradient L2 norm; `out` is f32.
    fn sum_squares(&self, args: Checked<SumSquares<'_, Self::Buffer>>) -> Result<()>;

    /// `out[slot] += Σ_i Σ x_i²` over several tensors (f32 result, fixed summation order).
    /// Backends may fuse the tensors into one pass; the default calls [`OptimOps::sum_squares`]
    /// per tensor.
    fn sum_squares_many(&self, args: Checked<SumSquaresMany<'_, Self::Buffer>>) -> Result<()> {
        sum_squares_many(self, args)
    }

    /// AdamW on many tensors reading its per-step values from `scalars` (f32, laid out as
    /// [`ADAMW_SCALARS`] says: sum of squares of the gradients, lr, bias corrections), with the
    /// gradient factor derived from the sum of squares by [`clip_grad_scale`]. On a GPU nothing
    /// travels through the host, so the step needs no host synchronisation and can be recorded
    /// once and replayed. The default reads `scalars` back and calls [`OptimOps::adamw`] per
    /// tensor.
    fn adamw_clipped(&self, args: Checked<AdamWClipped<'_, '_, Self::Buffer>>) -> Result<()> {
        adamw_clipped(self, args)
    }
}

/// [`crate::OptimOps::sum_squares_many`] composed of the core ops (its default).
pub fn sum_squares_many<D: OptimOps>(
    d: &D,
    args: Checked<SumSquaresMany<'_, D::Buffer>>,
) -> Result<()> {
    let SumSquaresMany { xs, out, slot } = args.into_inner();
    for &x in xs {
        d.exec(SumSquares { x, out, slot })?;
    }
    Ok(())
}

/// [`crate::OptimOps::adamw_clipped`] composed of the core ops (its default).
pub fn adamw_clipped<D: OptimOps>(
    d: &D,
    args: Checked<AdamWClipped<'_, '_, D::Buffer>>,
) -> Result<()> {
    let AdamWClipped {
        tensors,
        step,
        scalars,
    } = args.into_inner();
    // Every tensor is checked before any is updated.
    let raw = d.download_bytes(scalars, 0, ADAMW_SCALARS)?;
    let v: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let grad_scale = clip_grad_scale(v[0], step.max_norm, step.loss_scale);
    for t in tensors.iter_mut() {
        let s = AdamWStep {
            lr: v[1],
            beta1: step.beta1,
            beta2: step.beta2,
            eps: step.eps,
            weight_decay: t.weight_decay,
            bias_correction1: v[2],
            bias_correction2: v[3],
            grad_scale,
        };
        d.exec(AdamWUpdate {
            param: t.param,
            grad: t.grad,
            m: t.m,
            v: t.v,
            step: &s,
            param_copy: t.copy.as_deref_mut(),
        })?;
    }
    Ok(())
}

crate::checked::op_impls! {
    OptimOps:
    AdamWUpdate<'a> => adamw,
    SumSquares<'a> => sum_squares,
    SumSquaresMany<'a> => sum_squares_many,
    AdamWClipped<'a, 'j> => adamw_clipped,
}
