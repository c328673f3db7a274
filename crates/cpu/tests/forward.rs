//! Forward results of every op against the f64 references in `common::reference`.

mod common;

use common::reference as r;
use common::*;
use duet_device::{DType, Device, DeviceExt};

/// f32 arithmetic on O(1) data: a few ulps, with room for sums over ~100 terms.
const RTOL: f64 = 1e-5;
const ATOL: f64 = 1e-6;

#[test]
fn embedding_forward() {
    let d = dev();
    let mut rng = Rng::new(1);
    let (b, t, c, vocab, max_t) = (3, 5, 7, 11, 8);
    let tokens: Vec<i32> = (0..b * t).map(|_| rng.below(vocab) as i32).collect();
    let wte = rng.vec(vocab * c);
    let wpe = rng.vec(max_t * c);
    let want = r::embedding(&tokens, &to64(&wte), &to64(&wpe), b, t, c);
    for dtype in [DType::F32, DType::BF16] {
        let mut out = zeros(&d, dtype, b * t * c);
        d.embedding_forward(
            &up_i32(&d, &tokens),
            &up_as(&d, &wte, dtype),
            &up_as(&d, &wpe, dtype),
            &mut out,
            b,
            t,
            c,
        )
        .unwrap();
        let (rtol, atol) = if dtype == DType::F32 {
            (RTOL, ATOL)
        } else {
            (2e-2, 2e-2)
        };
        assert_close("embedding", &down(&d, &out), &want, rtol, atol);
    }
}

#[test]
fn layernorm_forward() {
    let d = dev();
    let mut rng = Rng::new(2);
    let (n, c, eps) = (9, 37, 1e-5);
    let x: Vec<f32> = rng.vec(n * c).iter().map(|v| 3.0 * v + 0.5).collect();
    let gamma = rng.vec(c);
    let beta = rng.vec(c);
    let (want, wmean, wrstd) = r::layernorm(&to64(&x), &to64(&gamma), &to64(&beta), n, c, eps);
    let mut out = zeros(&d, DType::F32, n * c);
    let mut mean = zeros(&d, DType::F32, n);
    let mut rstd = zeros(&d, DType::F32, n);
    d.layernorm_forward(
        &up(&d, &x),
        &up(&d, &gamma),
        &up(&d, &beta),
        &mut out,
        &mut mean,
        &mut rstd,
        n,
        c,
        eps as f32,
    )
    .unwrap();
    assert_close("out", &down(&d, &out), &want, RTOL, 1e-5);
    assert_close("mean", &down(&d, &mean), &wmean, RTOL, ATOL);
    assert_close("rstd", &down(&d, &rstd), &wrstd, RTOL, ATOL);

    // bf16 activations with bf16 parameters: inputs rounded, output rounded once.
    let xb = round_to(&x, DType::BF16);
    let (gb, bb) = (round_to(&gamma, DType::BF16), round_to(&beta, DType::BF16));
    let (want, _, _) = r::layernorm(&to64(&xb), &to64(&gb), &to64(&bb), n, c, eps);
    let mut out = zeros(&d, DType::BF16, n * c);
    d.layernorm_forward(
        &up_as(&d, &x, DType::BF16),
        &up_as(&d, &gamma, DType::BF16),
        &up_as(&d, &beta, DType::BF16),
        &mut out,
        &mut mean,
        &mut rstd,
        n,
        c,
        eps as f32,
    )
    .unwrap();
    assert_close("out bf16", &down(&d, &out), &want, 8e-3, 1e-2);
}

#[test]
fn bias_add() {
    let d = dev();
    let mut rng = Rng::new(3);
    let (rows, c) = (6, 13);
    let x = rng.vec(rows * c);
    let bias = rng.vec(c);
    let mut xb = up(&d, &x);
    d.bias_add(&mut xb, &up(&d, &bias), rows, c).unwrap();
    let want = r::bias_add(&to64(&x), &to64(&bias), c);
    assert_close("bias_add", &down(&d, &xb), &want, RTOL, ATOL);
}

#[test]
fn gelu_forward() {
    let d = dev();
    let mut rng = Rng::new(4);
    let x: Vec<f32> = rng.vec(1000).iter().map(|v| 6.0 * v).collect();
    let mut out = zeros(&d, DType::F32, x.len());
    d.gelu_forward(&up(&d, &x), &mut out).unwrap();
    assert_close("gelu", &down(&d, &out), &r::gelu(&to64(&x)), 1e-5, 1e-6);
}

#[test]
fn softmax_causal_forward() {
    let d = dev();
    let mut rng = Rng::new(5);
    let (rows, t, scale) = (4, 9, 0.35f32);
    let s: Vec<f32> = rng.vec(rows * t * t).iter().map(|v| 5.0 * v).collect();
    // Garbage above the diagonal must not matter.
    let mut s_masked = s.clone();
    for (i, v) in s_masked.iter_mut().enumerate() {
        if i % t > (i / t) % t {
            *v = f32::NAN;
        }
    }
    let want = r::softmax_causal(&to64(&s), rows, t, scale as f64);
    let mut p = up(&d, &vec![7.0; rows * t * t]);
    d.softmax_causal_forward(&up(&d, &s_masked), &mut p, rows, t, scale)
        .unwrap();
    assert_close("softmax", &down(&d, &p), &want, 1e-5, 1e-7);
}

#[test]
fn cross_entropy_losses() {
    let d = dev();
    let mut rng = Rng::new(6);
    let (n, v) = (7, 29);
    let logits: Vec<f32> = rng.vec(n * v).iter().map(|x| 4.0 * x).collect();
    let mut targets: Vec<i32> = (0..n).map(|_| rng.below(v) as i32).collect();
    targets[2] = -1;
    targets[5] = -100;
    let want = r::cross_entropy(&to64(&logits), &targets, n, v);
    let mut losses = up(&d, &vec![9.0; n]);
    d.cross_entropy(
        &up(&d, &logits),
        &up_i32(&d, &targets),
        &mut losses,
        None,
        n,
        v,
        1.0,
    )
    .unwrap();
    assert_close("losses", &down(&d, &losses), &want, 1e-5, 1e-6);
    assert_eq!(down(&d, &losses)[2], 0.0);
}

#[test]
fn split_and_merge_heads() {
    let d = dev();
    let mut rng = Rng::new(7);
    let (b, t, nh, hs) = (2, 5, 3, 4);
    let n = b * t * nh * hs;
    let qkv = rng.vec(3 * n);
    let want = r::split_heads(&to64(&qkv), b, t, nh, hs);
    for dtype in [DType::F32, DType::F16] {
        let mut q = zeros(&d, dtype, n);
        let mut k = zeros(&d, dtype, n);
        let mut v = zeros(&d, dtype, n);
        d.split_heads(
            &up_as(&d, &qkv, dtype),
            &mut q,
            &mut k,
            &mut v,
            b,
            t,
            nh,
            hs,
        )
        .unwrap();
        for (name, got, want) in [
            ("q", &q, &want[0]),
            ("k", &k, &want[1]),
            ("v", &v, &want[2]),
        ] {
            let want = round_to(&want.iter().map(|&x| x as f32).collect::<Vec<_>>(), dtype);
            assert_eq!(down(&d, got), want, "{name} {dtype}");
        }
    }

    let y = rng.vec(n);
    let want = r::merge_heads(&to64(&y), b, t, nh, hs);
    let mut out = zeros(&d, DType::F32, n);
    d.merge_heads(&up(&d, &y), &mut out, b, t, nh, hs, false)
        .unwrap();
    assert_close("merge", &down(&d, &out), &want, 0.0, 0.0);
    // backward = the inverse permutation: merging back recovers y.
    let mut back = zeros(&d, DType::F32, n);
    d.merge_heads(&out, &mut back, b, t, nh, hs, true).unwrap();
    assert_eq!(down(&d, &back), y);
}

#[test]
fn add_add_assign_scale() {
    let d = dev();
    let mut rng = Rng::new(8);
    let n = 40_000; // several parallel chunks
    let a = rng.vec(n);
    let b = rng.vec(n);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (ar, br) = (round_to(&a, dtype), round_to(&b, dtype));
        let want: Vec<f64> = ar
            .iter()
            .zip(&br)
            .map(|(&x, &y)| x as f64 + y as f64)
            .collect();
        let tol = if dtype == DType::F32 { 1e-7 } else { 1e-2 };
        let mut out = zeros(&d, dtype, n);
        d.add(&up_as(&d, &a, dtype), &up_as(&d, &b, dtype), &mut out)
            .unwrap();
        assert_close("add", &down(&d, &out), &want, tol, 0.0);
        let mut acc = up_as(&d, &a, dtype);
        d.add_assign(&mut acc, &up_as(&d, &b, dtype)).unwrap();
        assert_close("add_assign", &down(&d, &acc), &want, tol, 0.0);
        d.scale(&mut acc, -0.5).unwrap();
        let want2: Vec<f64> = round_to(&down(&d, &out), dtype)
            .iter()
            .map(|&x| -0.5 * x as f64)
            .collect();
        assert_close("scale", &down(&d, &acc), &want2, 0.0, 0.0);
    }
    // Mixed: an f32 gradient accumulating a bf16 one.
    let mut acc = up(&d, &a);
    d.add_assign(&mut acc, &up_as(&d, &b, DType::BF16)).unwrap();
    let want: Vec<f64> = a
        .iter()
        .zip(round_to(&b, DType::BF16))
        .map(|(&x, y)| x as f64 + y as f64)
        .collect();
    assert_close("add_assign mixed", &down(&d, &acc), &want, 1e-7, 0.0);
}

#[test]
fn sum_squares_accumulates_in_slot() {
    let d = dev();
    let mut rng = Rng::new(9);
    let x = rng.vec(100_003);
    let want: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let mut out = up(&d, &[1.0, 2.0, 3.0]);
    d.sum_squares(&up(&d, &x), &mut out, 1).unwrap();
    d.sum_squares(&up(&d, &x[..10]), &mut out, 2).unwrap();
    let small: f64 = x[..10].iter().map(|&v| v as f64 * v as f64).sum();
    assert_close(
        "sum_squares",
        &down(&d, &out),
        &[1.0, 2.0 + want, 3.0 + small],
        1e-7,
        0.0,
    );
    // bf16 input.
    let xb = round_to(&x, DType::BF16);
    let want: f64 = xb.iter().map(|&v| v as f64 * v as f64).sum();
    let mut out = zeros(&d, DType::F32, 1);
    d.sum_squares(&up_as(&d, &x, DType::BF16), &mut out, 0)
        .unwrap();
    assert_close("sum_squares bf16", &down(&d, &out), &[want], 1e-7, 0.0);
}

#[test]
fn copy_fill_upload_download() {
    let d = dev();
    let src = up(&d, &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let mut dst = up(&d, &[0.0; 6]);
    d.copy(&src, 1, &mut dst, 2, 3).unwrap();
    assert_eq!(down(&d, &dst), vec![0.0, 0.0, 2.0, 3.0, 4.0, 0.0]);
    d.upload(&[9.0f32, 8.0], &mut dst, 4).unwrap();
    assert_eq!(
        d.download_range::<f32>(&dst, 3, 3).unwrap(),
        vec![3.0, 9.0, 8.0]
    );
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
    ] {
        let mut b = zeros(&d, dtype, 50_000);
        assert!(down(&d, &b).iter().all(|&v| v == 0.0), "{dtype} zeroed");
        d.fill(&mut b, -1.5).unwrap();
        assert!(down(&d, &b).iter().all(|&v| v == -1.5), "{dtype} fill");
    }
    let mut ti = zeros(&d, DType::I32, 3);
    d.fill(&mut ti, -7.0).unwrap();
    assert_eq!(d.download::<i32>(&ti).unwrap(), vec![-7, -7, -7]);
    assert!(d.fill(&mut ti, 0.5).is_err());
    // Raw bytes of an FP8 buffer go up and down as u8.
    let mut f8 = zeros(&d, DType::F8E4M3, 4);
    d.upload(&[0x38u8, 0x40, 0xb8, 0x7e], &mut f8, 0).unwrap();
    assert_eq!(down(&d, &f8), vec![1.0, 2.0, -1.0, 448.0]);
    assert_eq!(d.download::<u8>(&f8).unwrap(), vec![0x38, 0x40, 0xb8, 0x7e]);
}

#[test]
fn memory_stats_track_allocations() {
    let d = dev();
    let base = d.memory_stats();
    assert_eq!(base.current, 0);
    // The host's available and total memory (Linux), which the memory plan is checked against.
    if cfg!(target_os = "linux") {
        let (avail, total) = base.driver.expect("/proc/meminfo");
        assert!(avail > 0 && avail <= total, "{:?}", base.driver);
    }
    let a = zeros(&d, DType::F32, 1000);
    let b = zeros(&d, DType::BF16, 500);
    assert_eq!(d.memory_stats().current, 5000);
    drop(a);
    let s = d.memory_stats();
    assert_eq!((s.current, s.peak), (1000, 5000));
    d.reset_peak_memory();
    assert_eq!(d.memory_stats().peak, 1000);
    drop(b);
    assert_eq!(d.memory_stats().current, 0);
}

#[test]
fn info_reports_cpu() {
    let d = dev();
    let info = d.info();
    assert_eq!(info.backend, "cpu");
    assert!(info.supports_bf16 && info.supports_fp8);
    assert!(!info.name.is_empty());
    assert!(info.details.iter().any(|(k, v)| k == "threads" && v == "2"));
    if std::path::Path::new("/proc/meminfo").exists() {
        assert!(info.total_memory > 0);
    }
}
