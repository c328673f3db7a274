//! LayerNorm forward and backward, and the backward fused with the bias-gradient column sum.

use super::*;
use crate::reference;
use duet_device::{DType, Device};

/// Rows with their own offsets and scales.
fn ln_input(r: &mut Rng, n: usize, c: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(n * c);
    for _ in 0..n {
        let (off, sc) = (r.uniform(-3.0, 3.0), r.uniform(0.1, 4.0));
        v.extend((0..c).map(|_| off + sc * r.uniform(-1.0, 1.0)));
    }
    v
}

struct LnCase {
    act: DType,
    pdt: DType,
    n: usize,
    c: usize,
    x: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    dout: Vec<f32>,
    dx0: Vec<f32>,
    dg0: Vec<f32>,
    db0: Vec<f32>,
}

impl LnCase {
    fn new(r: &mut Rng, act: DType, pdt: DType, n: usize, c: usize) -> Self {
        LnCase {
            act,
            pdt,
            n,
            c,
            x: ln_input(r, n, c),
            gamma: r.vec(c, 0.5, 1.5),
            beta: r.vec(c, -0.5, 0.5),
            dout: r.vec(n * c, -1.0, 1.0),
            dx0: r.vec(n * c, -0.5, 0.5),
            dg0: r.vec(c, -0.5, 0.5),
            db0: r.vec(c, -0.5, 0.5),
        }
    }

    /// Forward, then the backward from the device's own saved statistics (as the engine runs
    /// it), accumulating into dx, dgamma and dbeta; with `colsum`, the fused variant.
    fn run<E: Device>(&self, e: &E, colsum: Option<bool>) -> Vec<Tensor> {
        let (n, c) = (self.n, self.c);
        let x = put(e, self.act, &self.x);
        let g = put(e, self.pdt, &self.gamma);
        let b = put(e, self.pdt, &self.beta);
        let mut out = nan(e, self.act, n * c);
        let mut mean = nan(e, DType::F32, n);
        let mut rstd = nan(e, DType::F32, n);
        e.layernorm_forward(&x, &g, &b, &mut out, &mut mean, &mut rstd, n, c, 1e-5)
            .expect("layernorm_forward");
        let dout = put(e, self.act, &self.dout);
        let mut dx = put(e, self.act, &self.dx0);
        let mut dg = put(e, self.pdt, &self.dg0);
        let mut db = put(e, self.pdt, &self.db0);
        let mut res = vec![
            get(e, "out", &out),
            get(e, "mean", &mean),
            get(e, "rstd", &rstd),
        ];
        match colsum {
            None => e
                .layernorm_backward(&dout, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut db, n, c)
                .expect("layernorm_backward"),
            Some(fused) => {
                let mut dsum = put(e, DType::F32, &vec![0.25; c]);
                if fused {
                    e.layernorm_backward_colsum(
                        &dout, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut db, &mut dsum, n, c,
                    )
                    .expect("layernorm_backward_colsum");
                } else {
                    e.layernorm_backward(
                        &dout, &x, &g, &mean, &rstd, &mut dx, &mut dg, &mut db, n, c,
                    )
                    .expect("layernorm_backward");
                    e.bias_backward(&dx, &mut dsum, n, c)
                        .expect("bias_backward");
                }
                res.push(get(e, "dsum", &dsum));
            }
        }
        res.splice(
            3..3,
            [
                get(e, "dx", &dx),
                get(e, "dgamma", &dg),
                get(e, "dbeta", &db),
            ],
        );
        res
    }

    fn reference(&self) -> Vec<Want> {
        let (n, c) = (self.n, self.c);
        let x = rounded64(self.act, &self.x);
        let g = rounded64(self.pdt, &self.gamma);
        let b = rounded64(self.pdt, &self.beta);
        let (out, mean, rstd) = reference::layernorm(&x, &g, &b, n, c, 1e-5);
        let dout = rounded64(self.act, &self.dout);
        let (dx, dg, db) = reference::layernorm_backward(&dout, &x, &g, n, c, 1e-5);
        let add = |a: Vec<f64>, dt: DType, init: &[f32]| -> Vec<f64> {
            rounded64(dt, init)
                .iter()
                .zip(a)
                .map(|(i, d)| i + d)
                .collect()
        };
        vec![
            want("out", self.act, out),
            want("mean", DType::F32, mean),
            want("rstd", DType::F32, rstd),
            want("dx", self.act, add(dx, self.act, &self.dx0)),
            want("dgamma", self.pdt, add(dg, self.pdt, &self.dg0)),
            want("dbeta", self.pdt, add(db, self.pdt, &self.db0)),
        ]
    }
}

const LN_SHAPES: [(usize, usize); 5] = [(1, 1), (5, 3), (67, 768), (1024, 96), (300, 1000)];

/// LayerNorm forward (out, mean, rstd) and backward (accumulating dx, dgamma, dbeta) for every
/// activation dtype with parameters of that dtype or f32; deterministic.
pub fn layernorm_forward_backward<D: Device>(h: &Harness<D>) {
    let case = "layernorm_forward_backward";
    let mut r = h.rng(case);
    for act in FLOATS {
        for pdt in [act, DType::F32] {
            for (n, c) in LN_SHAPES {
                let lc = LnCase::new(&mut r, act, pdt, n, c);
                let got = lc.run(&h.dev, None);
                let grad = Tol::Rel {
                    f32: 2e-4,
                    f16: 5e-3,
                    bf16: 1e-2,
                    fp8: 0.13,
                };
                h.verify(
                    &format!("{case} {act}/{pdt} {n}x{c}"),
                    &got,
                    |cpu| lc.run(cpu, None),
                    || lc.reference(),
                    &[
                        Tol::REDUCTION,
                        Tol::rel(1e-5),
                        Tol::REDUCTION,
                        grad,
                        grad,
                        Tol::REDUCTION,
                    ],
                );
                assert_eq!(
                    got,
                    lc.run(&h.dev, None),
                    "{case}: {act}/{pdt} {n}x{c} not deterministic"
                );
            }
        }
    }
}

/// `layernorm_backward_colsum` equals `layernorm_backward` followed by `bias_backward` of the
/// updated dx: dx, dgamma and dbeta bit for bit, the column sum up to summation order.
pub fn layernorm_backward_colsum_matches_composition<D: Device>(h: &Harness<D>) {
    let case = "layernorm_backward_colsum_matches_composition";
    let mut r = h.rng(case);
    for act in FLOATS {
        for pdt in [act, DType::F32] {
            for (n, c) in LN_SHAPES {
                let lc = LnCase::new(&mut r, act, pdt, n, c);
                let fused = lc.run(&h.dev, Some(true));
                let plain = lc.run(&h.dev, Some(false));
                h.same(
                    &format!("{case} {act}/{pdt} {n}x{c}"),
                    &fused,
                    &plain,
                    &[
                        Tol::Bits,
                        Tol::Bits,
                        Tol::Bits,
                        Tol::Bits,
                        Tol::Bits,
                        Tol::Bits,
                        Tol::REDUCTION,
                    ],
                );
            }
        }
    }
}
