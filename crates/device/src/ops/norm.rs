//! Normalisation layers (LayerNorm).

use crate::*;

pub trait NormOps: ElementwiseOps {
    /// LayerNorm over the last dimension of `x` (`n × c`): `out = (x − μ)·rstd·γ + β`, saving
    /// `mean` and `rstd` (f32, `n` each) for the backward pass.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        out: &mut Self::Buffer,
        mean: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()>;

    /// LayerNorm backward. Accumulates into `dx`, `dgamma` and `dbeta`.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        dx: &mut Self::Buffer,
        dgamma: &mut Self::Buffer,
        dbeta: &mut Self::Buffer,
        n: usize,
        c: usize,
    ) -> Result<()>;

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
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_colsum(
        &self,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        dx: &mut Self::Buffer,
        dgamma: &mut Self::Buffer,
        dbeta: &mut Self::Buffer,
        dsum: &mut Self::Buffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        layernorm_backward_colsum(
            self, dout, x, gamma, mean, rstd, dx, dgamma, dbeta, dsum, n, c,
        )
    }
}

/// [`crate::NormOps::layernorm_backward_colsum`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward_colsum<D: NormOps>(
    d: &D,
    dout: &D::Buffer,
    x: &D::Buffer,
    gamma: &D::Buffer,
    mean: &D::Buffer,
    rstd: &D::Buffer,
    dx: &mut D::Buffer,
    dgamma: &mut D::Buffer,
    dbeta: &mut D::Buffer,
    dsum: &mut D::Buffer,
    n: usize,
    c: usize,
) -> Result<()> {
    // A wrong dsum fails before dx is touched.
    RowsDesc::new("layernorm_backward_colsum", n, c)?.validate_layernorm_backward(
        dout,
        x,
        gamma,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        Some(&*dsum),
    )?;
    d.layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, n, c)?;
    d.bias_backward(dx, dsum, n, c)
}
