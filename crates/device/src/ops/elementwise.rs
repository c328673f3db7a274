//! Elementwise ops: scaling, sums, biases and GELU.

use crate::*;

pub trait ElementwiseOps: Runtime {
    /// `x *= alpha` in place.
    fn scale(&self, x: &mut Self::Buffer, alpha: f32) -> Result<()>;

    /// `out = a + b` (residual connection). All three share a dtype and length.
    fn add(&self, a: &Self::Buffer, b: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `dst += src` (accumulate a gradient).
    fn add_assign(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<()>;

    /// `x[r, :] += bias` for every row of `x` (`rows × c`).
    fn bias_add(
        &self,
        x: &mut Self::Buffer,
        bias: &Self::Buffer,
        rows: usize,
        c: usize,
    ) -> Result<()>;

    /// Accumulates `dbias += Σ_rows dout[r, :]`.
    fn bias_backward(
        &self,
        dout: &Self::Buffer,
        dbias: &mut Self::Buffer,
        rows: usize,
        c: usize,
    ) -> Result<()>;

    /// `out = gelu(x)` with the tanh approximation.
    fn gelu_forward(&self, x: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `dx = gelu'(x) · dout` (overwrites `dx`).
    fn gelu_backward(
        &self,
        x: &Self::Buffer,
        dout: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<()>;
}
