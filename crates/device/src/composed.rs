//! The compositions of the fused paths: what each method of [`crate::Fused`] computes, written
//! with the core ops of [`crate::Device`] (and, for a fused path built on another, that one).
//! They are the trait's default bodies, and a backend whose native kernel does not cover some
//! inputs calls them for those, so every fused op works on every backend with every input the
//! contract allows.

use crate::*;

/// [`crate::Fused::cross_entropy_in_place`] composed of the core ops (its default): the
/// gradient into a temporary, then copied over the logits.
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_in_place<D: Fused>(
    d: &D,
    logits: &mut D::Buffer,
    targets: &D::Buffer,
    losses: &mut D::Buffer,
    n: usize,
    v: usize,
    ld: usize,
    grad_scale: f32,
) -> Result<()> {
    let len = n.checked_mul(ld).ok_or_else(|| {
        DeviceError::InvalidArgument(format!("cross_entropy_in_place: {n} × {ld} overflows"))
    })?;
    let mut grad = d.alloc(logits.dtype(), len)?;
    d.cross_entropy_padded(
        logits,
        targets,
        losses,
        Some(&mut grad),
        n,
        v,
        ld,
        grad_scale,
    )?;
    d.copy(&grad, 0, logits, 0, len)
}

/// [`crate::Fused::zero_many`] composed of the core ops (its default).
pub fn zero_many<D: Fused>(d: &D, dsts: &mut [&mut D::Buffer]) -> Result<()> {
    for buf in dsts.iter_mut() {
        d.fill(buf, 0.0)?;
    }
    Ok(())
}

/// [`crate::Fused::gemm_epilogue`] composed of the core ops (its default).
pub fn gemm_epilogue<D: Fused>(
    d: &D,
    desc: &GemmDesc,
    a: &D::Buffer,
    b: &D::Buffer,
    c: &mut D::Buffer,
    epilogue: Epilogue<'_, D::Buffer>,
) -> Result<()> {
    let (m, n) = (desc.m, desc.n);
    epilogue_shape("gemm_epilogue", desc, &epilogue, c.len())?;
    match epilogue {
        Epilogue::Bias(bias) => {
            d.gemm(desc, a, b, c)?;
            d.bias_add(c, bias, m, n)
        }
        Epilogue::BiasResidual { bias, residual } => {
            d.gemm(desc, a, b, c)?;
            d.bias_add(c, bias, m, n)?;
            d.add_assign(c, residual)
        }
        Epilogue::BiasGelu { bias, pre } => {
            d.gemm(desc, a, b, pre)?;
            d.bias_add(pre, bias, m, n)?;
            d.gelu_forward(pre, c)
        }
        Epilogue::DGelu { pre } => {
            let mut prod = d.alloc(c.dtype(), c.len())?;
            d.gemm(desc, a, b, &mut prod)?;
            d.gelu_backward(pre, &prod, c)
        }
        Epilogue::BiasGradA { dbias } => {
            if !desc.trans_a || desc.lda != m || desc.a_offset != 0 {
                return Err(DeviceError::InvalidArgument(
                    "gemm_epilogue: BiasGradA needs a dense A stored k × m (trans_a)".into(),
                ));
            }
            check_dtype("gemm_epilogue", dbias, DType::F32)?;
            check_len("gemm_epilogue", "dbias", dbias, m)?;
            d.gemm(desc, a, b, c)?;
            d.fill(dbias, 0.0)?;
            d.bias_backward(a, dbias, desc.k, m)
        }
    }
}

/// [`crate::Fused::layernorm_backward_colsum`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward_colsum<D: Fused>(
    d: &D,
    dout: &D::Buffer,
    x: &D::Buffer,
    gamma: &D::Buffer,
    mean: &D::Buffer,
    rstd: &D::Buffer,
    dx: &mut D::Buffer,
    dgamma: &mut D::Buffer,
    dbeta: &mut D::Buffer,
    dsum: &mut D::Buffer,
    n: usize,
    c: usize,
) -> Result<()> {
    // A wrong dsum fails before dx is touched.
    RowsDesc::new("layernorm_backward_colsum", n, c)?.validate_layernorm_backward(
        dout,
        x,
        gamma,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        Some(&*dsum),
    )?;
    d.layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, n, c)?;
    d.bias_backward(dx, dsum, n, c)
}

/// [`crate::Fused::flash_attention_forward`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_forward<D: Fused>(
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

/// [`crate::Fused::flash_attention_backward`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward<D: Fused>(
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

/// [`crate::Fused::sum_squares_many`] composed of the core ops (its default).
pub fn sum_squares_many<D: Fused>(
    d: &D,
    xs: &[&D::Buffer],
    out: &mut D::Buffer,
    slot: usize,
) -> Result<()> {
    args::validate_sum_squares_many(xs, out, slot)?;
    for x in xs {
        d.sum_squares(x, out, slot)?;
    }
    Ok(())
}

/// [`crate::Fused::adamw_clipped`] composed of the core ops (its default).
pub fn adamw_clipped<D: Fused>(
    d: &D,
    tensors: &mut [AdamWTensor<'_, D::Buffer>],
    step: &AdamWClipStep,
    scalars: &D::Buffer,
) -> Result<()> {
    // Every tensor is checked before any is updated.
    args::validate_adamw_clipped(tensors, scalars)?;
    let raw = d.download_bytes(scalars, 0, ADAMW_SCALARS)?;
    let v: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let grad_scale = clip_grad_scale(v[0], step.max_norm, step.loss_scale);
    for t in tensors.iter_mut() {
        let s = AdamWStep {
            lr: v[1],
            beta1: step.beta1,
            beta2: step.beta2,
            eps: step.eps,
            weight_decay: t.weight_decay,
            bias_correction1: v[2],
            bias_correction2: v[3],
            grad_scale,
        };
        d.adamw(t.param, t.grad, t.m, t.v, &s, t.copy.as_deref_mut())?;
    }
    Ok(())
}

/// [`crate::Fused::adamw_clipped_fp8`] composed of the core ops (its default).
pub fn adamw_clipped_fp8<D: Fused>(
    d: &D,
    tensors: &mut [AdamWTensor<'_, D::Buffer>],
    step: &AdamWClipStep,
    scalars: &D::Buffer,
    outs: &mut [AdamWFp8Out<'_, D::Buffer>],
    scale: &D::Buffer,
    amax: &mut D::Buffer,
) -> Result<()> {
    check_adamw_fp8_outs("adamw_clipped_fp8", tensors, outs, scale, amax)?;
    d.adamw_clipped(tensors, step, scalars)?;
    let mut jobs: Vec<Fp8QuantJob<'_, D::Buffer>> = outs
        .iter_mut()
        .map(|o| {
            let t = &tensors[o.tensor];
            o.job(t)
        })
        .collect();
    d.quantize_fp8_many(&mut jobs, scale, amax)
}

/// [`crate::Fused::quantize_fp8_many`] composed of the core ops (its default).
pub fn quantize_fp8_many<D: Fused>(
    d: &D,
    jobs: &mut [Fp8QuantJob<'_, D::Buffer>],
    scale: &D::Buffer,
    amax: &mut D::Buffer,
) -> Result<()> {
    check_fp8_quant_jobs("quantize_fp8_many", jobs, scale, amax)?;
    for j in jobs.iter_mut() {
        j.quantize(d, scale, amax)?;
    }
    Ok(())
}

/// [`crate::Fused::quantize_fp8_grad`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn quantize_fp8_grad<D: Fused>(
    d: &D,
    dout: &D::Buffer,
    gelu_pre: Option<&D::Buffer>,
    dst: &mut D::Buffer,
    dst_t: Option<&mut D::Buffer>,
    dbias: &mut D::Buffer,
    rows: usize,
    cols: usize,
    scale: &D::Buffer,
    amax: &mut D::Buffer,
    slot: usize,
) -> Result<()> {
    RowsDesc::new("quantize_fp8_grad", rows, cols)?.validate_quantize_fp8_grad(
        dout,
        gelu_pre,
        dst,
        dst_t.as_deref(),
        dbias,
        scale,
        amax,
        slot,
    )?;
    let tmp;
    let g = match gelu_pre {
        Some(pre) => {
            let mut t = d.alloc(dout.dtype(), dout.len())?;
            d.gelu_backward(pre, dout, &mut t)?;
            tmp = t;
            &tmp
        }
        None => dout,
    };
    d.bias_backward(g, dbias, rows, cols)?;
    d.quantize_fp8(g, dst, dst_t, rows, cols, scale, amax, slot)
}

/// [`crate::Fused::quantize_fp8_gelu`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn quantize_fp8_gelu<D: Fused>(
    d: &D,
    pre: &D::Buffer,
    dst: &mut D::Buffer,
    dst_t: Option<&mut D::Buffer>,
    rows: usize,
    cols: usize,
    scale: &D::Buffer,
    amax: &mut D::Buffer,
    slot: usize,
) -> Result<()> {
    RowsDesc::new("quantize_fp8_gelu", rows, cols)?.validate_quantize_fp8(
        Some(pre),
        dst,
        dst_t.as_deref(),
        scale,
        amax,
        slot,
    )?;
    let mut h = d.alloc(pre.dtype(), pre.len())?;
    d.gelu_forward(pre, &mut h)?;
    d.quantize_fp8(&h, dst, dst_t, rows, cols, scale, amax, slot)
}

/// [`crate::Fused::layernorm_forward_fp8`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward_fp8<D: Fused>(
    d: &D,
    x: &D::Buffer,
    gamma: &D::Buffer,
    beta: &D::Buffer,
    mean: &mut D::Buffer,
    rstd: &mut D::Buffer,
    dst: &mut D::Buffer,
    dst_t: Option<&mut D::Buffer>,
    n: usize,
    c: usize,
    eps: f32,
    scale: &D::Buffer,
    amax: &mut D::Buffer,
    slot: usize,
) -> Result<()> {
    RowsDesc::new("layernorm_forward_fp8", n, c)?.validate_layernorm_forward_fp8(
        x,
        gamma,
        beta,
        mean,
        rstd,
        dst,
        dst_t.as_deref(),
        scale,
        amax,
        slot,
    )?;
    let mut out = d.alloc(x.dtype(), x.len())?;
    d.layernorm_forward(x, gamma, beta, &mut out, mean, rstd, n, c, eps)?;
    d.quantize_fp8(&out, dst, dst_t, n, c, scale, amax, slot)
}

/// [`crate::Fused::gemm_fp8_epilogue`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp8_epilogue<D: Fused>(
    d: &D,
    desc: &GemmDesc,
    a: &D::Buffer,
    b: &D::Buffer,
    c: &mut D::Buffer,
    scale_inv: &D::Buffer,
    a_slot: usize,
    b_slot: usize,
    epilogue: Epilogue<'_, D::Buffer>,
) -> Result<()> {
    let bias = match &epilogue {
        Epilogue::Bias(b)
        | Epilogue::BiasResidual { bias: b, .. }
        | Epilogue::BiasGelu { bias: b, .. } => Some(*b),
        _ => None,
    };
    if let Some(b) = bias {
        check_dtype("gemm_fp8_epilogue", b, c.dtype())?;
    }
    let (m, n) = (desc.m, desc.n);
    epilogue_shape("gemm_fp8_epilogue", desc, &epilogue, c.len())?;
    match epilogue {
        Epilogue::Bias(bias) => {
            d.gemm_fp8(desc, a, b, c, scale_inv, a_slot, b_slot)?;
            d.bias_add(c, bias, m, n)
        }
        Epilogue::BiasResidual { bias, residual } => {
            d.gemm_fp8(desc, a, b, c, scale_inv, a_slot, b_slot)?;
            d.bias_add(c, bias, m, n)?;
            d.add_assign(c, residual)
        }
        Epilogue::BiasGelu { bias, pre } => {
            d.gemm_fp8(desc, a, b, pre, scale_inv, a_slot, b_slot)?;
            d.bias_add(pre, bias, m, n)?;
            d.gelu_forward(pre, c)
        }
        Epilogue::DGelu { .. } | Epilogue::BiasGradA { .. } => Err(DeviceError::InvalidArgument(
            "gemm_fp8_epilogue: only Bias, BiasResidual and BiasGelu are fused into FP8 GEMMs"
                .into(),
        )),
    }
}

/// [`crate::Fused::fp8_scaling_update`] composed of the core ops (its default).
#[allow(clippy::too_many_arguments)]
pub fn fp8_scaling_update<D: Fused>(
    d: &D,
    amax: &mut D::Buffer,
    history: &mut D::Buffer,
    scale: &mut D::Buffer,
    scale_inv: &mut D::Buffer,
    inv_stride: usize,
    fp8_max: &D::Buffer,
    len: usize,
    most_recent: bool,
    margin: i32,
) -> Result<()> {
    let ops = check_fp8_scaling_args(amax, history, scale, scale_inv, inv_stride, fp8_max, len)?;
    let to_f32 = |bytes: Vec<u8>| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let a = to_f32(d.download_bytes(amax, 0, ops)?);
    let mut h = to_f32(d.download_bytes(history, 0, ops * len)?);
    let mut s = to_f32(d.download_bytes(scale, 0, ops)?);
    let m = to_f32(d.download_bytes(fp8_max, 0, ops)?);
    for i in 0..ops {
        let hist = &mut h[i * len..(i + 1) * len];
        s[i] = fp8_history_step(hist, a[i], s[i], m[i], most_recent, margin);
    }
    let mut inv = to_f32(d.download_bytes(scale_inv, 0, ops * inv_stride)?);
    for (i, &x) in s.iter().enumerate() {
        inv[i * inv_stride] = fp8_scale_inv(x);
    }
    d.upload_bytes(&bytes(&h), history, 0)?;
    d.upload_bytes(&bytes(&s), scale, 0)?;
    d.upload_bytes(&bytes(&inv), scale_inv, 0)?;
    d.fill(amax, 0.0)
}

/// q, k and v split from `qkv` into temporaries: the composed attention's first step.
fn composed_heads<D: Device>(
    d: &D,
    qkv: &D::Buffer,
    h: &HeadsDesc,
) -> Result<(D::Buffer, D::Buffer, D::Buffer)> {
    let dt = qkv.dtype();
    let (mut q, mut k, mut v) = (d.alloc(dt, h.n)?, d.alloc(dt, h.n)?, d.alloc(dt, h.n)?);
    d.split_heads(qkv, &mut q, &mut k, &mut v, h.b, h.t, h.nh, h.hs)?;
    Ok((q, k, v))
}
