//! FP8 quantisation (kernels-cuda/fp8.cu): [`Device::quantize_fp8`] and the fused gradient
//! variant [`Device::quantize_fp8_grad`].
//!
//! Paths, chosen from the shape only (buffers are allocation-aligned):
//! * no transposed copy: `quantize_<S>_<D>`, a grid-stride loop over 8-element vectors with a
//!   scalar tail (any length);
//! * with `dst_t`, rows and cols multiples of 8: `quantize_t_<S>_<D>`, 64 × 64 tiles with
//!   16-byte loads and 8-byte stores of `dst` and `dst_t`;
//! * with `dst_t` otherwise: `quantize_t_scalar_<S>_<D>`, 32 × 32 tiles, one element per thread.
//!
//! The gradient variant runs the tile kernel on `g` (`quantize_grad_t` / `quantize_dgelu_t`),
//! which also writes one f32 column-sum row per 64-row tile into the device scratch, then
//! `colsum_finish` adds those rows into `dbias` in tile order: deterministic, no float atomics.
//! Shapes the tile kernel cannot take (cols not a multiple of 8, or rows not a multiple of 8 with
//! `dst_t`) run the separate ops, like the trait's default.

use super::*;

/// Tile edge of the vectorised kernels (`QT` in fp8.cu).
const QT: usize = 64;
/// Threads per block of the vectorised tile kernels (`QT_THREADS` in fp8.cu).
const QT_THREADS: u32 = 128;
/// Elements per vector: one 8-byte group of FP8 codes.
const VEC: usize = 8;

/// Whether every address is 16-byte aligned (always true for allocations; checked anyway, since
/// the vector kernels would fault otherwise).
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|p| p.is_multiple_of(16))
}

impl CudaDevice {
    /// Checks the operands of a quantisation of a `rows × cols` matrix `src` into `dst` (and
    /// `dst_t`) and returns the kernel suffixes of the source and FP8 dtypes and the length.
    #[allow(clippy::too_many_arguments)]
    fn quantize_check(
        op: &'static str,
        src: &CudaBuffer,
        dst: &CudaBuffer,
        dst_t: Option<&CudaBuffer>,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &CudaBuffer,
        slot: usize,
    ) -> Result<(&'static str, &'static str, usize)> {
        let ss = float_sfx(op, src.dtype())?;
        if !dst.dtype().is_fp8() {
            return Err(DeviceError::Unsupported {
                op: op.into(),
                dtype: dst.dtype(),
            });
        }
        let ds = conv::kernel_suffix(dst.dtype()).expect("fp8 dtype");
        let n = mul(op, &[rows, cols])?;
        check_len(op, "src", src, n)?;
        check_len(op, "dst", dst, n)?;
        if let Some(t) = dst_t {
            check_dtype(op, t, dst.dtype())?;
            check_len(op, "dst_t", t, n)?;
        }
        check_dtype(op, scale, DType::F32)?;
        check_dtype(op, amax, DType::F32)?;
        check_range(op, slot, 1, scale.len())?;
        check_range(op, slot, 1, amax.len())?;
        Ok((ss, ds, n))
    }

    /// Grid of the 64 × 64 tile kernels: x over row tiles, y over column tiles.
    fn tile_grid(op: &'static str, rows: usize, cols: usize) -> Result<(u32, u32, u32)> {
        let y = cols.div_ceil(QT);
        Ok((
            grid_dim(op, rows.div_ceil(QT))?,
            u32::try_from(y)
                .ok()
                .filter(|&g| g <= 65535)
                .ok_or_else(|| error::too_large(op, "cols / 64", y))?,
            1,
        ))
    }

    /// FP8 quantisation (see [`Device::quantize_fp8`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quantize_fp8_impl(
        &self,
        src: &CudaBuffer,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "quantize_fp8";
        let (ss, ds, n) = Self::quantize_check(
            OP,
            src,
            dst,
            dst_t.as_deref(),
            rows,
            cols,
            scale,
            amax,
            slot,
        )?;
        if n == 0 {
            return Ok(());
        }
        let Some(t) = dst_t else {
            // SAFETY: quantize_S_D(const S*, D*, u64 n, const float* scale, float* amax):
            // src and dst hold n elements (16-byte aligned allocations; the kernel moves 8
            // elements at a time and finishes the n % 8 tail one by one); scale and amax point
            // at slot < len (checked).
            return unsafe {
                self.launch_1d(
                    KernelModule::Fp8,
                    &format!("quantize_{ss}_{ds}"),
                    n.div_ceil(VEC),
                    &[
                        src.ptr().into(),
                        dst.ptr().into(),
                        (n as u64).into(),
                        scale.ptr_at(slot).into(),
                        amax.ptr_at(slot).into(),
                    ],
                )
            };
        };
        let args = [
            src.ptr().into(),
            dst.ptr().into(),
            t.ptr().into(),
            (rows as u64).into(),
            (cols as u64).into(),
            scale.ptr_at(slot).into(),
            amax.ptr_at(slot).into(),
        ];
        if rows.is_multiple_of(VEC)
            && cols.is_multiple_of(VEC)
            && aligned16(&[src.ptr(), dst.ptr(), t.ptr()])
        {
            let f = self.func(KernelModule::Fp8, &format!("quantize_t_{ss}_{ds}"))?;
            let grid = Self::tile_grid(OP, rows, cols)?;
            // SAFETY: quantize_t_S_D(const S*, D*, D* dst_t, u64 rows, u64 cols, const float*,
            // float*): src, dst and dst_t hold rows × cols elements; rows and cols are
            // multiples of 8 and the buffers 16-byte aligned, as the 64 × 64 tiles need
            // (every 8-element vector is bounds-checked as a whole); block QT_THREADS as the
            // kernel's __launch_bounds__; scale/amax at slot (checked).
            unsafe { kernels::launch(&self.stream, &f, cfg(grid, (QT_THREADS, 1, 1)), &args) }
        } else {
            let f = self.func(KernelModule::Fp8, &format!("quantize_t_scalar_{ss}_{ds}"))?;
            let grid = (
                grid_dim(OP, cols.div_ceil(32))?,
                u32::try_from(rows.div_ceil(32))
                    .ok()
                    .filter(|&g| g <= 65535)
                    .ok_or_else(|| error::too_large(OP, "rows / 32", rows.div_ceil(32)))?,
                1,
            );
            // SAFETY: quantize_t_scalar_S_D has the same parameters as quantize_t_S_D; its
            // 32 × 32 tiles (block (32, 8)) guard every index against rows and cols.
            unsafe { kernels::launch(&self.stream, &f, cfg(grid, (32, 8, 1)), &args) }
        }
    }

    /// Fused gradient quantisation (see [`Device::quantize_fp8_grad`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn quantize_fp8_grad_impl(
        &self,
        dout: &CudaBuffer,
        gelu_pre: Option<&CudaBuffer>,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        dbias: &mut CudaBuffer,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "quantize_fp8_grad";
        let (ss, ds, n) = Self::quantize_check(
            OP,
            dout,
            dst,
            dst_t.as_deref(),
            rows,
            cols,
            scale,
            amax,
            slot,
        )?;
        if let Some(pre) = gelu_pre {
            check_dtype(OP, pre, dout.dtype())?;
            check_len(OP, "gelu_pre", pre, n)?;
        }
        float_sfx(OP, dbias.dtype())?;
        check_len(OP, "dbias", dbias, cols)?;
        let mut ptrs = vec![dout.ptr(), dst.ptr()];
        ptrs.extend(gelu_pre.map(CudaBuffer::ptr));
        ptrs.extend(dst_t.as_deref().map(CudaBuffer::ptr));
        let fused = cols.is_multiple_of(VEC)
            && (dst_t.is_none() || rows.is_multiple_of(VEC))
            && aligned16(&ptrs);
        if !fused {
            // The trait's default: the separate ops (g in a temporary with gelu_pre).
            let tmp;
            let g = match gelu_pre {
                Some(pre) => {
                    let mut t = self.alloc(dout.dtype(), n)?;
                    self.gelu_backward(pre, dout, &mut t)?;
                    tmp = t;
                    &tmp
                }
                None => dout,
            };
            self.bias_backward(g, dbias, rows, cols)?;
            return self.quantize_fp8_impl(g, dst, dst_t, rows, cols, scale, amax, slot);
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
        let tiles = rows.div_ceil(QT);
        let part_bytes = mul(OP, &[tiles, cols, 4])?;
        // The scratch is sized on the first (unrecorded) call of a shape; later calls, recorded
        // ones included, reuse it.
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, part_bytes, &self.mem)?;
        // SAFETY: quantize_{grad,dgelu}_t_S_D(const S* dout, const S* pre, D* dst, D* dst_t,
        // float* partial, u64 rows, u64 cols, const float* scale, float* amax): dout, pre (when
        // given; unused and null otherwise) and dst hold rows × cols elements, dst_t too or is
        // null (the kernel then skips the transposed store); cols (and rows with dst_t) are
        // multiples of 8 and the buffers 16-byte aligned, as the tiles need; `partial` holds
        // ⌈rows / 64⌉ × cols f32 (just sized), one row per grid x index; block QT_THREADS as
        // the kernel's __launch_bounds__; scale/amax at slot (checked).
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg(grid, (QT_THREADS, 1, 1)),
                &[
                    dout.ptr().into(),
                    gelu_pre.map_or(0, CudaBuffer::ptr).into(),
                    dst.ptr().into(),
                    dst_t.map_or(0, |t| t.ptr()).into(),
                    partial.into(),
                    (rows as u64).into(),
                    (cols as u64).into(),
                    scale.ptr_at(slot).into(),
                    amax.ptr_at(slot).into(),
                ],
            )?;
        }
        // SAFETY: `partial` holds `tiles` rows of cols f32, all written by the kernel above
        // (every row tile writes every column); dbias holds cols elements of a float type.
        unsafe { self.colsum_finish(OP, partial, dbias.ptr(), dbias.dtype(), tiles, cols) }
    }
}
