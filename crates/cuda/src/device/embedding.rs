//! Token and position embedding backward (kernels-cuda/embedding.cu).

use super::*;

impl CudaDevice {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn embedding_backward_impl(
        &self,
        tokens: &CudaBuffer,
        dout: &CudaBuffer,
        dwte: &mut CudaBuffer,
        dwpe: &mut CudaBuffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_backward";
        let act = dout.dtype();
        let sa = float_sfx(OP, act)?;
        let sg = wide_sfx(OP, act, "dwte", dwte.dtype())?;
        check_dtype(OP, dwpe, dwte.dtype())?;
        check_dtype(OP, tokens, DType::I32)?;
        let bt = mul(OP, &[b, t])?;
        let total = mul(OP, &[bt, c])?;
        let tc = mul(OP, &[t, c])?;
        check_len(OP, "tokens", tokens, bt)?;
        check_len(OP, "dout", dout, total)?;
        if c == 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "c must be positive".into(),
            });
        }
        if dwte.is_empty() || !dwte.len().is_multiple_of(c) {
            return Err(DeviceError::Shape {
                op: OP,
                detail: format!(
                    "token table has {} elements, not a positive multiple of c = {c}",
                    dwte.len()
                ),
            });
        }
        check_min_len(OP, "position table", dwpe, tc)?;
        if bt == 0 {
            return Ok(());
        }
        let n = dim(OP, "b·t", bt)?;
        let vocab = dim(OP, "vocab", dwte.len() / c)?;
        let mut scratch = lock(&self.scratch, OP)?;
        let sorted = scratch.get(&self.ctx, &self.stream, align_up(bt * 4), &self.mem)?;
        let sort = self.func(KernelModule::Embedding, "embedding_sort_positions")?;
        // SAFETY: embedding_sort_positions(const int*, int*, int n): reads n tokens, writes a
        // permutation of 0..n into the n-int scratch area.
        unsafe {
            kernels::launch(
                &self.stream,
                &sort,
                cfg((grid_dim(OP, bt.div_ceil(256))?, 1, 1), (256, 1, 1)),
                &[tokens.ptr().into(), sorted.into(), n.into()],
            )?;
        }
        let wte_k = self.func(
            KernelModule::Embedding,
            &format!("embedding_backward_wte_{sa}_{sg}"),
        )?;
        let block = (c.div_ceil(32) * 32).clamp(32, 256);
        // SAFETY: embedding_backward_wte(const int*, const int*, const A*, G*, int n, int c,
        // int vocab, unsigned*): reads dout rows < n (b·t·c elements) and updates dwte rows
        // < vocab (dwte = vocab·c); columns < c.
        unsafe {
            kernels::launch(
                &self.stream,
                &wte_k,
                cfg(
                    (grid_dim(OP, bt)?, grid_dim(OP, c.div_ceil(block))?, 1),
                    (block as u32, 1, 1),
                ),
                &[
                    tokens.ptr().into(),
                    sorted.into(),
                    dout.ptr().into(),
                    dwte.ptr().into(),
                    n.into(),
                    dim(OP, "c", c)?.into(),
                    vocab.into(),
                    self.err_word.ptr().into(),
                ],
            )?;
        }
        // dwpe[t, :] += Σ_b dout[b, t, :]: a column sum of dout seen as b × (t·c). The scratch
        // area is re-sized for it; the sort output is no longer needed (stream order).
        // SAFETY: dout holds b × (t·c) elements, dwpe at least t·c.
        unsafe {
            self.column_sum(
                OP,
                &mut scratch,
                dout.ptr(),
                act,
                dwpe.ptr(),
                dwpe.dtype(),
                b,
                tc,
            )
        }
    }
}
