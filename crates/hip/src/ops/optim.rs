//! The optimizer ops: AdamW and the sum of squares (kernels-hip/adamw.hip, reduce.hip), per
//! tensor and multi-tensor. As on CUDA (crates/cuda/src/ops/optim.rs, the same table layouts and
//! chunk size), the multi-tensor launches read a table of chunks (a piece of one tensor per
//! block) built on the host, uploaded once and reused while the tensors stay the same, and the
//! clipped AdamW takes its per-step values from a device buffer: the whole update queues without
//! a host synchronisation, so a step can be recorded in a graph.

use super::prelude::*;
use duet_device::{AdamWClipStep, AdamWStep, AdamWTensor};

/// Elements per chunk of the multi-tensor passes: CUDA's `CHUNK`. The sum-of-squares partition
/// (and so its rounding) depends on it; equal to CUDA's, the partials are CUDA's bits.
pub(crate) const CHUNK: usize = 1 << 14;
/// Threads per block of sum_squares_many_partial, adamw_multi and zero_many (DUET_BLOCK; CUDA's
/// THREADS, which the per-thread order of the sums depends on).
pub(crate) const THREADS: u32 = 256;
/// Most tables kept on the device.
const MAX_TABLES: usize = 8;

/// Uploaded chunk tables, keyed by their bytes.
#[derive(Default)]
pub(crate) struct Tables {
    entries: Vec<(Vec<u8>, HipBuffer)>,
}

/// `(offset, len)` of each chunk of a tensor of `n` elements.
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |k| (k * CHUNK, CHUNK.min(n - k * CHUNK)))
}

/// Appends `v` to a kernel table, little-endian (the layout every table here uses).
pub(super) fn push_u64(table: &mut Vec<u8>, v: u64) {
    table.extend_from_slice(&v.to_le_bytes());
}

impl HipDevice {
    /// The device address of `table` (uploading it unless an identical one is cached; never
    /// while a graph is being recorded: the first, unrecorded step uploads every table).
    pub(crate) fn table(&self, op: &'static str, table: Vec<u8>) -> Result<*mut std::ffi::c_void> {
        let mut tables = self
            .tables
            .lock()
            .map_err(|_| DeviceError::InvalidArgument(format!("{op}: table lock poisoned")))?;
        if let Some((_, mem)) = tables.entries.iter().find(|(k, _)| *k == table) {
            return Ok(mem.ptr());
        }
        self.not_while_capturing(&format!("{op}: uploading a new chunk table"))?;
        if tables.entries.len() >= MAX_TABLES {
            tables.entries.remove(0);
        }
        let mut mem = self.alloc_impl(DType::U8, table.len())?;
        self.upload_bytes_impl(&table, &mut mem, 0)?;
        let ptr = mem.ptr();
        tables.entries.push((table, mem));
        Ok(ptr)
    }

    pub(crate) fn sum_squares_many_impl(
        &self,
        xs: &[&HipBuffer],
        out: &mut HipBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "sum_squares_many";
        args::validate_sum_squares_many(xs, out, slot)?;
        let mut table = Vec::new();
        let mut count = 0usize;
        for x in xs {
            let dt = float_code(OP, x.dtype())?;
            for (offset, len) in chunks(x.len()) {
                push_u64(&mut table, x.ptr() as u64);
                push_u64(&mut table, offset as u64);
                push_u64(&mut table, len as u64);
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
        // One f64 per chunk: two f32 slots each (the scratch is 256-byte aligned).
        let scratch = self.scratch(2 * count)?;
        let part = scratch.ptr();
        // SAFETY: sum_squares_many_partial(const DuetSumSqChunk*, double*): `count` 32-byte
        // records (ptr, offset, len, dtype code) describing ranges inside the live buffers of
        // `xs` (each chunk within its buffer's length), and `count` doubles of scratch.
        unsafe {
            self.kernel("sum_squares_many_partial")?
                .grid((blocks, 1, 1))
                .block((THREADS, 1, 1))
                .arg_ptr(table)
                .arg_ptr(part)
                .launch()?;
        }
        // SAFETY: `count` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, part, count, out, slot) }
    }

    pub(crate) fn adamw_clipped_impl(
        &self,
        tensors: &mut [AdamWTensor<'_, HipBuffer>],
        step: &AdamWClipStep,
        scalars: &HipBuffer,
    ) -> Result<()> {
        args::validate_adamw_clipped(tensors, scalars)?;
        self.adamw_clipped_except(tensors, &[], step, scalars)
    }

    /// [`HipDevice::adamw_clipped_impl`] on every tensor whose `skip` entry is not `true`
    /// (missing entries count as `false`); the arguments are validated by the caller.
    pub(crate) fn adamw_clipped_except(
        &self,
        tensors: &mut [AdamWTensor<'_, HipBuffer>],
        skip: &[bool],
        step: &AdamWClipStep,
        scalars: &HipBuffer,
    ) -> Result<()> {
        const OP: &str = "adamw_clipped";
        let mut table = Vec::new();
        let mut count = 0usize;
        let mut fp8_copies = Vec::new();
        for (i, t) in tensors.iter().enumerate() {
            if skip.get(i).copied().unwrap_or(false) {
                continue;
            }
            let gdt = float_code(OP, t.grad.dtype())?;
            let (copy, cdt) = match t.copy.as_deref() {
                None => (0u64, 0i32),
                // An FP8 copy is written by a cast after the update (as on CUDA).
                Some(c) if c.dtype().is_fp8() => {
                    fp8_copies.push(i);
                    (0, 0)
                }
                Some(c) => (c.ptr() as u64, float_code(OP, c.dtype())?),
            };
            for (offset, len) in chunks(t.param.len()) {
                for p in [t.param.ptr(), t.grad.ptr(), t.m.ptr(), t.v.ptr()] {
                    push_u64(&mut table, p as u64);
                }
                push_u64(&mut table, copy);
                push_u64(&mut table, offset as u64);
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
            let s = *step;
            // SAFETY: adamw_multi(const DuetAdamWChunk*, const float* scalars, 5 floats):
            // `count` 64-byte records describing ranges inside live f32 param/m/v buffers, a
            // grad and an optional copy of the recorded dtypes (lengths checked by
            // validate_adamw_clipped); `scalars` holds ADAMW_SCALARS f32.
            unsafe {
                self.kernel("adamw_multi")?
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

    pub(crate) fn zero_many_impl(&self, dsts: &mut [&mut HipBuffer]) -> Result<()> {
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
                push_u64(&mut table, d.ptr() as u64 + (k * bytes_per) as u64);
                push_u64(&mut table, len as u64);
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        // SAFETY: zero_many(const DuetZeroChunk*): `count` 16-byte records, each a byte range
        // inside one of the live buffers in `dsts`, starting 16-byte aligned.
        unsafe {
            self.kernel("zero_many")?
                .grid((blocks, 1, 1))
                .block((THREADS, 1, 1))
                .arg_ptr(table)
                .launch()
        }
    }
}

/// Most blocks of a `sum_squares` partial pass (fixed by n alone, so results are deterministic).
const SUMSQ_BLOCKS: usize = 1024;
/// Elements per block of a `sum_squares` partial pass before the cap: the CUDA backend's grid
/// (`n.div_ceil(256 * 16).clamp(1, 1024)`), so the partition and the f64 sums are its bits.
const SUMSQ_PER_BLOCK: usize = 256 * 16;

impl HipDevice {
    pub(crate) fn adamw_impl(
        &self,
        param: &mut HipBuffer,
        grad: &HipBuffer,
        m: &mut HipBuffer,
        v: &mut HipBuffer,
        step: &AdamWStep,
        param_copy: Option<&mut HipBuffer>,
    ) -> Result<()> {
        const OP: &str = "adamw";
        let n = args::validate_adamw(param, grad, m, v, param_copy.as_deref())?;
        let g = float_suffix(OP, grad.dtype())?;
        let (copy, cdt) = match param_copy {
            Some(c) => (c.ptr(), c.dtype()),
            None => (std::ptr::null_mut(), DType::F32),
        };
        let sc = kernel_suffix(cdt).expect("a float dtype");
        let s = step;
        // SAFETY: adamw_G_C(float* param, const G* grad, float* m, float* v, C* copy (nullable),
        // u64 n, 8 floats): param/m/v are f32 × n, grad and the copy n elements of their dtypes
        // (checked).
        unsafe {
            self.kernel(&format!("adamw_{g}_{sc}"))?
                .grid(self.grid_1d(n))
                .arg_buf(param)
                .arg_buf(grad)
                .arg_buf(m)
                .arg_buf(v)
                .arg_ptr(copy)
                .arg_u64(n as u64)
                .arg_f32(s.lr)
                .arg_f32(s.beta1)
                .arg_f32(s.beta2)
                .arg_f32(s.eps)
                .arg_f32(s.weight_decay)
                .arg_f32(s.bias_correction1)
                .arg_f32(s.bias_correction2)
                .arg_f32(s.grad_scale)
                .launch()
        }
    }

    pub(crate) fn sum_squares_impl(
        &self,
        x: &HipBuffer,
        out: &mut HipBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "sum_squares";
        args::validate_sum_squares(x, out, slot)?;
        let s = kernel_suffix(x.dtype()).ok_or_else(|| unsupported(OP, x.dtype()))?;
        // The partition depends on n only (never on the GPU), so results are reproducible.
        let blocks = x.len().div_ceil(SUMSQ_PER_BLOCK).clamp(1, SUMSQ_BLOCKS);
        // One f64 per block: two f32 slots each (the scratch is 256-byte aligned).
        let scratch = self.scratch(2 * blocks)?;
        let part = scratch.ptr();
        // SAFETY: sum_squares_partial_T(const T* x, u64 n, double* partial): x holds n
        // elements, the scratch `blocks` f64 (one per block).
        unsafe {
            self.kernel(&format!("sum_squares_partial_{s}"))?
                .grid((blocks as u32, 1, 1))
                .arg_buf(x)
                .arg_u64(x.len() as u64)
                .arg_ptr(part)
                .launch()?;
        };
        // SAFETY: `blocks` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, part, blocks, out, slot) }
    }
}

impl HipDevice {
    /// [`duet_device::Fused::adamw_clipped_fp8`]: the weights that get FP8 codes are updated by
    /// `adamw_fp8_tiles` (kernels-hip/adamw.hip), one block per 32 × 32 tile, which writes the
    /// moments, the master weight and the working copy and, from the copy's value in
    /// registers, the codes, their transpose (through shared memory) and the amax: the copy is
    /// not read back. Every other tensor goes through `adamw_multi`. The bits of
    /// `adamw_clipped` followed by `quantize_fp8_many` (its composition), which runs instead
    /// when a weight is named twice or has an FP8 working copy.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn adamw_clipped_fp8_impl(
        &self,
        tensors: &mut [AdamWTensor<'_, HipBuffer>],
        step: &AdamWClipStep,
        scalars: &HipBuffer,
        outs: &mut [duet_device::AdamWFp8Out<'_, HipBuffer>],
        scale: &HipBuffer,
        amax: &mut HipBuffer,
    ) -> Result<()> {
        const OP: &str = "adamw_clipped_fp8";
        args::validate_adamw_clipped(tensors, scalars)?;
        duet_device::check_adamw_fp8_outs(OP, tensors, outs, scale, amax)?;
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
            return self.quantize_fp8_many_impl(&mut jobs, scale, amax);
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
            let ddt = super::fp8::fp8_code(o.dst.dtype())
                .ok_or_else(|| unsupported(OP, o.dst.dtype()))?;
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
