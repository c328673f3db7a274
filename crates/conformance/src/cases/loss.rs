//! Softmax + cross-entropy.

use super::*;
use crate::reference;
use duet_device::{CrossEntropy, CrossEntropyInPlace, CrossEntropyPadded, DType, Device};

#[allow(clippy::too_many_arguments)]
fn run_ce<E: Device>(
    e: &E,
    dt: DType,
    logits: &[f32],
    targets: &[i32],
    n: usize,
    v: usize,
    gs: f32,
    with_grad: bool,
) -> Vec<Tensor> {
    let l = put(e, dt, logits);
    let t = put_i32(e, targets);
    let mut losses = nan(e, DType::F32, n);
    if with_grad {
        let mut d = nan(e, dt, n * v);
        e.exec(CrossEntropy {
            logits: &l,
            targets: &t,
            losses: &mut losses,
            dlogits: Some(&mut d),
            n,
            v,
            grad_scale: gs,
        })
        .expect("cross_entropy");
        vec![get(e, "losses", &losses), get(e, "dlogits", &d)]
    } else {
        e.exec(CrossEntropy {
            logits: &l,
            targets: &t,
            losses: &mut losses,
            dlogits: None,
            n,
            v,
            grad_scale: gs,
        })
        .expect("cross_entropy");
        vec![get(e, "losses", &losses)]
    }
}

/// Per-row losses, with and without the gradient `(softmax − onehot)·grad_scale`; ignored
/// (negative: −1, −100) targets give loss 0 and a zero gradient row; GPT-2's vocabulary among the
/// shapes, and a 150,000-token one whose rows (600 KB in f32, 300 KB in 16 bits) are too long for
/// a GPU's shared memory (CUDA then reads the row once per pass instead of caching it).
pub fn cross_entropy_losses_and_gradients<D: Device>(h: &Harness<D>) {
    let case = "cross_entropy_losses_and_gradients";
    let mut r = h.rng(case);
    for dt in FLOATS {
        for &(n, v) in &[
            (1usize, 1usize),
            (7, 96),
            (512, 96),
            (33, 1000),
            (4, 50257),
            (2, 150_000),
        ] {
            let logits = r.vec(n * v, -6.0, 6.0);
            let targets: Vec<i32> = (0..n)
                .map(|i| match i % 10 {
                    3 => -1,
                    8 => -100,
                    _ => r.below(v) as i32,
                })
                .collect();
            for with_grad in [false, true] {
                let gs = r.uniform(0.1, 2.0);
                let got = run_ce(&h.dev, dt, &logits, &targets, n, v, gs, with_grad);
                let tols: &[Tol] = if with_grad {
                    &[Tol::REDUCTION, Tol::ELEMENTWISE]
                } else {
                    &[Tol::REDUCTION]
                };
                h.verify(
                    &format!("{case} {dt} n{n} v{v} grad {with_grad}"),
                    &got,
                    |cpu| run_ce(cpu, dt, &logits, &targets, n, v, gs, with_grad),
                    || {
                        let l64 = rounded64(dt, &logits);
                        let mut w = vec![want(
                            "losses",
                            DType::F32,
                            reference::cross_entropy(&l64, &targets, n, v),
                        )];
                        if with_grad {
                            w.push(want(
                                "dlogits",
                                dt,
                                reference::cross_entropy_grad(&l64, &targets, n, v, gs as f64),
                            ));
                        }
                        w
                    },
                    tols,
                );
            }
        }
    }
}

/// Rows of `ld` logits of which the first `v` are the vocabulary's (GPT-2's 50257 padded to
/// 50304, and small odd shapes): the result equals the unpadded one on the first `v` columns —
/// bit for bit, whatever the padding holds (huge values here, which would dominate a softmax
/// that read them) — and the padded columns' gradient is exactly 0 (prefilled NaN). A `v`
/// above `ld` is refused.
pub fn cross_entropy_padded_rows_ignore_the_padding<D: Device>(h: &Harness<D>) {
    let case = "cross_entropy_padded_rows_ignore_the_padding";
    let mut r = h.rng(case);
    let e = &h.dev;
    for dt in FLOATS {
        for &(n, v, ld) in &[
            (5usize, 1usize, 8usize),
            (7, 96, 128),
            (33, 1000, 1024),
            (3, 50257, 50304),
        ] {
            let real = r.vec(n * v, -6.0, 6.0);
            let mut padded = vec![3.0e4f32; n * ld];
            for i in 0..n {
                padded[i * ld..i * ld + v].copy_from_slice(&real[i * v..(i + 1) * v]);
            }
            let targets: Vec<i32> = (0..n)
                .map(|i| if i % 4 == 3 { -1 } else { r.below(v) as i32 })
                .collect();
            let gs = r.uniform(0.1, 2.0);
            let t = put_i32(e, &targets);
            let run = |logits: &[f32], ld: usize| {
                let l = put(e, dt, logits);
                let mut losses = nan(e, DType::F32, n);
                let mut d = nan(e, dt, n * ld);
                e.exec(CrossEntropyPadded {
                    logits: &l,
                    targets: &t,
                    losses: &mut losses,
                    dlogits: Some(&mut d),
                    n,
                    v,
                    ld,
                    grad_scale: gs,
                })
                .expect("cross_entropy_padded");
                (get(e, "losses", &losses), get(e, "dlogits", &d))
            };
            let (l0, d0) = run(&real, v);
            let (l1, d1) = run(&padded, ld);
            let name = format!("{case} {dt} n{n} v{v} ld{ld}");
            assert_eq!(
                l1.bytes, l0.bytes,
                "{name}: losses differ from the unpadded rows'"
            );
            let es = dt.size_bytes();
            for i in 0..n {
                let row = &d1.bytes[i * ld * es..(i + 1) * ld * es];
                assert_eq!(
                    &row[..v * es],
                    &d0.bytes[i * v * es..(i + 1) * v * es],
                    "{name}: row {i}'s gradient differs from the unpadded row's"
                );
                assert!(
                    row[v * es..].iter().all(|&b| b == 0),
                    "{name}: row {i}'s padded gradient is not +0"
                );
            }
        }
        // v beyond the row is refused.
        let l = put(e, dt, &[0.0; 8]);
        let t = put_i32(e, &[0, 1]);
        let mut losses = nan(e, DType::F32, 2);
        assert!(
            e.exec(CrossEntropyPadded {
                logits: &l,
                targets: &t,
                losses: &mut losses,
                dlogits: None,
                n: 2,
                v: 5,
                ld: 4,
                grad_scale: 1.0
            })
            .is_err(),
            "v 5 > ld 4 accepted"
        );
    }
}

/// [`duet_device::LossOps::cross_entropy_in_place`] (the gradient written over the logits, llm.c's fused
/// classifier) gives exactly the losses and the gradient of
/// [`duet_device::LossOps::cross_entropy_padded`] — bit for bit, every float dtype, padded and
/// unpadded rows, ignored targets.
pub fn cross_entropy_in_place_matches_padded<D: Device>(h: &Harness<D>) {
    let case = "cross_entropy_in_place_matches_padded";
    let mut r = h.rng(case);
    let e = &h.dev;
    for dt in FLOATS {
        for &(n, v, ld) in &[
            (1usize, 1usize, 1usize),
            (7, 96, 96),
            (9, 96, 128),
            (33, 1000, 1024),
            (4, 50257, 50304),
        ] {
            let logits = r.vec(n * ld, -8.0, 8.0);
            let targets: Vec<i32> = (0..n)
                .map(|i| if i % 5 == 2 { -1 } else { r.below(v) as i32 })
                .collect();
            let gs = r.uniform(0.1, 2.0);
            let t = put_i32(e, &targets);
            let l = put(e, dt, &logits);
            let mut losses0 = nan(e, DType::F32, n);
            let mut d0 = nan(e, dt, n * ld);
            e.exec(CrossEntropyPadded {
                logits: &l,
                targets: &t,
                losses: &mut losses0,
                dlogits: Some(&mut d0),
                n,
                v,
                ld,
                grad_scale: gs,
            })
            .expect("cross_entropy_padded");
            let mut inplace = put(e, dt, &logits);
            let mut losses1 = nan(e, DType::F32, n);
            e.exec(CrossEntropyInPlace {
                logits: &mut inplace,
                targets: &t,
                losses: &mut losses1,
                n,
                v,
                ld,
                grad_scale: gs,
            })
            .expect("cross_entropy_in_place");
            let name = format!("{case} {dt} n{n} v{v} ld{ld}");
            assert_eq!(
                get(e, "losses", &losses1).bytes,
                get(e, "losses", &losses0).bytes,
                "{name}: losses"
            );
            assert_eq!(
                get(e, "dlogits", &inplace).bytes,
                get(e, "dlogits", &d0).bytes,
                "{name}: the gradient written over the logits"
            );
        }
    }
}
