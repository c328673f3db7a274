//! [`duet_device::AttentionOps`] on HIP: the head permutations, the causal softmax
//! (kernels-hip/attention.hip) and fused flash attention (kernels-hip/flash_attention.hip: see
//! [`duet_device::AttentionOps::flash_attention_forward`]).
//!
//! Flash attention mirrors crates/cuda's version 2 in its passes: the forward writes `out` and
//! the per-row log-sum-exp; the backward runs `backward_dq` (a block per query tile: D = Σ dO·O
//! for its rows into backend scratch, then dQ over the key tiles up to the diagonal) and then
//! `backward_dkv` (a block per key tile: dK and dV over the query tiles from the diagonal on,
//! reading D), each recomputing the probabilities from Q, K and `lse`. No `t × t` buffer, no
//! atomics: bit-identical run to run.
//!
//! Two inner products share the tiling, masking and online softmax ([`FlashInner`]): the
//! portable one (the default, every target: scalar FMAs in a fixed order, no result depends on
//! the wavefront size) and MFMA for every product (`DUET_HIP_FLASH_MFMA`, opt-in: gfx90a,
//! gfx942, gfx950 with wave64 only, compiled by CI's real hiprtc but not yet run on AMD
//! hardware). `DUET_HIP_NO_FLASH` withholds flash attention (the engine composes attention
//! through the unfused ops), for A/B runs. Neither is bit-identical to CUDA's tensor-core
//! kernels: the products sum in another order (CUDA's mma.sync rounds P to bf16 before P·V,
//! these keep it f32), and e^x is duet_exp_fma_f32 where CUDA uses ex2.approx: the two agree to
//! bf16 rounding, checked against the f64 reference by the conformance suite.

use super::prelude::*;
use crate::device::group_rows_grid;
use crate::flash::{FlashInner, flash_rows};

impl AttentionOps for HipDevice {
    fn split_heads(&self, args: Checked<SplitHeads<'_, Self::Buffer>>) -> Result<()> {
        let SplitHeads {
            qkv,
            q,
            k,
            v,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        const OP: &str = "split_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        // SAFETY: split_heads_T(const T* qkv, T* q, T* k, T* v, int b, int t, int nh, int hs):
        // qkv holds 3·b·t·nh·hs elements, q/k/v b·t·nh·hs each (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, OP, qkv.dtype(), &h, h.n, &[qkv, q, k, v]) }
    }

    fn split_heads_backward(
        &self,
        args: Checked<SplitHeadsBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SplitHeadsBackward {
            dq,
            dk,
            dv,
            dqkv,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        const OP: &str = "split_heads_backward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        // SAFETY: split_heads_backward_T(const T* dq, const T* dk, const T* dv, T* dqkv, int b,
        // int t, int nh, int hs): sizes as in split_heads (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, OP, dqkv.dtype(), &h, 3 * h.n, &[dq, dk, dv, dqkv]) }
    }

    fn merge_heads(&self, args: Checked<MergeHeads<'_, Self::Buffer>>) -> Result<()> {
        let MergeHeads {
            y,
            out,
            b,
            t,
            nh,
            hs,
            backward,
        } = args.into_inner();
        const OP: &str = "merge_heads";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let kernel = if backward {
            "merge_heads_backward"
        } else {
            "merge_heads"
        };
        // SAFETY: merge_heads[_backward]_T(const T*, T*, int b, int t, int nh, int hs): both hold
        // b·t·nh·hs elements (checked); grid-stride loop.
        unsafe { self.permute_heads(OP, kernel, y.dtype(), &h, h.n, &[y, out]) }
    }

    fn softmax_causal_forward(
        &self,
        args: Checked<SoftmaxCausalForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalForward {
            scores,
            probs,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        const OP: &str = "softmax_causal_forward";
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

    fn softmax_causal_backward(
        &self,
        args: Checked<SoftmaxCausalBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalBackward {
            probs,
            dprobs,
            dscores,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        const OP: &str = "softmax_causal_backward";
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

    fn flash_attention_forward(
        &self,
        args: Checked<FlashAttentionForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        if !self.caps.flash_attention(args.qkv.dtype(), args.hs) {
            return duet_device::composed::flash_attention_forward(self, args);
        }
        let FlashAttentionForward {
            qkv,
            out,
            lse,
            b,
            t,
            nh,
            hs,
            scale,
        } = args.into_inner();
        const OP: &str = "flash_attention_forward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let sfx = self.flash_check(OP, qkv.dtype(), hs)?;
        if h.n == 0 {
            return Ok(());
        }
        let grid = (
            grid_dim(OP, b * nh)?,
            grid_dim(OP, t.div_ceil(flash_rows(hs)))?,
            1,
        );
        // SAFETY: flash_attention_[mfma_]forward_hsHS_T(const T* qkv, T* out, float* lse,
        // int t, int nh, float scale): qkv holds b·t·3·nh·hs elements, out b·t·nh·hs, lse
        // b·nh·t (checked); the grid covers b·nh heads × ⌈t/BR⌉ query tiles of the kernel's BR
        // rows (flash_rows), rows past t are neither read nor written; block DUET_BLOCK.
        unsafe {
            self.kernel(&format!("{}forward_{sfx}", self.flash.prefix()))?
                .grid(grid)
                .arg_buf(qkv)
                .arg_buf(out)
                .arg_buf(lse)
                .arg_i32(dim(OP, "t", t)?)
                .arg_i32(dim(OP, "nh", nh)?)
                .arg_f32(scale)
                .launch()
        }
    }

    fn flash_attention_backward(
        &self,
        args: Checked<FlashAttentionBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        if !self.caps.flash_attention(args.qkv.dtype(), args.hs) {
            return duet_device::composed::flash_attention_backward(self, args);
        }
        let FlashAttentionBackward {
            qkv,
            out,
            dout,
            lse,
            dqkv,
            b,
            t,
            nh,
            hs,
            scale,
        } = args.into_inner();
        const OP: &str = "flash_attention_backward";
        let h = HeadsDesc::new(OP, b, t, nh, hs)?;
        let sfx = self.flash_check(OP, qkv.dtype(), hs)?;
        if h.n == 0 {
            return Ok(());
        }
        let grid = (
            grid_dim(OP, b * nh)?,
            grid_dim(OP, t.div_ceil(flash_rows(hs)))?,
            1,
        );
        let (t32, nh32) = (dim(OP, "t", t)?, dim(OP, "nh", nh)?);
        // D: one f32 per query row, held for both kernels.
        let scratch = self.scratch(b * nh * t)?;
        let d = scratch.ptr();
        let pfx = self.flash.prefix();
        // SAFETY: flash_attention_[mfma_]backward_dq_hsHS_T(const T* qkv, const T* out,
        // const T* dout, const float* lse, float* d, T* dqkv, int t, int nh, float scale): qkv
        // and dqkv hold b·t·3·nh·hs elements, out and dout b·t·nh·hs, lse b·nh·t (checked), `d`
        // b·nh·t f32 (the scratch just sized, held until both kernels are queued); one block
        // per head and query tile, writing d and the q part of its rows before t only.
        unsafe {
            self.kernel(&format!("{pfx}backward_dq_{sfx}"))?
                .grid(grid)
                .arg_buf(qkv)
                .arg_buf(out)
                .arg_buf(dout)
                .arg_buf(lse)
                .arg_ptr(d)
                .arg_buf(dqkv)
                .arg_i32(t32)
                .arg_i32(nh32)
                .arg_f32(scale)
                .launch()?;
        }
        // SAFETY: flash_attention_[mfma_]backward_dkv_hsHS_T(const T* qkv, const T* dout,
        // const float* lse, const float* d, T* dqkv, int t, int nh, float scale): sizes as
        // above; `d` was written for every row before t by backward_dq earlier on the same
        // stream; one block per head and key tile, writing only the k and v parts of its rows
        // before t.
        unsafe {
            self.kernel(&format!("{pfx}backward_dkv_{sfx}"))?
                .grid(grid)
                .arg_buf(qkv)
                .arg_buf(dout)
                .arg_buf(lse)
                .arg_ptr(d)
                .arg_buf(dqkv)
                .arg_i32(t32)
                .arg_i32(nh32)
                .arg_f32(scale)
                .launch()
        }
    }
}

impl HipDevice {
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

    /// The kernel name part for (`dtype`, `hs`), or the unsupported error.
    fn flash_check(&self, op: &'static str, dtype: DType, hs: usize) -> Result<String> {
        if !self.caps.flash_attention(dtype, hs) {
            let why = match self.flash {
                FlashInner::Off => "off (DUET_HIP_NO_FLASH)".to_string(),
                _ => format!("dtype {dtype}, head size {hs} (bf16 or f16, head size 64 or 128)"),
            };
            return Err(DeviceError::Unsupported {
                op: format!("{op}: {why}"),
                dtype,
            });
        }
        Ok(format!("hs{hs}_{}", float_suffix(op, dtype)?))
    }
}
