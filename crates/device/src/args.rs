//! The argument contract of the ops, checked in one place.
//!
//! Each op family has a shape descriptor (as [`crate::GemmDesc`] is for GEMMs) whose
//! `validate_*` methods check what the trait documents for every backend: sizes that overflow,
//! buffer lengths against the shape, and the dtypes the contract fixes (f32 statistics, losses,
//! scales and amaxes; i32 tokens and targets; float activations; FP8 codes). Each op's
//! [`crate::Check`] impl (beside its argument struct in [`crate::ops`]) calls its `validate_*`,
//! so they run once, before a backend sees the arguments; the backend adds only what is its own
//! (the dtypes its kernels cover, launch limits). The runtime's memory ops (upload, download,
//! copy, cast) call theirs directly. Data-dependent checks (token ids within the vocabulary) are
//! not here: the CPU checks them on the host, a GPU in the kernel (reported at the next
//! synchronisation).

use crate::{
    ADAMW_SCALARS, AdamWTensor, Buffer, DType, DeviceError, GemmDesc, Result, check_dtype,
    check_float, check_len, check_min_len, check_range,
};

fn shape(op: &'static str, detail: impl Into<String>) -> DeviceError {
    DeviceError::Shape {
        op,
        detail: detail.into(),
    }
}

fn product(op: &'static str, names: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| shape(op, format!("{names} overflows")))
}

/// FP8 codes (any of the four formats), else `Unsupported`.
fn is_fp8<B: Buffer>(op: &'static str, buf: &B) -> Result<()> {
    if buf.dtype().is_fp8() {
        Ok(())
    } else {
        Err(DeviceError::Unsupported {
            op: op.into(),
            dtype: buf.dtype(),
        })
    }
}

/// A slot of an f32 per-operand table (`scale`, `amax`, `out` of a sum of squares).
fn f32_slot<B: Buffer>(op: &'static str, buf: &B, slot: usize) -> Result<()> {
    check_dtype(op, buf, DType::F32)?;
    check_range(op, slot, 1, buf.len())
}

/// Any float dtype (FP8 included), else `Unsupported`.
fn any_float<B: Buffer>(op: &'static str, buf: &B) -> Result<()> {
    if buf.dtype().is_float() {
        Ok(())
    } else {
        Err(DeviceError::Unsupported {
            op: op.into(),
            dtype: buf.dtype(),
        })
    }
}

// ---------------------------------------------------------------------- memory

/// `upload_bytes`: `bytes` a whole number of `dst`'s elements, landing inside `dst` from
/// `offset`. Returns the number of elements.
pub fn validate_upload<B: Buffer>(dst: &B, bytes: usize, offset: usize) -> Result<usize> {
    const OP: &str = "upload_bytes";
    let size = dst.dtype().size_bytes();
    if !bytes.is_multiple_of(size) {
        return Err(shape(
            OP,
            format!(
                "{bytes} bytes is not a whole number of {} elements",
                dst.dtype()
            ),
        ));
    }
    check_range(OP, offset, bytes / size, dst.len())?;
    Ok(bytes / size)
}

/// `download_bytes`: `[offset, offset + len)` inside `src`.
pub fn validate_download<B: Buffer>(src: &B, offset: usize, len: usize) -> Result<()> {
    check_range("download_bytes", offset, len, src.len())
}

/// `copy`: `src` and `dst` of one dtype, both ranges of `len` elements inside their buffers.
pub fn validate_copy<B: Buffer>(
    src: &B,
    src_offset: usize,
    dst: &B,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    const OP: &str = "copy";
    if src.dtype() != dst.dtype() {
        return Err(DeviceError::DTypeMismatch {
            op: OP,
            expected: dst.dtype(),
            got: src.dtype(),
        });
    }
    check_range(OP, src_offset, len, src.len())?;
    check_range(OP, dst_offset, len, dst.len())
}

/// `fill` of an i32 buffer: `value` as an i32, refusing a non-integral or out-of-range value
/// rather than silently truncating it.
pub fn fill_i32(value: f32) -> Result<i32> {
    Ok(fill_integer(value, i32::MIN as f64, i32::MAX as f64, "i32")? as i32)
}

/// `fill` of a u8 buffer: `value` as a u8, refused as [`fill_i32`] refuses.
pub fn fill_u8(value: f32) -> Result<u8> {
    Ok(fill_integer(value, 0.0, 255.0, "u8")? as u8)
}

fn fill_integer(value: f32, min: f64, max: f64, what: &str) -> Result<f64> {
    let v = value as f64;
    if v.fract() == 0.0 && v >= min && v <= max {
        Ok(v)
    } else {
        Err(DeviceError::InvalidArgument(format!(
            "fill: {value} is not representable as {what}"
        )))
    }
}

// ---------------------------------------------------------------------- element-wise

/// `cast`: `src` and `dst` of any float dtype (FP8 included) and one length.
pub fn validate_cast<B: Buffer>(src: &B, dst: &B) -> Result<usize> {
    const OP: &str = "cast";
    any_float(OP, src)?;
    check_len(OP, "dst", dst, src.len())?;
    any_float(OP, dst)?;
    Ok(src.len())
}

/// `add`: `a`, `b` and `out` share a float dtype and a length.
pub fn validate_add<B: Buffer>(a: &B, b: &B, out: &B) -> Result<usize> {
    const OP: &str = "add";
    check_float(OP, a)?;
    check_dtype(OP, b, a.dtype())?;
    check_dtype(OP, out, a.dtype())?;
    check_len(OP, "b", b, a.len())?;
    check_len(OP, "out", out, a.len())?;
    Ok(a.len())
}

/// `add_assign`: float `dst` and `src` of one length (their dtypes may differ).
pub fn validate_add_assign<B: Buffer>(dst: &B, src: &B) -> Result<usize> {
    float_pair("add_assign", dst, ("src", src))
}

/// `gelu_forward`: float `x` and `out` of one length.
pub fn validate_gelu_forward<B: Buffer>(x: &B, out: &B) -> Result<usize> {
    float_pair("gelu_forward", x, ("out", out))
}

/// Float `a` and `b` (dtypes may differ) with `b` as long as `a`; the length.
fn float_pair<B: Buffer>(op: &'static str, a: &B, (what, b): (&str, &B)) -> Result<usize> {
    check_float(op, a)?;
    check_float(op, b)?;
    check_len(op, what, b, a.len())?;
    Ok(a.len())
}

/// `gelu_backward`: float `x`, `dout`, `dx` of one length.
pub fn validate_gelu_backward<B: Buffer>(x: &B, dout: &B, dx: &B) -> Result<usize> {
    const OP: &str = "gelu_backward";
    check_float(OP, x)?;
    check_float(OP, dout)?;
    check_float(OP, dx)?;
    check_len(OP, "dout", dout, x.len())?;
    check_len(OP, "dx", dx, x.len())?;
    Ok(x.len())
}

/// `adamw`: f32 `param`, `m`, `v`; a float `grad`; a `param_copy` of any float dtype; one length.
pub fn validate_adamw<B: Buffer>(
    param: &B,
    grad: &B,
    m: &B,
    v: &B,
    copy: Option<&B>,
) -> Result<usize> {
    adamw_operands("adamw", param, grad, m, v, copy)
}

/// `adamw_clipped`: f32 `scalars` of at least [`ADAMW_SCALARS`] values, and every tensor's
/// operands as [`validate_adamw`] checks them (reported as `adamw_clipped`'s).
pub fn validate_adamw_clipped<B: Buffer>(
    tensors: &[AdamWTensor<'_, B>],
    scalars: &B,
) -> Result<()> {
    const OP: &str = "adamw_clipped";
    validate_adamw_scalars(OP, scalars)?;
    for t in tensors {
        adamw_operands(OP, &*t.param, t.grad, &*t.m, &*t.v, t.copy.as_deref())?;
    }
    Ok(())
}

/// The per-step values of the clipped AdamW ops (`adamw_clipped`, `adamw_clipped_fp8`): f32,
/// at least [`ADAMW_SCALARS`] of them.
pub fn validate_adamw_scalars<B: Buffer>(op: &'static str, scalars: &B) -> Result<()> {
    check_dtype(op, scalars, DType::F32)?;
    check_min_len(op, "scalars", scalars, ADAMW_SCALARS)
}

/// [`validate_adamw`]'s checks, reported as `op`'s.
fn adamw_operands<B: Buffer>(
    op: &'static str,
    param: &B,
    grad: &B,
    m: &B,
    v: &B,
    copy: Option<&B>,
) -> Result<usize> {
    let n = param.len();
    check_dtype(op, param, DType::F32)?;
    check_dtype(op, m, DType::F32)?;
    check_dtype(op, v, DType::F32)?;
    check_float(op, grad)?;
    check_len(op, "grad", grad, n)?;
    check_len(op, "m", m, n)?;
    check_len(op, "v", v, n)?;
    if let Some(c) = copy {
        any_float(op, c)?;
        check_len(op, "param_copy", c, n)?;
    }
    Ok(n)
}

/// `sum_squares`: `x` of any float dtype (FP8 included), an f32 `out` holding `slot`.
pub fn validate_sum_squares<B: Buffer>(x: &B, out: &B, slot: usize) -> Result<usize> {
    const OP: &str = "sum_squares";
    any_float(OP, x)?;
    f32_slot(OP, out, slot)?;
    Ok(x.len())
}

/// `sum_squares_many`: an f32 `out` holding `slot` (checked even with no tensors) and every
/// `x` of any float dtype (FP8 included).
pub fn validate_sum_squares_many<B: Buffer>(xs: &[&B], out: &B, slot: usize) -> Result<()> {
    const OP: &str = "sum_squares_many";
    f32_slot(OP, out, slot)?;
    for x in xs {
        any_float(OP, *x)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------- FP8 GEMM

/// `gemm_fp8`: FP8 `a` and `b` (`Unsupported` otherwise) of one family (OCP or FNUZ, else
/// `InvalidArgument`), a float `c` (f32, f16, bf16), an f32 `scale_inv` holding `a_slot` and
/// `b_slot`, and the buffer lengths against `desc` ([`GemmDesc::validate`]).
pub fn validate_gemm_fp8<B: Buffer>(
    desc: &GemmDesc,
    a: &B,
    b: &B,
    c: &B,
    scale_inv: &B,
    a_slot: usize,
    b_slot: usize,
) -> Result<()> {
    const OP: &str = "gemm_fp8";
    is_fp8(OP, a)?;
    is_fp8(OP, b)?;
    let fnuz = |d: DType| matches!(d, DType::F8E4M3Fnuz | DType::F8E5M2Fnuz);
    if fnuz(a.dtype()) != fnuz(b.dtype()) {
        return Err(DeviceError::InvalidArgument(format!(
            "{OP}: A is {} but B is {}: OCP and FNUZ operands cannot be mixed",
            a.dtype(),
            b.dtype()
        )));
    }
    check_float(OP, c)?;
    check_dtype(OP, scale_inv, DType::F32)?;
    check_range(OP, a_slot, 1, scale_inv.len())?;
    check_range(OP, b_slot, 1, scale_inv.len())?;
    desc.validate(a.len(), b.len(), c.len())
}

// ---------------------------------------------------------------------- rows × cols

/// The shape of the row-wise ops: `rows × cols` matrices, one value per column (bias, LayerNorm
/// γ/β) or per row (LayerNorm statistics, losses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowsDesc {
    pub op: &'static str,
    pub rows: usize,
    pub cols: usize,
    /// `rows × cols`, checked.
    pub total: usize,
}

impl RowsDesc {
    /// `rows × cols` for `op`, refusing a product that overflows.
    pub fn new(op: &'static str, rows: usize, cols: usize) -> Result<Self> {
        let total = product(op, "rows × cols", &[rows, cols])?;
        Ok(RowsDesc {
            op,
            rows,
            cols,
            total,
        })
    }

    fn positive_cols(&self) -> Result<()> {
        if self.cols == 0 && self.rows > 0 {
            return Err(shape(self.op, "c must be positive"));
        }
        Ok(())
    }

    fn matrix<B: Buffer>(&self, what: &str, b: &B) -> Result<()> {
        check_float(self.op, b)?;
        check_len(self.op, what, b, self.total)
    }

    fn per_col<B: Buffer>(&self, what: &str, b: &B) -> Result<()> {
        check_float(self.op, b)?;
        check_len(self.op, what, b, self.cols)
    }

    fn per_row_f32<B: Buffer>(&self, what: &str, b: &B) -> Result<()> {
        check_dtype(self.op, b, DType::F32)?;
        check_len(self.op, what, b, self.rows)
    }

    /// `bias_add`: `x` (`rows × cols`) and `bias` (`cols`), floats.
    pub fn validate_bias_add<B: Buffer>(&self, x: &B, bias: &B) -> Result<()> {
        self.matrix("x", x)?;
        self.per_col("bias", bias)
    }

    /// `bias_backward`: `dout` (`rows × cols`) and `dbias` (`cols`), floats.
    pub fn validate_bias_backward<B: Buffer>(&self, dout: &B, dbias: &B) -> Result<()> {
        self.matrix("dout", dout)?;
        self.per_col("dbias", dbias)
    }

    /// `layernorm_forward`: `x`, `out` (`n × c`), `gamma`, `beta` (`c`), f32 `mean`, `rstd` (`n`).
    pub fn validate_layernorm_forward<B: Buffer>(
        &self,
        x: &B,
        gamma: &B,
        beta: &B,
        out: Option<&B>,
        mean: &B,
        rstd: &B,
    ) -> Result<()> {
        self.positive_cols()?;
        self.matrix("x", x)?;
        self.per_col("gamma", gamma)?;
        self.per_col("beta", beta)?;
        if let Some(out) = out {
            self.matrix("out", out)?;
        }
        self.per_row_f32("mean", mean)?;
        self.per_row_f32("rstd", rstd)
    }

    /// `layernorm_backward` (and, with `dsum` of `c`, `layernorm_backward_colsum`).
    #[allow(clippy::too_many_arguments)]
    pub fn validate_layernorm_backward<B: Buffer>(
        &self,
        dout: &B,
        x: &B,
        gamma: &B,
        mean: &B,
        rstd: &B,
        dx: &B,
        dgamma: &B,
        dbeta: &B,
        dsum: Option<&B>,
    ) -> Result<()> {
        self.positive_cols()?;
        if let Some(d) = dsum {
            self.per_col("dsum", d)?;
        }
        self.matrix("dout", dout)?;
        self.matrix("x", x)?;
        self.per_col("gamma", gamma)?;
        self.matrix("dx", dx)?;
        self.per_col("dgamma", dgamma)?;
        self.per_col("dbeta", dbeta)?;
        self.per_row_f32("mean", mean)?;
        self.per_row_f32("rstd", rstd)
    }

    /// `layernorm_forward_fp8`: [`RowsDesc::validate_layernorm_forward`]'s operands without
    /// `out` (`x`, `gamma`, `beta`, `mean`, `rstd`), then the codes of the output as
    /// [`RowsDesc::validate_quantize_fp8`] checks them (`dst`, `dst_t`, `scale` and `amax` at
    /// `slot`).
    #[allow(clippy::too_many_arguments)]
    pub fn validate_layernorm_forward_fp8<B: Buffer>(
        &self,
        x: &B,
        gamma: &B,
        beta: &B,
        mean: &B,
        rstd: &B,
        dst: &B,
        dst_t: Option<&B>,
        scale: &B,
        amax: &B,
        slot: usize,
    ) -> Result<()> {
        self.validate_layernorm_forward(x, gamma, beta, None, mean, rstd)?;
        self.validate_quantize_fp8(None, dst, dst_t, scale, amax, slot)
    }

    /// `quantize_fp8_grad`: float `gelu_pre` (when given) and `dout` (`rows × cols`), float
    /// `dbias` (`cols`), then the codes as [`RowsDesc::validate_quantize_fp8`] checks them.
    #[allow(clippy::too_many_arguments)]
    pub fn validate_quantize_fp8_grad<B: Buffer>(
        &self,
        dout: &B,
        gelu_pre: Option<&B>,
        dst: &B,
        dst_t: Option<&B>,
        dbias: &B,
        scale: &B,
        amax: &B,
        slot: usize,
    ) -> Result<()> {
        if let Some(pre) = gelu_pre {
            self.matrix("gelu_pre", pre)?;
        }
        self.matrix("dout", dout)?;
        self.per_col("dbias", dbias)?;
        self.validate_quantize_fp8(None, dst, dst_t, scale, amax, slot)
    }

    /// `cross_entropy`: float `logits` (`n × v`), i32 `targets` and f32 `losses` (`n`), float
    /// `dlogits` (`n × v`) when given; `v > 0` unless there are no rows.
    pub fn validate_cross_entropy<B: Buffer>(
        &self,
        logits: &B,
        targets: &B,
        losses: &B,
        dlogits: Option<&B>,
        v: usize,
    ) -> Result<()> {
        if v == 0 && self.rows > 0 {
            return Err(shape(self.op, "v must be positive"));
        }
        if v > self.cols {
            return Err(shape(
                self.op,
                format!("v ({v}) exceeds the row length ld ({})", self.cols),
            ));
        }
        self.matrix("logits", logits)?;
        check_dtype(self.op, targets, DType::I32)?;
        check_len(self.op, "targets", targets, self.rows)?;
        self.per_row_f32("losses", losses)?;
        if let Some(d) = dlogits {
            self.matrix("dlogits", d)?;
        }
        Ok(())
    }

    /// FP8 quantisation of a `rows × cols` float `src` into FP8 `dst` (and `dst_t`, its
    /// transpose, of `dst`'s dtype), reading `scale[slot]` and updating `amax[slot]` (f32).
    pub fn validate_quantize_fp8<B: Buffer>(
        &self,
        src: Option<&B>,
        dst: &B,
        dst_t: Option<&B>,
        scale: &B,
        amax: &B,
        slot: usize,
    ) -> Result<()> {
        if let Some(s) = src {
            self.matrix("src", s)?;
        }
        is_fp8(self.op, dst)?;
        check_len(self.op, "dst", dst, self.total)?;
        if let Some(t) = dst_t {
            check_dtype(self.op, t, dst.dtype())?;
            check_len(self.op, "dst_t", t, self.total)?;
        }
        f32_slot(self.op, scale, slot)?;
        f32_slot(self.op, amax, slot)
    }
}

// ---------------------------------------------------------------------- embeddings

/// The shape of the embedding ops: `b × t` tokens of width `c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokensDesc {
    pub op: &'static str,
    pub b: usize,
    pub t: usize,
    pub c: usize,
}

impl TokensDesc {
    pub fn new(op: &'static str, b: usize, t: usize, c: usize) -> Result<Self> {
        product(op, "b × t", &[b, t])?;
        product(op, "t × c", &[t, c])?;
        product(op, "b × t × c", &[b, t, c])?;
        if c == 0 {
            return Err(shape(op, "c must be positive"));
        }
        Ok(TokensDesc { op, b, t, c })
    }

    /// i32 `tokens` (`b·t`), the token table (`vocab × c`, float) and the position table (at
    /// least `t × c`, float), and the activations (`b·t × c`, float). Returns the vocabulary.
    pub fn validate<B: Buffer>(
        &self,
        tokens: &B,
        table: &B,
        pos_table: &B,
        act: &B,
    ) -> Result<usize> {
        let (op, c) = (self.op, self.c);
        check_dtype(op, tokens, DType::I32)?;
        check_len(op, "tokens", tokens, self.b * self.t)?;
        check_float(op, table)?;
        check_float(op, pos_table)?;
        check_float(op, act)?;
        if !table.len().is_multiple_of(c) || table.is_empty() {
            return Err(shape(
                op,
                format!(
                    "token table has {} elements, not a positive multiple of c = {c}",
                    table.len()
                ),
            ));
        }
        check_min_len(op, "position table", pos_table, self.t * c)?;
        check_len(op, "activations", act, self.b * self.t * c)?;
        Ok(table.len() / c)
    }
}

// ---------------------------------------------------------------------- attention

/// The shape of the head permutations and flash attention: `b × t` positions of `nh` heads of
/// size `hs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadsDesc {
    pub op: &'static str,
    pub b: usize,
    pub t: usize,
    pub nh: usize,
    pub hs: usize,
    /// `b·t·nh·hs` (one of q, k, v; `qkv` holds three), checked.
    pub n: usize,
}

impl HeadsDesc {
    pub fn new(op: &'static str, b: usize, t: usize, nh: usize, hs: usize) -> Result<Self> {
        let n = product(op, "b × t × nh × hs", &[b, t, nh, hs, 3])? / 3;
        // The length of flash attention's lse (checked even when hs = 0 makes n 0).
        product(op, "b × nh × t", &[b, nh, t])?;
        Ok(HeadsDesc {
            op,
            b,
            t,
            nh,
            hs,
            n,
        })
    }

    /// `split_heads` / `split_heads_backward`: the packed `qkv` (or `dqkv`, `3n`) and the
    /// three heads (`n` each), all of the packed buffer's dtype.
    pub fn validate_split<B: Buffer>(
        &self,
        packed: (&str, &B),
        parts: [(&str, &B); 3],
    ) -> Result<()> {
        let (pname, qkv) = packed;
        check_len(self.op, pname, qkv, 3 * self.n)?;
        for (name, p) in parts {
            check_dtype(self.op, p, qkv.dtype())?;
            check_len(self.op, name, p, self.n)?;
        }
        Ok(())
    }

    /// `merge_heads`: `y` and `out` of one dtype, `n` each.
    pub fn validate_merge<B: Buffer>(&self, y: &B, out: &B) -> Result<()> {
        check_dtype(self.op, out, y.dtype())?;
        check_len(self.op, "y", y, self.n)?;
        check_len(self.op, "out", out, self.n)
    }

    /// Flash attention: `qkv` (`3n`), the output-shaped buffers (`n` each, `qkv`'s dtype) and
    /// the f32 `lse` (`b·nh·t`).
    pub fn validate_flash<B: Buffer>(&self, qkv: &B, outs: &[(&str, &B)], lse: &B) -> Result<()> {
        check_float(self.op, qkv)?;
        check_len(self.op, "qkv", qkv, 3 * self.n)?;
        for (name, o) in outs {
            check_dtype(self.op, *o, qkv.dtype())?;
            let want = if *name == "dqkv" { 3 * self.n } else { self.n };
            check_len(self.op, name, *o, want)?;
        }
        check_dtype(self.op, lse, DType::F32)?;
        check_len(self.op, "lse", lse, self.b * self.nh * self.t)
    }
}

/// The shape of the causal softmax: `batch` matrices of `t × t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxDesc {
    pub op: &'static str,
    pub batch: usize,
    pub t: usize,
    /// `batch·t·t`, checked.
    pub total: usize,
}

impl SoftmaxDesc {
    pub fn new(op: &'static str, batch: usize, t: usize) -> Result<Self> {
        let total = product(op, "rows × t × t", &[batch, t, t])?;
        Ok(SoftmaxDesc {
            op,
            batch,
            t,
            total,
        })
    }

    /// Every buffer float and `batch·t·t` long.
    pub fn validate<B: Buffer>(&self, bufs: &[(&str, &B)]) -> Result<()> {
        for (name, b) in bufs {
            check_float(self.op, *b)?;
            check_len(self.op, name, *b, self.total)?;
        }
        Ok(())
    }
}
