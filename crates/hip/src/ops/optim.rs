//! [`duet_device::OptimOps`] on HIP: AdamW and the sum of squares (kernels-hip/adamw.hip,
//! reduce.hip), per tensor and multi-tensor. As on CUDA (crates/cuda/src/ops/optim.rs, the same
//! table layouts and chunk size), the multi-tensor launches read a table of chunks (a piece of
//! one tensor per block) built on the host, uploaded once and reused while the tensors stay the
//! same ([`HipDevice::table`]), and the clipped AdamW takes its per-step values from a device
//! buffer: the whole update queues without a host synchronisation, so a step can be recorded in
//! a graph.

use super::prelude::*;
use super::{THREADS, chunks, push_u64};
use duet_device::{AdamWClipStep, AdamWTensor};

/// Most blocks of a `sum_squares` partial pass (fixed by n alone, so results are deterministic).
const SUMSQ_BLOCKS: usize = 1024;
/// Elements per block of a `sum_squares` partial pass before the cap: the CUDA backend's grid
/// (`n.div_ceil(256 * 16).clamp(1, 1024)`), so the partition and the f64 sums are its bits.
const SUMSQ_PER_BLOCK: usize = 256 * 16;

impl OptimOps for HipDevice {
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

    fn sum_squares(&self, args: Checked<SumSquares<'_, Self::Buffer>>) -> Result<()> {
        let SumSquares { x, out, slot } = args.into_inner();
        const OP: &str = "sum_squares";
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

    fn sum_squares_many(&self, args: Checked<SumSquaresMany<'_, Self::Buffer>>) -> Result<()> {
        let SumSquaresMany { xs, out, slot } = args.into_inner();
        const OP: &str = "sum_squares_many";
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

    fn adamw_clipped(&self, args: Checked<AdamWClipped<'_, '_, Self::Buffer>>) -> Result<()> {
        let AdamWClipped {
            tensors,
            step,
            scalars,
        } = args.into_inner();
        self.adamw_clipped_except(tensors, &[], step, scalars)
    }
}

impl HipDevice {
    /// [`duet_device::OptimOps::adamw_clipped`] on every tensor whose `skip` entry is not `true`
    /// (missing entries count as `false`); the arguments are validated by the caller. Also the
    /// tensors without FP8 codes of [`duet_device::Fp8Ops::adamw_clipped_fp8`] (ops/fp8.rs).
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
}
