//! Mixed-precision training on the CPU: master weights, FP16 loss scaling (an overflow skips
//! the step and halves the scale), and convergence — bf16, fp16 and fp8 reach the same greedy
//! accuracy on the arithmetic task as fp32 within the same number of steps.

use duet_cpu::CpuDevice;
use duet_device::{DType, DeviceExt};
use duet_engine::model::{Gpt, init_weights};
use duet_engine::optim::{AdamW, AdamWConfig, StepStats};
use duet_engine::precision::LossScaler;
use duet_engine::precision::PrecisionPlan;
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::{Arc, OnceLock};

fn opt_cfg(c: &Config) -> AdamWConfig {
    let t = &c.train;
    AdamWConfig {
        beta1: t.optimizer.beta1,
        beta2: t.optimizer.beta2,
        eps: t.optimizer.eps,
        weight_decay: t.optimizer.weight_decay,
        grad_clip: t.optimizer.grad_clip,
    }
}

#[test]
fn working_copies_are_low_precision_and_masters_fp32() {
    let cfg = Config::preset(Preset::Tiny);
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let w = init_weights(&cfg.model, 1);
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let model = Gpt::with_precision(
        dev.clone(),
        &cfg.model,
        b,
        t,
        &w,
        PrecisionPlan::new(Precision::Bf16),
    )
    .unwrap();
    let opt = AdamW::with_masters(&*dev, opt_cfg(&cfg), model.specs(), model.params(), &w).unwrap();
    for (i, (spec, p)) in model.specs().iter().zip(model.params()).enumerate() {
        // Matrices, embeddings and the linear layers' biases are bf16 (with f32 masters);
        // LayerNorm parameters stay f32.
        let low = spec.decay || (spec.name.ends_with(".bias") && !spec.name.contains("ln_"));
        assert_eq!(low, spec.low_precision(), "{}", spec.name);
        let expect = if low { DType::BF16 } else { DType::F32 };
        assert_eq!(duet_device::Buffer::dtype(p), expect, "{}", spec.name);
        assert_eq!(opt.master(i).is_some(), low, "{}", spec.name);
    }
    // Masters hold the exact f32 initial weights; the working copy their bf16 rounding.
    let masters = opt.master_weights(&*dev, model.params()).unwrap();
    assert_eq!(masters, w);
    let working = model.weights().unwrap();
    let rounded: Vec<f32> = w[0]
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(working[0], rounded);
}

/// FP8: the linear layers' weight matrices are held in f32 with no master copy (they reach the
/// GEMMs only as FP8 codes of the f32 values); everything else as in BF16 (16-bit working
/// copies with f32 masters, LayerNorm parameters f32). The optimizer updates those weights in
/// place, and the memory plan counts 2 bytes per weight less than BF16's.
#[test]
fn fp8_linear_weights_are_f32_without_masters() {
    let cfg = Config::preset(Preset::Tiny);
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let w = init_weights(&cfg.model, 1);
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let model = |p: Precision| {
        Gpt::with_precision(dev.clone(), &cfg.model, b, t, &w, PrecisionPlan::new(p)).unwrap()
    };
    let (fp8, bf16) = (model(Precision::Fp8), model(Precision::Bf16));
    let opt = AdamW::with_masters(&*dev, opt_cfg(&cfg), fp8.specs(), fp8.params(), &w).unwrap();
    let mut linear = 0;
    for (i, (spec, p)) in fp8.specs().iter().zip(fp8.params()).enumerate() {
        let is_linear = spec.decay && !spec.name.contains(".wte.") && !spec.name.contains(".wpe.");
        let low = spec.low_precision() && !is_linear;
        let expect = if low { DType::BF16 } else { DType::F32 };
        assert_eq!(duet_device::Buffer::dtype(p), expect, "{}", spec.name);
        assert_eq!(opt.master(i).is_some(), low, "{}", spec.name);
        linear += usize::from(is_linear);
    }
    assert_eq!(linear, 4 * cfg.model.layers);
    // The weights are the exact initial values.
    assert_eq!(opt.master_weights(&*dev, fp8.params()).unwrap(), w);
    let weights: usize = fp8
        .specs()
        .iter()
        .filter(|s| s.decay && !s.name.contains(".wte.") && !s.name.contains(".wpe."))
        .map(|s| s.numel())
        .sum();
    let (p8, p16) = (fp8.memory_plan().params, bf16.memory_plan().params);
    assert_eq!(p8, p16 + 2 * weights as u64, "params bytes");
    let (o8, o16) = (fp8.memory_plan().optimizer, bf16.memory_plan().optimizer);
    assert_eq!(o8 + 4 * weights as u64, o16, "optimizer bytes");
}

type StepOutcome = (StepStats, Vec<Vec<f32>>, Vec<Vec<f32>>, u64);

/// One fp16 step with a given scaler: (its stats, master weights before, after, Adam steps).
fn fp16_step(scaler: &mut LossScaler) -> StepOutcome {
    let cfg = Config::preset(Preset::Tiny);
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let w = init_weights(&cfg.model, 3);
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let mut model = Gpt::with_precision(
        dev.clone(),
        &cfg.model,
        b,
        t,
        &w,
        PrecisionPlan::new(Precision::Fp16),
    )
    .unwrap();
    let mut opt =
        AdamW::with_masters(&*dev, opt_cfg(&cfg), model.specs(), model.params(), &w).unwrap();
    let v = cfg.model.vocab as i32;
    let inputs: Vec<i32> = (0..(b * t) as i32).map(|i| (i * 7) % v).collect();
    let targets: Vec<i32> = inputs.iter().map(|&x| (x + 7) % v).collect();
    model.set_loss_scale(scaler.scale());
    model.forward(&inputs).unwrap();
    model.loss(&targets, true).unwrap();
    model.zero_grads().unwrap();
    model.backward().unwrap();
    let before = opt.master_weights(&*dev, model.params()).unwrap();
    let (params, grads) = model.params_and_grads();
    let stats = opt
        .step_scaled(&*dev, params, grads, 1e-3, Some(scaler))
        .unwrap();
    let after = opt.master_weights(&*dev, model.params()).unwrap();
    (stats, before, after, opt.steps_taken())
}

#[test]
fn fp16_overflow_skips_the_step_and_halves_the_scale() {
    // 2^40 times the loss gradient overflows f16 (max 65504) in the logits' gradient.
    let mut scaler = LossScaler::dynamic_with(2f32.powi(40), 2000);
    let (stats, before, after, taken) = fp16_step(&mut scaler);
    assert!(stats.skipped, "an inf/NaN gradient must skip the step");
    assert!(!stats.grad_norm.is_finite());
    assert_eq!(stats.loss_scale, 2f32.powi(40));
    assert_eq!(scaler.scale(), 2f32.powi(39), "the dynamic scale halves");
    assert_eq!(scaler.skipped_total(), 1);
    assert_eq!(before, after, "skipped: no weight changes");
    assert_eq!(taken, 0, "skipped: Adam's step count does not advance");

    // The default 2^16 does not overflow here: the step is applied, with the gradient norm
    // unscaled to what an unscaled step would see.
    let mut ok = LossScaler::dynamic();
    let (stats, before, after, taken) = fp16_step(&mut ok);
    assert!(!stats.skipped);
    assert!(stats.grad_norm.is_finite() && stats.grad_norm > 0.0 && stats.grad_norm < 100.0);
    assert_eq!(ok.scale(), 65536.0);
    assert_ne!(before, after);
    assert_eq!(taken, 1);
    // Same step with a static scale of 1024: the unscaled norm agrees with 2^16's to f16 noise.
    let mut fixed = LossScaler::fixed(1024.0);
    let (s2, ..) = fp16_step(&mut fixed);
    let rel = ((s2.grad_norm - stats.grad_norm) / stats.grad_norm).abs();
    assert!(
        rel < 1e-2,
        "unscaled norms {} vs {}",
        s2.grad_norm,
        stats.grad_norm
    );
}

/// The arithmetic task, Default preset, 300 steps, greedy accuracy on held-out progressions.
fn accuracy(p: Precision) -> (f64, f32, u64) {
    let mut cfg = Config::preset(Preset::Default);
    cfg.train.steps = 300;
    cfg.train.data.max_stride = 8;
    cfg.train.recipe.precision = p;
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    let mut tr = Trainer::new(dev, cfg.clone()).unwrap();
    let mut last = f32::NAN;
    let mut skipped = 0;
    for _ in 0..cfg.train.steps {
        let r = tr.train_step().unwrap();
        last = r.loss;
        skipped += r.skipped as u64;
    }
    let e = tr.evaluate_generation(64).unwrap();
    eprintln!(
        "{p}: final loss {last:.4}, greedy accuracy {:.1}% exact, {:.2}% tokens, {skipped} skipped",
        100.0 * e.accuracy(),
        100.0 * e.token_accuracy
    );
    (e.accuracy(), last, skipped)
}

fn fp32_baseline() -> (f64, f32, u64) {
    static B: OnceLock<(f64, f32, u64)> = OnceLock::new();
    *B.get_or_init(|| accuracy(Precision::Fp32))
}

fn converges_like_fp32(p: Precision) {
    let (base, base_loss, _) = fp32_baseline();
    assert!(base >= 0.9, "fp32 itself must learn the task ({base})");
    let (acc, loss, skipped) = accuracy(p);
    assert!(
        acc >= base - 0.02,
        "{p}: greedy accuracy {acc} vs fp32 {base} after the same 300 steps"
    );
    assert!(
        (loss - base_loss).abs() < 0.05,
        "{p}: final loss {loss} vs fp32 {base_loss}"
    );
    assert_eq!(skipped, 0, "{p}: no step should overflow on this task");
}

#[test]
fn bf16_reaches_fp32_accuracy() {
    converges_like_fp32(Precision::Bf16);
}

#[test]
fn fp16_reaches_fp32_accuracy() {
    converges_like_fp32(Precision::Fp16);
}

#[test]
fn fp8_reaches_fp32_accuracy() {
    converges_like_fp32(Precision::Fp8);
}

/// Train 12 steps straight, or 6 + checkpoint round trip + 6: the losses must be identical.
fn resume_is_exact(p: Precision) {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.steps = 12;
    cfg.train.recipe.precision = p;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut full = Trainer::new(dev.clone(), cfg.clone()).unwrap();
    let all: Vec<f32> = (0..12).map(|_| full.train_step().unwrap().loss).collect();
    let mut first = Trainer::new(dev.clone(), cfg).unwrap();
    for _ in 0..6 {
        first.train_step().unwrap();
    }
    let bytes = first.checkpoint().unwrap().to_bytes().unwrap();
    drop(first);
    let ck = duet_engine::checkpoint::Checkpoint::from_bytes(&bytes).unwrap();
    let mut resumed = Trainer::from_checkpoint(dev, &ck).unwrap();
    let rest: Vec<f32> = (0..6).map(|_| resumed.train_step().unwrap().loss).collect();
    assert_eq!(&all[6..], &rest[..], "{p}: losses after resume");
}

#[test]
fn mixed_precision_resume_is_exact() {
    for p in [Precision::Bf16, Precision::Fp16, Precision::Fp8] {
        resume_is_exact(p);
    }
}

#[test]
fn fp16_resume_after_skipped_steps_is_exact() {
    // A dynamic scale starting at 2^40 overflows f16 for the first steps (skipped, halving)
    // until it fits; resuming must restore the scale, its clean-step count and Adam's own step
    // count (which trails the run's steps by the skipped ones).
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.steps = 40;
    cfg.train.recipe.precision = Precision::Fp16;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let start = || Some(LossScaler::dynamic_with(2f32.powi(40), 7));
    let mut full = Trainer::new(dev.clone(), cfg.clone()).unwrap();
    full.set_loss_scaler(start());
    let reports: Vec<_> = (0..40).map(|_| full.train_step().unwrap()).collect();
    let skipped = reports.iter().filter(|r| r.skipped).count();
    assert!(skipped >= 2, "the test needs skipped steps ({skipped})");
    assert!(
        reports[39].loss < reports[0].loss,
        "training continues after the skips"
    );
    assert_eq!(full.optimizer().steps_taken(), 40 - skipped as u64);

    let mut first = Trainer::new(dev.clone(), cfg).unwrap();
    first.set_loss_scaler(start());
    for _ in 0..20 {
        first.train_step().unwrap();
    }
    let bytes = first.checkpoint().unwrap().to_bytes().unwrap();
    drop(first);
    let ck = duet_engine::checkpoint::Checkpoint::from_bytes(&bytes).unwrap();
    let mut resumed = Trainer::from_checkpoint(dev, &ck).unwrap();
    // from_checkpoint restores the scale and clean-step count into the configured scaler
    // (growth every 2000 steps); this test grows every 7, so restore into such a scaler.
    let (scale, clean) = ck.loss_scaler.expect("fp16 saves its scaler");
    assert_eq!(resumed.loss_scaler().unwrap().scale(), scale);
    let mut s = LossScaler::dynamic_with(1.0, 7);
    s.restore_state(scale, clean);
    resumed.set_loss_scaler(Some(s));
    let rest: Vec<_> = (0..20).map(|_| resumed.train_step().unwrap()).collect();
    for (a, b) in reports[20..].iter().zip(&rest) {
        assert_eq!(
            (a.loss, a.loss_scale, a.skipped),
            (b.loss, b.loss_scale, b.skipped),
            "step {}",
            a.step
        );
    }
}

/// Gradients of one bf16 step on a fixed batch, with the linear layers' weight gradients in
/// bf16 or in f32: (the gradient dtypes, the gradients as f32).
fn bf16_grads(low_grads: bool) -> (Vec<DType>, Vec<Vec<f32>>) {
    let cfg = Config::preset(Preset::Tiny);
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let w = init_weights(&cfg.model, 5);
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let plan = PrecisionPlan {
        low_precision_weight_grads: low_grads,
        ..PrecisionPlan::new(Precision::Bf16)
    };
    let mut model = Gpt::with_precision(dev.clone(), &cfg.model, b, t, &w, plan).unwrap();
    let v = cfg.model.vocab as i32;
    let inputs: Vec<i32> = (0..(b * t) as i32).map(|i| (i * 5 + 1) % v).collect();
    let targets: Vec<i32> = inputs.iter().map(|&x| (x + 5) % v).collect();
    model.forward(&inputs).unwrap();
    model.loss(&targets, true).unwrap();
    model.zero_grads().unwrap();
    model.backward().unwrap();
    let dtypes = model
        .grads()
        .iter()
        .map(duet_device::Buffer::dtype)
        .collect();
    let grads = model
        .grads()
        .iter()
        .map(|g| dev.download_f32(g).unwrap())
        .collect();
    (dtypes, grads)
}

#[test]
fn bf16_weight_gradients_are_the_rounded_f32_ones() {
    // The weight-gradient GEMMs accumulate in f32 either way; bf16 storage rounds that result
    // once (what PyTorch autocast hands its optimizer). Everything else is unchanged.
    let (dt32, g32) = bf16_grads(false);
    let (dt16, g16) = bf16_grads(true);
    let cfg = Config::preset(Preset::Tiny);
    let specs = duet_engine::model::param_specs(&cfg.model);
    let mut linear = 0;
    for (i, spec) in specs.iter().enumerate() {
        assert_eq!(dt32[i], DType::F32, "{}", spec.name);
        let is_linear = spec.decay && !spec.name.contains(".wte.") && !spec.name.contains(".wpe.");
        if is_linear {
            linear += 1;
            assert_eq!(dt16[i], DType::BF16, "{}", spec.name);
            let rounded: Vec<f32> = g32[i]
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_f32())
                .collect();
            assert_eq!(g16[i], rounded, "{}", spec.name);
            assert!(
                g16[i].iter().any(|&x| x != 0.0),
                "{}: a zero gradient",
                spec.name
            );
        } else {
            assert_eq!(dt16[i], DType::F32, "{}", spec.name);
            assert_eq!(g16[i], g32[i], "{}", spec.name);
        }
    }
    assert_eq!(linear, 4 * cfg.model.layers);
}

/// FP8 weight codes written by the optimizer (after the scaling update, with the scales the
/// next step uses) instead of quantised at the start of the next forward pass: the same bits.
/// Two runs of 10 steps, one each way, with a validation pass after step 3 and the working
/// weights overwritten after step 6 (the next forward pass must quantise the new weights, not
/// use the codes the optimizer wrote), give identical losses, gradient norms, master weights,
/// moments and FP8 scaling state.
#[test]
fn fp8_codes_from_the_optimizer_change_no_bit() {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.recipe.precision = Precision::Fp8;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let run = |from_optimizer: bool| {
        let mut tr = Trainer::new(dev.clone(), cfg.clone()).unwrap();
        tr.set_fp8_codes_from_optimizer(from_optimizer);
        let mut out = Vec::new();
        for step in 1..=10 {
            let r = tr.train_step().unwrap();
            out.push((r.loss.to_bits(), r.grad_norm.to_bits()));
            assert_eq!(tr.model().fp8_codes_fresh(), from_optimizer, "step {step}");
            if step == 3 {
                out.push((tr.validation_loss().unwrap().to_bits(), 0));
            }
            if step == 6 {
                let w: Vec<Vec<f32>> = tr
                    .model()
                    .weights()
                    .unwrap()
                    .iter()
                    .map(|t| t.iter().map(|x| 0.97 * x).collect())
                    .collect();
                tr.model_mut().set_weights(&w).unwrap();
                assert!(!tr.model().fp8_codes_fresh());
            }
        }
        let ck = tr.checkpoint().unwrap();
        (out, ck.weights, ck.adam_m, ck.adam_v, ck.extra)
    };
    let fused = run(true);
    let separate = run(false);
    assert_eq!(fused.0, separate.0, "losses / gradient norms");
    assert!(fused.1 == separate.1, "master weights differ");
    assert!(
        fused.2 == separate.2 && fused.3 == separate.3,
        "moments differ"
    );
    assert_eq!(fused.4, separate.4, "FP8 scaling state");
}
