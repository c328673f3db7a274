//! Straightforward f64 reference implementations of the ops, written from the trait docs
//! independently of the backend code (plain nested loops, no blocking or lanes).

pub fn embedding(
    tokens: &[i32],
    wte: &[f64],
    wpe: &[f64],
    b: usize,
    t: usize,
    c: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; b * t * c];
    for bi in 0..b {
        for ti in 0..t {
            let tok = tokens[bi * t + ti] as usize;
            for j in 0..c {
                out[(bi * t + ti) * c + j] = wte[tok * c + j] + wpe[ti * c + j];
            }
        }
    }
    out
}

/// Returns (out, mean, rstd).
pub fn layernorm(
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    n: usize,
    c: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; n * c];
    let mut mean = vec![0.0; n];
    let mut rstd = vec![0.0; n];
    for r in 0..n {
        let row = &x[r * c..(r + 1) * c];
        let mu = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / c as f64;
        let rs = 1.0 / (var + eps).sqrt();
        for j in 0..c {
            out[r * c + j] = (row[j] - mu) * rs * gamma[j] + beta[j];
        }
        mean[r] = mu;
        rstd[r] = rs;
    }
    (out, mean, rstd)
}

pub fn bias_add(x: &[f64], bias: &[f64], c: usize) -> Vec<f64> {
    x.iter().enumerate().map(|(i, v)| v + bias[i % c]).collect()
}

pub fn gelu(x: &[f64]) -> Vec<f64> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    x.iter()
        .map(|&v| 0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh()))
        .collect()
}

pub fn softmax_causal(s: &[f64], rows: usize, t: usize, scale: f64) -> Vec<f64> {
    let mut p = vec![0.0; rows * t * t];
    for r in 0..rows {
        for i in 0..t {
            let base = (r * t + i) * t;
            let mx = (0..=i)
                .map(|j| scale * s[base + j])
                .fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = (0..=i).map(|j| (scale * s[base + j] - mx).exp()).sum();
            for j in 0..=i {
                p[base + j] = (scale * s[base + j] - mx).exp() / z;
            }
        }
    }
    p
}

/// Per-row losses (0 for negative targets).
pub fn cross_entropy(logits: &[f64], targets: &[i32], n: usize, v: usize) -> Vec<f64> {
    (0..n)
        .map(|r| {
            if targets[r] < 0 {
                return 0.0;
            }
            let row = &logits[r * v..(r + 1) * v];
            let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = mx + row.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
            lse - row[targets[r] as usize]
        })
        .collect()
}

/// qkv (b, t, 3, nh, hs) → [q, k, v], each (b, nh, t, hs).
pub fn split_heads(qkv: &[f64], b: usize, t: usize, nh: usize, hs: usize) -> [Vec<f64>; 3] {
    let mut out = [
        vec![0.0; b * nh * t * hs],
        vec![0.0; b * nh * t * hs],
        vec![0.0; b * nh * t * hs],
    ];
    for bi in 0..b {
        for ti in 0..t {
            for (w, o) in out.iter_mut().enumerate() {
                for h in 0..nh {
                    for e in 0..hs {
                        let src = (((bi * t + ti) * 3 + w) * nh + h) * hs + e;
                        let dst = ((bi * nh + h) * t + ti) * hs + e;
                        o[dst] = qkv[src];
                    }
                }
            }
        }
    }
    out
}

/// y (b, nh, t, hs) → out (b, t, nh·hs).
pub fn merge_heads(y: &[f64], b: usize, t: usize, nh: usize, hs: usize) -> Vec<f64> {
    let mut out = vec![0.0; y.len()];
    for bi in 0..b {
        for h in 0..nh {
            for ti in 0..t {
                for e in 0..hs {
                    out[((bi * t + ti) * nh + h) * hs + e] = y[((bi * nh + h) * t + ti) * hs + e];
                }
            }
        }
    }
    out
}

/// C = A·Bᵀ for dense A (m × k) and B (n × k).
pub fn matmul_abt(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
        }
    }
    c
}

/// Causal scaled self-attention straight from the definitions, with its backward: from `qkv`
/// (`b × t × 3 × nh × hs`) and `dout` (`b × t × nh·hs`) returns (out `b × t × nh·hs`,
/// lse `b × nh × t` of each query row's scaled scores over keys j ≤ i, dqkv in qkv's layout).
pub fn causal_attention(
    qkv: &[f64],
    dout: &[f64],
    (b, t, nh, hs): (usize, usize, usize, usize),
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let at = |bb: usize, i: usize, w: usize, h: usize| (((bb * t + i) * 3 + w) * nh + h) * hs;
    let ot = |bb: usize, i: usize, h: usize| ((bb * t + i) * nh + h) * hs;
    let dot = |x: &[f64], y: &[f64]| -> f64 { x.iter().zip(y).map(|(a, b)| a * b).sum() };
    let mut out = vec![0.0; b * t * nh * hs];
    let mut lse = vec![0.0; b * nh * t];
    let mut dqkv = vec![0.0; 3 * b * t * nh * hs];
    for bb in 0..b {
        for h in 0..nh {
            let mut p = vec![vec![0.0; t]; t];
            for i in 0..t {
                let q = &qkv[at(bb, i, 0, h)..][..hs];
                let s: Vec<f64> = (0..=i)
                    .map(|j| scale * dot(q, &qkv[at(bb, j, 1, h)..][..hs]))
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l = m + s.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
                lse[(bb * nh + h) * t + i] = l;
                for j in 0..=i {
                    p[i][j] = (s[j] - l).exp();
                    for d in 0..hs {
                        out[ot(bb, i, h) + d] += p[i][j] * qkv[at(bb, j, 2, h) + d];
                    }
                }
            }
            // dP = dO·Vᵀ, dS = P ⊙ (dP − rowsum(P ⊙ dP)), dQ = scale·dS·K, dK = scale·dSᵀ·Q,
            // dV = Pᵀ·dO.
            for i in 0..t {
                let g = &dout[ot(bb, i, h)..][..hs];
                let dp: Vec<f64> = (0..=i)
                    .map(|j| dot(g, &qkv[at(bb, j, 2, h)..][..hs]))
                    .collect();
                let di: f64 = (0..=i).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..=i {
                    let ds = scale * p[i][j] * (dp[j] - di);
                    for d in 0..hs {
                        dqkv[at(bb, i, 0, h) + d] += ds * qkv[at(bb, j, 1, h) + d];
                        dqkv[at(bb, j, 1, h) + d] += ds * qkv[at(bb, i, 0, h) + d];
                        dqkv[at(bb, j, 2, h) + d] += p[i][j] * g[d];
                    }
                }
            }
        }
    }
    (out, lse, dqkv)
}

/// Central finite-difference gradient of `L(x) = Σ w·f(x)` at `x` for the given indices (all
/// when `indices` is `None`), in f64.
pub fn fd_grad(
    f: impl Fn(&[f64]) -> Vec<f64>,
    x: &[f64],
    w: &[f64],
    h: f64,
    indices: Option<&[usize]>,
) -> Vec<(usize, f64)> {
    let loss = |x: &[f64]| -> f64 { f(x).iter().zip(w).map(|(a, b)| a * b).sum() };
    let all: Vec<usize> = (0..x.len()).collect();
    let idx = indices.unwrap_or(&all);
    let mut xp = x.to_vec();
    idx.iter()
        .map(|&i| {
            let orig = xp[i];
            xp[i] = orig + h;
            let lp = loss(&xp);
            xp[i] = orig - h;
            let lm = loss(&xp);
            xp[i] = orig;
            (i, (lp - lm) / (2.0 * h))
        })
        .collect()
}

/// Naive f64 GEMM on row-major storage with the trait's conventions, for one batch entry:
/// `C = alpha·op(A)·op(B) + beta·C` (`beta = 0` ignores C, NaN included).
#[allow(clippy::too_many_arguments)]
pub fn naive_gemm(
    trans_a: bool,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    alpha: f64,
    beta: f64,
    c: &mut [f64],
    ldc: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0;
            for p in 0..k {
                let av = if trans_a {
                    a[p * lda + i]
                } else {
                    a[i * lda + p]
                };
                let bv = if trans_b {
                    b[j * ldb + p]
                } else {
                    b[p * ldb + j]
                };
                acc += av * bv;
            }
            let old = c[i * ldc + j];
            c[i * ldc + j] = alpha * acc + if beta == 0.0 { 0.0 } else { beta * old };
        }
    }
}

/// A GEMM described by `desc` (batches, strides, offsets) on f64 copies of the operands.
pub fn gemm(desc: &duet_device::GemmDesc, a: &[f64], b: &[f64], c: &mut [f64]) {
    for bi in 0..desc.batch {
        let ao = desc.a_offset + bi * desc.stride_a;
        let bo = desc.b_offset + bi * desc.stride_b;
        let co = desc.c_offset + bi * desc.stride_c;
        naive_gemm(
            desc.trans_a,
            desc.trans_b,
            desc.m,
            desc.n,
            desc.k,
            &a[ao..],
            desc.lda,
            &b[bo..],
            desc.ldb,
            desc.alpha as f64,
            desc.beta as f64,
            &mut c[co..],
            desc.ldc,
        );
    }
}

/// d/dx of the tanh-approximated GELU.
pub fn gelu_grad(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let u = k * (x + 0.044715 * x * x * x);
    let th = u.tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x)
}

/// LayerNorm backward from the saved statistics: returns (dx, dgamma, dbeta) increments.
pub fn layernorm_backward(
    dout: &[f64],
    x: &[f64],
    gamma: &[f64],
    n: usize,
    c: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, mean, rstd) = layernorm(x, gamma, &vec![0.0; c], n, c, eps);
    let mut dx = vec![0.0; n * c];
    let mut dg = vec![0.0; c];
    let mut db = vec![0.0; c];
    for r in 0..n {
        let xh: Vec<f64> = (0..c).map(|j| (x[r * c + j] - mean[r]) * rstd[r]).collect();
        let dxh: Vec<f64> = (0..c).map(|j| dout[r * c + j] * gamma[j]).collect();
        let m1 = dxh.iter().sum::<f64>() / c as f64;
        let m2 = dxh.iter().zip(&xh).map(|(a, b)| a * b).sum::<f64>() / c as f64;
        for j in 0..c {
            dx[r * c + j] = (dxh[j] - m1 - xh[j] * m2) * rstd[r];
            dg[j] += dout[r * c + j] * xh[j];
            db[j] += dout[r * c + j];
        }
    }
    (dx, dg, db)
}

/// Causal softmax backward: `ds = scale · P ⊙ (dP − Σ_j P·dP)` (0 above the diagonal).
pub fn softmax_causal_backward(
    p: &[f64],
    dp: &[f64],
    rows: usize,
    t: usize,
    scale: f64,
) -> Vec<f64> {
    let mut ds = vec![0.0; rows * t * t];
    for r in 0..rows {
        for i in 0..t {
            let base = (r * t + i) * t;
            let dot: f64 = (0..=i).map(|j| p[base + j] * dp[base + j]).sum();
            for j in 0..=i {
                ds[base + j] = scale * p[base + j] * (dp[base + j] - dot);
            }
        }
    }
    ds
}

/// Cross-entropy gradient `(softmax − onehot) · grad_scale` (0 rows for negative targets).
pub fn cross_entropy_grad(
    logits: &[f64],
    targets: &[i32],
    n: usize,
    v: usize,
    grad_scale: f64,
) -> Vec<f64> {
    let mut d = vec![0.0; n * v];
    for r in 0..n {
        if targets[r] < 0 {
            continue;
        }
        let row = &logits[r * v..(r + 1) * v];
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x - mx).exp()).sum();
        for j in 0..v {
            let p = (row[j] - mx).exp() / z;
            d[r * v + j] = (p - if j == targets[r] as usize { 1.0 } else { 0.0 }) * grad_scale;
        }
    }
    d
}

/// One AdamW step in f64 (the trait's formula): returns (param, m, v).
pub fn adamw(
    param: &[f64],
    grad: &[f64],
    m: &[f64],
    v: &[f64],
    s: &duet_device::AdamWStep,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b1, b2) = (s.beta1 as f64, s.beta2 as f64);
    let mut p2 = param.to_vec();
    let mut m2 = m.to_vec();
    let mut v2 = v.to_vec();
    for i in 0..param.len() {
        let g = grad[i] * s.grad_scale as f64;
        m2[i] = b1 * m[i] + (1.0 - b1) * g;
        v2[i] = b2 * v[i] + (1.0 - b2) * g * g;
        let mh = m2[i] / s.bias_correction1 as f64;
        let vh = v2[i] / s.bias_correction2 as f64;
        p2[i] = param[i]
            - s.lr as f64 * (mh / (vh.sqrt() + s.eps as f64) + s.weight_decay as f64 * param[i]);
    }
    (p2, m2, v2)
}

/// The transpose of a `rows × cols` row-major matrix.
pub fn transpose<T: Copy>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for c in 0..cols {
        for r in 0..rows {
            out.push(x[r * cols + c]);
        }
    }
    out
}

// ---------------------------------------------------------------- optimizer and FP8 helpers

/// `Σ x²` in f64.
pub fn sum_squares(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum()
}

/// AdamW's gradient factor from the sum of squares of the (loss-scaled) gradients, in f64 from
/// the trait's description: PyTorch's `clip_grad_norm_` coefficient `max_norm / (norm + 1e-6)`
/// of the unscaled norm where it is below 1 (clipping on), divided by the loss scale.
pub fn clip_grad_scale(norm_sq: f64, max_norm: f64, loss_scale: f64) -> f64 {
    let norm = norm_sq.sqrt() / loss_scale;
    let coef = max_norm / (norm + 1e-6);
    let clip = if max_norm > 0.0 && coef < 1.0 {
        coef
    } else {
        1.0
    };
    clip / loss_scale
}

/// FP8 codes of `x · scale` (the product in f32, as the quantisation ops compute it) with the
/// host codec (round to nearest even, saturation, NaN to the format's NaN).
pub fn fp8_codes(x: &[f32], scale: f32, dtype: duet_device::DType) -> Vec<u8> {
    let f = duet_device::Fp8Format::of(dtype).expect("an FP8 dtype");
    x.iter().map(|&v| f.encode(v * scale)).collect()
}

/// The values FP8 codes stand for.
pub fn fp8_values(codes: &[u8], dtype: duet_device::DType) -> Vec<f64> {
    let f = duet_device::Fp8Format::of(dtype).expect("an FP8 dtype");
    codes.iter().map(|&c| f.decode(c) as f64).collect()
}

/// `max(prior, max |x|)` over the elements that are not NaN (infinities count).
pub fn fp8_amax(prior: f32, x: &[f32]) -> f32 {
    x.iter()
        .filter(|v| !v.is_nan())
        .fold(prior, |m, v| if v.abs() > m { v.abs() } else { m })
}

/// Column sums of a `rows × cols` row-major matrix.
pub fn col_sums(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut s = vec![0.0; cols];
    for r in 0..rows {
        for (j, sj) in s.iter_mut().enumerate() {
            *sj += x[r * cols + j];
        }
    }
    s
}
