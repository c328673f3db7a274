//! Normalisation layers (LayerNorm).

use crate::*;

/// The arguments of [`NormOps::layernorm_forward`]; [`Check::check`] validates them.
pub struct LayerNormForward<'a, B> {
    pub x: &'a B,
    pub gamma: &'a B,
    pub beta: &'a B,
    pub out: &'a mut B,
    pub mean: &'a mut B,
    pub rstd: &'a mut B,
    pub n: usize,
    pub c: usize,
    pub eps: f32,
}

impl<B: Buffer> Check for LayerNormForward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("layernorm_forward", self.n, self.c)?.validate_layernorm_forward(
            self.x,
            self.gamma,
            self.beta,
            Some(&*self.out),
            &*self.mean,
            &*self.rstd,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`NormOps::layernorm_backward`]; [`Check::check`] validates them.
pub struct LayerNormBackward<'a, B> {
    pub dout: &'a B,
    pub x: &'a B,
    pub gamma: &'a B,
    pub mean: &'a B,
    pub rstd: &'a B,
    pub dx: &'a mut B,
    pub dgamma: &'a mut B,
    pub dbeta: &'a mut B,
    pub n: usize,
    pub c: usize,
}

impl<B: Buffer> Check for LayerNormBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("layernorm_backward", self.n, self.c)?.validate_layernorm_backward(
            self.dout,
            self.x,
            self.gamma,
            self.mean,
            self.rstd,
            &*self.dx,
            &*self.dgamma,
            &*self.dbeta,
            None,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`NormOps::layernorm_backward_colsum`]; [`Check::check`] validates them.
pub struct LayerNormBackwardColsum<'a, B> {
    pub dout: &'a B,
    pub x: &'a B,
    pub gamma: &'a B,
    pub mean: &'a B,
    pub rstd: &'a B,
    pub dx: &'a mut B,
    pub dgamma: &'a mut B,
    pub dbeta: &'a mut B,
    pub dsum: &'a mut B,
    pub n: usize,
    pub c: usize,
}

impl<B: Buffer> Check for LayerNormBackwardColsum<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("layernorm_backward_colsum", self.n, self.c)?.validate_layernorm_backward(
            self.dout,
            self.x,
            self.gamma,
            self.mean,
            self.rstd,
            &*self.dx,
            &*self.dgamma,
            &*self.dbeta,
            Some(&*self.dsum),
        )?;
        Ok(Checked::new(self))
    }
}

pub trait NormOps: ElementwiseOps {
    /// LayerNorm over the last dimension of `x` (`n × c`): `out = (x − μ)·rstd·γ + β`, saving
    /// `mean` and `rstd` (f32, `n` each) for the backward pass.
    fn layernorm_forward(&self, args: Checked<LayerNormForward<'_, Self::Buffer>>) -> Result<()>;

    /// LayerNorm backward. Accumulates into `dx`, `dgamma` and `dbeta`.
    fn layernorm_backward(&self, args: Checked<LayerNormBackward<'_, Self::Buffer>>) -> Result<()>;

    /// [`NormOps::layernorm_backward`] (accumulating into `dx`, `dgamma` and `dbeta`), and then
    /// `dsum[col] += Σ_rows dx[row, col]` over the `n × c` `dx` *after* the update: the values
    /// left in `dx` (its dtype's rounding), summed in f32. `dsum` (`c`, any float dtype) is the
    /// bias gradient of a linear layer whose output was added to the residual stream this
    /// LayerNorm read: with `dx` the residual-stream gradient (it holds the gradient coming down
    /// the stream and the LayerNorm's input gradient is added), the result is exactly what
    /// [`ElementwiseOps::bias_backward`]`(dx, dsum, n, c)` would compute after the call, without
    /// reading `dx` again.
    ///
    /// `dx`, `dgamma` and `dbeta` are bit-identical to `layernorm_backward`'s. `dsum` is
    /// deterministic (a summation order fixed by the shape), but backends may add the rows in
    /// a different order than `bias_backward`, so it can differ from that op in the last bits.
    /// The default composes the two ops.
    fn layernorm_backward_colsum(
        &self,
        args: Checked<LayerNormBackwardColsum<'_, Self::Buffer>>,
    ) -> Result<()> {
        layernorm_backward_colsum(self, args)
    }
}

/// [`crate::NormOps::layernorm_backward_colsum`] composed of the core ops (its default).
pub fn layernorm_backward_colsum<D: NormOps>(
    d: &D,
    args: Checked<LayerNormBackwardColsum<'_, D::Buffer>>,
) -> Result<()> {
    let LayerNormBackwardColsum {
        dout,
        x,
        gamma,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        dsum,
        n,
        c,
    } = args.into_inner();
    d.exec(LayerNormBackward {
        dout,
        x,
        gamma,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        n,
        c,
    })?;
    d.exec(BiasBackward {
        dout: dx,
        dbias: dsum,
        rows: n,
        c,
    })
}

crate::checked::op_impls! {
    NormOps:
    LayerNormForward<'a> => layernorm_forward,
    LayerNormBackward<'a> => layernorm_backward,
    LayerNormBackwardColsum<'a> => layernorm_backward_colsum,
}
