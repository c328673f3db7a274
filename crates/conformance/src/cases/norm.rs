//! LayerNorm forward and backward, and the backward fused with the bias-gradient column sum:
//! every row path of the GPU kernels, repeated (accumulating) calls, every dsum dtype, and the
//! shapes they refuse.

use super::*;
use crate::harness::compare_values;
use crate::reference;
use duet_device::{
    BiasBackward, DType, Device, DeviceError, LayerNormBackward, LayerNormBackwardColsum,
    LayerNormForward,
};

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
    /// dsum's dtype and start (the colsum variant).
    sdt: DType,
    ds0: Vec<f32>,
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
            sdt: DType::F32,
            ds0: vec![0.25; c],
        }
    }

    /// With a dsum of `sdt` starting at random values, and a dx start biased per column (the
    /// residual-stream gradient), so the column sums are not all near zero.
    fn with_dsum(mut self, r: &mut Rng, sdt: DType) -> Self {
        let bias = r.vec(self.c, -0.3, 0.3);
        for (i, d) in self.dx0.iter_mut().enumerate() {
            *d += bias[i % self.c];
        }
        self.sdt = sdt;
        self.ds0 = r.vec(self.c, -0.5, 0.5);
        self
    }

    /// Forward, then the backward from the device's own saved statistics (as the engine runs
    /// it), accumulating into dx, dgamma and dbeta; with `colsum`, the fused variant.
    fn run<E: Device>(&self, e: &E, colsum: Option<bool>) -> Vec<Tensor> {
        self.run_times(e, colsum, 1)
    }

    /// [`LnCase::run`] with the backward called `times` times (each call adds again).
    fn run_times<E: Device>(&self, e: &E, colsum: Option<bool>, times: usize) -> Vec<Tensor> {
        let (n, c) = (self.n, self.c);
        let x = put(e, self.act, &self.x);
        let g = put(e, self.pdt, &self.gamma);
        let b = put(e, self.pdt, &self.beta);
        let mut out = nan(e, self.act, n * c);
        let mut mean = nan(e, DType::F32, n);
        let mut rstd = nan(e, DType::F32, n);
        e.exec(LayerNormForward {
            x: &x,
            gamma: &g,
            beta: &b,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps: 1e-5,
        })
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
            None => {
                for _ in 0..times {
                    e.exec(LayerNormBackward {
                        dout: &dout,
                        x: &x,
                        gamma: &g,
                        mean: &mean,
                        rstd: &rstd,
                        dx: &mut dx,
                        dgamma: &mut dg,
                        dbeta: &mut db,
                        n,
                        c,
                    })
                    .expect("layernorm_backward");
                }
            }
            Some(fused) => {
                let mut dsum = put(e, self.sdt, &self.ds0);
                for _ in 0..times {
                    if fused {
                        e.exec(LayerNormBackwardColsum {
                            dout: &dout,
                            x: &x,
                            gamma: &g,
                            mean: &mean,
                            rstd: &rstd,
                            dx: &mut dx,
                            dgamma: &mut dg,
                            dbeta: &mut db,
                            dsum: &mut dsum,
                            n,
                            c,
                        })
                        .expect("layernorm_backward_colsum");
                    } else {
                        e.exec(LayerNormBackward {
                            dout: &dout,
                            x: &x,
                            gamma: &g,
                            mean: &mean,
                            rstd: &rstd,
                            dx: &mut dx,
                            dgamma: &mut dg,
                            dbeta: &mut db,
                            n,
                            c,
                        })
                        .expect("layernorm_backward");
                        e.exec(BiasBackward {
                            dout: &dx,
                            dbias: &mut dsum,
                            rows: n,
                            c,
                        })
                        .expect("bias_backward");
                    }
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
        self.reference_times(1)
    }

    /// The f64 outputs after `times` backward calls: the starting gradients plus `times` of
    /// each increment, the sum rounded to the gradient's dtype after each call as the
    /// accumulation stores it. (Unrounded, a sum that cancels most of the starting value left an
    /// oracle the first call's one storage rounding missed by more than the tolerance: bf16
    /// dbeta of 3 × 1 rows, 4 ulps off a −0.00415 that started near ±0.05, seed
    /// 1796672588073234322.)
    fn reference_times(&self, times: usize) -> Vec<Want> {
        let (n, c) = (self.n, self.c);
        let x = rounded64(self.act, &self.x);
        let g = rounded64(self.pdt, &self.gamma);
        let b = rounded64(self.pdt, &self.beta);
        let (out, mean, rstd) = reference::layernorm(&x, &g, &b, n, c, 1e-5);
        let dout = rounded64(self.act, &self.dout);
        let (dx, dg, db) = reference::layernorm_backward(&dout, &x, &g, n, c, 1e-5);
        let add = |a: Vec<f64>, dt: DType, init: &[f32]| -> Vec<f64> {
            let mut acc = rounded64(dt, init);
            for _ in 0..times {
                let sum: Vec<f32> = acc.iter().zip(&a).map(|(i, d)| (i + d) as f32).collect();
                acc = rounded64(dt, &sum);
            }
            acc
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

/// Gradients against the oracle: f32 after two row reductions, 16-bit one rounding.
const LN_GRAD: Tol = Tol::Rel {
    f32: 2e-4,
    f16: 5e-3,
    bf16: 1e-2,
    fp8: 0.13,
};

/// The tolerances of [`LnCase::run`]'s outputs against the oracle: out, mean, rstd, dx, dgamma,
/// dbeta.
const LN_TOLS: [Tol; 6] = [
    Tol::REDUCTION,
    Tol::rel(1e-5),
    Tol::REDUCTION,
    LN_GRAD,
    LN_GRAD,
    Tol::REDUCTION,
];

/// `tols` of the six outputs, then dsum's.
fn with_dsum_tol(tols: [Tol; 6], dsum: Tol) -> [Tol; 7] {
    let mut t = [dsum; 7];
    t[..6].copy_from_slice(&tols);
    t
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
                h.verify(
                    &format!("{case} {act}/{pdt} {n}x{c}"),
                    &got,
                    |cpu| lc.run(cpu, None),
                    || lc.reference(),
                    &LN_TOLS,
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
                    &with_dsum_tol([Tol::Bits; 6], Tol::REDUCTION),
                );
            }
        }
    }
}

/// The (activation, parameter) dtype pairs of the recipes.
const LN_DTYPES: [(DType, DType); 5] = [
    (DType::F32, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::BF16, DType::F32),
    (DType::F16, DType::F16),
    (DType::F16, DType::F32),
];

/// Shapes (n, c) for every row path of a GPU LayerNorm: the vectorised fast path (c a multiple
/// of 8: 768, 2048), the single-element path (c = 1, 7, 100), one row, a few rows and many
/// rows (8192, so many blocks share the dgamma/dbeta reduction), and rows too wide for the
/// register-cached kernels (1537 single elements; 3080, 8200, 16392 vectors). Few rows where
/// they are wide, so the CPU runs them quickly.
const LN_PATH_SHAPES: [(usize, usize); 17] = [
    (1, 1),
    (1, 7),
    (1, 100),
    (1, 768),
    (1, 2048),
    (3, 1),
    (3, 7),
    (3, 100),
    (3, 768),
    (3, 2048),
    (8192, 1),
    (8192, 7),
    (8192, 100),
    (5, 1537),
    (4, 3080),
    (9, 8200),
    (3, 16392),
];

/// LayerNorm forward and backward over every row path (see `LN_PATH_SHAPES`) for the
/// recipes' dtype pairs: one backward call, then two (the second adds again: the starting
/// gradients plus twice the increment, bit-identical when run again).
pub fn layernorm_every_row_path_accumulates<D: Device>(h: &Harness<D>) {
    let case = "layernorm_every_row_path_accumulates";
    let mut r = h.rng(case);
    for (act, pdt) in LN_DTYPES {
        for (n, c) in LN_PATH_SHAPES {
            let lc = LnCase::new(&mut r, act, pdt, n, c);
            for times in [1, 2] {
                let what = format!("{case} {act}/{pdt} {n}x{c}, {times} backward call(s)");
                let got = lc.run_times(&h.dev, None, times);
                h.verify(
                    &what,
                    &got,
                    |cpu| lc.run_times(cpu, None, times),
                    || lc.reference_times(times),
                    &LN_TOLS,
                );
                if times == 2 {
                    assert!(
                        got == lc.run_times(&h.dev, None, times),
                        "{what}: not deterministic"
                    );
                }
            }
        }
    }
}

/// `layernorm_backward_colsum` over the fused kernels' paths (vectorised rows, 65 × 136 with a
/// partial last chunk; single elements, 65 × 130; one row; rows too wide for the fast path,
/// 37 × 3000 and 37 × 3080; many rows, 1024 × 768 and 8192 × 64) for every dtype pair and a
/// dsum of f32, of the parameters' dtype, and of a third dtype, every gradient starting
/// non-zero (dx biased per column, as a residual-stream gradient): dx, dgamma, dbeta
/// bit-identical to `layernorm_backward`'s; dsum equal (in f64) to its start plus the column
/// sums of the dx it left, and to `bias_backward`'s up to summation order; deterministic; and
/// against the oracle (the CPU, or the f64 reference with dsum its start plus the column sums
/// of the reference's dx).
pub fn layernorm_backward_colsum_every_path_and_dsum_dtype<D: Device>(h: &Harness<D>) {
    let case = "layernorm_backward_colsum_every_path_and_dsum_dtype";
    let mut r = h.rng(case);
    let shapes = [
        (1024usize, 768usize),
        (8192, 64),
        (65, 136),
        (65, 130),
        (1, 64),
        (37, 3000),
        (37, 3080),
    ];
    let mut combos: Vec<(DType, DType, DType)> = Vec::new();
    for (act, pdt) in LN_DTYPES {
        combos.push((act, pdt, DType::F32));
        if pdt != DType::F32 {
            combos.push((act, pdt, pdt));
        }
    }
    combos.push((DType::BF16, DType::F32, DType::F16));
    combos.push((DType::F32, DType::F32, DType::BF16));
    // One rounding of the stored value (or f32 sums of many rows).
    let rel = |dt: DType| match dt {
        DType::F32 => 1e-5,
        DType::F16 => 5e-3,
        _ => 1e-2,
    };
    for (act, pdt, sdt) in combos {
        for (n, c) in shapes {
            let what = format!("{case} {act}/{pdt}/dsum {sdt} {n}x{c}");
            let lc = LnCase::new(&mut r, act, pdt, n, c).with_dsum(&mut r, sdt);
            let fused = lc.run(&h.dev, Some(true));
            let plain = lc.run(&h.dev, Some(false));
            h.same(
                &what,
                &fused,
                &plain,
                &with_dsum_tol([Tol::Bits; 6], Tol::rel(rel(sdt))),
            );
            assert!(
                fused == lc.run(&h.dev, Some(true)),
                "{what}: not deterministic"
            );
            // dsum = its start + Σ_rows of the dx the call left (its dtype's rounding).
            let dx: Vec<f64> = fused[3].f32().iter().map(|&x| x as f64).collect();
            let from_dx: Vec<f64> = reference::col_sums(&dx, n, c)
                .iter()
                .zip(rounded64(sdt, &lc.ds0))
                .map(|(s, d)| s + d)
                .collect();
            let got: Vec<f64> = fused[6].f32().iter().map(|&x| x as f64).collect();
            compare_values(
                &format!("{what} dsum vs its start + the column sums of its dx"),
                &got,
                &from_dx,
                rel(sdt),
            );
            // Against the oracle: the dx behind dsum rounds differently there (the CPU's own
            // statistics, or none at all in f64), in the last bit of the activation dtype.
            h.verify(
                &what,
                &fused,
                |cpu| lc.run(cpu, Some(true)),
                || {
                    let mut w = lc.reference();
                    let ds: Vec<f64> = reference::col_sums(&w[3].values, n, c)
                        .iter()
                        .zip(rounded64(sdt, &lc.ds0))
                        .map(|(s, d)| s + d)
                        .collect();
                    w.push(want("dsum", sdt, ds));
                    w
                },
                &with_dsum_tol(LN_TOLS, Tol::rel(rel(sdt).max(rel(act)).max(1e-4))),
            );
        }
    }
}

/// LayerNorm refuses what does not fit: c = 0 with rows, gamma of the wrong length, a dsum of
/// the wrong length or an integer dsum (typed errors, the gradients left as they were); n = 0 is
/// a no-op.
pub fn layernorm_rejects_bad_shapes<D: Device>(h: &Harness<D>) {
    let case = "layernorm_rejects_bad_shapes";
    let d = &h.dev;
    let typed = |res: duet_device::Result<()>, what: &str| match res {
        Err(
            DeviceError::Shape { .. }
            | DeviceError::DTypeMismatch { .. }
            | DeviceError::Unsupported { .. },
        ) => {}
        other => panic!(
            "{case} ({}): {what}: expected a Shape, DTypeMismatch or Unsupported error, got \
             {other:?}",
            h.backend()
        ),
    };
    let x = put(d, DType::BF16, &[1.0; 8]);
    let p = put(d, DType::F32, &[1.0; 8]);
    let mut o = d.alloc(DType::BF16, 8).unwrap();
    let mut m = d.alloc(DType::F32, 1).unwrap();
    let mut rs = d.alloc(DType::F32, 1).unwrap();
    typed(
        d.exec(LayerNormForward {
            x: &x,
            gamma: &p,
            beta: &p,
            out: &mut o,
            mean: &mut m,
            rstd: &mut rs,
            n: 1,
            c: 0,
            eps: 1e-5,
        }),
        "forward with c = 0 and a row",
    );
    let short = put(d, DType::F32, &[1.0; 4]);
    typed(
        d.exec(LayerNormForward {
            x: &x,
            gamma: &short,
            beta: &p,
            out: &mut o,
            mean: &mut m,
            rstd: &mut rs,
            n: 1,
            c: 8,
            eps: 1e-5,
        }),
        "forward with a gamma of 4 for c = 8",
    );
    // n = 0: empty row buffers, nothing to do.
    let x0 = d.alloc(DType::BF16, 0).unwrap();
    let mut o0 = d.alloc(DType::BF16, 0).unwrap();
    let mut m0 = d.alloc(DType::F32, 0).unwrap();
    let mut r0 = d.alloc(DType::F32, 0).unwrap();
    d.exec(LayerNormForward {
        x: &x0,
        gamma: &p,
        beta: &p,
        out: &mut o0,
        mean: &mut m0,
        rstd: &mut r0,
        n: 0,
        c: 8,
        eps: 1e-5,
    })
    .unwrap_or_else(|e| panic!("{case}: n = 0 was refused: {e}"));
    // The colsum variant with a bad dsum.
    let a = |dtype, len| put(d, dtype, &vec![0.5; len]);
    let (dout, x2) = (a(DType::BF16, 16), a(DType::BF16, 16));
    let (g, mean, rstd) = (a(DType::F32, 8), a(DType::F32, 2), a(DType::F32, 2));
    let (mut dx, mut dg, mut db) = (a(DType::BF16, 16), a(DType::F32, 8), a(DType::F32, 8));
    let mut short = a(DType::F32, 4);
    typed(
        d.exec(LayerNormBackwardColsum {
            dout: &dout,
            x: &x2,
            gamma: &g,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dgamma: &mut dg,
            dbeta: &mut db,
            dsum: &mut short,
            n: 2,
            c: 8,
        }),
        "backward_colsum with a dsum of 4 for c = 8",
    );
    let mut ints = d.alloc(DType::I32, 8).unwrap();
    typed(
        d.exec(LayerNormBackwardColsum {
            dout: &dout,
            x: &x2,
            gamma: &g,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dgamma: &mut dg,
            dbeta: &mut db,
            dsum: &mut ints,
            n: 2,
            c: 8,
        }),
        "backward_colsum with an i32 dsum",
    );
    for (name, b, dt, len) in [
        ("dx", &dx, DType::BF16, 16),
        ("dgamma", &dg, DType::F32, 8),
        ("dbeta", &db, DType::F32, 8),
    ] {
        assert_eq!(
            get(d, name, b).bytes,
            encode(dt, &vec![0.5; len]),
            "{case}: a refused backward_colsum wrote {name}"
        );
    }
    d.synchronize().expect("no deferred error");
}
