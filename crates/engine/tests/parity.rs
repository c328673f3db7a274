//! Traces and their comparison, on the CPU backend.

use duet_cpu::CpuDevice;
use duet_engine::trace::{ParityOutcome, Trace, TraceHeader, TraceWriter, compare};
use duet_engine::{Config, Preset, Trainer};
use std::sync::Arc;

/// Trains `steps` steps and returns the trace; `perturb` = (step, tensor index, factor) scales one
/// weight tensor right after that step.
fn traced_run(threads: usize, steps: u64, perturb: Option<(u64, usize, f32)>) -> Trace {
    traced_run_in(duet_engine::Precision::Fp32, threads, steps, perturb)
}

fn traced_run_in(
    precision: duet_engine::Precision,
    threads: usize,
    steps: u64,
    perturb: Option<(u64, usize, f32)>,
) -> Trace {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.recipe.precision = precision;
    let dev = Arc::new(CpuDevice::new(Some(threads)).unwrap());
    let mut tr = Trainer::new(dev, cfg.clone()).unwrap();
    let header = TraceHeader {
        kind: "header".into(),
        duet_version: "test".into(),
        git_rev: "test".into(),
        backend: "cpu".into(),
        device: format!("cpu x{threads}"),
        precision: precision.as_str().into(),
        seed: cfg.train.data.seed,
        config: cfg,
        fp8_family: None,
    };
    let mut buf = Vec::new();
    {
        let mut w = TraceWriter::new(&mut buf, &header).unwrap();
        for _ in 0..steps {
            let r = tr.train_step().unwrap();
            if let Some((at, idx, factor)) = perturb
                && r.step == at
            {
                let mut weights = tr.model().weights().unwrap();
                weights[idx].iter_mut().for_each(|x| *x *= factor);
                tr.model_mut().set_weights(&weights).unwrap();
            }
            w.record(tr.model(), r.step, r.loss, r.grad_norm, r.lr, None)
                .unwrap();
        }
        w.flush().unwrap();
    }
    Trace::parse(buf.as_slice()).unwrap()
}

#[test]
fn one_thread_matches_two_threads() {
    let a = traced_run(1, 8, None);
    let b = traced_run(2, 8, None);
    match compare(&a, &b).unwrap() {
        ParityOutcome::Match { steps, .. } => assert_eq!(steps, 8),
        other => panic!("expected a match, got {other:?}"),
    }
}

#[test]
fn same_config_is_bit_identical_run_to_run() {
    let a = traced_run(2, 5, None);
    let b = traced_run(2, 5, None);
    assert_eq!(a.steps, b.steps);
}

#[test]
fn perturbed_weight_is_found_at_the_right_step_and_tensor() {
    let cfg = Config::preset(Preset::Tiny);
    let specs = duet_engine::model::param_specs(&cfg.model);
    let idx = duet_engine::model::param_index(1, duet_engine::model::BlockParam::FcW);
    let a = traced_run(2, 10, None);
    let b = traced_run(2, 10, Some((6, idx, 1.001)));
    match compare(&a, &b).unwrap() {
        ParityOutcome::Diverged { step, quantity, .. } => {
            assert_eq!(step, 6);
            assert!(quantity.starts_with(&specs[idx].name), "{quantity}");
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
}

#[test]
fn different_configs_are_not_comparable() {
    let a = traced_run(1, 2, None);
    let mut b = a.clone();
    b.header.config.train.optimizer.lr *= 2.0;
    let err = compare(&a, &b).unwrap_err().to_string();
    assert!(err.contains("config.train.lr"), "{err}");
    let mut c = a.clone();
    c.header.seed += 1;
    assert!(compare(&a, &c).unwrap_err().to_string().contains("seed"));
}

#[test]
fn fp8_traces_carry_the_scaling_state() {
    let a = traced_run_in(duet_engine::Precision::Fp8, 1, 4, None);
    let b = traced_run_in(duet_engine::Precision::Fp8, 2, 4, None);
    let fp8 = a.steps[3]
        .fp8
        .as_ref()
        .expect("fp8 runs trace their scales");
    let (name, op) = fp8.iter().next().unwrap();
    assert!(op.scale > 0.0 && op.amax > 0.0, "{name}: {op:?}");
    assert!(matches!(
        compare(&a, &b).unwrap(),
        ParityOutcome::Match { .. }
    ));
    // A different amax is reported as an FP8 divergence at its step.
    let mut c = b.clone();
    let first = c.steps[2]
        .fp8
        .as_mut()
        .unwrap()
        .values_mut()
        .next()
        .unwrap();
    first.amax *= 2.0;
    match compare(&a, &c).unwrap() {
        ParityOutcome::Diverged { step, quantity, .. } => {
            assert_eq!(step, 3);
            assert!(
                quantity.starts_with("fp8 ") && quantity.ends_with(".amax"),
                "{quantity}"
            );
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
}
