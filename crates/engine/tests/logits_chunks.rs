//! The logits in chunks of rows (model::memory::logits_chunk_rows): the LM head, the loss and
//! the LM head's backward run chunk by chunk, so the logits never exist whole. Against the same
//! model with the logits whole, on the CPU: the same losses, logits and every gradient but the
//! tied embedding's bit for bit (each row's arithmetic is the same), the embedding's within
//! f32 rounding (its LM-head part sums the chunks one after another), in fp32, bf16 and fp8,
//! with `zero_grads` before or after the loss; training steps follow the same losses; the
//! automatic choice of chunk size; a size that does not divide batch × seq is refused.

use duet_cpu::CpuDevice;
use duet_engine::model::memory::{
    LOGITS_CHUNK_BYTES, LOGITS_CHUNK_BYTES_KEPT_GELU, logits_chunk_rows,
};
use duet_engine::model::{Gpt, init_weights};
use duet_engine::precision::{Precision, PrecisionPlan};
use duet_engine::{Config, ModelConfig, Preset, Trainer};
use std::sync::Arc;

const B: usize = 4;
const T: usize = 16;

fn cfg() -> ModelConfig {
    ModelConfig {
        // Odd, as GPT-2's: padded to 384 on the device.
        vocab: 301,
        d_model: 64,
        heads: 4,
        ffn: 128,
        layers: 2,
        max_seq: T,
    }
}

struct Pass {
    loss: f32,
    logits: Vec<f32>,
    grads: Vec<Vec<f32>>,
}

/// One forward pass, loss with gradient and backward pass on a fixed batch, with the logits in
/// chunks of `rows` (0: automatic, whole here); `zero_first` clears the gradients before the
/// loss instead of after it.
fn pass(precision: Precision, rows: usize, zero_first: bool) -> Pass {
    let cfg = cfg();
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let plan = PrecisionPlan {
        logits_chunk_rows: rows,
        ..PrecisionPlan::new(precision)
    };
    let weights = init_weights(&cfg, 5);
    let mut m = Gpt::with_precision(dev, &cfg, B, T, &weights, plan).unwrap();
    assert_eq!(m.logits_chunked(), rows > 0 && rows < B * T);
    let tokens: Vec<i32> = (0..B * T).map(|i| ((i * 37 + 11) % 301) as i32).collect();
    // Some ignored targets (negative), in different chunks.
    let targets: Vec<i32> = (0..B * T)
        .map(|i| {
            if i % 13 == 5 {
                -1
            } else {
                ((i * 53 + 7) % 301) as i32
            }
        })
        .collect();
    m.forward(&tokens).unwrap();
    let logits = m.logits().unwrap();
    if zero_first {
        m.zero_grads().unwrap();
    }
    let loss = m.loss(&targets, true).unwrap();
    if !zero_first {
        m.zero_grads().unwrap();
    }
    m.backward().unwrap();
    Pass {
        loss,
        logits,
        grads: m.gradients().unwrap(),
    }
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn chunked_logits_match_whole_logits() {
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp8] {
        let whole = pass(precision, 0, false);
        for (rows, zero_first) in [(16, false), (16, true), (32, false)] {
            let name = format!("{precision} rows {rows} zero_first {zero_first}");
            let got = pass(precision, rows, zero_first);
            assert_eq!(
                got.loss.to_bits(),
                whole.loss.to_bits(),
                "{name}: loss {} vs {}",
                got.loss,
                whole.loss
            );
            assert_eq!(got.logits, whole.logits, "{name}: logits");
            assert_eq!(got.grads.len(), whole.grads.len());
            for (i, (g, w)) in got.grads.iter().zip(&whole.grads).enumerate() {
                if i == 0 {
                    // The tied embedding: the LM head's part summed chunk after chunk (f32).
                    let r = rel(w, g);
                    assert!(r < 1e-5, "{name}: wte gradient relative error {r:e}");
                    assert!(w.iter().any(|&x| x != 0.0), "{name}: wte gradient is zero");
                } else {
                    assert_eq!(g, w, "{name}: gradient {i} differs");
                }
            }
        }
    }
}

#[test]
fn training_with_chunked_logits_follows_whole_logits() {
    let losses = |rows: usize| -> Vec<f32> {
        let mut cfg = Config::preset(Preset::Tiny);
        cfg.model.vocab = 301;
        cfg.train.recipe.precision = Precision::Bf16;
        cfg.train.execution.logits_chunk_rows = rows;
        let n = cfg.train.data.batch * cfg.train.data.seq;
        assert!(rows == 0 || n.is_multiple_of(rows) && rows < n);
        let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
        let mut tr = Trainer::new(dev, cfg).unwrap();
        assert_eq!(tr.model().logits_chunked(), rows > 0);
        (0..6).map(|_| tr.train_step().unwrap().loss).collect()
    };
    let n = {
        let cfg = Config::preset(Preset::Tiny);
        cfg.train.data.batch * cfg.train.data.seq
    };
    let whole = losses(0);
    let chunked = losses(n / 4);
    // Step 1 is the same bits; later steps see the embedding's update from a gradient that
    // differs in its last bits.
    assert_eq!(chunked[0].to_bits(), whole[0].to_bits());
    for (s, (c, w)) in chunked.iter().zip(&whole).enumerate() {
        assert!(
            (c - w).abs() <= 1e-3 * w.abs(),
            "step {}: loss {c} with chunks vs {w} whole",
            s + 1
        );
    }
}

#[test]
fn chunk_rows_are_chosen_alike_everywhere_and_checked() {
    // GPT-2 at B 32, T 1024 (50304 padded columns): 3.3 GB of bf16 logits → 4 chunks of
    // 8192 rows (0.82 GB each); f32 → 8 of 4096.
    assert_eq!(
        logits_chunk_rows(32768, 50304, 2, 0, LOGITS_CHUNK_BYTES),
        Ok(8192)
    );
    assert_eq!(
        logits_chunk_rows(32768, 50304, 4, 0, LOGITS_CHUNK_BYTES),
        Ok(4096)
    );
    // Where the GELU outputs are kept, half the budget: gpt2 bf16 in chunks of 4096.
    assert_eq!(
        logits_chunk_rows(32768, 50304, 2, 0, LOGITS_CHUNK_BYTES_KEPT_GELU),
        Ok(4096)
    );
    const { assert!(8192 * 50304 * 2 <= LOGITS_CHUNK_BYTES && 16384 * 50304 * 2 > LOGITS_CHUNK_BYTES) };
    // Small logits stay whole.
    assert_eq!(logits_chunk_rows(64, 384, 4, 0, LOGITS_CHUNK_BYTES), Ok(64));
    assert_eq!(
        logits_chunk_rows(8192, 128, 2, 0, LOGITS_CHUNK_BYTES),
        Ok(8192)
    );
    // Chunks do not go below 512 rows (the GEMMs stay large), nor below n when n is smaller.
    assert_eq!(
        logits_chunk_rows(4096, 1 << 20, 4, 0, LOGITS_CHUNK_BYTES),
        Ok(512)
    );
    assert_eq!(
        logits_chunk_rows(300, 1 << 22, 4, 0, LOGITS_CHUNK_BYTES),
        Ok(300)
    );
    // An n with few divisors: the smallest divisor that fits (3 · 1021 rows).
    assert_eq!(
        logits_chunk_rows(3 * 1021, 200_000, 2, 0, LOGITS_CHUNK_BYTES),
        Ok(1021)
    );
    // Requested sizes must divide n.
    assert_eq!(
        logits_chunk_rows(64, 384, 4, 16, LOGITS_CHUNK_BYTES),
        Ok(16)
    );
    let e = logits_chunk_rows(64, 384, 4, 10, LOGITS_CHUNK_BYTES).unwrap_err();
    assert!(e.contains("must divide") && e.contains("64"), "{e}");
    assert!(logits_chunk_rows(64, 384, 4, 128, LOGITS_CHUNK_BYTES).is_err());
    let cfg = cfg();
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let plan = PrecisionPlan {
        logits_chunk_rows: 10,
        ..PrecisionPlan::new(Precision::Fp32)
    };
    let e = Gpt::with_precision(dev, &cfg, B, T, &init_weights(&cfg, 1), plan)
        .err()
        .expect("10 rows accepted for 64")
        .to_string();
    assert!(e.contains("must divide batch × seq = 64"), "{e}");
}

#[test]
fn chunked_logits_shrink_the_memory_plan() {
    use duet_engine::model::estimate_memory;
    let dev = CpuDevice::new(Some(1)).unwrap();
    let cfg = Config::preset(Preset::Gpt2);
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let plan = |rows: usize| {
        estimate_memory(
            &dev,
            &cfg.model,
            b,
            t,
            &PrecisionPlan {
                logits_chunk_rows: rows,
                ..PrecisionPlan::new(Precision::Bf16)
            },
        )
        .unwrap()
    };
    let (whole, auto) = (plan(b * t), plan(0));
    // 32768 × 50304 bf16 logits whole; 8192 rows of them plus a chunk's targets and losses.
    let saved = whole.activations - auto.activations;
    assert_eq!(saved, (32768 - 8192) * 50304 * 2 - 8192 * 8);
    assert_eq!(whole.total() - auto.total(), saved);
}
