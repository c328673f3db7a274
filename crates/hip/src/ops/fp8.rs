//! [`duet_device::Fp8Ops`] on HIP: quantisation (kernels-hip/fp8.hip), FP8 GEMMs through
//! hipBLASLt, the fused FP8 paths and the AdamW step that writes FP8 codes.

use super::prelude::*;
use super::{THREADS, push_u64};
use crate::blas;

impl Fp8Ops for HipDevice {
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
        const OP: &str = "quantize_fp8";
        let desc = RowsDesc::new(OP, rows, cols)?;
        let n = desc.total;
        let s = float_suffix(OP, src.dtype())?;
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
        if n == 0 {
            return Ok(());
        }
        // With a transposed copy, the tiled kernel (coalesced transposed stores); else, or past
        // its grid, the grid-stride one. Both take the same arguments.
        let (name, grid) = match (dst_t.is_some(), tile_grid(rows, cols)) {
            (true, Some(grid)) => (format!("quantize_tiled_{s}_{d}"), grid),
            _ => (format!("quantize_{s}_{d}"), self.grid_1d(n)),
        };
        // SAFETY: quantize_S_D / quantize_tiled_S_D: src, dst (and dst_t) hold rows × cols
        // elements; scale/amax at slot (checked); the tiled kernel gets one block per 32 × 32
        // tile (tile_grid).
        unsafe { self.launch_quantize(&name, grid, src, dst, dst_t, rows, cols, scale, amax, slot) }
    }

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
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        blas::fp8_check(&self.arch_base, a.dtype(), c.dtype())?;
        let scales = (scale_inv.ptr_at(a_slot), scale_inv.ptr_at(b_slot));
        self.with_lt("gemm_fp8", a.dtype(), |lt| {
            blas::gemm_fp8(
                lt,
                &self.arch_base,
                self.stream.raw(),
                desc,
                a,
                b,
                c,
                Some(scales),
            )
        })
    }

    /// [`duet_device::Fp8Ops::quantize_fp8_many`] in one launch (kernels-hip/fp8.hip
    /// `quantize_many`): one block per 32 × 32 tile of every job, the tiles of
    /// `quantize_tiled_S_D`, so the codes and amaxes are those of the jobs run one by one. The
    /// tile table is uploaded once and reused while the jobs stay the same (a model's weights
    /// at every step, also from `adamw_clipped_fp8`'s composition).
    fn quantize_fp8_many(
        &self,
        args: Checked<QuantizeFp8Many<'_, '_, Self::Buffer>>,
    ) -> Result<()> {
        let QuantizeFp8Many { jobs, scale, amax } = args.into_inner();
        const OP: &str = "quantize_fp8_many";
        let mut table = Vec::new();
        let mut count = 0usize;
        for j in jobs.iter() {
            let sdt = float_code(OP, j.src.dtype())?;
            let ddt = fp8_code(j.dst.dtype()).ok_or_else(|| unsupported(OP, j.dst.dtype()))?;
            let (rows, cols) = (j.rows, j.cols);
            if rows == 0 || cols == 0 {
                continue;
            }
            if u32::try_from(rows).is_err() || u32::try_from(cols).is_err() {
                return Err(duet_gpu::launch::kernel_too_large(
                    "HIP",
                    OP,
                    "rows or cols",
                    rows.max(cols),
                ));
            }
            let dst_t = j.dst_t.as_deref().map_or(0, |t| t.ptr() as u64);
            for r0 in (0..rows).step_by(32) {
                for c0 in (0..cols).step_by(32) {
                    for v in [
                        j.src.ptr() as u64,
                        j.dst.ptr() as u64,
                        dst_t,
                        rows as u64,
                        cols as u64,
                    ] {
                        push_u64(&mut table, v);
                    }
                    table.extend_from_slice(&(r0 as u32).to_le_bytes());
                    table.extend_from_slice(&(c0 as u32).to_le_bytes());
                    table.extend_from_slice(&sdt.to_le_bytes());
                    table.extend_from_slice(&ddt.to_le_bytes());
                    table.extend_from_slice(&(j.slot as u32).to_le_bytes());
                    table.extend_from_slice(&0u32.to_le_bytes());
                    count += 1;
                }
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        // SAFETY: quantize_many(const DuetQuantTile*, const float* scale, float* amax): `count`
        // 64-byte records, each a 32 × 32 tile (clipped to the job) of a job whose src, dst and
        // optional dst_t hold rows × cols elements of the recorded dtypes, and whose slot lies
        // inside scale and amax (all checked by check_fp8_quant_jobs).
        unsafe {
            self.kernel("quantize_many")?
                .grid((blocks, 1, 1))
                .arg_ptr(table)
                .arg_buf(scale)
                .arg_buf(amax)
                .launch()
        }
    }

    /// [`duet_device::Fp8Ops::quantize_fp8_grad`] in one pass (kernels-hip/fp8.hip
    /// `quantize_grad[_gelu]_S_D`, then `colsum_finish` over its per-tile column sums): the
    /// gradient (with GELU's backward on load) quantised and transposed per 32 × 32 tile, never
    /// written itself. Codes and amax are the composition's bits; `dbias` adds the rows in tile
    /// order (32-row tiles, then the tiles), so it may differ from `bias_backward` in the last
    /// bits, as the trait allows.
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
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let Some(grid) = tile_grid(rows, cols) else {
            // Past the tiled kernel's grid: the composition, its intermediate kept.
            return match gelu_pre {
                Some(pre) => self.with_workspace(dout.dtype(), dout.len(), |g| {
                    self.exec(GeluBackward {
                        x: pre,
                        dout,
                        dx: g,
                    })?;
                    self.exec(BiasBackward {
                        dout: g,
                        dbias,
                        rows,
                        c: cols,
                    })?;
                    self.exec(QuantizeFp8 {
                        src: g,
                        dst,
                        dst_t,
                        rows,
                        cols,
                        scale,
                        amax,
                        slot,
                    })
                }),
                None => {
                    self.exec(BiasBackward {
                        dout,
                        dbias,
                        rows,
                        c: cols,
                    })?;
                    self.exec(QuantizeFp8 {
                        src: dout,
                        dst,
                        dst_t,
                        rows,
                        cols,
                        scale,
                        amax,
                        slot,
                    })
                }
            };
        };
        const OP: &str = "quantize_fp8_grad";
        let s = float_suffix(OP, dout.dtype())?;
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
        let tile_rows = grid.1 as usize;
        let scratch = self.scratch(tile_rows * cols)?;
        let part = scratch.ptr();
        let dst_t = dst_t.map_or(std::ptr::null_mut(), |t| t.ptr());
        // SAFETY: quantize_grad[_gelu]_S_D(const S* dout, [const S* pre,] D* dst, D* dst_t (or
        // null), float* partial, u64 rows, u64 cols, const float* scale, float* amax): dout,
        // pre, dst (and dst_t) hold rows × cols elements, scale/amax at slot (validated above);
        // `part` holds (tile rows) × cols f32 (just sized, held until the finish below); one
        // block per 32 × 32 tile.
        unsafe {
            let launch = match gelu_pre {
                Some(pre) => self
                    .kernel(&format!("quantize_grad_gelu_{s}_{d}"))?
                    .arg_buf(dout)
                    .arg_buf(pre),
                None => self
                    .kernel(&format!("quantize_grad_{s}_{d}"))?
                    .arg_buf(dout),
            };
            launch
                .grid(grid)
                .arg_buf(dst)
                .arg_ptr(dst_t)
                .arg_ptr(part)
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .launch()?;
        }
        let so = float_suffix(OP, dbias.dtype())?;
        // SAFETY: colsum_finish_T(const float* partial, T* out, u64 chunks, u64 cols): the
        // (tile rows) × cols partials written above; dbias holds cols elements (validated);
        // 32 columns per block.
        unsafe {
            self.kernel(&format!("colsum_finish_{so}"))?
                .grid((grid_dim(OP, cols.div_ceil(32))?, 1, 1))
                .arg_ptr(part)
                .arg_buf(dbias)
                .arg_u64(tile_rows as u64)
                .arg_u64(cols as u64)
                .launch()
        }
    }

    /// [`duet_device::Fp8Ops::quantize_fp8_gelu`] in one pass (kernels-hip/fp8.hip
    /// `quantize_gelu_S_D`): gelu(pre) rounded to pre's dtype, quantised and transposed through
    /// a shared-memory tile, the activation never written; the composition's bits.
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
        let Some(grid) = tile_grid(rows, cols) else {
            // Past the tiled kernel's grid: GELU into a kept workspace, then the quantisation.
            return self.with_workspace(pre.dtype(), pre.len(), |h| {
                self.exec(GeluForward { x: pre, out: h })?;
                self.exec(QuantizeFp8 {
                    src: h,
                    dst,
                    dst_t,
                    rows,
                    cols,
                    scale,
                    amax,
                    slot,
                })
            });
        };
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let s = float_suffix("quantize_fp8_gelu", pre.dtype())?;
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
        // SAFETY: quantize_gelu_S_D(const S* pre, D* dst, D* dst_t (or null), u64 rows,
        // u64 cols, const float* scale, float* amax): pre, dst (and dst_t) hold rows × cols
        // elements, scale/amax at slot (validated above); one block per 32 × 32 tile.
        unsafe {
            self.launch_quantize(
                &format!("quantize_gelu_{s}_{d}"),
                grid,
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
    }

    /// [`duet_device::Fp8Ops::layernorm_forward_fp8`] in one pass (kernels-hip/layernorm.hip
    /// `layernorm_forward_fp8_A_P_D`): the rows' statistics as `layernorm_forward` computes
    /// them (for a vectorised plan by `layernorm_stats_*` first), the normalised output rounded
    /// to x's dtype and quantised (with the transpose through a shared-memory tile), never
    /// written: the composition's bits.
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
        if n == 0 || c == 0 {
            return Ok(());
        }
        let sa = float_suffix(OP, x.dtype())?;
        let sp = wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        same_dtype(OP, gamma.dtype(), &[beta])?;
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
        // Where layernorm_forward runs its vectorised kernels, their statistics (the same plan,
        // the same bits), then the one-pass kernel reading them.
        let given = match self.ln_vec_plan(&[x, gamma, beta], x.dtype(), c, false) {
            Some(p) => {
                self.layernorm_stats(OP, p, x, mean, rstd, n, c, eps)?;
                1
            }
            None => 0,
        };
        // SAFETY: layernorm_forward_fp8_A_P_D(const A* x, const P* gamma, const P* beta,
        // float* mean, float* rstd, D* dst, D* dst_t (or null), int n, int c, float eps,
        // const float* scale, float* amax, int given): x, dst (and dst_t) hold n·c elements,
        // gamma/beta c, mean/rstd n, scale/amax at slot (validated above); with `given` mean
        // and rstd were written just before on the same stream; one block per 32 rows.
        unsafe {
            self.kernel(&format!("{OP}_{sa}_{sp}_{d}"))?
                .grid((grid_dim(OP, n.div_ceil(32))?, 1, 1))
                .arg_buf(x)
                .arg_buf(gamma)
                .arg_buf(beta)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_buf(dst)
                .arg_ptr(dst_t.map_or(std::ptr::null_mut(), |t| t.ptr()))
                .arg_i32(dim(OP, "n", n)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_f32(eps)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .arg_i32(given)
                .launch()
        }
    }

    /// [`duet_device::Fp8Ops::fp8_scaling_update`] on the device (kernels-hip/fp8_scaling.hip,
    /// CUDA's kernel and bits): no download or upload, so a recorded step can include it.
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
        let blocks = grid_dim("fp8_scaling_update", ops.div_ceil(256))?;
        // SAFETY: fp8_scaling_update(float* amax, float* history, float* scale,
        // float* scale_inv, u64 inv_stride, const float* fp8_max, u64 ops, u64 len,
        // int most_recent, int margin); every buffer is f32 and holds ops (history ops × len,
        // scale_inv ops × inv_stride) elements (checked above); one thread per operand.
        unsafe {
            self.kernel("fp8_scaling_update")?
                .grid((blocks, 1, 1))
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

    /// [`duet_device::Fp8Ops::adamw_clipped_fp8`]: the weights that get FP8 codes are updated by
    /// `adamw_fp8_tiles` (kernels-hip/adamw.hip), one block per 32 × 32 tile, which writes the
    /// moments, the master weight and the working copy and, from the copy's value in
    /// registers, the codes, their transpose (through shared memory) and the amax: the copy is
    /// not read back. Every other tensor goes through `adamw_multi`. The bits of
    /// `adamw_clipped` followed by `quantize_fp8_many` (its composition), which runs instead
    /// when a weight is named twice or has an FP8 working copy.
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
        let mut fused = vec![false; tensors.len()];
        let mut composed = false;
        for o in outs.iter() {
            let t = &tensors[o.tensor];
            let fp8_copy = t.copy.as_deref().is_some_and(|c| c.dtype().is_fp8());
            if fused[o.tensor]
                || fp8_copy
                || u32::try_from(o.rows).is_err()
                || u32::try_from(o.cols).is_err()
            {
                composed = true;
            }
            fused[o.tensor] = true;
        }
        if composed {
            self.adamw_clipped_except(tensors, &[], step, scalars)?;
            let mut jobs: Vec<_> = outs.iter_mut().map(|o| o.job(&tensors[o.tensor])).collect();
            return self.exec(QuantizeFp8Many {
                jobs: &mut jobs,
                scale,
                amax,
            });
        }
        let mut table = Vec::new();
        let mut count = 0usize;
        for o in outs.iter() {
            let t = &tensors[o.tensor];
            let gdt = float_code(OP, t.grad.dtype())?;
            let (copy, cdt) = match t.copy.as_deref() {
                None => (0u64, 0i32),
                Some(c) => (c.ptr() as u64, float_code(OP, c.dtype())?),
            };
            let ddt = fp8_code(o.dst.dtype()).ok_or_else(|| unsupported(OP, o.dst.dtype()))?;
            let dst_t = o.dst_t.as_deref().map_or(0, |d| d.ptr() as u64);
            for r0 in (0..o.rows).step_by(32) {
                for c0 in (0..o.cols).step_by(32) {
                    for p in [t.param.ptr(), t.grad.ptr(), t.m.ptr(), t.v.ptr()] {
                        push_u64(&mut table, p as u64);
                    }
                    for v in [
                        copy,
                        o.dst.ptr() as u64,
                        dst_t,
                        o.rows as u64,
                        o.cols as u64,
                    ] {
                        push_u64(&mut table, v);
                    }
                    for v in [r0 as u32, c0 as u32] {
                        table.extend_from_slice(&v.to_le_bytes());
                    }
                    for v in [gdt, cdt, ddt] {
                        table.extend_from_slice(&v.to_le_bytes());
                    }
                    table.extend_from_slice(&(o.slot as u32).to_le_bytes());
                    table.extend_from_slice(&t.weight_decay.to_le_bytes());
                    table.extend_from_slice(&0u32.to_le_bytes());
                    count += 1;
                }
            }
        }
        if count > 0 {
            let blocks = grid_dim(OP, count)?;
            let table = self.table(OP, table)?;
            let s = *step;
            // SAFETY: adamw_fp8_tiles(const DuetAdamWFp8Tile*, const float* scalars, 5 floats,
            // const float* scale, float* amax): `count` 104-byte records, each a 32 × 32 tile
            // (clipped to rows × cols) of a weight whose f32 param/m/v, grad and optional copy
            // hold rows × cols elements of the recorded dtypes and whose dst (and dst_t) hold
            // as many codes (validate_adamw_clipped, check_adamw_fp8_outs); slot inside scale
            // and amax; each weight in one job only (checked above), so no element is updated
            // twice; `scalars` holds ADAMW_SCALARS f32.
            unsafe {
                self.kernel("adamw_fp8_tiles")?
                    .grid((blocks, 1, 1))
                    .block((THREADS, 1, 1))
                    .arg_ptr(table)
                    .arg_buf(scalars)
                    .arg_f32(s.beta1)
                    .arg_f32(s.beta2)
                    .arg_f32(s.eps)
                    .arg_f32(s.max_norm)
                    .arg_f32(s.loss_scale)
                    .arg_buf(scale)
                    .arg_buf(amax)
                    .launch()?;
            }
        }
        self.adamw_clipped_except(tensors, &fused, step, scalars)
    }
}

impl HipDevice {
    /// Launches one of the quantisation kernels that share the argument list `(const S* src,
    /// D* dst, D* dst_t (or null), u64 rows, u64 cols, const float* scale, float* amax)`:
    /// quantize_S_D, quantize_tiled_S_D, quantize_gelu_S_D (kernels-hip/fp8.hip), with the
    /// scale and amax of `slot`.
    ///
    /// # Safety
    /// `src`, `dst` and `dst_t` must hold `rows × cols` elements of the kernel's dtypes, `slot`
    /// must lie inside `scale` and `amax`, and `grid` must be the kernel's grid for the shape.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_quantize(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        src: &HipBuffer,
        dst: &mut HipBuffer,
        dst_t: Option<&mut HipBuffer>,
        rows: usize,
        cols: usize,
        scale: &HipBuffer,
        amax: &mut HipBuffer,
        slot: usize,
    ) -> Result<()> {
        // SAFETY: guaranteed by the caller.
        unsafe {
            self.kernel(name)?
                .grid(grid)
                .arg_buf(src)
                .arg_buf(dst)
                .arg_ptr(dst_t.map_or(std::ptr::null_mut(), |t| t.ptr()))
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .launch()
        }
    }

    /// Runs `f` on a buffer of `len` elements of `dtype` (contents undefined) that the device
    /// keeps for the next call of the same size: the compositions of the FP8 fusions allocate
    /// nothing per call, so a step that uses them can be recorded (the first, unrecorded step
    /// allocates them; a new size while recording is refused).
    fn with_workspace<R>(
        &self,
        dtype: DType,
        len: usize,
        f: impl FnOnce(&mut HipBuffer) -> Result<R>,
    ) -> Result<R> {
        let lock = || {
            self.workspaces
                .lock()
                .map_err(|_| DeviceError::InvalidArgument("workspace lock poisoned".into()))
        };
        let found = {
            let mut ws = lock()?;
            ws.idle
                .iter()
                .position(|b| b.dtype() == dtype && b.len() == len)
                .map(|i| ws.idle.swap_remove(i))
        };
        let mut buf = match found {
            Some(b) => b,
            None => {
                self.not_while_capturing("allocating an FP8 workspace")?;
                self.alloc(dtype, len)?
            }
        };
        let r = f(&mut buf);
        let mut ws = lock()?;
        if ws.idle.len() >= MAX_WORKSPACES {
            ws.idle.remove(0);
        }
        ws.idle.push(buf);
        r
    }
}

/// The grid of the tiled quantisation kernels (one block per 32 × 32 tile), or `None` past
/// HIP's 65535 blocks in y (over two million rows: the untiled kernels take those).
fn tile_grid(rows: usize, cols: usize) -> Option<(u32, u32, u32)> {
    let (gx, gy) = (cols.div_ceil(32).max(1), rows.div_ceil(32).max(1));
    (gy <= 65_535 && gx <= i32::MAX as usize).then_some((gx as u32, gy as u32, 1))
}

/// Most workspaces kept ([`HipDevice::with_workspace`]).
const MAX_WORKSPACES: usize = 16;

/// The tile table's codes of an FP8 dtype (kernels-hip/fp8.hip `DuetQuantTile::ddt`).
fn fp8_code(d: DType) -> Option<i32> {
    match d {
        DType::F8E4M3 => Some(0),
        DType::F8E5M2 => Some(1),
        DType::F8E4M3Fnuz => Some(2),
        DType::F8E5M2Fnuz => Some(3),
        _ => None,
    }
}
