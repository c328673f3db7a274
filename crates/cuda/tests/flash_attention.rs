//! The fused causal attention (`flash_attention_forward` / `_backward`) on CUDA against a plain
//! f64 host computation from the same bf16/f16-rounded inputs: output, log-sum-exp and every
//! part of dqkv, for head sizes 64 and 128 and sequence lengths that are and are not multiples
//! of the kernels' 64- and 128-row tiles, with every kernel version (selected per thread with
//! `CudaDevice::flash_attention_v1_on_this_thread` and `flash_backward_v3_on_this_thread`). Also checks that two runs give
//! bit-identical results and that unsupported dtypes, head sizes and wrong shapes are refused.
//! Without a CUDA device the tests print why they skip.

use duet_device::Fused;
use duet_cuda::CudaDevice;
use duet_device::{Buffer, DType, Device, DeviceError, DeviceExt};
use half::{bf16, f16};

/// Prints a skip notice straight to stderr, past the test harness's output capture.
macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn device(test: &str) -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            skip!("SKIP {test}: no usable CUDA device: {e}");
            None
        }
    }
}

/// Deterministic uniform values in [-amp, amp).
fn uniform(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// Rounds to `dtype` (bf16 or f16) and uploads; returns the buffer and the rounded values.
fn upload(dev: &CudaDevice, dtype: DType, x: &[f32]) -> (<CudaDevice as Device>::Buffer, Vec<f32>) {
    match dtype {
        DType::BF16 => {
            let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            let r = h.iter().map(|v| v.to_f32()).collect();
            (dev.upload_new(&h).unwrap(), r)
        }
        DType::F16 => {
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            let r = h.iter().map(|v| v.to_f32()).collect();
            (dev.upload_new(&h).unwrap(), r)
        }
        d => panic!("no upload for {d}"),
    }
}

struct Shape {
    b: usize,
    t: usize,
    nh: usize,
    hs: usize,
}

struct Reference {
    out: Vec<f64>,
    lse: Vec<f64>,
    dqkv: Vec<f64>,
}

/// Causal attention and its backward in f64, straight from the definitions.
fn reference(s: &Shape, qkv: &[f32], dout: &[f32], scale: f64) -> Reference {
    let (b, t, nh, hs) = (s.b, s.t, s.nh, s.hs);
    let at = |bb: usize, i: usize, w: usize, h: usize, d: usize| {
        (((bb * t + i) * 3 + w) * nh + h) * hs + d
    };
    let ot = |bb: usize, i: usize, h: usize, d: usize| ((bb * t + i) * nh + h) * hs + d;
    let mut out = vec![0.0f64; b * t * nh * hs];
    let mut lse = vec![0.0f64; b * nh * t];
    let mut dqkv = vec![0.0f64; 3 * b * t * nh * hs];
    let dot = |x: usize, y: usize, src_x: &[f32], src_y: &[f32]| -> f64 {
        (0..hs)
            .map(|d| src_x[x + d] as f64 * src_y[y + d] as f64)
            .sum()
    };
    for bb in 0..b {
        for h in 0..nh {
            // p[i][j] for j ≤ i.
            let mut p = vec![vec![0.0f64; t]; t];
            for i in 0..t {
                let sc: Vec<f64> = (0..=i)
                    .map(|j| scale * dot(at(bb, i, 0, h, 0), at(bb, j, 1, h, 0), qkv, qkv))
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = sc.iter().map(|&x| (x - m).exp()).sum();
                let lv = m + l.ln();
                lse[(bb * nh + h) * t + i] = lv;
                for j in 0..=i {
                    p[i][j] = (sc[j] - lv).exp();
                    for d in 0..hs {
                        out[ot(bb, i, h, d)] += p[i][j] * qkv[at(bb, j, 2, h, d)] as f64;
                    }
                }
            }
            for i in 0..t {
                let dp: Vec<f64> = (0..=i)
                    .map(|j| dot(ot(bb, i, h, 0), at(bb, j, 2, h, 0), dout, qkv))
                    .collect();
                let di: f64 = (0..=i).map(|j| p[i][j] * dp[j]).sum();
                for j in 0..=i {
                    let ds = p[i][j] * (dp[j] - di) * scale;
                    for d in 0..hs {
                        dqkv[at(bb, i, 0, h, d)] += ds * qkv[at(bb, j, 1, h, d)] as f64;
                        dqkv[at(bb, j, 1, h, d)] += ds * qkv[at(bb, i, 0, h, d)] as f64;
                        dqkv[at(bb, j, 2, h, d)] += p[i][j] * dout[ot(bb, i, h, d)] as f64;
                    }
                }
            }
        }
    }
    Reference { out, lse, dqkv }
}

/// max |got − want| / max |want| over the elements `pick` selects (absolute below 1e-3, where
/// the reference is zero, e.g. dq and dk for t = 1).
fn rel_err(got: &[f32], want: &[f64], pick: impl Fn(usize) -> bool) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if pick(i) {
            assert!(g.is_finite(), "element {i} is {g}");
            num = num.max((g as f64 - w).abs());
            den = den.max(w.abs());
        }
    }
    num / den.max(1e-3)
}

fn check_shape(dev: &CudaDevice, dtype: DType, s: &Shape, tol: f64) {
    let (b, t, nh, hs) = (s.b, s.t, s.nh, s.hs);
    let n = b * t * nh * hs;
    let scale = 1.0 / (hs as f32).sqrt();
    let (qkv, qkv_h) = upload(dev, dtype, &uniform(3 * n, (t * 31 + hs) as u64, 2.0));
    let (dout, dout_h) = upload(dev, dtype, &uniform(n, (t * 17 + nh) as u64 + 5, 1.0));
    let mut out = dev.alloc(dtype, n).unwrap();
    let mut lse = dev.alloc(DType::F32, b * nh * t).unwrap();
    let mut dqkv = dev.alloc(dtype, 3 * n).unwrap();
    dev.fill(&mut dqkv, f32::NAN).unwrap();
    dev.flash_attention_forward(&qkv, &mut out, &mut lse, b, t, nh, hs, scale)
        .unwrap();
    dev.flash_attention_backward(&qkv, &out, &dout, &lse, &mut dqkv, b, t, nh, hs, scale)
        .unwrap();
    let got_out = dev.download_f32(&out).unwrap();
    let got_lse = dev.download_f32(&lse).unwrap();
    let got_dqkv = dev.download_f32(&dqkv).unwrap();
    let r = reference(s, &qkv_h, &dout_h, scale as f64);

    let what = format!("{} {dtype} b={b} t={t} nh={nh} hs={hs}", version_name());
    let e_out = rel_err(&got_out, &r.out, |_| true);
    let e_lse = rel_err(&got_lse, &r.lse, |_| true);
    let part = |w: usize| move |i: usize| (i / (nh * hs)) % 3 == w;
    let (e_dq, e_dk, e_dv) = (
        rel_err(&got_dqkv, &r.dqkv, part(0)),
        rel_err(&got_dqkv, &r.dqkv, part(1)),
        rel_err(&got_dqkv, &r.dqkv, part(2)),
    );
    eprintln!(
        "{what}: out {e_out:.2e}  lse {e_lse:.2e}  dq {e_dq:.2e}  dk {e_dk:.2e}  dv {e_dv:.2e}"
    );
    for (name, e) in [
        ("out", e_out),
        ("lse", e_lse),
        ("dq", e_dq),
        ("dk", e_dk),
        ("dv", e_dv),
    ] {
        assert!(e <= tol, "{what}: {name} relative error {e:e} > {tol:e}");
    }
}

const SHAPES: &[(usize, usize, usize, usize)] = &[
    // (b, t, nh, hs)
    (1, 1, 2, 64),
    (1, 17, 2, 64),
    (2, 37, 3, 64),
    (1, 64, 2, 64),
    (1, 65, 1, 64),
    (1, 256, 2, 64),
    (1, 300, 1, 64),
    (1, 1, 1, 128),
    (1, 17, 1, 128),
    (1, 37, 2, 128),
    (2, 100, 2, 128),
    (1, 129, 1, 128),
    (1, 256, 1, 128),
    (1, 300, 1, 128),
];

/// The kernel versions to test: (name, select version 1, version-3 backward). "v3" is version
/// 2's forward with the version-3 backward (the default for head size 128).
const VERSIONS: [(&str, bool, bool); 3] = [
    ("v3", false, true),
    ("v2", false, false),
    ("v1", true, false),
];

/// The version selected on this thread, for messages.
fn version_name() -> &'static str {
    VERSION.with(std::cell::Cell::get)
}

thread_local! {
    static VERSION: std::cell::Cell<&'static str> = const { std::cell::Cell::new("default") };
}

/// Selects a kernel version for the calls made on this thread.
fn select(name: &'static str, v1: bool, v3: bool) {
    CudaDevice::flash_attention_v1_on_this_thread(Some(v1));
    CudaDevice::flash_backward_v3_on_this_thread(Some(v3));
    VERSION.with(|c| c.set(name));
}

fn check_all(test: &str, dtype: DType, tol: f64) {
    let Some(dev) = device(test) else { return };
    for (name, v1, v3) in VERSIONS {
        select(name, v1, v3);
        for &(b, t, nh, hs) in SHAPES {
            assert!(dev.capabilities().flash_attention(dtype, hs), "{dtype} hs={hs}");
            check_shape(&dev, dtype, &Shape { b, t, nh, hs }, tol);
        }
    }
}

#[test]
fn flash_attention_bf16_matches_f64_reference() {
    check_all(
        "flash_attention_bf16_matches_f64_reference",
        DType::BF16,
        1e-2,
    );
}

#[test]
fn flash_attention_f16_matches_f64_reference() {
    check_all(
        "flash_attention_f16_matches_f64_reference",
        DType::F16,
        2e-3,
    );
}

#[test]
fn flash_attention_is_deterministic() {
    let Some(dev) = device("flash_attention_is_deterministic") else {
        return;
    };
    for (dtype, hs, (version, v1, v3)) in [
        (DType::BF16, 64, VERSIONS[0]),
        (DType::F16, 128, VERSIONS[0]),
        (DType::F16, 64, VERSIONS[1]),
        (DType::BF16, 128, VERSIONS[1]),
        (DType::F16, 64, VERSIONS[2]),
        (DType::BF16, 128, VERSIONS[2]),
    ] {
        select(version, v1, v3);
        let (b, t, nh) = (2, 200, 4);
        let n = b * t * nh * hs;
        let scale = 1.0 / (hs as f32).sqrt();
        let (qkv, _) = upload(&dev, dtype, &uniform(3 * n, 3, 2.0));
        let (dout, _) = upload(&dev, dtype, &uniform(n, 4, 1.0));
        let run = || {
            let mut out = dev.alloc(dtype, n).unwrap();
            let mut lse = dev.alloc(DType::F32, b * nh * t).unwrap();
            let mut dqkv = dev.alloc(dtype, 3 * n).unwrap();
            dev.flash_attention_forward(&qkv, &mut out, &mut lse, b, t, nh, hs, scale)
                .unwrap();
            dev.flash_attention_backward(&qkv, &out, &dout, &lse, &mut dqkv, b, t, nh, hs, scale)
                .unwrap();
            (
                dev.download_bytes(&out, 0, n).unwrap(),
                dev.download_bytes(&lse, 0, b * nh * t).unwrap(),
                dev.download_bytes(&dqkv, 0, 3 * n).unwrap(),
            )
        };
        let (a, b2) = (run(), run());
        assert!(
            a.0 == b2.0,
            "{version} {dtype} hs={hs}: out differs between runs"
        );
        assert!(
            a.1 == b2.1,
            "{version} {dtype} hs={hs}: lse differs between runs"
        );
        assert!(
            a.2 == b2.2,
            "{version} {dtype} hs={hs}: dqkv differs between runs"
        );
    }
}

#[test]
fn flash_attention_refuses_what_it_does_not_support() {
    let Some(dev) = device("flash_attention_refuses_what_it_does_not_support") else {
        return;
    };
    for (dtype, hs, want) in [
        (DType::BF16, 64, true),
        (DType::BF16, 128, true),
        (DType::F16, 64, true),
        (DType::F16, 128, true),
        (DType::F32, 64, false),
        (DType::BF16, 32, false),
        (DType::F16, 96, false),
        (DType::BF16, 256, false),
    ] {
        assert_eq!(
            dev.capabilities().flash_attention(dtype, hs),
            want,
            "{dtype} hs={hs}"
        );
    }
    let (b, t, nh) = (1, 8, 2);
    let buffers = |dtype: DType, hs: usize| {
        let n = b * t * nh * hs;
        (
            dev.alloc(dtype, 3 * n).unwrap(),
            dev.alloc(dtype, n).unwrap(),
            dev.alloc(DType::F32, b * nh * t).unwrap(),
        )
    };
    let unsupported = |r: duet_device::Result<()>, what: &str| match r {
        Err(DeviceError::Unsupported { .. }) => {}
        other => panic!("{what}: expected Unsupported, got {other:?}"),
    };
    // Unsupported head size and dtype.
    let (qkv, mut out, mut lse) = buffers(DType::BF16, 32);
    unsupported(
        dev.flash_attention_forward(&qkv, &mut out, &mut lse, b, t, nh, 32, 0.1),
        "hs 32",
    );
    let (qkv, mut out, mut lse) = buffers(DType::F32, 64);
    unsupported(
        dev.flash_attention_forward(&qkv, &mut out, &mut lse, b, t, nh, 64, 0.1),
        "f32",
    );
    let mut dqkv = dev.alloc(DType::F32, qkv.len()).unwrap();
    unsupported(
        dev.flash_attention_backward(&qkv, &out, &out, &lse, &mut dqkv, b, t, nh, 64, 0.1),
        "f32 backward",
    );
    // Wrong lengths and dtypes.
    let (qkv, mut out, mut lse) = buffers(DType::BF16, 64);
    assert!(
        dev.flash_attention_forward(&qkv, &mut out, &mut lse, b, t + 1, nh, 64, 0.1)
            .is_err()
    );
    let mut lse16 = dev.alloc(DType::BF16, b * nh * t).unwrap();
    assert!(
        dev.flash_attention_forward(&qkv, &mut out, &mut lse16, b, t, nh, 64, 0.1)
            .is_err()
    );
    let mut out16 = dev.alloc(DType::F16, out.len()).unwrap();
    assert!(
        dev.flash_attention_forward(&qkv, &mut out16, &mut lse, b, t, nh, 64, 0.1)
            .is_err()
    );
    let mut short = dev.alloc(DType::BF16, qkv.len() - 1).unwrap();
    assert!(
        dev.flash_attention_backward(&qkv, &out, &out, &lse, &mut short, b, t, nh, 64, 0.1)
            .is_err()
    );
    // Empty shapes are fine.
    let (e0, mut e1, mut e2) = (
        dev.alloc(DType::BF16, 0).unwrap(),
        dev.alloc(DType::BF16, 0).unwrap(),
        dev.alloc(DType::F32, 0).unwrap(),
    );
    dev.flash_attention_forward(&e0, &mut e1, &mut e2, 0, t, nh, 64, 0.1)
        .unwrap();
    dev.synchronize().unwrap();
}
