//! Gradient accumulation (`grad_accum` K): a step's batch of 16 as K micro-batches against the
//! same batch in one pass, on the CPU, with the same f32 weight gradients on both sides (what
//! accumulation sums in): the losses, gradient norms and weights after several steps agree to
//! rounding in fp32, bf16 and fp8 with clipping engaged; the model is planned for the
//! micro-batch; validation gives the batch's loss; a resumed accumulating run continues with
//! the same bits; data-parallel ranks that accumulate (communicating once per step) match too;
//! bad settings are refused with a message.

use duet_cpu::CpuDevice;
use duet_engine::precision::WeightGradDtype;
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

const STEPS: usize = 5;

fn cfg(precision: Precision, k: usize) -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.train.data.batch = 16;
    c.train.data.grad_accum = k;
    c.train.recipe.precision = precision;
    // Clipping engages, so the step's whole gradient norm matters.
    c.train.optimizer.grad_clip = 0.5;
    // Accumulation keeps f32 weight gradients: so does the run it is compared with.
    c.train.recipe.weight_grad_dtype = WeightGradDtype::F32;
    c
}

struct Run {
    weights: Vec<Vec<f32>>,
    losses: Vec<f32>,
    norms: Vec<f32>,
    val: f32,
}

fn run(c: &Config) -> Run {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev, c.clone()).unwrap();
    assert_eq!(
        tr.model().batch_size(),
        c.train.data.batch / c.train.data.grad_accum,
        "the model is planned for one micro-batch"
    );
    let (mut losses, mut norms) = (vec![], vec![]);
    for _ in 0..STEPS {
        let r = tr.train_step().unwrap();
        losses.push(r.loss);
        norms.push(r.grad_norm);
    }
    let val = tr.validation_loss().unwrap();
    Run {
        weights: tr.checkpoint().unwrap().weights,
        losses,
        norms,
        val,
    }
}

fn rel(a: f32, b: f32) -> f32 {
    (a - b).abs() / b.abs().max(1e-12)
}

fn max_weight_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn accumulated_steps_match_the_whole_batch() {
    // (precision, loss and norm bound (relative), weight bound (absolute)). The micro-batches
    // sum the same per-row gradients in another order (and, in 16 bits, round activations
    // the same way: each row's forward pass does not depend on the batch), so only
    // summation-order differences remain; FP8's amax is taken over the whole step either way.
    for (precision, tol, wtol) in [
        (Precision::Fp32, 2e-5, 2e-6),
        (Precision::Bf16, 1e-3, 1e-4),
        (Precision::Fp8, 1e-3, 1e-4),
    ] {
        let whole = run(&cfg(precision, 1));
        for k in [2, 4] {
            let acc = run(&cfg(precision, k));
            let name = format!("{precision} grad_accum {k}");
            for s in 0..STEPS {
                let (l, n) = (
                    rel(acc.losses[s], whole.losses[s]),
                    rel(acc.norms[s], whole.norms[s]),
                );
                assert!(
                    l <= tol && n <= tol,
                    "{name} step {}: loss {} vs {} ({l:e}), norm {} vs {} ({n:e})",
                    s + 1,
                    acc.losses[s],
                    whole.losses[s],
                    acc.norms[s],
                    whole.norms[s]
                );
            }
            let w = max_weight_diff(&acc.weights, &whole.weights);
            assert!(w <= wtol, "{name}: weights differ by {w:e}");
            let v = rel(acc.val, whole.val);
            assert!(
                v <= tol,
                "{name}: validation {} vs {} ({v:e})",
                acc.val,
                whole.val
            );
        }
    }
}

#[test]
fn an_accumulating_run_resumes_with_the_same_bits() {
    let c = cfg(Precision::Bf16, 4);
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut straight = Trainer::new(dev.clone(), c.clone()).unwrap();
    let all: Vec<f32> = (0..6)
        .map(|_| straight.train_step().unwrap().loss)
        .collect();
    let mut first = Trainer::new(dev.clone(), c.clone()).unwrap();
    for _ in 0..3 {
        first.train_step().unwrap();
    }
    let ck = first.checkpoint().unwrap();
    let back = duet_engine::checkpoint::Checkpoint::from_bytes(&ck.to_bytes().unwrap()).unwrap();
    assert_eq!(back.config.train.data.grad_accum, 4);
    let mut resumed = Trainer::from_checkpoint(dev, &back).unwrap();
    let rest: Vec<f32> = (0..3).map(|_| resumed.train_step().unwrap().loss).collect();
    for (s, (a, b)) in rest.iter().zip(&all[3..]).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "step {}: {a} vs {b}", s + 4);
    }
}

#[test]
fn fp16_with_a_loss_scaler_accumulates() {
    let mut c = cfg(Precision::Fp16, 2);
    c.train.optimizer.grad_clip = 1.0;
    let whole = {
        let mut w = c.clone();
        w.train.data.grad_accum = 1;
        run(&w)
    };
    let acc = run(&c);
    for s in 0..STEPS {
        assert!(
            rel(acc.losses[s], whole.losses[s]) <= 1e-2,
            "fp16 step {}: {} vs {}",
            s + 1,
            acc.losses[s],
            whole.losses[s]
        );
    }
}

#[test]
fn bad_accumulation_settings_are_refused() {
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    for k in [0, 3, 32] {
        let e = Trainer::new(dev.clone(), cfg(Precision::Fp32, k))
            .err()
            .unwrap_or_else(|| panic!("grad_accum {k} accepted for batch 16"))
            .to_string();
        assert!(
            e.contains("grad_accum") && e.contains("divide the batch (16)"),
            "{k}: {e}"
        );
    }
}

/// The run's memory plan (what `duet bench` reports) counts the f32 sums of accumulation: one
/// f32 per (padded) parameter element beside the model's plan for the micro-batch, none at K 1.
#[test]
fn the_memory_plan_counts_the_accumulation_sums() {
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    for k in [1, 4] {
        let tr = Trainer::new(dev.clone(), cfg(Precision::Fp32, k)).unwrap();
        let sums: u64 = duet_engine::model::param_specs(&tr.config().model)
            .iter()
            .map(|s| 4 * s.device_numel() as u64)
            .sum();
        let extra = tr.memory_plan().total() - tr.model().memory_plan().total();
        assert_eq!(extra, if k > 1 { sums } else { 0 }, "grad_accum {k}");
        assert!(sums > 0);
    }
}

/// Two ranks of an in-process group, each accumulating two micro-batches of 4 (communication
/// after the last), with and without ZeRO-1 and the overlapped reduction, against one device
/// with the whole batch of 16.
#[test]
fn data_parallel_ranks_accumulate_like_the_whole_batch() {
    use duet_cpu::CpuGroup;
    use duet_engine::dist::DpOptions;
    let whole = run(&cfg(Precision::Fp32, 1));
    for (zero, overlap) in [(false, true), (false, false), (true, true)] {
        let devs: Vec<_> = (0..2)
            .map(|_| Arc::new(CpuDevice::new(Some(1)).unwrap()))
            .collect();
        let comms = CpuGroup::communicators(devs.clone()).unwrap();
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devs)
            .map(|(comm, dev)| {
                std::thread::spawn(move || {
                    let opts = DpOptions {
                        zero,
                        overlap,
                        ..DpOptions::default()
                    };
                    let c = cfg(Precision::Fp32, 2);
                    let mut tr = Trainer::new_data_parallel(dev, c, Arc::new(comm), opts).unwrap();
                    assert_eq!(tr.model().batch_size(), 4);
                    let losses: Vec<f32> =
                        (0..STEPS).map(|_| tr.train_step().unwrap().loss).collect();
                    let val = tr.validation_loss().unwrap();
                    (losses, tr.checkpoint().unwrap().weights, val)
                })
            })
            .collect();
        for h in handles {
            let (losses, weights, val) = h.join().unwrap();
            let name = format!("2 ranks × grad_accum 2, zero {zero}, overlap {overlap}");
            for (s, (got, want)) in losses.iter().zip(&whole.losses).enumerate() {
                let l = rel(*got, *want);
                assert!(l <= 2e-5, "{name} step {}: {got} vs {want}", s + 1);
            }
            let w = max_weight_diff(&weights, &whole.weights);
            assert!(w <= 2e-6, "{name}: weights differ by {w:e}");
            assert!(
                rel(val, whole.val) <= 2e-5,
                "{name}: validation {val} vs {}",
                whole.val
            );
        }
    }
}
