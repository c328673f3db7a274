//! The classifier: softmax cross-entropy with its gradient.

use crate::*;

/// The arguments of [`LossOps::cross_entropy`]; [`Check::check`] validates them.
pub struct CrossEntropy<'a, B> {
    pub logits: &'a B,
    pub targets: &'a B,
    pub losses: &'a mut B,
    pub dlogits: Option<&'a mut B>,
    pub n: usize,
    pub v: usize,
    pub grad_scale: f32,
}

impl<B: Buffer> Check for CrossEntropy<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("cross_entropy", self.n, self.v)?.validate_cross_entropy(
            self.logits,
            self.targets,
            &*self.losses,
            self.dlogits.as_deref(),
            self.v,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`LossOps::cross_entropy_padded`]; [`Check::check`] validates them.
pub struct CrossEntropyPadded<'a, B> {
    pub logits: &'a B,
    pub targets: &'a B,
    pub losses: &'a mut B,
    pub dlogits: Option<&'a mut B>,
    pub n: usize,
    pub v: usize,
    pub ld: usize,
    pub grad_scale: f32,
}

impl<B: Buffer> Check for CrossEntropyPadded<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("cross_entropy_padded", self.n, self.ld)?.validate_cross_entropy(
            self.logits,
            self.targets,
            &*self.losses,
            self.dlogits.as_deref(),
            self.v,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`LossOps::cross_entropy_in_place`]; [`Check::check`] validates them.
pub struct CrossEntropyInPlace<'a, B> {
    pub logits: &'a mut B,
    pub targets: &'a B,
    pub losses: &'a mut B,
    pub n: usize,
    pub v: usize,
    pub ld: usize,
    pub grad_scale: f32,
}

impl<B: Buffer> Check for CrossEntropyInPlace<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("cross_entropy_in_place", self.n, self.ld)?.validate_cross_entropy(
            &*self.logits,
            self.targets,
            &*self.losses,
            None,
            self.v,
        )?;
        Ok(Checked::new(self))
    }
}

pub trait LossOps: Runtime {
    /// Fused softmax + cross-entropy over `logits` (`n × v`) with i32 `targets` (`n`; a negative
    /// target is ignored: loss 0, gradient 0). Writes per-row `losses` (f32, `n`). When `dlogits`
    /// is given, also writes `dlogits = (softmax(logits) − onehot(target)) · grad_scale`.
    /// ([`LossOps::cross_entropy_padded`] with rows of exactly `v` logits.)
    fn cross_entropy(&self, args: Checked<CrossEntropy<'_, Self::Buffer>>) -> Result<()> {
        let CrossEntropy {
            logits,
            targets,
            losses,
            dlogits,
            n,
            v,
            grad_scale,
        } = args.into_inner();
        self.exec(CrossEntropyPadded {
            logits,
            targets,
            losses,
            dlogits,
            n,
            v,
            ld: v,
            grad_scale,
        })
    }

    /// [`LossOps::cross_entropy`] over rows of `ld ≥ v` logits (`n × ld`) of which only the first
    /// `v` are the vocabulary's: a vocabulary padded to a multiple the GEMMs run fast at. The
    /// padded columns take no part in the softmax or the loss, whatever they hold, and their
    /// gradient is written 0.
    fn cross_entropy_padded(
        &self,
        args: Checked<CrossEntropyPadded<'_, Self::Buffer>>,
    ) -> Result<()>;

    /// [`LossOps::cross_entropy_padded`] with the logits' gradient written over the logits
    /// (llm.c's fused classifier): `logits` (`n × ld`, any float dtype) becomes
    /// `(softmax − onehot(target))·grad_scale` on its first `v` columns and 0 on the padding;
    /// `losses` as there. The same bits as cross_entropy_padded's `dlogits`. A backend that has
    /// it natively needs no second `n × ld` buffer; the default computes into a temporary and
    /// copies it back.
    fn cross_entropy_in_place(
        &self,
        args: Checked<CrossEntropyInPlace<'_, Self::Buffer>>,
    ) -> Result<()> {
        cross_entropy_in_place(self, args)
    }
}

/// [`crate::LossOps::cross_entropy_in_place`] composed of the core ops (its default): the
/// gradient into a temporary, then copied over the logits.
pub fn cross_entropy_in_place<D: LossOps>(
    d: &D,
    args: Checked<CrossEntropyInPlace<'_, D::Buffer>>,
) -> Result<()> {
    let CrossEntropyInPlace {
        logits,
        targets,
        losses,
        n,
        v,
        ld,
        grad_scale,
    } = args.into_inner();
    let len = n.checked_mul(ld).ok_or_else(|| {
        DeviceError::InvalidArgument(format!("cross_entropy_in_place: {n} × {ld} overflows"))
    })?;
    let mut grad = d.alloc(logits.dtype(), len)?;
    d.exec(CrossEntropyPadded {
        logits,
        targets,
        losses,
        dlogits: Some(&mut grad),
        n,
        v,
        ld,
        grad_scale,
    })?;
    d.copy(&grad, 0, logits, 0, len)
}

crate::checked::op_impls! {
    LossOps:
    CrossEntropy<'a> => cross_entropy,
    CrossEntropyPadded<'a> => cross_entropy_padded,
    CrossEntropyInPlace<'a> => cross_entropy_in_place,
}
