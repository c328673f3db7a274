//! Elementwise ops: scaling, sums, biases and GELU.

use crate::args::*;
use crate::*;

/// The arguments of [`ElementwiseOps::scale`]; [`Check::check`] validates them.
pub struct Scale<'a, B> {
    pub x: &'a mut B,
    pub alpha: f32,
}

impl<B: Buffer> Check for Scale<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::add`]; [`Check::check`] validates them.
pub struct Add<'a, B> {
    pub a: &'a B,
    pub b: &'a B,
    pub out: &'a mut B,
}

impl<B: Buffer> Check for Add<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_add(self.a, self.b, &*self.out)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::add_assign`]; [`Check::check`] validates them.
pub struct AddAssign<'a, B> {
    pub dst: &'a mut B,
    pub src: &'a B,
}

impl<B: Buffer> Check for AddAssign<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_add_assign(&*self.dst, self.src)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::bias_add`]; [`Check::check`] validates them.
pub struct BiasAdd<'a, B> {
    pub x: &'a mut B,
    pub bias: &'a B,
    pub rows: usize,
    pub c: usize,
}

impl<B: Buffer> Check for BiasAdd<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("bias_add", self.rows, self.c)?.validate_bias_add(&*self.x, self.bias)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::bias_backward`]; [`Check::check`] validates them.
pub struct BiasBackward<'a, B> {
    pub dout: &'a B,
    pub dbias: &'a mut B,
    pub rows: usize,
    pub c: usize,
}

impl<B: Buffer> Check for BiasBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        RowsDesc::new("bias_backward", self.rows, self.c)?
            .validate_bias_backward(self.dout, &*self.dbias)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::gelu_forward`]; [`Check::check`] validates them.
pub struct GeluForward<'a, B> {
    pub x: &'a B,
    pub out: &'a mut B,
}

impl<B: Buffer> Check for GeluForward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_gelu_forward(self.x, &*self.out)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`ElementwiseOps::gelu_backward`]; [`Check::check`] validates them.
pub struct GeluBackward<'a, B> {
    pub x: &'a B,
    pub dout: &'a B,
    pub dx: &'a mut B,
}

impl<B: Buffer> Check for GeluBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        validate_gelu_backward(self.x, self.dout, &*self.dx)?;
        Ok(Checked::new(self))
    }
}

pub trait ElementwiseOps: Runtime {
    /// `x *= alpha` in place.
    fn scale(&self, args: Checked<Scale<'_, Self::Buffer>>) -> Result<()>;

    /// `out = a + b` (residual connection). All three share a dtype and length.
    fn add(&self, args: Checked<Add<'_, Self::Buffer>>) -> Result<()>;

    /// `dst += src` (accumulate a gradient).
    fn add_assign(&self, args: Checked<AddAssign<'_, Self::Buffer>>) -> Result<()>;

    /// `x[r, :] += bias` for every row of `x` (`rows × c`).
    fn bias_add(&self, args: Checked<BiasAdd<'_, Self::Buffer>>) -> Result<()>;

    /// Accumulates `dbias += Σ_rows dout[r, :]`.
    fn bias_backward(&self, args: Checked<BiasBackward<'_, Self::Buffer>>) -> Result<()>;

    /// `out = gelu(x)` with the tanh approximation.
    fn gelu_forward(&self, args: Checked<GeluForward<'_, Self::Buffer>>) -> Result<()>;

    /// `dx = gelu'(x) · dout` (overwrites `dx`).
    fn gelu_backward(&self, args: Checked<GeluBackward<'_, Self::Buffer>>) -> Result<()>;
}

crate::checked::op_impls! {
    ElementwiseOps:
    Scale<'a> => scale,
    Add<'a> => add,
    AddAssign<'a> => add_assign,
    BiasAdd<'a> => bias_add,
    BiasBackward<'a> => bias_backward,
    GeluForward<'a> => gelu_forward,
    GeluBackward<'a> => gelu_backward,
}
