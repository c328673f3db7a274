//! Every backward op against central finite differences of the f64 reference forward.
//!
//! For an op `f` with reference forward `f64`, random input `x` and random weights `w`, the
//! loss is `L(x) = Σ w·f(x)`; its gradient is estimated as `(L(x + h·eᵢ) − L(x − h·eᵢ)) / 2h`
//! in f64 with `h = 1e-4` and compared with the backend's backward output given `dout = w`.
//!
//! Tolerance: `|got − fd| ≤ 1e-3·|fd| + 1e-4·max|fd|`. The FD estimate's own error is
//! O(h²·f''') ≈ 1e-8 plus rounding ≈ 1e-16/h = 1e-12, far below that; the backend computes in
//! f32 (relative error ~1e-6 per element, ~1e-5 after the row reductions of layernorm and
//! softmax), so the bound leaves two orders of magnitude of headroom while any wrong term in a
//! gradient formula (a missing factor, a sign, a dropped mean) shows up as an O(1) relative
//! error and fails.

mod common;

use common::reference as r;
use common::*;
use duet_device::{
    AddAssign, BiasBackward, CrossEntropy, DType, EmbeddingBackward, GeluBackward, Gemm, GemmDesc,
    LayerNormBackward, LayerNormForward, MergeHeads, Runtime, Scale, SoftmaxCausalBackward,
    SoftmaxCausalForward, SplitHeadsBackward,
};

const H: f64 = 1e-4;

#[track_caller]
fn assert_grad(what: &str, got: &[f32], fd: &[(usize, f64)]) {
    let scale = fd.iter().fold(0.0f64, |m, &(_, g)| m.max(g.abs()));
    assert!(
        scale > 0.0,
        "{what}: all-zero FD gradient makes the test vacuous"
    );
    for &(i, want) in fd {
        let g = got[i] as f64;
        let tol = 1e-3 * want.abs() + 1e-4 * scale;
        assert!(
            (g - want).abs() <= tol,
            "{what}[{i}]: backend {g}, finite difference {want} (tolerance {tol:e})"
        );
    }
}

/// `got − init` element-wise: the part an accumulating backward added.
fn added(got: &[f32], init: &[f32]) -> Vec<f32> {
    got.iter().zip(init).map(|(g, i)| g - i).collect()
}

#[test]
fn embedding_backward() {
    let d = dev();
    let mut rng = Rng::new(11);
    let (b, t, c, vocab, max_t) = (3, 4, 5, 6, 6);
    // Repeated tokens (vocab 6, 12 positions) exercise the per-row accumulation.
    let tokens: Vec<i32> = (0..b * t).map(|_| rng.below(vocab) as i32).collect();
    let wte = to64(&rng.vec(vocab * c));
    let wpe = to64(&rng.vec(max_t * c));
    let w = rng.vec(b * t * c);
    let fd_wte = r::fd_grad(
        |x| r::embedding(&tokens, x, &wpe, b, t, c),
        &wte,
        &to64(&w),
        H,
        None,
    );
    let fd_wpe = r::fd_grad(
        |x| r::embedding(&tokens, &wte, x, b, t, c),
        &wpe,
        &to64(&w),
        H,
        None,
    );
    let (init_te, init_pe) = (rng.vec(vocab * c), rng.vec(max_t * c));
    let mut dwte = up(&d, &init_te);
    let mut dwpe = up(&d, &init_pe);
    d.exec(EmbeddingBackward {
        tokens: &up_i32(&d, &tokens),
        dout: &up(&d, &w),
        dwte: &mut dwte,
        dwpe: &mut dwpe,
        b,
        t,
        c,
    })
    .unwrap();
    assert_grad("dwte", &added(&down(&d, &dwte), &init_te), &fd_wte);
    assert_grad("dwpe", &added(&down(&d, &dwpe), &init_pe), &fd_wpe);
}

#[test]
fn layernorm_backward() {
    let d = dev();
    let mut rng = Rng::new(12);
    let (n, c, eps) = (5, 16, 1e-5);
    let x: Vec<f32> = rng.vec(n * c).iter().map(|v| 2.0 * v + 0.3).collect();
    let gamma: Vec<f32> = rng.vec(c).iter().map(|v| 1.0 + 0.5 * v).collect();
    let beta = rng.vec(c);
    let w = rng.vec(n * c);
    let (x64, g64, b64, w64) = (to64(&x), to64(&gamma), to64(&beta), to64(&w));
    let fd_x = r::fd_grad(
        |x| r::layernorm(x, &g64, &b64, n, c, eps).0,
        &x64,
        &w64,
        H,
        None,
    );
    let fd_g = r::fd_grad(
        |g| r::layernorm(&x64, g, &b64, n, c, eps).0,
        &g64,
        &w64,
        H,
        None,
    );
    let fd_b = r::fd_grad(
        |b| r::layernorm(&x64, &g64, b, n, c, eps).0,
        &b64,
        &w64,
        H,
        None,
    );

    let (xb, gb) = (up(&d, &x), up(&d, &gamma));
    let mut out = zeros(&d, DType::F32, n * c);
    let mut mean = zeros(&d, DType::F32, n);
    let mut rstd = zeros(&d, DType::F32, n);
    d.exec(LayerNormForward {
        x: &xb,
        gamma: &gb,
        beta: &up(&d, &beta),
        out: &mut out,
        mean: &mut mean,
        rstd: &mut rstd,
        n,
        c,
        eps: eps as f32,
    })
    .unwrap();
    let (i_dx, i_dg, i_db) = (rng.vec(n * c), rng.vec(c), rng.vec(c));
    let mut dx = up(&d, &i_dx);
    let mut dg = up(&d, &i_dg);
    let mut db = up(&d, &i_db);
    d.exec(LayerNormBackward {
        dout: &up(&d, &w),
        x: &xb,
        gamma: &gb,
        mean: &mean,
        rstd: &rstd,
        dx: &mut dx,
        dgamma: &mut dg,
        dbeta: &mut db,
        n,
        c,
    })
    .unwrap();
    assert_grad("dx", &added(&down(&d, &dx), &i_dx), &fd_x);
    assert_grad("dgamma", &added(&down(&d, &dg), &i_dg), &fd_g);
    assert_grad("dbeta", &added(&down(&d, &db), &i_db), &fd_b);
}

#[test]
fn bias_backward() {
    let d = dev();
    let mut rng = Rng::new(13);
    let (rows, c) = (70, 9); // more rows than one reduction block
    let x = to64(&rng.vec(rows * c));
    let bias = to64(&rng.vec(c));
    let w = rng.vec(rows * c);
    let fd = r::fd_grad(|b| r::bias_add(&x, b, c), &bias, &to64(&w), H, None);
    let init = rng.vec(c);
    let mut db = up(&d, &init);
    d.exec(BiasBackward {
        dout: &up(&d, &w),
        dbias: &mut db,
        rows,
        c,
    })
    .unwrap();
    assert_grad("dbias", &added(&down(&d, &db), &init), &fd);
}

#[test]
fn gelu_backward() {
    let d = dev();
    let mut rng = Rng::new(14);
    let x: Vec<f32> = rng.vec(300).iter().map(|v| 4.0 * v).collect();
    let w = rng.vec(300);
    let fd = r::fd_grad(r::gelu, &to64(&x), &to64(&w), H, None);
    let mut dx = up(&d, &vec![f32::NAN; 300]); // overwritten
    d.exec(GeluBackward {
        x: &up(&d, &x),
        dout: &up(&d, &w),
        dx: &mut dx,
    })
    .unwrap();
    assert_grad("gelu dx", &down(&d, &dx), &fd);
}

#[test]
fn softmax_causal_backward() {
    let d = dev();
    let mut rng = Rng::new(15);
    let (rows, t, scale) = (3, 6, 0.4f32);
    let s: Vec<f32> = rng.vec(rows * t * t).iter().map(|v| 3.0 * v).collect();
    let w = rng.vec(rows * t * t);
    let fd = r::fd_grad(
        |s| r::softmax_causal(s, rows, t, scale as f64),
        &to64(&s),
        &to64(&w),
        H,
        None,
    );
    let mut p = zeros(&d, DType::F32, rows * t * t);
    d.exec(SoftmaxCausalForward {
        scores: &up(&d, &s),
        probs: &mut p,
        batch: rows,
        t,
        scale,
    })
    .unwrap();
    let mut ds = up(&d, &vec![f32::NAN; rows * t * t]);
    d.exec(SoftmaxCausalBackward {
        probs: &p,
        dprobs: &up(&d, &w),
        dscores: &mut ds,
        batch: rows,
        t,
        scale,
    })
    .unwrap();
    let got = down(&d, &ds);
    assert_grad("dscores", &got, &fd);
    for (i, &g) in got.iter().enumerate() {
        if i % t > (i / t) % t {
            assert_eq!(g, 0.0, "above the diagonal");
        }
    }
}

#[test]
fn cross_entropy_backward() {
    let d = dev();
    let mut rng = Rng::new(16);
    let (n, v, grad_scale) = (6, 11, 0.37f32);
    let logits: Vec<f32> = rng.vec(n * v).iter().map(|x| 3.0 * x).collect();
    let mut targets: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
    targets[1] = -1;
    targets[4] = -100;
    // dlogits = grad_scale · d(Σ losses)/dlogits: weights are grad_scale for every row.
    let w = vec![grad_scale as f64; n];
    let fd = r::fd_grad(
        |l| r::cross_entropy(l, &targets, n, v),
        &to64(&logits),
        &w,
        H,
        None,
    );
    let mut losses = zeros(&d, DType::F32, n);
    let mut dl = up(&d, &vec![f32::NAN; n * v]);
    d.exec(CrossEntropy {
        logits: &up(&d, &logits),
        targets: &up_i32(&d, &targets),
        losses: &mut losses,
        dlogits: Some(&mut dl),
        n,
        v,
        grad_scale,
    })
    .unwrap();
    let got = down(&d, &dl);
    assert_grad("dlogits", &got, &fd);
    for &row in &[1, 4] {
        assert!(
            got[row * v..(row + 1) * v].iter().all(|&g| g == 0.0),
            "ignored row {row}"
        );
    }
    // The losses written alongside the gradient are the forward's.
    let want = r::cross_entropy(&to64(&logits), &targets, n, v);
    assert_close("losses", &down(&d, &losses), &want, 1e-5, 1e-6);
}

#[test]
fn split_heads_backward_is_adjoint() {
    let d = dev();
    let mut rng = Rng::new(17);
    let (b, t, nh, hs) = (2, 3, 2, 4);
    let n = b * t * nh * hs;
    let qkv = to64(&rng.vec(3 * n));
    let w: Vec<f32> = rng.vec(3 * n);
    // L = Σ w_q·q + w_k·k + w_v·v with the weights concatenated.
    let fd = r::fd_grad(
        |x| r::split_heads(x, b, t, nh, hs).concat(),
        &qkv,
        &to64(&w),
        H,
        None,
    );
    let mut dqkv = up(&d, &vec![f32::NAN; 3 * n]);
    d.exec(SplitHeadsBackward {
        dq: &up(&d, &w[..n]),
        dk: &up(&d, &w[n..2 * n]),
        dv: &up(&d, &w[2 * n..]),
        dqkv: &mut dqkv,
        b,
        t,
        nh,
        hs,
    })
    .unwrap();
    assert_grad("dqkv", &down(&d, &dqkv), &fd);
}

#[test]
fn merge_heads_backward_is_adjoint() {
    let d = dev();
    let mut rng = Rng::new(18);
    let (b, t, nh, hs) = (2, 3, 2, 4);
    let n = b * t * nh * hs;
    let y = to64(&rng.vec(n));
    let w = rng.vec(n);
    let fd = r::fd_grad(|y| r::merge_heads(y, b, t, nh, hs), &y, &to64(&w), H, None);
    let mut dy = zeros(&d, DType::F32, n);
    d.exec(MergeHeads {
        y: &up(&d, &w),
        out: &mut dy,
        b,
        t,
        nh,
        hs,
        backward: true,
    })
    .unwrap();
    assert_grad("dy", &down(&d, &dy), &fd);
}

#[test]
fn gemm_backward_identities() {
    // Forward C = A·Bᵀ (a linear layer); dA = dC·B and dB = dCᵀ·A via the backend's GEMM.
    let d = dev();
    let mut rng = Rng::new(19);
    let (m, n, k) = (5, 7, 4);
    let a = to64(&rng.vec(m * k));
    let bm = to64(&rng.vec(n * k));
    let w = rng.vec(m * n);
    let fd_a = r::fd_grad(|a| r::matmul_abt(a, &bm, m, n, k), &a, &to64(&w), H, None);
    let fd_b = r::fd_grad(|b| r::matmul_abt(&a, b, m, n, k), &bm, &to64(&w), H, None);
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<_>>();
    let (ab, bb, dc) = (up(&d, &f32s(&a)), up(&d, &f32s(&bm)), up(&d, &w));
    let mut da = up(&d, &vec![f32::NAN; m * k]);
    d.exec(Gemm {
        desc: &GemmDesc::new(false, false, m, k, n),
        a: &dc,
        b: &bb,
        c: &mut da,
    })
    .unwrap();
    assert_grad("dA", &down(&d, &da), &fd_a);
    // dB accumulates (beta 1) as the engine does for weight gradients.
    let init = rng.vec(n * k);
    let mut db = up(&d, &init);
    d.exec(Gemm {
        desc: &GemmDesc::new(true, false, n, k, m).beta(1.0),
        a: &dc,
        b: &ab,
        c: &mut db,
    })
    .unwrap();
    assert_grad("dB", &added(&down(&d, &db), &init), &fd_b);
}

#[test]
fn add_and_scale_backward() {
    let d = dev();
    let mut rng = Rng::new(20);
    let n = 50;
    let (a, b) = (to64(&rng.vec(n)), to64(&rng.vec(n)));
    let w = rng.vec(n);
    // out = a + b: both gradients are dout; the engine accumulates them with add_assign.
    let fd_a = r::fd_grad(
        |a| a.iter().zip(&b).map(|(x, y)| x + y).collect(),
        &a,
        &to64(&w),
        H,
        None,
    );
    let init = rng.vec(n);
    let mut da = up(&d, &init);
    d.exec(AddAssign {
        dst: &mut da,
        src: &up(&d, &w),
    })
    .unwrap();
    assert_grad("add da", &added(&down(&d, &da), &init), &fd_a);
    // y = alpha·x: dx = alpha·dout, computed with the backend's scale.
    let alpha = -1.75;
    let fd_x = r::fd_grad(
        |x| x.iter().map(|v| alpha * v).collect(),
        &a,
        &to64(&w),
        H,
        None,
    );
    let mut dx = up(&d, &w);
    d.exec(Scale {
        x: &mut dx,
        alpha: alpha as f32,
    })
    .unwrap();
    assert_grad("scale dx", &down(&d, &dx), &fd_x);
}
