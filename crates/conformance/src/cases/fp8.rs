//! FP8 delayed scaling: quantisation (plain, multi-matrix, fused with the GELU, its backward and
//! the LayerNorm), the FP8 GEMMs and their epilogues, and the scaling update.

use super::*;
use crate::reference;
use duet_device::{
    Add, BiasAdd, BiasBackward, DType, Device, DeviceError, Epilogue, Fp8Format, Fp8QuantJob,
    Fp8ScalingUpdate, GeluBackward, GeluForward, GemmDesc, GemmFp8, GemmFp8Epilogue,
    LayerNormForward, LayerNormForwardFp8, QuantizeFp8, QuantizeFp8Gelu, QuantizeFp8Grad,
    QuantizeFp8Many, fp8_history_step, fp8_scale_inv,
};

/// A tolerance for results the oracle may round one step apart: FP8 codes compared as values
/// (one code step is 2⁻³ relative for E4M3, 2⁻² for E5M2), 16-bit values one rounding, f32
/// element-wise.
pub(crate) fn step_tol(dt: DType) -> Tol {
    Tol::Rel {
        f32: 1e-5,
        f16: 5e-3,
        bf16: 1e-2,
        fp8: if matches!(dt, DType::F8E5M2 | DType::F8E5M2Fnuz) {
            0.26
        } else {
            0.13
        },
    }
}

/// Whether the backend quantises to FP8 at all; prints the skip when not.
fn fp8_or_skip<D: Device>(h: &Harness<D>, case: &str) -> bool {
    let info = h.dev.info();
    if !info.supports_fp8 {
        skip(
            case,
            &format!("{} ({}) has no FP8 support", info.name, info.arch),
        );
    }
    info.supports_fp8
}

/// Whether `gemm_fp8_epilogue` runs natively for C of `dt` (the one place to change when the
/// capability moves).
fn fp8_epilogue_native<D: Device>(d: &D, dt: DType) -> bool {
    d.capabilities().fp8_gemm_epilogue(dt)
}

/// The wanted FP8 output holding `codes` (as the values they decode to: the harness encodes
/// them back, which gives the same, canonical codes).
fn codes_want(name: &str, dt: DType, codes: &[u8]) -> Want {
    want(name, dt, reference::fp8_values(codes, dt))
}

/// The codes of `got` (outputs named `codes`/`codes_t`) that the oracle's `wants` allow a code
/// step away: at most 2% of them (5% on a GPU, whose GELU or LayerNorm rounds differently from
/// the f64 oracle more often), and at least one, may differ at all.
#[track_caller]
fn codes_mostly_exact<D: Device>(h: &Harness<D>, what: &str, got: &[Tensor], wants: &[Want]) {
    let pct = if h.is_reference() { 2 } else { 5 };
    for g in got.iter().filter(|g| g.name.starts_with("codes")) {
        let w = wants
            .iter()
            .find(|w| w.name == g.name)
            .expect("a wanted output");
        let w32: Vec<f32> = w.values.iter().map(|&x| x as f32).collect();
        let want = encode(w.dtype, &w32);
        let differ = g.bytes.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert!(
            differ * 100 <= pct * g.bytes.len().max(100 / pct),
            "{what} {}: {differ} of {} codes differ from the f64 oracle's (at most {pct}%; seed {})",
            g.name,
            g.bytes.len(),
            crate::harness::base_seed()
        );
    }
}

/// Values with a wide dynamic range (2⁻¹² to 2¹² in magnitude), some exact zeros of both signs,
/// and values past every FP8 maximum.
fn wide(r: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 97 {
            0 => 0.0,
            1 => -0.0,
            3 => 1e5,
            4 => -7e4,
            _ => {
                let u = r.uniform(0.0, 1.0) as f64;
                let s = r.uniform(-0.5, 0.5) as f64;
                (s * 2f64.powf(u * 24.0 - 12.0)) as f32
            }
        })
        .collect()
}

/// Values that probe every encoder branch, for all four formats: each finite code's value, the
/// exact midpoints between neighbouring codes (ties) and one f32 ulp either side, values at and
/// past each maximum, FP8 subnormals and values that round to zero, f32 subnormals, both signs,
/// NaN of both signs; with `finite` false also ±∞ and ±f32::MAX.
fn specials(finite: bool) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::new();
    for f in FP8S {
        let f = Fp8Format::of(f).expect("fp8");
        let mut vals: Vec<f32> = (0..=0x7fu8)
            .map(|c| f.decode(c))
            .filter(|v| v.is_finite())
            .collect();
        vals.sort_by(f32::total_cmp);
        vals.dedup();
        for w in vals.windows(2) {
            let mid = ((w[0] as f64 + w[1] as f64) / 2.0) as f32;
            v.extend([w[0], mid, f32::from_bits(mid.to_bits() + 1)]);
            if mid > 0.0 {
                v.push(f32::from_bits(mid.to_bits() - 1));
            }
        }
        let top = *vals.last().expect("codes");
        v.extend([top, top * 1.01, top * 1.0625, top * 1.125, top * 2.0]);
    }
    v.extend([
        0.0, 464.0, 465.0, 480.0, 61440.0, 61439.0, 1e30, 1e-40, 1e-45, 1e-30, 3.0e-3,
    ]);
    if !finite {
        v.extend([f32::INFINITY, f32::MAX]);
    }
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v.extend([
        f32::NAN,
        f32::from_bits(0xffc0_0000),
        f32::from_bits(0x7f80_0001),
    ]);
    v
}

/// Every other element a special value (from a random starting point of the list), the rest
/// [`wide`] values.
fn mixed(r: &mut Rng, n: usize, finite: bool) -> Vec<f32> {
    let sp = specials(finite);
    let base = wide(r, n);
    let start = r.below(sp.len());
    base.iter()
        .enumerate()
        .map(|(i, &x)| {
            if i % 2 == 0 {
                sp[(i / 2 + start) % sp.len()]
            } else {
                x
            }
        })
        .collect()
}

/// One point of the quantisation grids of [`for_each_quant_point`].
#[derive(Clone, Copy)]
struct QuantPoint<'a> {
    rows: usize,
    cols: usize,
    finite: bool,
    /// The input ([`mixed`] values) and the values it takes stored as `src`.
    x: &'a [f32],
    stored: &'a [f32],
    src: DType,
    fmt: DType,
    transposed: bool,
    scale: f32,
}

impl QuantPoint<'_> {
    fn what(&self, case: &str) -> String {
        let QuantPoint {
            rows,
            cols,
            finite,
            src,
            fmt,
            transposed,
            scale,
            ..
        } = *self;
        format!(
            "{case}: {rows}x{cols} {src} -> {fmt} finite {finite} scale {scale} transposed \
             {transposed}"
        )
    }
}

/// Runs `f` over every shape of `shapes` × finite or not ([`mixed`] inputs, one draw each) ×
/// every source dtype × every FP8 dtype × with and without the transposed copy × scales 1 and
/// 37.25.
fn for_each_quant_point(r: &mut Rng, shapes: &[(usize, usize)], mut f: impl FnMut(&QuantPoint)) {
    for &(rows, cols) in shapes {
        for finite in [true, false] {
            let x = mixed(r, rows * cols, finite);
            for src in FLOATS {
                let stored = rounded(src, &x);
                for fmt in FP8S {
                    for transposed in [false, true] {
                        for scale in [1.0f32, 37.25] {
                            f(&QuantPoint {
                                rows,
                                cols,
                                finite,
                                x: &x,
                                stored: &stored,
                                src,
                                fmt,
                                transposed,
                                scale,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// The scale buffer of the quantisation cases (the case's scale in slot 1) and the amax buffer
/// it starts from (slot 1 holds a prior maximum; the others must stay untouched).
fn scales(scale: f32) -> [f32; 3] {
    [0.5, scale, 3.0e-3]
}
const AMAX0: [f32; 3] = [0.0, 2.0, 0.0];

/// The codes (and transposed codes) and amax the quantisation of `xs` (already stored values)
/// into slot 1 gives, from the host codec.
fn quantize_wants(
    xs: &[f32],
    dst: DType,
    rows: usize,
    cols: usize,
    transposed: bool,
    scale: f32,
    amax0: &[f32],
) -> Vec<Want> {
    let codes = reference::fp8_codes(xs, scale, dst);
    let mut w = vec![codes_want("codes", dst, &codes)];
    if transposed {
        w.push(codes_want(
            "codes_t",
            dst,
            &reference::transpose(&codes, rows, cols),
        ));
    }
    let mut a: Vec<f64> = amax0.iter().map(|&x| x as f64).collect();
    a[1] = reference::fp8_amax(amax0[1], xs) as f64;
    w.push(want("amax", DType::F32, a));
    w
}

/// The tolerances of [`quantize_wants`]' outputs: `codes` for the codes, `amax` for the amax.
fn quantize_tols(transposed: bool, codes: Tol, amax: Tol) -> Vec<Tol> {
    let mut t = vec![codes];
    if transposed {
        t.push(codes);
    }
    t.push(amax);
    t
}

/// The outputs of a quantisation into slot 1: codes, transposed codes (when wanted), the scale
/// buffer of [`scales`] and the amax.
struct QuantBufs<B> {
    dst: B,
    dt: Option<B>,
    scale: B,
    amax: B,
}

impl<B> QuantBufs<B> {
    /// NaN-filled codes of `fmt` for `n` elements, the scale `scale` in slot 1, amax `amax0`.
    fn new<E: Device<Buffer = B>>(
        e: &E,
        fmt: DType,
        n: usize,
        transposed: bool,
        scale: f32,
        amax0: &[f32],
    ) -> Self {
        QuantBufs {
            dst: nan(e, fmt, n),
            dt: transposed.then(|| nan(e, fmt, n)),
            scale: put(e, DType::F32, &scales(scale)),
            amax: put(e, DType::F32, amax0),
        }
    }

    /// `quantize_fp8` of the `rows × cols` `src` into these outputs.
    fn quantize<E: Device<Buffer = B>>(&mut self, e: &E, src: &B, rows: usize, cols: usize) {
        e.exec(QuantizeFp8 {
            src,
            dst: &mut self.dst,
            dst_t: self.dt.as_mut(),
            rows,
            cols,
            scale: &self.scale,
            amax: &mut self.amax,
            slot: 1,
        })
        .expect("quantize_fp8");
    }

    /// Downloads the codes (and transposed codes) and the amax.
    fn outs<E: Device<Buffer = B>>(&self, e: &E) -> Vec<Tensor> {
        let mut out = vec![get(e, "codes", &self.dst)];
        if let Some(t) = &self.dt {
            out.push(get(e, "codes_t", t));
        }
        out.push(get(e, "amax", &self.amax));
        out
    }
}

/// One `quantize_fp8` of `x` (stored as `src`) into slot 1.
#[allow(clippy::too_many_arguments)]
fn quantize_on<E: Device>(
    e: &E,
    x: &[f32],
    src: DType,
    dst: DType,
    rows: usize,
    cols: usize,
    transposed: bool,
    scale: f32,
) -> Vec<Tensor> {
    let mut q = QuantBufs::new(e, dst, rows * cols, transposed, scale, &AMAX0);
    q.quantize(e, &put(e, src, x), rows, cols);
    q.outs(e)
}

/// `quantize_fp8` from every source dtype into every FP8 dtype, with and without the transposed
/// copy, odd shapes, special values (ties, saturation, subnormals, NaN, ±∞), two scales: codes
/// bit for bit the host codec's of `x · scale`, the amax bit for bit `max(prior, max |x|)`
/// ignoring NaN (other slots untouched), the transposed codes the transpose; and a hand-checked
/// table of codes (which guards the host codec too).
pub fn quantize_fp8_codes_amax_transpose<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_codes_amax_transpose";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let shapes = [
        (37, 70),
        (130, 33),
        (1, 1000),
        (64, 13),
        (13, 64),
        (72, 8),
        (8, 1),
        (1, 1),
        (64, 64),
    ];
    for_each_quant_point(&mut r, &shapes, |p| {
        let QuantPoint {
            rows,
            cols,
            x,
            src,
            fmt,
            transposed,
            scale,
            ..
        } = *p;
        let what = p.what(CASE);
        let got = quantize_on(&h.dev, x, src, fmt, rows, cols, transposed, scale);
        h.verify(
            &what,
            &got,
            |c| quantize_on(c, x, src, fmt, rows, cols, transposed, scale),
            || quantize_wants(p.stored, fmt, rows, cols, transposed, scale, &AMAX0),
            &quantize_tols(transposed, Tol::Bits, Tol::Bits),
        );
    });
    known_codes(h);
}

/// A hand-checked table of codes: the host codec must give these, and so must the device.
fn known_codes<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_codes_amax_transpose";
    let nan_neg = f32::from_bits(0xffc0_0000);
    // (input, e4m3, e5m2)
    let table: [(f32, u8, u8); 16] = [
        (0.0, 0x00, 0x00),
        (-0.0, 0x80, 0x80),
        (1.0, 0x38, 0x3c),
        (1.0625, 0x38, 0x3c), // E4M3 tie → even (1.0)
        (1.1875, 0x3a, 0x3d), // E4M3 tie between 1.125 and 1.25 → even (1.25)
        (1.125, 0x39, 0x3c),  // E5M2 tie between 1.0 and 1.25 → even (1.0)
        (448.0, 0x7e, 0x5f),
        (464.0, 0x7e, 0x5f), // E4M3: tie with the (NaN) code above → max
        (-1e9, 0xfe, 0xfb),
        (f32::INFINITY, 0x7e, 0x7b),
        (f32::NEG_INFINITY, 0xfe, 0xfb),
        (f32::NAN, 0x7f, 0x7f),
        (nan_neg, 0x7f, 0x7f),
        (0.001953125, 0x01, 0x18),  // 2^-9: smallest E4M3 subnormal
        (0.0009765625, 0x00, 0x14), // 2^-10: E4M3 tie with zero → 0
        (-1e-40, 0x80, 0x80),
    ];
    let (rows, cols) = (64usize, 64usize);
    let x: Vec<f32> = (0..rows * cols).map(|i| table[i % table.len()].0).collect();
    for (dst, col) in [(DType::F8E4M3, 1), (DType::F8E5M2, 2)] {
        let want_codes: Vec<u8> = (0..rows * cols)
            .map(|i| {
                let t = table[i % table.len()];
                if col == 1 { t.1 } else { t.2 }
            })
            .collect();
        let f = Fp8Format::of(dst).expect("fp8");
        for (i, &(input, ..)) in table.iter().enumerate() {
            assert_eq!(
                f.encode(input),
                want_codes[i],
                "{CASE}: the host codec encodes {input:e} as {dst} {:#04x}, the table says {:#04x}",
                f.encode(input),
                want_codes[i]
            );
        }
        for transposed in [false, true] {
            let got = quantize_on(&h.dev, &x, DType::F32, dst, rows, cols, transposed, 1.0);
            let want = Tensor {
                name: "codes".into(),
                dtype: dst,
                bytes: want_codes.clone(),
            };
            compare(
                &format!("{CASE}: known {dst} codes (transposed {transposed})"),
                &got[0],
                &want,
                Tol::Bits,
            );
        }
    }
}

/// One job of the multi-matrix case: rows, cols, source dtype, FP8 dtype, transposed copy,
/// slot.
type Spec = (usize, usize, DType, DType, bool, usize);

/// `quantize_fp8_many` of the jobs (`many`) or one `quantize_fp8` per job in order, into fresh
/// NaN-filled outputs; the amax starts at `amax0`.
fn many_on<E: Device>(
    e: &E,
    specs: &[Spec],
    xs: &[Vec<f32>],
    scale: &[f32],
    amax0: &[f32],
    many: bool,
) -> Vec<Tensor> {
    let srcs: Vec<E::Buffer> = specs.iter().zip(xs).map(|(s, x)| put(e, s.2, x)).collect();
    let mut dsts: Vec<E::Buffer> = specs.iter().map(|s| nan(e, s.3, s.0 * s.1)).collect();
    let mut dts: Vec<E::Buffer> = specs.iter().map(|s| nan(e, s.3, s.0 * s.1)).collect();
    let sb = put(e, DType::F32, scale);
    let mut amax = put(e, DType::F32, amax0);
    if many {
        let mut jobs: Vec<Fp8QuantJob<'_, E::Buffer>> = specs
            .iter()
            .zip(&srcs)
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
            .map(|((s, src), (dst, dt))| Fp8QuantJob {
                src,
                dst,
                dst_t: s.4.then_some(dt),
                rows: s.0,
                cols: s.1,
                slot: s.5,
            })
            .collect();
        e.exec(QuantizeFp8Many {
            jobs: &mut jobs,
            scale: &sb,
            amax: &mut amax,
        })
        .expect("quantize_fp8_many");
    } else {
        for ((s, src), (dst, dt)) in specs
            .iter()
            .zip(&srcs)
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
        {
            e.exec(QuantizeFp8 {
                src,
                dst,
                dst_t: s.4.then_some(dt),
                rows: s.0,
                cols: s.1,
                scale: &sb,
                amax: &mut amax,
                slot: s.5,
            })
            .expect("quantize_fp8");
        }
    }
    let mut out = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        out.push(get(e, &format!("job {i} codes"), &dsts[i]));
        if s.4 {
            out.push(get(e, &format!("job {i} codes_t"), &dts[i]));
        }
    }
    out.push(get(e, "amax", &amax));
    out
}

/// `quantize_fp8_many` over a mix of jobs (model-like weights with transposed copies, shapes
/// with rows or cols not multiples of 8, E4M3/E5M2 and FNUZ, f32/f16/bf16 sources, slots shared
/// by several jobs, an unnamed slot, an empty job), two scale sets: bit for bit one
/// `quantize_fp8` per job in order on the same device, and the host codec's codes and amax; a
/// bad job anywhere refuses the call before any job runs.
pub fn quantize_fp8_many_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_many_matches_composition";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let (e4, e5, bf) = (DType::F8E4M3, DType::F8E5M2, DType::BF16);
    let specs: Vec<Spec> = vec![
        // A small model's linear weights (qkv, projection, MLP up and down), own slots.
        (288, 96, bf, e4, true, 0),
        (96, 96, bf, e4, true, 1),
        (384, 96, bf, e4, true, 2),
        (96, 384, bf, e4, true, 3),
        // No transposed copy, other dtype pairs, shared slots.
        (96, 96, bf, e4, false, 4),
        (36, 64, bf, e4, false, 4),
        (200, 136, DType::F32, e5, true, 5),
        (64, 72, DType::F16, e5, false, 5),
        (96, 40, bf, DType::F8E4M3Fnuz, true, 6),
        (1, 8, bf, e4, true, 4),
        // Rows not a multiple of 8 with dst_t, cols not a multiple of 8.
        (36, 64, bf, e4, true, 5),
        (37, 45, DType::F32, e5, true, 6),
        (130, 33, bf, e4, false, 4),
        (5, 3, DType::F16, DType::F8E5M2Fnuz, true, 6),
        // Empty.
        (0, 64, bf, e4, true, 5),
    ];
    let xs: Vec<Vec<f32>> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.0 * s.1;
            if i % 3 == 0 {
                mixed(&mut r, n, false)
            } else {
                wide(&mut r, n)
            }
        })
        .collect();
    let amax0 = [0.0f32, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0];
    for scale in [
        [0.5f32, 1.0, 37.25, 3.0e-3, 1.0, 0.25, 8.0, 1.0],
        [448.0, 2.0e-3, 1.0, 100.0, 3.0, 1.0e-2, 0.5, 1.0],
    ] {
        let what = format!("{CASE}: scales {scale:?}");
        let got = many_on(&h.dev, &specs, &xs, &scale, &amax0, true);
        let each = many_on(&h.dev, &specs, &xs, &scale, &amax0, false);
        let bits = vec![Tol::Bits; got.len()];
        h.same(&what, &got, &each, &bits);
        h.verify(
            &what,
            &got,
            |c| many_on(c, &specs, &xs, &scale, &amax0, true),
            || {
                let mut amax = amax0;
                let mut w = Vec::new();
                for (i, (s, x)) in specs.iter().zip(&xs).enumerate() {
                    let stored = rounded(s.2, x);
                    let codes = reference::fp8_codes(&stored, scale[s.5], s.3);
                    w.push(codes_want(&format!("job {i} codes"), s.3, &codes));
                    if s.4 {
                        let ct = reference::transpose(&codes, s.0, s.1);
                        w.push(codes_want(&format!("job {i} codes_t"), s.3, &ct));
                    }
                    amax[s.5] = reference::fp8_amax(amax[s.5], &stored);
                }
                w.push(want(
                    "amax",
                    DType::F32,
                    amax.iter().map(|&x| x as f64).collect(),
                ));
                w
            },
            &bits,
        );
        let a = find_amax(&got);
        assert_eq!(a[7], 0.0, "{what}: the unnamed slot 7 was written");
    }
    many_checks_every_job_first(h);
}

fn find_amax(ts: &[Tensor]) -> Vec<f32> {
    ts.iter()
        .find(|t| t.name == "amax")
        .expect("an amax output")
        .f32()
}

/// A bad second job refuses the whole call with `quantize_fp8`'s error before the first job
/// runs: a short source (`Shape`), an integer source or a float destination (`Unsupported`),
/// transposed codes of the wrong length (`Shape`) or of another FP8 dtype (`DTypeMismatch`), a
/// slot past the end (`Shape`); so do a short scale (`Shape`) and a bf16 one (`DTypeMismatch`).
/// No jobs at all is a no-op.
fn many_checks_every_job_first<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_many_matches_composition";
    let e = &h.dev;
    let (rows, cols) = (64usize, 64usize);
    let n = rows * cols;
    let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
    let src = put(e, DType::BF16, &vec![1.5; n]);
    let short = e.alloc(DType::BF16, n - 1).expect("alloc");
    let ints = put_i32(e, &vec![1; n]);
    let scale = put(e, DType::F32, &[1.0, 1.0]);
    let short_scale = put(e, DType::F32, &[1.0]);
    let bf16_scale = put(e, DType::BF16, &[1.0, 1.0]);
    let mut amax = put(e, DType::F32, &[0.0, 0.0]);
    let mut first = e.alloc(e4, n).expect("alloc");
    e.fill(&mut first, 0.0).expect("fill");
    let shape = |e: &DeviceError| matches!(e, DeviceError::Shape { .. });
    let unsupported = |e: &DeviceError| matches!(e, DeviceError::Unsupported { .. });
    let mismatch = |e: &DeviceError| matches!(e, DeviceError::DTypeMismatch { .. });
    #[allow(clippy::type_complexity)]
    let bad: [(
        &str,
        &D::Buffer,
        DType,
        Option<(DType, usize)>,
        usize,
        &D::Buffer,
        &dyn Fn(&DeviceError) -> bool,
    ); 8] = [
        ("a short source", &short, e4, None, 1, &scale, &shape),
        ("an i32 source", &ints, e4, None, 1, &scale, &unsupported),
        (
            "a bf16 destination",
            &src,
            DType::BF16,
            None,
            1,
            &scale,
            &unsupported,
        ),
        (
            "long transposed codes",
            &src,
            e4,
            Some((e4, n + 8)),
            1,
            &scale,
            &shape,
        ),
        (
            "E5M2 transposed codes",
            &src,
            e4,
            Some((e5, n)),
            1,
            &scale,
            &mismatch,
        ),
        ("slot 2 of 2", &src, e4, None, 2, &scale, &shape),
        (
            "a scale of 1 for slot 1",
            &src,
            e4,
            None,
            1,
            &short_scale,
            &shape,
        ),
        ("a bf16 scale", &src, e4, None, 0, &bf16_scale, &mismatch),
    ];
    for (what, src2, dst2, dt2, slot2, scale, kind) in bad {
        let mut dst = e.alloc(dst2, n).expect("alloc");
        let mut dt = dt2.map(|(t, len)| e.alloc(t, len).expect("alloc"));
        let mut jobs = [
            Fp8QuantJob {
                src: &src,
                dst: &mut first,
                dst_t: None,
                rows,
                cols,
                slot: 0,
            },
            Fp8QuantJob {
                src: src2,
                dst: &mut dst,
                dst_t: dt.as_mut(),
                rows,
                cols,
                slot: slot2,
            },
        ];
        let err = e
            .exec(QuantizeFp8Many {
                jobs: &mut jobs,
                scale,
                amax: &mut amax,
            })
            .expect_err("a bad job is refused");
        assert!(kind(&err), "{CASE}: {what} gives {err}");
        let codes = e.download_bytes(&first, 0, n).expect("download");
        assert!(
            codes.iter().all(|&b| b == 0),
            "{CASE}: {what}: the first job ran before the error: {err}"
        );
        assert_eq!(
            get(e, "amax", &amax).f32(),
            vec![0.0, 0.0],
            "{CASE}: {what}: amax changed before the error: {err}"
        );
    }
    e.exec(QuantizeFp8Many {
        jobs: &mut [],
        scale: &scale,
        amax: &mut amax,
    })
    .expect("no jobs");
    assert_eq!(
        get(e, "amax", &amax).f32(),
        vec![0.0, 0.0],
        "{CASE}: no jobs changed amax"
    );
}

/// `quantize_fp8_grad` (or, with `composed`, gelu_backward + bias_backward + quantize_fp8) of
/// `dout` (and `pre`) stored as `act`, into slot 1; `dbias` (f32) starts at `dbias0`. Outputs
/// codes, [codes_t], amax, dbias.
#[allow(clippy::too_many_arguments)]
fn grad_on<E: Device>(
    e: &E,
    dout: &[f32],
    pre: Option<&[f32]>,
    act: DType,
    fmt: DType,
    rows: usize,
    cols: usize,
    transposed: bool,
    dbias0: &[f32],
    composed: bool,
) -> Vec<Tensor> {
    let n = rows * cols;
    let d = put(e, act, dout);
    let p = pre.map(|p| put(e, act, p));
    let mut q = QuantBufs::new(e, fmt, n, transposed, 37.25, &AMAX0);
    let mut dbias = put(e, DType::F32, dbias0);
    if composed {
        let tmp;
        let g = match &p {
            Some(p) => {
                let mut t = nan(e, act, n);
                e.exec(GeluBackward {
                    x: p,
                    dout: &d,
                    dx: &mut t,
                })
                .expect("gelu_backward");
                tmp = t;
                &tmp
            }
            None => &d,
        };
        e.exec(BiasBackward {
            dout: g,
            dbias: &mut dbias,
            rows,
            c: cols,
        })
        .expect("bias_backward");
        q.quantize(e, g, rows, cols);
    } else {
        e.exec(QuantizeFp8Grad {
            dout: &d,
            gelu_pre: p.as_ref(),
            dst: &mut q.dst,
            dst_t: q.dt.as_mut(),
            dbias: &mut dbias,
            rows,
            cols,
            scale: &q.scale,
            amax: &mut q.amax,
            slot: 1,
        })
        .expect("quantize_fp8_grad");
    }
    let mut out = q.outs(e);
    out.push(get(e, "dbias", &dbias));
    out
}

/// `quantize_fp8_grad` with and without the GELU, with and without the transposed copy, every
/// activation dtype, three FP8 formats, tile multiples, partial tiles, odd shapes, a single
/// row: codes, transposed codes and amax bit for bit the separate ops' (gelu_backward,
/// bias_backward, quantize_fp8) on the same device, dbias within a reduction's rounding (and
/// the same bits on a second call); against the oracle (without the GELU codes and amax bit for
/// bit the host codec's of the stored dout, with it within a code step; dbias accumulated onto
/// its start).
pub fn quantize_fp8_grad_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_grad_matches_composition";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let shapes = [(64, 64), (128, 72), (72, 8), (1, 8), (37, 45), (40, 13)];
    for &(rows, cols) in &shapes {
        let n = rows * cols;
        // No infinities in any dtype (f16 tops out at 65504): the saturating values stay.
        let dout: Vec<f32> = wide(&mut r, n).iter().map(|x| x.clamp(-3e4, 3e4)).collect();
        let pre: Vec<f32> = wide(&mut r, n).iter().map(|x| x.clamp(-6.0, 6.0)).collect();
        let dbias0 = r.vec(cols, -3.0, 3.0);
        for act in FLOATS {
            let ds = rounded(act, &dout);
            let ps = rounded(act, &pre);
            for fmt in [DType::F8E4M3, DType::F8E5M2, DType::F8E4M3Fnuz] {
                for gelu in [false, true] {
                    for transposed in [true, false] {
                        let what = format!(
                            "{CASE}: {rows}x{cols} {act} -> {fmt} gelu {gelu} transposed \
                             {transposed}"
                        );
                        let p = gelu.then_some(pre.as_slice());
                        let run = |composed| {
                            grad_on(
                                &h.dev, &dout, p, act, fmt, rows, cols, transposed, &dbias0,
                                composed,
                            )
                        };
                        let got = run(false);
                        let plain = run(true);
                        let mut tols = quantize_tols(transposed, Tol::Bits, Tol::Bits);
                        tols.push(Tol::REDUCTION);
                        h.same(&what, &got, &plain, &tols);
                        let again = run(false);
                        let db = got.len() - 1;
                        compare(
                            &format!("{what}: dbias deterministic"),
                            &again[db],
                            &got[db],
                            Tol::Bits,
                        );
                        // g = dout exactly without the GELU; with it, the oracle's gelu' may
                        // round g to the other side of a code (or of act's rounding).
                        let mut tols = if gelu {
                            quantize_tols(transposed, step_tol(fmt), Tol::rel(1e-2))
                        } else {
                            quantize_tols(transposed, Tol::Bits, Tol::Bits)
                        };
                        tols.push(if gelu && act != DType::F32 {
                            Tol::rel(1e-2)
                        } else {
                            Tol::REDUCTION
                        });
                        let wants = {
                            let g: Vec<f32> = if gelu {
                                let g64: Vec<f32> = ps
                                    .iter()
                                    .zip(&ds)
                                    .map(|(&x, &d)| {
                                        (reference::gelu_grad(x as f64) * d as f64) as f32
                                    })
                                    .collect();
                                rounded(act, &g64)
                            } else {
                                ds.clone()
                            };
                            let mut w =
                                quantize_wants(&g, fmt, rows, cols, transposed, 37.25, &AMAX0);
                            let g64: Vec<f64> = g.iter().map(|&x| x as f64).collect();
                            let sums = reference::col_sums(&g64, rows, cols);
                            let db: Vec<f64> = sums
                                .iter()
                                .zip(&dbias0)
                                .map(|(s, &d0)| s + d0 as f64)
                                .collect();
                            w.push(want("dbias", DType::F32, db));
                            w
                        };
                        h.verify(
                            &what,
                            &got,
                            |c| {
                                grad_on(
                                    c, &dout, p, act, fmt, rows, cols, transposed, &dbias0, false,
                                )
                            },
                            || wants.clone(),
                            &tols,
                        );
                        codes_mostly_exact(h, &what, &got, &wants);
                    }
                }
            }
        }
    }
}

/// `quantize_fp8_gelu` (or, with `composed`, gelu_forward + quantize_fp8) of `pre` stored as
/// `act`, into slot 1 with scale `scale`.
#[allow(clippy::too_many_arguments)]
fn gelu_on<E: Device>(
    e: &E,
    pre: &[f32],
    act: DType,
    fmt: DType,
    rows: usize,
    cols: usize,
    transposed: bool,
    scale: f32,
    composed: bool,
) -> Vec<Tensor> {
    let n = rows * cols;
    let p = put(e, act, pre);
    let mut q = QuantBufs::new(e, fmt, n, transposed, scale, &AMAX0);
    if composed {
        let mut g = nan(e, act, n);
        e.exec(GeluForward { x: &p, out: &mut g })
            .expect("gelu_forward");
        q.quantize(e, &g, rows, cols);
    } else {
        let QuantBufs {
            dst,
            dt,
            scale,
            amax,
        } = &mut q;
        e.exec(QuantizeFp8Gelu {
            pre: &p,
            dst,
            dst_t: dt.as_mut(),
            rows,
            cols,
            scale,
            amax,
            slot: 1,
        })
        .expect("quantize_fp8_gelu");
    }
    q.outs(e)
}

/// `quantize_fp8_gelu` from every activation dtype into every FP8 format, with and without the
/// transposed copy, two scales, tile multiples, partial tiles, odd shapes, special values
/// (every encoder branch, ±∞, NaN): codes, transposed codes and amax bit for bit
/// gelu_forward + quantize_fp8 on the same device; against the oracle (the f64 GELU rounded to
/// the activation dtype) within a code step.
pub fn quantize_fp8_gelu_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "quantize_fp8_gelu_matches_composition";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let shapes = [
        (64, 64),
        (72, 8),
        (37, 45),
        (13, 64),
        (64, 13),
        (1, 8),
        (8, 1),
        (1, 1),
    ];
    for_each_quant_point(&mut r, &shapes, |p| {
        let QuantPoint {
            rows,
            cols,
            x: pre,
            src: act,
            fmt,
            transposed,
            scale,
            ..
        } = *p;
        let what = p.what(CASE);
        let run = |composed| {
            gelu_on(
                &h.dev, pre, act, fmt, rows, cols, transposed, scale, composed,
            )
        };
        let got = run(false);
        let plain = run(true);
        let bits = quantize_tols(transposed, Tol::Bits, Tol::Bits);
        h.same(&what, &got, &plain, &bits);
        let wants = {
            let x64: Vec<f64> = p.stored.iter().map(|&x| x as f64).collect();
            let g32: Vec<f32> = reference::gelu(&x64).iter().map(|&x| x as f32).collect();
            let g = rounded(act, &g32);
            quantize_wants(&g, fmt, rows, cols, transposed, scale, &AMAX0)
        };
        h.verify(
            &what,
            &got,
            |c| gelu_on(c, pre, act, fmt, rows, cols, transposed, scale, false),
            || wants.clone(),
            &quantize_tols(transposed, step_tol(fmt), Tol::rel(1e-2)),
        );
        codes_mostly_exact(h, &what, &got, &wants);
    });
}

/// LayerNorm inputs: rows with different offsets and spreads, some exact zeros; with `specials`
/// (and enough rows) row 1 constant (zero variance), row 2 with a NaN, row 3 with an infinity,
/// row 4 near 1e4 (cancellation in x − μ).
fn ln_input(r: &mut Rng, n: usize, c: usize, specials: bool) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n * c)
        .map(|i| {
            let row = i / c;
            let offset = ((row * 37) % 11) as f32 * 0.7 - 3.5;
            let spread = 2f32.powi((row % 7) as i32 - 3);
            if i % 53 == 5 {
                0.0
            } else {
                offset + spread * r.uniform(-1.0, 1.0)
            }
        })
        .collect();
    if specials {
        let mut row = |r: usize, f: &dyn Fn(usize) -> f32| {
            if r < n {
                for j in 0..c {
                    x[r * c + j] = f(j);
                }
            }
        };
        row(1, &|_| 3.0);
        row(2, &|j| {
            if j == c / 2 {
                f32::NAN
            } else {
                0.25 * j as f32
            }
        });
        row(3, &|j| if j == 0 { f32::INFINITY } else { -1.0 });
        row(4, &|j| 1.0e4 + (j % 13) as f32 * 0.5);
    }
    x
}

/// γ around 1 with every 17th at 40 (normalised values past every FP8 maximum once scaled) and β
/// small with exact ±0.
fn ln_params(r: &mut Rng, c: usize) -> (Vec<f32>, Vec<f32>) {
    let gamma = (0..c)
        .map(|j| {
            if j % 17 == 3 {
                40.0
            } else {
                r.uniform(0.5, 1.5)
            }
        })
        .collect();
    let beta = (0..c)
        .map(|j| match j % 23 {
            0 => 0.0,
            1 => -0.0,
            _ => r.uniform(-0.5, 0.5),
        })
        .collect();
    (gamma, beta)
}

const LN_EPS: f32 = 1e-5;

/// `layernorm_forward_fp8` (or, with `composed`, layernorm_forward into a temporary and
/// quantize_fp8 of it) into slot 1, whose amax starts at 0.5. Outputs mean, rstd, codes,
/// [codes_t], amax.
#[allow(clippy::too_many_arguments)]
fn ln_fp8_on<E: Device>(
    e: &E,
    (x, gamma, beta): (&[f32], &[f32], &[f32]),
    (act, param, fmt): (DType, DType, DType),
    n: usize,
    c: usize,
    transposed: bool,
    scale: f32,
    composed: bool,
) -> Vec<Tensor> {
    let len = n * c;
    let xb = put(e, act, x);
    let gb = put(e, param, gamma);
    let bb = put(e, param, beta);
    let mut mean = nan(e, DType::F32, n);
    let mut rstd = nan(e, DType::F32, n);
    let mut q = QuantBufs::new(e, fmt, len, transposed, scale, &LN_AMAX0);
    if composed {
        let mut out = nan(e, act, len);
        e.exec(LayerNormForward {
            x: &xb,
            gamma: &gb,
            beta: &bb,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps: LN_EPS,
        })
        .expect("layernorm_forward");
        q.quantize(e, &out, n, c);
    } else {
        e.exec(LayerNormForwardFp8 {
            x: &xb,
            gamma: &gb,
            beta: &bb,
            mean: &mut mean,
            rstd: &mut rstd,
            dst: &mut q.dst,
            dst_t: q.dt.as_mut(),
            n,
            c,
            eps: LN_EPS,
            scale: &q.scale,
            amax: &mut q.amax,
            slot: 1,
        })
        .expect("layernorm_forward_fp8");
    }
    let mut out = vec![get(e, "mean", &mean), get(e, "rstd", &rstd)];
    out.extend(q.outs(e));
    out
}
const LN_AMAX0: [f32; 3] = [0.0, 0.5, 0.0];

/// `layernorm_forward_fp8` over rows and columns that are and are not multiples of 8 and 32, a
/// single row and column, bf16/f16/f32 activations with parameters of the same type or f32,
/// every FP8 format, two scales, special rows (zero variance, NaN, ∞, cancellation): mean, rstd,
/// codes, transposed codes and amax bit for bit layernorm_forward + quantize_fp8 on the same
/// device; against the oracle (statistics within a reduction's rounding, codes within a code
/// step); the separate ops' argument errors.
pub fn layernorm_forward_fp8_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "layernorm_forward_fp8_matches_composition";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let shapes = [
        (65, 130),
        (1, 64),
        (37, 45),
        (33, 8),
        (8, 1),
        (9, 1537),
        (16, 768),
    ];
    for &(n, c) in &shapes {
        let (gamma, beta) = ln_params(&mut r, c);
        for specials in [false, true] {
            let x = ln_input(&mut r, n, c, specials);
            for (act, param) in [
                (DType::BF16, DType::BF16),
                (DType::BF16, DType::F32),
                (DType::F16, DType::F16),
                (DType::F16, DType::F32),
                (DType::F32, DType::F32),
            ] {
                for fmt in FP8S {
                    for transposed in [false, true] {
                        for scale in [1.0f32, 37.25] {
                            let what = format!(
                                "{CASE}: {n}x{c} {act}/{param} -> {fmt} specials {specials} \
                                 scale {scale} transposed {transposed}"
                            );
                            let run = |composed| {
                                ln_fp8_on(
                                    &h.dev,
                                    (&x, &gamma, &beta),
                                    (act, param, fmt),
                                    n,
                                    c,
                                    transposed,
                                    scale,
                                    composed,
                                )
                            };
                            let got = run(false);
                            let plain = run(true);
                            let mut bits = vec![Tol::Bits, Tol::Bits];
                            bits.extend(quantize_tols(transposed, Tol::Bits, Tol::Bits));
                            h.same(&what, &got, &plain, &bits);
                            let mut tols = vec![Tol::REDUCTION, Tol::REDUCTION];
                            tols.extend(quantize_tols(transposed, step_tol(fmt), Tol::rel(1e-2)));
                            let wants = {
                                let (out, mean, rstd) = reference::layernorm(
                                    &rounded64(act, &x),
                                    &rounded64(param, &gamma),
                                    &rounded64(param, &beta),
                                    n,
                                    c,
                                    LN_EPS as f64,
                                );
                                let o32: Vec<f32> = out.iter().map(|&v| v as f32).collect();
                                let o = rounded(act, &o32);
                                let mut w = vec![
                                    want("mean", DType::F32, mean),
                                    want("rstd", DType::F32, rstd),
                                ];
                                w.extend(quantize_wants(
                                    &o, fmt, n, c, transposed, scale, &LN_AMAX0,
                                ));
                                w
                            };
                            h.verify(
                                &what,
                                &got,
                                |cpu| {
                                    ln_fp8_on(
                                        cpu,
                                        (&x, &gamma, &beta),
                                        (act, param, fmt),
                                        n,
                                        c,
                                        transposed,
                                        scale,
                                        false,
                                    )
                                },
                                || wants.clone(),
                                &tols,
                            );
                            codes_mostly_exact(h, &what, &got, &wants);
                        }
                    }
                }
            }
        }
    }
    ln_fp8_refuses(h);
}

/// `layernorm_forward_fp8` gives the separate ops' errors: a short β (`Shape`), a float
/// destination (`Unsupported`), a slot past the scale and amax (`Shape`); a valid call runs.
fn ln_fp8_refuses<D: Device>(h: &Harness<D>) {
    const CASE: &str = "layernorm_forward_fp8_matches_composition";
    let d = &h.dev;
    let (n, c) = (4usize, 16usize);
    let x = put(d, DType::BF16, &vec![0.5; n * c]);
    let gamma = put(d, DType::BF16, &vec![1.0; c]);
    let short = put(d, DType::BF16, &vec![0.0; c - 1]);
    let scale = put(d, DType::F32, &[1.0]);
    let mut amax = put(d, DType::F32, &[0.0]);
    let mut mean = nan(d, DType::F32, n);
    let mut rstd = nan(d, DType::F32, n);
    let mut run = |beta: &D::Buffer, fmt: DType, slot: usize| {
        let mut dst = nan(d, fmt, n * c);
        d.exec(LayerNormForwardFp8 {
            x: &x,
            gamma: &gamma,
            beta,
            mean: &mut mean,
            rstd: &mut rstd,
            dst: &mut dst,
            dst_t: None,
            n,
            c,
            eps: LN_EPS,
            scale: &scale,
            amax: &mut amax,
            slot,
        })
    };
    for (what, beta, fmt, slot, kind) in [
        ("a short beta", &short, DType::F8E4M3, 0, "Shape"),
        ("a bf16 destination", &gamma, DType::BF16, 0, "Unsupported"),
        ("slot 1 of 1", &gamma, DType::F8E4M3, 1, "Shape"),
    ] {
        match run(beta, fmt, slot) {
            Err(DeviceError::Shape { .. }) if kind == "Shape" => {}
            Err(DeviceError::Unsupported { .. }) if kind == "Unsupported" => {}
            other => panic!("{CASE}: {what}: expected {kind}, got {other:?}"),
        }
    }
    run(&gamma, DType::F8E4M3, 0).expect("a valid layernorm_forward_fp8");
}

/// Values for FP8 GEMM operands (in code space: the inverse scales bring them back): mostly
/// moderate, every eighth one small (subnormal codes), both signs.
fn gemm_operand(r: &mut Rng, n: usize, mag: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = r.uniform(-mag, mag);
            if i % 8 == 3 { v * 2f32.powi(-9) } else { v }
        })
        .collect()
}

/// The FP8 GEMMs' tolerance: against the f64 oracle (the CPU) a reduction's; against the CPU
/// (a GPU) what FP8 tensor cores give, which do not accumulate in full f32 on Hopper (the CUDA
/// tests' 2e-3 for an f32 C, 1e-2 for 16-bit ones; twice that with fast accumulation).
fn gemm_fp8_tol<D: Device>(h: &Harness<D>, cd: DType, fast: bool) -> Tol {
    let k = if fast { 2.0 } else { 1.0 };
    match (h.is_reference(), cd) {
        (true, DType::F32) => Tol::REDUCTION,
        (true, _) => Tol::GEMM16,
        (false, DType::F32) => Tol::rel(2e-3 * k),
        (false, _) => Tol::Rel {
            f32: 2e-3 * k,
            f16: 1e-2 * k,
            bf16: 2e-2 * k,
            fp8: 0.13,
        },
    }
}

/// One `gemm_fp8` with A and B the host codes of `a` and `b`, C of `cd` (NaN-filled when beta is
/// 0, else `c0`), the inverse scales `inv[0]` and `inv[stride]` (the elements between NaN).
#[allow(clippy::too_many_arguments)]
fn gemm_fp8_on<E: Device>(
    e: &E,
    desc: &GemmDesc,
    (ad, bd, cd): (DType, DType, DType),
    a: &[f32],
    b: &[f32],
    c0: &[f32],
    inv: (f32, f32),
    stride: usize,
) -> Result<Vec<Tensor>, DeviceError> {
    let ab = put(e, ad, a);
    let bb = put(e, bd, b);
    let mut c = if desc.beta == 0.0 {
        nan(e, cd, c0.len())
    } else {
        put(e, cd, c0)
    };
    let mut sv = vec![f32::NAN; 2 * stride];
    (sv[0], sv[stride]) = inv;
    let s = put(e, DType::F32, &sv);
    e.exec(GemmFp8 {
        desc,
        a: &ab,
        b: &bb,
        c: &mut c,
        scale_inv: &s,
        a_slot: 0,
        b_slot: stride,
    })?;
    Ok(vec![get(e, "c", &c)])
}

/// The f64 reference of [`gemm_fp8_on`]: the decoded codes times their inverse scales.
fn gemm_fp8_want(
    desc: &GemmDesc,
    (ad, bd, cd): (DType, DType, DType),
    a: &[f32],
    b: &[f32],
    c0: &[f32],
    inv: (f32, f32),
) -> Vec<Want> {
    let a64: Vec<f64> = rounded64(ad, a).iter().map(|x| x * inv.0 as f64).collect();
    let b64: Vec<f64> = rounded64(bd, b).iter().map(|x| x * inv.1 as f64).collect();
    let mut c = if desc.beta == 0.0 {
        vec![0.0; c0.len()]
    } else {
        rounded64(cd, c0)
    };
    reference::gemm(desc, &a64, &b64, &mut c);
    vec![want("c", cd, c)]
}

/// `gemm_fp8` in the layout every backend takes (A `m × k`, B `n × k`, both K-major), m, n, k
/// multiples of 16, E4M3·E4M3 and E4M3/E5M2 mixes of each family, C f32, bf16 and f16, the
/// inverse scales packed and apart (the backend's stride, at least 3), accumulation into C
/// (alpha, beta), fast accumulation: against the oracle (the decoded values times the inverse
/// scales, an f64 GEMM). A backend may
/// refuse a format with `Unsupported` (not the CPU); other layouts (A transposed, B not, k not
/// a multiple of 16) give the right answer or `Unsupported`/`InvalidArgument`; OCP and FNUZ
/// operands mixed are refused.
pub fn gemm_fp8_matches_reference<D: Device>(h: &Harness<D>) {
    const CASE: &str = "gemm_fp8_matches_reference";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let mut r = h.rng(CASE);
    let (e4, e5, e4z, e5z) = (
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
    );
    let pairs = [
        (e4, e4),
        (e5, e4),
        (e4, e5),
        (e4z, e4z),
        (e5z, e4z),
        (e4z, e5z),
    ];
    let inv = (1.0f32 / 64.0, 4.0f32);
    // Inverse scales apart: at the backend's own stride (CUDA's 64 reads them in place), at
    // least 3.
    let wide = h.dev.capabilities().fp8_scale_inv_stride.max(3);
    let mut ran = 0;
    let mut refused = Vec::new();
    for (m, n, k) in [(64, 48, 96), (32, 16, 512), (16, 128, 64)] {
        let desc = GemmDesc::new(false, true, m, n, k);
        let a = gemm_operand(&mut r, m * k, 200.0);
        let b = gemm_operand(&mut r, n * k, 0.5);
        let c0 = r.vec(m * n, -2.0, 2.0);
        for &(ad, bd) in &pairs {
            for cd in [DType::BF16, DType::F32, DType::F16] {
                for (stride, d, what_d) in [
                    (1usize, desc, "plain"),
                    (wide, desc, "scales apart"),
                    (1, desc.beta(1.0).alpha(0.5), "alpha 0.5 beta 1"),
                    (wide, desc.fp8_fast_accum(true), "fast accumulation"),
                ] {
                    let what = format!(
                        "{CASE}: {m}x{n}x{k} {ad}·{bd} -> {cd} {what_d} (inv_stride {stride})"
                    );
                    let dts = (ad, bd, cd);
                    let got = match gemm_fp8_on(&h.dev, &d, dts, &a, &b, &c0, inv, stride) {
                        Ok(g) => g,
                        Err(DeviceError::Unsupported { .. }) if !h.is_reference() => {
                            refused.push(format!("{ad}·{bd} -> {cd}"));
                            continue;
                        }
                        Err(err) => panic!("{what}: {err}"),
                    };
                    ran += 1;
                    let tol = gemm_fp8_tol(h, cd, d.fp8_fast_accum);
                    h.verify(
                        &what,
                        &got,
                        |c| {
                            gemm_fp8_on(c, &d, dts, &a, &b, &c0, inv, stride)
                                .expect("gemm_fp8 on the CPU")
                        },
                        || gemm_fp8_want(&d, dts, &a, &b, &c0, inv),
                        &[tol],
                    );
                }
            }
        }
    }
    assert!(ran > 0, "{CASE}: the backend refused every FP8 GEMM");
    if !refused.is_empty() {
        refused.sort();
        refused.dedup();
        skip(
            &format!("{CASE} (some formats)"),
            &format!("{} refuses {}", h.backend(), refused.join(", ")),
        );
    }
    // Layouts a backend may refuse: the right answer or a typed refusal.
    for (what, d) in [
        (
            "A transposed, B not",
            GemmDesc::new(true, false, 32, 32, 32),
        ),
        ("B not transposed", GemmDesc::new(false, false, 32, 32, 32)),
        ("k = 24", GemmDesc::new(false, true, 32, 32, 24)),
    ] {
        let (ar, ac) = d.a_stored();
        let (br, bc) = d.b_stored();
        let a = gemm_operand(&mut r, ar * ac, 100.0);
        let b = gemm_operand(&mut r, br * bc, 1.0);
        let c0 = vec![0.0; d.m * d.n];
        let dts = (e4, e4, DType::BF16);
        let what = format!("{CASE}: {what}");
        match gemm_fp8_on(&h.dev, &d, dts, &a, &b, &c0, inv, 1) {
            Ok(got) => h.verify(
                &what,
                &got,
                |c| gemm_fp8_on(c, &d, dts, &a, &b, &c0, inv, 1).expect("gemm_fp8 on the CPU"),
                || gemm_fp8_want(&d, dts, &a, &b, &c0, inv),
                &[gemm_fp8_tol(h, DType::BF16, false)],
            ),
            Err(DeviceError::Unsupported { .. } | DeviceError::InvalidArgument(_)) => {}
            Err(err) => {
                panic!("{what}: refused with {err} (expected Unsupported or InvalidArgument)")
            }
        }
    }
    // OCP and FNUZ operands in one GEMM: refused.
    let d = GemmDesc::new(false, true, 32, 32, 32);
    let v = vec![0.5f32; 32 * 32];
    for (ad, bd) in [(e4, e4z), (e5z, e4)] {
        match gemm_fp8_on(&h.dev, &d, (ad, bd, DType::BF16), &v, &v, &v, inv, 1) {
            Err(DeviceError::Unsupported { .. } | DeviceError::InvalidArgument(_)) => {}
            other => panic!(
                "{CASE}: {ad}·{bd} (families mixed) gives {:?}, expected Unsupported or InvalidArgument",
                other.map(|_| ())
            ),
        }
    }
}

/// `gemm_fp8_epilogue`'s Bias, BiasResidual and BiasGelu against gemm_fp8 followed by
/// bias_add, add and gelu_forward on the same device (same codes and scales), C bf16 and f16 —
/// natively fused where the backend's capabilities say so, else through the trait's composed
/// default; an epilogue FP8 GEMMs do not take (DGelu) and a bias of another dtype are refused.
pub fn gemm_fp8_epilogue_matches_composition<D: Device>(h: &Harness<D>) {
    const CASE: &str = "gemm_fp8_epilogue_matches_composition";
    if !fp8_or_skip(h, CASE) {
        return;
    }
    let g = &h.dev;
    let dts = HALVES;
    for dt in dts {
        if !fp8_epilogue_native(g, dt) {
            eprintln!(
                "{CASE}: C {dt} through the composed default on {}",
                h.backend()
            );
        }
    }
    let mut r = h.rng(CASE);
    let (n, k, m) = (64, 96, 128);
    // The E4M3 of the device's FP8 family (FNUZ on gfx942, which has no OCP GEMMs).
    let e4 = if g.info().fp8_is_fnuz() {
        DType::F8E4M3Fnuz
    } else {
        DType::F8E4M3
    };
    for dt in dts {
        let what = format!("{CASE}: C {dt}");
        let x8 = put(g, e4, &gemm_operand(&mut r, n * k, 100.0));
        let w8 = put(g, e4, &gemm_operand(&mut r, m * k, 100.0));
        let scale_inv = put(g, DType::F32, &[1.0 / 32.0, 1.0 / 64.0]);
        let bias = put(g, dt, &r.vec(m, -0.5, 0.5));
        let res = put(g, dt, &r.vec(n * m, -1.0, 1.0));
        let desc = GemmDesc::new(false, true, n, m, k);
        let gemm = |c: &mut D::Buffer| {
            g.exec(GemmFp8 {
                desc: &desc,
                a: &x8,
                b: &w8,
                c,
                scale_inv: &scale_inv,
                a_slot: 0,
                b_slot: 1,
            })
            .expect("gemm_fp8")
        };
        let fused = |c: &mut D::Buffer, ep: Epilogue<'_, D::Buffer>| {
            g.exec(GemmFp8Epilogue {
                desc: &desc,
                a: &x8,
                b: &w8,
                c,
                scale_inv: &scale_inv,
                a_slot: 0,
                b_slot: 1,
                epilogue: ep,
            })
        };
        // Bias.
        let mut plain = nan(g, dt, n * m);
        gemm(&mut plain);
        g.exec(BiasAdd {
            x: &mut plain,
            bias: &bias,
            rows: n,
            c: m,
        })
        .expect("bias_add");
        let mut got = nan(g, dt, n * m);
        fused(&mut got, Epilogue::Bias(&bias)).expect("gemm_fp8_epilogue Bias");
        h.same_buf(&format!("{what} bias"), "c", &got, &plain, Tol::GEMM16);
        // Bias + residual (C is only written).
        let mut tmp = nan(g, dt, n * m);
        gemm(&mut tmp);
        g.exec(BiasAdd {
            x: &mut tmp,
            bias: &bias,
            rows: n,
            c: m,
        })
        .expect("bias_add");
        let mut plain = nan(g, dt, n * m);
        g.exec(Add {
            a: &tmp,
            b: &res,
            out: &mut plain,
        })
        .expect("add");
        let mut got = nan(g, dt, n * m);
        fused(
            &mut got,
            Epilogue::BiasResidual {
                bias: &bias,
                residual: &res,
            },
        )
        .expect("gemm_fp8_epilogue BiasResidual");
        h.same_buf(
            &format!("{what} bias + residual"),
            "c",
            &got,
            &plain,
            Tol::GEMM16,
        );
        // Bias + GELU with the pre-activation.
        let mut plain_pre = nan(g, dt, n * m);
        gemm(&mut plain_pre);
        g.exec(BiasAdd {
            x: &mut plain_pre,
            bias: &bias,
            rows: n,
            c: m,
        })
        .expect("bias_add");
        let mut plain = nan(g, dt, n * m);
        g.exec(GeluForward {
            x: &plain_pre,
            out: &mut plain,
        })
        .expect("gelu_forward");
        let mut pre = nan(g, dt, n * m);
        let mut got = nan(g, dt, n * m);
        fused(
            &mut got,
            Epilogue::BiasGelu {
                bias: &bias,
                pre: &mut pre,
            },
        )
        .expect("gemm_fp8_epilogue BiasGelu");
        h.same(
            &format!("{what} bias + gelu"),
            &[get(g, "pre", &pre), get(g, "c", &got)],
            &[get(g, "pre", &plain_pre), get(g, "c", &plain)],
            &[Tol::GEMM16, Tol::GEMM16],
        );
        // Misuse: an epilogue FP8 GEMMs do not take, a bias of another dtype.
        let mut out = nan(g, dt, n * m);
        assert!(
            fused(&mut out, Epilogue::DGelu { pre: &pre }).is_err(),
            "{what}: DGelu is not an FP8 epilogue"
        );
        let bias32 = put(g, DType::F32, &vec![0.0; m]);
        assert!(
            fused(&mut out, Epilogue::Bias(&bias32)).is_err(),
            "{what}: an f32 bias with a {dt} C"
        );
    }
}

/// One setting of the scaling update: history length, most-recent mode, margin, inv_stride.
type Scaling = (usize, bool, i32, usize);

/// The amaxes of step `step` (0, ∞, NaN, a tiny one that saturates the scale, random ones).
fn step_amaxes(r: &mut Rng, ops: usize, step: usize) -> Vec<f32> {
    (0..ops)
        .map(|i| match (i + step) % 6 {
            0 => 0.0,
            1 => f32::INFINITY,
            2 => f32::NAN,
            3 => 1e-37,
            _ => r.uniform(0.0, 20.0),
        })
        .collect()
}

/// The starting state of the scaling update: history, scale, scale_inv, fp8_max.
struct ScalingInit {
    hist: Vec<f32>,
    scale: Vec<f32>,
    inv: Vec<f32>,
    maxes: Vec<f32>,
}

/// Steps of `fp8_scaling_update`; after each, history, scale, scale_inv and amax.
fn scaling_on<E: Device>(
    e: &E,
    s: &ScalingInit,
    amaxes: &[Vec<f32>],
    (len, most_recent, margin, inv_stride): Scaling,
) -> Vec<Tensor> {
    let mut hist = put(e, DType::F32, &s.hist);
    let mut scale = put(e, DType::F32, &s.scale);
    let mut inv = put(e, DType::F32, &s.inv);
    let maxes = put(e, DType::F32, &s.maxes);
    let mut out = Vec::new();
    for (step, a) in amaxes.iter().enumerate() {
        let mut amax = put(e, DType::F32, a);
        e.exec(Fp8ScalingUpdate {
            amax: &mut amax,
            history: &mut hist,
            scale: &mut scale,
            scale_inv: &mut inv,
            inv_stride,
            fp8_max: &maxes,
            len,
            most_recent,
            margin,
        })
        .expect("fp8_scaling_update");
        out.push(get(e, &format!("history step {step}"), &hist));
        out.push(get(e, &format!("scale step {step}"), &scale));
        out.push(get(e, &format!("scale_inv step {step}"), &inv));
        out.push(get(e, &format!("amax step {step}"), &amax));
    }
    out
}

/// `fp8_scaling_update` over eleven operands of two formats' maxima, bit for bit the host
/// computation (`fp8_history_step`, `fp8_scale_inv`): history roll, max with a NaN entry, amaxes
/// of 0, ∞ and NaN that keep the scale, saturation at f32::MAX, margins of both signs,
/// most-recent mode, four steps; inverse scales packed, 3 apart and at the backend's stride (the
/// elements in between untouched); the amaxes cleared; a zero stride or a short `scale_inv`
/// refused before anything is written.
pub fn fp8_scaling_update_matches_host<D: Device>(h: &Harness<D>) {
    const CASE: &str = "fp8_scaling_update_matches_host";
    let mut r = h.rng(CASE);
    if h.backend() == "cuda" {
        assert_eq!(
            h.dev.capabilities().fp8_scale_inv_stride,
            64,
            "{CASE}: cuBLASLt reads 256-byte aligned scales in place"
        );
    }
    let dev_stride = h.dev.capabilities().fp8_scale_inv_stride;
    let ops = 11;
    for setting in [
        (1, false, 0, 1),
        (16, false, 0, dev_stride),
        (5, true, 2, 3),
        (7, false, -3, 1),
        (4, true, 0, dev_stride.max(2)),
    ] {
        let (len, most_recent, margin, inv_stride) = setting;
        let what = format!(
            "{CASE}: len {len} most_recent {most_recent} margin {margin} inv_stride {inv_stride}"
        );
        let mut hist = vec![0.0f32; ops * len];
        for (i, x) in hist.iter_mut().enumerate() {
            if i % len < len / 2 {
                *x = r.uniform(0.0, 8.0);
            }
        }
        if len > 3 {
            hist[2] = f32::NAN; // operand 0: a NaN in its history keeps its scale
        }
        let init = ScalingInit {
            hist,
            scale: (0..ops).map(|_| r.uniform(0.5, 300.0)).collect(),
            inv: (0..ops * inv_stride).map(|i| i as f32 + 0.5).collect(),
            maxes: (0..ops)
                .map(|i| if i % 3 == 2 { 57344.0 } else { 448.0 })
                .collect(),
        };
        let amaxes: Vec<Vec<f32>> = (0..4).map(|s| step_amaxes(&mut r, ops, s)).collect();
        let got = scaling_on(&h.dev, &init, &amaxes, setting);
        h.verify(
            &what,
            &got,
            |c| scaling_on(c, &init, &amaxes, setting),
            || {
                let mut hist = init.hist.clone();
                let mut scale = init.scale.clone();
                let mut inv = init.inv.clone();
                let mut w = Vec::new();
                let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
                for (step, a) in amaxes.iter().enumerate() {
                    for i in 0..ops {
                        let hi = &mut hist[i * len..(i + 1) * len];
                        scale[i] = fp8_history_step(
                            hi,
                            a[i],
                            scale[i],
                            init.maxes[i],
                            most_recent,
                            margin,
                        );
                        inv[i * inv_stride] = fp8_scale_inv(scale[i]);
                    }
                    w.push(want(&format!("history step {step}"), DType::F32, f(&hist)));
                    w.push(want(&format!("scale step {step}"), DType::F32, f(&scale)));
                    w.push(want(&format!("scale_inv step {step}"), DType::F32, f(&inv)));
                    w.push(want(
                        &format!("amax step {step}"),
                        DType::F32,
                        vec![0.0; ops],
                    ));
                }
                w
            },
            &vec![Tol::Bits; got.len()],
        );
    }
    scaling_refuses(h);
}

/// `fp8_scaling_update` with an inverse-scale stride of 0 (`InvalidArgument`) or a `scale_inv`
/// shorter than `ops · inv_stride` (`Shape`) is refused before anything is written.
fn scaling_refuses<D: Device>(h: &Harness<D>) {
    const CASE: &str = "fp8_scaling_update_matches_host";
    let d = &h.dev;
    let (ops, len) = (5usize, 3usize);
    let mut amax = put(d, DType::F32, &[2.0, 0.0, 448.0, f32::NAN, 0.5]);
    let mut hist = put(d, DType::F32, &vec![1.0; ops * len]);
    let mut scale = put(d, DType::F32, &[1.0; 5]);
    let maxes = put(d, DType::F32, &[448.0, 448.0, 57344.0, 448.0, 240.0]);
    let mut inv = put(d, DType::F32, &vec![7.0; ops * 2]);
    for (stride, what) in [(0usize, "inv_stride 0"), (3, "a scale_inv of 10 for 5 × 3")] {
        let err = d
            .exec(Fp8ScalingUpdate {
                amax: &mut amax,
                history: &mut hist,
                scale: &mut scale,
                scale_inv: &mut inv,
                inv_stride: stride,
                fp8_max: &maxes,
                len,
                most_recent: false,
                margin: 0,
            })
            .expect_err("refused");
        assert!(
            matches!(
                (stride, &err),
                (0, DeviceError::InvalidArgument(_)) | (3, DeviceError::Shape { .. })
            ),
            "{CASE}: {what} gives {err}"
        );
        for (name, b, want) in [
            ("scale_inv", &inv, vec![7.0; ops * 2]),
            ("amax", &amax, vec![2.0, 0.0, 448.0, f32::NAN, 0.5]),
            ("history", &hist, vec![1.0; ops * len]),
            ("scale", &scale, vec![1.0; ops]),
        ] {
            compare(
                &format!("{CASE}: {what}: {name} untouched"),
                &get(d, name, b),
                &Tensor::encoded(name, DType::F32, &want),
                Tol::Bits,
            );
        }
    }
}
