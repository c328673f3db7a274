//! Invalid arguments come back as typed errors (never panics) and leave outputs untouched.

mod common;

use common::*;
use duet_cpu::CpuDevice;
use duet_device::{
    AdamWStep, AdamWUpdate, Add, AddAssign, BiasAdd, BiasBackward, CrossEntropy, DType,
    DeviceError, DeviceExt, EmbeddingBackward, EmbeddingForward, GeluBackward, GeluForward, Gemm,
    GemmDesc, LayerNormBackward, LayerNormForward, MergeHeads, Runtime, Scale,
    SoftmaxCausalBackward, SoftmaxCausalForward, SplitHeads, SplitHeadsBackward, SumSquares,
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
    shape(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 4, 3, 4),
        a: &a,
        b: &b,
        c: &mut c,
    })); // C too small
    shape(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 3, 3, 5),
        a: &a,
        b: &b,
        c: &mut c,
    })); // A too small
    let mut desc = GemmDesc::new(false, false, 3, 3, 4);
    desc.lda = 2;
    shape(d.exec(Gemm {
        desc: &desc,
        a: &a,
        b: &b,
        c: &mut c,
    }));
    let bh = zeros(&d, DType::BF16, 12);
    mismatch(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 3, 3, 4),
        a: &a,
        b: &bh,
        c: &mut c,
    }));
    let ah = zeros(&d, DType::F16, 12);
    let bh16 = zeros(&d, DType::F16, 12);
    let mut cb = zeros(&d, DType::BF16, 9);
    mismatch(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 3, 3, 4),
        a: &ah,
        b: &bh16,
        c: &mut cb,
    }));
    let a8 = zeros(&d, DType::F8E4M3, 12);
    let b8 = zeros(&d, DType::F8E4M3, 12);
    unsupported(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 3, 3, 4),
        a: &a8,
        b: &b8,
        c: &mut c,
    }));
    let ai = zeros(&d, DType::I32, 12);
    let bi = zeros(&d, DType::I32, 12);
    unsupported(d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 3, 3, 4),
        a: &ai,
        b: &bi,
        c: &mut c,
    }));
    assert_eq!(down(&d, &c), vec![5.0; 9], "C untouched by failed calls");
}

#[test]
fn elementwise_errors() {
    let d = dev();
    let a = zeros(&d, DType::F32, 4);
    let b5 = zeros(&d, DType::F32, 5);
    let bh = zeros(&d, DType::BF16, 4);
    let mut out = zeros(&d, DType::F32, 4);
    shape(d.exec(Add {
        a: &a,
        b: &b5,
        out: &mut out,
    }));
    mismatch(d.exec(Add {
        a: &a,
        b: &bh,
        out: &mut out,
    }));
    shape(d.exec(AddAssign {
        dst: &mut out,
        src: &b5,
    }));
    let i = zeros(&d, DType::I32, 4);
    unsupported(d.exec(AddAssign {
        dst: &mut out,
        src: &i,
    }));
    let mut f8 = zeros(&d, DType::F8E5M2, 4);
    unsupported(d.exec(Scale {
        x: &mut f8,
        alpha: 2.0,
    }));
    unsupported(d.exec(GeluForward {
        x: &f8,
        out: &mut out,
    }));
    shape(d.exec(GeluForward {
        x: &b5,
        out: &mut out,
    }));
    shape(d.exec(GeluBackward {
        x: &a,
        dout: &b5,
        dx: &mut out,
    }));
    let mut i_out = zeros(&d, DType::I32, 4);
    unsupported(d.cast(&a, &mut i_out, 1.0));
    shape(d.cast(&b5, &mut out, 1.0));
    let mut x = zeros(&d, DType::F32, 12);
    shape(d.exec(BiasAdd {
        x: &mut x,
        bias: &a,
        rows: 4,
        c: 4,
    }));
    shape(d.exec(BiasAdd {
        x: &mut x,
        bias: &b5,
        rows: 3,
        c: 4,
    }));
    let mut db = zeros(&d, DType::F32, 3);
    shape(d.exec(BiasBackward {
        dout: &x,
        dbias: &mut db,
        rows: 3,
        c: 4,
    }));
    let mut sq = zeros(&d, DType::F32, 2);
    shape(d.exec(SumSquares {
        x: &a,
        out: &mut sq,
        slot: 2,
    }));
    let mut sqh = zeros(&d, DType::BF16, 2);
    mismatch(d.exec(SumSquares {
        x: &a,
        out: &mut sqh,
        slot: 0,
    }));
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
    invalid(d.exec(EmbeddingForward {
        tokens: &bad_tokens,
        wte: &wte,
        wpe: &wpe,
        out: &mut out,
        b,
        t,
        c,
    }));
    invalid(d.exec(EmbeddingForward {
        tokens: &neg_tokens,
        wte: &wte,
        wpe: &wpe,
        out: &mut out,
        b,
        t,
        c,
    }));
    mismatch(d.exec(EmbeddingForward {
        tokens: &tok_f32,
        wte: &wte,
        wpe: &wpe,
        out: &mut out,
        b,
        t,
        c,
    }));
    shape(d.exec(EmbeddingForward {
        tokens: &tokens,
        wte: &wte,
        wpe: &wpe,
        out: &mut out,
        b,
        t: t + 1,
        c,
    }));
    let short_wpe = zeros(&d, DType::F32, (t - 1) * c);
    shape(d.exec(EmbeddingForward {
        tokens: &tokens,
        wte: &wte,
        wpe: &short_wpe,
        out: &mut out,
        b,
        t,
        c,
    }));
    assert_eq!(
        down(&d, &out),
        vec![3.0; 24],
        "out untouched by failed calls"
    );
    let mut dwte = zeros(&d, DType::F32, vocab * c);
    let mut dwpe = zeros(&d, DType::F32, t * c);
    invalid(d.exec(EmbeddingBackward {
        tokens: &bad_tokens,
        dout: &out,
        dwte: &mut dwte,
        dwpe: &mut dwpe,
        b,
        t,
        c,
    }));
    let mut dwte8 = zeros(&d, DType::F8E4M3, vocab * c);
    unsupported(d.exec(EmbeddingBackward {
        tokens: &tokens,
        dout: &out,
        dwte: &mut dwte8,
        dwpe: &mut dwpe,
        b,
        t,
        c,
    }));

    let (n, c) = (3, 4);
    let x = zeros(&d, DType::F32, n * c);
    let g = zeros(&d, DType::F32, c);
    let mut o = zeros(&d, DType::F32, n * c);
    let mut mean = zeros(&d, DType::F32, n);
    let mut rstd = zeros(&d, DType::F32, n);
    let mut mean16 = zeros(&d, DType::BF16, n);
    mismatch(d.exec(LayerNormForward {
        x: &x,
        gamma: &g,
        beta: &g,
        out: &mut o,
        mean: &mut mean16,
        rstd: &mut rstd,
        n,
        c,
        eps: 1e-5,
    }));
    shape(d.exec(LayerNormForward {
        x: &x,
        gamma: &g,
        beta: &g,
        out: &mut o,
        mean: &mut mean,
        rstd: &mut rstd,
        n: n + 1,
        c,
        eps: 1e-5,
    }));
    let x8 = zeros(&d, DType::F8E4M3, n * c);
    unsupported(d.exec(LayerNormForward {
        x: &x8,
        gamma: &g,
        beta: &g,
        out: &mut o,
        mean: &mut mean,
        rstd: &mut rstd,
        n,
        c,
        eps: 1e-5,
    }));
    let mut dg = zeros(&d, DType::F32, c);
    let mut dbeta = zeros(&d, DType::F32, c + 1);
    let mut dx = zeros(&d, DType::F32, n * c);
    shape(d.exec(LayerNormBackward {
        dout: &x,
        x: &x,
        gamma: &g,
        mean: &mean,
        rstd: &rstd,
        dx: &mut dx,
        dgamma: &mut dg,
        dbeta: &mut dbeta,
        n,
        c,
    }));
    let mut dbeta_ok = dg.clone_empty(&d);
    mismatch(d.exec(LayerNormBackward {
        dout: &x,
        x: &x,
        gamma: &g,
        mean: &mean16,
        rstd: &rstd,
        dx: &mut dx,
        dgamma: &mut dg,
        dbeta: &mut dbeta_ok,
        n,
        c,
    }));

    let (b, t, nh, hs) = (1, 2, 2, 3);
    let qkv = zeros(&d, DType::F32, 3 * b * t * nh * hs);
    let mut q = zeros(&d, DType::F32, b * t * nh * hs);
    let mut k = zeros(&d, DType::F32, b * t * nh * hs);
    let mut v16 = zeros(&d, DType::BF16, b * t * nh * hs);
    let mut v_short = zeros(&d, DType::F32, b * t * nh * hs - 1);
    mismatch(d.exec(SplitHeads {
        qkv: &qkv,
        q: &mut q,
        k: &mut k,
        v: &mut v16,
        b,
        t,
        nh,
        hs,
    }));
    shape(d.exec(SplitHeads {
        qkv: &qkv,
        q: &mut q,
        k: &mut k,
        v: &mut v_short,
        b,
        t,
        nh,
        hs,
    }));
    let mut dqkv = zeros(&d, DType::F32, 3 * b * t * nh * hs + 1);
    shape(d.exec(SplitHeadsBackward {
        dq: &q,
        dk: &k,
        dv: &q,
        dqkv: &mut dqkv,
        b,
        t,
        nh,
        hs,
    }));
    shape(d.exec(MergeHeads {
        y: &q,
        out: &mut v_short,
        b,
        t,
        nh,
        hs,
        backward: false,
    }));
    mismatch(d.exec(MergeHeads {
        y: &q,
        out: &mut v16,
        b,
        t,
        nh,
        hs,
        backward: true,
    }));
    shape(d.exec(SplitHeads {
        qkv: &qkv,
        q: &mut q,
        k: &mut k,
        v: &mut v_short,
        b: usize::MAX,
        t: 2,
        nh: 2,
        hs: 2,
    }));

    let (rows, t) = (2, 3);
    let s = zeros(&d, DType::F32, rows * t * t);
    let mut p = zeros(&d, DType::F32, rows * t * t - 1);
    shape(d.exec(SoftmaxCausalForward {
        scores: &s,
        probs: &mut p,
        batch: rows,
        t,
        scale: 1.0,
    }));
    let mut p8 = zeros(&d, DType::F8E4M3, rows * t * t);
    unsupported(d.exec(SoftmaxCausalForward {
        scores: &s,
        probs: &mut p8,
        batch: rows,
        t,
        scale: 1.0,
    }));
    shape(d.exec(SoftmaxCausalBackward {
        probs: &s,
        dprobs: &p,
        dscores: &mut s.clone_empty(&d),
        batch: rows,
        t,
        scale: 1.0,
    }));
}

#[test]
fn loss_and_optimizer_errors() {
    let d = dev();
    let (n, v) = (3, 5);
    let logits = zeros(&d, DType::F32, n * v);
    let mut losses = zeros(&d, DType::F32, n);
    invalid(d.exec(CrossEntropy {
        logits: &logits,
        targets: &up_i32(&d, &[0, 5, 1]),
        losses: &mut losses,
        dlogits: None,
        n,
        v,
        grad_scale: 1.0,
    }));
    mismatch(d.exec(CrossEntropy {
        logits: &logits,
        targets: &logits,
        losses: &mut losses,
        dlogits: None,
        n,
        v,
        grad_scale: 1.0,
    }));
    let mut losses16 = zeros(&d, DType::BF16, n);
    let targets = up_i32(&d, &[0, 4, -1]);
    mismatch(d.exec(CrossEntropy {
        logits: &logits,
        targets: &targets,
        losses: &mut losses16,
        dlogits: None,
        n,
        v,
        grad_scale: 1.0,
    }));
    let mut dl = zeros(&d, DType::F32, n * v + 1);
    shape(d.exec(CrossEntropy {
        logits: &logits,
        targets: &targets,
        losses: &mut losses,
        dlogits: Some(&mut dl),
        n,
        v,
        grad_scale: 1.0,
    }));
    shape(d.exec(CrossEntropy {
        logits: &logits,
        targets: &targets,
        losses: &mut losses,
        dlogits: None,
        n,
        v: v + 1,
        grad_scale: 1.0,
    }));

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
    mismatch(d.exec(AdamWUpdate {
        param: &mut p16,
        grad: &g,
        m: &mut m,
        v: &mut vv,
        step: &step,
        param_copy: None,
    }));
    let mut m16 = zeros(&d, DType::BF16, 4);
    mismatch(d.exec(AdamWUpdate {
        param: &mut p,
        grad: &g,
        m: &mut m16,
        v: &mut vv,
        step: &step,
        param_copy: None,
    }));
    shape(d.exec(AdamWUpdate {
        param: &mut p,
        grad: &zeros(&d, DType::F32, 3),
        m: &mut m,
        v: &mut vv,
        step: &step,
        param_copy: None,
    }));
    unsupported(d.exec(AdamWUpdate {
        param: &mut p,
        grad: &zeros(&d, DType::F8E4M3, 4),
        m: &mut m,
        v: &mut vv,
        step: &step,
        param_copy: None,
    }));
    let mut copy_short = zeros(&d, DType::BF16, 3);
    shape(d.exec(AdamWUpdate {
        param: &mut p,
        grad: &g,
        m: &mut m,
        v: &mut vv,
        step: &step,
        param_copy: Some(&mut copy_short),
    }));
    let mut copy_i32 = zeros(&d, DType::I32, 4);
    unsupported(d.exec(AdamWUpdate {
        param: &mut p,
        grad: &g,
        m: &mut m,
        v: &mut vv,
        step: &step,
        param_copy: Some(&mut copy_i32),
    }));
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
