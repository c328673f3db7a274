//! What the CPU's GEMM does beyond the trait's contract, which the conformance suite checks
//! (transposes, dtypes, strides, offsets, alpha/beta): batches that accumulate into one C in
//! order (`stride_c = 0`), k = 0, and the same bits for any thread count.

mod common;

use common::*;
use duet_cpu::CpuDevice;
use duet_device::{Gemm, GemmDesc, Runtime};

/// Runs the f32 `desc` on random data and compares with the f64 reference GEMM (batches in
/// order) from the same inputs.
fn check(desc: GemmDesc, seed: u64) {
    let d = dev();
    let mut rng = Rng::new(seed);
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    let a_len = desc.a_offset + (desc.batch - 1) * desc.stride_a + (ar - 1) * desc.lda + ac + 3;
    let b_len = desc.b_offset + (desc.batch - 1) * desc.stride_b + (br - 1) * desc.ldb + bc + 2;
    let c_len =
        desc.c_offset + (desc.batch - 1) * desc.stride_c + (desc.m - 1) * desc.ldc + desc.n + 5;
    let (a, b, c0) = (rng.vec(a_len), rng.vec(b_len), rng.vec(c_len));
    let mut cb = up(&d, &c0);
    d.exec(Gemm {
        desc: &desc,
        a: &up(&d, &a),
        b: &up(&d, &b),
        c: &mut cb,
    })
    .unwrap();
    let mut want = to64(&c0);
    reference::gemm(&desc, &to64(&a), &to64(&b), &mut want);
    // f32 accumulation over few terms of size ≤ 1: a few ulps of the row sums.
    assert_close(&format!("{desc:?}"), &down(&d, &cb), &want, 1e-5, 1e-5);
}

#[test]
fn overlapping_output_batches_accumulate_in_order() {
    // stride_c = 0: every batch entry accumulates into the same C (beta 1).
    let mut desc = GemmDesc::batched(false, false, 3, 4, 2, 4).beta(1.0);
    desc.stride_c = 0;
    check(desc, 9);
}

#[test]
fn k_zero_overwrites_or_scales_c() {
    // k = 0 with beta 0 overwrites C (NaN included) with zeros; with beta 2 it scales C.
    let d = dev();
    let e = up(&d, &[]);
    let mut c = up(&d, &[f32::NAN, 1.0, 2.0, 3.0]);
    d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 2, 2, 0),
        a: &e,
        b: &e,
        c: &mut c,
    })
    .unwrap();
    assert_eq!(down(&d, &c), vec![0.0; 4]);
    let mut c = up(&d, &[5.0, 1.0, 2.0, 3.0]);
    d.exec(Gemm {
        desc: &GemmDesc::new(false, false, 2, 2, 0).beta(2.0),
        a: &e,
        b: &e,
        c: &mut c,
    })
    .unwrap();
    assert_eq!(down(&d, &c), vec![10.0, 2.0, 4.0, 6.0]);
}

/// GEMM bytes with `threads` threads for the model's shapes.
fn gemm_bytes(threads: usize, desc: GemmDesc, seed: u64) -> Vec<u8> {
    let d = CpuDevice::new(Some(threads)).unwrap();
    let mut rng = Rng::new(seed);
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    let a = up(&d, &rng.vec(desc.batch * ar * ac));
    let b = up(&d, &rng.vec(desc.batch * br * bc));
    let mut c = up(&d, &rng.vec(desc.batch * desc.m * desc.n));
    d.exec(Gemm {
        desc: &desc,
        a: &a,
        b: &b,
        c: &mut c,
    })
    .unwrap();
    d.download_bytes(&c, 0, c_len(&desc)).unwrap()
}

fn c_len(desc: &GemmDesc) -> usize {
    desc.batch * desc.m * desc.n
}

#[test]
fn gemm_thread_count_independent() {
    // Linear layers (x·Wᵀ, dY·W, dYᵀ·X) and attention batches of a small GPT.
    let shapes = [
        GemmDesc::new(false, true, 256, 384, 128),
        GemmDesc::new(false, false, 256, 128, 384),
        GemmDesc::new(true, false, 384, 128, 256).beta(1.0),
        GemmDesc::new(false, true, 512, 512, 512),
        GemmDesc::batched(false, true, 64, 64, 32, 8),
        GemmDesc::batched(false, false, 64, 32, 64, 3),
    ];
    for (i, desc) in shapes.into_iter().enumerate() {
        let one = gemm_bytes(1, desc, i as u64);
        for threads in [2, 3, 4] {
            assert!(
                one == gemm_bytes(threads, desc, i as u64),
                "{desc:?}: {threads} threads differ from 1"
            );
        }
    }
}
