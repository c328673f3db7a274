//! Causal self-attention: the unfused pieces (head split/merge, causal softmax) and
//! flash attention.

use crate::*;

/// The arguments of [`AttentionOps::split_heads`]; [`Check::check`] validates them.
pub struct SplitHeads<'a, B> {
    pub qkv: &'a B,
    pub q: &'a mut B,
    pub k: &'a mut B,
    pub v: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
}

impl<B: Buffer> Check for SplitHeads<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        HeadsDesc::new("split_heads", self.b, self.t, self.nh, self.hs)?.validate_split(
            ("qkv", self.qkv),
            [("q", &*self.q), ("k", &*self.k), ("v", &*self.v)],
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::split_heads_backward`]; [`Check::check`] validates them.
pub struct SplitHeadsBackward<'a, B> {
    pub dq: &'a B,
    pub dk: &'a B,
    pub dv: &'a B,
    pub dqkv: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
}

impl<B: Buffer> Check for SplitHeadsBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        HeadsDesc::new("split_heads_backward", self.b, self.t, self.nh, self.hs)?.validate_split(
            ("dqkv", &*self.dqkv),
            [("dq", self.dq), ("dk", self.dk), ("dv", self.dv)],
        )?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::merge_heads`]; [`Check::check`] validates them.
pub struct MergeHeads<'a, B> {
    pub y: &'a B,
    pub out: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
    pub backward: bool,
}

impl<B: Buffer> Check for MergeHeads<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        HeadsDesc::new("merge_heads", self.b, self.t, self.nh, self.hs)?
            .validate_merge(self.y, &*self.out)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::softmax_causal_forward`]; [`Check::check`] validates them.
pub struct SoftmaxCausalForward<'a, B> {
    pub scores: &'a B,
    pub probs: &'a mut B,
    pub batch: usize,
    pub t: usize,
    pub scale: f32,
}

impl<B: Buffer> Check for SoftmaxCausalForward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        SoftmaxDesc::new("softmax_causal_forward", self.batch, self.t)?
            .validate(&[("scores", self.scores), ("probs", &*self.probs)])?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::softmax_causal_backward`]; [`Check::check`] validates them.
pub struct SoftmaxCausalBackward<'a, B> {
    pub probs: &'a B,
    pub dprobs: &'a B,
    pub dscores: &'a mut B,
    pub batch: usize,
    pub t: usize,
    pub scale: f32,
}

impl<B: Buffer> Check for SoftmaxCausalBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        SoftmaxDesc::new("softmax_causal_backward", self.batch, self.t)?.validate(&[
            ("probs", self.probs),
            ("dprobs", self.dprobs),
            ("dscores", &*self.dscores),
        ])?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::flash_attention_forward`]; [`Check::check`] validates them.
pub struct FlashAttentionForward<'a, B> {
    pub qkv: &'a B,
    pub out: &'a mut B,
    pub lse: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
    pub scale: f32,
}

impl<B: Buffer> Check for FlashAttentionForward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        HeadsDesc::new("flash_attention_forward", self.b, self.t, self.nh, self.hs)?
            .validate_flash(self.qkv, &[("out", &*self.out)], &*self.lse)?;
        Ok(Checked::new(self))
    }
}

/// The arguments of [`AttentionOps::flash_attention_backward`]; [`Check::check`] validates them.
pub struct FlashAttentionBackward<'a, B> {
    pub qkv: &'a B,
    pub out: &'a B,
    pub dout: &'a B,
    pub lse: &'a B,
    pub dqkv: &'a mut B,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
    pub scale: f32,
}

impl<B: Buffer> Check for FlashAttentionBackward<'_, B> {
    fn check(self) -> Result<Checked<Self>> {
        HeadsDesc::new("flash_attention_backward", self.b, self.t, self.nh, self.hs)?
            .validate_flash(
                self.qkv,
                &[
                    ("out", self.out),
                    ("dout", self.dout),
                    ("dqkv", &*self.dqkv),
                ],
                self.lse,
            )?;
        Ok(Checked::new(self))
    }
}

pub trait AttentionOps: GemmOps {
    /// Splits `qkv` (`b × t × 3 × nh × hs`) into `q`, `k`, `v` (each `b × nh × t × hs`).
    fn split_heads(&self, args: Checked<SplitHeads<'_, Self::Buffer>>) -> Result<()>;

    /// Backward of [`AttentionOps::split_heads`]: writes `dqkv` from `dq`, `dk`, `dv`.
    fn split_heads_backward(
        &self,
        args: Checked<SplitHeadsBackward<'_, Self::Buffer>>,
    ) -> Result<()>;

    /// Merges heads: `y` (`b × nh × t × hs`) → `out` (`b × t × nh·hs`). With `backward` set it
    /// does the inverse permutation (`out` layout → `y` layout), which is the gradient.
    fn merge_heads(&self, args: Checked<MergeHeads<'_, Self::Buffer>>) -> Result<()>;

    /// Causal scaled softmax over `batch` independent `t × t` score matrices (`batch·t·t`
    /// elements; the row index within each matrix is the query position):
    /// `probs[i, j] = softmax_j(scale · scores[i, j])` for `j ≤ i`, 0 above the diagonal.
    fn softmax_causal_forward(
        &self,
        args: Checked<SoftmaxCausalForward<'_, Self::Buffer>>,
    ) -> Result<()>;

    /// Backward of the causal scaled softmax over `batch` matrices of `t × t`:
    /// `dscores = scale · P ⊙ (dP − Σ_j P·dP)` (overwrites; 0 above the diagonal).
    fn softmax_causal_backward(
        &self,
        args: Checked<SoftmaxCausalBackward<'_, Self::Buffer>>,
    ) -> Result<()>;

    /// Fused causal self-attention straight from the QKV projection: `qkv` is
    /// `b × t × 3 × nh × hs` (the c_attn output layout), `out` (`b × t × nh·hs`, heads merged)
    /// receives `softmax_causal(scale · q·kᵀ) · v`, and `lse` (f32, `b × nh × t`) the
    /// log-sum-exp of each query row's scaled scores (over keys j ≤ i), for the backward pass.
    /// A native path writes no `t × t` matrix to memory ([`Capabilities::flash_attention`]);
    /// the default composes the unfused ops (split heads, batched GEMMs, causal softmax, merge
    /// heads) through temporaries and computes `lse` on the host from the scores: correct on
    /// every backend, for checking, not for speed (it cannot be recorded in a graph).
    fn flash_attention_forward(
        &self,
        args: Checked<FlashAttentionForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        flash_attention_forward(self, args)
    }

    /// Backward of [`AttentionOps::flash_attention_forward`]: from `dout` (`b × t × nh·hs`) and the
    /// forward pass's `qkv`, `out` and `lse`, overwrites `dqkv` (`b × t × 3 × nh × hs`).
    /// Deterministic (no floating-point atomics). The default recomputes the probabilities
    /// from `qkv` and composes the unfused backward (batched GEMMs, causal softmax backward,
    /// head permutations) through temporaries.
    fn flash_attention_backward(
        &self,
        args: Checked<FlashAttentionBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        flash_attention_backward(self, args)
    }
}

/// [`crate::AttentionOps::flash_attention_forward`] composed of the core ops (its default).
pub fn flash_attention_forward<D: AttentionOps>(
    d: &D,
    args: Checked<FlashAttentionForward<'_, D::Buffer>>,
) -> Result<()> {
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
    let h = HeadsDesc::new("flash_attention_forward", b, t, nh, hs)?;
    let (q, k, v) = composed_heads(d, qkv, &h)?;
    let p_len = b * nh * t * t;
    let mut s = d.alloc(qkv.dtype(), p_len)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(false, true, t, t, hs, b * nh),
        a: &q,
        b: &k,
        c: &mut s,
    })?;
    let mut p = d.alloc(qkv.dtype(), p_len)?;
    d.exec(SoftmaxCausalForward {
        scores: &s,
        probs: &mut p,
        batch: b * nh,
        t,
        scale,
    })?;
    let mut y = d.alloc(qkv.dtype(), h.n)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(false, false, t, hs, t, b * nh),
        a: &p,
        b: &v,
        c: &mut y,
    })?;
    d.exec(MergeHeads {
        y: &y,
        out,
        b,
        t,
        nh,
        hs,
        backward: false,
    })?;
    let sv = s.dtype().bytes_to_f32(&d.download_bytes(&s, 0, p_len)?)?;
    let l: Vec<u8> = (0..b * nh * t)
        .flat_map(|row| {
            let i = row % t;
            let z = &sv[row * t..row * t + i + 1];
            let mx = z
                .iter()
                .fold(f64::NEG_INFINITY, |m, &x| m.max(scale as f64 * x as f64));
            let sum: f64 = z
                .iter()
                .map(|&x| (scale as f64 * x as f64 - mx).exp())
                .sum();
            ((mx + sum.ln()) as f32).to_le_bytes()
        })
        .collect();
    d.upload_bytes(&l, lse, 0)
}

/// [`crate::AttentionOps::flash_attention_backward`] composed of the core ops (its default).
pub fn flash_attention_backward<D: AttentionOps>(
    d: &D,
    args: Checked<FlashAttentionBackward<'_, D::Buffer>>,
) -> Result<()> {
    let FlashAttentionBackward {
        qkv,
        out: _,
        dout,
        lse: _,
        dqkv,
        b,
        t,
        nh,
        hs,
        scale,
    } = args.into_inner();
    let h = HeadsDesc::new("flash_attention_backward", b, t, nh, hs)?;
    let dt = qkv.dtype();
    let bh = b * nh;
    let (q, k, v) = composed_heads(d, qkv, &h)?;
    let mut s = d.alloc(dt, bh * t * t)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(false, true, t, t, hs, bh),
        a: &q,
        b: &k,
        c: &mut s,
    })?;
    let mut p = d.alloc(dt, bh * t * t)?;
    d.exec(SoftmaxCausalForward {
        scores: &s,
        probs: &mut p,
        batch: bh,
        t,
        scale,
    })?;
    let mut dy = d.alloc(dt, h.n)?;
    d.exec(MergeHeads {
        y: dout,
        out: &mut dy,
        b,
        t,
        nh,
        hs,
        backward: true,
    })?;
    // dP = dY·Vᵀ (into s, no longer needed), dV = Pᵀ·dY.
    d.exec(Gemm {
        desc: &GemmDesc::batched(false, true, t, t, hs, bh),
        a: &dy,
        b: &v,
        c: &mut s,
    })?;
    let mut dv = d.alloc(dt, h.n)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(true, false, t, hs, t, bh),
        a: &p,
        b: &dy,
        c: &mut dv,
    })?;
    let mut ds = d.alloc(dt, bh * t * t)?;
    d.exec(SoftmaxCausalBackward {
        probs: &p,
        dprobs: &s,
        dscores: &mut ds,
        batch: bh,
        t,
        scale,
    })?;
    let mut dq = d.alloc(dt, h.n)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(false, false, t, hs, t, bh),
        a: &ds,
        b: &k,
        c: &mut dq,
    })?;
    let mut dk = d.alloc(dt, h.n)?;
    d.exec(Gemm {
        desc: &GemmDesc::batched(true, false, t, hs, t, bh),
        a: &ds,
        b: &q,
        c: &mut dk,
    })?;
    d.exec(SplitHeadsBackward {
        dq: &dq,
        dk: &dk,
        dv: &dv,
        dqkv,
        b,
        t,
        nh,
        hs,
    })
}

/// q, k and v split from `qkv` into temporaries: the composed attention's first step.
fn composed_heads<D: AttentionOps>(
    d: &D,
    qkv: &D::Buffer,
    h: &HeadsDesc,
) -> Result<(D::Buffer, D::Buffer, D::Buffer)> {
    let dt = qkv.dtype();
    let (mut q, mut k, mut v) = (d.alloc(dt, h.n)?, d.alloc(dt, h.n)?, d.alloc(dt, h.n)?);
    d.exec(SplitHeads {
        qkv,
        q: &mut q,
        k: &mut k,
        v: &mut v,
        b: h.b,
        t: h.t,
        nh: h.nh,
        hs: h.hs,
    })?;
    Ok((q, k, v))
}

crate::checked::op_impls! {
    AttentionOps:
    SplitHeads<'a> => split_heads,
    SplitHeadsBackward<'a> => split_heads_backward,
    MergeHeads<'a> => merge_heads,
    SoftmaxCausalForward<'a> => softmax_causal_forward,
    SoftmaxCausalBackward<'a> => softmax_causal_backward,
    FlashAttentionForward<'a> => flash_attention_forward,
    FlashAttentionBackward<'a> => flash_attention_backward,
}
