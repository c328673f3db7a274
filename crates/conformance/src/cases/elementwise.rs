//! Element-wise ops and casts: cast, scale, add, add_assign, GELU, bias add and its gradient.

use super::*;
use crate::reference;
use duet_device::{
    Add, AddAssign, BiasAdd, BiasBackward, Buffer, DType, Device, DeviceError, Fp8Format,
    GeluBackward, GeluForward, Scale,
};

/// Values that exercise every corner of the FP8 and 16-bit codecs: saturation, subnormals,
/// ties, signs, infinities, the largest finite values.
pub fn codec_corners(r: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0625,
        -1.0625,
        448.0,
        464.0,
        1e9,
        -1e9,
        57344.0,
        61440.0,
        240.0,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        65504.0,
        70000.0,
        1e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0xbf81_8000),
        f32::from_bits(0x7f7f_8000),
        f32::MAX,
        -f32::MAX,
        f32::from_bits(0x0000_0001),
        f32::from_bits(0x0000_8000),
        f32::from_bits(0x0001_8000),
        f32::from_bits(0x807f_ffff),
    ];
    while v.len() < n {
        let mag = 2f32.powf(r.uniform(-20.0, 17.0));
        let s = if r.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        v.push(s * mag);
    }
    v
}

/// `cast` between every pair of float dtypes with and without a scale (a negative one too), bit
/// for bit: the host model decodes the source, multiplies by the scale in f32 and encodes
/// (saturating FP8); every FP8 code decodes to its value (NaN codes to NaN) and survives a
/// round trip through bf16 (the finite ones); values past an FP8 maximum and ±∞ saturate to
/// ±max; NaN stays NaN in every dtype.
pub fn cast_every_pair_bit_exact<D: Device>(h: &Harness<D>) {
    let case = "cast_every_pair_bit_exact";
    let d = &h.dev;
    let mut r = h.rng(case);
    let data = codec_corners(&mut r, 4099);
    for src in FLOATS_AND_FP8 {
        let s = put(d, src, &data);
        let decoded = rounded(src, &data);
        for dst in FLOATS_AND_FP8 {
            for scale in [1.0f32, 0.37, -2.0] {
                let mut o = nan(d, dst, data.len());
                d.cast(&s, &mut o, scale).expect("cast");
                let host: Vec<f32> = decoded.iter().map(|&x| x * scale).collect();
                let want = Tensor::encoded("dst", dst, &host);
                compare(
                    &format!("{case} {src}->{dst} scale {scale} ({})", h.backend()),
                    &get(d, "dst", &o),
                    &want,
                    Tol::Bits,
                );
            }
        }
    }
    let ints = d.alloc(DType::I32, 4).unwrap();
    let mut f = d.alloc(DType::F32, 4).unwrap();
    assert!(
        matches!(
            d.cast(&ints, &mut f, 1.0),
            Err(DeviceError::Unsupported { .. })
        ),
        "{case}: casting i32 is Unsupported"
    );
    fp8_codes_saturation_nan(h);
}

/// The FP8 and NaN parts of [`cast_every_pair_bit_exact`].
fn fp8_codes_saturation_nan<D: Device>(h: &Harness<D>) {
    let case = "cast_every_pair_bit_exact";
    let d = &h.dev;
    let cast = |src: &D::Buffer, dst: DType| {
        let mut o = nan(d, dst, src.len());
        d.cast(src, &mut o, 1.0).expect("cast");
        o
    };
    let codes: Vec<u8> = (0..=255).collect();
    for fp8 in FP8S {
        let f = Fp8Format::of(fp8).expect("fp8");
        let mut b = d.alloc(fp8, 256).unwrap();
        d.upload_bytes(&codes, &mut b, 0).unwrap();
        let decoded: Vec<f32> = codes.iter().map(|&c| f.decode(c)).collect();
        compare(
            &format!("{case}: every {fp8} code to f32 ({})", h.backend()),
            &get(d, "f32", &cast(&b, DType::F32)),
            &Tensor::encoded("f32", DType::F32, &decoded),
            Tol::rel(0.0),
        );
        // bf16 holds every FP8 value exactly: FP8 → bf16 → FP8 keeps every finite code.
        let back = get(d, "codes", &cast(&cast(&b, DType::BF16), fp8)).bytes;
        for c in codes.iter().filter(|&&c| f.decode(c).is_finite()) {
            assert_eq!(
                back[*c as usize],
                *c,
                "{case}: {fp8} code {c:#04x} through bf16 ({})",
                h.backend()
            );
        }
        let max = fp8.max_finite().expect("fp8 max");
        let big = put(
            d,
            DType::F32,
            &[1e6, -1e6, f32::INFINITY, f32::NEG_INFINITY],
        );
        assert_eq!(
            get(d, "saturated", &cast(&big, fp8)).f32(),
            vec![max, -max, max, -max],
            "{case}: {fp8} saturates ({})",
            h.backend()
        );
    }
    let nans = put(d, DType::F32, &[f32::NAN, -f32::NAN]);
    for dst in FLOATS_AND_FP8 {
        assert!(
            get(d, "nan", &cast(&nans, dst))
                .f32()
                .iter()
                .all(|x| x.is_nan()),
            "{case}: NaN cast to {dst} ({})",
            h.backend()
        );
    }
}

fn run_elementwise<E: Device>(
    e: &E,
    dt: DType,
    src_dt: DType,
    a: &[f32],
    b: &[f32],
) -> Vec<Tensor> {
    let n = a.len();
    let mut ba = put(e, dt, a);
    let bb = put(e, dt, b);
    e.exec(Scale {
        x: &mut ba,
        alpha: -0.7,
    })
    .expect("scale");
    let mut sum = nan(e, dt, n);
    e.exec(Add {
        a: &ba,
        b: &bb,
        out: &mut sum,
    })
    .expect("add");
    let mut acc = put(e, dt, a);
    let src = put(e, src_dt, b);
    e.exec(AddAssign {
        dst: &mut acc,
        src: &src,
    })
    .expect("add_assign");
    vec![
        get(e, "scaled", &ba),
        get(e, "sum", &sum),
        get(e, "accumulated", &acc),
    ]
}

/// `scale`, `add` and `add_assign` (every source dtype into every destination dtype) on odd
/// and aligned lengths.
pub fn scale_add_add_assign<D: Device>(h: &Harness<D>) {
    let case = "scale_add_add_assign";
    let mut r = h.rng(case);
    for dt in FLOATS {
        for src_dt in FLOATS {
            for n in [1usize, 7, 8, 1000, 65536 + 3] {
                let a = r.vec(n, -4.0, 4.0);
                let b = r.vec(n, -4.0, 4.0);
                let got = run_elementwise(&h.dev, dt, src_dt, &a, &b);
                h.verify(
                    &format!("{case} {dt} (+= {src_dt}) n={n}"),
                    &got,
                    |c| run_elementwise(c, dt, src_dt, &a, &b),
                    || {
                        let a64 = rounded64(dt, &a);
                        let b64 = rounded64(dt, &b);
                        // The scaled value is stored (rounded) before the add reads it.
                        let scaled: Vec<f32> = a64.iter().map(|&x| (x * -0.7) as f32).collect();
                        let s64 = rounded64(dt, &scaled);
                        let bs = rounded64(src_dt, &b);
                        vec![
                            want("scaled", dt, a64.iter().map(|x| x * -0.7).collect()),
                            want(
                                "sum",
                                dt,
                                s64.iter().zip(&b64).map(|(x, y)| x + y).collect(),
                            ),
                            want(
                                "accumulated",
                                dt,
                                a64.iter().zip(&bs).map(|(x, y)| x + y).collect(),
                            ),
                        ]
                    },
                    &[Tol::ELEMENTWISE; 3],
                );
            }
        }
    }
    let d = &h.dev;
    let a = d.alloc(DType::F32, 8).unwrap();
    let b = d.alloc(DType::BF16, 8).unwrap();
    let mut o = d.alloc(DType::F32, 8).unwrap();
    assert!(
        matches!(
            d.exec(Add {
                a: &a,
                b: &b,
                out: &mut o
            }),
            Err(DeviceError::DTypeMismatch { .. })
        ),
        "{case}: add of mixed dtypes"
    );
    let short = d.alloc(DType::F32, 7).unwrap();
    assert!(
        matches!(
            d.exec(Add {
                a: &a,
                b: &short,
                out: &mut o
            }),
            Err(DeviceError::Shape { .. })
        ),
        "{case}: add of different lengths"
    );
}

fn run_gelu<E: Device>(e: &E, dt: DType, x: &[f32], dy: &[f32]) -> Vec<Tensor> {
    let bx = put(e, dt, x);
    let bdy = put(e, dt, dy);
    let mut y = nan(e, dt, x.len());
    e.exec(GeluForward {
        x: &bx,
        out: &mut y,
    })
    .expect("gelu_forward");
    let mut dx = nan(e, dt, x.len());
    e.exec(GeluBackward {
        x: &bx,
        dout: &bdy,
        dx: &mut dx,
    })
    .expect("gelu_backward");
    vec![get(e, "y", &y), get(e, "dx", &dx)]
}

/// GELU (tanh approximation) and its gradient against the analytic f64 forms.
pub fn gelu_forward_backward<D: Device>(h: &Harness<D>) {
    let case = "gelu_forward_backward";
    let mut r = h.rng(case);
    for dt in FLOATS {
        for n in [1usize, 7, 8, 1000, 65536 + 3] {
            let mut x = r.vec(n, -6.0, 6.0);
            if n > 4 {
                x[0] = 0.0;
                x[1] = -12.0;
                x[2] = 12.0;
            }
            let dy = r.vec(n, -2.0, 2.0);
            let got = run_gelu(&h.dev, dt, &x, &dy);
            h.verify(
                &format!("{case} {dt} n={n}"),
                &got,
                |c| run_gelu(c, dt, &x, &dy),
                || {
                    let x64 = rounded64(dt, &x);
                    let dy64 = rounded64(dt, &dy);
                    vec![
                        want("y", dt, reference::gelu(&x64)),
                        want(
                            "dx",
                            dt,
                            x64.iter()
                                .zip(&dy64)
                                .map(|(&a, &g)| reference::gelu_grad(a) * g)
                                .collect(),
                        ),
                    ]
                },
                &[Tol::Rel {
                    f32: 2e-5,
                    f16: 5e-3,
                    bf16: 1e-2,
                    fp8: 0.13,
                }; 2],
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_bias<E: Device>(
    e: &E,
    act: DType,
    pdt: DType,
    x: &[f32],
    bias: &[f32],
    d0: &[f32],
    rows: usize,
    c: usize,
) -> Vec<Tensor> {
    let mut bx = put(e, act, x);
    let bb = put(e, pdt, bias);
    e.exec(BiasAdd {
        x: &mut bx,
        bias: &bb,
        rows,
        c,
    })
    .expect("bias_add");
    let mut db = put(e, pdt, d0);
    e.exec(BiasBackward {
        dout: &bx,
        dbias: &mut db,
        rows,
        c,
    })
    .expect("bias_backward");
    vec![get(e, "x+bias", &bx), get(e, "dbias", &db)]
}

/// `bias_add` and `bias_backward` (accumulating) for every activation dtype with a bias of
/// that dtype or f32, on odd and large shapes; `bias_backward` is deterministic.
pub fn bias_add_and_backward<D: Device>(h: &Harness<D>) {
    let case = "bias_add_and_backward";
    let mut r = h.rng(case);
    for act in FLOATS {
        for pdt in [act, DType::F32] {
            for &(rows, c) in &[
                (1usize, 1usize),
                (37, 13),
                (256, 768),
                (1000, 96),
                (8192, 64),
            ] {
                let x = r.vec(rows * c, -2.0, 2.0);
                let bias = r.vec(c, -1.0, 1.0);
                let d0 = r.vec(c, -1.0, 1.0);
                let got = run_bias(&h.dev, act, pdt, &x, &bias, &d0, rows, c);
                h.verify(
                    &format!("{case} {act}+{pdt} {rows}x{c}"),
                    &got,
                    |cpu| run_bias(cpu, act, pdt, &x, &bias, &d0, rows, c),
                    || {
                        let y = reference::bias_add(&rounded64(act, &x), &rounded64(pdt, &bias), c);
                        let y32: Vec<f32> = y.iter().map(|&v| v as f32).collect();
                        let yr = rounded64(act, &y32);
                        let mut db = rounded64(pdt, &d0);
                        for (i, v) in yr.iter().enumerate() {
                            db[i % c] += v;
                        }
                        vec![want("x+bias", act, y), want("dbias", pdt, db)]
                    },
                    &[Tol::ELEMENTWISE, Tol::REDUCTION],
                );
                let again = run_bias(&h.dev, act, pdt, &x, &bias, &d0, rows, c);
                assert_eq!(
                    got[1].bytes, again[1].bytes,
                    "{case}: bias_backward {act}->{pdt} {rows}x{c} is not deterministic"
                );
            }
        }
    }
}
