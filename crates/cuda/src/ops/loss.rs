//! [`LossOps`] for [`CudaDevice`]: fused softmax + cross-entropy (kernels-cuda/cross_entropy.cu).

use super::prelude::*;
use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute;
use std::cell::Cell;

/// Where the cross-entropy kernels keep a row while they work on it (kernels-cuda/
/// cross_entropy.cu's `cached` argument). Every choice gives the same bits; the default is the
/// first of `Exp`, `Logits`, `None` whose shared memory a block may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossEntropyCache {
    /// No cache: the row is read from global memory once per pass (max, sum, gradient).
    None = 0,
    /// The row's logits as stored (16 bytes per 8 bf16 logits: 100.6 KB at vocabulary 50257):
    /// one read of global memory, e^x computed twice per element (sum and gradient).
    Logits = 1,
    /// The row in f32, then its e^(x − max) (32 bytes per 8 logits: 201 KB at 50257): one read
    /// of global memory and e^x once per element, at one block per SM for GPT-2's vocabulary.
    Exp = 2,
}

thread_local! {
    static CE_CACHE_ON_THREAD: Cell<Option<CrossEntropyCache>> = const { Cell::new(None) };
}

impl CudaDevice {
    /// Selects where the cross-entropy kernels keep a row for the calls made on the calling
    /// thread: `Some(c)` that cache where its shared memory fits (else the next one down),
    /// `None` the default. Every choice gives the same bits. For A/B tests and benchmarks.
    pub fn cross_entropy_cache_on_this_thread(cache: Option<CrossEntropyCache>) {
        CE_CACHE_ON_THREAD.with(|c| c.set(cache));
    }

    /// The cross-entropy kernel `<name>_<sfx>` (`<name>_exp_<sfx>` for the f32 cache), where it
    /// keeps a row of `v` logits of `dtype` ([`CrossEntropyCache`]) and the dynamic shared
    /// memory that takes: ceil(v / 8) groups of 8 elements, in f32 for `Exp`, as stored for
    /// `Logits`. The first of the thread's choice (or `Exp` by default), `Logits`, `None` whose
    /// bytes fit in what a block may have beside the kernel's static reduction array (then the
    /// function is allowed that much).
    fn ce_func(
        &self,
        name: &str,
        sfx: &str,
        dtype: DType,
        v: usize,
    ) -> Result<(CudaFunction, CrossEntropyCache, u32)> {
        /// The kernels' static shared memory (block_max/block_sum's 32 floats).
        const STATIC: usize = 32 * 4;
        let want = CE_CACHE_ON_THREAD
            .with(Cell::get)
            .unwrap_or(CrossEntropyCache::Exp);
        let groups = v.div_ceil(8) * 8;
        let choices = [
            (CrossEntropyCache::Exp, groups * 4),
            (CrossEntropyCache::Logits, groups * dtype.size_bytes()),
        ];
        let have = self.smem_optin;
        let (mode, bytes) = choices
            .into_iter()
            .find(|&(mode, bytes)| mode as u8 <= want as u8 && bytes > 0 && bytes + STATIC <= have)
            .unwrap_or((CrossEntropyCache::None, 0));
        let kernel = match mode {
            CrossEntropyCache::Exp => format!("{name}_exp_{sfx}"),
            _ => format!("{name}_{sfx}"),
        };
        let f = self.func(KernelModule::CrossEntropy, &kernel)?;
        if bytes > 0 {
            // Always the same (largest) allowance, never the row's own size: the attribute
            // belongs to the function, which every thread using this device shares, so a call
            // for a smaller vocabulary setting it between another thread's setting and launch
            // made that launch fail (issue 49). The launch asks for `bytes`; the allowance only
            // bounds what a launch may ask, so the kernels and their results are unchanged.
            f.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                (have - STATIC) as i32,
            )
            .map_err(drv("cuFuncSetAttribute"))?;
        }
        Ok((f, mode, bytes as u32))
    }
}

impl LossOps for CudaDevice {
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
        if let Some(d) = &dlogits {
            // The kernels write dlogits in the logits' dtype.
            check_dtype(OP, *d, logits.dtype())?;
        }
        if n == 0 {
            return Ok(());
        }
        let dptr = dlogits.map(|d| d.ptr()).unwrap_or(0);
        let block = duet_gpu::cross_entropy_threads(v);
        let (f, mode, cache) = self.ce_func("cross_entropy", s, logits.dtype(), v)?;
        // SAFETY: cross_entropy[_exp](const T*, const int*, float*, T* (nullable), int v, int
        // ld, float, unsigned*, int cached): one block per row < n over logits/dlogits (n·ld,
        // checked, v ≤ ld), targets and losses (n); with `cached` 1 (the logits cache) or the
        // _exp kernel, `cache` bytes of dynamic shared memory hold the row's ceil(v / 8) groups
        // of 8 elements as stored or in f32 (the mode, the kernel and the bytes from ce_func,
        // which allowed the function that much).
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
                .arg_i32(mode as i32)
                .shared_mem(cache)
                .launch()
        }
    }

    /// [`duet_device::LossOps::cross_entropy_in_place`]: kernels-cuda/cross_entropy.cu's
    /// `cross_entropy_in_place_T` (the gradient over the logits, one block per row).
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
        let block = duet_gpu::cross_entropy_threads(v);
        let (f, mode, cache) = self.ce_func("cross_entropy_in_place", s, logits.dtype(), v)?;
        // SAFETY: cross_entropy_in_place[_exp](T* logits, const int*, float*, int v, int ld, float,
        // unsigned*, int cached): one block per row < n over logits (n·ld, checked, v ≤ ld;
        // each element read and then overwritten by the same thread, after the block's
        // reductions), targets and losses (n); `cache` bytes of dynamic shared memory as in
        // cross_entropy_padded.
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
                .arg_i32(mode as i32)
                .shared_mem(cache)
                .launch()
        }
    }
}
