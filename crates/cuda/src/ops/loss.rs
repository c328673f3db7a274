//! The loss: fused softmax + cross-entropy (kernels-cuda/cross_entropy.cu).

use super::prelude::*;
use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute;

impl CudaDevice {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cross_entropy_impl(
        &self,
        logits: &CudaBuffer,
        targets: &CudaBuffer,
        losses: &mut CudaBuffer,
        dlogits: Option<&mut CudaBuffer>,
        n: usize,
        v: usize,
        ld: usize,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "cross_entropy";
        RowsDesc::new(OP, n, ld)?.validate_cross_entropy(
            logits,
            targets,
            losses,
            dlogits.as_deref(),
            v,
        )?;
        let s = float_suffix(OP, logits.dtype())?;
        if let Some(d) = &dlogits {
            // The kernels write dlogits in the logits' dtype.
            check_dtype(OP, *d, logits.dtype())?;
        }
        if n == 0 {
            return Ok(());
        }
        let dptr = dlogits.map(|d| d.ptr()).unwrap_or(0);
        let block = duet_device::cross_entropy_threads(v);
        let (f, cache) = self.ce_func(&format!("cross_entropy_{s}"), logits.dtype(), v)?;
        // SAFETY: cross_entropy(const T*, const int*, float*, T* (nullable), int v, int ld,
        // float, unsigned*, int cached): one block per row < n over logits/dlogits (n·ld,
        // checked, v ≤ ld), targets and losses (n); with `cached`, `cache` bytes of dynamic
        // shared memory hold the row's ceil(v / 8) groups of 8 elements (allowed by ce_func).
        unsafe {
            self.launcher(&f)
                .grid((grid_dim(OP, n)?, 1, 1))
                .block((block, 1, 1))
                .arg_buf(logits)
                .arg_buf(targets)
                .arg_buf(losses)
                .arg_ptr(dptr)
                .arg_i32(dim(OP, "v", v)?)
                .arg_i32(dim(OP, "ld", ld)?)
                .arg_f32(grad_scale)
                .arg_ptr(self.err_word.ptr())
                .arg_i32((cache > 0) as i32)
                .shared_mem(cache)
                .launch()
        }
    }

    /// [`duet_device::Fused::cross_entropy_in_place`]: kernels-cuda/cross_entropy.cu's
    /// `cross_entropy_in_place_T` (the gradient over the logits, one block per row).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cross_entropy_in_place_impl(
        &self,
        logits: &mut CudaBuffer,
        targets: &CudaBuffer,
        losses: &mut CudaBuffer,
        n: usize,
        v: usize,
        ld: usize,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "cross_entropy_in_place";
        RowsDesc::new(OP, n, ld)?.validate_cross_entropy(&*logits, targets, losses, None, v)?;
        let s = float_suffix(OP, logits.dtype())?;
        if n == 0 {
            return Ok(());
        }
        let block = duet_device::cross_entropy_threads(v);
        let (f, cache) = self.ce_func(&format!("cross_entropy_in_place_{s}"), logits.dtype(), v)?;
        // SAFETY: cross_entropy_in_place(T* logits, const int*, float*, int v, int ld, float,
        // unsigned*, int cached): one block per row < n over logits (n·ld, checked, v ≤ ld;
        // each element read and then overwritten by the same thread, after the block's
        // reductions), targets and losses (n); `cache` bytes of dynamic shared memory as in
        // cross_entropy_impl.
        unsafe {
            self.launcher(&f)
                .grid((grid_dim(OP, n)?, 1, 1))
                .block((block, 1, 1))
                .arg_buf(logits)
                .arg_buf(targets)
                .arg_buf(losses)
                .arg_i32(dim(OP, "v", v)?)
                .arg_i32(dim(OP, "ld", ld)?)
                .arg_f32(grad_scale)
                .arg_ptr(self.err_word.ptr())
                .arg_i32((cache > 0) as i32)
                .shared_mem(cache)
                .launch()
        }
    }

    /// The cross-entropy kernel `name` and the dynamic shared memory its rows of `v` logits of
    /// `dtype` are cached in: ceil(v / 8) groups of 8 elements, where that fits in what a block
    /// may have beside the kernel's static reduction array (then the function is allowed that
    /// much), else 0 (the kernel reads the row from global memory once per pass; the same bits).
    fn ce_func(&self, name: &str, dtype: DType, v: usize) -> Result<(CudaFunction, u32)> {
        /// The kernels' static shared memory (block_max/block_sum's 32 floats).
        const STATIC: usize = 32 * 4;
        let f = self.func(KernelModule::CrossEntropy, name)?;
        let bytes = v.div_ceil(8) * 8 * dtype.size_bytes();
        let have = self.smem_optin;
        if bytes == 0 || bytes + STATIC > have {
            return Ok((f, 0));
        }
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
        .map_err(drv("cuFuncSetAttribute"))?;
        Ok((f, bytes as u32))
    }
}
