//! FP8's calibration step (issue 53): a fresh FP8 scaling state has every scale at 1, where the
//! first backward pass would quantise gradients of order 1e-5 into E5M2's subnormals. The first
//! step's scales come from its own tensors' amaxes instead: its gradient norm lands on FP32's,
//! the amax histories hold only trained steps, and a run resumed from a step-0 checkpoint
//! calibrates as the uninterrupted one does.

use duet_cpu::CpuDevice;
use duet_engine::fp8::Fp8FastAccum;
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

/// The tiny model on 64 × 64 tokens: per-token loss gradients of 1/4096, so the first step's
/// output gradients sit near E5M2's smallest subnormal at scale 1.
fn cfg(precision: Precision) -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.train.data.batch = 64;
    c.train.data.seq = 64;
    c.model.max_seq = 64;
    c.train.recipe.precision = precision;
    c.train.recipe.fp8_fast_accum = Fp8FastAccum::None;
    c
}

fn trainer(c: &Config) -> Trainer<CpuDevice> {
    Trainer::new(Arc::new(CpuDevice::new(Some(2)).unwrap()), c.clone()).unwrap()
}

fn rel(a: f32, b: f32) -> f32 {
    (a - b).abs() / b.abs()
}

#[test]
fn the_first_fp8_step_takes_its_scales_from_its_own_amaxes() {
    let fp32 = trainer(&cfg(Precision::Fp32)).train_step().unwrap();
    let mut tr = trainer(&cfg(Precision::Fp8));
    let fp8 = tr.train_step().unwrap();
    // Uncalibrated (every scale 1 at step 1), the gradient norm was 1.7 % off FP32's here;
    // calibrated, 0.04 %.
    let e = rel(fp8.grad_norm, fp32.grad_norm);
    assert!(
        e < 5e-3,
        "step 1 gradient norm {} vs FP32's {} ({e:e})",
        fp8.grad_norm,
        fp32.grad_norm
    );
    // The histories hold the trained step's amax alone, not the calibration's.
    let ops = tr.model().fp8_state().unwrap().unwrap();
    for (i, o) in ops.iter().enumerate() {
        assert!(o.history[0] > 0.0, "operand {i}: {:?}", o.history);
        assert!(
            o.history[1..].iter().all(|&a| a == 0.0),
            "operand {i}: {:?}",
            o.history
        );
        assert!(o.scale != 1.0, "operand {i} kept the initial scale");
    }
}

#[test]
fn a_run_resumed_at_step_0_calibrates_like_the_uninterrupted_one() {
    let c = cfg(Precision::Fp8);
    let mut whole = trainer(&c);
    let a: Vec<_> = (0..2).map(|_| whole.train_step().unwrap()).collect();
    let ck = trainer(&c).checkpoint().unwrap();
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut resumed = Trainer::from_checkpoint(dev, &ck).unwrap();
    for (i, r) in a.iter().enumerate() {
        let b = resumed.train_step().unwrap();
        assert_eq!(
            (r.loss.to_bits(), r.grad_norm.to_bits()),
            (b.loss.to_bits(), b.grad_norm.to_bits()),
            "step {}",
            i + 1
        );
    }
}
