//! Causal self-attention: the unfused pieces (head split/merge, causal softmax) and
//! flash attention.

use crate::*;

pub trait AttentionOps: GemmOps {
    /// Splits `qkv` (`b × t × 3 × nh × hs`) into `q`, `k`, `v` (each `b × nh × t × hs`).
    #[allow(clippy::too_many_arguments)]
    fn split_heads(
        &self,
        qkv: &Self::Buffer,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()>;

    /// Backward of [`AttentionOps::split_heads`]: writes `dqkv` from `dq`, `dk`, `dv`.
    #[allow(clippy::too_many_arguments)]
    fn split_heads_backward(
        &self,
        dq: &Self::Buffer,
        dk: &Self::Buffer,
        dv: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()>;

    /// Merges heads: `y` (`b × nh × t × hs`) → `out` (`b × t × nh·hs`). With `backward` set it
    /// does the inverse permutation (`out` layout → `y` layout), which is the gradient.
    #[allow(clippy::too_many_arguments)]
    fn merge_heads(
        &self,
        y: &Self::Buffer,
        out: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        backward: bool,
    ) -> Result<()>;

    /// Causal scaled softmax over `batch` independent `t × t` score matrices (`batch·t·t`
    /// elements; the row index within each matrix is the query position):
    /// `probs[i, j] = softmax_j(scale · scores[i, j])` for `j ≤ i`, 0 above the diagonal.
    fn softmax_causal_forward(
        &self,
        scores: &Self::Buffer,
        probs: &mut Self::Buffer,
        batch: usize,
        t: usize,
        scale: f32,
    ) -> Result<()>;

    /// Backward of the causal scaled softmax over `batch` matrices of `t × t`:
    /// `dscores = scale · P ⊙ (dP − Σ_j P·dP)` (overwrites; 0 above the diagonal).
    fn softmax_causal_backward(
        &self,
        probs: &Self::Buffer,
        dprobs: &Self::Buffer,
        dscores: &mut Self::Buffer,
        batch: usize,
        t: usize,
        scale: f32,
    ) -> Result<()>;

    /// Fused causal self-attention straight from the QKV projection: `qkv` is
    /// `b × t × 3 × nh × hs` (the c_attn output layout), `out` (`b × t × nh·hs`, heads merged)
    /// receives `softmax_causal(scale · q·kᵀ) · v`, and `lse` (f32, `b × nh × t`) the
    /// log-sum-exp of each query row's scaled scores (over keys j ≤ i), for the backward pass.
    /// A native path writes no `t × t` matrix to memory ([`Capabilities::flash_attention`]);
    /// the default composes the unfused ops (split heads, batched GEMMs, causal softmax, merge
    /// heads) through temporaries and computes `lse` on the host from the scores: correct on
    /// every backend, for checking, not for speed (it cannot be recorded in a graph).
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_forward(
        &self,
        qkv: &Self::Buffer,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        flash_attention_forward(self, qkv, out, lse, b, t, nh, hs, scale)
    }

    /// Backward of [`AttentionOps::flash_attention_forward`]: from `dout` (`b × t × nh·hs`) and the
    /// forward pass's `qkv`, `out` and `lse`, overwrites `dqkv` (`b × t × 3 × nh × hs`).
    /// Deterministic (no floating-point atomics). The default recomputes the probabilities
    /// from `qkv` and composes the unfused backward (batched GEMMs, causal softmax backward,
    /// head permutations) through temporaries.
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_backward(
        &self,
        qkv: &Self::Buffer,
        out: &Self::Buffer,
        dout: &Self::Buffer,
        lse: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        flash_attention_backward(self, qkv, out, dout, lse, dqkv, b, t, nh, hs, scale)
    }
}

/// [`crate::AttentionOps::flash_attention_forward`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward<D: AttentionOps>(
    d: &D,
    qkv: &D::Buffer,
    out: &mut D::Buffer,
    lse: &mut D::Buffer,
    b: usize,
    t: usize,
    nh: usize,
    hs: usize,
    scale: f32,
) -> Result<()> {
    let h = HeadsDesc::new("flash_attention_forward", b, t, nh, hs)?;
    h.validate_flash(qkv, &[("out", &*out)], lse)?;
    let (q, k, v) = composed_heads(d, qkv, &h)?;
    let p_len = b * nh * t * t;
    let mut s = d.alloc(qkv.dtype(), p_len)?;
    d.gemm(
        &GemmDesc::batched(false, true, t, t, hs, b * nh),
        &q,
        &k,
        &mut s,
    )?;
    let mut p = d.alloc(qkv.dtype(), p_len)?;
    d.softmax_causal_forward(&s, &mut p, b * nh, t, scale)?;
    let mut y = d.alloc(qkv.dtype(), h.n)?;
    d.gemm(
        &GemmDesc::batched(false, false, t, hs, t, b * nh),
        &p,
        &v,
        &mut y,
    )?;
    d.merge_heads(&y, out, b, t, nh, hs, false)?;
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
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward<D: AttentionOps>(
    d: &D,
    qkv: &D::Buffer,
    out: &D::Buffer,
    dout: &D::Buffer,
    lse: &D::Buffer,
    dqkv: &mut D::Buffer,
    b: usize,
    t: usize,
    nh: usize,
    hs: usize,
    scale: f32,
) -> Result<()> {
    let h = HeadsDesc::new("flash_attention_backward", b, t, nh, hs)?;
    h.validate_flash(qkv, &[("out", out), ("dout", dout), ("dqkv", &*dqkv)], lse)?;
    let dt = qkv.dtype();
    let bh = b * nh;
    let (q, k, v) = composed_heads(d, qkv, &h)?;
    let mut s = d.alloc(dt, bh * t * t)?;
    d.gemm(
        &GemmDesc::batched(false, true, t, t, hs, bh),
        &q,
        &k,
        &mut s,
    )?;
    let mut p = d.alloc(dt, bh * t * t)?;
    d.softmax_causal_forward(&s, &mut p, bh, t, scale)?;
    let mut dy = d.alloc(dt, h.n)?;
    d.merge_heads(dout, &mut dy, b, t, nh, hs, true)?;
    // dP = dY·Vᵀ (into s, no longer needed), dV = Pᵀ·dY.
    d.gemm(
        &GemmDesc::batched(false, true, t, t, hs, bh),
        &dy,
        &v,
        &mut s,
    )?;
    let mut dv = d.alloc(dt, h.n)?;
    d.gemm(
        &GemmDesc::batched(true, false, t, hs, t, bh),
        &p,
        &dy,
        &mut dv,
    )?;
    let mut ds = d.alloc(dt, bh * t * t)?;
    d.softmax_causal_backward(&p, &s, &mut ds, bh, t, scale)?;
    let mut dq = d.alloc(dt, h.n)?;
    d.gemm(
        &GemmDesc::batched(false, false, t, hs, t, bh),
        &ds,
        &k,
        &mut dq,
    )?;
    let mut dk = d.alloc(dt, h.n)?;
    d.gemm(
        &GemmDesc::batched(true, false, t, hs, t, bh),
        &ds,
        &q,
        &mut dk,
    )?;
    d.split_heads_backward(&dq, &dk, &dv, dqkv, b, t, nh, hs)
}

/// q, k and v split from `qkv` into temporaries: the composed attention's first step.
fn composed_heads<D: AttentionOps>(
    d: &D,
    qkv: &D::Buffer,
    h: &HeadsDesc,
) -> Result<(D::Buffer, D::Buffer, D::Buffer)> {
    let dt = qkv.dtype();
    let (mut q, mut k, mut v) = (d.alloc(dt, h.n)?, d.alloc(dt, h.n)?, d.alloc(dt, h.n)?);
    d.split_heads(qkv, &mut q, &mut k, &mut v, h.b, h.t, h.nh, h.hs)?;
    Ok((q, k, v))
}
