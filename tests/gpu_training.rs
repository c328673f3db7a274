//! Training parity between the CPU reference and the CUDA backend: the same seed and config give
//! the same losses (FP32, 1e-4 relative over 20 steps), traces that `duet parity` accepts, and a
//! CUDA run repeated gives a bit-identical trace. Without a CUDA device these tests print why they
//! skip.

#![cfg(feature = "cuda")]

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::Device;

use duet_engine::trace::{ParityOutcome, Trace, TraceHeader, TraceWriter, compare};
use duet_engine::{Config, Preset, Trainer};
use std::sync::Arc;

fn cuda(test: &str) -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            // Straight to stderr, past the harness's capture, so a skip is never silent.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIP {test}: {e}");
            None
        }
    }
}

fn small_config() -> Config {
    let mut cfg = Config::preset(Preset::Default);
    cfg.model.layers = 2;
    cfg.train.steps = 20;
    cfg.train.data.batch = 8;
    cfg.train.data.seq = 48;
    cfg
}

fn run<D: Device>(dev: Arc<D>, cfg: &Config, steps: u64) -> (Vec<f32>, Trace) {
    let info = dev.info();
    let header = TraceHeader {
        kind: "header".into(),
        duet_version: env!("CARGO_PKG_VERSION").into(),
        git_rev: "test".into(),
        backend: info.backend.clone(),
        device: info.name.clone(),
        precision: "fp32".into(),
        seed: cfg.train.data.seed,
        config: cfg.clone(),
        fp8_family: None,
    };
    let mut tr = Trainer::new(dev, cfg.clone()).unwrap();
    let mut buf = Vec::new();
    let mut losses = Vec::new();
    {
        let mut w = TraceWriter::new(&mut buf, &header).unwrap();
        for _ in 0..steps {
            let r = tr.train_step().unwrap();
            losses.push(r.loss);
            w.record(tr.model(), r.step, r.loss, r.grad_norm, r.lr, None)
                .unwrap();
        }
        w.flush().unwrap();
    }
    (losses, Trace::parse(buf.as_slice()).unwrap())
}

#[test]
fn cpu_and_cuda_train_the_same_fp32() {
    let Some(gpu) = cuda("cpu_and_cuda_train_the_same_fp32") else {
        return;
    };
    let cfg = small_config();
    let cpu = Arc::new(CpuDevice::new(None).unwrap());
    let (l_cpu, t_cpu) = run(cpu, &cfg, 20);
    let (l_gpu, t_gpu) = run(gpu.clone(), &cfg, 20);
    let mut worst = 0f64;
    for (i, (a, b)) in l_cpu.iter().zip(&l_gpu).enumerate() {
        let rel = ((a - b) / a).abs() as f64;
        worst = worst.max(rel);
        assert!(
            rel <= 1e-4,
            "step {}: cpu loss {a} vs cuda {b} (rel {rel:.2e})",
            i + 1
        );
    }
    eprintln!(
        "20 steps: cpu {:.6} → {:.6}, cuda {:.6} → {:.6}, worst relative loss difference {worst:.2e}",
        l_cpu[0], l_cpu[19], l_gpu[0], l_gpu[19]
    );
    match compare(&t_cpu, &t_gpu).unwrap() {
        ParityOutcome::Match { worst, .. } => {
            eprintln!("trace parity cpu vs cuda: match {worst:?}")
        }
        d => panic!("cpu vs cuda traces diverge: {d:?}"),
    }
    // Run to run on the same GPU: bit-identical.
    let (_, t_again) = run(gpu, &cfg, 20);
    assert_eq!(
        t_gpu.steps, t_again.steps,
        "a repeated CUDA run must be bit-identical"
    );
    eprintln!("cuda run twice: bit-identical traces");
}

/// Activation checkpointing on CUDA: the gradients after one step match those without it
/// (FP32 and BF16; the CUDA kernels are deterministic, so the match is expected to be exact).
#[test]
fn cuda_checkpointing_keeps_the_gradients() {
    use duet_engine::precision::Precision;
    let Some(gpu) = cuda("cuda_checkpointing_keeps_the_gradients") else {
        return;
    };
    for precision in [Precision::Fp32, Precision::Bf16] {
        let grads = |every: usize| {
            let mut cfg = Config::preset(Preset::Default);
            cfg.model.layers = 5;
            cfg.train.data.batch = 8;
            cfg.train.recipe.precision = precision;
            cfg.train.execution.checkpoint_every = every;
            let mut tr = Trainer::new(gpu.clone(), cfg).unwrap();
            tr.train_step().unwrap();
            (
                tr.model().gradients().unwrap(),
                tr.model().memory_plan().activations,
            )
        };
        let (plain, mem0) = grads(0);
        for every in [1, 2, 4] {
            let (ck, mem) = grads(every);
            let mut worst = 0f32;
            for (a, b) in plain.iter().zip(&ck) {
                let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
                let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                worst = worst.max(d / scale);
            }
            eprintln!(
                "cuda {precision:?} checkpoint every {every}: worst relative gradient difference {worst:.2e}, activations {mem} vs {mem0} bytes"
            );
            assert!(worst <= 1e-6, "{precision:?} every {every}: {worst}");
            assert!(mem < mem0);
        }
    }
}
