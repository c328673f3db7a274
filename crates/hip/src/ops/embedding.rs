//! [`duet_device::EmbeddingOps`] on HIP: token and position embedding, forward and backward
//! (kernels-hip/embedding.hip).
//!
//! The backward adds each token's rows in position order without atomics (one block per
//! position; only the block of a token's first occurrence works); the position gradient is a
//! column sum (reduce.hip).

use super::prelude::*;

impl EmbeddingOps for HipDevice {
    fn embedding_forward(&self, args: Checked<EmbeddingForward<'_, Self::Buffer>>) -> Result<()> {
        let EmbeddingForward {
            tokens,
            wte,
            wpe,
            out,
            b,
            t,
            c,
        } = args.into_inner();
        const OP: &str = "embedding_forward";
        let vocab = wte.len() / c;
        // The kernels take the tables in one dtype, the activations' or f32.
        check_dtype(OP, wpe, wte.dtype())?;
        let sa = float_suffix(OP, out.dtype())?;
        let sp = wide_suffix(OP, out.dtype(), "wte", wte.dtype())?;
        let bt = b * t;
        if bt == 0 {
            return Ok(());
        }
        self.queue_id_check(OP, tokens, vocab, false)?;
        // SAFETY: embedding_forward_A_P(const int* tokens, const P* wte, const P* wpe, A* out,
        // int t, int c, int vocab): one block per position < b·t; tokens hold b·t ids, each
        // row reads wte[tok·c..] only for 0 ≤ tok < vocab (the kernel checks; wte holds
        // vocab·c) and wpe[(p % t)·c..] (wpe ≥ t·c), and writes out[p·c..] (out = b·t·c).
        unsafe {
            self.kernel(&format!("{OP}_{sa}_{sp}"))?
                .grid(rows_grid(OP, bt)?)
                .arg_buf(tokens)
                .arg_buf(wte)
                .arg_buf(wpe)
                .arg_buf(out)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_i32(dim(OP, "vocab", vocab)?)
                .launch()
        }
    }

    fn embedding_backward(&self, args: Checked<EmbeddingBackward<'_, Self::Buffer>>) -> Result<()> {
        let EmbeddingBackward {
            tokens,
            dout,
            dwte,
            dwpe,
            b,
            t,
            c,
        } = args.into_inner();
        const OP: &str = "embedding_backward";
        let vocab = dwte.len() / c;
        let sa = float_suffix(OP, dout.dtype())?;
        // The kernels take dwte in the activations' dtype or f32.
        let sg = wide_suffix(OP, dout.dtype(), "dwte", dwte.dtype())?;
        let bt = b * t;
        if bt == 0 {
            return Ok(());
        }
        self.queue_id_check(OP, tokens, vocab, false)?;
        // SAFETY: embedding_backward_wte_A_G(const int* tokens, const A* dout, G* dwte, int n,
        // int c, int vocab): one block per position p < n = b·t; tokens hold n ids, dout n·c
        // elements; a block updates dwte[tok·c..] only for 0 ≤ tok < vocab (the kernel checks;
        // dwte holds vocab·c).
        unsafe {
            self.kernel(&format!("embedding_backward_wte_{sa}_{sg}"))?
                .grid(rows_grid(OP, bt)?)
                .arg_buf(tokens)
                .arg_buf(dout)
                .arg_buf(dwte)
                .arg_i32(dim(OP, "b·t", bt)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_i32(dim(OP, "vocab", vocab)?)
                .launch()?;
        };
        // dwpe[t, :] += Σ_b dout[b, t, :]: a column sum over b rows of t·c columns.
        self.column_sum(OP, dout, b, t * c, dwpe)
    }
}
