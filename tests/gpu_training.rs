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

fn cuda() -> Option<Arc<CudaDevice>> {
    match CudaDevice::new(0) {
        Ok(d) => Some(Arc::new(d)),
        Err(e) => {
            // Straight to stderr, past the harness's capture, so a skip is never silent.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIP cpu_and_cuda_train_the_same_fp32: {e}"
            );
            None
        }
    }
}

fn small_config() -> Config {
    let mut cfg = Config::preset(Preset::Default);
    cfg.model.layers = 2;
    cfg.train.steps = 20;
    cfg.train.batch = 8;
    cfg.train.seq = 48;
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
        seed: cfg.train.seed,
        config: cfg.clone(),
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
    let Some(gpu) = cuda() else { return };
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
