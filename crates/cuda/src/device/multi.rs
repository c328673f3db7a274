//! Multi-tensor optimizer kernels: the global gradient sum of squares and AdamW over every
//! parameter in one launch each (kernels-cuda/reduce.cu `sum_squares_many_partial`,
//! kernels-cuda/adamw.cu `adamw_multi`). Each launch reads a table of chunks (a piece of one
//! tensor per block) that is built on the host, uploaded once and reused while the tensors stay
//! the same (a training run passes the same buffers every step).

use super::{CudaDevice, cfg, lock};
use crate::kernels::{self, KernelModule};
use crate::memory::{CudaBuffer, DeviceMemory};
use duet_device::{
    AdamWClipStep, AdamWTensor, Buffer, DType, Device, DeviceError, Result, check_dtype, check_len,
    check_range,
};

/// Elements per chunk (one block of THREADS threads, 64 elements each: enough blocks in flight
/// to keep these bandwidth-bound passes near the memory bandwidth). A multiple of 8, so every
/// chunk of a 256-byte aligned allocation starts 16-byte aligned for every dtype; the kernels
/// still check each address and fall back to element-wise accesses when one is not. The
/// sum-of-squares partition (and so its rounding) depends on it: changing it changes the last
/// bits of `sum_squares_many`.
const CHUNK: usize = 1 << 14;
/// Threads per block of sum_squares_many_partial, adamw_multi and adamw_fp8_*: the kernels are
/// built for exactly this (SUMSQ_THREADS in reduce.cu, `__launch_bounds__` in adamw.cu and
/// fp8.cu).
pub(super) const THREADS: u32 = 256;
/// Most tables kept on the device.
const MAX_TABLES: usize = 8;

/// Uploaded chunk tables, keyed by their bytes.
#[derive(Default)]
pub(super) struct Tables {
    entries: Vec<(Vec<u8>, DeviceMemory)>,
}

/// The dtype code of the AdamW chunk tables (`grad_dt`, `copy_dt`: 0 f32, 1 bf16, 2 f16).
pub(super) fn dt_code(op: &'static str, d: DType) -> Result<i32> {
    match d {
        DType::F32 => Ok(0),
        DType::BF16 => Ok(1),
        DType::F16 => Ok(2),
        dtype => Err(DeviceError::Unsupported {
            op: op.into(),
            dtype,
        }),
    }
}

/// `(offset, len)` of each chunk of a tensor of `n` elements.
pub(super) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |k| (k * CHUNK, CHUNK.min(n - k * CHUNK)))
}

impl CudaDevice {
    /// The device address of `table` (uploading it unless an identical one is cached). Also the
    /// job table of `quantize_fp8_many` (device/fp8.rs).
    pub(super) fn table(&self, op: &'static str, table: Vec<u8>) -> Result<u64> {
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

    pub(super) fn zero_many_impl(&self, dsts: &mut [&mut CudaBuffer]) -> Result<()> {
        const OP: &str = "zero_many";
        // Chunks of CHUNK · 4 bytes; every chunk start stays 16-byte aligned (allocations are
        // 256-byte aligned and the chunk size is a multiple of 16).
        let bytes_per = CHUNK * 4;
        let mut table = Vec::new();
        let mut count = 0usize;
        for d in dsts.iter() {
            let bytes = d.size_bytes();
            for k in 0..bytes.div_ceil(bytes_per) {
                let len = bytes_per.min(bytes - k * bytes_per);
                table.extend_from_slice(&(d.ptr() + (k * bytes_per) as u64).to_le_bytes());
                table.extend_from_slice(&(len as u64).to_le_bytes());
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = super::grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        let f = self.func(KernelModule::Reduce, "zero_many")?;
        // SAFETY: zero_many(const ZeroChunk*): `count` 16-byte records, each a byte range
        // inside one of the live buffers in `dsts`, starting 16-byte aligned.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((blocks, 1, 1), (256, 1, 1)),
                &[table.into()],
            )
        }
    }

    pub(super) fn sum_squares_many_impl(
        &self,
        xs: &[&CudaBuffer],
        out: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "sum_squares_many";
        check_dtype(OP, out, DType::F32)?;
        check_range(OP, slot, 1, out.len())?;
        let mut table = Vec::new();
        let mut count = 0usize;
        for x in xs {
            let dt = dt_code(OP, x.dtype())?;
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
        let blocks = super::grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, count * 8, &self.mem)?;
        let fp = self.func(KernelModule::Reduce, "sum_squares_many_partial")?;
        // SAFETY: sum_squares_many_partial(const SumSqChunk*, double*): `count` 32-byte chunk
        // records (ptr, offset, len, dtype) describing ranges inside live buffers, and `count`
        // doubles of scratch. The kernel reads 16-byte packs only from chunks whose start is
        // 16-byte aligned, and only whole packs inside the chunk.
        unsafe {
            kernels::launch(
                &self.stream,
                &fp,
                cfg((blocks, 1, 1), (THREADS, 1, 1)),
                &[table.into(), partial.into()],
            )?;
        }
        // SAFETY: `count` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, partial, count, out, slot) }
    }

    pub(super) fn adamw_clipped_impl(
        &self,
        tensors: &mut [AdamWTensor<'_, CudaBuffer>],
        step: &AdamWClipStep,
        scalars: &CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "adamw_clipped";
        check_dtype(OP, scalars, DType::F32)?;
        check_range(OP, 0, duet_device::ADAMW_SCALARS, scalars.len())?;
        let mut table = Vec::new();
        let mut count = 0usize;
        let mut fp8_copies = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            let n = t.param.len();
            check_dtype(OP, &*t.param, DType::F32)?;
            check_dtype(OP, &*t.m, DType::F32)?;
            check_dtype(OP, &*t.v, DType::F32)?;
            check_len(OP, "grad", t.grad, n)?;
            check_len(OP, "m", &*t.m, n)?;
            check_len(OP, "v", &*t.v, n)?;
            let gdt = dt_code(OP, t.grad.dtype())?;
            let (copy, cdt) = match t.copy.as_deref() {
                None => (0u64, 0i32),
                Some(c) => {
                    check_len(OP, "param_copy", c, n)?;
                    if c.dtype().is_fp8() {
                        // Written by a cast after the update.
                        fp8_copies.push(i);
                        (0, 0)
                    } else {
                        (c.ptr(), dt_code(OP, c.dtype())?)
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
            let blocks = super::grid_dim(OP, count)?;
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
                kernels::launch(
                    &self.stream,
                    &f,
                    cfg((blocks, 1, 1), (THREADS, 1, 1)),
                    &[
                        table.into(),
                        scalars.ptr().into(),
                        s.beta1.into(),
                        s.beta2.into(),
                        s.eps.into(),
                        s.max_norm.into(),
                        s.loss_scale.into(),
                    ],
                )?;
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
