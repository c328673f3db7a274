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
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "cross_entropy";
        let s = float_suffix(OP, logits.dtype())?;
        let total = checked_product(OP, &[n, v])?;
        if v == 0 && n > 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "v must be positive".into(),
            });
        }
        check_len(OP, "logits", logits, total)?;
        check_dtype(OP, targets, DType::I32)?;
        check_len(OP, "targets", targets, n)?;
        check_dtype(OP, losses, DType::F32)?;
        check_len(OP, "losses", losses, n)?;
        if let Some(d) = &dlogits {
            check_dtype(OP, *d, logits.dtype())?;
            check_len(OP, "dlogits", *d, total)?;
        }
        if n == 0 {
            return Ok(());
        }
        let dptr = dlogits.map(|d| d.ptr()).unwrap_or(0);
        let block = (v.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
        // SAFETY: cross_entropy(const T*, const int*, float*, T* (nullable), int v, float,
        // unsigned*): one block per row < n over logits/dlogits (n·v), targets and losses (n).
        unsafe {
            self.kernel(KernelModule::CrossEntropy, &format!("cross_entropy_{s}"))?
                .grid((grid_dim(OP, n)?, 1, 1))
                .block((block, 1, 1))
                .arg_buf(logits)
                .arg_buf(targets)
                .arg_buf(losses)
                .arg_ptr(dptr)
                .arg_i32(dim(OP, "v", v)?)
                .arg_f32(grad_scale)
                .arg_ptr(self.err_word.ptr())
                .launch()
        }
    }
}
