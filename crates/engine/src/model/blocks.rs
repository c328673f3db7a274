use super::LN_EPS;
use super::attention::{attention_backward, attention_forward};
use super::fp8_codes::{Fp8Bufs, linear_id};
use super::linear::{
    GradIo, LinearInput, linear_act_forward, linear_backward, linear_forward, linear_gelu_forward,
};
use super::memory::{BlockActs, Dims, Scratch};
use super::params::{BlockParam, param_index};
use crate::Result;
use duet_device::{
    Buffer, Device, DeviceError, FlashAttentionBackward, FlashAttentionForward, GeluBackward,
    GeluForward, LayerNormBackward, LayerNormBackwardColsum, LayerNormForward, MergeHeads,
    SplitHeads, SplitHeadsBackward,
};

/// What every part of one block's pass reads: the device, the parameters, the block's index
/// and the model's dimensions.
struct Block<'a, D: Device> {
    dev: &'a D,
    p: &'a [D::Buffer],
    l: usize,
    d: Dims,
}

/// One block's forward pass from `x` into its activations `a`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_forward<D: Device>(
    dev: &D,
    p: &[D::Buffer],
    q8: &mut Option<Fp8Bufs<D>>,
    record: bool,
    l: usize,
    x: &D::Buffer,
    a: &mut BlockActs<D::Buffer>,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
) -> Result<()> {
    let blk = Block { dev, p, l, d };
    attention_forward_part(&blk, q8, record, x, a, s)?;
    mlp_forward_part(&blk, q8, record, a, s)
}

/// The attention half of a block's forward pass: `x` → LayerNorm → qkv → attention → attc,
/// and `res2 = x + attc · ProjWᵀ + ProjB`.
fn attention_forward_part<D: Device>(
    blk: &Block<'_, D>,
    q8: &mut Option<Fp8Bufs<D>>,
    record: bool,
    x: &D::Buffer,
    a: &mut BlockActs<D::Buffer>,
    s: &mut Scratch<D::Buffer>,
) -> Result<()> {
    let Block { dev, p, l, d } = *blk;
    let Dims {
        b, t, c, nh, hs, n, ..
    } = d;
    let scale = 1.0 / (hs as f32).sqrt();
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    // Attention. FP8 keeps no LayerNorm output: it exists only inside the quantisation of
    // the next layer's input.
    let fp8 = q8.is_some();
    let ln1 = if fp8 {
        LinearInput::LayerNormOf {
            x,
            gamma: w(BlockParam::Ln1W),
            beta: w(BlockParam::Ln1B),
            mean: &mut a.ln1_mean,
            rstd: &mut a.ln1_rstd,
        }
    } else {
        dev.exec(LayerNormForward {
            x,
            gamma: w(BlockParam::Ln1W),
            beta: w(BlockParam::Ln1B),
            out: &mut a.ln1,
            mean: &mut a.ln1_mean,
            rstd: &mut a.ln1_rstd,
            n,
            c,
            eps: LN_EPS,
        })?;
        LinearInput::Plain(&a.ln1)
    };
    linear_act_forward(
        dev,
        q8.as_mut().map(|q| (q, linear_id(l, BlockParam::AttnW))),
        record,
        ln1,
        w(BlockParam::AttnW),
        w(BlockParam::AttnB),
        &mut a.qkv,
        None,
        None,
        n,
        c,
        3 * c,
    )?;
    if d.flash {
        dev.exec(FlashAttentionForward {
            qkv: &a.qkv,
            out: &mut a.attc,
            lse: &mut a.lse,
            b,
            t,
            nh,
            hs,
            scale,
        })?;
    } else {
        dev.exec(SplitHeads {
            qkv: &a.qkv,
            q: &mut s.q,
            k: &mut s.k,
            v: &mut s.v,
            b,
            t,
            nh,
            hs,
        })?;
        attention_forward(dev, s, d, scale)?;
        dev.exec(MergeHeads {
            y: &s.d_c2,
            out: &mut a.attc,
            b,
            t,
            nh,
            hs,
            backward: false,
        })?;
    }
    linear_forward(
        dev,
        q8.as_mut().map(|q| (q, linear_id(l, BlockParam::ProjW))),
        record,
        &a.attc,
        w(BlockParam::ProjW),
        w(BlockParam::ProjB),
        &mut a.res2,
        Some(x),
        n,
        c,
        c,
    )?;
    Ok(())
}

/// The MLP half of a block's forward pass: `res2` → LayerNorm → fch → GELU →
/// `res3 = res2 + gelu(fch) · FcProjWᵀ + FcProjB`.
fn mlp_forward_part<D: Device>(
    blk: &Block<'_, D>,
    q8: &mut Option<Fp8Bufs<D>>,
    record: bool,
    a: &mut BlockActs<D::Buffer>,
    s: &mut Scratch<D::Buffer>,
) -> Result<()> {
    let Block { dev, p, l, d } = *blk;
    let Dims { c, f, n, .. } = d;
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    let fp8 = q8.is_some();
    // MLP.
    // gelu(fch) lives in the block's activations where the plan keeps it, else in scratch (the
    // backward pass recomputes it). FP8 never writes it: the GELU runs inside the quantisation
    // of the next layer's input.
    let keep_gelu = !a.gelu.is_empty();
    if fp8 {
        let ln2 = LinearInput::LayerNormOf {
            x: &a.res2,
            gamma: w(BlockParam::Ln2W),
            beta: w(BlockParam::Ln2B),
            mean: &mut a.ln2_mean,
            rstd: &mut a.ln2_rstd,
        };
        linear_act_forward(
            dev,
            q8.as_mut().map(|q| (q, linear_id(l, BlockParam::FcW))),
            record,
            ln2,
            w(BlockParam::FcW),
            w(BlockParam::FcB),
            &mut a.fch,
            None,
            None,
            n,
            c,
            f,
        )?;
    } else {
        dev.exec(LayerNormForward {
            x: &a.res2,
            gamma: w(BlockParam::Ln2W),
            beta: w(BlockParam::Ln2B),
            out: &mut a.ln2,
            mean: &mut a.ln2_mean,
            rstd: &mut a.ln2_rstd,
            n,
            c,
            eps: LN_EPS,
        })?;
        linear_gelu_forward(
            dev,
            None,
            record,
            &a.ln2,
            w(BlockParam::FcW),
            w(BlockParam::FcB),
            &mut a.fch,
            if keep_gelu { &mut a.gelu } else { &mut s.d_f2 },
            n,
            c,
            f,
        )?;
    }
    linear_act_forward(
        dev,
        q8.as_mut().map(|q| (q, linear_id(l, BlockParam::FcProjW))),
        record,
        match (fp8, keep_gelu) {
            (true, _) => LinearInput::GeluOf(&a.fch),
            (false, true) => LinearInput::Plain(&a.gelu),
            (false, false) => LinearInput::Plain(&s.d_f2),
        },
        w(BlockParam::FcProjW),
        w(BlockParam::FcProjB),
        &mut a.res3,
        Some(&a.res2),
        None,
        n,
        f,
        c,
    )?;
    Ok(())
}

/// One block's backward pass: consumes `s.dresid` (the gradient of the block's output) and
/// leaves the gradient of its input there; accumulates the block's parameter gradients.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_backward<D: Device>(
    dev: &D,
    p: &[D::Buffer],
    g: &mut [D::Buffer],
    s: &mut Scratch<D::Buffer>,
    q8: &mut Option<Fp8Bufs<D>>,
    zeros_c: &D::Buffer,
    l: usize,
    x: &D::Buffer,
    a: &BlockActs<D::Buffer>,
    d: Dims,
) -> Result<()> {
    let blk = Block { dev, p, l, d };
    mlp_backward_part(&blk, g, s, q8, a)?;
    attention_backward_part(&blk, g, s, q8, zeros_c, x, a)
}

/// The MLP half of a block's backward pass: `s.dresid` (the gradient of res3) back through
/// the MLP and the second LayerNorm into the gradient of res2 (in `s.dresid`).
fn mlp_backward_part<D: Device>(
    blk: &Block<'_, D>,
    g: &mut [D::Buffer],
    s: &mut Scratch<D::Buffer>,
    q8: &mut Option<Fp8Bufs<D>>,
    a: &BlockActs<D::Buffer>,
) -> Result<()> {
    let Block { dev, p, l, d } = *blk;
    let Dims { c, f, n, .. } = d;
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    let gi = |bp: BlockParam| param_index(l, bp);
    // res3 = res2 + gelu(fch) · FcProjWᵀ + FcProjB; dresid passes through unchanged. The weight
    // gradient needs gelu(fch): kept by the forward pass, or recomputed into d_f2 (bit for bit
    // what the forward pass used; FP8 keeps its own transposed copy instead).
    let keep_gelu = !a.gelu.is_empty();
    let fp8 = q8.is_some();
    if !fp8 && !keep_gelu {
        dev.exec(GeluForward {
            x: &a.fch,
            out: &mut s.d_f2,
        })?;
    }
    let one_buffer = s.d_f.is_empty();
    let fused_gelu = {
        let (gw, gb) = two_mut(g, gi(BlockParam::FcProjW), gi(BlockParam::FcProjB));
        let io = match (keep_gelu, one_buffer) {
            (true, _) => GradIo::Split {
                x: &a.gelu,
                dx: if one_buffer { &mut s.d_f2 } else { &mut s.d_f },
            },
            (false, true) => GradIo::Shared(&mut s.d_f2),
            (false, false) => GradIo::Split {
                x: &s.d_f2,
                dx: &mut s.d_f,
            },
        };
        // mlp.c_proj's bias gradient came out of the LayerNorm backward that wrote dresid
        // (16-bit runs; FP8 sums it in the quantisation of dresid).
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, linear_id(l, BlockParam::FcProjW))),
            &s.dresid,
            io,
            w(BlockParam::FcProjW),
            gw,
            fp8.then_some(gb),
            Some(&a.fch),
            None,
            n,
            f,
            c,
        )?
    };
    // The gradient of fch: fused into the GEMM above, into FP8's quantisation below, or a
    // separate pass into d_f2.
    let gelu_in_quantize = q8.is_some();
    let unfused = !fused_gelu && !gelu_in_quantize;
    if unfused && one_buffer {
        return Err(DeviceError::InvalidArgument(
            "the backend's fused GEMM epilogues were switched off after the model was built \
             (its memory plan relies on them): build the model again"
                .into(),
        )
        .into());
    }
    if unfused {
        dev.exec(GeluBackward {
            x: &a.fch,
            dout: &s.d_f,
            dx: &mut s.d_f2,
        })?;
    }
    let d_hidden = if one_buffer || unfused {
        &s.d_f2
    } else {
        &s.d_f
    };
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::FcW), gi(BlockParam::FcB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, linear_id(l, BlockParam::FcW))),
            d_hidden,
            GradIo::Split {
                x: &a.ln2,
                dx: &mut s.d_c,
            },
            w(BlockParam::FcW),
            gw,
            Some(gb),
            None,
            gelu_in_quantize.then_some(&a.fch),
            n,
            c,
            f,
        )?;
    }
    {
        // dresid becomes the gradient of res2: its column sum is attn.c_proj's bias gradient.
        let sum = (!fp8).then(|| gi(BlockParam::ProjB));
        let (gw, gb, dsum) = ln_grads(g, gi(BlockParam::Ln2W), gi(BlockParam::Ln2B), sum);
        layernorm_backward(
            dev,
            &s.d_c,
            &a.res2,
            w(BlockParam::Ln2W),
            &a.ln2_mean,
            &a.ln2_rstd,
            &mut s.dresid,
            gw,
            gb,
            dsum,
            n,
            c,
        )?;
    }
    Ok(())
}

/// The attention half of a block's backward pass: `s.dresid` (the gradient of res2) back
/// through attention and the first LayerNorm into the gradient of the block's input `x` (in
/// `s.dresid`).
fn attention_backward_part<D: Device>(
    blk: &Block<'_, D>,
    g: &mut [D::Buffer],
    s: &mut Scratch<D::Buffer>,
    q8: &mut Option<Fp8Bufs<D>>,
    zeros_c: &D::Buffer,
    x: &D::Buffer,
    a: &BlockActs<D::Buffer>,
) -> Result<()> {
    let Block { dev, p, l, d } = *blk;
    let Dims {
        b, t, c, nh, hs, n, ..
    } = d;
    let scale = 1.0 / (hs as f32).sqrt();
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    let gi = |bp: BlockParam| param_index(l, bp);
    let fp8 = q8.is_some();
    // res2 = x + attc · ProjWᵀ + ProjB.
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::ProjW), gi(BlockParam::ProjB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, linear_id(l, BlockParam::ProjW))),
            &s.dresid,
            GradIo::Split {
                x: &a.attc,
                dx: &mut s.d_c,
            },
            w(BlockParam::ProjW),
            gw,
            fp8.then_some(gb),
            None,
            None,
            n,
            c,
            c,
        )?;
    }
    if d.flash {
        dev.exec(FlashAttentionBackward {
            qkv: &a.qkv,
            out: &a.attc,
            dout: &s.d_c,
            lse: &a.lse,
            dqkv: &mut s.dqkv,
            b,
            t,
            nh,
            hs,
            scale,
        })?;
    } else {
        // attc = merge(atty): the gradient goes back through the inverse permutation.
        dev.exec(MergeHeads {
            y: &s.d_c,
            out: &mut s.d_c2,
            b,
            t,
            nh,
            hs,
            backward: true,
        })?;
        // q, k and v are split from the saved qkv again (the forward pass kept no copy).
        dev.exec(SplitHeads {
            qkv: &a.qkv,
            q: &mut s.q,
            k: &mut s.k,
            v: &mut s.v,
            b,
            t,
            nh,
            hs,
        })?;
        attention_backward(dev, s, d, scale)?;
        dev.exec(SplitHeadsBackward {
            dq: &s.dq,
            dk: &s.dk,
            dv: &s.dv,
            dqkv: &mut s.dqkv,
            b,
            t,
            nh,
            hs,
        })?;
    }
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::AttnW), gi(BlockParam::AttnB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, linear_id(l, BlockParam::AttnW))),
            &s.dqkv,
            GradIo::Split {
                x: &a.ln1,
                dx: &mut s.d_c,
            },
            w(BlockParam::AttnW),
            gw,
            Some(gb),
            None,
            None,
            n,
            c,
            3 * c,
        )?;
        // The key bias adds q_i·b to a whole row of scores, which the softmax ignores: its
        // gradient is exactly zero, and what a GEMM leaves there is rounding noise that Adam
        // would turn into lr-sized random updates (different on every backend). Make it exactly
        // zero.
        dev.copy(zeros_c, 0, gb, c, c)?;
    }
    {
        // dresid becomes the gradient of this block's input, the previous block's res3: its
        // column sum is that block's mlp.c_proj bias gradient.
        let sum = (l > 0 && !fp8).then(|| param_index(l - 1, BlockParam::FcProjB));
        let (gw, gb, dsum) = ln_grads(g, gi(BlockParam::Ln1W), gi(BlockParam::Ln1B), sum);
        layernorm_backward(
            dev,
            &s.d_c,
            x,
            w(BlockParam::Ln1W),
            &a.ln1_mean,
            &a.ln1_rstd,
            &mut s.dresid,
            gw,
            gb,
            dsum,
            n,
            c,
        )?;
    }
    Ok(())
}

/// [`duet_device::NormOps::layernorm_backward`], with `dsum += Σ_rows dx` (after the update) in the same pass
/// where given: the bias gradient of the linear layer whose output `dx` is the gradient of.
#[allow(clippy::too_many_arguments)]
pub(super) fn layernorm_backward<D: Device>(
    dev: &D,
    dout: &D::Buffer,
    x: &D::Buffer,
    gamma: &D::Buffer,
    mean: &D::Buffer,
    rstd: &D::Buffer,
    dx: &mut D::Buffer,
    dgamma: &mut D::Buffer,
    dbeta: &mut D::Buffer,
    dsum: Option<&mut D::Buffer>,
    n: usize,
    c: usize,
) -> Result<()> {
    match dsum {
        Some(dsum) => dev.exec(LayerNormBackwardColsum {
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            dsum,
            n,
            c,
        })?,
        None => dev.exec(LayerNormBackward {
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            n,
            c,
        })?,
    }
    Ok(())
}

/// A LayerNorm's weight and bias gradients (`w`, `b`) and, where given, the gradient its
/// backward pass also sums the residual gradient into (`sum`, a linear layer's bias).
pub(super) fn ln_grads<B>(
    g: &mut [B],
    w: usize,
    b: usize,
    sum: Option<usize>,
) -> (&mut B, &mut B, Option<&mut B>) {
    match sum {
        Some(s) => {
            let [gw, gb, gs] = g.get_disjoint_mut([w, b, s]).expect("distinct parameters");
            (gw, gb, Some(gs))
        }
        None => {
            let (gw, gb) = two_mut(g, w, b);
            (gw, gb, None)
        }
    }
}

/// Two distinct mutable elements of a slice.
pub(super) fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "two_mut needs distinct indices");
    if i < j {
        let (lo, hi) = v.split_at_mut(j);
        (&mut lo[i], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(i);
        (&mut hi[0], &mut lo[j])
    }
}
