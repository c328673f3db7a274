//! A checkpoint whose training state makes no sense is refused on resume with what is wrong,
//! never trained on (an inf loss scale skipped every step; a negative second moment gave NaN two
//! steps later; an FP8 checkpoint without its scaling state silently reset the scales).

use duet_cpu::CpuDevice;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::train::{ADAM_STEPS_KEY, FP8_STATE_KEY};
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

fn checkpoint(precision: Precision) -> (Arc<CpuDevice>, Checkpoint) {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.steps = 4;
    cfg.train.recipe.precision = precision;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev.clone(), cfg).unwrap();
    for _ in 0..2 {
        tr.train_step().unwrap();
    }
    (dev, tr.checkpoint().unwrap())
}

fn refused(dev: &Arc<CpuDevice>, ck: &Checkpoint, needle: &str) {
    match Trainer::from_checkpoint(dev.clone(), ck) {
        Ok(_) => panic!("a checkpoint with {needle} was resumed"),
        Err(e) => assert!(e.to_string().contains(needle), "{e}"),
    }
}

#[test]
fn nonsense_training_state_is_refused_on_resume() {
    let (dev, ck) = checkpoint(Precision::Fp32);
    assert!(Trainer::from_checkpoint(dev.clone(), &ck).is_ok());
    let mut bad = ck.clone();
    bad.adam_v[3][0] = -1e-3;
    refused(&dev, &bad, "never negative");
    let mut bad = ck.clone();
    bad.extra.insert(ADAM_STEPS_KEY.into(), "9".into());
    refused(&dev, &bad, "above the step");
    let mut bad = ck.clone();
    bad.extra.insert(ADAM_STEPS_KEY.into(), "0".into());
    refused(&dev, &bad, "only a loss scaler skips steps");

    let (dev, ck) = checkpoint(Precision::Fp16);
    assert!(ck.loss_scaler.is_some());
    for scale in [f32::INFINITY, -1.0, f32::NAN, 0.0] {
        let mut bad = ck.clone();
        bad.loss_scaler = Some((scale, 0));
        refused(&dev, &bad, "is not a positive finite number");
    }

    let (dev, ck) = checkpoint(Precision::Fp8);
    assert!(Trainer::from_checkpoint(dev.clone(), &ck).is_ok());
    let mut bad = ck.clone();
    bad.extra.remove(FP8_STATE_KEY);
    refused(&dev, &bad, "without its FP8 scaling state");
    let json = ck.extra[FP8_STATE_KEY].clone();
    let mut ops: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    ops[0]["scale"] = serde_json::json!(-2.0);
    let mut bad = ck.clone();
    bad.extra
        .insert(FP8_STATE_KEY.into(), serde_json::to_string(&ops).unwrap());
    refused(&dev, &bad, "scale -2 is not a positive finite number");
    let mut ops: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    ops[1]["history"][0] = serde_json::json!(-0.5);
    let mut bad = ck.clone();
    bad.extra
        .insert(FP8_STATE_KEY.into(), serde_json::to_string(&ops).unwrap());
    refused(&dev, &bad, "amax history holds -0.5");
}
