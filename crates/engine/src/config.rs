//! Model and training configuration: presets, TOML files, flag overrides and validation.

use crate::fp8::{AmaxAlgo, DelayedScaling, Fp8FastAccum, Fp8Recipe};
use crate::precision::{Precision, WeightGradDtype};
use crate::{EngineError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Shape of the GPT model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub heads: usize,
    pub ffn: usize,
    pub layers: usize,
    /// Longest sequence the position embedding covers.
    pub max_seq: usize,
}

impl ModelConfig {
    pub fn head_size(&self) -> usize {
        self.d_model / self.heads
    }

    /// Number of trainable parameters (the LM head is tied to the token embedding).
    pub fn num_params(&self) -> usize {
        let (v, c, f, l, t) = (
            self.vocab,
            self.d_model,
            self.ffn,
            self.layers,
            self.max_seq,
        );
        let per_layer = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + f * c + f + c * f + c;
        v * c + t * c + l * per_layer + 2 * c
    }

    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("vocab", self.vocab),
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("ffn", self.ffn),
            ("layers", self.layers),
            ("max_seq", self.max_seq),
        ];
        for (name, value) in fields {
            if value == 0 {
                return Err(EngineError::Config(format!("{name} must be at least 1")));
            }
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(EngineError::Config(format!(
                "heads ({}) must divide d_model ({})",
                self.heads, self.d_model
            )));
        }
        if self.vocab > i32::MAX as usize {
            return Err(EngineError::Config(format!(
                "vocab {} is too large",
                self.vocab
            )));
        }
        Ok(())
    }
}

/// Optimisation and run settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub batch: usize,
    /// Tokens per training sequence (≤ model.max_seq).
    pub seq: usize,
    pub steps: u64,
    pub lr: f32,
    /// Linear warm-up steps, then cosine decay to `lr · min_lr_ratio`.
    pub warmup: u64,
    pub min_lr_ratio: f32,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Global L2-norm clipping threshold (0 disables clipping).
    pub grad_clip: f32,
    pub seed: u64,
    /// Held-out progressions checked by greedy generation at the end of the run.
    pub eval_sequences: usize,
    /// Strides of the arithmetic-progression task are drawn from 1..=max_stride.
    pub max_stride: usize,
    /// fp32, bf16, fp16 or fp8 (see [`crate::precision`]).
    #[serde(default)]
    pub precision: Precision,
    /// Loss scale: 0 = dynamic for fp16 (start 2^16, halve and skip on inf/NaN, double after
    /// 2000 clean steps); a positive value is a static scale.
    #[serde(default)]
    pub loss_scale: f32,
    /// FP8 recipe: hybrid (E4M3 forward, E5M2 gradients) or e4m3.
    #[serde(default)]
    pub fp8_format: Fp8Recipe,
    /// Length of each FP8 operand's amax history (1..=1024).
    #[serde(default = "default_amax_history_len")]
    pub fp8_amax_history_len: usize,
    /// max or most_recent.
    #[serde(default)]
    pub fp8_amax_compute_algo: AmaxAlgo,
    /// scale = fp8_max / amax / 2^margin.
    #[serde(default)]
    pub fp8_margin: i32,
    /// FP8 GEMMs in the tensor cores' fast accumulation: none, forward (the default, as in
    /// Transformer Engine's and torchao's recipes) or all.
    #[serde(default)]
    pub fp8_fast_accum: Fp8FastAccum,
    /// Training data: empty for the synthetic progression task, else a UTF-8 text file (byte
    /// tokens) or an llm.c `.bin` token shard.
    #[serde(default)]
    pub data: String,
    /// Activation checkpointing: keep the input of every segment of this many blocks and
    /// recompute the segment in the backward pass (0 = off).
    #[serde(default)]
    pub checkpoint_every: usize,
    /// Read the loss back every N steps: the steps in between are queued without a host
    /// synchronisation and their losses and gradient norms come back together, the same bits
    /// (1 reads back after every step). Steps that need the host (a loss scaler, several
    /// ranks) still run one by one; `duet train` also reads back at every log line,
    /// validation and checkpoint.
    #[serde(default = "default_loss_every")]
    pub loss_every: u64,
    /// Record the training step once and replay it (CUDA graphs) where the backend can and the
    /// step allows it (no loss scaler, one device); the results are the same bits.
    #[serde(default = "default_true")]
    pub graphs: bool,
    /// Time the GEMM algorithms once per shape and keep the fastest (CUDA), instead of the
    /// library heuristic's first choice. Faster; two runs may differ in the last bits.
    #[serde(default)]
    pub gemm_autotune: bool,
    /// Storage of the linear layers' weight gradients: `auto` keeps them in bf16 for bf16 and
    /// fp8 runs on one device (the f32-accumulated GEMM result rounded once, the values PyTorch
    /// autocast hands its optimizer) and f32 otherwise; `f32` always keeps f32.
    #[serde(default)]
    pub weight_grad_dtype: WeightGradDtype,
    /// Recompute the MLP's GELU output in the backward pass instead of keeping it (batch × seq
    /// × ffn activations per block less memory; false: a little faster). FP8 never stores it.
    #[serde(default = "default_true")]
    pub recompute_gelu: bool,
}

fn default_true() -> bool {
    true
}

fn default_amax_history_len() -> usize {
    16
}

fn default_loss_every() -> u64 {
    10
}

impl TrainConfig {
    /// The delayed-scaling settings of this run.
    pub fn delayed_scaling(&self) -> DelayedScaling {
        DelayedScaling {
            recipe: self.fp8_format,
            amax_history_len: self.fp8_amax_history_len,
            algo: self.fp8_amax_compute_algo,
            margin: self.fp8_margin,
            fast_accum: self.fp8_fast_accum,
        }
    }
}

/// The whole configuration of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub train: TrainConfig,
}

/// Named starting points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Small enough to learn the arithmetic task on a 2-core CPU in under three minutes.
    Default,
    /// The seeds' benchmark model: d_model 768, 12 heads, FFN 3072, 4 layers, seq 256, batch 32.
    Seed,
    /// d_model 2048, 16 heads, FFN 8192, 12 layers.
    Large,
    /// A tiny model for tests and references.
    Tiny,
}

impl std::str::FromStr for Preset {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "default" => Ok(Preset::Default),
            "seed" => Ok(Preset::Seed),
            "large" => Ok(Preset::Large),
            "tiny" => Ok(Preset::Tiny),
            other => Err(EngineError::Config(format!(
                "unknown preset '{other}' (expected default, seed, large or tiny)"
            ))),
        }
    }
}

impl Config {
    pub fn preset(p: Preset) -> Config {
        let train = TrainConfig {
            batch: 32,
            seq: 48,
            steps: 600,
            lr: 2e-3,
            warmup: 50,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            seed: 1337,
            eval_sequences: 256,
            max_stride: 8,
            data: String::new(),
            checkpoint_every: 0,
            loss_every: default_loss_every(),
            graphs: true,
            gemm_autotune: false,
            weight_grad_dtype: WeightGradDtype::Auto,
            recompute_gelu: true,
            precision: Precision::Fp32,
            loss_scale: 0.0,
            fp8_format: Fp8Recipe::Hybrid,
            fp8_amax_history_len: default_amax_history_len(),
            fp8_amax_compute_algo: AmaxAlgo::Max,
            fp8_margin: 0,
            fp8_fast_accum: Fp8FastAccum::default(),
        };
        match p {
            Preset::Default => Config {
                model: ModelConfig {
                    vocab: 96,
                    d_model: 128,
                    heads: 4,
                    ffn: 512,
                    layers: 2,
                    max_seq: 64,
                },
                // Strides 1..=48: half of all progressions, learned to 100% greedy accuracy in
                // well under a minute on two cores.
                train: TrainConfig {
                    steps: 1000,
                    max_stride: 48,
                    ..train
                },
            },
            Preset::Seed => Config {
                model: ModelConfig {
                    vocab: 96,
                    d_model: 768,
                    heads: 12,
                    ffn: 3072,
                    layers: 4,
                    max_seq: 256,
                },
                train: TrainConfig {
                    seq: 256,
                    steps: 300,
                    lr: 3e-4,
                    warmup: 30,
                    ..train
                },
            },
            Preset::Large => Config {
                model: ModelConfig {
                    vocab: 96,
                    d_model: 2048,
                    heads: 16,
                    ffn: 8192,
                    layers: 12,
                    max_seq: 256,
                },
                train: TrainConfig {
                    seq: 256,
                    steps: 300,
                    lr: 3e-4,
                    warmup: 30,
                    ..train
                },
            },
            Preset::Tiny => Config {
                model: ModelConfig {
                    vocab: 96,
                    d_model: 32,
                    heads: 4,
                    ffn: 64,
                    layers: 2,
                    max_seq: 16,
                },
                train: TrainConfig {
                    batch: 4,
                    seq: 16,
                    steps: 20,
                    lr: 1e-3,
                    warmup: 2,
                    eval_sequences: 0,
                    ..train
                },
            },
        }
    }

    /// Reads a TOML file whose tables override `base` field by field
    /// (e.g. `[model] layers = 6` keeps every other field of `base`).
    pub fn from_toml_file(path: &Path, base: Config) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_toml_str(&text, base).map_err(|e| match e {
            EngineError::Config(m) => EngineError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn from_toml_str(text: &str, base: Config) -> Result<Config> {
        let overrides: toml::Table =
            toml::from_str(text).map_err(|e| EngineError::Config(one_line(e.message())))?;
        let mut merged = toml::Table::try_from(&base)
            .map_err(|e| EngineError::Config(format!("cannot serialise config: {e}")))?;
        for (section, value) in overrides {
            let Some(toml::Value::Table(dst)) = merged.get_mut(&section) else {
                return Err(EngineError::Config(format!(
                    "unknown section [{section}] (expected [model] or [train])"
                )));
            };
            let toml::Value::Table(src) = value else {
                return Err(EngineError::Config(format!("'{section}' must be a table")));
            };
            for (k, v) in src {
                if !dst.contains_key(&k) {
                    return Err(EngineError::Config(format!("unknown field {section}.{k}")));
                }
                dst.insert(k, v);
            }
        }
        toml::Value::Table(merged)
            .try_into()
            .map_err(|e: toml::de::Error| EngineError::Config(one_line(e.message())))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serialises")
    }

    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        let t = &self.train;
        if t.batch == 0 {
            return Err(EngineError::Config("batch must be at least 1".into()));
        }
        if t.seq == 0 {
            return Err(EngineError::Config("seq must be at least 1".into()));
        }
        if t.seq > self.model.max_seq {
            return Err(EngineError::Config(format!(
                "seq ({}) exceeds the model's maximum sequence length max_seq ({})",
                t.seq, self.model.max_seq
            )));
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return Err(EngineError::Config(format!(
                "lr must be positive, got {}",
                t.lr
            )));
        }
        for (name, b) in [("beta1", t.beta1), ("beta2", t.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(EngineError::Config(format!(
                    "{name} must be in [0, 1), got {b}"
                )));
            }
        }
        if !(t.eps.is_finite() && t.eps > 0.0) {
            return Err(EngineError::Config(format!(
                "eps must be positive, got {}",
                t.eps
            )));
        }
        if !(t.weight_decay.is_finite() && t.weight_decay >= 0.0) {
            return Err(EngineError::Config("weight_decay must be ≥ 0".into()));
        }
        if !(t.grad_clip.is_finite() && t.grad_clip >= 0.0) {
            return Err(EngineError::Config(
                "grad_clip must be ≥ 0 (0 disables)".into(),
            ));
        }
        if t.max_stride == 0 || t.max_stride >= self.model.vocab {
            return Err(EngineError::Config(format!(
                "max_stride must be in 1..{} (the vocabulary size), got {}",
                self.model.vocab, t.max_stride
            )));
        }
        if !(0.0..=1.0).contains(&t.min_lr_ratio) {
            return Err(EngineError::Config("min_lr_ratio must be in [0, 1]".into()));
        }
        if !(t.loss_scale.is_finite() && t.loss_scale >= 0.0) {
            return Err(EngineError::Config(
                "loss_scale must be ≥ 0 (0: dynamic for fp16)".into(),
            ));
        }
        if t.loss_every == 0 {
            return Err(EngineError::Config(
                "loss_every must be at least 1 (1 reads the loss back after every step)".into(),
            ));
        }
        t.delayed_scaling().validate()?;
        Ok(())
    }

    /// Learning rate at 0-based `step`: linear warm-up, then cosine decay.
    pub fn lr_at(&self, step: u64) -> f32 {
        let t = &self.train;
        let lr = t.lr as f64;
        if step < t.warmup {
            return (lr * (step + 1) as f64 / t.warmup as f64) as f32;
        }
        let decay_steps = t.steps.saturating_sub(t.warmup).max(1);
        let progress = ((step - t.warmup) as f64 / decay_steps as f64).min(1.0);
        let min_lr = lr * t.min_lr_ratio as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        (min_lr + coeff * (lr - min_lr)) as f32
    }
}

/// Joins a multi-line parser message into one line.
fn one_line(msg: &str) -> String {
    msg.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_overrides_fields() {
        let base = Config::preset(Preset::Default);
        let c = Config::from_toml_str("[model]\nlayers = 6\n[train]\nlr = 0.01\n", base.clone())
            .unwrap();
        assert_eq!(c.model.layers, 6);
        assert_eq!(c.model.d_model, base.model.d_model);
        assert_eq!(c.train.lr, 0.01);
        assert!(Config::from_toml_str("[model]\nlayerz = 6\n", base.clone()).is_err());
        assert!(Config::from_toml_str("[modle]\nlayers = 6\n", base.clone()).is_err());
        assert!(Config::from_toml_str("[model]\nlayers = -1\n", base).is_err());
    }

    #[test]
    fn graphs_default_on_and_toml_can_turn_them_off() {
        let base = Config::preset(Preset::Seed);
        assert!(base.train.graphs);
        let c = Config::from_toml_str("[train]\ngraphs = false\n", base.clone()).unwrap();
        assert!(!c.train.graphs);
        assert!(Config::from_toml_str("[train]\ngraphs = \"no\"\n", base).is_err());
    }

    #[test]
    fn validation_rejects_bad_shapes() {
        let mut c = Config::preset(Preset::Default);
        c.model.heads = 3;
        assert!(c.validate().unwrap_err().to_string().contains("divide"));
        let mut c = Config::preset(Preset::Default);
        c.train.seq = c.model.max_seq + 1;
        assert!(c.validate().unwrap_err().to_string().contains("max_seq"));
        let mut c = Config::preset(Preset::Default);
        c.model.layers = 0;
        assert!(c.validate().is_err());
        for p in [Preset::Default, Preset::Seed, Preset::Large, Preset::Tiny] {
            Config::preset(p).validate().unwrap();
        }
    }

    #[test]
    fn lr_schedule_warms_up_and_decays() {
        let c = Config::preset(Preset::Default);
        assert!(c.lr_at(0) < c.lr_at(c.train.warmup - 1));
        assert!((c.lr_at(c.train.warmup) - c.train.lr).abs() < 1e-6);
        let end = c.lr_at(c.train.steps);
        assert!((end - c.train.lr * c.train.min_lr_ratio).abs() < 1e-6);
    }

    #[test]
    fn seed_preset_matches_the_benchmark() {
        let c = Config::preset(Preset::Seed);
        assert_eq!(
            (
                c.model.vocab,
                c.model.d_model,
                c.model.heads,
                c.model.ffn,
                c.model.layers
            ),
            (96, 768, 12, 3072, 4)
        );
        assert_eq!((c.train.seq, c.train.batch, c.train.lr), (256, 32, 3e-4));
    }
}
