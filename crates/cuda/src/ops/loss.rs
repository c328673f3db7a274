//! The loss: fused softmax + cross-entropy (kernels-cuda/cross_entropy.cu).

use super::prelude::*;

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
        // SAFETY: cross_entropy(const T*, const int*, float*, T* (nullable), int v, int ld,
        // float, unsigned*): one block per row < n over logits/dlogits (n·ld, checked, v ≤ ld),
        // targets and losses (n).
        unsafe {
            self.kernel(KernelModule::CrossEntropy, &format!("cross_entropy_{s}"))?
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
        // SAFETY: cross_entropy_in_place(T* logits, const int*, float*, int v, int ld, float,
        // unsigned*): one block per row < n over logits (n·ld, checked, v ≤ ld; each element
        // read and then overwritten by the same thread, after the block's reductions), targets
        // and losses (n).
        unsafe {
            self.kernel(
                KernelModule::CrossEntropy,
                &format!("cross_entropy_in_place_{s}"),
            )?
            .grid((grid_dim(OP, n)?, 1, 1))
            .block((block, 1, 1))
            .arg_buf(logits)
            .arg_buf(targets)
            .arg_buf(losses)
            .arg_i32(dim(OP, "v", v)?)
            .arg_i32(dim(OP, "ld", ld)?)
            .arg_f32(grad_scale)
            .arg_ptr(self.err_word.ptr())
            .launch()
        }
    }
}
