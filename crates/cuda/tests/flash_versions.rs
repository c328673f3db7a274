//! The conformance suite's flash-attention cases (crates/conformance, cases/attention.rs) once
//! per CUDA kernel version, selected for the test's thread with
//! `CudaDevice::flash_attention_v1_on_this_thread` and `flash_backward_v3_on_this_thread`
//! (tests/conformance.rs runs them with the default selection only). Also the CUDA support table
//! the kernels are built for. Without a usable CUDA device (or one older than sm_80, which has no
//! flash attention) every test prints `SKIP <test>: <reason>`.

use duet_conformance::{Harness, cases, harness::skip};
use duet_cuda::CudaDevice;
use duet_device::{DType, Device};

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

/// Runs the generic bodies with the kernel version (`v1`, version 3's backward `v3`) selected
/// on this thread.
fn with_version(test: &str, v1: bool, v3: bool) {
    let Some(h) = harness(test) else { return };
    CudaDevice::flash_attention_v1_on_this_thread(Some(v1));
    CudaDevice::flash_backward_v3_on_this_thread(Some(v3));
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
}

/// Version 2's forward with version 3's backward (the default for head size 128).
#[test]
fn flash_v3_backward() {
    with_version("flash_v3_backward", false, true);
}

/// Version 2, forward and backward (the default for head size 64).
#[test]
fn flash_v2() {
    with_version("flash_v2", false, false);
}

/// Version 1.
#[test]
fn flash_v1() {
    with_version("flash_v1", true, false);
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
