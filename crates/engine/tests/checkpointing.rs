//! Activation checkpointing changes memory, not numbers: gradients after a step are bitwise
//! identical with and without it (CPU), in FP32, BF16 and FP8 — and with FP8 the scaling
//! metadata is identical too, because the recompute records no amax.

use duet_cpu::CpuDevice;
use duet_device::Runtime;
use duet_engine::precision::Precision;
use duet_engine::{Config, Preset, Trainer};
use std::sync::Arc;

fn config(precision: Precision, every: usize) -> Config {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.model.layers = 5; // not a multiple of 2 or 4: a short last segment
    cfg.train.recipe.precision = precision;
    cfg.train.execution.checkpoint_every = every;
    cfg
}

struct After {
    grads: Vec<Vec<f32>>,
    weights: Vec<Vec<f32>>,
    losses: Vec<f32>,
    fp8: Option<String>,
    activation_bytes: u64,
}

fn run(precision: Precision, every: usize, steps: usize) -> After {
    run_with(config(precision, every), steps)
}

fn run_with(cfg: Config, steps: usize) -> After {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev, cfg).unwrap();
    let losses = (0..steps).map(|_| tr.train_step().unwrap().loss).collect();
    After {
        grads: tr.model().gradients().unwrap(),
        weights: tr.model().weights().unwrap(),
        losses,
        fp8: tr.model().fp8_state().unwrap().map(|s| format!("{s:?}")),
        activation_bytes: tr.model().memory_plan().activations,
    }
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .collect()
}

#[test]
fn gradients_are_bitwise_identical_with_checkpointing() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp8] {
        let plain = run(precision, 0, 3);
        for every in [1, 2, 4] {
            let ck = run(precision, every, 3);
            assert_eq!(
                bits(&plain.grads),
                bits(&ck.grads),
                "{precision:?} every {every}: gradients"
            );
            assert_eq!(
                bits(&plain.weights),
                bits(&ck.weights),
                "{precision:?} every {every}: weights"
            );
            assert_eq!(
                plain.losses, ck.losses,
                "{precision:?} every {every}: losses"
            );
            assert_eq!(
                plain.fp8, ck.fp8,
                "{precision:?} every {every}: FP8 scaling state"
            );
            assert!(
                ck.activation_bytes < plain.activation_bytes,
                "{precision:?} every {every}: {} vs {} activation bytes",
                ck.activation_bytes,
                plain.activation_bytes
            );
        }
        if precision == Precision::Fp8 {
            assert!(plain.fp8.is_some());
        }
    }
}

#[test]
fn keeping_the_gelu_output_changes_memory_not_numbers() {
    // Recomputing gelu(fch) in the backward pass (the default) or keeping it from the forward
    // pass: the same bits, with and without checkpointing; FP8 never stores it.
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp8] {
        for every in [0, 2] {
            let recompute = run(precision, every, 2);
            let mut cfg = config(precision, every);
            cfg.train.execution.recompute_gelu = false;
            let kept = run_with(cfg, 2);
            let what = format!("{precision:?} every {every}");
            assert_eq!(
                bits(&recompute.grads),
                bits(&kept.grads),
                "{what}: gradients"
            );
            assert_eq!(
                bits(&recompute.weights),
                bits(&kept.weights),
                "{what}: weights"
            );
            assert_eq!(recompute.losses, kept.losses, "{what}: losses");
            assert_eq!(recompute.fp8, kept.fp8, "{what}: FP8 state");
            if precision == Precision::Fp8 {
                assert_eq!(kept.activation_bytes, recompute.activation_bytes, "{what}");
            } else {
                assert!(kept.activation_bytes > recompute.activation_bytes, "{what}");
            }
        }
    }
}

#[test]
fn checkpointing_every_block_saves_the_most() {
    let a = run(Precision::Fp32, 1, 1).activation_bytes;
    let b = run(Precision::Fp32, 2, 1).activation_bytes;
    let c = run(Precision::Fp32, 0, 1).activation_bytes;
    assert!(a < b && b < c, "{a} {b} {c}");
}

#[test]
fn fp8_recompute_records_no_amax() {
    use duet_engine::model::{Gpt, init_weights};
    use duet_engine::precision::PrecisionPlan;
    let cfg = config(Precision::Fp8, 2);
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg.model, 1);
    let plan = PrecisionPlan {
        checkpoint_every: 2,
        ..PrecisionPlan::new(Precision::Fp8)
    };
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let mut m = Gpt::with_precision(dev, &cfg.model, b, t, &weights, plan).unwrap();
    let tokens: Vec<i32> = (0..(b * t) as i32).map(|i| (i * 5 + 1) % 96).collect();
    m.forward(&tokens).unwrap();
    m.loss(&tokens, true).unwrap();
    let after_forward = m.fp8_recorded_amax().unwrap().unwrap();
    assert!(
        after_forward.iter().step_by(3).all(|&a| a > 0.0),
        "the forward records input amaxes"
    );
    // Forget what the forward recorded: the backward (with its recomputation of the first two
    // segments) may only record output-gradient amaxes (slot 3·i + 2).
    m.fp8_clear_recorded_amax().unwrap();
    m.zero_grads().unwrap();
    m.backward().unwrap();
    let amax = m.fp8_recorded_amax().unwrap().unwrap();
    for (slot, a) in amax.iter().enumerate() {
        if slot % 3 == 2 {
            assert!(*a > 0.0, "slot {slot}: output gradients are recorded");
        } else {
            assert_eq!(*a, 0.0, "slot {slot}: recomputation recorded an amax");
        }
    }
}

/// The memory estimate is the buffer table the model allocates: what the device's allocator
/// counts while the model is built equals the estimate's model part to the byte, and building
/// the optimizer adds exactly its optimizer part, in every precision and plan.
#[test]
fn memory_estimate_is_what_is_allocated() {
    use duet_engine::model::{Gpt, estimate_memory, init_weights};
    use duet_engine::optim::{AdamW, AdamWConfig};
    use duet_engine::precision::PrecisionPlan;
    let mut cfg = Config::preset(Preset::Default);
    cfg.train.data.batch = 4;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg.model, 1);
    let ocfg = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        grad_clip: 1.0,
    };
    for precision in Precision::ALL {
        for (every, low_grads, keep_gelu) in [(0, false, false), (1, false, true), (3, true, true)]
        {
            let plan = PrecisionPlan {
                checkpoint_every: every,
                low_precision_weight_grads: low_grads,
                keep_gelu_output: keep_gelu,
                ..PrecisionPlan::new(precision)
            };
            let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
            let est = estimate_memory(&*dev, &cfg.model, b, t, &plan).unwrap();
            let before = dev.memory_stats().current;
            let m = Gpt::with_precision(dev.clone(), &cfg.model, b, t, &weights, plan).unwrap();
            let model = dev.memory_stats().current - before;
            assert_eq!(
                model,
                est.model_bytes(),
                "{precision:?} every {every}: allocated vs estimated"
            );
            assert_eq!(m.memory_plan(), &est);
            let opt = if precision == Precision::Fp32 {
                AdamW::new(&*dev, ocfg, m.specs())
            } else {
                AdamW::with_masters(&*dev, ocfg, m.specs(), m.params(), &weights)
            }
            .unwrap();
            let optimizer = dev.memory_stats().current - before - model;
            assert_eq!(optimizer, est.optimizer, "{precision:?}: optimizer state");
            drop((m, opt));
            assert_eq!(
                dev.memory_stats().current,
                before,
                "{precision:?}: all freed"
            );
        }
    }
}
