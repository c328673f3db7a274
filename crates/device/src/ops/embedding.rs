//! Token and position embeddings.

use crate::*;

/// The arguments of [`EmbeddingOps::embedding_forward`]; [`Check::check`] validates them.
pub struct EmbeddingForward<'a, B> {
    pub tokens: &'a B,
    pub wte: &'a B,
    pub wpe: &'a B,
    pub out: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub c: usize,
}

impl<B: Buffer> Check for EmbeddingForward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        TokensDesc::new("embedding_forward", self.b, self.t, self.c)?.validate(
            self.tokens,
            self.wte,
            self.wpe,
            &*self.out,
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`EmbeddingOps::embedding_backward`]; [`Check::check`] validates them.
pub struct EmbeddingBackward<'a, B> {
    pub tokens: &'a B,
    pub dout: &'a B,
    pub dwte: &'a mut B,
    pub dwpe: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub c: usize,
}

impl<B: Buffer> Check for EmbeddingBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        TokensDesc::new("embedding_backward", self.b, self.t, self.c)?.validate(
            self.tokens,
            &*self.dwte,
            &*self.dwpe,
            self.dout,
        )?;
        Ok(Checked::new(self))
    }
}

pub trait EmbeddingOps: Runtime {
    /// `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]` for `tokens` (i32, `b·t`), `out` (`b·t × c`).
    fn embedding_forward(&self, args: Checked<EmbeddingForward<'_, Self::Buffer>>) -> Result<()>;

    /// Accumulates `dwte[tokens[b,t],:] += dout[b,t,:]` and `dwpe[t,:] += Σ_b dout[b,t,:]`.
    /// Deterministic: the result does not depend on thread scheduling.
    fn embedding_backward(&self, args: Checked<EmbeddingBackward<'_, Self::Buffer>>) -> Result<()>;
}

crate::checked::op_impls! {
    EmbeddingOps:
    EmbeddingForward<'a> => embedding_forward,
    EmbeddingBackward<'a> => embedding_backward,
}
