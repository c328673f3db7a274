//! Attention: the head permutations and the causal softmax (kernels-hip/attention.hip). HIP
//! has no fused flash attention (its capabilities list none: the trait's composed default runs).

use super::prelude::*;
use crate::device::group_rows_grid;

impl HipDevice {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_heads_impl(
        &self,
        qkv: &HipBuffer,
        q: &mut HipBuffer,
        k: &mut HipBuffer,
        v: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        h.validate_split(("qkv", qkv), [("q", &*q), ("k", &*k), ("v", &*v)])?;
        // SAFETY: split_heads_T(const T* qkv, T* q, T* k, T* v, int b, int t, int nh, int hs):
        // qkv holds 3·b·t·nh·hs elements, q/k/v b·t·nh·hs each (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, OP, qkv.dtype(), &h, h.n, &[qkv, q, k, v]) }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn split_heads_backward_impl(
        &self,
        dq: &HipBuffer,
        dk: &HipBuffer,
        dv: &HipBuffer,
        dqkv: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads_backward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        h.validate_split(("dqkv", &*dqkv), [("dq", dq), ("dk", dk), ("dv", dv)])?;
        // SAFETY: split_heads_backward_T(const T* dq, const T* dk, const T* dv, T* dqkv, int b,
        // int t, int nh, int hs): sizes as in split_heads (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, OP, dqkv.dtype(), &h, 3 * h.n, &[dq, dk, dv, dqkv]) }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn merge_heads_impl(
        &self,
        y: &HipBuffer,
        out: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        backward: bool,
    ) -> Result<()> {
        const OP: &str = "merge_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        h.validate_merge(y, out)?;
        let kernel = if backward {
            "merge_heads_backward"
        } else {
            "merge_heads"
        };
        // SAFETY: merge_heads[_backward]_T(const T*, T*, int b, int t, int nh, int hs): both hold
        // b·t·nh·hs elements (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, kernel, y.dtype(), &h, h.n, &[y, out]) }
    }

    pub(crate) fn softmax_causal_forward_impl(
        &self,
        scores: &HipBuffer,
        probs: &mut HipBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_forward";
        SoftmaxDesc::new(OP, rows, t)?.validate(&[("scores", scores), ("probs", &*probs)])?;
        let n = float_suffix(OP, scores.dtype())?;
        // The kernels write probs in the scores' dtype.
        same_dtype(OP, scores.dtype(), &[probs])?;
        if rows * t == 0 {
            return Ok(());
        }
        // SAFETY: softmax_causal_forward_T(const T* scores, T* probs, u64 total_rows, int t,
        // float scale): one block per line < rows·t, each touching t elements of buffers
        // holding rows·t·t (checked).
        unsafe { self.softmax_rows(OP, n, rows, t, scale, &[scores, probs]) }
    }

    pub(crate) fn softmax_causal_backward_impl(
        &self,
        probs: &HipBuffer,
        dprobs: &HipBuffer,
        dscores: &mut HipBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_backward";
        SoftmaxDesc::new(OP, rows, t)?.validate(&[
            ("probs", probs),
            ("dprobs", dprobs),
            ("dscores", &*dscores),
        ])?;
        let n = float_suffix(OP, probs.dtype())?;
        // The kernels take all three in one dtype.
        same_dtype(OP, probs.dtype(), &[dprobs, dscores])?;
        if rows * t == 0 {
            return Ok(());
        }
        // SAFETY: softmax_causal_backward_T(const T* probs, const T* dprobs, T* dscores,
        // u64 total_rows, int t, float scale): as the forward.
        unsafe { self.softmax_rows(OP, n, rows, t, scale, &[probs, dprobs, dscores]) }
    }

    /// Launches the head permutation `<kernel>_<T>` (attention.hip) of `dtype` elements as a
    /// grid-stride loop over `items`: the pointer parameters `bufs`, then
    /// `int b, int t, int nh, int hs` of `h`.
    ///
    /// # Safety
    /// `bufs` must be the kernel's pointer parameters in order, each holding every element the
    /// kernel touches for `h`.
    unsafe fn permute_heads(
        &self,
        op: &'static str,
        kernel: &str,
        dtype: DType,
        h: &HeadsDesc,
        items: usize,
        bufs: &[&HipBuffer],
    ) -> Result<()> {
        // The kernels move f32, f16 and bf16 elements.
        let n = float_suffix(op, dtype)?;
        let launch = self
            .kernel(&format!("{kernel}_{n}"))?
            .grid(self.grid_1d(items));
        let launch = bufs.iter().fold(launch, |l, b| l.arg_buf(b));
        // SAFETY: the pointer parameters are the caller's (see `# Safety`); the four ints
        // follow in the kernel's order.
        unsafe {
            launch
                .arg_i32(dim(op, "b", h.b)?)
                .arg_i32(dim(op, "t", h.t)?)
                .arg_i32(dim(op, "nh", h.nh)?)
                .arg_i32(dim(op, "hs", h.hs)?)
                .launch()
        }
    }

    /// Launches the causal softmax kernel `<op>_<n>` (attention.hip) over `rows · t` lines of
    /// `t` elements, one block per line: the pointer parameters `bufs`, then
    /// `u64 rows·t, int t, float scale`.
    ///
    /// # Safety
    /// `bufs` must be the kernel's pointer parameters in order, each holding `rows · t · t`
    /// elements of the kernel's dtype.
    unsafe fn softmax_rows(
        &self,
        op: &'static str,
        n: &str,
        rows: usize,
        t: usize,
        scale: f32,
        bufs: &[&HipBuffer],
    ) -> Result<()> {
        let launch = self
            .kernel(&format!("{op}_{n}"))?
            .grid(group_rows_grid(op, rows * t)?);
        let launch = bufs.iter().fold(launch, |l, b| l.arg_buf(b));
        // SAFETY: the pointer parameters are the caller's (see `# Safety`); the line count, t
        // and the scale follow in the kernel's order.
        unsafe {
            launch
                .arg_u64((rows * t) as u64)
                .arg_i32(dim(op, "t", t)?)
                .arg_f32(scale)
                .launch()
        }
    }
}
