//! [`Fp8Ops`] for [`CudaDevice`]: every op that reads or writes FP8 codes.
//!
//! FP8 quantisation (kernels-cuda/fp8.cu): [`duet_device::Fp8Ops::quantize_fp8`], the fused gradient
//! variant [`duet_device::Fp8Ops::quantize_fp8_grad`] and the fused GELU variant [`duet_device::Fp8Ops::quantize_fp8_gelu`].
//!
//! Paths, chosen from the shape only (buffers are allocation-aligned):
//! * no transposed copy: `quantize_<S>_<D>`, a grid-stride loop over 8-element vectors with a
//!   scalar tail (any length);
//! * with `dst_t`, rows and cols multiples of 8: `quantize_t_<S>_<D>`, 64 × 64 tiles with
//!   16-byte loads and 8-byte stores of `dst` and `dst_t`;
//! * with `dst_t` otherwise: `quantize_t_scalar_<S>_<D>`, 32 × 32 tiles, one element per thread.
//!
//! The GELU variant runs the same three paths (`quantize_gelu_*`) on `gelu(pre)`, computed on
//! load exactly as `gelu_forward` does it (rounded to `pre`'s dtype); any shape.
//!
//! The gradient variant runs the tile kernel on `g` (`quantize_grad_t` / `quantize_dgelu_t`) in
//! one launch: each block writes one f32 column-sum row per 64-row tile into the device scratch
//! and counts itself on its column tile's counter (`CudaDevice::fp8_counters`, zero between
//! launches); the last block of a column tile adds the rows into `dbias` in a fixed order (that of
//! `colsum_finish`): deterministic, no float atomics. Shapes the tile kernel cannot take (cols
//! not a multiple of 8, or rows not a multiple of 8 with `dst_t`) run the separate ops, like the
//! trait's default.
//!
//! The multi-matrix variant [`duet_device::Fp8Ops::quantize_fp8_many`] runs `quantize_t_many_<S>_<D>`, the
//! 64 × 64 tile kernel over a table of jobs, one tile per block, one launch per (source, FP8)
//! dtype pair among the jobs (one for a model's bf16 weights). The table (64-byte records:
//! pointers, shape, the slot's scale/amax addresses, first block) goes through the multi-tensor
//! table cache of ops/optim.rs: uploaded on the first call with these buffers and reused
//! afterwards, so a call recorded into a CUDA graph with the same jobs as an earlier eager call
//! uploads nothing. Jobs the tiles cannot take (cols not a multiple of 8, or rows not a multiple
//! of 8 with `dst_t`, or unaligned buffers) run [`duet_device::Fp8Ops::quantize_fp8`] one by one.
//!
//! The LayerNorm variant [`duet_device::Fp8Ops::layernorm_forward_fp8`] runs `layernorm_fp8_<A>_<P>_<v|s>_<D>`:
//! the fast LayerNorm forward's block and row layout (`super::norm::plan`, chosen exactly
//! as `layernorm_forward` chooses it for the same operands), so mean, rstd and the normalised
//! values are its bits, then the codes of each value rounded to `x`'s dtype, as `quantize_fp8`
//! computes them. One block per 32 rows; with `dst_t` the block's codes go through a 32-row
//! shared tile (`32 · ⌈c / 128⌉ · 128` bytes) to the transposed store. From
//! [`LN_SPLIT_MIN_COLS`] columns on (vectorised plans, OCP formats, shapes the tile kernel takes)
//! it runs two launches instead, since a 32-row block keeps too few wide rows in flight:
//! layernorm.cu's `layernorm_stats_<A>_v` (the plan's row statistics, layernorm_forward's bits) and
//! `layernorm_quant_t_<A>_<P>_<D>` (the 64 × 64 tile kernel on the LayerNorm output computed on
//! load from those statistics). Rows without a fast plan
//! (wider than the fast LayerNorm takes), FNUZ formats, and tiles beyond the GPU's shared memory
//! run the separate ops, like the trait's default.

use super::gemm::{REFUSED_FP8_BIAS, REFUSED_FP8_GELU};
use super::norm;
use super::prelude::*;
use crate::blaslt::{self, LtEpilogue};
use crate::device::FP8_COUNTERS;
use cudarc::driver::sys as cu;
use duet_device::{AdamWTensor, Fp8QuantJob};
use duet_device::{Epilogue, GemmDesc, composed};

/// Tile edge of the vectorised kernels (`QT` in fp8.cu).
const QT: usize = 64;
/// Threads per block of the vectorised tile kernels (`QT_THREADS` in fp8.cu).
const QT_THREADS: u32 = 128;
/// Elements per vector: one 8-byte group of FP8 codes.
const VEC: usize = 8;
/// Bytes of one job record of `quantize_t_many` (`QuantJob` in fp8.cu).
const JOB_BYTES: usize = 64;
/// Rows per block of the fused LayerNorm kernel (`LNQ_ROWS` in fp8.cu).
const LNQ_ROWS: usize = 32;
/// Most elements per thread of the one-pass LayerNorm kernel (`M` in fp8.cu's
/// layernorm_fp8_body); wider plans run the split kernels or the separate ops.
const LNQ_MAX_ELEMENTS: usize = 24;
/// Dynamic shared memory a kernel may use without opting in.
const SMEM_DEFAULT: usize = 48 * 1024;
/// Shared memory per block kept back from the opt-in maximum for the kernel's static arrays.
const SMEM_STATIC_RESERVE: usize = 1024;

/// Bytes of one chunk record of `adamw_fp8_<D>` (`AdamWFp8Chunk` in fp8.cu) and of one job of
/// `transpose_codes_many` (`CodesJob`).
const ADAMW_CHUNK_BYTES: usize = 80;
const CODES_JOB_BYTES: usize = 40;

/// Row width from which [`duet_device::Fp8Ops::layernorm_forward_fp8`] runs the split kernels (statistics,
/// then the 64 × 64 tile kernel) instead of the one-pass kernel.
const LN_SPLIT_MIN_COLS: usize = 1024;

thread_local! {
    /// Per-thread override of the LayerNorm + FP8 path (`Some(true)`: split whenever possible).
    static LN_SPLIT_ON_THREAD: std::cell::Cell<Option<bool>> =
        const { std::cell::Cell::new(None) };
    /// Per-thread switch of [`duet_device::Fp8Ops::adamw_clipped_fp8`]'s fused kernel (`false`: the
    /// separate ops, as the trait's default runs them).
    static ADAMW_FP8_FUSED_ON_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Whether a LayerNorm + FP8 call with rows of `c` elements runs the split kernels.
fn use_ln_split(c: usize) -> bool {
    LN_SPLIT_ON_THREAD
        .with(std::cell::Cell::get)
        .unwrap_or(c >= LN_SPLIT_MIN_COLS)
}

/// What [`CudaDevice::quantize_from`] quantises: the source as is (`quantize_*` kernels) or
/// its GELU, computed on load (`quantize_gelu_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QuantOf {
    Src,
    Gelu,
}

/// Whether every address is 16-byte aligned (always true for allocations; checked anyway, since
/// the vector kernels would fault otherwise).
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p.is_multiple_of(16))
}

impl CudaDevice {
    /// The kernel suffixes of a quantisation's source (f32, f16, bf16) and FP8 dtypes, for
    /// operands the op's validator has checked.
    fn quantize_suffixes(
        op: &'static str,
        src: &CudaBuffer,
        dst: &CudaBuffer,
    ) -> Result<(&'static str, &'static str)> {
        let ss = float_suffix(op, src.dtype())?;
        let ds = conv::kernel_suffix(dst.dtype()).expect("fp8 dtype");
        Ok((ss, ds))
    }

    /// Grid of the 64 × 64 tile kernels: x over row tiles, y over column tiles.
    fn tile_grid(op: &'static str, rows: usize, cols: usize) -> Result<(u32, u32, u32)> {
        let y = cols.div_ceil(QT);
        Ok((
            grid_dim(op, rows.div_ceil(QT))?,
            u32::try_from(y)
                .ok()
                .filter(|&g| g <= 65535)
                .ok_or_else(|| too_large(op, "cols / 64", y))?,
            1,
        ))
    }

    /// FP8 quantisation of `src` or of `gelu(src)` (see [`duet_device::Fp8Ops::quantize_fp8`] and
    /// [`duet_device::Fp8Ops::quantize_fp8_gelu`]): the three paths of the module docs, of the kernel family
    /// `quantize` or `quantize_gelu`.
    #[allow(clippy::too_many_arguments)]
    fn quantize_from(
        &self,
        of: QuantOf,
        src: &CudaBuffer,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        let (op, prefix) = match of {
            QuantOf::Src => ("quantize_fp8", "quantize"),
            QuantOf::Gelu => ("quantize_fp8_gelu", "quantize_gelu"),
        };
        let desc = RowsDesc::new(op, rows, cols)?;
        let n = desc.total;
        let (ss, ds) = Self::quantize_suffixes(op, src, dst)?;
        if n == 0 {
            return Ok(());
        }
        let Some(t) = dst_t else {
            // SAFETY: {quantize,quantize_gelu}_S_D(const S*, D*, u64 n, const float* scale,
            // float* amax):
            // src and dst hold n elements (16-byte aligned allocations; the kernel moves 8
            // elements at a time and finishes the n % 8 tail one by one); scale and amax point
            // at slot < len (checked).
            return unsafe {
                self.kernel(KernelModule::Fp8, &format!("{prefix}_{ss}_{ds}"))?
                    .grid(self.grid_1d(n.div_ceil(VEC)))
                    .block((EW_BLOCK, 1, 1))
                    .arg_buf(src)
                    .arg_buf(dst)
                    .arg_u64(n as u64)
                    .arg_ptr(scale.ptr_at(slot))
                    .arg_ptr(amax.ptr_at(slot))
                    .launch()
            };
        };
        let args = [
            Arg::U64(src.ptr()),
            Arg::U64(dst.ptr()),
            Arg::U64(t.ptr()),
            Arg::U64(rows as u64),
            Arg::U64(cols as u64),
            Arg::U64(scale.ptr_at(slot)),
            Arg::U64(amax.ptr_at(slot)),
        ];
        if rows.is_multiple_of(VEC)
            && cols.is_multiple_of(VEC)
            && aligned16(&[src.ptr(), dst.ptr(), t.ptr()])
        {
            let f = self.func(KernelModule::Fp8, &format!("{prefix}_t_{ss}_{ds}"))?;
            let grid = Self::tile_grid(op, rows, cols)?;
            // SAFETY: {quantize,quantize_gelu}_t_S_D(const S*, D*, D* dst_t, u64 rows, u64 cols,
            // const float*, float*): src, dst and dst_t hold rows × cols elements; rows and cols are
            // multiples of 8 and the buffers 16-byte aligned, as the 64 × 64 tiles need
            // (every 8-element vector is bounds-checked as a whole); block QT_THREADS as the
            // kernel's __launch_bounds__; scale/amax at slot (checked).
            unsafe {
                self.launcher(&f)
                    .grid(grid)
                    .block((QT_THREADS, 1, 1))
                    .args(&args)
                    .launch()
            }
        } else {
            let f = self.func(KernelModule::Fp8, &format!("{prefix}_t_scalar_{ss}_{ds}"))?;
            let grid = (
                grid_dim(op, cols.div_ceil(32))?,
                u32::try_from(rows.div_ceil(32))
                    .ok()
                    .filter(|&g| g <= 65535)
                    .ok_or_else(|| too_large(op, "rows / 32", rows.div_ceil(32)))?,
                1,
            );
            // SAFETY: {prefix}_t_scalar_S_D has the same parameters as {prefix}_t_S_D; its
            // 32 × 32 tiles (block (32, 8)) guard every index against rows and cols.
            unsafe {
                self.launcher(&f)
                    .grid(grid)
                    .block((32, 8, 1))
                    .args(&args)
                    .launch()
            }
        }
    }

    /// Selects the [`duet_device::Fp8Ops::layernorm_forward_fp8`] kernels for the calls made on the calling
    /// thread: `Some(true)` the split kernels (statistics, then the tile kernel) wherever they
    /// apply, `Some(false)` the one-pass kernel, `None` by row width. For A/B tests and
    /// benchmarks; both give the same bits.
    pub fn layernorm_fp8_split_on_this_thread(split: Option<bool>) {
        LN_SPLIT_ON_THREAD.with(|c| c.set(split));
    }

    /// Dynamic shared memory the fused LayerNorm kernel may use on this GPU: the opt-in
    /// maximum per block less [`SMEM_STATIC_RESERVE`] (at least the default 48 KiB).
    fn lnq_smem_cap(&self) -> usize {
        self.smem_optin
            .saturating_sub(SMEM_STATIC_RESERVE)
            .max(SMEM_DEFAULT)
    }

    /// How many weight matrices [`duet_device::Fp8Ops::adamw_clipped_fp8`] has updated and quantised in its
    /// fused kernel on this device (each call adds the matrices it took), so that a test or a
    /// benchmark can tell that the fused path ran.
    pub fn adamw_fp8_fused_count(&self) -> u64 {
        self.adamw_fp8_fused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Turns [`duet_device::Fp8Ops::adamw_clipped_fp8`]'s fused kernel off (or back on) for calls from the
    /// current thread, so that tests and benchmarks can compare it with the separate ops in one
    /// process; both give the same bits.
    pub fn adamw_fp8_fused_on_this_thread(fused: bool) {
        ADAMW_FP8_FUSED_ON_THREAD.with(|c| c.set(fused));
    }
}

impl Fp8Ops for CudaDevice {
    fn quantize_fp8(&self, args: Checked<QuantizeFp8<'_, Self::Buffer>>) -> Result<()> {
        let QuantizeFp8 {
            src,
            dst,
            dst_t,
            rows,
            cols,
            scale,
            amax,
            slot,
        } = args.into_inner();
        self.quantize_from(QuantOf::Src, src, dst, dst_t, rows, cols, scale, amax, slot)
    }

    /// FP8 GEMM through cuBLASLt (see [`duet_device::Fp8Ops::gemm_fp8`] and `crate::blaslt`).
    fn gemm_fp8(&self, args: Checked<GemmFp8<'_, Self::Buffer>>) -> Result<()> {
        let GemmFp8 {
            desc,
            a,
            b,
            c,
            scale_inv,
            a_slot,
            b_slot,
        } = args.into_inner();
        blaslt::validate(desc, a, b, c, scale_inv, a_slot, b_slot, self.cc)?;
        self.with_lt("gemm_fp8", |lt| {
            lt.gemm_fp8(
                &self.stream,
                desc,
                a,
                b,
                c,
                scale_inv,
                (a_slot, b_slot),
                blaslt::LtEpilogue::None,
            )
        })
    }

    /// Many FP8 quantisations (see [`duet_device::Fp8Ops::quantize_fp8_many`] and the module docs).
    fn quantize_fp8_many(
        &self,
        args: Checked<QuantizeFp8Many<'_, '_, Self::Buffer>>,
    ) -> Result<()> {
        let QuantizeFp8Many { jobs, scale, amax } = args.into_inner();
        const OP: &str = "quantize_fp8_many";
        // (source suffix, FP8 suffix) → the group's records and block count, in the order the
        // pairs first appear.
        let mut groups: Vec<((&'static str, &'static str), Vec<u8>, u64)> = Vec::new();
        let mut single = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            // Sizes and dtypes checked above.
            let n = j.rows * j.cols;
            let (ss, ds) = Self::quantize_suffixes(OP, j.src, j.dst)?;
            if n == 0 {
                continue;
            }
            let mut ptrs = vec![j.src.ptr(), j.dst.ptr()];
            ptrs.extend(j.dst_t.as_deref().map(CudaBuffer::ptr));
            let tiled = j.cols.is_multiple_of(VEC)
                && (j.dst_t.is_none() || j.rows.is_multiple_of(VEC))
                && aligned16(&ptrs);
            let col_tiles = j.cols.div_ceil(QT) as u64;
            let tiles = j.rows.div_ceil(QT) as u64 * col_tiles;
            let gi = match groups.iter().position(|(k, ..)| *k == (ss, ds)) {
                Some(gi) => gi,
                None => {
                    groups.push(((ss, ds), Vec::new(), 0));
                    groups.len() - 1
                }
            };
            let (_, records, blocks) = &mut groups[gi];
            // Block indices (and tile_start) stay below 2^31.
            if !tiled || *blocks + tiles > i32::MAX as u64 {
                single.push(i);
                continue;
            }
            for v in [
                j.src.ptr(),
                j.dst.ptr(),
                j.dst_t.as_deref().map_or(0, CudaBuffer::ptr),
                j.rows as u64,
                j.cols as u64,
                scale.ptr_at(j.slot),
                amax.ptr_at(j.slot),
            ] {
                records.extend_from_slice(&v.to_le_bytes());
            }
            records.extend_from_slice(&(*blocks as u32).to_le_bytes());
            records.extend_from_slice(&(col_tiles as u32).to_le_bytes());
            *blocks += tiles;
        }
        groups.retain(|(_, _, blocks)| *blocks > 0);
        if !groups.is_empty() {
            // One table for all groups (one cache entry); group g's records start at its offset.
            let mut table = Vec::new();
            let mut launches = Vec::new();
            for ((ss, ds), records, blocks) in &groups {
                let f = self.func(KernelModule::Fp8, &format!("quantize_t_many_{ss}_{ds}"))?;
                // (At most `blocks` < 2^31 jobs: each has a block.)
                let njobs = (records.len() / JOB_BYTES) as i32;
                launches.push((f, table.len() as u64, njobs, *blocks as u32));
                table.extend_from_slice(records);
            }
            let base = self.table(OP, table)?;
            for (f, offset, njobs, blocks) in launches {
                // SAFETY: quantize_t_many_S_D(const QuantJob* jobs, unsigned njobs): `njobs` (> 0)
                // 64-byte records at base + offset (a live device table, cached while these
                // buffers are in use; records start at multiples of 64 from its 256-byte aligned
                // start), each naming a job checked above: src and dst hold rows × cols elements
                // of the group's dtypes, dst_t too or is 0; cols (and rows with dst_t) multiples
                // of 8 and the buffers 16-byte aligned, as the tiles need; scale/amax the job's
                // slot (checked); tile_start increasing from 0 with the job's ⌈rows / 64⌉ ×
                // col_tiles blocks each, `blocks` in all (< 2^31), so every block finds its job
                // and tile inside the matrix; block QT_THREADS as the kernel's __launch_bounds__.
                unsafe {
                    self.launcher(&f)
                        .grid((blocks, 1, 1))
                        .block((QT_THREADS, 1, 1))
                        .arg_ptr(base + offset)
                        .arg_i32(njobs)
                        .launch()?;
                }
            }
        }
        for i in single {
            jobs[i].quantize(self, scale, amax)?;
        }
        Ok(())
    }

    /// Fused gradient quantisation (see [`duet_device::Fp8Ops::quantize_fp8_grad`]).
    fn quantize_fp8_grad(&self, args: Checked<QuantizeFp8Grad<'_, Self::Buffer>>) -> Result<()> {
        let QuantizeFp8Grad {
            dout,
            gelu_pre,
            dst,
            dst_t,
            dbias,
            rows,
            cols,
            scale,
            amax,
            slot,
        } = args.into_inner();
        const OP: &str = "quantize_fp8_grad";
        let desc = RowsDesc::new(OP, rows, cols)?;
        let n = desc.total;
        let (ss, ds) = Self::quantize_suffixes(OP, dout, dst)?;
        if let Some(pre) = gelu_pre {
            // The kernels take gelu_pre in dout's dtype.
            check_dtype(OP, pre, dout.dtype())?;
        }
        let dbias_code = float_code(OP, dbias.dtype())?;
        let mut ptrs = vec![dout.ptr(), dst.ptr()];
        ptrs.extend(gelu_pre.map(CudaBuffer::ptr));
        ptrs.extend(dst_t.as_deref().map(CudaBuffer::ptr));
        let fused = cols.is_multiple_of(VEC)
            && (dst_t.is_none() || rows.is_multiple_of(VEC))
            && aligned16(&ptrs);
        if !fused {
            // The trait's default: the separate ops (g in a temporary with gelu_pre).
            return composed::quantize_fp8_grad(
                self,
                QuantizeFp8Grad {
                    dout,
                    gelu_pre,
                    dst,
                    dst_t,
                    dbias,
                    rows,
                    cols,
                    scale,
                    amax,
                    slot,
                }
                .check()?,
            );
        }
        if n == 0 {
            return Ok(());
        }
        let name = if gelu_pre.is_some() {
            format!("quantize_dgelu_t_{ss}_{ds}")
        } else {
            format!("quantize_grad_t_{ss}_{ds}")
        };
        let f = self.func(KernelModule::Fp8, &name)?;
        let grid = Self::tile_grid(OP, rows, cols)?;
        debug_assert!(grid.1 as usize <= FP8_COUNTERS);
        let tiles = rows.div_ceil(QT);
        let part_bytes = checked_product(OP, &[tiles, cols, 4])?;
        // The scratch is sized on the first (unrecorded) call of a shape; later calls, recorded
        // ones included, reuse it.
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, part_bytes, &self.mem)?;
        // SAFETY: quantize_{grad,dgelu}_t_S_D(const S* dout, const S* pre, D* dst, D* dst_t,
        // float* partial, unsigned* counters, u64 dbias, int dbias_dt, u64 rows, u64 cols,
        // const float* scale, float* amax): dout, pre (when given; unused and null otherwise)
        // and dst hold rows × cols elements, dst_t too or is null (the kernel then skips the
        // transposed store); cols (and rows with dst_t) are multiples of 8 and the buffers
        // 16-byte aligned, as the tiles need; `partial` holds ⌈rows / 64⌉ × cols f32 (just
        // sized), one row per grid x index; the counters hold FP8_COUNTERS ≥ grid y u32, zero
        // between launches (each launch's finishing blocks reset theirs; launches are ordered
        // on the one stream, so no two use them at once); dbias holds cols values of the dtype
        // `dbias_code` names; block QT_THREADS as the kernel's __launch_bounds__; scale/amax at
        // slot (checked).
        unsafe {
            self.launcher(&f)
                .grid(grid)
                .block((QT_THREADS, 1, 1))
                .arg_buf(dout)
                .arg_ptr(gelu_pre.map_or(0, CudaBuffer::ptr))
                .arg_buf(dst)
                .arg_ptr(dst_t.map_or(0, |t| t.ptr()))
                .arg_ptr(partial)
                .arg_ptr(self.fp8_counters.ptr())
                .arg_buf(dbias)
                .arg_i32(dbias_code)
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .launch()
        }
    }

    fn quantize_fp8_gelu(&self, args: Checked<QuantizeFp8Gelu<'_, Self::Buffer>>) -> Result<()> {
        let QuantizeFp8Gelu {
            pre,
            dst,
            dst_t,
            rows,
            cols,
            scale,
            amax,
            slot,
        } = args.into_inner();
        self.quantize_from(
            QuantOf::Gelu,
            pre,
            dst,
            dst_t,
            rows,
            cols,
            scale,
            amax,
            slot,
        )
    }

    /// LayerNorm forward with the FP8 quantisation of its output (see
    /// [`duet_device::Fp8Ops::layernorm_forward_fp8`]).
    fn layernorm_forward_fp8(
        &self,
        args: Checked<LayerNormForwardFp8<'_, Self::Buffer>>,
    ) -> Result<()> {
        let LayerNormForwardFp8 {
            x,
            gamma,
            beta,
            mean,
            rstd,
            dst,
            dst_t,
            n,
            c,
            eps,
            scale,
            amax,
            slot,
        } = args.into_inner();
        const OP: &str = "layernorm_forward_fp8";
        let act = x.dtype();
        let (sa, ds) = Self::quantize_suffixes(OP, x, dst)?;
        // The kernels take gamma and beta in one dtype, the activations' or f32.
        let sp = wide_suffix(OP, act, "gamma", gamma.dtype())?;
        check_dtype(OP, beta, gamma.dtype())?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ci) = (dim(OP, "n", n)?, dim(OP, "c", c)?);
        // layernorm_forward's plan for these operands (its `out` would be a fresh, aligned
        // allocation), so the row statistics are computed in its order.
        let plan = norm::plan(
            c,
            act,
            aligned16(&[x.ptr(), gamma.ptr(), beta.ptr()]),
            false,
        );
        let smem = if dst_t.is_some() {
            LNQ_ROWS * c.div_ceil(128) * 128
        } else {
            0
        };
        let codes_aligned =
            aligned16(&[dst.ptr()]) && dst_t.as_deref().is_none_or(|t| aligned16(&[t.ptr()]));
        // (Rows as int in the kernel, up to the last block's end.)
        let fused = matches!(dst.dtype(), DType::F8E4M3 | DType::F8E5M2)
            && n.next_multiple_of(LNQ_ROWS) <= i32::MAX as usize
            && codes_aligned
            && (smem <= SMEM_DEFAULT || smem <= self.lnq_smem_cap());
        // Wide rows: statistics, then the 64 × 64 tile kernel (see the module documentation).
        if let Some(p) = plan.filter(|p| {
            p.vec
                && use_ln_split(c)
                && c.is_multiple_of(VEC)
                && (dst_t.is_none() || n.is_multiple_of(VEC))
                && codes_aligned
                && matches!(dst.dtype(), DType::F8E4M3 | DType::F8E5M2)
        }) {
            self.layernorm_stats(x, mean, rstd, n, c, eps, p)?;
            let f = self.func(
                KernelModule::Fp8,
                &format!("layernorm_quant_t_{sa}_{sp}_{ds}"),
            )?;
            let grid = Self::tile_grid(OP, n, c)?;
            // SAFETY: layernorm_quant_t_A_P_D(const A* x, const P* gamma, const P* beta,
            // const float* mean, const float* rstd, D* dst, D* dst_t, u64 rows, u64 cols,
            // const float* scale, float* amax): x, dst (and dst_t, or null) hold n·c elements,
            // gamma/beta c, mean/rstd n (checked, mean/rstd written by the launch above on the
            // same stream); the 64 × 64 tile grid of n × c with c a multiple of 8 (and n too
            // with dst_t), 16-byte aligned x/gamma/beta/dst/dst_t (checked above);
            // scale/amax at slot (checked).
            return unsafe {
                self.launcher(&f)
                    .grid(grid)
                    .block((QT_THREADS, 1, 1))
                    .arg_buf(x)
                    .arg_buf(gamma)
                    .arg_buf(beta)
                    .arg_buf(mean)
                    .arg_buf(rstd)
                    .arg_buf(dst)
                    .arg_ptr(dst_t.map_or(0, |t| t.ptr()))
                    .arg_u64(n as u64)
                    .arg_u64(c as u64)
                    .arg_ptr(scale.ptr_at(slot))
                    .arg_ptr(amax.ptr_at(slot))
                    .launch()
            };
        }
        // The one-pass kernel holds at most 24 elements per thread (two rows in flight).
        let Some(p) = plan.filter(|p| fused && p.elements(act) <= LNQ_MAX_ELEMENTS) else {
            // The trait's default: layernorm_forward into a temporary, then quantize_fp8.
            return composed::layernorm_forward_fp8(
                self,
                LayerNormForwardFp8 {
                    x,
                    gamma,
                    beta,
                    mean,
                    rstd,
                    dst,
                    dst_t,
                    n,
                    c,
                    eps,
                    scale,
                    amax,
                    slot,
                }
                .check()?,
            );
        };
        let v = if p.vec { 'v' } else { 's' };
        let f = self.func(
            KernelModule::Fp8,
            &format!("layernorm_fp8_{sa}_{sp}_{v}_{ds}"),
        )?;
        if smem > SMEM_DEFAULT {
            // Always the same (largest) value, so no later call lowers it under a recorded launch.
            f.set_attribute(
                cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.lnq_smem_cap() as i32,
            )
            .map_err(drv("cuFuncSetAttribute"))?;
        }
        let (_, threads) = p.block(norm::LN_WARPS);
        let grid = (grid_dim(OP, n.div_ceil(LNQ_ROWS))?, 1, 1);
        // SAFETY: layernorm_fp8_A_P_{v|s}_D(const A* x, const P* gamma, const P* beta,
        // float* mean, float* rstd, D* dst, D* dst_t, int n, int c, float eps, int G,
        // const float* scale, float* amax): x, dst (and dst_t, or null: no transposed store)
        // hold n·c elements, gamma/beta c, mean/rstd n (checked); block b touches rows
        // [32b, 32b + 32) ∩ [0, n) only; the block is the plan's ⌊8 / G⌋ row groups of G warps
        // (≤ 256 threads, the kernel's __launch_bounds__); vector loads only when the plan says
        // so (16-byte aligned x/gamma/beta, c a multiple of the vector width), code stores of
        // at most 8 bytes at multiples of their size from 16-byte aligned dst/dst_t; the
        // dynamic shared tile is 32 rows of ⌈c / 128⌉ · 128 bytes (allowed above 48 KiB by the
        // attribute set above, within the device's opt-in limit); scale/amax at slot (checked).
        unsafe {
            self.launcher(&f)
                .grid(grid)
                .block((threads, 1, 1))
                .shared_mem(smem as u32)
                .arg_buf(x)
                .arg_buf(gamma)
                .arg_buf(beta)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_buf(dst)
                .arg_ptr(dst_t.map_or(0, |t| t.ptr()))
                .arg_i32(ni)
                .arg_i32(ci)
                .arg_f32(eps)
                .arg_i32(p.g as i32)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .launch()
        }
    }

    /// An FP8 GEMM with a bias, bias + residual or bias + GELU epilogue (bias, residual and
    /// pre-activation in C's dtype). Where cuBLASLt refuses one (remembered), the FP8 GEMM and
    /// the separate ops.
    fn gemm_fp8_epilogue(&self, args: Checked<GemmFp8Epilogue<'_, Self::Buffer>>) -> Result<()> {
        if !self.capabilities().fp8_gemm_epilogue(args.c.dtype()) {
            return composed::gemm_fp8_epilogue(self, args);
        }
        let GemmFp8Epilogue {
            desc,
            a,
            b,
            c,
            scale_inv,
            a_slot,
            b_slot,
            epilogue,
        } = args.into_inner();
        const OP8: &str = "gemm_fp8_epilogue";
        blaslt::validate(desc, a, b, c, scale_inv, a_slot, b_slot, self.cc)?;
        let dt = c.dtype();
        if !matches!(dt, DType::BF16 | DType::F16) {
            return Err(DeviceError::Unsupported {
                op: format!("{OP8} (C must be bf16 or f16)"),
                dtype: dt,
            });
        }
        // One dense C (the fallback adds the bias over whole rows of C); alpha 1 and beta 0,
        // and residual and pre of C's length, where the epilogue needs them.
        // The epilogues take the bias (n elements), residual and pre in C's dtype.
        let check_bias = |bias: &CudaBuffer| -> Result<()> {
            check_dtype(OP8, bias, dt)?;
            duet_device::check_len(OP8, "bias", bias, desc.n)
        };
        let (slots, scales) = ((a_slot, b_slot), scale_inv);
        match epilogue {
            Epilogue::Bias(bias) | Epilogue::BiasResidual { bias, .. } => {
                check_bias(bias)?;
                let residual = match epilogue {
                    Epilogue::BiasResidual { residual, .. } => {
                        check_dtype(OP8, residual, dt)?;
                        Some(residual)
                    }
                    _ => None,
                };
                let epi = match residual {
                    Some(r) => LtEpilogue::BiasResidual {
                        bias: bias.ptr(),
                        dtype: dt,
                        residual: r.ptr(),
                    },
                    None => LtEpilogue::Bias {
                        bias: bias.ptr(),
                        dtype: dt,
                    },
                };
                let what =
                    "the FP8 GEMM's bias epilogue (the bias then added by a separate kernel)";
                let fused = self.lt_unless_refused(REFUSED_FP8_BIAS, what, || {
                    self.with_lt(OP8, |lt| {
                        lt.gemm_fp8(&self.stream, desc, a, b, c, scales, slots, epi)
                    })
                });
                if fused {
                    return Ok(());
                }
                match residual {
                    Some(r) => {
                        self.copy(r, 0, c, 0, c.len())?;
                        let acc = GemmDesc { beta: 1.0, ..*desc };
                        self.exec(GemmFp8 {
                            desc: &acc,
                            a,
                            b,
                            c,
                            scale_inv: scales,
                            a_slot,
                            b_slot,
                        })?;
                    }
                    None => self.exec(GemmFp8 {
                        desc,
                        a,
                        b,
                        c,
                        scale_inv: scales,
                        a_slot,
                        b_slot,
                    })?,
                }
                self.exec(BiasAdd {
                    x: c,
                    bias,
                    rows: desc.m,
                    c: desc.n,
                })
            }
            Epilogue::BiasGelu { bias, pre } => {
                check_bias(bias)?;
                check_dtype(OP8, &*pre, dt)?;
                if !desc.n.is_multiple_of(8) {
                    return Err(DeviceError::InvalidArgument(format!(
                        "{OP8}: n {} must be a multiple of 8 for a GELU epilogue",
                        desc.n
                    )));
                }
                let epi = LtEpilogue::GeluAuxBias {
                    bias: bias.ptr(),
                    dtype: dt,
                    aux: pre.ptr(),
                    ld: desc.ldc as i64,
                };
                let what =
                    "the FP8 GEMM's bias + GELU epilogue (bias and GELU then by separate kernels)";
                let fused = self.lt_unless_refused(REFUSED_FP8_GELU, what, || {
                    self.with_lt(OP8, |lt| {
                        lt.gemm_fp8(&self.stream, desc, a, b, c, scales, slots, epi)
                    })
                });
                if fused {
                    return Ok(());
                }
                self.exec(GemmFp8 {
                    desc,
                    a,
                    b,
                    c: pre,
                    scale_inv: scales,
                    a_slot,
                    b_slot,
                })?;
                self.exec(BiasAdd {
                    x: pre,
                    bias,
                    rows: desc.m,
                    c: desc.n,
                })?;
                self.exec(GeluForward { x: pre, out: c })
            }
            _ => Err(DeviceError::InvalidArgument(format!(
                "{OP8}: only the bias, bias + residual and bias + GELU epilogues run on FP8 GEMMs"
            ))),
        }
    }

    fn fp8_scaling_update(&self, args: Checked<Fp8ScalingUpdate<'_, Self::Buffer>>) -> Result<()> {
        let Fp8ScalingUpdate {
            amax,
            history,
            scale,
            scale_inv,
            inv_stride,
            fp8_max,
            len,
            most_recent,
            margin,
        } = args.into_inner();
        let ops = amax.len();
        if ops == 0 {
            return Ok(());
        }
        // SAFETY: fp8_scaling_update(float* amax, float* history, float* scale,
        // float* scale_inv, u64 inv_stride, const float* fp8_max, u64 ops, u64 len,
        // int most_recent, int margin); every buffer is f32 and holds ops (history ops × len,
        // scale_inv ops × inv_stride) elements (checked above); one thread per operand.
        unsafe {
            self.kernel(KernelModule::Fp8Scaling, "fp8_scaling_update")?
                .grid((ops.div_ceil(128) as u32, 1, 1))
                .block((128, 1, 1))
                .arg_buf(amax)
                .arg_buf(history)
                .arg_buf(scale)
                .arg_buf(scale_inv)
                .arg_u64(inv_stride as u64)
                .arg_buf(fp8_max)
                .arg_u64(ops as u64)
                .arg_u64(len as u64)
                .arg_i32(most_recent as i32)
                .arg_i32(margin)
                .launch()
        }
    }

    /// [`duet_device::Fp8Ops::adamw_clipped_fp8`]: every output the fused kernel takes (a weight with no
    /// working copy, i.e. its f32 `param` is the weight, f32 moments, a gradient of f32, bf16 or
    /// f16, one output per tensor) is updated by `adamw_fp8_<D>` (one launch per FP8 dtype, the
    /// chunks of `adamw_multi`), which also writes its codes and records its amax; their
    /// transposed codes then come from those codes (`transpose_codes_many`, one launch, where
    /// rows and cols are multiples of 8; otherwise from the updated weights). The other tensors
    /// go through `adamw_multi`, and the other outputs are quantised from their updated weights
    /// afterwards (`quantize_fp8_many`), as the trait's default does. Every operand is checked
    /// before anything is launched.
    fn adamw_clipped_fp8(
        &self,
        args: Checked<AdamWClippedFp8<'_, '_, Self::Buffer>>,
    ) -> Result<()> {
        let AdamWClippedFp8 {
            tensors,
            step,
            scalars,
            outs,
            scale,
            amax,
        } = args.into_inner();
        const OP: &str = "adamw_clipped_fp8";
        let enabled = self.fused_ops() && ADAMW_FP8_FUSED_ON_THREAD.with(std::cell::Cell::get);
        let mut fused = vec![false; tensors.len()];
        // Per output: its codes (and transposed codes) come from the fused kernel.
        let mut fused_out = vec![false; outs.len()];
        // FP8 suffix → the group's chunk records and count.
        let mut groups: Vec<(&'static str, Vec<u8>, usize)> = Vec::new();
        let mut transposes: Vec<u8> = Vec::new();
        let mut transpose_blocks = 0u64;
        for (oi, o) in outs.iter().enumerate() {
            let t = &tensors[o.tensor];
            // An FP8 dtype and n = rows · cols: checked by check_adamw_fp8_outs.
            let ds = conv::kernel_suffix(o.dst.dtype()).expect("fp8 dtype");
            let n = o.rows * o.cols;
            let Ok(gdt) = float_code(OP, t.grad.dtype()) else {
                continue;
            };
            // The transposed codes from the codes: whole 8-byte vectors of 64 × 64 tiles.
            let transpose = match o.dst_t.as_deref() {
                None => None,
                Some(dt) => {
                    let tiles = (o.rows.div_ceil(QT) * o.cols.div_ceil(QT)) as u64;
                    (o.rows.is_multiple_of(VEC)
                        && o.cols.is_multiple_of(VEC)
                        && aligned16(&[o.dst.ptr(), dt.ptr()])
                        && transpose_blocks + tiles <= i32::MAX as u64)
                        .then_some((dt.ptr(), tiles))
                }
            };
            let takes = enabled
                && !fused[o.tensor]
                && t.copy.is_none()
                && [&*t.param, &*t.m, &*t.v]
                    .iter()
                    .all(|b| b.dtype() == DType::F32 && b.len() == n)
                && t.grad.len() == n
                && (o.dst_t.is_none() || transpose.is_some());
            if !takes {
                continue;
            }
            let gi = match groups.iter().position(|(k, ..)| *k == ds) {
                Some(gi) => gi,
                None => {
                    groups.push((ds, Vec::new(), 0));
                    groups.len() - 1
                }
            };
            let (_, records, count) = &mut groups[gi];
            for (offset, len) in super::optim::chunks(n) {
                for v in [
                    t.param.ptr(),
                    t.grad.ptr(),
                    t.m.ptr(),
                    t.v.ptr(),
                    o.dst.ptr(),
                    scale.ptr_at(o.slot),
                    amax.ptr_at(o.slot),
                    offset as u64,
                ] {
                    records.extend_from_slice(&v.to_le_bytes());
                }
                records.extend_from_slice(&(len as u32).to_le_bytes());
                records.extend_from_slice(&gdt.to_le_bytes());
                records.extend_from_slice(&t.weight_decay.to_le_bytes());
                records.extend_from_slice(&0u32.to_le_bytes());
                *count += 1;
            }
            if let Some((dst_t, tiles)) = transpose {
                for v in [o.dst.ptr(), dst_t, o.rows as u64, o.cols as u64] {
                    transposes.extend_from_slice(&v.to_le_bytes());
                }
                transposes.extend_from_slice(&(transpose_blocks as u32).to_le_bytes());
                transposes.extend_from_slice(&(o.cols.div_ceil(QT) as u32).to_le_bytes());
                transpose_blocks += tiles;
            }
            fused[o.tensor] = true;
            fused_out[oi] = true;
        }
        // The other tensors: adamw_multi (which checks its operands before launching).
        let mut rest: Vec<AdamWTensor<'_, CudaBuffer>> = tensors
            .iter_mut()
            .zip(&fused)
            .filter(|(_, f)| !**f)
            .map(|(t, _)| AdamWTensor {
                param: &mut *t.param,
                grad: t.grad,
                m: &mut *t.m,
                v: &mut *t.v,
                copy: t.copy.as_deref_mut(),
                weight_decay: t.weight_decay,
            })
            .collect();
        self.exec(AdamWClipped {
            tensors: &mut rest,
            step,
            scalars,
        })?;
        drop(rest);
        let s = *step;
        for (ds, records, count) in groups {
            let f = self.func(KernelModule::Fp8, &format!("adamw_fp8_{ds}"))?;
            let blocks = grid_dim(OP, count)?;
            debug_assert_eq!(records.len(), count * ADAMW_CHUNK_BYTES);
            let table = self.table(OP, records)?;
            // SAFETY: adamw_fp8_D(const AdamWFp8Chunk* chunks, const float* scalars, 5 floats):
            // `count` 80-byte records (a live device table, cached while these buffers are in
            // use), each a chunk (offset, len inside the tensor) of one tensor checked above:
            // f32 param/m/v and a gradient of the recorded dtype, n elements each, codes of
            // the group's FP8 dtype and n elements (check_adamw_fp8_outs), scale/amax that
            // output's slot (checked); no tensor in two records' tensors; `scalars` holds
            // ADAMW_SCALARS f32 (checked); the kernel moves 4-element vectors only when every
            // stream is aligned for them; block THREADS as its __launch_bounds__.
            unsafe {
                self.launcher(&f)
                    .grid((blocks, 1, 1))
                    .block((super::optim::THREADS, 1, 1))
                    .arg_ptr(table)
                    .arg_buf(scalars)
                    .arg_f32(s.beta1)
                    .arg_f32(s.beta2)
                    .arg_f32(s.eps)
                    .arg_f32(s.max_norm)
                    .arg_f32(s.loss_scale)
                    .launch()?;
            }
        }
        if transpose_blocks > 0 {
            let njobs = (transposes.len() / CODES_JOB_BYTES) as i32;
            let f = self.func(KernelModule::Fp8, "transpose_codes_many")?;
            let table = self.table(OP, transposes)?;
            // SAFETY: transpose_codes_many(const CodesJob* jobs, unsigned njobs): `njobs` (> 0)
            // 40-byte records (a live device table), each the codes of one output written
            // above (rows × cols FP8 bytes) and its transposed codes (cols × rows, checked by
            // check_adamw_fp8_outs), rows and cols multiples of 8, both 16-byte aligned;
            // tile_start increasing from 0 with ⌈rows / 64⌉ × col_tiles blocks per job,
            // `transpose_blocks` in all (< 2^31); block QT_THREADS as the kernel's
            // __launch_bounds__. Ordered after the update on the same stream.
            unsafe {
                self.launcher(&f)
                    .grid((transpose_blocks as u32, 1, 1))
                    .block((QT_THREADS, 1, 1))
                    .arg_ptr(table)
                    .arg_i32(njobs)
                    .launch()?;
            }
        }
        let count = fused.iter().filter(|f| **f).count() as u64;
        self.adamw_fp8_fused
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        // The outputs the kernel did not take: quantised from their updated weights.
        let mut jobs: Vec<Fp8QuantJob<'_, CudaBuffer>> = outs
            .iter_mut()
            .zip(&fused_out)
            .filter(|(_, f)| !**f)
            .map(|(o, _)| {
                let t = &tensors[o.tensor];
                o.job(t)
            })
            .collect();
        if jobs.is_empty() {
            return Ok(());
        }
        self.exec(QuantizeFp8Many {
            jobs: &mut jobs,
            scale,
            amax,
        })
    }
}
