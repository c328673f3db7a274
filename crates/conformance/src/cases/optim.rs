//! The optimizer: AdamW (single and multi-tensor, with the FP8 weight codes) and the sums of
//! squares behind gradient clipping.

use super::*;
use crate::reference;
use duet_device::{
    ADAMW_SCALARS, AdamWClipStep, AdamWClipped, AdamWClippedFp8, AdamWFp8Out, AdamWStep,
    AdamWTensor, AdamWUpdate, BiasBackward, Buffer, DType, Device, DeviceError, Fp8QuantJob,
    QuantizeFp8Many, SumSquares, SumSquaresMany, clip_grad_scale,
};

/// The copy kinds of a working copy: none, every float and every FP8 dtype.
const COPIES: [Option<DType>; 8] = [
    None,
    Some(DType::F32),
    Some(DType::F16),
    Some(DType::BF16),
    Some(DType::F8E4M3),
    Some(DType::F8E5M2),
    Some(DType::F8E4M3Fnuz),
    Some(DType::F8E5M2Fnuz),
];

/// The named output of `ts`.
fn find<'a>(ts: &'a [Tensor], name: &str) -> &'a Tensor {
    ts.iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no output named {name}"))
}

/// Checks that the working copies in `got` are their step's parameters rounded on the host
/// (exact: the copy is the updated f32 weight stored in the copy's dtype).
#[track_caller]
fn copies_are_rounded_params(what: &str, got: &[Tensor], pairs: &[(String, String)]) {
    for (param, copy) in pairs {
        let p = find(got, param);
        let c = find(got, copy);
        let want = Tensor::encoded(&c.name, c.dtype, &p.f32());
        compare(
            &format!("{what} {copy} is {param} rounded"),
            c,
            &want,
            Tol::Bits,
        );
    }
}

/// The starting values of one AdamW tensor (param, grad, m, v).
struct Init {
    p: Vec<f32>,
    g: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Init {
    /// The first moment has its gradient's sign (as momentum does), so that `β1·m + (1−β1)·g`
    /// cannot cancel: with a single element there is no tensor scale to measure the rounding
    /// of a cancelled sum against.
    fn draw(r: &mut Rng, n: usize, grad: f32) -> Self {
        let g = r.vec(n, -grad, grad);
        let m = g
            .iter()
            .map(|x| r.uniform(0.0, 0.01).copysign(*x))
            .collect();
        Init {
            p: r.vec(n, -1.0, 1.0),
            g,
            m,
            v: r.vec(n, 0.0, 0.001),
        }
    }
}

/// An AdamW step with the suite's β1 = 0.9, β2 = 0.95, ε = 1e-8.
fn adamw_step(lr: f32, weight_decay: f32, (bc1, bc2): (f32, f32), grad_scale: f32) -> AdamWStep {
    AdamWStep {
        lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay,
        bias_correction1: bc1,
        bias_correction2: bc2,
        grad_scale,
    }
}

/// One tensor's buffers.
struct Bufs<B> {
    p: B,
    g: B,
    m: B,
    v: B,
    c: Option<B>,
}

fn bufs<E: Device>(e: &E, init: &Init, gdt: DType, copy: Option<DType>) -> Bufs<E::Buffer> {
    Bufs {
        p: put(e, DType::F32, &init.p),
        g: put(e, gdt, &init.g),
        m: put(e, DType::F32, &init.m),
        v: put(e, DType::F32, &init.v),
        c: copy.map(|d| nan(e, d, init.p.len())),
    }
}

fn adamw_tensors<'a, B>(bs: &'a mut [Bufs<B>], wds: &[f32]) -> Vec<AdamWTensor<'a, B>> {
    bs.iter_mut()
        .zip(wds)
        .map(|(b, &wd)| AdamWTensor {
            param: &mut b.p,
            grad: &b.g,
            m: &mut b.m,
            v: &mut b.v,
            copy: b.c.as_mut(),
            weight_decay: wd,
        })
        .collect()
}

/// Downloads param, m, v (and the copy) of tensor `i` after step `t` under names
/// `t{i} param step {t}` etc.
fn push_state<E: Device>(e: &E, out: &mut Vec<Tensor>, b: &Bufs<E::Buffer>, i: usize, t: usize) {
    out.push(get(e, &format!("t{i} param step {t}"), &b.p));
    out.push(get(e, &format!("t{i} m step {t}"), &b.m));
    out.push(get(e, &format!("t{i} v step {t}"), &b.v));
    if let Some(c) = &b.c {
        out.push(get(e, &format!("t{i} copy step {t}"), c));
    }
}

/// The f64 reference state of one tensor.
struct State {
    p: Vec<f64>,
    g: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
}

impl State {
    /// The states of tensors with these starts and gradient dtypes.
    fn all(inits: &[Init], grads: impl Iterator<Item = DType>) -> Vec<Self> {
        inits
            .iter()
            .zip(grads)
            .map(|(i, g)| State::new(i, g))
            .collect()
    }
    fn new(init: &Init, gdt: DType) -> Self {
        State {
            p: rounded64(DType::F32, &init.p),
            g: rounded64(gdt, &init.g),
            m: rounded64(DType::F32, &init.m),
            v: rounded64(DType::F32, &init.v),
        }
    }
    fn step(&mut self, s: &AdamWStep) {
        let (p, m, v) = reference::adamw(&self.p, &self.g, &self.m, &self.v, s);
        (self.p, self.m, self.v) = (p, m, v);
    }
    /// The wants of [`push_state`] (the copy: the f64 weight rounded to the copy's dtype).
    fn push(&self, out: &mut Vec<Want>, copy: Option<DType>, i: usize, t: usize) {
        out.push(want(
            &format!("t{i} param step {t}"),
            DType::F32,
            self.p.clone(),
        ));
        out.push(want(
            &format!("t{i} m step {t}"),
            DType::F32,
            self.m.clone(),
        ));
        out.push(want(
            &format!("t{i} v step {t}"),
            DType::F32,
            self.v.clone(),
        ));
        if let Some(d) = copy {
            let p32: Vec<f32> = self.p.iter().map(|&x| x as f32).collect();
            out.push(want(&format!("t{i} copy step {t}"), d, rounded64(d, &p32)));
        }
    }
}

/// The tolerances of [`push_state`]'s outputs: f32 state element-wise; a copy one rounding of
/// its dtype away (an FP8 copy one code step, since the oracle's weight may round the other
/// way).
fn state_tols(tols: &mut Vec<Tol>, copy: Option<DType>) {
    tols.extend([Tol::ELEMENTWISE; 3]);
    if let Some(d) = copy {
        tols.push(super::fp8::step_tol(d));
    }
}

/// One tensor updated by `adamw` over `steps`.
fn adamw_on<E: Device>(
    e: &E,
    init: &Init,
    gdt: DType,
    copy: Option<DType>,
    steps: &[AdamWStep],
) -> Vec<Tensor> {
    let mut b = bufs(e, init, gdt, copy);
    let mut out = Vec::new();
    for (t, s) in steps.iter().enumerate() {
        e.exec(AdamWUpdate {
            param: &mut b.p,
            grad: &b.g,
            m: &mut b.m,
            v: &mut b.v,
            step: s,
            param_copy: b.c.as_mut(),
        })
        .expect("adamw");
        push_state(e, &mut out, &b, 0, t + 1);
    }
    out
}

/// `adamw` for every gradient dtype and every kind of working copy, odd lengths, weight decay
/// on and off, a gradient scale, three steps with the bias corrections of
/// [`AdamWStep::bias_corrections`]: param, m, v against the oracle (f32 element-wise), the copy
/// bit for bit the device's own parameter rounded on the host, and a wrong parameter dtype
/// refused.
pub fn adamw_all_grad_and_copy_dtypes<D: Device>(h: &Harness<D>) {
    const CASE: &str = "adamw_all_grad_and_copy_dtypes";
    let mut r = h.rng(CASE);
    let fp8 = h.dev.info().supports_fp8;
    let mut skipped_fp8 = false;
    for gdt in FLOATS {
        for copy in COPIES {
            if copy.is_some_and(|d| d.is_fp8()) && !fp8 {
                skipped_fp8 = true;
                continue;
            }
            for (n, wd) in [
                (1usize, 0.1f32),
                (7, 0.0),
                (4099, 0.1),
                (4099, 0.0),
                (33_333, 0.1),
            ] {
                let what = format!("{CASE}: grad {gdt} copy {copy:?} n {n} wd {wd}");
                let init = Init::draw(&mut r, n, 0.1);
                let steps: Vec<AdamWStep> = (1..=3u64)
                    .map(|t| adamw_step(3e-4, wd, AdamWStep::bias_corrections(0.9, 0.95, t), 0.5))
                    .collect();
                let got = adamw_on(&h.dev, &init, gdt, copy, &steps);
                let mut tols = Vec::new();
                for _ in &steps {
                    state_tols(&mut tols, copy);
                }
                h.verify(
                    &what,
                    &got,
                    |c| adamw_on(c, &init, gdt, copy, &steps),
                    || {
                        let mut s = State::new(&init, gdt);
                        let mut w = Vec::new();
                        for (t, st) in steps.iter().enumerate() {
                            s.step(st);
                            s.push(&mut w, copy, 0, t + 1);
                        }
                        w
                    },
                    &tols,
                );
                if copy.is_some() {
                    let pairs: Vec<(String, String)> = (1..=steps.len())
                        .map(|t| (format!("t0 param step {t}"), format!("t0 copy step {t}")))
                        .collect();
                    copies_are_rounded_params(&what, &got, &pairs);
                }
            }
        }
    }
    if skipped_fp8 {
        skip(
            &format!("{CASE} (FP8 copies)"),
            &format!("{} has no FP8 support", h.dev.info().name),
        );
    }
    // The master weights must be f32.
    let d = &h.dev;
    let mut p16 = d.alloc(DType::BF16, 4).expect("alloc");
    let gr = d.alloc(DType::F32, 4).expect("alloc");
    let mut m = d.alloc(DType::F32, 4).expect("alloc");
    let mut v = d.alloc(DType::F32, 4).expect("alloc");
    let step = adamw_step(1e-3, 0.0, AdamWStep::bias_corrections(0.9, 0.95, 1), 1.0);
    let err = d.exec(AdamWUpdate {
        param: &mut p16,
        grad: &gr,
        m: &mut m,
        v: &mut v,
        step: &step,
        param_copy: None,
    });
    assert!(
        matches!(err, Err(DeviceError::DTypeMismatch { .. })),
        "{CASE}: a bf16 parameter gives {err:?}"
    );
}

/// `sum_squares` of `x` (dtype `dt`) into slots 0 and 2 of `[0.5, -1, 2]`.
fn sum_squares_on<E: Device>(e: &E, dt: DType, x: &[f32]) -> Vec<Tensor> {
    let xb = put(e, dt, x);
    let mut o = put(e, DType::F32, &[0.5, -1.0, 2.0]);
    for slot in [0usize, 2] {
        e.exec(SumSquares {
            x: &xb,
            out: &mut o,
            slot,
        })
        .expect("sum_squares");
    }
    vec![get(e, "out", &o)]
}

/// `sum_squares` of every float dtype and odd lengths accumulating into two slots of a buffer
/// with values (the slot between untouched) against the f64 sum, the same bits on a second run,
/// and a slot past the end refused.
pub fn sum_squares_matches_and_is_deterministic<D: Device>(h: &Harness<D>) {
    const CASE: &str = "sum_squares_matches_and_is_deterministic";
    let mut r = h.rng(CASE);
    for dt in FLOATS {
        for n in [1usize, 3, 4096, 100_003, 300_007] {
            let what = format!("{CASE}: {dt} n {n}");
            let x = r.vec(n, -2.0, 2.0);
            let got = sum_squares_on(&h.dev, dt, &x);
            h.verify(
                &what,
                &got,
                |c| sum_squares_on(c, dt, &x),
                || {
                    let s = reference::sum_squares(&rounded64(dt, &x));
                    vec![want("out", DType::F32, vec![0.5 + s, -1.0, 2.0 + s])]
                },
                &[Tol::REDUCTION],
            );
            let again = sum_squares_on(&h.dev, dt, &x);
            compare(
                &format!("{what}: deterministic"),
                &again[0],
                &got[0],
                Tol::Bits,
            );
        }
    }
    let x = h.dev.alloc(DType::F32, 4).expect("alloc");
    let mut o = h.dev.alloc(DType::F32, 2).expect("alloc");
    let err = h.dev.exec(SumSquares {
        x: &x,
        out: &mut o,
        slot: 2,
    });
    assert!(
        matches!(err, Err(DeviceError::Shape { .. })),
        "{CASE}: slot 2 of 2 gives {err:?}"
    );
}

/// The multi-tensor lengths: multiples of 4 and 8 and not, several 16384-element chunks, 1.
const MULTI_SIZES: [usize; 18] = [
    3, 7_000, 1, 40_001, 4096, 7, 16_385, 20_003, 5, 16_384, 32_771, 2, 8_191, 65_537, 12, 9,
    4_097, 31,
];

/// `sum_squares_many` (`many`) or one `sum_squares` per tensor into slot 1 of a buffer with
/// values.
fn sum_squares_many_on<E: Device>(
    e: &E,
    xs: &[(DType, Vec<f32>)],
    init: &[f32],
    many: bool,
) -> Vec<Tensor> {
    let bs: Vec<E::Buffer> = xs.iter().map(|(d, x)| put(e, *d, x)).collect();
    let mut o = put(e, DType::F32, init);
    if many {
        let refs: Vec<&E::Buffer> = bs.iter().collect();
        e.exec(SumSquaresMany {
            xs: &refs,
            out: &mut o,
            slot: 1,
        })
        .expect("sum_squares_many");
    } else {
        for b in &bs {
            e.exec(SumSquares {
                x: b,
                out: &mut o,
                slot: 1,
            })
            .expect("sum_squares");
        }
    }
    vec![get(e, "out", &o)]
}

/// `sum_squares_many` over tensors of odd lengths and every float dtype, accumulating into a
/// slot with a value, against one `sum_squares` per tensor on the same device (within a
/// reduction's rounding: the op may sum in another order) and against the oracle; on CUDA also
/// bit for bit against a host replay of its fixed reduction order.
pub fn sum_squares_many_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "sum_squares_many_matches_composition";
    let mut r = h.rng(CASE);
    let xs: Vec<(DType, Vec<f32>)> = MULTI_SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| (FLOATS[i % 3], r.vec(n, -0.5, 0.5)))
        .collect();
    let init = [
        r.uniform(-1.0, 1.0),
        r.uniform(0.0, 10.0),
        r.uniform(-1.0, 1.0),
    ];
    let got = sum_squares_many_on(&h.dev, &xs, &init, true);
    let plain = sum_squares_many_on(&h.dev, &xs, &init, false);
    h.same(CASE, &got, &plain, &[Tol::REDUCTION]);
    h.verify(
        CASE,
        &got,
        |c| sum_squares_many_on(c, &xs, &init, true),
        || {
            let s: f64 = xs
                .iter()
                .map(|(d, x)| reference::sum_squares(&rounded64(*d, x)))
                .sum();
            let w = vec![init[0] as f64, init[1] as f64 + s, init[2] as f64];
            vec![want("out", DType::F32, w)]
        },
        &[Tol::REDUCTION],
    );
    let again = sum_squares_many_on(&h.dev, &xs, &init, true);
    compare(
        &format!("{CASE}: deterministic"),
        &again[0],
        &got[0],
        Tol::Bits,
    );
    if h.backend() == "cuda" {
        let stored: Vec<Vec<f32>> = xs.iter().map(|(d, x)| rounded(*d, x)).collect();
        let model = sum_squares_many_model(&stored, init[1]);
        let g = got[0].f32()[1];
        assert_eq!(
            g.to_bits(),
            model.to_bits(),
            "{CASE}: CUDA's sum_squares_many gives {g}, its reduction order gives {model} (seed {})",
            crate::harness::base_seed()
        );
    }
}

/// The CUDA backend's sum_squares_many reduction replayed on the host, operation for operation:
/// chunks of 16384 elements per tensor; in each, thread t of 256 adds x² of elements t, t + 256,
/// ... by f64 FMAs; the block adds its 256 sums by warp butterflies, then the 8 warp sums by
/// another; sum_squares_finish adds the chunk sums the same way (thread t: chunks t, t + 256, ...)
/// and rounds `init + sum` to f32 once.
fn sum_squares_many_model(xs: &[Vec<f32>], init: f32) -> f32 {
    const CHUNK: usize = 1 << 14;
    const THREADS: usize = 256;
    fn butterfly(v: &mut [f64]) {
        for o in [16, 8, 4, 2, 1] {
            let prev = v.to_vec();
            for (l, x) in v.iter_mut().enumerate() {
                *x = prev[l] + prev[l ^ o];
            }
        }
    }
    fn block_sum(mut acc: Vec<f64>) -> f64 {
        for warp in acc.chunks_mut(32) {
            butterfly(warp);
        }
        let mut lanes = vec![0.0f64; 32];
        for (w, lane) in lanes.iter_mut().take(THREADS / 32).enumerate() {
            *lane = acc[w * 32];
        }
        butterfly(&mut lanes);
        lanes[0]
    }
    let mut partials = Vec::new();
    for x in xs {
        for chunk in x.chunks(CHUNK) {
            let mut acc = vec![0.0f64; THREADS];
            for (j, &e) in chunk.iter().enumerate() {
                let v = e as f64;
                acc[j % THREADS] = v.mul_add(v, acc[j % THREADS]);
            }
            partials.push(block_sum(acc));
        }
    }
    let mut acc = vec![0.0f64; THREADS];
    for (i, &p) in partials.iter().enumerate() {
        acc[i % THREADS] += p;
    }
    (init as f64 + block_sum(acc)) as f32
}

/// One tensor of the multi-tensor update: gradient dtype, working copy, weight decay.
#[derive(Clone, Copy, Debug)]
struct Spec {
    grad: DType,
    copy: Option<DType>,
    wd: f32,
}

/// The per-step values (lr, bias corrections) of `t` steps.
fn step_scalars(steps: u64) -> Vec<[f32; 3]> {
    (1..=steps)
        .map(|t| {
            let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, t);
            [1e-3, bc1, bc2]
        })
        .collect()
}

/// The sum of squares of the gradients (`sum_squares_many` into slot 0 of the scalars), then
/// per step the step's values in the scalars and `adamw_clipped` (or, with `per_tensor`, one
/// `adamw` per tensor with the step `clip_grad_scale` derives from the scalars read back).
fn clipped_on<E: Device>(
    e: &E,
    specs: &[Spec],
    inits: &[Init],
    clip: &AdamWClipStep,
    steps: &[[f32; 3]],
    per_tensor: bool,
) -> Vec<Tensor> {
    let mut bs: Vec<Bufs<E::Buffer>> = specs
        .iter()
        .zip(inits)
        .map(|(s, i)| bufs(e, i, s.grad, s.copy))
        .collect();
    let wds: Vec<f32> = specs.iter().map(|s| s.wd).collect();
    let mut scalars = put(e, DType::F32, &[0.0; ADAMW_SCALARS]);
    {
        let grads: Vec<&E::Buffer> = bs.iter().map(|b| &b.g).collect();
        e.exec(SumSquaresMany {
            xs: &grads,
            out: &mut scalars,
            slot: 0,
        })
        .expect("sum_squares_many");
    }
    let mut out = vec![get(e, "norm_sq", &scalars)];
    for (t, sc) in steps.iter().enumerate() {
        e.upload_bytes(&encode(DType::F32, sc), &mut scalars, 1)
            .expect("upload");
        if per_tensor {
            let v = get(e, "scalars", &scalars).f32();
            let grad_scale = clip_grad_scale(v[0], clip.max_norm, clip.loss_scale);
            for b in bs.iter_mut().zip(&wds) {
                let (b, &wd) = b;
                let s = AdamWStep {
                    lr: v[1],
                    beta1: clip.beta1,
                    beta2: clip.beta2,
                    eps: clip.eps,
                    weight_decay: wd,
                    bias_correction1: v[2],
                    bias_correction2: v[3],
                    grad_scale,
                };
                e.exec(AdamWUpdate {
                    param: &mut b.p,
                    grad: &b.g,
                    m: &mut b.m,
                    v: &mut b.v,
                    step: &s,
                    param_copy: b.c.as_mut(),
                })
                .expect("adamw");
            }
        } else {
            e.exec(AdamWClipped {
                tensors: &mut adamw_tensors(&mut bs, &wds),
                step: clip,
                scalars: &scalars,
            })
            .expect("adamw_clipped");
        }
        for (i, b) in bs.iter().enumerate() {
            push_state(e, &mut out, b, i, t + 1);
        }
    }
    out
}

/// `adamw_clipped` over tensors of every gradient dtype with every kind of working copy (odd
/// lengths, several chunks), weight decay on every other one, the sum of squares from
/// `sum_squares_many`, two steps; clipping active and inactive, off, and with a loss scale
/// (active and inactive): bit for bit one `adamw` per tensor with the `AdamWStep` that
/// `clip_grad_scale` derives from the scalars, and against the oracle (the f64 reference with
/// the clipping factor computed in f64); the copies are the rounded parameters.
pub fn adamw_clipped_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "adamw_clipped_matches_composition";
    let mut r = h.rng(CASE);
    let fp8 = h.dev.info().supports_fp8;
    let copies = [
        None,
        Some(DType::BF16),
        Some(DType::F16),
        Some(if fp8 { DType::F8E4M3 } else { DType::BF16 }),
        Some(DType::F32),
        Some(if fp8 { DType::F8E5M2Fnuz } else { DType::F16 }),
    ];
    // Tensor i: grad dtype FLOATS[i / 6], copy copies[i % 6].
    let specs: Vec<Spec> = MULTI_SIZES
        .iter()
        .enumerate()
        .map(|(i, _)| Spec {
            grad: FLOATS[i / copies.len()],
            copy: copies[i % copies.len()],
            wd: if i % 2 == 0 { 0.1 } else { 0.0 },
        })
        .collect();
    let steps = step_scalars(2);
    for (max_norm, loss_scale) in [
        (1.0f32, 1.0f32),
        (1e6, 1.0),
        (0.0, 1.0),
        (0.5, 1024.0),
        (0.02, 1024.0),
    ] {
        let what = format!("{CASE}: max_norm {max_norm} loss_scale {loss_scale}");
        let inits: Vec<Init> = MULTI_SIZES
            .iter()
            .map(|&n| Init::draw(&mut r, n, 0.5))
            .collect();
        let clip = AdamWClipStep {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            max_norm,
            loss_scale,
        };
        let got = clipped_on(&h.dev, &specs, &inits, &clip, &steps, false);
        let plain = clipped_on(&h.dev, &specs, &inits, &clip, &steps, true);
        let bits = vec![Tol::Bits; got.len()];
        h.same(&what, &got, &plain, &bits);
        let mut tols = vec![Tol::REDUCTION];
        for _ in &steps {
            for s in &specs {
                state_tols(&mut tols, s.copy);
            }
        }
        h.verify(
            &what,
            &got,
            |c| clipped_on(c, &specs, &inits, &clip, &steps, false),
            || {
                let mut st = State::all(&inits, specs.iter().map(|s| s.grad));
                let ns: f64 = st.iter().map(|s| reference::sum_squares(&s.g)).sum();
                let gs = reference::clip_grad_scale(ns, max_norm as f64, loss_scale as f64);
                let mut w = vec![want("norm_sq", DType::F32, vec![ns, 0.0, 0.0, 0.0])];
                for (t, sc) in steps.iter().enumerate() {
                    for (i, (s, spec)) in st.iter_mut().zip(&specs).enumerate() {
                        s.step(&adamw_step(sc[0], spec.wd, (sc[1], sc[2]), gs as f32));
                        s.push(&mut w, spec.copy, i, t + 1);
                    }
                }
                w
            },
            &tols,
        );
        let pairs: Vec<(String, String)> = (1..=steps.len())
            .flat_map(|t| {
                specs
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.copy.is_some())
                    .map(move |(i, _)| {
                        (
                            format!("t{i} param step {t}"),
                            format!("t{i} copy step {t}"),
                        )
                    })
            })
            .collect();
        copies_are_rounded_params(&what, &got, &pairs);
    }
}

/// One tensor of the `adamw_clipped_fp8` case: shape, gradient dtype, codes (if any), whether
/// the codes are also wanted transposed, whether the tensor has a bf16 working copy.
#[derive(Clone, Copy, Debug)]
struct Fp8Case {
    rows: usize,
    cols: usize,
    grad: DType,
    codes: Option<DType>,
    transposed: bool,
    copy: bool,
}

/// The cases of the CUDA fused kernel's test: several chunks and tiles with partial ones, one
/// tile, a wide matrix, every FP8 format, f32/bf16/f16 gradients, codes without a transposed
/// copy, a weight without codes (a bias), transposed codes with cols not a multiple of 8, and a
/// weight with a bf16 working copy.
fn fp8_cases() -> Vec<Fp8Case> {
    let case = |rows, cols, grad, codes, transposed, copy| Fp8Case {
        rows,
        cols,
        grad,
        codes,
        transposed,
        copy,
    };
    let (bf, e4, e5) = (DType::BF16, Some(DType::F8E4M3), Some(DType::F8E5M2));
    vec![
        case(200, 136, bf, e4, true, false),
        case(64, 64, bf, Some(DType::F8E4M3Fnuz), true, false),
        case(1, 100, bf, None, false, false),
        case(48, 20, bf, e4, true, false),
        case(24, 1040, bf, e4, true, false),
        case(32, 64, DType::F32, e4, true, false),
        case(16, 8, bf, e5, true, false),
        case(3, 7000, bf, e4, false, false),
        case(5, 7, DType::F16, Some(DType::F8E5M2Fnuz), false, false),
        case(64, 64, bf, e4, true, true),
    ]
}

/// The slot of case `i`'s codes.
fn fp8_slot(i: usize) -> usize {
    3 * i + 1
}

/// The FP8 update's buffers: the tensors, the codes (and transposed codes) per case, scale,
/// amax and scalars.
struct Fp8Bufs<B> {
    t: Vec<Bufs<B>>,
    codes: Vec<Option<(B, B)>>,
    scale: B,
    amax: B,
    scalars: B,
}

fn fp8_bufs<E: Device>(
    e: &E,
    cases: &[Fp8Case],
    inits: &[Init],
    scale: &[f32],
    amax: &[f32],
) -> Fp8Bufs<E::Buffer> {
    Fp8Bufs {
        t: cases
            .iter()
            .zip(inits)
            .map(|(c, i)| bufs(e, i, c.grad, c.copy.then_some(DType::BF16)))
            .collect(),
        codes: cases
            .iter()
            .map(|c| {
                c.codes
                    .map(|d| (nan(e, d, c.rows * c.cols), nan(e, d, c.rows * c.cols)))
            })
            .collect(),
        scale: put(e, DType::F32, scale),
        amax: put(e, DType::F32, amax),
        scalars: put(e, DType::F32, &[0.0; ADAMW_SCALARS]),
    }
}

/// The outputs of the cases with codes.
fn fp8_outs<'a, B>(cases: &[Fp8Case], codes: &'a mut [Option<(B, B)>]) -> Vec<AdamWFp8Out<'a, B>> {
    codes
        .iter_mut()
        .enumerate()
        .filter_map(|(i, c)| c.as_mut().map(|c| (i, c)))
        .map(|(i, (d, dt))| AdamWFp8Out {
            tensor: i,
            dst: d,
            dst_t: cases[i].transposed.then_some(dt),
            rows: cases[i].rows,
            cols: cases[i].cols,
            slot: fp8_slot(i),
        })
        .collect()
}

/// The gradient-norm square the FP8 case's scalars hold (clipping active with max_norm 1).
const FP8_NORM_SQ: f32 = 37.5;

fn fp8_clip() -> AdamWClipStep {
    AdamWClipStep {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        max_norm: 1.0,
        loss_scale: 1.0,
    }
}

/// Steps of `adamw_clipped_fp8` (or, with `composed`, `adamw_clipped` followed by
/// `quantize_fp8_many` of the outputs' jobs); after each, every tensor's state, the codes and
/// the amax.
fn clipped_fp8_on<E: Device>(
    e: &E,
    cases: &[Fp8Case],
    inits: &[Init],
    scale: &[f32],
    amax0: &[f32],
    steps: &[[f32; 3]],
    composed: bool,
) -> Vec<Tensor> {
    let mut b = fp8_bufs(e, cases, inits, scale, amax0);
    let wds: Vec<f32> = (0..cases.len())
        .map(|i| if i % 2 == 0 { 0.1 } else { 0.0 })
        .collect();
    let clip = fp8_clip();
    let mut out = Vec::new();
    for (k, sc) in steps.iter().enumerate() {
        let s = [FP8_NORM_SQ, sc[0], sc[1], sc[2]];
        e.upload_bytes(&encode(DType::F32, &s), &mut b.scalars, 0)
            .expect("upload");
        let mut tensors = adamw_tensors(&mut b.t, &wds);
        let mut outs = fp8_outs(cases, &mut b.codes);
        if composed {
            e.exec(AdamWClipped {
                tensors: &mut tensors,
                step: &clip,
                scalars: &b.scalars,
            })
            .expect("adamw_clipped");
            let mut jobs: Vec<Fp8QuantJob<'_, E::Buffer>> = outs
                .iter_mut()
                .map(|o| {
                    let t = &tensors[o.tensor];
                    o.job(t)
                })
                .collect();
            e.exec(QuantizeFp8Many {
                jobs: &mut jobs,
                scale: &b.scale,
                amax: &mut b.amax,
            })
            .expect("quantize_fp8_many");
        } else {
            e.exec(AdamWClippedFp8 {
                tensors: &mut tensors,
                step: &clip,
                scalars: &b.scalars,
                outs: &mut outs,
                scale: &b.scale,
                amax: &mut b.amax,
            })
            .expect("adamw_clipped_fp8");
        }
        drop(outs);
        drop(tensors);
        let t = k + 1;
        for (i, tb) in b.t.iter().enumerate() {
            push_state(e, &mut out, tb, i, t);
        }
        for (i, c) in b.codes.iter().enumerate() {
            if let Some((d, dt)) = c {
                out.push(get(e, &format!("t{i} codes step {t}"), d));
                if cases[i].transposed {
                    out.push(get(e, &format!("t{i} codes_t step {t}"), dt));
                }
            }
        }
        out.push(get(e, &format!("amax step {t}"), &b.amax));
    }
    out
}

/// `adamw_clipped_fp8` over five steps with clipping active, against `adamw_clipped` followed
/// by `quantize_fp8_many` of the outputs' jobs on the same device (weights, moments, copies,
/// codes, transposed codes and amax bit for bit); against the oracle (state element-wise, codes
/// within a code step); the codes and amax bit for bit the host quantisation of the device's own
/// updated weights (their copy where they have one); and outputs `check_adamw_fp8_outs` refuses
/// rejected before anything changes.
pub fn adamw_clipped_fp8_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "adamw_clipped_fp8_matches_composition";
    if !h.dev.info().supports_fp8 {
        skip(CASE, &format!("{} has no FP8 support", h.dev.info().name));
        return;
    }
    let mut r = h.rng(CASE);
    let cases = fp8_cases();
    let inits: Vec<Init> = cases
        .iter()
        .map(|c| Init::draw(&mut r, c.rows * c.cols, 1.0))
        .collect();
    let slots = 3 * cases.len();
    let scale: Vec<f32> = (0..slots).map(|s| 0.5 + 37.0 * (s % 5) as f32).collect();
    let amax0: Vec<f32> = (0..slots)
        .map(|s| if s % 2 == 0 { 0.0 } else { r.uniform(0.0, 0.6) })
        .collect();
    let steps = step_scalars(5);
    let got = clipped_fp8_on(&h.dev, &cases, &inits, &scale, &amax0, &steps, false);
    let plain = clipped_fp8_on(&h.dev, &cases, &inits, &scale, &amax0, &steps, true);
    h.same(CASE, &got, &plain, &vec![Tol::Bits; got.len()]);

    // The oracle.
    let mut tols = Vec::new();
    for _ in &steps {
        for c in &cases {
            state_tols(&mut tols, c.copy.then_some(DType::BF16));
        }
        for c in &cases {
            if let Some(d) = c.codes {
                tols.push(super::fp8::step_tol(d));
                if c.transposed {
                    tols.push(super::fp8::step_tol(d));
                }
            }
        }
        tols.push(Tol::rel(1e-2));
    }
    h.verify(
        CASE,
        &got,
        |c| clipped_fp8_on(c, &cases, &inits, &scale, &amax0, &steps, false),
        || {
            let mut st = State::all(&inits, cases.iter().map(|c| c.grad));
            let gs = reference::clip_grad_scale(FP8_NORM_SQ as f64, 1.0, 1.0);
            let mut amax = amax0.clone();
            let mut w = Vec::new();
            for (k, sc) in steps.iter().enumerate() {
                let t = k + 1;
                for (i, s) in st.iter_mut().enumerate() {
                    let wd = if i % 2 == 0 { 0.1 } else { 0.0 };
                    s.step(&adamw_step(sc[0], wd, (sc[1], sc[2]), gs as f32));
                    s.push(&mut w, cases[i].copy.then_some(DType::BF16), i, t);
                }
                for (i, c) in cases.iter().enumerate() {
                    let Some(d) = c.codes else { continue };
                    let p32: Vec<f32> = st[i].p.iter().map(|&x| x as f32).collect();
                    let wv = if c.copy {
                        rounded(DType::BF16, &p32)
                    } else {
                        p32
                    };
                    let slot = fp8_slot(i);
                    let codes = reference::fp8_codes(&wv, scale[slot], d);
                    w.push(want(
                        &format!("t{i} codes step {t}"),
                        d,
                        reference::fp8_values(&codes, d),
                    ));
                    if c.transposed {
                        let ct = reference::transpose(&codes, c.rows, c.cols);
                        w.push(want(
                            &format!("t{i} codes_t step {t}"),
                            d,
                            reference::fp8_values(&ct, d),
                        ));
                    }
                    amax[slot] = reference::fp8_amax(amax[slot], &wv);
                }
                w.push(want(
                    &format!("amax step {t}"),
                    DType::F32,
                    amax.iter().map(|&x| x as f64).collect(),
                ));
            }
            w
        },
        &tols,
    );

    // The codes and amax are the host quantisation of the device's own updated weights.
    let mut amax = amax0.clone();
    for t in 1..=steps.len() {
        for (i, c) in cases.iter().enumerate() {
            let Some(d) = c.codes else { continue };
            let wname = if c.copy {
                format!("t{i} copy step {t}")
            } else {
                format!("t{i} param step {t}")
            };
            let wv = find(&got, &wname).f32();
            let slot = fp8_slot(i);
            let codes = reference::fp8_codes(&wv, scale[slot], d);
            let what = format!("{CASE}: t{i} step {t} codes of the device's weights");
            let name = format!("t{i} codes step {t}");
            let want_t = |name: &str, bytes: Vec<u8>| Tensor {
                name: name.to_string(),
                dtype: d,
                bytes,
            };
            compare(
                &what,
                find(&got, &name),
                &want_t(&name, codes.clone()),
                Tol::Bits,
            );
            if c.transposed {
                let name = format!("t{i} codes_t step {t}");
                let ct = reference::transpose(&codes, c.rows, c.cols);
                compare(&what, find(&got, &name), &want_t(&name, ct), Tol::Bits);
            }
            amax[slot] = reference::fp8_amax(amax[slot], &wv);
        }
        let name = format!("amax step {t}");
        let wa = Tensor::encoded(&name, DType::F32, &amax);
        compare(
            &format!("{CASE}: step {t} amax of the device's weights"),
            find(&got, &name),
            &wa,
            Tol::Bits,
        );
    }

    bad_outs_are_refused_first(h, &cases[..2], &inits[..2]);
}

/// Outputs `check_adamw_fp8_outs` refuses (a tensor index past the end, codes of the wrong
/// length, codes of a float dtype, transposed codes of another FP8 dtype, a slot past the end)
/// give its error and change nothing: the valid output before the bad one is not written and
/// the update does not run.
fn bad_outs_are_refused_first<D: Device>(h: &Harness<D>, cases: &[Fp8Case], inits: &[Init]) {
    const CASE: &str = "adamw_clipped_fp8_matches_composition";
    let e = &h.dev;
    let slots = 3 * cases.len();
    let scale: Vec<f32> = (0..slots).map(|s| 1.0 + s as f32).collect();
    let mut b = fp8_bufs(e, cases, inits, &scale, &vec![0.0; slots]);
    let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, 1);
    e.upload_bytes(
        &encode(DType::F32, &[FP8_NORM_SQ, 1e-3, bc1, bc2]),
        &mut b.scalars,
        0,
    )
    .expect("upload");
    let snapshot = |b: &Fp8Bufs<D::Buffer>| -> Vec<Vec<u8>> {
        let mut all: Vec<&D::Buffer> = Vec::new();
        for t in &b.t {
            all.extend([&t.p, &t.m, &t.v]);
            all.extend(t.c.as_ref());
        }
        for (d, dt) in b.codes.iter().flatten() {
            all.extend([d, dt]);
        }
        all.push(&b.amax);
        all.iter()
            .map(|x| e.download_bytes(x, 0, x.len()).expect("download"))
            .collect()
    };
    let before = snapshot(&b);
    let wds = [0.1f32, 0.0];
    let (rows, cols) = (cases[1].rows, cases[1].cols);
    let n = rows * cols;
    let fmt = cases[1].codes.expect("codes");
    let other_fmt = if fmt == DType::F8E5M2 {
        DType::F8E4M3
    } else {
        DType::F8E5M2
    };
    #[derive(Debug)]
    enum Bad {
        Tensor,
        Short,
        Float,
        TransposedDtype,
        Slot,
    }
    for bad in [
        Bad::Tensor,
        Bad::Short,
        Bad::Float,
        Bad::TransposedDtype,
        Bad::Slot,
    ] {
        let mut dst = match bad {
            Bad::Short => e.alloc(fmt, n - 1),
            Bad::Float => e.alloc(DType::BF16, n),
            _ => e.alloc(fmt, n),
        }
        .expect("alloc");
        let mut dst_t = match bad {
            Bad::TransposedDtype => e.alloc(other_fmt, n),
            _ => e.alloc(fmt, n),
        }
        .expect("alloc");
        let Fp8Bufs {
            t,
            codes,
            scale,
            amax,
            scalars,
        } = &mut b;
        let mut tensors = adamw_tensors(t, &wds);
        let mut outs = fp8_outs(&cases[..1], &mut codes[..1]);
        outs.push(AdamWFp8Out {
            tensor: if matches!(bad, Bad::Tensor) { 2 } else { 1 },
            dst: &mut dst,
            dst_t: Some(&mut dst_t),
            rows,
            cols,
            slot: if matches!(bad, Bad::Slot) { slots } else { 4 },
        });
        let err = e
            .exec(AdamWClippedFp8 {
                tensors: &mut tensors,
                step: &fp8_clip(),
                scalars,
                outs: &mut outs,
                scale,
                amax,
            })
            .expect_err("a bad output is refused");
        let kind_ok = match bad {
            Bad::Float => matches!(err, DeviceError::Unsupported { .. }),
            Bad::TransposedDtype => matches!(err, DeviceError::DTypeMismatch { .. }),
            _ => matches!(err, DeviceError::Shape { .. }),
        };
        assert!(kind_ok, "{CASE}: bad output {bad:?} gives {err}");
        drop(outs);
        drop(tensors);
        assert!(
            snapshot(&b) == before,
            "{CASE}: bad output {bad:?} ({err}) was refused after something changed"
        );
    }
}

/// The multi-pass reductions (`sum_squares`, and column sums through `bias_backward`) run from
/// eight threads at once on the one shared device give, call for call, the bits the same calls
/// give one at a time: a device is `Sync`, and an op's passes must not meet another thread's
/// (the HIP backend's shared scratch area did, found on the HIP-on-CUDA platform).
pub fn reductions_from_many_threads_are_exact<D: Device>(h: &Harness<D>) {
    const CASE: &str = "reductions_from_many_threads_are_exact";
    const THREADS: usize = 8;
    const ROUNDS: usize = 12;
    let mut r = h.rng(CASE);
    // Per thread: a sum_squares input and a bias_backward input of its own sizes.
    let inputs: Vec<(Vec<f32>, usize, usize, Vec<f32>)> = (0..THREADS)
        .map(|t| {
            let n = 3 + 17_000 * t + r.below(5_000);
            let (rows, c) = (1 + 300 * t + r.below(200), 8 + 24 * t);
            (r.vec(n, -2.0, 2.0), rows, c, r.vec(rows * c, -1.0, 1.0))
        })
        .collect();
    let run = |e: &D, t: usize| -> (Vec<u8>, Vec<u8>) {
        let (x, rows, c, d) = &inputs[t];
        let xb = put(e, DType::F32, x);
        let mut o = put(e, DType::F32, &[0.25]);
        e.exec(SumSquares {
            x: &xb,
            out: &mut o,
            slot: 0,
        })
        .expect("sum_squares");
        let db = put(e, DType::F32, d);
        let mut dbias = put(e, DType::F32, &vec![0.5; *c]);
        e.exec(BiasBackward {
            dout: &db,
            dbias: &mut dbias,
            rows: *rows,
            c: *c,
        })
        .expect("bias_backward");
        (get(e, "out", &o).bytes, get(e, "dbias", &dbias).bytes)
    };
    let alone: Vec<_> = (0..THREADS).map(|t| run(&h.dev, t)).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (dev, run, alone) = (&h.dev, &run, &alone);
                s.spawn(move || {
                    for round in 0..ROUNDS {
                        let got = run(dev, t);
                        assert!(
                            got.0 == alone[t].0,
                            "{CASE}: thread {t} round {round}: sum_squares differs from the same call alone"
                        );
                        assert!(
                            got.1 == alone[t].1,
                            "{CASE}: thread {t} round {round}: bias_backward differs from the same call alone"
                        );
                    }
                })
            })
            .collect();
        for hd in handles {
            if let Err(e) = hd.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}
