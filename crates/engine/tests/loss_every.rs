//! Reading the loss back every N steps (`Trainer::train_steps`, `train.loss_every`) changes no
//! number: the same per-step losses, gradient norms and learning rates, and the same weights,
//! optimizer moments, data position and FP8 scaling state, bit for bit, as one
//! `Trainer::train_step` at a time — in every precision (fp16's loss scaler runs its steps one by
//! one), for groups that do not divide the run, and for calls longer than the device ring.

use duet_cpu::CpuDevice;
use duet_device::Runtime;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::train::{MAX_QUEUED_STEPS, StepReport};
use duet_engine::{Config, EngineError, Precision, Preset, Trainer};
use std::sync::Arc;

fn config(precision: Precision) -> Config {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.recipe.precision = precision;
    cfg
}

fn trainer(cfg: &Config) -> Trainer<CpuDevice> {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    Trainer::new(dev, cfg.clone()).unwrap()
}

/// Everything a report says except its wall time, as bits.
fn report_bits(r: &StepReport) -> (u64, u32, u32, u32, usize, Option<u32>, bool) {
    (
        r.step,
        r.loss.to_bits(),
        r.lr.to_bits(),
        r.grad_norm.to_bits(),
        r.tokens,
        r.loss_scale.map(f32::to_bits),
        r.skipped,
    )
}

/// Tensors as the bits of their values.
type Bits = Vec<Vec<u32>>;

fn bits(v: &[Vec<f32>]) -> Bits {
    v.iter()
        .map(|t| t.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// The run's whole resumable state, comparable bit for bit.
fn state(tr: &Trainer<CpuDevice>) -> (Bits, Bits, Bits, Checkpoint) {
    let ck = tr.checkpoint().unwrap();
    let (w, m, v) = (bits(&ck.weights), bits(&ck.adam_m), bits(&ck.adam_v));
    (w, m, v, ck)
}

/// `groups` calls of `train_steps` against as many single steps, from the same seed.
fn check(cfg: &Config, groups: &[usize], what: &str) {
    let total: usize = groups.iter().sum();
    let mut single = trainer(cfg);
    let a: Vec<_> = (0..total)
        .map(|_| report_bits(&single.train_step().unwrap()))
        .collect();
    let mut grouped = trainer(cfg);
    let mut b = Vec::new();
    for &k in groups {
        let reports = grouped.train_steps(k).unwrap();
        assert_eq!(reports.len(), k, "{what}: one report per step");
        b.extend(reports.iter().map(report_bits));
        assert_eq!(grouped.step(), b.len() as u64, "{what}: step count");
    }
    assert_eq!(a, b, "{what}: reports");
    assert!(a.iter().all(|r| f32::from_bits(r.1).is_finite()));
    let (wa, ma, va, cka) = state(&single);
    let (wb, mb, vb, ckb) = state(&grouped);
    assert!(wa == wb, "{what}: weights");
    assert!(ma == mb && va == vb, "{what}: AdamW moments");
    assert_eq!(cka.step, ckb.step, "{what}");
    assert_eq!(cka.data_state, ckb.data_state, "{what}: data position");
    assert_eq!(cka.loss_scaler, ckb.loss_scaler, "{what}: loss scaler");
    assert_eq!(cka.extra, ckb.extra, "{what}: FP8 state, AdamW steps");
    // And the next step continues identically.
    assert_eq!(
        report_bits(&single.train_step().unwrap()),
        report_bits(&grouped.train_step().unwrap()),
        "{what}: the step after"
    );
}

#[test]
fn train_steps_equal_single_steps_bit_for_bit() {
    for p in [
        Precision::Fp32,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
    ] {
        check(&config(p), &[6], &format!("{p}: 6 steps in one group"));
    }
}

#[test]
fn groups_that_do_not_divide_the_run_match() {
    let cfg = config(Precision::Fp32);
    check(&cfg, &[3, 3, 1], "7 steps in groups of 3");
    check(&cfg, &[1, 4, 2, 5], "uneven groups");
    check(&config(Precision::Fp8), &[3, 3, 1], "fp8, groups of 3");
    check(&config(Precision::Fp16), &[3, 3, 1], "fp16, groups of 3");
}

#[test]
fn calls_longer_than_the_ring_read_back_in_pieces() {
    let mut cfg = config(Precision::Fp32);
    cfg.train.steps = 100;
    check(&cfg, &[MAX_QUEUED_STEPS + 3], "a call longer than the ring");
}

#[test]
fn zero_steps_do_nothing_and_the_ring_is_allocated_once() {
    let mut cfg = config(Precision::Fp32);
    cfg.train.execution.loss_every = 4;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev.clone(), cfg).unwrap();
    assert!(tr.train_steps(0).unwrap().is_empty());
    assert_eq!(tr.step(), 0);
    tr.train_steps(4).unwrap();
    let after_first = dev.memory_stats().current;
    for k in [4, 2, 3, 4] {
        tr.train_steps(k).unwrap();
    }
    assert_eq!(tr.step(), 17);
    assert_eq!(
        dev.memory_stats().current,
        after_first,
        "no device allocation per call"
    );
}

/// A loss that overflows in the second step: the first is finite (initial weights), and the
/// enormous update makes the next logits infinite.
fn diverging() -> Config {
    let mut cfg = config(Precision::Fp32);
    cfg.train.optimizer.lr = 1e38;
    cfg.train.optimizer.warmup = 0;
    cfg.train.optimizer.grad_clip = 0.0;
    cfg
}

#[test]
fn a_divergence_inside_a_group_keeps_the_steps_before_it() {
    let cfg = diverging();
    let mut single = trainer(&cfg);
    let mut expected = Vec::new();
    let err = loop {
        match single.train_step() {
            Ok(r) => expected.push(report_bits(&r)),
            Err(e) => break e,
        }
        assert!(expected.len() < 6, "the run does not diverge");
    };
    let EngineError::Diverged { step, loss } = err else {
        panic!("expected a divergence, got {err}")
    };
    assert!(step >= 2 && !loss.is_finite(), "step {step}: loss {loss}");
    let mut grouped = trainer(&cfg);
    let reports = grouped.train_steps(8).unwrap();
    let got: Vec<_> = reports.iter().map(report_bits).collect();
    assert_eq!(got, expected, "the finite steps before the divergence");
    assert_eq!(grouped.step(), step - 1);
    // The divergence comes back from every later step and from checkpoint().
    let same = |e: EngineError| match e {
        EngineError::Diverged { step: s, loss: l } => {
            assert_eq!(s, step);
            assert_eq!(l.to_bits(), loss.to_bits());
        }
        other => panic!("expected the divergence, got {other}"),
    };
    same(grouped.train_steps(3).unwrap_err());
    same(grouped.train_step().unwrap_err());
    same(grouped.checkpoint().unwrap_err());
    // A group that starts with the diverging step fails at once, like a single step.
    let mut at_start = trainer(&cfg);
    at_start.train_steps(step as usize - 1).unwrap();
    same(at_start.train_steps(4).unwrap_err());
}

#[test]
fn loss_every_is_validated_and_defaults_to_ten() {
    let base = Config::preset(Preset::Default);
    assert_eq!(base.train.execution.loss_every, 10);
    let mut c = base.clone();
    c.train.execution.loss_every = 0;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("loss_every must be at least 1"), "{err}");
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let err = Trainer::new(dev, c).err().expect("refused").to_string();
    assert!(err.contains("loss_every"), "{err}");
    let c = Config::from_toml_str("[train]\nloss_every = 1\n", base.clone()).unwrap();
    assert_eq!(c.train.execution.loss_every, 1);
    c.validate().unwrap();
    let c = Config::from_toml_str("[train]\nloss_every = 0\n", base.clone()).unwrap();
    assert!(c.validate().is_err());
    assert!(Config::from_toml_str("[train]\nloss_every = -1\n", base.clone()).is_err());
    // Configs written before the field existed (checkpoints, traces) read as the default.
    let mut old: toml::Table = toml::from_str(&base.to_toml()).unwrap();
    old["train"].as_table_mut().unwrap().remove("loss_every");
    let c: Config = toml::Value::Table(old).try_into().unwrap();
    assert_eq!(c.train.execution.loss_every, 10);
}
