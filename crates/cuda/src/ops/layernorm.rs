//! LayerNorm forward and backward (kernels-cuda/layernorm.cu).
//!
//! Fast path: the row is held in registers by a group of `g` warps, each thread owning `m`
//! vectors of the row ([`plan`]); the backward is one kernel over fixed chunks of rows (dx plus
//! one dgamma/dbeta partial row per chunk) and one finish kernel for both parameter gradients.
//! Rows too wide for the fast kernels use the original warp-per-row kernels. Every choice
//! depends on the shape and dtypes only (buffers are allocation-aligned), so the summation
//! orders are fixed and the results bit-reproducible.

use super::prelude::*;

/// Vectors per thread the fast kernels are instantiated for.
const LN_M: [usize; 6] = [1, 2, 3, 4, 6, 8];
/// Most 16-byte vectors per thread of the vectorised forward (64 bf16/f16 or 32 f32 elements):
/// rows up to 2048 bf16 elements get one warp each, whose reductions need no block barrier.
const LN_FWD_MAX_VECTORS: usize = 8;
/// Warps per block of the fast forward (at most; `⌊8 / g⌋` row groups of `g` warps).
pub(crate) const LN_WARPS: usize = 8;
/// Warps per block of the fused backward (at most; `⌊4 / g⌋` row groups of `g` warps).
const LN_BWD_WARPS: usize = 4;
/// Most chunks (partial rows) of the fused backward.
const LN_MAX_CHUNKS: usize = 512;

/// How the fast LayerNorm kernels split a row of `c` elements.
/// The fused LayerNorm + FP8 quantisation (ops/fp8.rs) uses the forward's plan too, so its
/// row statistics follow the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// 16-byte vectors (`c` a multiple of the vector width, buffers 16-byte aligned), else
    /// single elements.
    pub(crate) vec: bool,
    /// Warps per row (1..=8).
    pub(crate) g: usize,
    /// Vectors per thread (one of [`LN_M`]).
    m: usize,
}

impl Plan {
    /// Kernel name of this plan: `layernorm_{fwd|bwd}_<act>_<param>_<v|s><m>`.
    fn kernel(&self, pass: &str, sa: &str, sp: &str) -> String {
        let v = if self.vec { 'v' } else { 's' };
        format!("layernorm_{pass}_{sa}_{sp}_{v}{}", self.m)
    }

    /// Elements per thread for rows of `act` (vectors of 16 bytes, or single elements).
    pub(crate) fn elements(&self, act: DType) -> usize {
        if self.vec {
            self.m * (16 / act.size_bytes())
        } else {
            self.m
        }
    }

    /// Row groups per block and threads per block, for blocks of at most `warps` warps.
    pub(crate) fn block(&self, warps: usize) -> (usize, u32) {
        let groups = warps / self.g;
        (groups, (groups * self.g * 32) as u32)
    }
}

/// The split of a row for the fast kernels, or `None` when the row is too wide for them.
/// Among the group sizes (forward up to 8 warps, backward up to 4) whose threads need at most
/// the instantiated vectors each (forward: [`LN_FWD_MAX_VECTORS`] vectors of 16 bytes;
/// backward: 3; single elements: 6), picks the one with the fewest thread slots, then
/// the fewest warps per row.
pub(crate) fn plan(c: usize, act: DType, aligned: bool, backward: bool) -> Option<Plan> {
    let pack = 16 / act.size_bytes();
    let vec = aligned && c.is_multiple_of(pack);
    let (width, max_m) = match (vec, backward) {
        (false, _) => (1, 6),
        (true, true) => (pack, 3),
        (true, false) => (pack, LN_FWD_MAX_VECTORS),
    };
    let nv = c / width;
    let mut best: Option<(usize, Plan)> = None;
    let max_g = if backward { LN_BWD_WARPS } else { LN_WARPS };
    for g in 1..=max_g {
        let per = nv.div_ceil(32 * g);
        let Some(&m) = LN_M.iter().find(|&&m| m >= per && m <= max_m) else {
            continue;
        };
        let slots = 32 * g * per;
        if best.is_none_or(|(s, _)| slots < s) {
            best = Some((slots, Plan { vec, g, m }));
        }
    }
    best.map(|(_, p)| p)
}

/// Rows per chunk of the fused backward: a multiple of 4 (every row group gets the same number
/// of rows), at least 4, and at most [`LN_MAX_CHUNKS`] chunks. A function of `n` only.
fn ln_rows_per_chunk(n: usize) -> usize {
    n.div_ceil(LN_MAX_CHUNKS).max(4).next_multiple_of(4)
}

/// Whether every address is 16-byte aligned (always true for whole allocations).
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p.is_multiple_of(16))
}

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

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_forward_impl(
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
        RowsDesc::new(OP, n, c)?.validate_layernorm_forward(
            x,
            gamma,
            beta,
            Some(&*out),
            mean,
            rstd,
        )?;
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

    /// LayerNorm backward; with `dsum`, also `dsum += Σ_rows dx` of the updated `dx`
    /// ([`Fused::layernorm_backward_colsum`]). dx, dgamma and dbeta get the same bits either
    /// way: the vectorised fast path's `layernorm_bwdsum_*` kernels are `layernorm_bwd_*` plus a
    /// third partial row (the column sums of the stored dx, added in dbeta's order), finished
    /// with dgamma's and dbeta's arithmetic by `layernorm_dparams_finish3_*`; the other paths
    /// (single elements, rows too wide) add a separate column sum of dx (`bias_backward`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_backward_impl(
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
        RowsDesc::new(op, n, c)?.validate_layernorm_backward(
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            dsum.as_deref(),
        )?;
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
            self.layernorm_backward_impl(
                dout, x, gamma, mean, rstd, dx, dgamma, dbeta, None, n, c,
            )?;
            return self.bias_backward(dx, dsum, n, c);
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
            Some(dsum) => self.bias_backward(dx, dsum, n, c),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = |c, act, bwd| plan(c, act, true, bwd);
        let v = |g, m| Some(Plan { vec: true, g, m });
        let s = |g, m| Some(Plan { vec: false, g, m });
        assert_eq!(p(768, DType::BF16, false), v(1, 3));
        assert_eq!(p(768, DType::BF16, true), v(1, 3));
        assert_eq!(p(1024, DType::BF16, false), v(1, 4));
        assert_eq!(p(2048, DType::BF16, false), v(1, 8));
        assert_eq!(p(4096, DType::BF16, false), v(2, 8));
        assert_eq!(p(2048, DType::BF16, true), v(4, 2));
        assert_eq!(p(768, DType::F32, false), v(1, 6));
        assert_eq!(p(768, DType::F32, true), v(2, 3));
        assert_eq!(p(1, DType::F32, true), s(1, 1));
        assert_eq!(p(7, DType::BF16, false), s(1, 1));
        assert_eq!(p(100, DType::BF16, true), s(1, 4));
        assert_eq!(p(100, DType::F32, true), v(1, 1));
        assert_eq!(plan(768, DType::BF16, false, true), s(4, 6));
        assert_eq!(p(3072, DType::BF16, true), v(4, 3));
        assert_eq!(p(3080, DType::BF16, true), None);
        assert_eq!(p(6144, DType::BF16, false), v(3, 8));
        assert_eq!(p(6152, DType::BF16, false), v(5, 6));
        assert_eq!(p(16384, DType::BF16, false), v(8, 8));
        assert_eq!(p(16392, DType::BF16, false), None);
        assert_eq!(p(769, DType::F16, true), None);
        assert_eq!(p(1537, DType::F16, false), None);
        assert_eq!(ln_rows_per_chunk(1), 4);
        assert_eq!(ln_rows_per_chunk(8192), 16);
        assert_eq!(ln_rows_per_chunk(1 << 20), 2048);
        for n in [1usize, 7, 8, 9, 100, 2049, 8192, 70000, 1 << 22] {
            assert!(n.div_ceil(ln_rows_per_chunk(n)) <= LN_MAX_CHUNKS);
        }
    }
}
