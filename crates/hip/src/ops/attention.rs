//! Attention: the head permutations and the causal softmax (kernels-hip/attention.hip). HIP
//! has no fused flash attention (its capabilities list none: the trait's composed default runs).

use super::prelude::*;

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
        let len = h.n;
        // The kernels move f32, f16 and bf16 elements.
        let n = float_suffix(OP, qkv.dtype())?;
        // SAFETY: split_heads_T(const T* qkv, T* q, T* k, T* v, int b, int t, int nh, int hs):
        // qkv holds 3·b·t·nh·hs elements, q/k/v b·t·nh·hs each (checked); grid-stride loop.
        unsafe {
            self.kernel(&format!("{OP}_{n}"))?
                .grid(self.grid_1d(len))
                .arg_buf(qkv)
                .arg_buf(q)
                .arg_buf(k)
                .arg_buf(v)
                .arg_i32(dim(OP, "b", b)?)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "nh", nh)?)
                .arg_i32(dim(OP, "hs", hs)?)
                .launch()
        }
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
        let len = h.n;
        // The kernels move f32, f16 and bf16 elements.
        let n = float_suffix(OP, dqkv.dtype())?;
        // SAFETY: split_heads_backward_T(const T* dq, const T* dk, const T* dv, T* dqkv, int b,
        // int t, int nh, int hs): sizes as in split_heads (checked); grid-stride loop.
        unsafe {
            self.kernel(&format!("{OP}_{n}"))?
                .grid(self.grid_1d(3 * len))
                .arg_buf(dq)
                .arg_buf(dk)
                .arg_buf(dv)
                .arg_buf(dqkv)
                .arg_i32(dim(OP, "b", b)?)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "nh", nh)?)
                .arg_i32(dim(OP, "hs", hs)?)
                .launch()
        }
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
        let len = h.n;
        // The kernels move f32, f16 and bf16 elements.
        let n = float_suffix(OP, y.dtype())?;
        let name = if backward {
            format!("merge_heads_backward_{n}")
        } else {
            format!("merge_heads_{n}")
        };
        // SAFETY: merge_heads[_backward]_T(const T*, T*, int b, int t, int nh, int hs): both hold
        // b·t·nh·hs elements (checked); grid-stride loop.
        unsafe {
            self.kernel(&name)?
                .grid(self.grid_1d(len))
                .arg_buf(y)
                .arg_buf(out)
                .arg_i32(dim(OP, "b", b)?)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "nh", nh)?)
                .arg_i32(dim(OP, "hs", hs)?)
                .launch()
        }
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
        unsafe {
            self.kernel(&format!("{OP}_{n}"))?
                .grid(rows_grid(OP, rows * t)?)
                .arg_buf(scores)
                .arg_buf(probs)
                .arg_u64((rows * t) as u64)
                .arg_i32(dim(OP, "t", t)?)
                .arg_f32(scale)
                .launch()
        }
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
        unsafe {
            self.kernel(&format!("{OP}_{n}"))?
                .grid(rows_grid(OP, rows * t)?)
                .arg_buf(probs)
                .arg_buf(dprobs)
                .arg_buf(dscores)
                .arg_u64((rows * t) as u64)
                .arg_i32(dim(OP, "t", t)?)
                .arg_f32(scale)
                .launch()
        }
    }
}
