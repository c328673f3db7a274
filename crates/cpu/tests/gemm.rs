//! GEMM against a naive f64 GEMM: transposes, odd shapes, batches with strides and offsets,
//! alpha/beta, mixed input dtypes, and thread-count independence.

mod common;

use common::*;
use duet_cpu::CpuDevice;
use duet_device::{DType, Device, GemmDesc};

/// Runs `desc` on random data (A/B in `in_dtype`, C in `c_dtype`) and compares with the
/// naive reference computed from the same (rounded) inputs.
fn check(desc: GemmDesc, in_dtype: DType, c_dtype: DType, seed: u64) {
    let d = dev();
    let mut rng = Rng::new(seed);
    let (ar, ac) = desc.a_stored();
    let (br, bc) = desc.b_stored();
    let a_len = desc.a_offset + (desc.batch - 1) * desc.stride_a + (ar - 1) * desc.lda + ac + 3;
    let b_len = desc.b_offset + (desc.batch - 1) * desc.stride_b + (br - 1) * desc.ldb + bc + 2;
    let c_len =
        desc.c_offset + (desc.batch - 1) * desc.stride_c + (desc.m - 1) * desc.ldc + desc.n + 5;
    let a = round_to(&rng.vec(a_len), in_dtype);
    let b = round_to(&rng.vec(b_len), in_dtype);
    let c0 = round_to(&rng.vec(c_len), c_dtype);
    let ab = up_as(&d, &a, in_dtype);
    let bb = up_as(&d, &b, in_dtype);
    let mut cb = up_as(&d, &c0, c_dtype);
    d.gemm(&desc, &ab, &bb, &mut cb).unwrap();
    let got = down(&d, &cb);

    let (a64, b64) = (to64(&a), to64(&b));
    let mut want = to64(&c0);
    for i in 0..desc.batch {
        let ao = desc.a_offset + i * desc.stride_a;
        let bo = desc.b_offset + i * desc.stride_b;
        let co = desc.c_offset + i * desc.stride_c;
        naive_gemm(
            desc.trans_a,
            desc.trans_b,
            desc.m,
            desc.n,
            desc.k,
            &a64[ao..],
            desc.lda,
            &b64[bo..],
            desc.ldb,
            desc.alpha as f64,
            desc.beta as f64,
            &mut want[co..],
            desc.ldc,
        );
    }
    // f32 accumulation over k ≤ 64 terms of size ≤ 1: a few ulps of the row sums. A bf16/f16
    // C is rounded once more on store.
    let (rtol, atol) = match c_dtype {
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        _ => (8e-3, 8e-3),
    };
    assert_close(
        &format!("{desc:?} {in_dtype}->{c_dtype}"),
        &got,
        &want,
        rtol,
        atol,
    );
}

#[test]
fn all_transposes_odd_shape() {
    for (i, (ta, tb)) in [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        check(
            GemmDesc::new(ta, tb, 7, 13, 5),
            DType::F32,
            DType::F32,
            i as u64,
        );
        check(
            GemmDesc::new(ta, tb, 1, 1, 1),
            DType::F32,
            DType::F32,
            10 + i as u64,
        );
        check(
            GemmDesc::new(ta, tb, 33, 17, 64),
            DType::F32,
            DType::F32,
            20 + i as u64,
        );
    }
}

#[test]
fn large_parallel_matrix() {
    // Big enough to take the multithreaded path of the gemm crate.
    for (ta, tb) in [(false, true), (true, false), (false, false)] {
        check(
            GemmDesc::new(ta, tb, 130, 96, 70),
            DType::F32,
            DType::F32,
            7,
        );
    }
}

#[test]
fn alpha_beta() {
    for (alpha, beta) in [
        (1.0, 0.0),
        (0.5, 1.0),
        (-2.0, 0.25),
        (0.0, 3.0),
        (1.5, -1.0),
    ] {
        let desc = GemmDesc::new(false, true, 9, 11, 6).alpha(alpha).beta(beta);
        check(desc, DType::F32, DType::F32, 3);
    }
}

#[test]
fn leading_dimensions_strides_offsets() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let mut desc = GemmDesc::batched(ta, tb, 5, 6, 4, 3).alpha(0.75).beta(0.5);
        desc.lda += 3;
        desc.ldb += 2;
        desc.ldc += 4;
        let (ar, _) = desc.a_stored();
        let (br, _) = desc.b_stored();
        desc.stride_a = ar * desc.lda + 7;
        desc.stride_b = br * desc.ldb + 1;
        desc.stride_c = desc.m * desc.ldc + 2;
        desc.a_offset = 5;
        desc.b_offset = 3;
        desc.c_offset = 11;
        check(desc, DType::F32, DType::F32, 41);
    }
}

#[test]
fn batched_attention_shapes() {
    // scores = q·kᵀ and y = P·v over B·NH = 6 heads, both with the batch-parallel path.
    check(
        GemmDesc::batched(false, true, 16, 16, 8, 6),
        DType::F32,
        DType::F32,
        5,
    );
    check(
        GemmDesc::batched(false, false, 16, 8, 16, 6),
        DType::F32,
        DType::F32,
        6,
    );
    // Backward shapes: dq = dS·k, dk = dSᵀ·q.
    check(
        GemmDesc::batched(true, false, 16, 8, 16, 6),
        DType::F32,
        DType::F32,
        8,
    );
}

#[test]
fn overlapping_output_batches_accumulate_in_order() {
    // stride_c = 0: every batch entry accumulates into the same C (beta 1).
    let mut desc = GemmDesc::batched(false, false, 3, 4, 2, 4).beta(1.0);
    desc.stride_c = 0;
    check(desc, DType::F32, DType::F32, 9);
}

#[test]
fn half_precision_inputs() {
    for in_dtype in [DType::F16, DType::BF16] {
        for (ta, tb) in [(false, true), (true, false)] {
            check(GemmDesc::new(ta, tb, 7, 13, 5), in_dtype, DType::F32, 12);
            check(
                GemmDesc::new(ta, tb, 7, 13, 5).beta(1.0),
                in_dtype,
                in_dtype,
                13,
            );
            check(
                GemmDesc::batched(ta, tb, 8, 8, 8, 4),
                in_dtype,
                in_dtype,
                14,
            );
        }
    }
}

#[test]
fn beta_zero_overwrites_nan() {
    let d = dev();
    let desc = GemmDesc::new(false, false, 2, 2, 2);
    for dtype in [DType::F32, DType::BF16] {
        let mut c = up_as(
            &d,
            &[f32::NAN, f32::INFINITY, f32::NAN, -f32::INFINITY],
            dtype,
        );
        let a = up_as(&d, &[1.0, 2.0, 3.0, 4.0], dtype);
        let b = up_as(&d, &[1.0, 0.0, 0.0, 1.0], dtype);
        d.gemm(&desc, &a, &b, &mut c).unwrap();
        assert_eq!(down(&d, &c), vec![1.0, 2.0, 3.0, 4.0], "{dtype}");
    }
    // k = 0 with beta 0 also overwrites; with beta 2 it scales C.
    let e = up(&d, &[]);
    let mut c = up(&d, &[f32::NAN, 1.0, 2.0, 3.0]);
    d.gemm(&GemmDesc::new(false, false, 2, 2, 0), &e, &e, &mut c)
        .unwrap();
    assert_eq!(down(&d, &c), vec![0.0; 4]);
    let mut c = up(&d, &[5.0, 1.0, 2.0, 3.0]);
    d.gemm(
        &GemmDesc::new(false, false, 2, 2, 0).beta(2.0),
        &e,
        &e,
        &mut c,
    )
    .unwrap();
    assert_eq!(down(&d, &c), vec![10.0, 2.0, 4.0, 6.0]);
}

#[test]
fn untouched_elements_stay() {
    // Elements between rows (ldc > n) and outside the batch ranges are not written.
    let d = dev();
    let mut desc = GemmDesc::new(false, false, 2, 2, 3);
    desc.ldc = 5;
    desc.c_offset = 1;
    for dtype in [DType::F32, DType::BF16] {
        let mut c = up_as(&d, &[-7.0; 12], dtype);
        let a = up_as(&d, &[1.0; 6], dtype);
        let b = up_as(&d, &[1.0; 6], dtype);
        d.gemm(&desc, &a, &b, &mut c).unwrap();
        let mut want = vec![-7.0; 12];
        for i in [1, 2, 6, 7] {
            want[i] = 3.0;
        }
        assert_eq!(down(&d, &c), want, "{dtype}");
    }
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
    d.gemm(&desc, &a, &b, &mut c).unwrap();
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
