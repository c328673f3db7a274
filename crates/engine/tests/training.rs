//! Trainer behaviour on the CPU reference backend.

use duet_cpu::CpuDevice;
use duet_device::Runtime;
use duet_engine::{Config, Preset, Trainer};
use std::sync::Arc;

fn tiny() -> Config {
    Config::preset(Preset::Tiny)
}

#[test]
fn buffers_are_planned_once() {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev.clone(), tiny()).unwrap();
    tr.train_step().unwrap();
    let after_one = dev.memory_stats();
    for _ in 0..4 {
        tr.train_step().unwrap();
    }
    let after_five = dev.memory_stats();
    assert_eq!(
        after_one.current, after_five.current,
        "no device allocation per step"
    );
    assert_eq!(after_one.peak, after_five.peak);
    assert!(after_five.current >= tr.model().memory_plan().params);
}

#[test]
fn same_seed_same_losses_and_thread_count_does_not_matter() {
    let run = |threads: usize| {
        let dev = Arc::new(CpuDevice::new(Some(threads)).unwrap());
        let mut tr = Trainer::new(dev, tiny()).unwrap();
        (0..6)
            .map(|_| tr.train_step().unwrap().loss)
            .collect::<Vec<f32>>()
    };
    let a = run(2);
    assert_eq!(a, run(2), "run to run");
    let b = run(1);
    for (x, y) in a.iter().zip(&b) {
        assert!(((x - y) / x).abs() < 1e-5, "1 vs 2 threads: {a:?} vs {b:?}");
    }
    let mut other = tiny();
    other.train.data.seed += 1;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev, other).unwrap();
    assert_ne!(
        tr.train_step().unwrap().loss,
        a[0],
        "the seed changes the run"
    );
}

#[test]
fn loss_falls() {
    let mut cfg = tiny();
    cfg.train.steps = 40;
    cfg.train.optimizer.lr = 1e-2;
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    let mut tr = Trainer::new(dev, cfg).unwrap();
    let first = tr.train_step().unwrap();
    assert!(
        (first.loss - 96f32.ln()).abs() < 0.3,
        "initial loss {} ≈ ln 96",
        first.loss
    );
    let mut last = first.clone();
    for _ in 1..40 {
        last = tr.train_step().unwrap();
    }
    assert_eq!(last.step, 40);
    assert!(
        last.loss < first.loss - 0.7,
        "loss {} → {}",
        first.loss,
        last.loss
    );
}

#[test]
fn bad_tokens_are_rejected() {
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let mut tr = Trainer::new(dev, tiny()).unwrap();
    let n = 4 * 16;
    let mut x = vec![1i32; n];
    x[3] = 96;
    let err = tr.train_step_on(&x, &vec![1; n]).unwrap_err().to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
    let err = tr
        .train_step_on(&vec![1; n - 1], &vec![1; n - 1])
        .unwrap_err()
        .to_string();
    assert!(err.contains("planned for 4 × 16"), "{err}");
}
