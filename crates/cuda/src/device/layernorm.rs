//! LayerNorm forward and backward (kernels-cuda/layernorm.cu).
//!
//! Fast path (16-byte vectors: `c` a multiple of the vector width, buffers 16-byte aligned):
//! the row is held in registers by a group of `g` warps, each thread owning `m` vectors of it
//! ([`plan`]). The forward runs a grid of a few blocks per SM, each row group looping over rows
//! and loading the next row while it finishes the current one. The backward runs about one block
//! per SM, block `b` taking the fixed chunk of rows `[b·rpc, (b+1)·rpc)` ([`bwd_chunks`]): dx
//! plus one dgamma/dbeta partial row per chunk, summed in registers; one finish kernel adds the
//! partial rows into both parameter gradients. Other rows use the original warp-per-row kernels.
//! Every summation order depends only on the shape, the dtypes and (backward chunks) the
//! device's SM count, so results are bit-reproducible run to run on a device.

use super::*;

/// Vectors per thread the fast forward kernels are instantiated for.
const LN_FWD_M: [usize; 6] = [1, 2, 3, 4, 6, 8];
/// Vectors per thread the fast backward kernels are instantiated for.
const LN_BWD_M: [usize; 3] = [1, 2, 3];
/// Warps per row the fast kernels take (forward: all; backward: those dividing 12 and 16).
const LN_FWD_G: [usize; 4] = [1, 2, 4, 8];
const LN_BWD_G: [usize; 3] = [1, 2, 4];
/// Threads per block of the fast forward (`8 / g` row groups).
const LN_FWD_THREADS: usize = 256;
/// Rows beyond this take the fallback kernels (the fast kernels' row counters stay in `int`).
const LN_MAX_ROWS: usize = 1 << 30;

/// Blocks per SM the forward kernel with `m` vectors is built for (`LN_FWD_BPS` in the kernel
/// file: `__launch_bounds__(256, bps)`), so the grid is one full wave.
fn fwd_blocks_per_sm(m: usize) -> usize {
    match m {
        ..=3 => 4,
        4 => 3,
        _ => 2,
    }
}

/// Threads per block of the backward kernel with `m` vectors (`LN_BWD_THREADS` in the kernel
/// file, one block per SM).
fn bwd_threads(m: usize) -> usize {
    if m >= 3 { 384 } else { 512 }
}

/// How the fast LayerNorm kernels split a row of `c` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Warps per row.
    g: usize,
    /// Vectors (16 bytes of the activation type) per thread.
    m: usize,
}

impl Plan {
    /// Kernel name of this plan: `layernorm_{fwd|bwd}_<act>_<param>_v<m>`.
    fn kernel(&self, pass: &str, sa: &str, sp: &str) -> String {
        format!("layernorm_{pass}_{sa}_{sp}_v{}", self.m)
    }
}

/// The split of a row for the fast kernels, or `None` when the row does not fit them (not a
/// whole number of aligned 16-byte vectors, or too wide). Among the instantiated (`g`, `m`)
/// whose threads cover the row, picks the one with the fewest thread slots, then the fewest
/// warps per row.
fn plan(c: usize, act: DType, aligned: bool, backward: bool) -> Option<Plan> {
    let pack = 16 / act.size_bytes();
    if !aligned || !c.is_multiple_of(pack) {
        return None;
    }
    let nv = c / pack;
    let (gs, ms): (&[usize], &[usize]) = if backward {
        (&LN_BWD_G, &LN_BWD_M)
    } else {
        (&LN_FWD_G, &LN_FWD_M)
    };
    let mut best: Option<(usize, Plan)> = None;
    for &g in gs {
        let per = nv.div_ceil(32 * g);
        let Some(&m) = ms.iter().find(|&&m| m >= per) else {
            continue;
        };
        let slots = 32 * g * m;
        if best.is_none_or(|(s, _)| slots < s) {
            best = Some((slots, Plan { g, m }));
        }
    }
    best.map(|(_, p)| p)
}

/// (rows per chunk, chunks) of the fused backward for `n` rows, `groups` row groups per block
/// and `sms` SMs: at most one chunk per SM (fewer when the rows would leave a row group idle),
/// the rows spread evenly, no chunk empty.
fn bwd_chunks(n: usize, groups: usize, sms: usize) -> (usize, usize) {
    let target = sms.min(n.div_ceil(groups)).max(1);
    let rpc = n.div_ceil(target);
    (rpc, n.div_ceil(rpc))
}

/// Whether every address is 16-byte aligned (always true for whole allocations).
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p.is_multiple_of(16))
}

/// `DUET_LN_LEGACY=1`: bf16/f32 shapes the previous fast kernels covered at `m` = 2 or 3 run
/// those instead (for examples/layernorm_bench's before/after comparison only).
pub const LN_LEGACY_ENV: &str = "DUET_LN_LEGACY";

fn legacy_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var(LN_LEGACY_ENV).is_ok_and(|v| v == "1"))
}

/// The previous plan for bf16 rows (`max_g` 8 forward, 4 backward), when it used `m` = 2 or 3.
fn legacy_plan(c: usize, act: DType, pdt: DType, aligned: bool, backward: bool) -> Option<Plan> {
    if !legacy_on() || act != DType::BF16 || pdt != DType::F32 || !aligned || !c.is_multiple_of(8) {
        return None;
    }
    let nv = c / 8;
    let max_g = if backward { 4 } else { 8 };
    let mut best: Option<(usize, Plan)> = None;
    for g in 1..=max_g {
        let m = nv.div_ceil(32 * g);
        if m <= 3 && best.is_none_or(|(s, _)| 32 * g * m < s) {
            best = Some((32 * g * m, Plan { g, m }));
        }
    }
    best.map(|(_, p)| p).filter(|p| p.m >= 2)
}

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
        let aligned = aligned16(&[x.ptr(), gamma.ptr(), beta.ptr(), out.ptr()]);
        let fast = n <= LN_MAX_ROWS;
        let args = |g: usize| -> Result<Vec<Arg>> {
            Ok(vec![
                x.ptr().into(),
                gamma.ptr().into(),
                beta.ptr().into(),
                out.ptr().into(),
                mean.ptr().into(),
                rstd.ptr().into(),
                dim(OP, "n", n)?.into(),
                dim(OP, "c", c)?.into(),
                eps.into(),
                (g as i32).into(),
            ])
        };
        if let Some(p) = legacy_plan(c, act, gamma.dtype(), aligned, false).filter(|_| fast) {
            let f = self.func(
                KernelModule::LayerNorm,
                &format!("layernorm_legacy_fwd_bf16_f32_v{}", p.m),
            )?;
            let groups = 8 / p.g;
            // SAFETY: layernorm_legacy_fwd_bf16_f32_v*(const bf16*, const float*, const float*,
            // bf16*, float*, float*, int n, int c, float eps, int G): one row per group of G
            // warps, `groups` groups per block, rows < n; x/out hold n·c, gamma/beta c,
            // mean/rstd n elements (dtypes checked by legacy_plan); 16-byte accesses only when
            // `aligned` and c is a multiple of 8.
            return unsafe {
                kernels::launch(
                    &self.stream,
                    &f,
                    cfg(
                        (grid_dim(OP, n.div_ceil(groups))?, 1, 1),
                        ((groups * p.g * 32) as u32, 1, 1),
                    ),
                    &args(p.g)?,
                )
            };
        }
        if let Some(p) = plan(c, act, aligned, false).filter(|_| fast) {
            let f = self.func(KernelModule::LayerNorm, &p.kernel("fwd", sa, sp))?;
            let groups = LN_FWD_THREADS / (32 * p.g);
            let blocks = n
                .div_ceil(groups)
                .min(self.sm_count as usize * fwd_blocks_per_sm(p.m));
            // SAFETY: layernorm_fwd_*_v<m>(const A*, const P*, const P*, A*, float*, float*,
            // int n, int c, float eps, int G): blocks of 256 threads (the kernel's launch
            // bound), 8/G row groups each looping over rows < n (n ≤ 2^30, so the row counters
            // do not overflow); x/out hold n·c, gamma/beta c, mean/rstd n elements; 16-byte
            // accesses only when `aligned` and c is a multiple of the vector width (`plan`).
            return unsafe {
                kernels::launch(
                    &self.stream,
                    &f,
                    cfg((grid_dim(OP, blocks)?, 1, 1), (LN_FWD_THREADS as u32, 1, 1)),
                    &args(p.g)?,
                )
            };
        }
        // Rows too wide for the fast kernel: one warp per row.
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
        let aligned = aligned16(&[dout.ptr(), x.ptr(), gamma.ptr(), dx.ptr()]);
        let fast = n <= LN_MAX_ROWS;
        let legacy = legacy_plan(c, act, gamma.dtype(), aligned, true)
            .filter(|_| fast && dgamma.dtype() == DType::F32);
        let fused = match legacy {
            Some(p) => {
                // The previous chunking: 4-row multiples, at most 512 chunks, ⌊4/g⌋ groups.
                let rpc = n.div_ceil(512).max(4).next_multiple_of(4);
                let name = format!("layernorm_legacy_bwd_bf16_f32_v{}", p.m);
                Some((p, name, rpc, ((4 / p.g) * p.g * 32) as u32))
            }
            None => plan(c, act, aligned, true).filter(|_| fast).map(|p| {
                let threads = bwd_threads(p.m);
                let (rpc, _) = bwd_chunks(n, threads / (32 * p.g), self.sm_count as usize);
                (p, p.kernel("bwd", sa, sp), rpc, threads as u32)
            }),
        };
        if let Some((p, name, rpc, threads)) = fused {
            let sg = float_sfx(OP, dgamma.dtype())?;
            let chunks = n.div_ceil(rpc);
            let part_bytes = align_up(chunks * c * 4);
            let mut scratch = lock(&self.scratch, OP)?;
            let pg = scratch.get(&self.ctx, &self.stream, 2 * part_bytes, &self.mem)?;
            let pb = pg + part_bytes as u64;
            let f = self.func(KernelModule::LayerNorm, &name)?;
            // SAFETY: layernorm_bwd_*(const A*, const A*, const P*, const float*, const float*,
            // A*, float*, float*, int n, int c, int rpc, int G) with the block size its launch
            // bound names (`bwd_threads`; legacy: ⌊4/G⌋ groups of G warps): block b handles rows
            // [b·rpc, min(n, (b+1)·rpc)) of buffers holding n·c / c / n elements (n ≤ 2^30) and
            // writes row b of the two chunks × c f32 partial areas (scratch of 2·part_bytes);
            // 16-byte accesses only when `aligned` and c is a multiple of the vector width.
            unsafe {
                kernels::launch(
                    &self.stream,
                    &f,
                    cfg((grid_dim(OP, chunks)?, 1, 1), (threads, 1, 1)),
                    &[
                        dout.ptr().into(),
                        x.ptr().into(),
                        gamma.ptr().into(),
                        mean.ptr().into(),
                        rstd.ptr().into(),
                        dx.ptr().into(),
                        pg.into(),
                        pb.into(),
                        ni.into(),
                        ci.into(),
                        dim(OP, "rows per chunk", rpc)?.into(),
                        (p.g as i32).into(),
                    ],
                )?;
            }
            let fargs: [Arg; 6] = [
                pg.into(),
                pb.into(),
                dgamma.ptr().into(),
                dbeta.ptr().into(),
                dim(OP, "chunks", chunks)?.into(),
                ci.into(),
            ];
            if legacy.is_some() {
                let ff = self.func(KernelModule::LayerNorm, "layernorm_legacy_finish_f32")?;
                // SAFETY: layernorm_legacy_finish_f32(const float*, const float*, float*,
                // float*, int chunks, int c): block (32, 32), grid (⌈c/32⌉, 2); reads chunks·c
                // partials from each area, updates c f32 elements of dgamma and dbeta.
                return unsafe {
                    kernels::launch(
                        &self.stream,
                        &ff,
                        cfg((grid_dim(OP, c.div_ceil(32))?, 2, 1), (32, 32, 1)),
                        &fargs,
                    )
                };
            }
            let ff = self.func(
                KernelModule::LayerNorm,
                &format!("layernorm_dparams_finish_{sg}"),
            )?;
            // SAFETY: layernorm_dparams_finish(const float*, const float*, G*, G*, int chunks,
            // int c): block (8, 32), grid (⌈c/32⌉, 2); c is a multiple of 4 (fast plans only)
            // and the partial areas 16-byte aligned, so its float4 reads of chunks·c partials
            // per area stay inside them; updates c elements of dgamma and dbeta (dtype G).
            return unsafe {
                kernels::launch(
                    &self.stream,
                    &ff,
                    cfg((grid_dim(OP, c.div_ceil(32))?, 2, 1), (8, 32, 1)),
                    &fargs,
                )
            };
        }
        // Rows too wide for the fused kernel: dx with one warp per row, then the parameter
        // gradients in two passes.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = |c, act, bwd| plan(c, act, true, bwd);
        let v = |g, m| Some(Plan { g, m });
        assert_eq!(p(768, DType::BF16, false), v(1, 3));
        assert_eq!(p(768, DType::BF16, true), v(1, 3));
        assert_eq!(p(2048, DType::BF16, false), v(1, 8));
        assert_eq!(p(2048, DType::BF16, true), v(4, 2));
        assert_eq!(p(1024, DType::BF16, true), v(2, 2));
        assert_eq!(p(768, DType::F32, false), v(1, 6));
        assert_eq!(p(768, DType::F32, true), v(2, 3));
        assert_eq!(p(100, DType::F32, true), v(1, 1));
        assert_eq!(p(3072, DType::BF16, true), v(4, 3));
        assert_eq!(p(3080, DType::BF16, true), None);
        assert_eq!(p(6144, DType::BF16, false), v(4, 6));
        assert_eq!(p(16384, DType::BF16, false), v(8, 8));
        assert_eq!(p(16392, DType::BF16, false), None);
        // Rows that are not whole aligned 16-byte vectors take the fallback kernels.
        assert_eq!(p(1, DType::F32, true), None);
        assert_eq!(p(7, DType::BF16, false), None);
        assert_eq!(p(100, DType::BF16, true), None);
        assert_eq!(plan(768, DType::BF16, false, true), None);
        assert_eq!(p(769, DType::F16, true), None);
        // Every backward plan fits its block: whole row groups.
        for c in (8..=3072).step_by(8) {
            if let Some(q) = p(c, DType::BF16, true) {
                assert!(bwd_threads(q.m).is_multiple_of(32 * q.g), "{c}: {q:?}");
            }
        }
    }

    #[test]
    fn chunks() {
        assert_eq!(bwd_chunks(8192, 12, 132), (63, 131));
        assert_eq!(bwd_chunks(1, 12, 132), (1, 1));
        assert_eq!(bwd_chunks(3, 12, 132), (3, 1));
        assert_eq!(bwd_chunks(67, 12, 132), (12, 6));
        for n in [1usize, 7, 8, 9, 100, 2049, 8192, 70000, 1 << 22] {
            for (groups, sms) in [(12, 132), (4, 108), (16, 1)] {
                let (rpc, chunks) = bwd_chunks(n, groups, sms);
                assert!(chunks <= sms && chunks * rpc >= n && (chunks - 1) * rpc < n);
            }
        }
    }
}
