//! Token and position embeddings: forward and backward, the token gradient's summation order
//! bit for bit (large vocabularies, long runs of one token), and token ids outside the
//! vocabulary.

use super::*;
use crate::reference;
use duet_device::{CrossEntropy, DType, Device, DeviceError, EmbeddingBackward, EmbeddingForward};

/// The inputs of one forward + backward run: tokens, tables, output gradient and the gradients'
/// starts, for activations of `act` and parameters of `pdt`.
struct EmbInputs {
    act: DType,
    pdt: DType,
    toks: Vec<i32>,
    wte: Vec<f32>,
    wpe: Vec<f32>,
    dout: Vec<f32>,
    dw0: Vec<f32>,
    dp0: Vec<f32>,
    shape: (usize, usize, usize),
}

impl EmbInputs {
    /// `embedding_forward`, then `embedding_backward` accumulating into the starts: (out, dwte,
    /// dwpe).
    fn run<E: Device>(&self, e: &E) -> Vec<Tensor> {
        let (b, t, c) = self.shape;
        let bt = put_i32(e, &self.toks);
        let bwte = put(e, self.pdt, &self.wte);
        let bwpe = put(e, self.pdt, &self.wpe);
        let mut out = nan(e, self.act, b * t * c);
        e.exec(EmbeddingForward {
            tokens: &bt,
            wte: &bwte,
            wpe: &bwpe,
            out: &mut out,
            b,
            t,
            c,
        })
        .expect("embedding_forward");
        let mut res = vec![get(e, "out", &out)];
        res.extend(run_backward(
            e,
            self.act,
            self.pdt,
            &self.toks,
            &self.dout,
            (&self.dw0, &self.dp0),
            self.shape,
        ));
        res
    }
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
                let inp = EmbInputs {
                    act,
                    pdt,
                    toks,
                    wte: r.vec(vocab * c, -1.0, 1.0),
                    wpe: r.vec(max_t * c, -1.0, 1.0),
                    dout: r.vec(b * t * c, -1.0, 1.0),
                    dw0: r.vec(vocab * c, -0.1, 0.1),
                    dp0: r.vec(max_t * c, -0.1, 0.1),
                    shape: (b, t, c),
                };
                let got = inp.run(&h.dev);
                h.verify(
                    &format!("{case} {act}/{pdt} b{b} t{t} c{c} v{vocab}"),
                    &got,
                    |cpu| inp.run(cpu),
                    || {
                        let out = reference::embedding(
                            &inp.toks,
                            &rounded64(pdt, &inp.wte),
                            &rounded64(pdt, &inp.wpe),
                            b,
                            t,
                            c,
                        );
                        let d64 = rounded64(act, &inp.dout);
                        let mut dw = rounded64(pdt, &inp.dw0);
                        let mut dp = rounded64(pdt, &inp.dp0);
                        for bi in 0..b {
                            for ti in 0..t {
                                let tok = inp.toks[bi * t + ti] as usize;
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
                let again = inp.run(&h.dev);
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
            d.exec(EmbeddingForward {
                tokens: &toks,
                wte: &wte,
                wpe: &wpe,
                out: &mut o,
                b: 1,
                t: 4,
                c: 8,
            }),
            &d,
            &format!("embedding_forward with token {bad} of a vocabulary of 4"),
        );
    }
    let logits = d.alloc(DType::F32, 2 * 5).unwrap();
    let targets = put_i32(&d, &[1, 5]);
    let mut losses = d.alloc(DType::F32, 2).unwrap();
    expect_error(
        d.exec(CrossEntropy {
            logits: &logits,
            targets: &targets,
            losses: &mut losses,
            dlogits: None,
            n: 2,
            v: 5,
            grad_scale: 1.0,
        }),
        &d,
        "cross_entropy with target 5 of a vocabulary of 5",
    );
}

/// Tokens with repeats: a quarter from 5 hot ids (long runs of one row), the rest uniform over
/// the vocabulary.
fn hot_tokens(r: &mut Rng, n: usize, vocab: usize) -> Vec<i32> {
    let hot: Vec<usize> = (0..5).map(|_| r.below(vocab)).collect();
    (0..n)
        .map(|_| {
            if r.below(4) == 0 {
                hot[r.below(hot.len())] as i32
            } else {
                r.below(vocab) as i32
            }
        })
        .collect()
}

/// The summation order of the token gradient, on the host: per token, its `dout` rows (the
/// stored values, widened to f32) added in ascending position order to a zero f32 row; ids
/// outside the vocabulary contribute nothing. Returns the sums of the rows some token hits.
fn position_order(toks: &[i32], dout: &[f32], vocab: usize, c: usize) -> Vec<Option<Vec<f32>>> {
    let mut acc: Vec<Option<Vec<f32>>> = vec![None; vocab];
    for (p, &tok) in toks.iter().enumerate() {
        if tok < 0 || tok as usize >= vocab {
            continue;
        }
        let a = acc[tok as usize].get_or_insert_with(|| vec![0.0; c]);
        for (a, &g) in a.iter_mut().zip(&dout[p * c..(p + 1) * c]) {
            *a += g;
        }
    }
    acc
}

/// A dwte start of zero on the rows some token in range hits and of small random values on the
/// others. From zero every backend's order gives the bits of [`position_order`] (the CPU adds
/// each `dout` row straight into the table row, a GPU may sum a token's rows first and add the
/// sum once: the same from zero, not from another start), and the rows no token hits must keep
/// their start.
fn zero_where_hit(r: &mut Rng, toks: &[i32], vocab: usize, c: usize) -> Vec<f32> {
    let mut w = r.vec(vocab * c, -0.1, 0.1);
    for &tok in toks {
        if tok >= 0 && (tok as usize) < vocab {
            w[tok as usize * c..][..c].fill(0.0);
        }
    }
    w
}

/// dwte after the backward as the host model has it: the start (rounded to `pdt`) where no token
/// hits, else the position-order sum (rounded to `pdt` once, by the comparison).
fn model_dwte(pdt: DType, toks: &[i32], dout: &[f32], w0: &[f32], c: usize) -> Vec<f64> {
    let vocab = w0.len() / c;
    let sums = position_order(toks, dout, vocab, c);
    let mut w = rounded64(pdt, w0);
    for (v, s) in sums.iter().enumerate() {
        if let Some(s) = s {
            for (w, &s) in w[v * c..][..c].iter_mut().zip(s) {
                *w = s as f64;
            }
        }
    }
    w
}

/// `embedding_backward` alone: (dwte, dwpe).
fn run_backward<E: Device>(
    e: &E,
    act: DType,
    pdt: DType,
    toks: &[i32],
    dout: &[f32],
    (dw0, dp0): (&[f32], &[f32]),
    (b, t, c): (usize, usize, usize),
) -> Vec<Tensor> {
    let bt = put_i32(e, toks);
    let bd = put(e, act, dout);
    let mut dw = put(e, pdt, dw0);
    let mut dp = put(e, pdt, dp0);
    e.exec(EmbeddingBackward {
        tokens: &bt,
        dout: &bd,
        dwte: &mut dw,
        dwpe: &mut dp,
        b,
        t,
        c,
    })
    .expect("embedding_backward");
    e.synchronize().expect("no deferred error");
    vec![get(e, "dwte", &dw), get(e, "dwpe", &dp)]
}

/// dwpe in f64: its start plus, per position, the batch's `dout` rows.
fn reference_dwpe(
    pdt: DType,
    act: DType,
    dout: &[f32],
    dp0: &[f32],
    b: usize,
    t: usize,
) -> Vec<f64> {
    let c = dp0.len() / t;
    let d = rounded64(act, dout);
    let mut dp = rounded64(pdt, dp0);
    for bi in 0..b {
        for (i, p) in dp.iter_mut().enumerate() {
            *p += d[bi * t * c + i];
        }
    }
    dp
}

/// (b, t, vocab, c, with bf16 dout): one radix pass (vocab 96), two (300, 50257); one sort
/// tile and several (n = b·t = 8192, 16384, 20000); even and odd c; a tiny vocabulary.
const EMB_SHAPES: [(usize, usize, usize, usize, bool); 16] = [
    (32, 256, 96, 768, true),
    (32, 256, 96, 129, false),
    (32, 256, 96, 1, false),
    (32, 256, 50257, 130, true),
    (32, 256, 50257, 64, false),
    (32, 256, 50257, 1, false),
    (16, 1024, 50257, 64, false),
    (16, 1024, 96, 129, false),
    (8, 2500, 96, 64, false),
    (8, 2500, 300, 130, true),
    (8, 2500, 300, 1, false),
    (4, 5000, 50257, 63, true),
    (2, 7, 3, 768, false),
    (2, 7, 3, 129, false),
    (2, 7, 3, 64, false),
    (2, 7, 3, 1, false),
];

/// The token gradient bit for bit: dwte (f32 or bf16) starting at zero on the rows the tokens
/// hit equals, on a GPU, the CPU's bits, and on the CPU the host model of the summation order
/// (per token, its dout rows added in ascending position order in f32, rounded once to the
/// table's dtype); the rows no token hits keep their start. For f32 dout and bf16 dout (f32 and
/// bf16 tables), vocabularies of 3 to 50257, n = 14 to 20000 with hot tokens, even and odd c,
/// and one token at every position (n = 8192 and 20000). dwpe (a nonzero start) within the
/// reduction tolerance; a nonzero start everywhere within it too, and deterministic.
pub fn embedding_backward_bits_follow_position_order<D: Device>(h: &Harness<D>) {
    let case = "embedding_backward_bits_follow_position_order";
    let mut r = h.rng(case);
    let mut runs: Vec<(usize, usize, usize, usize, DType, DType, bool)> = Vec::new();
    for (b, t, vocab, c, bf16) in EMB_SHAPES {
        runs.push((b, t, vocab, c, DType::F32, DType::F32, false));
        if bf16 {
            runs.push((b, t, vocab, c, DType::BF16, DType::F32, false));
            runs.push((b, t, vocab, c, DType::BF16, DType::BF16, false));
        }
    }
    // One token everywhere: a single run of n positions.
    runs.push((1, 8192, 96, 768, DType::F32, DType::F32, true));
    runs.push((1, 20000, 50257, 96, DType::F32, DType::F32, true));
    for (b, t, vocab, c, act, pdt, one) in runs {
        let n = b * t;
        let what = format!("{case} {act}/{pdt} b{b} t{t} v{vocab} c{c}");
        let toks = if one {
            vec![(vocab / 2) as i32; n]
        } else {
            hot_tokens(&mut r, n, vocab)
        };
        let dout = r.vec(n * c, -1.0, 1.0);
        let dw0 = zero_where_hit(&mut r, &toks, vocab, c);
        let dp0 = r.vec(t * c, -0.1, 0.1);
        let shape = (b, t, c);
        let got = run_backward(&h.dev, act, pdt, &toks, &dout, (&dw0, &dp0), shape);
        h.verify(
            &what,
            &got,
            |cpu| run_backward(cpu, act, pdt, &toks, &dout, (&dw0, &dp0), shape),
            || {
                vec![
                    want(
                        "dwte",
                        pdt,
                        model_dwte(pdt, &toks, &rounded(act, &dout), &dw0, c),
                    ),
                    want("dwpe", pdt, reference_dwpe(pdt, act, &dout, &dp0, b, t)),
                ]
            },
            &[Tol::Bits, Tol::REDUCTION],
        );
        // From a start that is not zero: within the reduction tolerance (on the CPU, which
        // runs the same loop for every table, for the small tables only, to keep it quick),
        // and deterministic.
        let w1 = r.vec(vocab * c, -0.1, 0.1);
        let got = run_backward(&h.dev, act, pdt, &toks, &dout, (&w1, &dp0), shape);
        if !h.is_reference() || vocab * c <= 1 << 20 {
            h.verify(
                &format!("{what}, nonzero start"),
                &got,
                |cpu| run_backward(cpu, act, pdt, &toks, &dout, (&w1, &dp0), shape),
                || {
                    let d = rounded64(act, &dout);
                    let mut w = rounded64(pdt, &w1);
                    for (p, &tok) in toks.iter().enumerate() {
                        for j in 0..c {
                            w[tok as usize * c + j] += d[p * c + j];
                        }
                    }
                    vec![
                        want("dwte", pdt, w),
                        want("dwpe", pdt, reference_dwpe(pdt, act, &dout, &dp0, b, t)),
                    ]
                },
                // One token's 20000 rows summed in f32 stray further from the f64 sum.
                &[
                    if one { Tol::rel(1e-3) } else { Tol::REDUCTION },
                    Tol::REDUCTION,
                ],
            );
        }
        assert!(
            got == run_backward(&h.dev, act, pdt, &toks, &dout, (&w1, &dp0), shape),
            "{what}: not deterministic"
        );
    }
}

/// Token ids outside the vocabulary (−1, vocab, vocab + 1000, i32::MIN, i32::MAX among hot
/// tokens; and every id out of range) in `embedding_backward`: an `InvalidArgument` naming a
/// token, reported once, from the call or from the next `synchronize`, and they contribute
/// nothing. The two places differ in what the valid ids did: the CPU checks every id before it
/// writes, so a refused call leaves dwte and dwpe as they were; a GPU checks in the kernel,
/// adds the valid ids' rows (dwte then equals the host model of the position order with the bad
/// ids left out, bit for bit, from a zero start on the rows hit) and reports the error deferred.
pub fn embedding_backward_bad_tokens_contribute_nothing<D: Device>(h: &Harness<D>) {
    let case = "embedding_backward_bad_tokens_contribute_nothing";
    let d = h.fresh();
    let mut r = h.rng(case);
    let shapes = [
        (32usize, 256usize, 96usize, 768usize, false),
        (32, 256, 50257, 64, false),
        (4, 5000, 96, 33, false),
        (4, 5000, 50257, 32, false),
        (1, 4, 8, 8, false),
        (1, 9000, 96, 16, true),
    ];
    for (b, t, vocab, c, all_bad) in shapes {
        let n = b * t;
        let what = format!("{case} b{b} t{t} v{vocab} c{c}");
        let toks: Vec<i32> = if all_bad {
            (0..n)
                .map(|i| if i % 2 == 0 { -5 } else { vocab as i32 })
                .collect()
        } else {
            let mut toks = hot_tokens(&mut r, n, vocab);
            let bad = [-1, vocab as i32, vocab as i32 + 1000, i32::MIN, i32::MAX];
            for (k, &x) in bad.iter().enumerate() {
                toks[(k * 7919 + 3) % n] = x;
            }
            toks
        };
        let dout = r.vec(n * c, -1.0, 1.0);
        let dw0 = zero_where_hit(&mut r, &toks, vocab, c);
        let dp0 = r.vec(t * c, -0.1, 0.1);
        let bt = put_i32(&d, &toks);
        let bd = put(&d, DType::F32, &dout);
        let mut dw = put(&d, DType::F32, &dw0);
        let mut dp = put(&d, DType::F32, &dp0);
        let (err, refused) = match d.exec(EmbeddingBackward {
            tokens: &bt,
            dout: &bd,
            dwte: &mut dw,
            dwpe: &mut dp,
            b,
            t,
            c,
        }) {
            Err(e) => (e, true),
            Ok(()) => match d.synchronize() {
                Err(e) => (e, false),
                Ok(()) => panic!("{what}: accepted ({})", h.backend()),
            },
        };
        match err {
            DeviceError::InvalidArgument(msg) => {
                assert!(
                    msg.contains("token"),
                    "{what}: the message names no token: {msg}"
                )
            }
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
        d.synchronize()
            .unwrap_or_else(|e| panic!("{what}: the error was reported twice: {e}"));
        let got = get(&d, "dwte", &dw);
        let want_w: Vec<f32> = if refused || all_bad {
            dw0.clone()
        } else {
            model_dwte(DType::F32, &toks, &dout, &dw0, c)
                .iter()
                .map(|&x| x as f32)
                .collect()
        };
        let want_t = Tensor::encoded("dwte", DType::F32, &want_w);
        compare(
            &format!(
                "{what} dwte ({} {})",
                h.backend(),
                if refused {
                    "refused the call: as it was"
                } else {
                    "reported it deferred: the valid ids' sums"
                }
            ),
            &got,
            &want_t,
            Tol::Bits,
        );
        if refused {
            compare(
                &format!("{what} dwpe (refused: as it was)"),
                &get(&d, "dwpe", &dp),
                &Tensor::encoded("dwpe", DType::F32, &dp0),
                Tol::Bits,
            );
        }
    }
}
