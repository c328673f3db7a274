//! The logits in chunks of rows on CUDA (model::memory::logits_chunk_rows), at GPT-2's
//! vocabulary (50257, padded to 50304), against the CPU backend running the same chunks and
//! against CUDA with the logits whole: the chunks' LM-head GEMMs at row offsets, the in-place
//! classifier on each chunk (its rows cached in shared memory), the LM head's backward GEMMs
//! into the final LayerNorm's gradient at row offsets and into the tied embedding's gradient
//! (written by the first chunk, added to by the others). FP32 and bf16: loss, logits and every
//! gradient. Without a CUDA device the test prints why it skips.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::Device;
use duet_engine::ModelConfig;
use duet_engine::model::{Gpt, init_weights};
use duet_engine::precision::{Precision, PrecisionPlan};
use std::sync::Arc;

const B: usize = 4;
const T: usize = 256;

fn cfg() -> ModelConfig {
    ModelConfig {
        vocab: 50257,
        d_model: 64,
        heads: 1,
        ffn: 128,
        layers: 1,
        max_seq: T,
    }
}

/// Loss, logits and gradients after one forward and backward pass on a fixed batch, the logits
/// in chunks of `rows` (B·T: whole).
fn run<D: Device>(
    dev: Arc<D>,
    precision: Precision,
    rows: usize,
) -> (f32, Vec<f32>, Vec<Vec<f32>>) {
    let cfg = cfg();
    let weights = init_weights(&cfg, 3);
    let plan = PrecisionPlan {
        logits_chunk_rows: rows,
        ..PrecisionPlan::new(precision)
    };
    let mut m = Gpt::with_precision(dev, &cfg, B, T, &weights, plan).unwrap();
    assert_eq!(m.logits_chunked(), rows < B * T);
    let tokens: Vec<i32> = (0..B * T).map(|i| ((i * 7919) % 50257) as i32).collect();
    let targets: Vec<i32> = (0..B * T)
        .map(|i| {
            if i % 17 == 3 {
                -1
            } else {
                ((i * 104729 + 13) % 50257) as i32
            }
        })
        .collect();
    m.forward(&tokens).unwrap();
    let logits = m.logits().unwrap();
    let loss = m.loss(&targets, true).unwrap();
    m.zero_grads().unwrap();
    m.backward().unwrap();
    (loss, logits, m.gradients().unwrap())
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn close(
    what: &str,
    a: &(f32, Vec<f32>, Vec<Vec<f32>>),
    b: &(f32, Vec<f32>, Vec<Vec<f32>>),
    tol: f64,
) {
    assert!(
        ((a.0 - b.0).abs() as f64) <= tol * b.0.abs() as f64,
        "{what}: loss {} vs {}",
        a.0,
        b.0
    );
    let r = rel(&b.1, &a.1);
    assert!(r < tol, "{what}: logits differ: relative error {r:e}");
    for (i, (x, y)) in a.2.iter().zip(&b.2).enumerate() {
        let r = rel(y, x);
        // The key bias's gradient is exactly zero on both (see the model).
        assert!(
            r < 10.0 * tol || x.iter().chain(y).all(|&v| v == 0.0),
            "{what}: gradient {i}: relative error {r:e}"
        );
    }
}

#[test]
fn chunked_logits_match_cpu_and_whole_logits() {
    let gpu = match CudaDevice::new(0) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            eprintln!("SKIP chunked_logits_match_cpu_and_whole_logits: no usable CUDA device: {e}");
            return;
        }
    };
    let cpu = Arc::new(CpuDevice::new(None).unwrap());
    let rows = B * T / 4;
    for (precision, tol) in [(Precision::Fp32, 1e-4), (Precision::Bf16, 2e-2)] {
        let g = run(gpu.clone(), precision, rows);
        let c = run(cpu.clone(), precision, rows);
        close(&format!("{precision} chunked: cuda vs cpu"), &g, &c, tol);
        let whole = run(gpu.clone(), precision, B * T);
        close(
            &format!("{precision} cuda: chunked vs whole"),
            &g,
            &whole,
            tol,
        );
    }
}
