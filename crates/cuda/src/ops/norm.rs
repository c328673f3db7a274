//! [`NormOps`] for [`CudaDevice`]: LayerNorm forward and backward (kernels-cuda/layernorm.cu).
//!
//! Fast path: the row is held in registers by a group of `g` warps, each thread owning `m`
//! vectors of the row ([`plan`]); the backward is one kernel over fixed chunks of rows (dx plus
//! one dgamma/dbeta partial row per chunk) and one finish kernel for both parameter gradients.
//! Rows too wide for the fast kernels use the original warp-per-row kernels. Every choice
//! depends on the shape and dtypes only (buffers are allocation-aligned), so the summation
//! orders are fixed and the results bit-reproducible.

use super::prelude::*;

use duet_gpu::layernorm_plan::{
    LN_BWD_WARPS, LN_FWD_MAX_VECTORS, Plan, aligned16, ln_rows_per_chunk,
};
pub(crate) use duet_gpu::layernorm_plan::{LN_WARPS, plan};

impl CudaDevice {
    /// The row statistics (mean, rstd) of `layernorm_forward` with the vectorised plan `p`, no
    /// output (`layernorm_stats_<act>_v`): the first launch of the split LayerNorm + FP8 path
    /// (ops/fp8.rs), whose caller has checked x (n·c elements, 16-byte aligned), mean and
    /// rstd (n f32 each).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_stats(
        &self,
        x: &CudaBuffer,
        mean: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        n: usize,
        c: usize,
        eps: f32,
        p: Plan,
    ) -> Result<()> {
        const OP: &str = "layernorm_forward_fp8";
        debug_assert!(p.vec && p.m <= LN_FWD_MAX_VECTORS);
        let sa = float_suffix(OP, x.dtype())?;
        let f = self.func(KernelModule::LayerNorm, &format!("layernorm_stats_{sa}_v"))?;
        let (groups, threads) = p.block(LN_WARPS);
        // SAFETY: layernorm_stats_A_v(const A* x, float* mean, float* rstd, int n, int c,
        // float eps, int G): x holds n·c elements, mean/rstd n (checked by the caller); block b
        // reads rows [groups·b, groups·b + groups) ∩ [0, n) with 16-byte loads (the plan is
        // vectorised: x 16-byte aligned, c a multiple of the vector width) of at most the
        // plan's vectors per thread (≤ LN_FWD_MAX_VECTORS, the kernel's M); ⌊8 / G⌋ groups of
        // G warps, ≤ 256 threads.
        unsafe {
            self.launcher(&f)
                .grid((grid_dim(OP, n.div_ceil(groups))?, 1, 1))
                .block((threads, 1, 1))
                .arg_buf(x)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_i32(dim(OP, "n", n)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_f32(eps)
                .arg_i32(p.g as i32)
                .launch()
        }
    }

    /// LayerNorm backward; with `dsum`, also `dsum += Σ_rows dx` of the updated `dx`
    /// ([`duet_device::NormOps::layernorm_backward_colsum`]). dx, dgamma and dbeta get the same bits either
    /// way: the vectorised fast path's `layernorm_bwdsum_*` kernels are `layernorm_bwd_*` plus a
    /// third partial row (the column sums of the stored dx, added in dbeta's order), finished
    /// with dgamma's and dbeta's arithmetic by `layernorm_dparams_finish3_*`; the other paths
    /// (single elements, rows too wide) add a separate column sum of dx (`bias_backward`).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_into(
        &self,
        dout: &CudaBuffer,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        mean: &CudaBuffer,
        rstd: &CudaBuffer,
        dx: &mut CudaBuffer,
        dgamma: &mut CudaBuffer,
        dbeta: &mut CudaBuffer,
        mut dsum: Option<&mut CudaBuffer>,
        n: usize,
        c: usize,
    ) -> Result<()> {
        let op: &'static str = match dsum {
            Some(_) => "layernorm_backward_colsum",
            None => "layernorm_backward",
        };
        let act = dout.dtype();
        let sa = float_suffix(op, act)?;
        // The kernels take x, dout and dx in one dtype, gamma and the parameter gradients
        // (dgamma and dbeta in one dtype) in the activations' dtype or f32.
        let sp = wide_suffix(op, act, "gamma", gamma.dtype())?;
        wide_suffix(op, act, "dgamma", dgamma.dtype())?;
        check_dtype(op, dbeta, dgamma.dtype())?;
        same_dtype(op, act, &[x, dx])?;
        let ss = match &dsum {
            Some(ds) => Some(float_suffix(op, ds.dtype())?),
            None => None,
        };
        if n == 0 {
            return Ok(());
        }
        let (ni, ci) = (dim(op, "n", n)?, dim(op, "c", c)?);
        let aligned = aligned16(&[dout.ptr(), x.ptr(), gamma.ptr(), dx.ptr()]);
        let fast = plan(c, act, aligned, true);
        if let (Some(p), Some(dsum)) = (fast, dsum.as_deref_mut())
            && !p.vec
        {
            // layernorm_bwdsum_* exist for the vectorised plans only: the backward, then the
            // column sum of the new dx.
            self.layernorm_backward_into(
                dout, x, gamma, mean, rstd, dx, dgamma, dbeta, None, n, c,
            )?;
            return self.exec(BiasBackward {
                dout: dx,
                dbias: dsum,
                rows: n,
                c,
            });
        }
        if let Some(p) = fast {
            let sg = float_suffix(op, dgamma.dtype())?;
            let rpc = ln_rows_per_chunk(n);
            let chunks = n.div_ceil(rpc);
            let part_bytes = align_up(chunks * c * 4);
            let areas = if dsum.is_some() { 3 } else { 2 };
            let mut scratch = lock(&self.scratch, op)?;
            let pg = scratch.get(&self.ctx, &self.stream, areas * part_bytes, &self.mem)?;
            let pb = pg + part_bytes as u64;
            let ps = pb + part_bytes as u64;
            let pass = if dsum.is_some() { "bwdsum" } else { "bwd" };
            let f = self.func(KernelModule::LayerNorm, &p.kernel(pass, sa, sp))?;
            let (_, threads) = p.block(LN_BWD_WARPS);
            let mut args = vec![
                Arg::U64(dout.ptr()),
                Arg::U64(x.ptr()),
                Arg::U64(gamma.ptr()),
                Arg::U64(mean.ptr()),
                Arg::U64(rstd.ptr()),
                Arg::U64(dx.ptr()),
                Arg::U64(pg),
                Arg::U64(pb),
            ];
            if dsum.is_some() {
                args.push(Arg::U64(ps));
            }
            args.extend([
                Arg::I32(ni),
                Arg::I32(ci),
                Arg::I32(dim(op, "rows per chunk", rpc)?),
                Arg::I32(p.g as i32),
            ]);
            // SAFETY: layernorm_bwd_*(const A*, const A*, const P*, const float*, const float*,
            // A*, float*, float*, int n, int c, int rpc, int G), and layernorm_bwdsum_* with a
            // third float* (ps) after pb: block b handles rows [b·rpc, min(n, (b+1)·rpc)) of
            // buffers holding n·c / c / n elements and writes row b of the two (three) chunks × c
            // f32 partial areas (scratch of `areas`·part_bytes); vector accesses only when
            // `aligned` and c is a multiple of the vector width (`plan`).
            unsafe {
                self.launcher(&f)
                    .grid((grid_dim(op, chunks)?, 1, 1))
                    .block((threads, 1, 1))
                    .args(&args)
                    .launch()?;
            }
            let cgrid = grid_dim(op, c.div_ceil(32))?;
            let chunks = dim(op, "chunks", chunks)?;
            // The finish: dgamma and dbeta (and dsum) from their partial areas.
            let mut fargs = vec![Arg::U64(pg), Arg::U64(pb)];
            let name = match (dsum, ss) {
                (Some(dsum), Some(ss)) => {
                    fargs.extend([
                        Arg::U64(ps),
                        Arg::U64(dgamma.ptr()),
                        Arg::U64(dbeta.ptr()),
                        Arg::U64(dsum.ptr()),
                    ]);
                    format!("layernorm_dparams_finish3_{sg}_{ss}")
                }
                _ => {
                    fargs.extend([Arg::U64(dgamma.ptr()), Arg::U64(dbeta.ptr())]);
                    format!("layernorm_dparams_finish_{sg}")
                }
            };
            fargs.extend([Arg::I32(chunks), Arg::I32(ci)]);
            let ff = self.func(KernelModule::LayerNorm, &name)?;
            // SAFETY: layernorm_dparams_finish(const float*, const float*, G*, G*, int chunks,
            // int c), and layernorm_dparams_finish3 with a third area (ps) after pb and a third
            // output dsum (dtype U) after dbeta: block (32, 32), grid (⌈c/32⌉, areas); reads
            // chunks·c partials from each area and updates c elements of dgamma, dbeta (dtype
            // G) and dsum, checked above.
            return unsafe {
                self.launcher(&ff)
                    .grid((cgrid, areas as u32, 1))
                    .block((32, 32, 1))
                    .args(&fargs)
                    .launch()
            };
        }
        // Rows too wide for the fused kernel: dx with one warp per row, then the parameter
        // gradients in two passes.
        // SAFETY: layernorm_backward_dx(const A*, const A*, const P*, const float*, const float*,
        // A*, int n, int c): one warp per row < n over buffers of n·c / c / n elements.
        unsafe {
            self.kernel(
                KernelModule::LayerNorm,
                &format!("layernorm_backward_dx_{sa}_{sp}"),
            )?
            .grid(rows_grid(op, n)?)
            .block((ROW_BLOCK, 1, 1))
            .arg_buf(dout)
            .arg_buf(x)
            .arg_buf(gamma)
            .arg_buf(mean)
            .arg_buf(rstd)
            .arg_buf(dx)
            .arg_i32(ni)
            .arg_i32(ci)
            .launch()?;
        }
        let rpc = rows_per_chunk(n);
        let chunks = n.div_ceil(rpc);
        let part_bytes = align_up(chunks * c * 4);
        let mut scratch = lock(&self.scratch, op)?;
        let pg = scratch.get(&self.ctx, &self.stream, 2 * part_bytes, &self.mem)?;
        let pb = pg + part_bytes as u64;
        // SAFETY: layernorm_dparams_partial(const A*, const A*, const float*, const float*,
        // float*, float*, int n, int c, int rows_per_chunk): reads n·c / n elements, writes
        // chunks·c floats to each of the two scratch areas.
        unsafe {
            self.kernel(
                KernelModule::LayerNorm,
                &format!("layernorm_dparams_partial_{sa}"),
            )?
            .grid((grid_dim(op, c.div_ceil(32))?, grid_dim(op, chunks)?, 1))
            .block((32, 8, 1))
            .arg_buf(dout)
            .arg_buf(x)
            .arg_buf(mean)
            .arg_buf(rstd)
            .arg_ptr(pg)
            .arg_ptr(pb)
            .arg_i32(ni)
            .arg_i32(ci)
            .arg_i32(dim(op, "rows per chunk", rpc)?)
            .launch()?;
        }
        for (partial, out) in [(pg, &*dgamma), (pb, &*dbeta)] {
            // SAFETY: chunks·c partials, c outputs of the gradient's dtype (checked above).
            unsafe { self.colsum_finish(op, partial, out.ptr(), out.dtype(), chunks, c)? };
        }
        drop(scratch);
        // The column sum of the updated dx: the separate column-sum kernels (queued after the
        // dx kernel on the same stream).
        match dsum {
            Some(dsum) => self.exec(BiasBackward {
                dout: dx,
                dbias: dsum,
                rows: n,
                c,
            }),
            None => Ok(()),
        }
    }
}

impl NormOps for CudaDevice {
    fn layernorm_forward(&self, args: Checked<LayerNormForward<'_, Self::Buffer>>) -> Result<()> {
        let LayerNormForward {
            x,
            gamma,
            beta,
            out,
            mean,
            rstd,
            n,
            c,
            eps,
        } = args.into_inner();
        const OP: &str = "layernorm_forward";
        let act = x.dtype();
        let sa = float_suffix(OP, act)?;
        // The kernels take gamma and beta in one dtype, the activations' or f32, and write
        // `out` in the activations' dtype.
        let sp = wide_suffix(OP, act, "gamma", gamma.dtype())?;
        check_dtype(OP, beta, gamma.dtype())?;
        check_dtype(OP, out, act)?;
        if n == 0 {
            return Ok(());
        }
        let aligned = aligned16(&[x.ptr(), gamma.ptr(), beta.ptr(), out.ptr()]);
        if let Some(p) = plan(c, act, aligned, false) {
            let f = self.func(KernelModule::LayerNorm, &p.kernel("fwd", sa, sp))?;
            let (groups, threads) = p.block(LN_WARPS);
            // SAFETY: layernorm_fwd_*(const A*, const P*, const P*, A*, float*, float*, int n,
            // int c, float eps, int G): rows < n, `groups` rows of G warps per block; x/out hold
            // n·c, gamma/beta c, mean/rstd n elements; vector accesses only when `aligned` and
            // c is a multiple of the vector width (`plan`).
            return unsafe {
                self.launcher(&f)
                    .grid((grid_dim(OP, n.div_ceil(groups))?, 1, 1))
                    .block((threads, 1, 1))
                    .arg_buf(x)
                    .arg_buf(gamma)
                    .arg_buf(beta)
                    .arg_buf(out)
                    .arg_buf(mean)
                    .arg_buf(rstd)
                    .arg_i32(dim(OP, "n", n)?)
                    .arg_i32(dim(OP, "c", c)?)
                    .arg_f32(eps)
                    .arg_i32(p.g as i32)
                    .launch()
            };
        }
        // Rows too wide for the fast kernel: one warp per row.
        // SAFETY: layernorm_forward(const A*, const P*, const P*, A*, float*, float*, int n,
        // int c, float eps): one warp per row < n; x/out hold n·c, gamma/beta c, mean/rstd n.
        unsafe {
            self.kernel(
                KernelModule::LayerNorm,
                &format!("layernorm_forward_{sa}_{sp}"),
            )?
            .grid(rows_grid(OP, n)?)
            .block((ROW_BLOCK, 1, 1))
            .arg_buf(x)
            .arg_buf(gamma)
            .arg_buf(beta)
            .arg_buf(out)
            .arg_buf(mean)
            .arg_buf(rstd)
            .arg_i32(dim(OP, "n", n)?)
            .arg_i32(dim(OP, "c", c)?)
            .arg_f32(eps)
            .launch()
        }
    }

    fn layernorm_backward(&self, args: Checked<LayerNormBackward<'_, Self::Buffer>>) -> Result<()> {
        let LayerNormBackward {
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
        } = args.into_inner();
        self.layernorm_backward_into(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, None, n, c)
    }

    fn layernorm_backward_colsum(
        &self,
        args: Checked<LayerNormBackwardColsum<'_, Self::Buffer>>,
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
        self.layernorm_backward_into(
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            Some(dsum),
            n,
            c,
        )
    }
}
