//! The optimizer ops: AdamW and the sum of squares (kernels-hip/adamw.hip, reduce.hip). HIP has
//! no multi-tensor kernels (the trait's defaults run).

use super::prelude::*;
use duet_device::AdamWStep;

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
