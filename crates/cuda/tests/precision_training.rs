//! Mixed-precision training on CUDA: bf16, fp16 and fp8 runs of the arithmetic task reach the
//! same greedy accuracy as fp32 in the same number of steps, and their loss curves follow the
//! CPU backend's run of the same precision. Precisions the GPU lacks are skipped with a notice
//! (bf16 needs sm_80, fp8 sm_89). Without a CUDA device the tests print why they skip.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{Device, Runtime};
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::{Arc, Mutex, OnceLock};

macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// One device for the whole binary; the tests take turns on it.
fn gpu(test: &str) -> Option<Arc<CudaDevice>> {
    static DEV: OnceLock<Result<Arc<CudaDevice>, String>> = OnceLock::new();
    match DEV.get_or_init(|| CudaDevice::new(0).map(Arc::new).map_err(|e| e.to_string())) {
        Ok(d) => Some(d.clone()),
        Err(e) => {
            skip!("SKIP {test}: no usable CUDA device: {e}");
            None
        }
    }
}

fn lock() -> std::sync::MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

const STEPS: u64 = 300;

struct Run {
    losses: Vec<f32>,
    accuracy: f64,
    skipped: u64,
}

fn train<D: Device>(dev: Arc<D>, p: Precision) -> Run {
    let mut cfg = Config::preset(Preset::Default);
    cfg.train.steps = STEPS;
    cfg.train.data.max_stride = 8;
    cfg.train.recipe.precision = p;
    let mut tr = Trainer::new(dev, cfg).unwrap();
    let mut losses = Vec::new();
    let mut skipped = 0;
    for _ in 0..STEPS {
        let r = tr.train_step().unwrap();
        losses.push(r.loss);
        skipped += r.skipped as u64;
    }
    let e = tr.evaluate_generation(64).unwrap();
    Run {
        losses,
        accuracy: e.accuracy(),
        skipped,
    }
}

fn gpu_fp32() -> Option<&'static Run> {
    static R: OnceLock<Option<Run>> = OnceLock::new();
    R.get_or_init(|| gpu("fp32 baseline").map(|g| train(g, Precision::Fp32)))
        .as_ref()
}

fn check(p: Precision) {
    let test = format!("{p}_on_cuda_trains_like_fp32_and_like_the_cpu");
    let _guard = lock();
    let Some(g) = gpu(&test) else { return };
    let info = g.info();
    if !p.supported_by(&info) {
        skip!(
            "SKIP {test}: {} ({}) does not support {p}",
            info.name,
            info.arch
        );
        return;
    }
    let base = gpu_fp32().expect("gpu present");
    let run = train(g, p);
    let cpu = train(Arc::new(CpuDevice::new(None).unwrap()), p);
    let last = |r: &Run| r.losses[r.losses.len() - 1];
    eprintln!(
        "{p}: cuda final loss {:.4}, accuracy {:.1}% | cuda fp32 {:.4}, {:.1}% | cpu {p} {:.4}, {:.1}%",
        last(&run),
        100.0 * run.accuracy,
        last(base),
        100.0 * base.accuracy,
        last(&cpu),
        100.0 * cpu.accuracy
    );
    assert!(base.accuracy >= 0.9, "fp32 on CUDA learns the task");
    assert!(
        run.accuracy >= base.accuracy - 0.02,
        "{p}: accuracy {} vs fp32 {}",
        run.accuracy,
        base.accuracy
    );
    assert_eq!(run.skipped, 0, "{p}: no overflow on this task");
    // The same precision on both backends: the loss curves agree to about 10% at every
    // logged point (rounding differs: GEMM accumulation order, FP8 tensor-core accumulation).
    for i in (0..STEPS as usize).step_by(25) {
        let (a, b) = (run.losses[i], cpu.losses[i]);
        assert!(
            (a - b).abs() <= 0.1 * b.abs() + 0.03,
            "{p} step {}: cuda loss {a} vs cpu {b}",
            i + 1
        );
    }
}

#[test]
fn bf16_on_cuda_trains_like_fp32_and_like_the_cpu() {
    check(Precision::Bf16);
}

#[test]
fn fp16_on_cuda_trains_like_fp32_and_like_the_cpu() {
    check(Precision::Fp16);
}

#[test]
fn fp8_on_cuda_trains_like_fp32_and_like_the_cpu() {
    check(Precision::Fp8);
}

/// The fused paths (flash attention, GEMM epilogues with bias, bias + GELU and the GELU
/// backward) train like the separate ops they replace: bf16, a model with head size 64, the
/// same start and data with the fused ops on and off. Early losses agree to bf16 rounding, and
/// both runs learn the task.
#[test]
fn fused_ops_train_like_the_separate_ops() {
    let test = "fused_ops_train_like_the_separate_ops";
    let _guard = lock();
    let Some(g) = gpu(test) else { return };
    g.set_fused_ops(true);
    if !(g
        .capabilities()
        .flash_attention(duet_device::DType::BF16, 64)
        && g.capabilities().gemm_epilogue(duet_device::DType::BF16))
    {
        skip!("SKIP {test}: {} has no bf16 fused paths", g.info().name);
        return;
    }
    let mut cfg = Config::preset(Preset::Default);
    cfg.model.heads = 2;
    cfg.train.data.max_stride = 8;
    cfg.train.recipe.precision = Precision::Bf16;
    let run = |fused: bool| {
        g.set_fused_ops(fused);
        let mut tr = Trainer::new(g.clone(), cfg.clone()).unwrap();
        let losses: Vec<f32> = (0..200).map(|_| tr.train_step().unwrap().loss).collect();
        (losses, tr.evaluate_generation(64).unwrap().accuracy())
    };
    let (fused, fused_acc) = run(true);
    let (separate, separate_acc) = run(false);
    g.set_fused_ops(true);
    for (i, (a, b)) in fused.iter().zip(&separate).take(10).enumerate() {
        let rel = (a - b).abs() / b.abs();
        assert!(rel < 2e-2, "step {}: fused loss {a} vs separate {b}", i + 1);
    }
    eprintln!(
        "{test}: final loss fused {} separate {}, accuracy {fused_acc} vs {separate_acc}",
        fused[199], separate[199]
    );
    assert!(fused[199] < 0.3 * fused[0] && separate[199] < 0.3 * separate[0]);
    assert!(
        fused_acc >= 0.9 && separate_acc >= 0.9,
        "{fused_acc} {separate_acc}"
    );
}

/// A recorded (CUDA graph) training step computes exactly what the unrecorded step computes:
/// fp32, bf16 and fp8 (delayed scaling updated between replays) runs of 12 steps with and
/// without graphs give bit-identical losses, gradient norms and weights, the same FP8 scales
/// and amax histories as read back by the host (the FP8 report and the checkpoint's metadata:
/// they once stayed at the recording step's values), and the graphed run really replays a
/// graph.
#[test]
fn recorded_steps_are_bit_identical() {
    let test = "recorded_steps_are_bit_identical";
    let _guard = lock();
    let Some(g) = gpu(test) else { return };
    for p in [Precision::Fp32, Precision::Bf16, Precision::Fp8] {
        if !p.supported_by(&g.info()) {
            skip!("SKIP {test} ({p}): not supported by {}", g.info().name);
            continue;
        }
        let mut cfg = Config::preset(Preset::Default);
        cfg.model.heads = 2;
        cfg.train.recipe.precision = p;
        let run = |graphs: bool| {
            let mut c = cfg.clone();
            c.train.execution.graphs = graphs;
            let mut tr = Trainer::new(g.clone(), c).unwrap();
            let reports: Vec<(u32, u32)> = (0..12)
                .map(|_| {
                    let r = tr.train_step().unwrap();
                    (r.loss.to_bits(), r.grad_norm.to_bits())
                })
                .collect();
            let ck = tr.checkpoint().unwrap();
            (
                reports,
                ck.weights,
                tr.step_recorded(),
                ck.extra,
                tr.model().fp8_report(16).unwrap(),
            )
        };
        let (a, wa, recorded, ea, fa) = run(true);
        let (b, wb, unrecorded, eb, fb) = run(false);
        assert!(recorded, "{p}: the graphed run did not replay a graph");
        assert!(!unrecorded, "{p}: graphs were off");
        assert_eq!(a, b, "{p}: losses / norms differ with graphs");
        assert!(wa == wb, "{p}: weights differ with graphs");
        // The FP8 scales and amax histories the host reads back (reports, traces and
        // checkpoints) follow the replayed steps' device updates.
        assert_eq!(
            ea, eb,
            "{p}: checkpoint metadata (FP8 scaling state) differs with graphs"
        );
        assert_eq!(
            format!("{fa:?}"),
            format!("{fb:?}"),
            "{p}: FP8 report differs with graphs"
        );
    }
}

/// Steps queued several at a time and read back once (`Trainer::train_steps`: each step's
/// losses and norm copied into a device ring, one download per group) compute exactly what
/// single steps compute: fp32, bf16 and fp8 runs of 12 steps in groups of 5, 5 and 2 — the
/// first group holds the unrecorded first step, the recording and replays — give bit-identical
/// losses, gradient norms and weights to 12 calls of `train_step`, with graphs and without.
#[test]
fn queued_steps_are_bit_identical() {
    let test = "queued_steps_are_bit_identical";
    let _guard = lock();
    let Some(g) = gpu(test) else { return };
    for p in [Precision::Fp32, Precision::Bf16, Precision::Fp8] {
        if !p.supported_by(&g.info()) {
            skip!("SKIP {test} ({p}): not supported by {}", g.info().name);
            continue;
        }
        for graphs in [true, false] {
            let mut cfg = Config::preset(Preset::Default);
            cfg.model.heads = 2;
            cfg.train.recipe.precision = p;
            cfg.train.execution.graphs = graphs;
            let bits = |r: &duet_engine::train::StepReport| {
                (
                    r.step,
                    r.loss.to_bits(),
                    r.grad_norm.to_bits(),
                    r.lr.to_bits(),
                )
            };
            let mut single = Trainer::new(g.clone(), cfg.clone()).unwrap();
            let a: Vec<_> = (0..12)
                .map(|_| bits(&single.train_step().unwrap()))
                .collect();
            let mut grouped = Trainer::new(g.clone(), cfg.clone()).unwrap();
            let mut b = Vec::new();
            for k in [5, 5, 2] {
                b.extend(grouped.train_steps(k).unwrap().iter().map(bits));
            }
            assert_eq!(
                single.step_recorded(),
                graphs,
                "{p} graphs {graphs}: single steps recorded"
            );
            assert_eq!(
                grouped.step_recorded(),
                graphs,
                "{p} graphs {graphs}: queued steps recorded"
            );
            assert_eq!(
                a, b,
                "{p} graphs {graphs}: losses / norms differ when queued"
            );
            let (wa, wb) = (
                single.checkpoint().unwrap().weights,
                grouped.checkpoint().unwrap().weights,
            );
            assert!(wa == wb, "{p} graphs {graphs}: weights differ when queued");
        }
    }
}

/// FP8 weight codes written by the optimizer's fused kernels (`adamw_fp8_<D>` and
/// `transpose_codes_many`, after the scaling update) instead of quantised at the start of the
/// next forward pass: the same bits on the GPU, with the step recorded and replayed. Runs of 12
/// steps each way with a validation pass after step 3 and the weights replaced after step 6
/// (the replay must then quantise them first, outside the recording) give identical losses,
/// gradient norms, weights, moments and FP8 scaling state, and the fused kernels took every
/// weight matrix in the first run.
#[test]
fn fp8_codes_from_the_optimizer_are_bit_identical() {
    let test = "fp8_codes_from_the_optimizer_are_bit_identical";
    let _guard = lock();
    let Some(g) = gpu(test) else { return };
    if !Precision::Fp8.supported_by(&g.info()) {
        skip!("SKIP {test}: fp8 not supported by {}", g.info().name);
        return;
    }
    let mut cfg = Config::preset(Preset::Default);
    cfg.model.heads = 2;
    cfg.train.recipe.precision = Precision::Fp8;
    let layers = cfg.model.layers as u64;
    let run = |from_optimizer: bool| {
        let mut tr = Trainer::new(g.clone(), cfg.clone()).unwrap();
        tr.set_fp8_codes_from_optimizer(from_optimizer);
        let before = g.adamw_fp8_fused_count();
        let mut out = Vec::new();
        for step in 1..=12 {
            let r = tr.train_step().unwrap();
            out.push((r.loss.to_bits(), r.grad_norm.to_bits()));
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
            }
        }
        assert!(tr.step_recorded(), "the run did not replay a graph");
        let fused = g.adamw_fp8_fused_count() - before;
        let ck = tr.checkpoint().unwrap();
        (out, ck.weights, ck.adam_m, ck.adam_v, ck.extra, fused)
    };
    let a = run(true);
    let b = run(false);
    // Counted when the update is queued: the first step and the recording (replays queue
    // nothing); each time every weight matrix.
    assert!(
        a.5 >= 4 * layers && a.5 % (4 * layers) == 0,
        "fused kernel use (codes from the optimizer): {}",
        a.5
    );
    assert_eq!(b.5, 0, "fused kernel use (separate)");
    assert_eq!(a.0, b.0, "losses / gradient norms");
    assert!(a.1 == b.1, "master weights differ");
    assert!(a.2 == b.2 && a.3 == b.3, "moments differ");
    assert_eq!(a.4, b.4, "FP8 scaling state");
}
