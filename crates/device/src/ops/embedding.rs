//! Token and position embeddings.

use crate::*;

pub trait EmbeddingOps: Runtime {
    /// `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]` for `tokens` (i32, `b·t`), `out` (`b·t × c`).
    #[allow(clippy::too_many_arguments)]
    fn embedding_forward(
        &self,
        tokens: &Self::Buffer,
        wte: &Self::Buffer,
        wpe: &Self::Buffer,
        out: &mut Self::Buffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()>;

    /// Accumulates `dwte[tokens[b,t],:] += dout[b,t,:]` and `dwpe[t,:] += Σ_b dout[b,t,:]`.
    /// Deterministic: the result does not depend on thread scheduling.
    #[allow(clippy::too_many_arguments)]
    fn embedding_backward(
        &self,
        tokens: &Self::Buffer,
        dout: &Self::Buffer,
        dwte: &mut Self::Buffer,
        dwpe: &mut Self::Buffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()>;
}
