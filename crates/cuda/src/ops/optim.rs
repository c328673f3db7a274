//! [`OptimOps`] for [`CudaDevice`]: AdamW and the gradient sum of squares.
//!
//! Multi-tensor optimizer kernels: the global gradient sum of squares and AdamW over every
//! parameter in one launch each (kernels-cuda/reduce.cu `sum_squares_many_partial`,
//! kernels-cuda/adamw.cu `adamw_multi`). Each launch reads a table of chunks (a piece of one
//! tensor per block) that is built on the host, uploaded once and reused while the tensors stay
//! the same (a training run passes the same buffers every step).

use super::prelude::*;
use crate::memory::DeviceMemory;

/// Elements per chunk (one block of THREADS threads, 64 elements each: enough blocks in flight
/// to keep these bandwidth-bound passes near the memory bandwidth). A multiple of 8, so every
/// chunk of a 256-byte aligned allocation starts 16-byte aligned for every dtype; the kernels
/// still check each address and fall back to element-wise accesses when one is not. The
/// sum-of-squares partition (and so its rounding) depends on it: changing it changes the last
/// bits of `sum_squares_many`.
pub(crate) const CHUNK: usize = 1 << 14;
/// Threads per block of sum_squares_many_partial, adamw_multi and adamw_fp8_*: the kernels are
/// built for exactly this (SUMSQ_THREADS in reduce.cu, `__launch_bounds__` in adamw.cu and
/// fp8.cu).
pub(crate) const THREADS: u32 = 256;
/// Most tables kept on the device.
const MAX_TABLES: usize = 8;

/// `(offset, len)` of each chunk of a tensor of `n` elements.
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |k| (k * CHUNK, CHUNK.min(n - k * CHUNK)))
}

impl CudaDevice {
    /// The device address of `table` (uploading it unless an identical one is cached). Also the
    /// job table of `quantize_fp8_many` (ops/fp8.rs).
    pub(crate) fn table(&self, op: &'static str, table: Vec<u8>) -> Result<u64> {
        let mut tables = lock(&self.tables, op)?;
        if let Some((_, mem)) = tables.entries.iter().find(|(k, _)| *k == table) {
            return Ok(mem.ptr());
        }
        if tables.entries.len() >= MAX_TABLES {
            tables.entries.remove(0);
        }
        let mut mem = CudaBuffer::new(
            Some(DeviceMemory::zeroed(
                &self.ctx,
                &self.stream,
                table.len(),
                &self.mem,
            )?),
            DType::U8,
            table.len(),
        );
        self.upload_bytes(&table, &mut mem, 0)?;
        let ptr = mem.ptr();
        let mem = mem.into_memory().expect("non-empty table");
        tables.entries.push((table, mem));
        Ok(ptr)
    }
}

impl OptimOps for CudaDevice {
    fn adamw(&self, args: Checked<AdamWUpdate<'_, Self::Buffer>>) -> Result<()> {
        let AdamWUpdate {
            param,
            grad,
            m,
            v,
            step,
            param_copy,
        } = args.into_inner();
        const OP: &str = "adamw";
        let n = param.len();
        let sg = float_suffix(OP, grad.dtype())?;
        // The fused kernel writes f32/f16/bf16 copies; an fp8 copy is a cast afterwards.
        let (fused_copy, cast_copy) = match param_copy {
            None => (None, None),
            Some(pc) if pc.dtype().is_fp8() => (None, Some(pc)),
            Some(pc) => (Some(pc), None),
        };
        if n == 0 {
            return Ok(());
        }
        let sc = fused_copy
            .as_ref()
            .map(|pc| float_suffix(OP, pc.dtype()))
            .transpose()?
            .unwrap_or("f32");
        let copy_ptr = fused_copy.as_ref().map(|pc| pc.ptr()).unwrap_or(0);
        let st = *step;
        // SAFETY: adamw_G_C(float*, const G*, float*, float*, C* (nullable), u64 n, 8 floats):
        // param/m/v are f32 × n, grad and the copy n elements of their dtypes.
        unsafe {
            self.kernel(KernelModule::AdamW, &format!("adamw_{sg}_{sc}"))?
                .grid(self.grid_1d(n))
                .block((EW_BLOCK, 1, 1))
                .arg_buf(param)
                .arg_buf(grad)
                .arg_buf(m)
                .arg_buf(v)
                .arg_ptr(copy_ptr)
                .arg_u64(n as u64)
                .arg_f32(st.lr)
                .arg_f32(st.beta1)
                .arg_f32(st.beta2)
                .arg_f32(st.eps)
                .arg_f32(st.weight_decay)
                .arg_f32(st.bias_correction1)
                .arg_f32(st.bias_correction2)
                .arg_f32(st.grad_scale)
                .launch()?;
        }
        if let Some(pc) = cast_copy {
            self.cast(param, pc, 1.0)?;
        }
        Ok(())
    }

    fn sum_squares(&self, args: Checked<SumSquares<'_, Self::Buffer>>) -> Result<()> {
        let SumSquares { x, out, slot } = args.into_inner();
        const OP: &str = "sum_squares";
        let n = x.len();
        // The kernels read f32, f16 and bf16 (no FP8).
        let s = float_suffix(OP, x.dtype())?;
        if n == 0 {
            return Ok(());
        }
        // The partition depends on n only (never on the GPU), so results are reproducible.
        let blocks = n.div_ceil(256 * 16).clamp(1, 1024);
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, blocks * 8, &self.mem)?;
        // SAFETY: sum_squares_partial(const T*, u64 n, double*): x holds n elements, the
        // scratch `blocks` doubles (one per block).
        unsafe {
            self.kernel(KernelModule::Reduce, &format!("sum_squares_partial_{s}"))?
                .grid((blocks as u32, 1, 1))
                .block((256, 1, 1))
                .arg_buf(x)
                .arg_u64(n as u64)
                .arg_ptr(partial)
                .launch()?;
        }
        // SAFETY: `blocks` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, partial, blocks, out, slot) }
    }

    fn sum_squares_many(&self, args: Checked<SumSquaresMany<'_, Self::Buffer>>) -> Result<()> {
        let SumSquaresMany { xs, out, slot } = args.into_inner();
        const OP: &str = "sum_squares_many";
        let mut table = Vec::new();
        let mut count = 0usize;
        for x in xs {
            // The kernel reads f32, f16 and bf16 (no FP8).
            let dt = float_code(OP, x.dtype())?;
            for (offset, len) in chunks(x.len()) {
                table.extend_from_slice(&x.ptr().to_le_bytes());
                table.extend_from_slice(&(offset as u64).to_le_bytes());
                table.extend_from_slice(&(len as u64).to_le_bytes());
                table.extend_from_slice(&dt.to_le_bytes());
                table.extend_from_slice(&0i32.to_le_bytes());
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, count * 8, &self.mem)?;
        // SAFETY: sum_squares_many_partial(const SumSqChunk*, double*): `count` 32-byte chunk
        // records (ptr, offset, len, dtype) describing ranges inside live buffers, and `count`
        // doubles of scratch. The kernel reads 16-byte packs only from chunks whose start is
        // 16-byte aligned, and only whole packs inside the chunk.
        unsafe {
            self.kernel(KernelModule::Reduce, "sum_squares_many_partial")?
                .grid((blocks, 1, 1))
                .block((THREADS, 1, 1))
                .arg_ptr(table)
                .arg_ptr(partial)
                .launch()?;
        }
        // SAFETY: `count` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, partial, count, out, slot) }
    }

    fn adamw_clipped(&self, args: Checked<AdamWClipped<'_, '_, Self::Buffer>>) -> Result<()> {
        let AdamWClipped {
            tensors,
            step,
            scalars,
        } = args.into_inner();
        const OP: &str = "adamw_clipped";
        let mut table = Vec::new();
        let mut count = 0usize;
        let mut fp8_copies = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let n = t.param.len();
            let gdt = float_code(OP, t.grad.dtype())?;
            let (copy, cdt) = match t.copy.as_deref() {
                None => (0u64, 0i32),
                Some(c) => {
                    if c.dtype().is_fp8() {
                        // Written by a cast after the update.
                        fp8_copies.push(i);
                        (0, 0)
                    } else {
                        (c.ptr(), float_code(OP, c.dtype())?)
                    }
                }
            };
            for (offset, len) in chunks(n) {
                for p in [t.param.ptr(), t.grad.ptr(), t.m.ptr(), t.v.ptr(), copy] {
                    table.extend_from_slice(&p.to_le_bytes());
                }
                table.extend_from_slice(&(offset as u64).to_le_bytes());
                table.extend_from_slice(&(len as u32).to_le_bytes());
                table.extend_from_slice(&gdt.to_le_bytes());
                table.extend_from_slice(&cdt.to_le_bytes());
                table.extend_from_slice(&t.weight_decay.to_le_bytes());
                count += 1;
            }
        }
        if count > 0 {
            let blocks = grid_dim(OP, count)?;
            let table = self.table(OP, table)?;
            let f = self.func(KernelModule::AdamW, "adamw_multi")?;
            let s = *step;
            // SAFETY: adamw_multi(const AdamWChunk*, const float* scalars, 5 floats): `count`
            // 64-byte chunk records describing ranges inside live f32 param/m/v buffers, a grad
            // and an optional copy of the recorded dtypes (lengths checked above); `scalars`
            // holds ADAMW_SCALARS f32. The kernel moves 4-element vectors only when every
            // stream's chunk start is aligned for them, and only whole vectors inside the
            // chunk; the block size is its `__launch_bounds__`.
            unsafe {
                self.launcher(&f)
                    .grid((blocks, 1, 1))
                    .block((THREADS, 1, 1))
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
        for i in fp8_copies {
            let t = &mut tensors[i];
            if let Some(c) = t.copy.as_deref_mut() {
                self.cast(t.param, c, 1.0)?;
            }
        }
        Ok(())
    }
}

impl CudaDevice {
    /// `out[slot] += Σ partial[0..count)` in a fixed order (sum_squares_finish in reduce.cu).
    ///
    /// # Safety
    /// `partial` must hold `count` f64 partial sums written by earlier queued work, and `slot`
    /// must lie inside `out` (f32).
    pub(crate) unsafe fn sum_squares_finish(
        &self,
        op: &'static str,
        partial: u64,
        count: usize,
        out: &CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        let count = i32::try_from(count).map_err(|_| too_large(op, "partials", count))?;
        // SAFETY: sum_squares_finish(const double*, int count, float*, u64 slot), one block of
        // 256 threads; sizes from the caller.
        unsafe {
            self.kernel(KernelModule::Reduce, "sum_squares_finish")?
                .grid((1, 1, 1))
                .block((256, 1, 1))
                .arg_ptr(partial)
                .arg_i32(count)
                .arg_buf(out)
                .arg_u64(slot as u64)
                .launch()
        }
    }
}
