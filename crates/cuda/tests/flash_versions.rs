//! The conformance suite's flash-attention cases (crates/conformance, cases/attention.rs) once
//! per CUDA kernel version, selected for the test's thread with
//! `CudaDevice::flash_attention_v1_on_this_thread`, `flash_backward_v3_on_this_thread` and
//! `flash_backward_v4_on_this_thread` (tests/conformance.rs runs them with the default
//! selection only), and version 4's backward against version 2's, value for value. Also the
//! CUDA support table the kernels are built for. Without a usable CUDA device (or one older than
//! sm_80, which has no flash attention) every test prints `SKIP <test>: <reason>`.

use duet_conformance::harness::{get, put, skip};
use duet_conformance::{Harness, cases};
use duet_cuda::CudaDevice;
use duet_device::{DType, FlashAttentionBackward, FlashAttentionForward, Runtime};

fn open() -> Result<CudaDevice, String> {
    CudaDevice::new(0).map_err(|e| e.to_string())
}

/// A harness on a device with flash attention, or a SKIP line saying why there is none.
fn harness(test: &str) -> Option<Harness<CudaDevice>> {
    let dev = match open() {
        Ok(d) => d,
        Err(e) => {
            skip(test, &format!("backend not available: {e}"));
            return None;
        }
    };
    let arch = dev.info().arch;
    match arch.strip_prefix("sm_").and_then(|s| s.parse::<u32>().ok()) {
        Some(sm) if sm >= 80 => Some(Harness::new(dev, open)),
        _ => {
            skip(
                test,
                &format!("{arch} has no flash attention (needs sm_80+)"),
            );
            None
        }
    }
}

/// Runs the generic bodies with the kernel version (`v1`, version 3's backward `v3`, version
/// 4's backward `v4`) selected on this thread.
fn with_version(test: &str, v1: bool, v3: bool, v4: bool) {
    let Some(h) = harness(test) else { return };
    CudaDevice::flash_attention_v1_on_this_thread(Some(v1));
    CudaDevice::flash_backward_v3_on_this_thread(Some(v3));
    CudaDevice::flash_backward_v4_on_this_thread(Some(v4));
    for dt in [DType::BF16, DType::F16] {
        for hs in [64, 128] {
            assert!(
                h.dev.capabilities().flash_attention(dt, hs),
                "{test}: {dt} hs{hs} has no flash attention"
            );
        }
    }
    cases::flash_attention_matches_f64_reference(&h);
    cases::flash_attention_is_deterministic(&h);
    cases::flash_attention_matches_composition(&h);
    CudaDevice::flash_attention_v1_on_this_thread(None);
    CudaDevice::flash_backward_v3_on_this_thread(None);
    CudaDevice::flash_backward_v4_on_this_thread(None);
}

/// Version 2's forward with version 3's backward (the default for head size 128).
#[test]
fn flash_v3_backward() {
    with_version("flash_v3_backward", false, true, false);
}

/// Version 2's forward with version 4's backward (the default for head size 64).
#[test]
fn flash_v4_backward() {
    with_version("flash_v4_backward", false, false, true);
}

/// Version 2, forward and backward.
#[test]
fn flash_v2() {
    with_version("flash_v2", false, false, false);
}

/// Version 1.
#[test]
fn flash_v1() {
    with_version("flash_v1", true, false, false);
}

/// Version 4's backward (32 rows per warp, head size 64) gives version 2's dQ, dK and dV value
/// for value: the same products in the same order per element. Shapes with t below, at and
/// between the tile sizes (32, 64, 128) and past several tiles, in bf16 and f16.
#[test]
fn flash_v4_backward_equals_v2() {
    let test = "flash_v4_backward_equals_v2";
    let Some(h) = harness(test) else { return };
    let d = &h.dev;
    let mut r = h.rng(test);
    for dt in [DType::BF16, DType::F16] {
        for (b, t, nh) in [
            (1, 1, 1),
            (2, 37, 3),
            (1, 64, 2),
            (2, 127, 2),
            (1, 128, 1),
            (2, 200, 3),
            (1, 1024, 2),
            (1, 1031, 1),
        ] {
            let hs = 64;
            let n = b * t * nh * hs;
            let scale = 1.0 / (hs as f32).sqrt();
            let qkv = put(d, dt, &r.vec(3 * n, -2.0, 2.0));
            let dout = put(d, dt, &r.vec(n, -1.0, 1.0));
            let mut out = d.alloc(dt, n).unwrap();
            let mut lse = d.alloc(DType::F32, b * nh * t).unwrap();
            d.exec(FlashAttentionForward {
                qkv: &qkv,
                out: &mut out,
                lse: &mut lse,
                b,
                t,
                nh,
                hs,
                scale,
            })
            .unwrap();
            let mut grads = Vec::new();
            for v4 in [false, true] {
                CudaDevice::flash_backward_v3_on_this_thread(Some(false));
                CudaDevice::flash_backward_v4_on_this_thread(Some(v4));
                let mut dqkv = d.alloc(dt, 3 * n).unwrap();
                d.fill(&mut dqkv, f32::NAN).unwrap();
                d.exec(FlashAttentionBackward {
                    qkv: &qkv,
                    out: &out,
                    dout: &dout,
                    lse: &lse,
                    dqkv: &mut dqkv,
                    b,
                    t,
                    nh,
                    hs,
                    scale,
                })
                .unwrap();
                grads.push(get(d, "dqkv", &dqkv).f32());
            }
            CudaDevice::flash_backward_v3_on_this_thread(None);
            CudaDevice::flash_backward_v4_on_this_thread(None);
            let (v2, v4) = (&grads[0], &grads[1]);
            assert!(
                v2.iter().all(|x| x.is_finite()),
                "{test}: {dt} b{b} t{t} nh{nh}: version 2 left an element unwritten"
            );
            let diff = v2.iter().zip(v4).position(|(a, b)| a != b);
            assert!(
                diff.is_none(),
                "{test}: {dt} b{b} t{t} nh{nh}: element {} (of {}) is {} in version 2, {} in version 4",
                diff.unwrap(),
                v2.len(),
                v2[diff.unwrap()],
                v4[diff.unwrap()]
            );
        }
    }
}

/// The (dtype, head size) pairs the kernels exist for, and no others.
#[test]
fn flash_support_table() {
    let Some(h) = harness("flash_support_table") else {
        return;
    };
    for (dt, hs, want) in [
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
            h.dev.capabilities().flash_attention(dt, hs),
            want,
            "{dt} hs{hs}"
        );
    }
}
