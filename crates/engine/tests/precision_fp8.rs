//! FP8 on the CPU: the four codecs against the format definitions (all 256 codes), the CPU
//! backend's quantisation and FP8 GEMM emulation against those codecs, and the delayed-scaling
//! metadata driven by amaxes the device records.

use duet_cpu::CpuDevice;
use duet_device::Runtime;
use duet_device::{DType, DeviceExt, Fp8Format, GemmDesc, GemmFp8, QuantizeFp8};
use duet_engine::fp8::{AmaxAlgo, DelayedScaling, Fp8Family, Fp8Recipe, Fp8State};

/// What a code means, computed from the format definition alone (not from the codec):
/// `None` for NaN, else the value (±inf included).
fn by_definition(dtype: DType, code: u8) -> Option<f64> {
    let (exp_bits, man_bits, bias) = match dtype {
        DType::F8E4M3 => (4, 3, 7),
        DType::F8E5M2 => (5, 2, 15),
        DType::F8E4M3Fnuz => (4, 3, 8),
        DType::F8E5M2Fnuz => (5, 2, 16),
        _ => unreachable!(),
    };
    let fnuz = matches!(dtype, DType::F8E4M3Fnuz | DType::F8E5M2Fnuz);
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((code & 0x7f) >> man_bits) as i32;
    let m = (code & ((1 << man_bits) - 1)) as i32;
    let e_max = (1 << exp_bits) - 1;
    if fnuz && code == 0x80 {
        return None; // the only NaN; there is no negative zero
    }
    if dtype == DType::F8E4M3 && e == e_max && m == (1 << man_bits) - 1 {
        return None; // S.1111.111
    }
    if dtype == DType::F8E5M2 && e == e_max {
        return if m == 0 {
            Some(sign * f64::INFINITY)
        } else {
            None
        };
    }
    let frac = m as f64 / (1 << man_bits) as f64;
    Some(if e == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(e - bias)
    })
}

const FORMATS: [(DType, f64, usize); 4] = [
    // (dtype, max finite, number of NaN codes)
    (DType::F8E4M3, 448.0, 2),
    (DType::F8E5M2, 57344.0, 6),
    (DType::F8E4M3Fnuz, 240.0, 1),
    (DType::F8E5M2Fnuz, 57344.0, 1),
];

#[test]
fn all_256_codes_of_every_format_match_the_definitions() {
    for (dtype, max, nans) in FORMATS {
        let f = Fp8Format::of(dtype).unwrap();
        let mut nan_codes = 0;
        let mut finite_max = 0f64;
        for code in 0..=255u8 {
            let got = f.decode(code);
            match by_definition(dtype, code) {
                None => {
                    assert!(got.is_nan(), "{dtype} {code:#04x} must be NaN, got {got}");
                    nan_codes += 1;
                    assert_eq!(f.encode(got), f.nan_code());
                    assert!(f.decode(f.encode(f32::NAN)).is_nan());
                }
                Some(v) => {
                    assert_eq!(got as f64, v, "{dtype} {code:#04x}");
                    if v.is_finite() {
                        finite_max = finite_max.max(v.abs());
                        // Every finite code round-trips, negative zero included (OCP only).
                        assert_eq!(f.encode(got), code, "{dtype} {code:#04x} = {v}");
                    } else {
                        // ±inf (E5M2 only) saturates to ±max instead of staying infinite.
                        let back = f.encode(got);
                        assert_eq!(f.decode(back) as f64, v.signum() * max, "{dtype} saturates");
                    }
                }
            }
        }
        assert_eq!(nan_codes, nans, "{dtype}: number of NaN codes");
        assert_eq!(finite_max, max, "{dtype}: largest finite value");
        assert_eq!(f.max_finite() as f64, max);
        // Saturation: anything beyond ±max (and ±inf) encodes to ±max.
        for x in [max * 1.5, max * 1e3, f64::INFINITY] {
            assert_eq!(f.decode(f.encode(x as f32)) as f64, max, "{dtype} +{x}");
            assert_eq!(f.decode(f.encode(-x as f32)) as f64, -max, "{dtype} -{x}");
        }
        // Round to nearest even between the two smallest normal codes.
        let one = f.encode(1.0);
        let next = f.decode(one + 1);
        let mid = (1.0 + next) / 2.0;
        assert_eq!(f.encode(mid), one, "{dtype}: a tie rounds to the even code");
        let above = f32::from_bits(mid.to_bits() + 1);
        assert_eq!(f.encode(above), one + 1, "{dtype}: above the tie rounds up");
    }
    // FNUZ has no negative zero: -0.0 encodes to 0x00, and 0x80 is NaN, not -0.
    for dtype in [DType::F8E4M3Fnuz, DType::F8E5M2Fnuz] {
        let f = Fp8Format::of(dtype).unwrap();
        assert_eq!(f.encode(-0.0), 0x00);
        assert_eq!(f.encode(-1e-30), 0x00, "underflow to zero is unsigned");
        assert!(f.decode(0x80).is_nan());
    }
    // OCP keeps the sign of zero.
    assert_eq!(Fp8Format::E4M3.encode(-0.0), 0x80);
    assert_eq!(Fp8Format::E5M2.encode(-0.0), 0x80);
}

/// Values spanning several binades with both signs and a few beyond every FP8 range.
fn spread(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let u = s as f32 / u32::MAX as f32;
            if i % 53 == 0 {
                1e6 * (u - 0.5)
            } else {
                (u - 0.5) * 2f32.powf(u * 16.0 - 8.0)
            }
        })
        .collect()
}

#[test]
fn cpu_quantize_records_amax_and_uses_the_codec() {
    let dev = CpuDevice::new(Some(2)).unwrap();
    let (rows, cols) = (45, 70);
    let x = spread(rows * cols, 7);
    let src = dev.upload_new(&x).unwrap();
    for dtype in [
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
    ] {
        let f = Fp8Format::of(dtype).unwrap();
        let scale = dev.upload_new(&[3.0f32, 0.125]).unwrap();
        let mut amax = dev.upload_new(&[7.0f32, 1e9]).unwrap();
        let mut q = dev.alloc(dtype, rows * cols).unwrap();
        let mut qt = dev.alloc(dtype, rows * cols).unwrap();
        dev.exec(QuantizeFp8 {
            src: &src,
            dst: &mut q,
            dst_t: Some(&mut qt),
            rows,
            cols,
            scale: &scale,
            amax: &mut amax,
            slot: 0,
        })
        .unwrap();
        let codes: Vec<u8> = dev.download_bytes(&q, 0, rows * cols).unwrap();
        let tcodes: Vec<u8> = dev.download_bytes(&qt, 0, rows * cols).unwrap();
        for r in 0..rows {
            for c in 0..cols {
                let want = f.encode(x[r * cols + c] * 3.0);
                assert_eq!(codes[r * cols + c], want, "{dtype} ({r}, {c})");
                assert_eq!(tcodes[c * rows + r], want, "{dtype} transposed ({c}, {r})");
            }
        }
        let a: Vec<f32> = dev.download(&amax).unwrap();
        let true_max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(a[0], true_max.max(7.0), "amax = max(previous, max |x|)");
        assert_eq!(a[1], 1e9, "other slots untouched");
        // Errors are typed.
        let mut wrong = dev.alloc(DType::BF16, rows * cols).unwrap();
        assert!(
            dev.exec(QuantizeFp8 {
                src: &src,
                dst: &mut wrong,
                dst_t: None,
                rows,
                cols,
                scale: &scale,
                amax: &mut amax,
                slot: 0
            })
            .is_err()
        );
        assert!(
            dev.exec(QuantizeFp8 {
                src: &src,
                dst: &mut q,
                dst_t: None,
                rows,
                cols,
                scale: &scale,
                amax: &mut amax,
                slot: 2
            })
            .is_err(),
            "slot out of range"
        );
    }
}

#[test]
fn cpu_fp8_gemm_is_the_f32_gemm_of_the_decoded_values_times_scale_inv() {
    let dev = CpuDevice::new(Some(2)).unwrap();
    let (m, n, k) = (24, 40, 32);
    let a = spread(m * k, 3);
    let b = spread(n * k, 5);
    let scale = dev.upload_new(&[16.0f32, 0.5]).unwrap();
    let scale_inv = dev.upload_new(&[1.0 / 16.0f32, 2.0]).unwrap();
    let mut amax = dev.alloc(DType::F32, 2).unwrap();
    let (a32, b32) = (dev.upload_new(&a).unwrap(), dev.upload_new(&b).unwrap());
    let mut a8 = dev.alloc(DType::F8E4M3, m * k).unwrap();
    let mut b8 = dev.alloc(DType::F8E5M2, n * k).unwrap();
    dev.exec(QuantizeFp8 {
        src: &a32,
        dst: &mut a8,
        dst_t: None,
        rows: m,
        cols: k,
        scale: &scale,
        amax: &mut amax,
        slot: 0,
    })
    .unwrap();
    dev.exec(QuantizeFp8 {
        src: &b32,
        dst: &mut b8,
        dst_t: None,
        rows: n,
        cols: k,
        scale: &scale,
        amax: &mut amax,
        slot: 1,
    })
    .unwrap();
    let c0: Vec<f32> = spread(m * n, 9);
    let mut c = dev.upload_new(&c0).unwrap();
    let desc = GemmDesc::new(false, true, m, n, k).alpha(0.5).beta(1.0);
    dev.exec(GemmFp8 {
        desc: &desc,
        a: &a8,
        b: &b8,
        c: &mut c,
        scale_inv: &scale_inv,
        a_slot: 0,
        b_slot: 1,
    })
    .unwrap();
    let got: Vec<f32> = dev.download(&c).unwrap();
    let ad: Vec<f64> = dev
        .download_bytes(&a8, 0, m * k)
        .unwrap()
        .iter()
        .map(|&q| Fp8Format::E4M3.decode(q) as f64 / 16.0)
        .collect();
    let bd: Vec<f64> = dev
        .download_bytes(&b8, 0, n * k)
        .unwrap()
        .iter()
        .map(|&q| Fp8Format::E5M2.decode(q) as f64 * 2.0)
        .collect();
    let mut worst = 0f64;
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| ad[i * k + p] * bd[j * k + p]).sum();
            let want = 0.5 * dot + c0[i * n + j] as f64;
            let abs: f64 = (0..k).map(|p| (ad[i * k + p] * bd[j * k + p]).abs()).sum();
            let err = (got[i * n + j] as f64 - want).abs() / (abs + c0[i * n + j].abs() as f64);
            worst = worst.max(err);
        }
    }
    assert!(
        worst < 1e-6,
        "relative error {worst:e} beyond f32 accumulation"
    );
    // The quantised operands are within FP8 rounding of the originals.
    let rel = |x: f32, q: f64| ((x as f64 - q) / x as f64).abs();
    assert!(
        a.iter()
            .zip(&ad)
            .filter(|(x, _)| x.abs() * 16.0 > 0.02 && x.abs() * 16.0 < 440.0)
            .all(|(&x, &q)| rel(x, q) <= 1.0 / 16.0 + 1e-6),
        "E4M3 keeps 3 mantissa bits"
    );
    // OCP and FNUZ operands cannot be mixed.
    let mut fz = dev.alloc(DType::F8E4M3Fnuz, n * k).unwrap();
    dev.exec(QuantizeFp8 {
        src: &b32,
        dst: &mut fz,
        dst_t: None,
        rows: n,
        cols: k,
        scale: &scale,
        amax: &mut amax,
        slot: 1,
    })
    .unwrap();
    assert!(
        dev.exec(GemmFp8 {
            desc: &desc,
            a: &a8,
            b: &fz,
            c: &mut c,
            scale_inv: &scale_inv,
            a_slot: 0,
            b_slot: 1
        })
        .is_err()
    );
}

#[test]
fn delayed_scaling_follows_the_amaxes_the_device_records() {
    let dev = CpuDevice::new(Some(1)).unwrap();
    let cfg = DelayedScaling {
        recipe: Fp8Recipe::Hybrid,
        amax_history_len: 2,
        algo: AmaxAlgo::Max,
        margin: 1,
        ..DelayedScaling::default()
    };
    let mut st: Fp8State<CpuDevice> =
        Fp8State::allocate(&dev, cfg, Fp8Family::Ocp, &["lin".to_string()]).unwrap();
    assert_eq!((st.fwd, st.bwd), (DType::F8E4M3, DType::F8E5M2));
    let slot = Fp8State::<CpuDevice>::slot(0, duet_engine::fp8::Operand::GradOutput);
    assert_eq!(slot, 2);
    let mut q = dev.alloc(DType::F8E5M2, 4).unwrap();
    // Three steps with amax 4, 1, 0.5 on the gradient operand.
    let mut scales = Vec::new();
    for step_max in [4.0f32, 1.0, 0.5] {
        let x = dev.upload_new(&[step_max, -0.25, 0.0, 0.1]).unwrap();
        dev.exec(QuantizeFp8 {
            src: &x,
            dst: &mut q,
            dst_t: None,
            rows: 1,
            cols: 4,
            scale: &st.scale,
            amax: &mut st.amax,
            slot,
        })
        .unwrap();
        st.update(&dev).unwrap();
        let s: Vec<f32> = dev.download(&st.scale).unwrap();
        let inv: Vec<f32> = dev.download(&st.scale_inv).unwrap();
        assert_eq!(inv[slot], 1.0 / s[slot]);
        assert_eq!(
            dev.download::<f32>(&st.amax).unwrap(),
            [0.0; 3],
            "amax cleared"
        );
        scales.push(s);
    }
    // E5M2 max 57344, margin 1: 57344/4/2; max(1, 4) still 4; then max(0.5, 1) = 1.
    let g: Vec<f32> = scales.iter().map(|s| s[slot]).collect();
    assert_eq!(g, [7168.0, 7168.0, 28672.0]);
    // Operands that saw no data (amax 0) keep the initial scale 1.
    assert!(scales.iter().all(|s| s[0] == 1.0 && s[1] == 1.0));
    let rep = st.report(&dev, 4).unwrap();
    assert_eq!(rep[2].name, "lin.grad_output");
    assert_eq!(rep[2].amax_history, [0.5, 1.0]);
    assert_eq!(rep[2].dtype, "f8e5m2");
    // Export and import (checkpoints): a fresh state continues exactly where this one is.
    let mut fresh: Fp8State<CpuDevice> =
        Fp8State::allocate(&dev, cfg, Fp8Family::Ocp, &["lin".to_string()]).unwrap();
    fresh.import(&dev, &st.export(&dev).unwrap()).unwrap();
    assert_eq!(
        fresh.report(&dev, 16).unwrap(),
        st.report(&dev, 16).unwrap()
    );
    assert_eq!(
        dev.download::<f32>(&fresh.scale_inv).unwrap(),
        dev.download::<f32>(&st.scale_inv).unwrap()
    );
    let mut fnuz: Fp8State<CpuDevice> =
        Fp8State::allocate(&dev, cfg, Fp8Family::Fnuz, &["lin".to_string()]).unwrap();
    assert!(
        fnuz.import(&dev, &st.export(&dev).unwrap()).is_err(),
        "OCP state into an FNUZ model"
    );
}

#[test]
fn fp8_models_need_gemm_dimensions_divisible_by_16() {
    use duet_engine::model::{Gpt, init_weights};
    use duet_engine::precision::PrecisionPlan;
    use duet_engine::{Config, Precision, Preset};
    use std::sync::Arc;
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let mut cfg = Config::preset(Preset::Tiny).model;
    let w = init_weights(&cfg, 1);
    let plan = PrecisionPlan::new(Precision::Fp8);
    assert!(Gpt::with_precision(dev.clone(), &cfg, 4, 16, &w, plan).is_ok());
    let err = Gpt::with_precision(dev.clone(), &cfg, 3, 5, &w, plan)
        .err()
        .expect("15 rows are refused");
    assert!(err.to_string().contains("multiples of 16"), "{err}");
    cfg.ffn = 40;
    let w = init_weights(&cfg, 1);
    assert!(Gpt::with_precision(dev.clone(), &cfg, 4, 16, &w, plan).is_err());
    // Other precisions have no such rule.
    assert!(Gpt::with_precision(dev, &cfg, 3, 5, &w, PrecisionPlan::new(Precision::Bf16)).is_ok());
}
