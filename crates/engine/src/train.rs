//! The training loop on the arithmetic-progression task, and greedy-generation evaluation.

use crate::config::Config;
use crate::data::{Progressions, keeps_stride, progression};
use crate::model::{Gpt, init_weights};
use crate::optim::AdamW;
use crate::precision::LossScaler;
use crate::{EngineError, Result};
use duet_device::Device;
use std::sync::Arc;
use std::time::Instant;

/// Prompt and continuation lengths of the generation check.
pub const PROMPT_LEN: usize = 16;
pub const GEN_LEN: usize = 32;

/// What one training step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// 1-based step number.
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens: usize,
    pub seconds: f64,
    /// The loss scale this step's gradients carried (None without loss scaling).
    pub loss_scale: Option<f32>,
    /// The optimizer step was skipped (inf/NaN gradients under loss scaling).
    pub skipped: bool,
}

/// Result of the greedy-generation check on held-out progressions.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationEval {
    pub sequences: usize,
    /// Sequences whose every generated token kept the stride.
    pub exact: usize,
    /// Generated tokens that kept the stride from their predecessor.
    pub token_accuracy: f64,
}

impl GenerationEval {
    pub fn accuracy(&self) -> f64 {
        if self.sequences == 0 {
            0.0
        } else {
            self.exact as f64 / self.sequences as f64
        }
    }
}

/// Owns the model, the optimizer and the data stream of one run.
pub struct Trainer<D: Device> {
    cfg: Config,
    model: Gpt<D>,
    opt: AdamW<D>,
    data: Progressions,
    step: u64,
    scaler: Option<LossScaler>,
}

impl<D: Device> Trainer<D> {
    /// A fresh run: weights initialised from the config's seed.
    pub fn new(dev: Arc<D>, cfg: Config) -> Result<Self> {
        cfg.validate()?;
        let weights = init_weights(&cfg.model, cfg.train.seed);
        Self::with_weights(dev, cfg, &weights)
    }

    pub fn with_weights(dev: Arc<D>, cfg: Config, weights: &[Vec<f32>]) -> Result<Self> {
        cfg.validate()?;
        let (model, opt, scaler) = crate::precision::build(dev, &cfg, weights)?;
        let t = &cfg.train;
        let data = Progressions::new(cfg.model.vocab, t.max_stride, t.seed);
        Ok(Self {
            cfg,
            model,
            opt,
            data,
            step: 0,
            scaler,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn model(&self) -> &Gpt<D> {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Gpt<D> {
        &mut self.model
    }

    pub fn optimizer(&self) -> &AdamW<D> {
        &self.opt
    }

    /// Steps completed so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// One step on the next synthetic batch.
    pub fn train_step(&mut self) -> Result<StepReport> {
        let (b, t) = (self.cfg.train.batch, self.cfg.train.seq);
        let (inputs, targets) = self.data.batch(b, t);
        self.train_step_on(&inputs, &targets)
    }

    /// One step (forward, backward, AdamW) on a given batch.
    pub fn train_step_on(&mut self, inputs: &[i32], targets: &[i32]) -> Result<StepReport> {
        let start = Instant::now();
        let lr = self.cfg.lr_at(self.step);
        if let Some(s) = &self.scaler {
            self.model.set_loss_scale(s.scale());
        }
        self.model.forward(inputs)?;
        let loss = self.model.loss(targets, true)?;
        if !loss.is_finite() {
            return Err(EngineError::Diverged {
                step: self.step + 1,
                loss,
            });
        }
        self.model.zero_grads()?;
        self.model.backward()?;
        let dev = self.model.device().clone();
        let (params, grads) = self.model.params_and_grads();
        let stats = self
            .opt
            .step_scaled(&*dev, params, grads, lr, self.scaler.as_mut())?;
        self.model.fp8_update()?;
        self.step += 1;
        Ok(StepReport {
            step: self.step,
            loss,
            lr,
            grad_norm: stats.grad_norm,
            tokens: inputs.len(),
            seconds: start.elapsed().as_secs_f64(),
            loss_scale: self.scaler.as_ref().map(|_| stats.loss_scale),
            skipped: stats.skipped,
        })
    }

    /// Greedy generation on `n` held-out progressions: prompt [`PROMPT_LEN`] tokens, generate
    /// [`GEN_LEN`], exact when every generated token keeps the stride.
    pub fn evaluate_generation(&mut self, n: usize) -> Result<GenerationEval> {
        let (b, t, v) = (
            self.cfg.train.batch,
            self.cfg.train.seq,
            self.cfg.model.vocab,
        );
        if t < PROMPT_LEN + GEN_LEN - 1 {
            return Err(EngineError::Config(format!(
                "the generation check needs seq ≥ {} (prompt {PROMPT_LEN} + {GEN_LEN} generated), got {t}",
                PROMPT_LEN + GEN_LEN - 1
            )));
        }
        let pairs = self.data.held_out_pairs(n, self.cfg.train.seed);
        let mut exact = 0;
        let mut good_tokens = 0usize;
        for chunk in pairs.chunks(b) {
            let mut tokens = vec![0i32; b * t];
            for (r, &(s, k)) in chunk.iter().enumerate() {
                tokens[r * t..r * t + PROMPT_LEN]
                    .copy_from_slice(&progression(v, s, k, PROMPT_LEN));
            }
            for pos in PROMPT_LEN - 1..PROMPT_LEN + GEN_LEN - 1 {
                self.model.forward(&tokens)?;
                let logits = self.model.logits()?;
                for r in 0..chunk.len() {
                    let row = &logits[(r * t + pos) * v..(r * t + pos + 1) * v];
                    tokens[r * t + pos + 1] = argmax(row) as i32;
                }
            }
            for r in 0..chunk.len() {
                let row = &tokens[r * t..r * t + PROMPT_LEN + GEN_LEN];
                let (prompt, generated) = row.split_at(PROMPT_LEN);
                if keeps_stride(v, prompt, generated) {
                    exact += 1;
                }
                let k = (prompt[1] - prompt[0]).rem_euclid(v as i32);
                good_tokens += row[PROMPT_LEN - 1..]
                    .windows(2)
                    .filter(|w| (w[1] - w[0]).rem_euclid(v as i32) == k)
                    .count();
            }
        }
        Ok(GenerationEval {
            sequences: pairs.len(),
            exact,
            token_accuracy: good_tokens as f64 / (pairs.len() * GEN_LEN).max(1) as f64,
        })
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}
