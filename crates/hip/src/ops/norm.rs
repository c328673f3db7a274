//! [`duet_device::NormOps`] on HIP: LayerNorm forward and backward (kernels-hip/layernorm.hip).
//! The forward runs CUDA's fast path where its plan is vectorised
//! ([`duet_gpu::layernorm_plan`]: the row in registers, 16-byte loads and stores, the same
//! sums in the same order, so CUDA's bits); other rows, and the backward, one 32-lane group per
//! row with the parameter gradients in two deterministic passes (CUDA's row kernels' bits).

use super::prelude::*;
use crate::device::{group_rows_grid, rows_per_chunk};
use duet_gpu::layernorm_plan::{LN_BWD_WARPS, LN_WARPS, Plan, aligned16, ln_rows_per_chunk, plan};
use std::ffi::c_void;

impl NormOps for HipDevice {
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
        let sa = float_suffix(OP, x.dtype())?;
        // The kernels take gamma and beta in one dtype, the activations' or f32, and write
        // `out` in the activations' dtype.
        let sp = wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        same_dtype(OP, gamma.dtype(), &[beta])?;
        same_dtype(OP, x.dtype(), &[out])?;
        if n == 0 {
            return Ok(());
        }
        if let Some(p) = self.ln_vec_plan(&[x, gamma, beta, &*out], x.dtype(), c, false) {
            let (groups, threads) = p.block(LN_WARPS);
            // SAFETY: layernorm_fwd_A_P_vM(const A* x, const P* gamma, const P* beta, A* out,
            // float* mean, float* rstd, int n, int c, float eps, int G): rows < n, `groups` rows
            // of G 32-lane groups per block of `threads` (at most 256); x/out hold n·c,
            // gamma/beta c, mean/rstd n elements (checked); 16-byte accesses only: every
            // buffer is 16-byte aligned and c a multiple of the vector width (ln_vec_plan).
            return unsafe {
                self.kernel(&p.kernel("fwd", sa, sp))?
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
        // SAFETY: layernorm_forward_A_P(const A* x, const P* gamma, const P* beta, A* out,
        // float* mean, float* rstd, int n, int c, float eps): one block per row < n; x/out hold
        // n·c, gamma/beta c, mean/rstd n elements (checked).
        unsafe {
            self.kernel(&format!("{OP}_{sa}_{sp}"))?
                .grid(group_rows_grid(OP, n)?)
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
        const OP: &str = "layernorm_backward";
        let sa = float_suffix(OP, x.dtype())?;
        // The kernels take x, dout and dx in one dtype and gamma in theirs or f32.
        let sp = wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        same_dtype(OP, x.dtype(), &[dout, dx])?;
        if n == 0 {
            return Ok(());
        }
        if let Some(p) = self.ln_vec_plan(&[dout, x, gamma, &*dx], x.dtype(), c, true) {
            return self.layernorm_backward_vec(
                OP,
                p,
                (dout, x, gamma, mean, rstd),
                dx,
                dgamma,
                dbeta,
                None,
                n,
                c,
            );
        }
        let (ni, ci) = (dim(OP, "n", n)?, dim(OP, "c", c)?);
        // SAFETY: layernorm_backward_dx_A_P(const A* dout, const A* x, const P* gamma,
        // const float* mean, const float* rstd, A* dx, int n, int c): one block per row < n;
        // dout/x/dx hold n·c, gamma c, mean/rstd n elements (checked).
        unsafe {
            self.kernel(&format!("layernorm_backward_dx_{sa}_{sp}"))?
                .grid(group_rows_grid(OP, n)?)
                .arg_buf(dout)
                .arg_buf(x)
                .arg_buf(gamma)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_buf(dx)
                .arg_i32(ni)
                .arg_i32(ci)
                .launch()?;
        };
        let rpc = rows_per_chunk(n);
        let chunks = n.div_ceil(rpc);
        let scratch = self.scratch(2 * chunks * c)?;
        let pg = scratch.ptr();
        // SAFETY: the scratch holds 2·chunks·c f32; pb is its second half.
        let pb = unsafe { pg.cast::<f32>().add(chunks * c) }.cast::<c_void>();
        let gx = grid_dim(OP, c.div_ceil(32))?;
        // SAFETY: layernorm_dparams_partial_A(const A* dout, const A* x, const float* mean,
        // const float* rstd, float* pg, float* pb, int n, int c, int rows_per_chunk): reads
        // n·c / n elements (checked), writes chunks·c f32 to each half of the scratch (sized
        // above); 32 columns per block, one grid row per chunk.
        unsafe {
            self.kernel(&format!("layernorm_dparams_partial_{sa}"))?
                .grid((gx.max(1), grid_dim(OP, chunks)?, 1))
                .arg_buf(dout)
                .arg_buf(x)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_ptr(pg)
                .arg_ptr(pb)
                .arg_i32(ni)
                .arg_i32(ci)
                .arg_i32(dim(OP, "rows per chunk", rpc)?)
                .launch()?;
        };
        for (part, out) in [(pg, &*dgamma), (pb, &*dbeta)] {
            let so = float_suffix(OP, out.dtype())?;
            // SAFETY: colsum_finish_G(const float* partial, G* out, u64 chunks, u64 cols): the
            // chunks·c partials written above; out holds c elements (checked).
            unsafe {
                self.kernel(&format!("colsum_finish_{so}"))?
                    .grid((grid_dim(OP, c.div_ceil(32))?, 1, 1))
                    .arg_ptr(part)
                    .arg_buf(out)
                    .arg_u64(chunks as u64)
                    .arg_u64(c as u64)
                    .launch()?;
            };
        }
        Ok(())
    }

    /// [`duet_device::NormOps::layernorm_backward_colsum`]: for a vectorised plan CUDA's
    /// `layernorm_bwdsum_*` (dx, dgamma, dbeta with the plain backward's bits, dsum the column
    /// sums of the stored dx in dbeta's order); otherwise the composition (the backward, then
    /// the column sum of dx).
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
        const OP: &str = "layernorm_backward_colsum";
        float_suffix(OP, x.dtype())?;
        wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        wide_suffix(OP, x.dtype(), "dgamma", dgamma.dtype())?;
        same_dtype(OP, dgamma.dtype(), &[dbeta])?;
        same_dtype(OP, x.dtype(), &[dout, dx])?;
        float_suffix(OP, dsum.dtype())?;
        match self.ln_vec_plan(&[dout, x, gamma, &*dx], x.dtype(), c, true) {
            Some(p) if n > 0 => self.layernorm_backward_vec(
                OP,
                p,
                (dout, x, gamma, mean, rstd),
                dx,
                dgamma,
                dbeta,
                Some(dsum),
                n,
                c,
            ),
            _ => duet_device::composed::layernorm_backward_colsum(
                self,
                LayerNormBackwardColsum {
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
                }
                .check()?,
            ),
        }
    }
}

impl HipDevice {
    /// The plan (forward, or `backward`) of rows of `c` elements of `act` when it is vectorised
    /// (the kernels HIP has of CUDA's fast path) and every buffer is 16-byte aligned.
    pub(crate) fn ln_vec_plan(
        &self,
        bufs: &[&HipBuffer],
        act: DType,
        c: usize,
        backward: bool,
    ) -> Option<Plan> {
        let addrs: Vec<u64> = bufs.iter().map(|b| b.ptr() as u64).collect();
        plan(c, act, aligned16(&addrs), backward).filter(|p| p.vec)
    }

    /// `layernorm_stats_<act>_v`: the vectorised forward's mean and rstd of the n rows of `x`
    /// (no output), for the one-pass LayerNorm + FP8 kernel (ops/fp8.rs) to read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_stats(
        &self,
        op: &'static str,
        p: Plan,
        x: &HipBuffer,
        mean: &HipBuffer,
        rstd: &HipBuffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()> {
        let sa = float_suffix(op, x.dtype())?;
        let (groups, threads) = p.block(LN_WARPS);
        // SAFETY: layernorm_stats_A_v(const A* x, float* mean, float* rstd, int n, int c,
        // float eps, int G): the caller checked x to hold n·c elements (16-byte aligned, c a
        // multiple of the vector width: ln_vec_plan) and mean/rstd n f32; layout as the forward.
        unsafe {
            self.kernel(&format!("layernorm_stats_{sa}_v"))?
                .grid((grid_dim(op, n.div_ceil(groups))?, 1, 1))
                .block((threads, 1, 1))
                .arg_buf(x)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_i32(dim(op, "n", n)?)
                .arg_i32(dim(op, "c", c)?)
                .arg_f32(eps)
                .arg_i32(p.g as i32)
                .launch()
        }
    }

    /// CUDA's fused LayerNorm backward for a vectorised plan `p`: `layernorm_bwd_*` (dx and one
    /// dgamma/dbeta partial row per chunk of [`ln_rows_per_chunk`] rows) then
    /// `layernorm_dparams_finish_*`; with `dsum`, `layernorm_bwdsum_*` (a third partial row:
    /// the column sums of the stored dx) and `layernorm_dparams_finish3_*`. The caller has
    /// validated every buffer for (n, c) and the dtypes the kernels take.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_backward_vec(
        &self,
        op: &'static str,
        p: Plan,
        (dout, x, gamma, mean, rstd): (&HipBuffer, &HipBuffer, &HipBuffer, &HipBuffer, &HipBuffer),
        dx: &mut HipBuffer,
        dgamma: &mut HipBuffer,
        dbeta: &mut HipBuffer,
        dsum: Option<&mut HipBuffer>,
        n: usize,
        c: usize,
    ) -> Result<()> {
        let sa = float_suffix(op, x.dtype())?;
        let sp = wide_suffix(op, x.dtype(), "gamma", gamma.dtype())?;
        let sg = float_suffix(op, dgamma.dtype())?;
        let rpc = ln_rows_per_chunk(n);
        let chunks = n.div_ceil(rpc);
        let areas = if dsum.is_some() { 3 } else { 2 };
        let scratch = self.scratch(areas * chunks * c)?;
        let pg = scratch.ptr();
        // SAFETY: the scratch holds `areas`·chunks·c f32; pb and ps start at the second and
        // third of those areas.
        let (pb, ps) = unsafe {
            let f = pg.cast::<f32>();
            (
                f.add(chunks * c).cast::<c_void>(),
                f.add((areas - 1) * chunks * c).cast::<c_void>(),
            )
        };
        let (ni, ci) = (dim(op, "n", n)?, dim(op, "c", c)?);
        let (_, threads) = p.block(LN_BWD_WARPS);
        let pass = if dsum.is_some() { "bwdsum" } else { "bwd" };
        let launch = self
            .kernel(&p.kernel(pass, sa, sp))?
            .grid((grid_dim(op, chunks)?, 1, 1))
            .block((threads, 1, 1))
            .arg_buf(dout)
            .arg_buf(x)
            .arg_buf(gamma)
            .arg_buf(mean)
            .arg_buf(rstd)
            .arg_buf(dx)
            .arg_ptr(pg)
            .arg_ptr(pb);
        let launch = if dsum.is_some() {
            launch.arg_ptr(ps)
        } else {
            launch
        };
        // SAFETY: layernorm_bwd_A_P_vM(const A* dout, const A* x, const P* gamma,
        // const float* mean, const float* rstd, A* dx, float* pg, float* pb, int n, int c,
        // int rpc, int G), layernorm_bwdsum_* with a third float* (ps) after pb: block b
        // handles rows [b·rpc, min(n, (b+1)·rpc)) of buffers holding n·c / c / n elements
        // (checked by the caller) and writes row b of the chunks × c partial areas (the scratch
        // just sized); at most 128 threads (LN_BWD_WARPS groups); 16-byte accesses only: the
        // buffers are 16-byte aligned and c a multiple of the vector width (ln_vec_plan).
        unsafe {
            launch
                .arg_i32(ni)
                .arg_i32(ci)
                .arg_i32(dim(op, "rows per chunk", rpc)?)
                .arg_i32(p.g as i32)
                .launch()?;
        }
        let cgrid = grid_dim(op, c.div_ceil(32))?;
        let chunks = dim(op, "chunks", chunks)?;
        let finish = match &dsum {
            Some(ds) => format!(
                "layernorm_dparams_finish3_{sg}_{}",
                float_suffix(op, ds.dtype())?
            ),
            None => format!("layernorm_dparams_finish_{sg}"),
        };
        let launch = self
            .kernel(&finish)?
            .grid((cgrid, areas as u32, 1))
            .block((32, 32, 1))
            .arg_ptr(pg)
            .arg_ptr(pb);
        let launch = match dsum {
            Some(ds) => launch
                .arg_ptr(ps)
                .arg_buf(dgamma)
                .arg_buf(dbeta)
                .arg_buf(ds),
            None => launch.arg_buf(dgamma).arg_buf(dbeta),
        };
        // SAFETY: layernorm_dparams_finish_G(const float* pg, const float* pb, G* dgamma,
        // G* dbeta, int chunks, int c), and finish3_G_U with ps after pb and U* dsum after dbeta:
        // block (32, 32) (DUET_KERNEL_1024), grid (⌈c/32⌉, areas); reads chunks·c partials of
        // each area written above and updates c elements of dgamma, dbeta (and dsum), checked
        // by the caller.
        unsafe { launch.arg_i32(chunks).arg_i32(ci).launch() }
    }
}
