//! LayerNorm forward and backward (kernels-cuda/layernorm.cu).

use super::*;

impl CudaDevice {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layernorm_forward_impl(
        &self,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        beta: &CudaBuffer,
        out: &mut CudaBuffer,
        mean: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_forward";
        let act = x.dtype();
        let sa = float_sfx(OP, act)?;
        let sp = wide_sfx(OP, act, "gamma", gamma.dtype())?;
        check_dtype(OP, beta, gamma.dtype())?;
        check_dtype(OP, out, act)?;
        check_dtype(OP, mean, DType::F32)?;
        check_dtype(OP, rstd, DType::F32)?;
        let total = mul(OP, &[n, c])?;
        if c == 0 && n > 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "c must be positive".into(),
            });
        }
        check_len(OP, "x", x, total)?;
        check_len(OP, "gamma", gamma, c)?;
        check_len(OP, "beta", beta, c)?;
        check_len(OP, "out", out, total)?;
        check_len(OP, "mean", mean, n)?;
        check_len(OP, "rstd", rstd, n)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.func(
            KernelModule::LayerNorm,
            &format!("layernorm_forward_{sa}_{sp}"),
        )?;
        // SAFETY: layernorm_forward(const A*, const P*, const P*, A*, float*, float*, int n,
        // int c, float eps): one warp per row < n; x/out hold n·c, gamma/beta c, mean/rstd n.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg(
                    (grid_dim(OP, n.div_ceil(ROWS_PER_BLOCK))?, 1, 1),
                    (ROW_BLOCK, 1, 1),
                ),
                &[
                    x.ptr().into(),
                    gamma.ptr().into(),
                    beta.ptr().into(),
                    out.ptr().into(),
                    mean.ptr().into(),
                    rstd.ptr().into(),
                    dim(OP, "n", n)?.into(),
                    dim(OP, "c", c)?.into(),
                    eps.into(),
                ],
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn layernorm_backward_impl(
        &self,
        dout: &CudaBuffer,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        mean: &CudaBuffer,
        rstd: &CudaBuffer,
        dx: &mut CudaBuffer,
        dgamma: &mut CudaBuffer,
        dbeta: &mut CudaBuffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "layernorm_backward";
        let act = dout.dtype();
        let sa = float_sfx(OP, act)?;
        let sp = wide_sfx(OP, act, "gamma", gamma.dtype())?;
        wide_sfx(OP, act, "dgamma", dgamma.dtype())?;
        check_dtype(OP, dbeta, dgamma.dtype())?;
        same_dtype(OP, act, &[x, dx])?;
        check_dtype(OP, mean, DType::F32)?;
        check_dtype(OP, rstd, DType::F32)?;
        let total = mul(OP, &[n, c])?;
        if c == 0 && n > 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "c must be positive".into(),
            });
        }
        check_len(OP, "dout", dout, total)?;
        check_len(OP, "x", x, total)?;
        check_len(OP, "gamma", gamma, c)?;
        check_len(OP, "dx", dx, total)?;
        check_len(OP, "dgamma", dgamma, c)?;
        check_len(OP, "dbeta", dbeta, c)?;
        check_len(OP, "mean", mean, n)?;
        check_len(OP, "rstd", rstd, n)?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ci) = (dim(OP, "n", n)?, dim(OP, "c", c)?);
        let f = self.func(
            KernelModule::LayerNorm,
            &format!("layernorm_backward_dx_{sa}_{sp}"),
        )?;
        // SAFETY: layernorm_backward_dx(const A*, const A*, const P*, const float*, const float*,
        // A*, int n, int c): one warp per row < n over buffers of n·c / c / n elements.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg(
                    (grid_dim(OP, n.div_ceil(ROWS_PER_BLOCK))?, 1, 1),
                    (ROW_BLOCK, 1, 1),
                ),
                &[
                    dout.ptr().into(),
                    x.ptr().into(),
                    gamma.ptr().into(),
                    mean.ptr().into(),
                    rstd.ptr().into(),
                    dx.ptr().into(),
                    ni.into(),
                    ci.into(),
                ],
            )?;
        }
        let rpc = rows_per_chunk(n);
        let chunks = n.div_ceil(rpc);
        let part_bytes = align_up(chunks * c * 4);
        let mut scratch = lock(&self.scratch, OP)?;
        let pg = scratch.get(&self.ctx, &self.stream, 2 * part_bytes, &self.mem)?;
        let pb = pg + part_bytes as u64;
        let fp = self.func(
            KernelModule::LayerNorm,
            &format!("layernorm_dparams_partial_{sa}"),
        )?;
        // SAFETY: layernorm_dparams_partial(const A*, const A*, const float*, const float*,
        // float*, float*, int n, int c, int rows_per_chunk): reads n·c / n elements, writes
        // chunks·c floats to each of the two scratch areas.
        unsafe {
            kernels::launch(
                &self.stream,
                &fp,
                cfg(
                    (grid_dim(OP, c.div_ceil(32))?, grid_dim(OP, chunks)?, 1),
                    (32, 8, 1),
                ),
                &[
                    dout.ptr().into(),
                    x.ptr().into(),
                    mean.ptr().into(),
                    rstd.ptr().into(),
                    pg.into(),
                    pb.into(),
                    ni.into(),
                    ci.into(),
                    dim(OP, "rows per chunk", rpc)?.into(),
                ],
            )?;
        }
        for (partial, out) in [(pg, &*dgamma), (pb, &*dbeta)] {
            // SAFETY: chunks·c partials, c outputs of the gradient's dtype (checked above).
            unsafe { self.colsum_finish(OP, partial, out.ptr(), out.dtype(), chunks, c)? };
        }
        Ok(())
    }
}
