//! Invalid arguments come back as typed errors (never panics) and leave outputs untouched.

mod common;

use common::*;
use duet_cpu::CpuDevice;
use duet_device::{
    AdamWStep, AttentionOps, DType, DeviceError, DeviceExt, ElementwiseOps, EmbeddingOps, GemmDesc,
    GemmOps, LossOps, NormOps, OptimOps, Runtime,
};

#[track_caller]
fn shape<T: std::fmt::Debug>(r: Result<T, DeviceError>) {
    assert!(
        matches!(r, Err(DeviceError::Shape { .. })),
        "expected Shape, got {r:?}"
    );
}

#[track_caller]
fn mismatch<T: std::fmt::Debug>(r: Result<T, DeviceError>) {
    assert!(
        matches!(r, Err(DeviceError::DTypeMismatch { .. })),
        "expected DTypeMismatch, got {r:?}"
    );
}

#[track_caller]
fn unsupported<T: std::fmt::Debug>(r: Result<T, DeviceError>) {
    assert!(
        matches!(r, Err(DeviceError::Unsupported { .. })),
        "expected Unsupported, got {r:?}"
    );
}

#[track_caller]
fn invalid<T: std::fmt::Debug>(r: Result<T, DeviceError>) {
    assert!(
        matches!(r, Err(DeviceError::InvalidArgument(_))),
        "expected InvalidArgument, got {r:?}"
    );
}

#[test]
fn construction() {
    invalid(CpuDevice::new(Some(0)));
    assert_eq!(CpuDevice::new(Some(3)).unwrap().threads(), 3);
    assert!(CpuDevice::default().threads() >= 1);
}

#[test]
fn copies_and_fills() {
    let d = dev();
    let mut f = zeros(&d, DType::F32, 4);
    shape(d.upload_bytes(&[0u8; 6], &mut f, 0)); // not whole f32s
    shape(d.upload_bytes(&[0u8; 8], &mut f, 3)); // past the end
    shape(d.upload(&[1.0f32; 2], &mut f, usize::MAX));
    mismatch(d.upload(&[1i32; 2], &mut f, 0));
    shape(d.download_bytes(&f, 2, 3));
    mismatch(d.download::<i32>(&f));
    let h = zeros(&d, DType::F16, 4);
    mismatch(d.copy(&h, 0, &mut f, 0, 1));
    let g = zeros(&d, DType::F32, 4);
    shape(d.copy(&g, 2, &mut f, 0, 3));
    shape(d.copy(&g, 0, &mut f, 2, 3));
    let mut i = zeros(&d, DType::I32, 2);
    invalid(d.fill(&mut i, 1.5));
    invalid(d.fill(&mut i, 1e12));
    invalid(d.alloc(DType::F32, usize::MAX / 2)); // byte count overflows
    let huge = d.alloc(DType::F32, 1 << 60);
    assert!(
        matches!(huge, Err(DeviceError::OutOfMemory { .. })),
        "{huge:?}"
    );
    // Only the live buffers f, h, g, i count: failed allocations leave no trace.
    assert_eq!(d.memory_stats().current, 16 + 8 + 16 + 8);
}

#[test]
fn gemm_errors() {
    let d = dev();
    let a = zeros(&d, DType::F32, 12);
    let b = zeros(&d, DType::F32, 12);
    let mut c = up(&d, &[5.0; 9]);
    shape(d.gemm(&GemmDesc::new(false, false, 4, 3, 4), &a, &b, &mut c)); // C too small
    shape(d.gemm(&GemmDesc::new(false, false, 3, 3, 5), &a, &b, &mut c)); // A too small
    let mut desc = GemmDesc::new(false, false, 3, 3, 4);
    desc.lda = 2;
    shape(d.gemm(&desc, &a, &b, &mut c));
    let bh = zeros(&d, DType::BF16, 12);
    mismatch(d.gemm(&GemmDesc::new(false, false, 3, 3, 4), &a, &bh, &mut c));
    let ah = zeros(&d, DType::F16, 12);
    let bh16 = zeros(&d, DType::F16, 12);
    let mut cb = zeros(&d, DType::BF16, 9);
    mismatch(d.gemm(&GemmDesc::new(false, false, 3, 3, 4), &ah, &bh16, &mut cb));
    let a8 = zeros(&d, DType::F8E4M3, 12);
    let b8 = zeros(&d, DType::F8E4M3, 12);
    unsupported(d.gemm(&GemmDesc::new(false, false, 3, 3, 4), &a8, &b8, &mut c));
    let ai = zeros(&d, DType::I32, 12);
    let bi = zeros(&d, DType::I32, 12);
    unsupported(d.gemm(&GemmDesc::new(false, false, 3, 3, 4), &ai, &bi, &mut c));
    assert_eq!(down(&d, &c), vec![5.0; 9], "C untouched by failed calls");
}

#[test]
fn elementwise_errors() {
    let d = dev();
    let a = zeros(&d, DType::F32, 4);
    let b5 = zeros(&d, DType::F32, 5);
    let bh = zeros(&d, DType::BF16, 4);
    let mut out = zeros(&d, DType::F32, 4);
    shape(d.add(&a, &b5, &mut out));
    mismatch(d.add(&a, &bh, &mut out));
    shape(d.add_assign(&mut out, &b5));
    let i = zeros(&d, DType::I32, 4);
    unsupported(d.add_assign(&mut out, &i));
    let mut f8 = zeros(&d, DType::F8E5M2, 4);
    unsupported(d.scale(&mut f8, 2.0));
    unsupported(d.gelu_forward(&f8, &mut out));
    shape(d.gelu_forward(&b5, &mut out));
    shape(d.gelu_backward(&a, &b5, &mut out));
    let mut i_out = zeros(&d, DType::I32, 4);
    unsupported(d.cast(&a, &mut i_out, 1.0));
    shape(d.cast(&b5, &mut out, 1.0));
    let mut x = zeros(&d, DType::F32, 12);
    shape(d.bias_add(&mut x, &a, 4, 4));
    shape(d.bias_add(&mut x, &b5, 3, 4));
    let mut db = zeros(&d, DType::F32, 3);
    shape(d.bias_backward(&x, &mut db, 3, 4));
    let mut sq = zeros(&d, DType::F32, 2);
    shape(d.sum_squares(&a, &mut sq, 2));
    let mut sqh = zeros(&d, DType::BF16, 2);
    mismatch(d.sum_squares(&a, &mut sqh, 0));
}

#[test]
fn model_kernel_errors() {
    let d = dev();
    let (b, t, c, vocab) = (2, 3, 4, 5);
    let tokens = up_i32(&d, &[0, 1, 2, 3, 4, 0]);
    let bad_tokens = up_i32(&d, &[0, 1, 2, 3, 5, 0]);
    let neg_tokens = up_i32(&d, &[0, 1, -1, 3, 4, 0]);
    let tok_f32 = zeros(&d, DType::F32, 6);
    let wte = zeros(&d, DType::F32, vocab * c);
    let wpe = zeros(&d, DType::F32, t * c);
    let mut out = up(&d, &[3.0; 24]);
    invalid(d.embedding_forward(&bad_tokens, &wte, &wpe, &mut out, b, t, c));
    invalid(d.embedding_forward(&neg_tokens, &wte, &wpe, &mut out, b, t, c));
    mismatch(d.embedding_forward(&tok_f32, &wte, &wpe, &mut out, b, t, c));
    shape(d.embedding_forward(&tokens, &wte, &wpe, &mut out, b, t + 1, c));
    let short_wpe = zeros(&d, DType::F32, (t - 1) * c);
    shape(d.embedding_forward(&tokens, &wte, &short_wpe, &mut out, b, t, c));
    assert_eq!(
        down(&d, &out),
        vec![3.0; 24],
        "out untouched by failed calls"
    );
    let mut dwte = zeros(&d, DType::F32, vocab * c);
    let mut dwpe = zeros(&d, DType::F32, t * c);
    invalid(d.embedding_backward(&bad_tokens, &out, &mut dwte, &mut dwpe, b, t, c));
    let mut dwte8 = zeros(&d, DType::F8E4M3, vocab * c);
    unsupported(d.embedding_backward(&tokens, &out, &mut dwte8, &mut dwpe, b, t, c));

    let (n, c) = (3, 4);
    let x = zeros(&d, DType::F32, n * c);
    let g = zeros(&d, DType::F32, c);
    let mut o = zeros(&d, DType::F32, n * c);
    let mut mean = zeros(&d, DType::F32, n);
    let mut rstd = zeros(&d, DType::F32, n);
    let mut mean16 = zeros(&d, DType::BF16, n);
    mismatch(d.layernorm_forward(&x, &g, &g, &mut o, &mut mean16, &mut rstd, n, c, 1e-5));
    shape(d.layernorm_forward(&x, &g, &g, &mut o, &mut mean, &mut rstd, n + 1, c, 1e-5));
    let x8 = zeros(&d, DType::F8E4M3, n * c);
    unsupported(d.layernorm_forward(&x8, &g, &g, &mut o, &mut mean, &mut rstd, n, c, 1e-5));
    let mut dg = zeros(&d, DType::F32, c);
    let mut dbeta = zeros(&d, DType::F32, c + 1);
    let mut dx = zeros(&d, DType::F32, n * c);
    shape(d.layernorm_backward(&x, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut dbeta, n, c));
    let mut dbeta_ok = dg.clone_empty(&d);
    mismatch(d.layernorm_backward(
        &x,
        &x,
        &g,
        &mean16,
        &rstd,
        &mut dx,
        &mut dg,
        &mut dbeta_ok,
        n,
        c,
    ));

    let (b, t, nh, hs) = (1, 2, 2, 3);
    let qkv = zeros(&d, DType::F32, 3 * b * t * nh * hs);
    let mut q = zeros(&d, DType::F32, b * t * nh * hs);
    let mut k = zeros(&d, DType::F32, b * t * nh * hs);
    let mut v16 = zeros(&d, DType::BF16, b * t * nh * hs);
    let mut v_short = zeros(&d, DType::F32, b * t * nh * hs - 1);
    mismatch(d.split_heads(&qkv, &mut q, &mut k, &mut v16, b, t, nh, hs));
    shape(d.split_heads(&qkv, &mut q, &mut k, &mut v_short, b, t, nh, hs));
    let mut dqkv = zeros(&d, DType::F32, 3 * b * t * nh * hs + 1);
    shape(d.split_heads_backward(&q, &k, &q, &mut dqkv, b, t, nh, hs));
    shape(d.merge_heads(&q, &mut v_short, b, t, nh, hs, false));
    mismatch(d.merge_heads(&q, &mut v16, b, t, nh, hs, true));
    shape(d.split_heads(&qkv, &mut q, &mut k, &mut v_short, usize::MAX, 2, 2, 2));

    let (rows, t) = (2, 3);
    let s = zeros(&d, DType::F32, rows * t * t);
    let mut p = zeros(&d, DType::F32, rows * t * t - 1);
    shape(d.softmax_causal_forward(&s, &mut p, rows, t, 1.0));
    let mut p8 = zeros(&d, DType::F8E4M3, rows * t * t);
    unsupported(d.softmax_causal_forward(&s, &mut p8, rows, t, 1.0));
    shape(d.softmax_causal_backward(&s, &p, &mut s.clone_empty(&d), rows, t, 1.0));
}

#[test]
fn loss_and_optimizer_errors() {
    let d = dev();
    let (n, v) = (3, 5);
    let logits = zeros(&d, DType::F32, n * v);
    let mut losses = zeros(&d, DType::F32, n);
    invalid(d.cross_entropy(
        &logits,
        &up_i32(&d, &[0, 5, 1]),
        &mut losses,
        None,
        n,
        v,
        1.0,
    ));
    mismatch(d.cross_entropy(&logits, &logits, &mut losses, None, n, v, 1.0));
    let mut losses16 = zeros(&d, DType::BF16, n);
    let targets = up_i32(&d, &[0, 4, -1]);
    mismatch(d.cross_entropy(&logits, &targets, &mut losses16, None, n, v, 1.0));
    let mut dl = zeros(&d, DType::F32, n * v + 1);
    shape(d.cross_entropy(&logits, &targets, &mut losses, Some(&mut dl), n, v, 1.0));
    shape(d.cross_entropy(&logits, &targets, &mut losses, None, n, v + 1, 1.0));

    let step = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        bias_correction1: 0.1,
        bias_correction2: 0.05,
        grad_scale: 1.0,
    };
    let mut p = up(&d, &[1.0; 4]);
    let mut m = zeros(&d, DType::F32, 4);
    let mut vv = zeros(&d, DType::F32, 4);
    let g = zeros(&d, DType::F32, 4);
    let mut p16 = zeros(&d, DType::BF16, 4);
    mismatch(d.adamw(&mut p16, &g, &mut m, &mut vv, &step, None));
    let mut m16 = zeros(&d, DType::BF16, 4);
    mismatch(d.adamw(&mut p, &g, &mut m16, &mut vv, &step, None));
    shape(d.adamw(
        &mut p,
        &zeros(&d, DType::F32, 3),
        &mut m,
        &mut vv,
        &step,
        None,
    ));
    unsupported(d.adamw(
        &mut p,
        &zeros(&d, DType::F8E4M3, 4),
        &mut m,
        &mut vv,
        &step,
        None,
    ));
    let mut copy_short = zeros(&d, DType::BF16, 3);
    shape(d.adamw(&mut p, &g, &mut m, &mut vv, &step, Some(&mut copy_short)));
    let mut copy_i32 = zeros(&d, DType::I32, 4);
    unsupported(d.adamw(&mut p, &g, &mut m, &mut vv, &step, Some(&mut copy_i32)));
    assert_eq!(
        down(&d, &p),
        vec![1.0; 4],
        "param untouched by failed calls"
    );
}

/// A zeroed buffer shaped like `self` (test shorthand).
trait CloneEmpty {
    fn clone_empty(&self, d: &CpuDevice) -> duet_cpu::CpuBuffer;
}

impl CloneEmpty for duet_cpu::CpuBuffer {
    fn clone_empty(&self, d: &CpuDevice) -> duet_cpu::CpuBuffer {
        use duet_device::Buffer;
        d.alloc(self.dtype(), self.len()).unwrap()
    }
}
