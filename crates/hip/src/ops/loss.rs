//! [`duet_device::LossOps`] on HIP: fused softmax + cross-entropy (kernels-hip/cross_entropy.hip).

use super::prelude::*;

impl LossOps for HipDevice {
    fn cross_entropy_padded(
        &self,
        args: Checked<CrossEntropyPadded<'_, Self::Buffer>>,
    ) -> Result<()> {
        let CrossEntropyPadded {
            logits,
            targets,
            losses,
            dlogits,
            n,
            v,
            ld,
            grad_scale,
        } = args.into_inner();
        const OP: &str = "cross_entropy";
        let s = float_suffix(OP, logits.dtype())?;
        let dl = match dlogits {
            Some(d) => {
                // The kernels write dlogits in the logits' dtype.
                same_dtype(OP, logits.dtype(), &[d])?;
                d.ptr()
            }
            None => std::ptr::null_mut(),
        };
        if n == 0 {
            return Ok(());
        }
        self.queue_id_check(OP, targets, v, true)?;
        // The CUDA backend's block size for v, so the partition of every row (and its bits) is
        // CUDA's: one thread per group of 8 logits, whole 32-lane groups, 32 to 1024 threads.
        let block = duet_gpu::cross_entropy_threads(v);
        // SAFETY: cross_entropy_T(const T* logits, const int* targets, float* losses,
        // T* dlogits (nullable), int v, int ld, float grad_scale): one block per row < n over
        // logits and dlogits (n·ld, checked, v ≤ ld), targets and losses (n), checked; a row reads logits[row·v + tgt] only
        // for 0 ≤ tgt < v (the kernel checks); the kernel is built for blocks up to 1024.
        unsafe {
            self.kernel(&format!("{OP}_{s}"))?
                .grid(rows_grid(OP, n)?)
                .block((block, 1, 1))
                .arg_buf(logits)
                .arg_buf(targets)
                .arg_buf(losses)
                .arg_ptr(dl)
                .arg_i32(dim(OP, "v", v)?)
                .arg_i32(dim(OP, "ld", ld)?)
                .arg_f32(grad_scale)
                .launch()
        }
    }

    /// [`duet_device::LossOps::cross_entropy_in_place`]: kernels-hip/cross_entropy.hip's
    /// `cross_entropy_in_place_T` (the gradient over the logits, one block per row; the same
    /// row body, and bits, as `cross_entropy_T`'s dlogits).
    fn cross_entropy_in_place(
        &self,
        args: Checked<CrossEntropyInPlace<'_, Self::Buffer>>,
    ) -> Result<()> {
        let CrossEntropyInPlace {
            logits,
            targets,
            losses,
            n,
            v,
            ld,
            grad_scale,
        } = args.into_inner();
        const OP: &str = "cross_entropy_in_place";
        let s = float_suffix(OP, logits.dtype())?;
        if n == 0 {
            return Ok(());
        }
        self.queue_id_check("cross_entropy", targets, v, true)?;
        let block = duet_gpu::cross_entropy_threads(v);
        // SAFETY: cross_entropy_in_place_T(T* logits, const int* targets, float* losses, int v,
        // int ld, float grad_scale): one block per row < n over logits (n·ld, checked, v ≤ ld;
        // each element read and then overwritten by the same thread, after the block's
        // reductions and a barrier), targets and losses (n); built for blocks up to 1024.
        unsafe {
            self.kernel(&format!("{OP}_{s}"))?
                .grid(rows_grid(OP, n)?)
                .block((block, 1, 1))
                .arg_buf(logits)
                .arg_buf(targets)
                .arg_buf(losses)
                .arg_i32(dim(OP, "v", v)?)
                .arg_i32(dim(OP, "ld", ld)?)
                .arg_f32(grad_scale)
                .launch()
        }
    }
}
