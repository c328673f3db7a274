//! Token and position embeddings.

use super::*;
use crate::reference;
use duet_device::{DType, Device, DeviceError};

#[allow(clippy::too_many_arguments)]
fn run_embedding<E: Device>(
    e: &E,
    act: DType,
    pdt: DType,
    toks: &[i32],
    wte: &[f32],
    wpe: &[f32],
    dout: &[f32],
    (dw0, dp0): (&[f32], &[f32]),
    (b, t, c): (usize, usize, usize),
) -> Vec<Tensor> {
    let bt = put_i32(e, toks);
    let bwte = put(e, pdt, wte);
    let bwpe = put(e, pdt, wpe);
    let mut out = nan(e, act, b * t * c);
    e.embedding_forward(&bt, &bwte, &bwpe, &mut out, b, t, c)
        .expect("embedding_forward");
    let bd = put(e, act, dout);
    let mut dw = put(e, pdt, dw0);
    let mut dp = put(e, pdt, dp0);
    e.embedding_backward(&bt, &bd, &mut dw, &mut dp, b, t, c)
        .expect("embedding_backward");
    e.synchronize().expect("no deferred error");
    vec![
        get(e, "out", &out),
        get(e, "dwte", &dw),
        get(e, "dwpe", &dp),
    ]
}

/// Forward (gather + add) and backward (scatter-add into dwte by token, sum over the batch into
/// dwpe, both accumulating) for every activation dtype with parameters of that dtype or f32;
/// few distinct tokens so many positions share a row; the backward is deterministic.
pub fn embedding_forward_backward<D: Device>(h: &Harness<D>) {
    let case = "embedding_forward_backward";
    let mut r = h.rng(case);
    for act in FLOATS {
        for pdt in [act, DType::F32] {
            for &(b, t, c, vocab, max_t) in &[
                (2usize, 5usize, 3usize, 7usize, 8usize),
                (4, 64, 128, 96, 64),
                (8, 256, 96, 96, 300),
                (3, 33, 40, 1000, 40),
            ] {
                let distinct = 1 + r.below(vocab.min(12));
                let toks: Vec<i32> = (0..b * t)
                    .map(|_| r.below(distinct) as i32 * (vocab / distinct) as i32)
                    .collect();
                let wte = r.vec(vocab * c, -1.0, 1.0);
                let wpe = r.vec(max_t * c, -1.0, 1.0);
                let dout = r.vec(b * t * c, -1.0, 1.0);
                let dw0 = r.vec(vocab * c, -0.1, 0.1);
                let dp0 = r.vec(max_t * c, -0.1, 0.1);
                let got = run_embedding(
                    &h.dev,
                    act,
                    pdt,
                    &toks,
                    &wte,
                    &wpe,
                    &dout,
                    (&dw0, &dp0),
                    (b, t, c),
                );
                h.verify(
                    &format!("{case} {act}/{pdt} b{b} t{t} c{c} v{vocab}"),
                    &got,
                    |cpu| {
                        run_embedding(
                            cpu,
                            act,
                            pdt,
                            &toks,
                            &wte,
                            &wpe,
                            &dout,
                            (&dw0, &dp0),
                            (b, t, c),
                        )
                    },
                    || {
                        let out = reference::embedding(
                            &toks,
                            &rounded64(pdt, &wte),
                            &rounded64(pdt, &wpe),
                            b,
                            t,
                            c,
                        );
                        let d64 = rounded64(act, &dout);
                        let mut dw = rounded64(pdt, &dw0);
                        let mut dp = rounded64(pdt, &dp0);
                        for bi in 0..b {
                            for ti in 0..t {
                                let tok = toks[bi * t + ti] as usize;
                                for j in 0..c {
                                    let g = d64[(bi * t + ti) * c + j];
                                    dw[tok * c + j] += g;
                                    dp[ti * c + j] += g;
                                }
                            }
                        }
                        vec![
                            want("out", act, out),
                            want("dwte", pdt, dw),
                            want("dwpe", pdt, dp),
                        ]
                    },
                    &[Tol::ELEMENTWISE, Tol::REDUCTION, Tol::REDUCTION],
                );
                let again = run_embedding(
                    &h.dev,
                    act,
                    pdt,
                    &toks,
                    &wte,
                    &wpe,
                    &dout,
                    (&dw0, &dp0),
                    (b, t, c),
                );
                assert_eq!(
                    got, again,
                    "{case}: {act}/{pdt} b{b} t{t} c{c} not deterministic"
                );
            }
        }
    }
}

/// A token id outside the vocabulary, or a cross-entropy target outside it, is an
/// `InvalidArgument` naming it — from the call itself (the CPU checks before it runs) or from
/// the next `synchronize` (a GPU checks in the kernel and reports it deferred) — reported
/// once; nothing is silently read out of bounds.
pub fn embedding_bad_token_is_an_error<D: Device>(h: &Harness<D>) {
    let case = "embedding_bad_token_is_an_error";
    let d = h.fresh();
    let expect_error = |call: duet_device::Result<()>, d: &D, what: &str| {
        let err = match call {
            Err(e) => e,
            Ok(()) => match d.synchronize() {
                Err(e) => e,
                Ok(()) => panic!("{case}: {what} was accepted ({})", h.backend()),
            },
        };
        match err {
            DeviceError::InvalidArgument(msg) => assert!(
                msg.contains("token") || msg.contains("target"),
                "{case}: {what}: the message names neither token nor target: {msg}"
            ),
            other => panic!("{case}: {what}: expected InvalidArgument, got {other:?}"),
        }
        d.synchronize().expect("the error is reported once");
    };
    for bad in [9i32, -1] {
        let toks = put_i32(&d, &[0, 1, bad, 2]);
        let wte = d.alloc(DType::F32, 4 * 8).unwrap();
        let wpe = d.alloc(DType::F32, 4 * 8).unwrap();
        let mut o = d.alloc(DType::F32, 4 * 8).unwrap();
        expect_error(
            d.embedding_forward(&toks, &wte, &wpe, &mut o, 1, 4, 8),
            &d,
            &format!("embedding_forward with token {bad} of a vocabulary of 4"),
        );
    }
    let logits = d.alloc(DType::F32, 2 * 5).unwrap();
    let targets = put_i32(&d, &[1, 5]);
    let mut losses = d.alloc(DType::F32, 2).unwrap();
    expect_error(
        d.cross_entropy(&logits, &targets, &mut losses, None, 2, 5, 1.0),
        &d,
        "cross_entropy with target 5 of a vocabulary of 5",
    );
}
