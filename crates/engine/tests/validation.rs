//! Validating changes nothing the training computes: a run that computes the validation loss
//! after every step takes the same steps, bit for bit, as one that never validates, in every
//! precision (FP8's forward passes record amaxes into the delayed-scaling state; the
//! validation puts that state back).

use duet_cpu::CpuDevice;
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

#[test]
fn validation_leaves_the_training_unchanged() {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    for precision in Precision::ALL {
        let mut cfg = Config::preset(Preset::Tiny);
        cfg.train.recipe.precision = precision;
        cfg.train.data.eval_sequences = 0;
        let mut plain = Trainer::new(dev.clone(), cfg.clone()).unwrap();
        let mut validated = Trainer::new(dev.clone(), cfg).unwrap();
        assert!(validated.has_validation_data());
        let mut vals = Vec::new();
        for step in 1..=6 {
            let a = plain.train_step().unwrap();
            let b = validated.train_step().unwrap();
            vals.push(validated.validation_loss().unwrap());
            assert_eq!(
                (a.loss.to_bits(), a.grad_norm.to_bits()),
                (b.loss.to_bits(), b.grad_norm.to_bits()),
                "{precision} step {step}: validating changed the training"
            );
        }
        assert!(vals.iter().all(|v| v.is_finite()), "{precision}: {vals:?}");
        // The checks above can fail: the validation itself moves the FP8 state it restores.
        if precision == Precision::Fp8 {
            let before = validated.model().fp8_state().unwrap();
            validated.validation_loss().unwrap();
            assert_eq!(validated.model().fp8_state().unwrap(), before);
        }
    }
}
