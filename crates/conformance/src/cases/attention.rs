//! Attention: head permutations, the causal softmax, and flash attention against the unfused
//! composition.

use super::*;
use crate::reference;
use duet_device::{DType, Device, GemmDesc};

fn run_perms<E: Device>(
    e: &E,
    dt: DType,
    qkv: &[f32],
    grads: &[Vec<f32>; 4],
    shape: (usize, usize, usize, usize),
) -> Vec<Tensor> {
    let (b, t, nh, hs) = shape;
    let n = b * t * nh * hs;
    let x = put(e, dt, qkv);
    let (mut q, mut k, mut v) = (nan(e, dt, n), nan(e, dt, n), nan(e, dt, n));
    e.split_heads(&x, &mut q, &mut k, &mut v, b, t, nh, hs)
        .expect("split_heads");
    let (gq, gk, gv) = (
        put(e, dt, &grads[0]),
        put(e, dt, &grads[1]),
        put(e, dt, &grads[2]),
    );
    let mut dqkv = nan(e, dt, 3 * n);
    e.split_heads_backward(&gq, &gk, &gv, &mut dqkv, b, t, nh, hs)
        .expect("split_heads_backward");
    let y = put(e, dt, &grads[3]);
    let mut merged = nan(e, dt, n);
    e.merge_heads(&y, &mut merged, b, t, nh, hs, false)
        .expect("merge_heads");
    let mut unmerged = nan(e, dt, n);
    e.merge_heads(&y, &mut unmerged, b, t, nh, hs, true)
        .expect("merge_heads backward");
    vec![
        get(e, "q", &q),
        get(e, "k", &k),
        get(e, "v", &v),
        get(e, "dqkv", &dqkv),
        get(e, "merged", &merged),
        get(e, "unmerged", &unmerged),
    ]
}

/// `split_heads`, its backward and `merge_heads` both ways move every element exactly.
pub fn head_permutations_exact<D: Device>(h: &Harness<D>) {
    let case = "head_permutations_exact";
    let mut r = h.rng(case);
    for dt in FLOATS {
        for shape in [
            (1usize, 1usize, 1usize, 1usize),
            (2, 5, 3, 7),
            (4, 64, 12, 64),
            (2, 33, 4, 8),
        ] {
            let (b, t, nh, hs) = shape;
            let n = b * t * nh * hs;
            let qkv = r.vec(3 * n, -2.0, 2.0);
            let grads = [
                r.vec(n, -1.0, 1.0),
                r.vec(n, -1.0, 1.0),
                r.vec(n, -1.0, 1.0),
                r.vec(n, -1.0, 1.0),
            ];
            let got = run_perms(&h.dev, dt, &qkv, &grads, shape);
            h.verify(
                &format!("{case} {dt} b{b} t{t} nh{nh} hs{hs}"),
                &got,
                |cpu| run_perms(cpu, dt, &qkv, &grads, shape),
                || {
                    let [q, k, v] = reference::split_heads(&rounded64(dt, &qkv), b, t, nh, hs);
                    // The inverse of split_heads: dq, dk, dv back into the qkv layout.
                    let g: Vec<Vec<f64>> = grads[..3].iter().map(|x| rounded64(dt, x)).collect();
                    let mut dqkv = vec![0.0; 3 * n];
                    for bi in 0..b {
                        for ti in 0..t {
                            for (w, gw) in g.iter().enumerate() {
                                for hh in 0..nh {
                                    for e in 0..hs {
                                        dqkv[(((bi * t + ti) * 3 + w) * nh + hh) * hs + e] =
                                            gw[((bi * nh + hh) * t + ti) * hs + e];
                                    }
                                }
                            }
                        }
                    }
                    let y = rounded64(dt, &grads[3]);
                    let merged = reference::merge_heads(&y, b, t, nh, hs);
                    // merge_heads backward: the out layout read as y's (the inverse permutation).
                    let mut unmerged = vec![0.0; n];
                    for (i, &m) in reference::merge_heads(
                        &(0..n).map(|i| i as f64).collect::<Vec<_>>(),
                        b,
                        t,
                        nh,
                        hs,
                    )
                    .iter()
                    .enumerate()
                    {
                        unmerged[m as usize] = y[i];
                    }
                    vec![
                        want("q", dt, q),
                        want("k", dt, k),
                        want("v", dt, v),
                        want("dqkv", dt, dqkv),
                        want("merged", dt, merged),
                        want("unmerged", dt, unmerged),
                    ]
                },
                &[Tol::Bits; 6],
            );
        }
    }
}

fn run_softmax<E: Device>(
    e: &E,
    dt: DType,
    s: &[f32],
    dp: &[f32],
    rows: usize,
    t: usize,
    scale: f32,
) -> Vec<Tensor> {
    let bs = put(e, dt, s);
    let mut p = nan(e, dt, rows * t * t);
    e.softmax_causal_forward(&bs, &mut p, rows, t, scale)
        .expect("softmax_causal_forward");
    let bdp = put(e, dt, dp);
    let mut ds = nan(e, dt, rows * t * t);
    e.softmax_causal_backward(&p, &bdp, &mut ds, rows, t, scale)
        .expect("softmax_causal_backward");
    vec![get(e, "probs", &p), get(e, "dscores", &ds)]
}

/// The causal scaled softmax (0 above the diagonal) and its backward.
pub fn softmax_causal_forward_backward<D: Device>(h: &Harness<D>) {
    let case = "softmax_causal_forward_backward";
    let mut r = h.rng(case);
    let scale = 1.0 / 8.0f32;
    for dt in FLOATS {
        for &(rows, t) in &[(1usize, 1usize), (3, 5), (24, 64), (4, 256), (2, 1030)] {
            let s = r.vec(rows * t * t, -8.0, 8.0);
            let dp = r.vec(rows * t * t, -1.0, 1.0);
            let got = run_softmax(&h.dev, dt, &s, &dp, rows, t, scale);
            // The backward reads the probabilities the device stored: the reference does too.
            let stored = got[0].f32().iter().map(|&x| x as f64).collect::<Vec<_>>();
            h.verify(
                &format!("{case} {dt} rows{rows} t{t}"),
                &got,
                |cpu| run_softmax(cpu, dt, &s, &dp, rows, t, scale),
                || {
                    let p = reference::softmax_causal(&rounded64(dt, &s), rows, t, scale as f64);
                    let ds = reference::softmax_causal_backward(
                        &stored,
                        &rounded64(dt, &dp),
                        rows,
                        t,
                        scale as f64,
                    );
                    vec![want("probs", dt, p), want("dscores", dt, ds)]
                },
                &[Tol::ELEMENTWISE, Tol::REDUCTION],
            );
        }
    }
}

/// Attention through the unfused ops, as the engine composes it without flash attention:
/// returns (out, lse, dqkv).
#[allow(clippy::too_many_arguments)]
fn composed_attention<E: Device>(
    e: &E,
    dt: DType,
    qkv: &E::Buffer,
    dout: &E::Buffer,
    (b, t, nh, hs): (usize, usize, usize, usize),
    scale: f32,
) -> Vec<Tensor> {
    let n = b * t * nh * hs;
    let bh = b * nh;
    let (mut q, mut k, mut v) = (nan(e, dt, n), nan(e, dt, n), nan(e, dt, n));
    e.split_heads(qkv, &mut q, &mut k, &mut v, b, t, nh, hs)
        .unwrap();
    let mut s = nan(e, dt, bh * t * t);
    e.gemm(
        &GemmDesc::batched(false, true, t, t, hs, bh),
        &q,
        &k,
        &mut s,
    )
    .unwrap();
    let mut p = nan(e, dt, bh * t * t);
    e.softmax_causal_forward(&s, &mut p, bh, t, scale).unwrap();
    let mut y = nan(e, dt, n);
    e.gemm(
        &GemmDesc::batched(false, false, t, hs, t, bh),
        &p,
        &v,
        &mut y,
    )
    .unwrap();
    let mut out = nan(e, dt, n);
    e.merge_heads(&y, &mut out, b, t, nh, hs, false).unwrap();
    // lse of each query row's scaled scores over keys j ≤ i, on the host from the scores.
    let sv = get(e, "s", &s).f32();
    let lse: Vec<f32> = (0..bh * t)
        .map(|row| {
            let i = row % t;
            let z = &sv[row * t..row * t + i + 1];
            let mx = z
                .iter()
                .fold(f64::NEG_INFINITY, |m, &x| m.max(scale as f64 * x as f64));
            (mx + z
                .iter()
                .map(|&x| (scale as f64 * x as f64 - mx).exp())
                .sum::<f64>()
                .ln()) as f32
        })
        .collect();
    // Backward.
    let mut dy = nan(e, dt, n);
    e.merge_heads(dout, &mut dy, b, t, nh, hs, true).unwrap();
    let mut dp = nan(e, dt, bh * t * t);
    e.gemm(
        &GemmDesc::batched(false, true, t, t, hs, bh),
        &dy,
        &v,
        &mut dp,
    )
    .unwrap();
    let mut dv = nan(e, dt, n);
    e.gemm(
        &GemmDesc::batched(true, false, t, hs, t, bh),
        &p,
        &dy,
        &mut dv,
    )
    .unwrap();
    let mut ds = nan(e, dt, bh * t * t);
    e.softmax_causal_backward(&p, &dp, &mut ds, bh, t, scale)
        .unwrap();
    let mut dq = nan(e, dt, n);
    e.gemm(
        &GemmDesc::batched(false, false, t, hs, t, bh),
        &ds,
        &k,
        &mut dq,
    )
    .unwrap();
    let mut dk = nan(e, dt, n);
    e.gemm(
        &GemmDesc::batched(true, false, t, hs, t, bh),
        &ds,
        &q,
        &mut dk,
    )
    .unwrap();
    let mut dqkv = nan(e, dt, 3 * n);
    e.split_heads_backward(&dq, &dk, &dv, &mut dqkv, b, t, nh, hs)
        .unwrap();
    let lse_t = Tensor {
        name: "lse".into(),
        dtype: DType::F32,
        bytes: encode(DType::F32, &lse),
    };
    vec![get(e, "out", &out), lse_t, get(e, "dqkv", &dqkv)]
}

/// Flash attention (forward with its log-sum-exp, backward) equals the unfused composition
/// (split heads, batched GEMMs, causal softmax, merge heads) on the same device, for the dtypes
/// and head sizes the backend offers it; odd sequence lengths; deterministic backward.
pub fn flash_attention_matches_composition<D: Device>(h: &Harness<D>) {
    let case = "flash_attention_matches_composition";
    let d = &h.dev;
    let mut r = h.rng(case);
    let mut ran = 0;
    for dt in HALVES {
        for &(b, t, nh, hs) in &[
            (2usize, 67usize, 3usize, 64usize),
            (1, 130, 2, 128),
            (2, 256, 2, 64),
        ] {
            if !d.supports_flash_attention(dt, hs) {
                continue;
            }
            ran += 1;
            let n = b * t * nh * hs;
            let scale = 1.0 / (hs as f32).sqrt();
            let qkv = put(d, dt, &r.vec(3 * n, -2.0, 2.0));
            let dout = put(d, dt, &r.vec(n, -1.0, 1.0));
            let plain = composed_attention(d, dt, &qkv, &dout, (b, t, nh, hs), scale);
            let run = || {
                let mut out = nan(d, dt, n);
                let mut lse = nan(d, DType::F32, b * nh * t);
                d.flash_attention_forward(&qkv, &mut out, &mut lse, b, t, nh, hs, scale)
                    .expect("flash_attention_forward");
                let mut dqkv = nan(d, dt, 3 * n);
                d.flash_attention_backward(&qkv, &out, &dout, &lse, &mut dqkv, b, t, nh, hs, scale)
                    .expect("flash_attention_backward");
                vec![
                    get(d, "out", &out),
                    get(d, "lse", &lse),
                    get(d, "dqkv", &dqkv),
                ]
            };
            let fused = run();
            let tol = if dt == DType::BF16 {
                Tol::rel(3e-2)
            } else {
                Tol::rel(1e-2)
            };
            h.same(
                &format!("{case} {dt} b{b} t{t} nh{nh} hs{hs}"),
                &fused,
                &plain,
                &[tol, Tol::rel(1e-3), tol],
            );
            assert_eq!(
                fused,
                run(),
                "{case}: {dt} b{b} t{t} nh{nh} hs{hs} not deterministic"
            );
        }
    }
    if ran == 0 {
        skip(
            case,
            &format!("the {} backend has no flash attention", h.backend()),
        );
    }
}
