//! Straightforward f64 reference implementations of the ops, written from the trait docs
//! independently of the backend code (plain nested loops, no blocking or lanes).
#![allow(dead_code)]

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
