//! Softmax + cross-entropy.

use super::*;
use crate::reference;
use duet_device::{DType, Fused};

#[allow(clippy::too_many_arguments)]
fn run_ce<E: Fused>(
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
        e.cross_entropy(&l, &t, &mut losses, Some(&mut d), n, v, gs)
            .expect("cross_entropy");
        vec![get(e, "losses", &losses), get(e, "dlogits", &d)]
    } else {
        e.cross_entropy(&l, &t, &mut losses, None, n, v, gs)
            .expect("cross_entropy");
        vec![get(e, "losses", &losses)]
    }
}

/// Per-row losses, with and without the gradient `(softmax − onehot)·grad_scale`; ignored
/// (negative: −1, −100) targets give loss 0 and a zero gradient row; GPT-2's vocabulary among the shapes.
pub fn cross_entropy_losses_and_gradients<D: Fused>(h: &Harness<D>) {
    let case = "cross_entropy_losses_and_gradients";
    let mut r = h.rng(case);
    for dt in FLOATS {
        for &(n, v) in &[(1usize, 1usize), (7, 96), (512, 96), (33, 1000), (4, 50257)] {
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
