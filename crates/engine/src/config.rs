//! Model and training configuration: presets, TOML files, flag overrides and validation.

use crate::dataset::DataFormat;
use crate::dataset::io_message;
use crate::fp8::{AmaxAlgo, DelayedScaling, Fp8FamilyChoice, Fp8FastAccum, Fp8Recipe};
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

/// Most parameters a model may have: 2^40 (about 1.1e12). Far beyond what one device holds
/// (16 bytes a parameter with gradients and AdamW state), so it rejects no real model; it exists
/// so that sizes from a typo (`--layers 18446744073709551615`) stop with a clear error before
/// anything is allocated, and every size derived from the shapes fits in 64 bits.
pub const MAX_PARAMS: u64 = 1 << 40;

/// Most elements one weight or activation tensor may have: 2^40 (4 TiB in f32).
pub const MAX_TENSOR_ELEMS: u64 = 1 << 40;

/// Most layers: far more than any real model, few enough that the per-layer bookkeeping
/// (a dozen tensors each) stays small. Tiny layers would otherwise pass the parameter limit
/// with billions of them.
pub const MAX_LAYERS: usize = 1 << 16;

/// Refuses a tensor of shape `dims` (named for the message) whose elements overflow 64 bits
/// or pass [`MAX_TENSOR_ELEMS`].
fn check_tensor(what: &str, dims: &[(&str, usize)]) -> Result<()> {
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &(_, d)| acc.checked_mul(d as u64));
    match n {
        Some(n) if n <= MAX_TENSOR_ELEMS => Ok(()),
        _ => {
            let names: Vec<&str> = dims.iter().map(|d| d.0).collect();
            let values: Vec<String> = dims.iter().map(|d| d.1.to_string()).collect();
            Err(EngineError::Config(format!(
                "{what} ({} = {}) would have more than 2^40 (about 1.1e12) elements",
                names.join(" × "),
                values.join(" × ")
            )))
        }
    }
}

impl ModelConfig {
    /// `d_model / heads` (0 heads counts as 1, so that an unvalidated config does not divide by 0).
    pub fn head_size(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Number of trainable parameters (the LM head is tied to the token embedding); `None`
    /// when it does not fit in 64 bits.
    pub fn checked_num_params(&self) -> Option<u64> {
        let (v, c, f, l, t) = (
            self.vocab as u64,
            self.d_model as u64,
            self.ffn as u64,
            self.layers as u64,
            self.max_seq as u64,
        );
        // Per layer: LayerNorms 4c, attention 3c² + 3c, projection c² + c, MLP 2fc + f + c.
        let cc = c.checked_mul(c)?;
        let fc = f.checked_mul(c)?;
        let per_layer = cc
            .checked_mul(4)?
            .checked_add(fc.checked_mul(2)?)?
            .checked_add(c.checked_mul(9)?)?
            .checked_add(f)?;
        v.checked_mul(c)?
            .checked_add(t.checked_mul(c)?)?
            .checked_add(l.checked_mul(per_layer)?)?
            .checked_add(c.checked_mul(2)?)
    }

    /// Number of trainable parameters (the LM head is tied to the token embedding). Exact for
    /// a validated config; saturates instead of wrapping for an absurd one.
    pub fn num_params(&self) -> usize {
        self.checked_num_params()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
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
        // Sizes, with checked arithmetic, before anything is allocated: the largest weight
        // matrices (the attention's 3c × c is the largest of a block), then the whole model.
        let (v, c, f, t) = (self.vocab, self.d_model, self.ffn, self.max_seq);
        check_tensor("the token embedding", &[("vocab", v), ("d_model", c)])?;
        check_tensor("the position embedding", &[("max_seq", t), ("d_model", c)])?;
        check_tensor(
            "the attention weight",
            &[("3", 3), ("d_model", c), ("d_model", c)],
        )?;
        check_tensor("the MLP weight", &[("ffn", f), ("d_model", c)])?;
        if self.checked_num_params().is_none_or(|n| n > MAX_PARAMS) {
            return Err(EngineError::Config(format!(
                "the model has more than 2^40 (about 1.1e12) parameters (vocab {v}, d_model \
                 {c}, ffn {f}, layers {}, max_seq {t})",
                self.layers
            )));
        }
        if self.layers > MAX_LAYERS {
            return Err(EngineError::Config(format!(
                "layers ({}) is more than {MAX_LAYERS} (2^16), far beyond any real model",
                self.layers
            )));
        }
        Ok(())
    }
}

/// Optimisation and run settings, in groups. In a config file and a checkpoint they are one flat
/// `[train]` table (the groups are flattened), as before the groups existed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Steps of the whole run (the learning-rate schedule ends there).
    pub steps: u64,
    #[serde(flatten)]
    pub data: DataConfig,
    #[serde(flatten)]
    pub optimizer: OptimizerConfig,
    #[serde(flatten)]
    pub recipe: PrecisionRecipe,
    #[serde(flatten)]
    pub execution: ExecutionConfig,
}

/// What a run trains on and in which order: the batch shape, the data (a file, or the synthetic
/// progression task and its evaluation) and the seed of the weights and the data order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataConfig {
    pub batch: usize,
    /// Gradient accumulation: each step's batch runs as this many micro-batches of
    /// batch / (ranks · grad_accum) rows, their gradients summed (in f32) before one optimizer
    /// step: the step of the whole batch up to rounding (1 = off).
    #[serde(default = "default_grad_accum")]
    pub grad_accum: usize,
    /// Tokens per training sequence (≤ model.max_seq).
    pub seq: usize,
    pub seed: u64,
    /// Held-out progressions checked by greedy generation at the end of the run.
    pub eval_sequences: usize,
    /// Strides of the arithmetic-progression task are drawn from 1..=max_stride.
    pub max_stride: usize,
    /// Training data: empty for the synthetic progression task, else files, folders and globs
    /// of UTF-8 text (byte tokens) or token shards ([`crate::dataset::resolve_data`]). A run
    /// records the resolved shards, absolute; a config file may also give the single string of
    /// earlier versions (`data = "corpus.txt"`).
    #[serde(default, deserialize_with = "string_or_list")]
    pub data: Vec<String>,
    /// Validation shards (the same syntax); empty: a `data` folder's `*val*.bin` shards, else
    /// the tail of every training shard ([`crate::dataset::VAL_FRACTION`]).
    #[serde(default, deserialize_with = "string_or_list")]
    pub val_data: Vec<String>,
    /// How the data files are read: auto (by name), text, llmc or nanogpt.
    #[serde(default)]
    pub data_format: DataFormat,
    /// Most validation batches evaluated (evenly spaced windows of the validation data).
    #[serde(default = "default_val_batches")]
    pub val_batches: usize,
    /// The tokenizer of the data (`duet train --tokenizer`): the path it was read from (a
    /// tokenizer.json or a folder holding one or GPT-2's files), empty for byte tokens or the
    /// synthetic task. The run copies it into its folder as `tokenizer.json`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tokenizer: String,
    /// blake3 of the tokenizer's canonical tokenizer.json (duet_tokenize's `Tokenizer::hash`),
    /// empty without a tokenizer; checkpoints also carry it as the `tokenizer_hash` metadata key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tokenizer_hash: String,
}

impl DataConfig {
    /// The data as a log line names it: the file, or the number of shards and the first.
    pub fn describe(&self) -> String {
        let list = |v: &[String]| match v {
            [] => String::new(),
            [one] => one.clone(),
            [first, ..] => format!("{} shards ({first}, …)", v.len()),
        };
        match self.val_data.is_empty() {
            true => list(&self.data),
            false => format!("{} | val {}", list(&self.data), list(&self.val_data)),
        }
    }
}

fn default_val_batches() -> usize {
    crate::dataset::DEFAULT_VAL_BATCHES
}

/// A list of strings, or one string (a one-element list; empty: none), as earlier config files
/// and checkpoints wrote `data`.
fn string_or_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<String>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a path or a list of paths")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<Self::Value, E> {
            Ok(if s.is_empty() {
                Vec::new()
            } else {
                vec![s.to_string()]
            })
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut v = Vec::new();
            while let Some(s) = seq.next_element::<String>()? {
                v.push(s);
            }
            Ok(v)
        }
    }
    d.deserialize_any(V)
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// AdamW and its learning-rate schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
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
    /// Steps the warm-up + cosine schedule spans when they are not the run's `steps`: 0 (the
    /// usual case, not written) means `steps`. A resumed run that changes `--steps` keeps the
    /// schedule the run started with (this is then that run's step count): past its end it
    /// continues at the final learning rate (`lr · min_lr_ratio`) instead of stretching the
    /// cosine over the new length.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub schedule_steps: u64,
}

/// How the numbers are stored and scaled: the precision, loss scaling, the FP8 delayed-scaling
/// recipe and the weight gradients' storage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrecisionRecipe {
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
    /// FP8 encodings: device (the default: the device's own), ocp or fnuz (the CPU computes
    /// both; a GPU only its own).
    #[serde(default)]
    pub fp8_family: Fp8FamilyChoice,
    /// Storage of the linear layers' weight gradients: `auto` keeps them in bf16 for bf16 and
    /// fp8 runs on one device (the f32-accumulated GEMM result rounded once, the values PyTorch
    /// autocast hands its optimizer) and f32 otherwise; `f32` always keeps f32.
    #[serde(default)]
    pub weight_grad_dtype: WeightGradDtype,
}

/// How a step runs, not what it computes: every setting here gives the same numbers (GEMM
/// autotuning the same values up to the last bits), so a resumed run may change them (the
/// `duet train` flags of its Execution group).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionConfig {
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
    /// Recompute the MLP's GELU output in the backward pass instead of keeping it (batch × seq
    /// × ffn activations per block less memory; false: a little faster). FP8 never stores it.
    #[serde(default = "default_true")]
    pub recompute_gelu: bool,
    /// Rows of logits the LM head and the loss handle at once (0 = automatic: the logits
    /// whole up to 1 GiB, 512 MiB where the GELU outputs are kept, else in the fewest equal
    /// chunks of rows that fit; a divisor of batch × seq). Chunks hold less memory; the tied
    /// embedding's gradient then sums the chunks' contributions one after another, so it may
    /// differ in the last bits.
    #[serde(default)]
    pub logits_chunk_rows: usize,
}

fn default_true() -> bool {
    true
}

fn default_grad_accum() -> usize {
    1
}

fn default_amax_history_len() -> usize {
    16
}

fn default_loss_every() -> u64 {
    10
}

/// `base` with the changes `f` makes (the presets).
fn with(base: &TrainConfig, f: impl FnOnce(&mut TrainConfig)) -> TrainConfig {
    let mut t = base.clone();
    f(&mut t);
    t
}

impl PrecisionRecipe {
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
    /// GPT-2 (124M): d_model 768, 12 heads, 12 layers, vocab 50257, context 1024, batch 32.
    Gpt2,
    /// GPT-2 medium (350M): d_model 1024, 16 heads, 24 layers, batch 16.
    Gpt2Medium,
    /// GPT-2 large (774M): d_model 1280, 20 heads, 36 layers, batch 8.
    Gpt2Large,
    /// GPT-2 XL (1.56B): d_model 1600, 25 heads, 48 layers, batch 4.
    Gpt2Xl,
}

impl Preset {
    pub const NAMES: [&'static str; 8] = [
        "default",
        "seed",
        "large",
        "tiny",
        "gpt2",
        "gpt2-medium",
        "gpt2-large",
        "gpt2-xl",
    ];
}

impl std::str::FromStr for Preset {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "default" => Ok(Preset::Default),
            "seed" => Ok(Preset::Seed),
            "large" => Ok(Preset::Large),
            "tiny" => Ok(Preset::Tiny),
            "gpt2" => Ok(Preset::Gpt2),
            "gpt2-medium" => Ok(Preset::Gpt2Medium),
            "gpt2-large" => Ok(Preset::Gpt2Large),
            "gpt2-xl" => Ok(Preset::Gpt2Xl),
            other => Err(EngineError::Config(format!(
                "unknown preset '{other}' (expected one of {})",
                Preset::NAMES.join(", ")
            ))),
        }
    }
}

/// The training settings every preset starts from (each changes a few of them).
fn preset_train() -> TrainConfig {
    TrainConfig {
        steps: 600,
        data: DataConfig {
            batch: 32,
            grad_accum: 1,
            seq: 48,
            seed: 1337,
            eval_sequences: 256,
            max_stride: 8,
            data: Vec::new(),
            val_data: Vec::new(),
            data_format: DataFormat::Auto,
            val_batches: crate::dataset::DEFAULT_VAL_BATCHES,
            tokenizer: String::new(),
            tokenizer_hash: String::new(),
        },
        optimizer: OptimizerConfig {
            lr: 2e-3,
            warmup: 50,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            grad_clip: 1.0,
            schedule_steps: 0,
        },
        recipe: PrecisionRecipe {
            precision: Precision::Fp32,
            loss_scale: 0.0,
            fp8_format: Fp8Recipe::Hybrid,
            fp8_amax_history_len: default_amax_history_len(),
            fp8_amax_compute_algo: AmaxAlgo::Max,
            fp8_margin: 0,
            fp8_fast_accum: Fp8FastAccum::default(),
            fp8_family: Fp8FamilyChoice::default(),
            weight_grad_dtype: WeightGradDtype::Auto,
        },
        execution: ExecutionConfig {
            checkpoint_every: 0,
            loss_every: default_loss_every(),
            graphs: true,
            gemm_autotune: false,
            recompute_gelu: true,
            logits_chunk_rows: 0,
        },
    }
}

/// The GPT-2 presets (`p`, from `train`): GPT-2's sizes (OpenAI's release: vocab 50257,
/// context 1024, the residual projections initialised with std 0.02/√(2·layers) as every duet
/// model) with the optimizer of nanoGPT / llm.c's GPT-2 runs: AdamW β (0.9, 0.95), weight decay
/// 0.1 on matrices and embeddings, clipping at 1.0, warm-up 700 steps then cosine to 10% of the
/// peak; the peak learning rates of the GPT-3 paper's table for these sizes (6e-4, 3e-4,
/// 2.5e-4, 2e-4). Batch × 1024 tokens per step; the synthetic task by default (give --data for
/// text or llm.c shards).
fn gpt2_preset(p: Preset, train: &TrainConfig) -> Config {
    let (d_model, heads, layers, batch, lr) = match p {
        Preset::Gpt2 => (768, 12, 12, 32, 6e-4),
        Preset::Gpt2Medium => (1024, 16, 24, 16, 3e-4),
        Preset::Gpt2Large => (1280, 20, 36, 8, 2.5e-4),
        _ => (1600, 25, 48, 4, 2e-4),
    };
    Config {
        model: ModelConfig {
            vocab: 50257,
            d_model,
            heads,
            ffn: 4 * d_model,
            layers,
            max_seq: 1024,
        },
        train: with(train, |t| {
            t.data.batch = batch;
            t.data.seq = 1024;
            t.data.eval_sequences = 0;
            t.steps = 5000;
            t.optimizer.lr = lr;
            t.optimizer.warmup = 700;
            t.optimizer.min_lr_ratio = 0.1;
            t.optimizer.weight_decay = 0.1;
            // gpt2 keeps the MLP's GELU outputs (no recompute in the backward
            // pass: 2.3 ms of 69 a step on an H100 at B 32); its logits then go
            // in chunks of 4096 rows, and device memory stays under llm.c's
            // (results/2026-12-07-h100-gpt2-flash-v4/). The larger sizes recompute.
            t.execution.recompute_gelu = p != Preset::Gpt2;
        }),
    }
}

impl Config {
    /// The configuration of preset `p`.
    pub fn preset(p: Preset) -> Config {
        let train = preset_train();
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
                train: with(&train, |t| {
                    t.steps = 1000;
                    t.data.max_stride = 48;
                }),
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
                train: with(&train, |t| {
                    t.data.seq = 256;
                    t.steps = 300;
                    t.optimizer.lr = 3e-4;
                    t.optimizer.warmup = 30;
                }),
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
                train: with(&train, |t| {
                    t.data.seq = 256;
                    t.steps = 300;
                    t.optimizer.lr = 3e-4;
                    t.optimizer.warmup = 30;
                }),
            },
            // GPT-2's sizes with the optimizer of nanoGPT / llm.c's GPT-2 runs.
            Preset::Gpt2 | Preset::Gpt2Medium | Preset::Gpt2Large | Preset::Gpt2Xl => {
                gpt2_preset(p, &train)
            }
            Preset::Tiny => Config {
                model: ModelConfig {
                    vocab: 96,
                    d_model: 32,
                    heads: 4,
                    ffn: 64,
                    layers: 2,
                    max_seq: 16,
                },
                train: with(&train, |t| {
                    t.data.batch = 4;
                    t.data.seq = 16;
                    t.steps = 20;
                    t.optimizer.lr = 1e-3;
                    t.optimizer.warmup = 2;
                    t.data.eval_sequences = 0;
                }),
            },
        }
    }

    /// Reads a TOML file whose tables override `base` field by field
    /// (e.g. `[model] layers = 6` keeps every other field of `base`).
    pub fn from_toml_file(path: &Path, base: Config) -> Result<Config> {
        let io = |message: String| EngineError::Io {
            path: path.display().to_string(),
            message,
        };
        let bytes = crate::dataset::read_regular(path).map_err(|e| io(io_message(&e)))?;
        let text = String::from_utf8(bytes).map_err(|_| io("is not UTF-8 text".into()))?;
        Self::from_toml_str(&text, base).map_err(|e| match e {
            EngineError::Config(m) => EngineError::Config(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn from_toml_str(text: &str, base: Config) -> Result<Config> {
        let overrides: toml::Table = toml::from_str(text).map_err(|e| {
            // The parser's message lacks the place; its span gives it.
            let at = e
                .span()
                .map(|s| {
                    let (line, col) = position(text, s.start);
                    format!("line {line}, column {col}: ")
                })
                .unwrap_or_default();
            EngineError::Config(format!("{at}{}", one_line(e.message())))
        })?;
        let base_table = toml::Table::try_from(&base)
            .map_err(|e| EngineError::Config(format!("cannot serialise config: {e}")))?;
        let mut merged = base_table.clone();
        let mut set = Vec::new();
        for (section, value) in overrides {
            // Found (a second parse of the text) only for an error message.
            let at = || key_position(text, &section, None);
            let toml::Value::Table(src) = value else {
                if base_table.contains_key(&section) {
                    return Err(EngineError::Config(format!(
                        "{}'{section}' must be a table: write [{section}] and its keys below",
                        at()
                    )));
                }
                // `layers = 1` before any [section] header: name the table it belongs in.
                let home: Vec<String> = base_table
                    .iter()
                    .filter(|(_, t)| t.as_table().is_some_and(|t| t.contains_key(&section)))
                    .map(|(name, _)| format!("[{name}]"))
                    .collect();
                let home = if home.is_empty() {
                    "[model] or [train]".to_string()
                } else {
                    home.join(" or ")
                };
                return Err(EngineError::Config(format!(
                    "{}'{section}' is a key outside any section: put it under {home}",
                    at()
                )));
            };
            let Some(toml::Value::Table(dst)) = merged.get_mut(&section) else {
                return Err(EngineError::Config(format!(
                    "{}unknown section [{section}] (expected [model] or [train])",
                    at()
                )));
            };
            for (k, v) in src {
                if !dst.contains_key(&k) && !skipped_when_empty(&section, &k) {
                    let at = key_position(text, &section, Some(&k));
                    return Err(EngineError::Config(format!(
                        "{at}unknown field {section}.{k}"
                    )));
                }
                dst.insert(k.clone(), v.clone());
                set.push((section.clone(), k, v));
            }
        }
        toml::Value::Table(merged)
            .try_into()
            .map_err(|e: toml::de::Error| {
                // A value of the wrong type: the merged table has no spans, so find the override
                // that fails on its own to name its key and line.
                for (section, k, v) in &set {
                    let mut one = base_table.clone();
                    if let Some(toml::Value::Table(dst)) = one.get_mut(section) {
                        dst.insert(k.clone(), v.clone());
                    }
                    if let Err(e) = toml::Value::Table(one).try_into::<Config>() {
                        let at = key_position(text, section, Some(k));
                        return EngineError::Config(format!(
                            "{at}bad value for {section}.{k}: {}",
                            one_line(e.message())
                        ));
                    }
                }
                EngineError::Config(one_line(&e.to_string()))
            })
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serialises")
    }

    /// A whole configuration as `to_toml` writes it (a checkpoint's), refusing keys it does not
    /// know: the groups are flattened into `[train]`, which serde cannot check by itself, so every
    /// key read must come back when the parsed config is written again. Keys a missing field's
    /// default fills (files from before that field existed) are fine.
    pub fn from_toml_exact(text: &str) -> std::result::Result<Config, String> {
        let cfg: Config = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
        let read: toml::Table = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
        let known = toml::Table::try_from(&cfg).map_err(|e| e.to_string())?;
        for (section, v) in &read {
            let Some(keys) = v.as_table() else {
                continue;
            };
            let Some(have) = known.get(section).and_then(|s| s.as_table()) else {
                return Err(format!("unknown section [{section}]"));
            };
            if let Some(k) = keys.keys().find(|k| !have.contains_key(*k)) {
                return Err(format!("unknown field {section}.{k}"));
            }
        }
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        self.model.validate()?;
        let t = &self.train;
        if t.data.batch == 0 {
            return Err(EngineError::Config("batch must be at least 1".into()));
        }
        if t.data.grad_accum == 0 || !t.data.batch.is_multiple_of(t.data.grad_accum) {
            return Err(EngineError::Config(format!(
                "grad_accum ({}) must be at least 1 and divide the batch ({})",
                t.data.grad_accum, t.data.batch
            )));
        }
        if t.data.seq == 0 {
            return Err(EngineError::Config("seq must be at least 1".into()));
        }
        if t.data.seq > self.model.max_seq {
            return Err(EngineError::Config(format!(
                "seq ({}) exceeds the model's maximum sequence length max_seq ({}): lower \
                 --seq or raise --max-seq (a model read from a file keeps its own)",
                t.data.seq, self.model.max_seq
            )));
        }
        if !(t.optimizer.lr.is_finite() && t.optimizer.lr > 0.0) {
            return Err(EngineError::Config(format!(
                "lr must be positive, got {}",
                t.optimizer.lr
            )));
        }
        for (name, b) in [("beta1", t.optimizer.beta1), ("beta2", t.optimizer.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(EngineError::Config(format!(
                    "{name} must be in [0, 1), got {b}"
                )));
            }
        }
        if !(t.optimizer.eps.is_finite() && t.optimizer.eps > 0.0) {
            return Err(EngineError::Config(format!(
                "eps must be positive, got {}",
                t.optimizer.eps
            )));
        }
        if !(t.optimizer.weight_decay.is_finite() && t.optimizer.weight_decay >= 0.0) {
            return Err(EngineError::Config("weight_decay must be ≥ 0".into()));
        }
        if !(t.optimizer.grad_clip.is_finite() && t.optimizer.grad_clip >= 0.0) {
            return Err(EngineError::Config(
                "grad_clip must be ≥ 0 (0 disables)".into(),
            ));
        }
        // The largest activations of a step, with checked arithmetic: the logits, the MLP's
        // hidden layer, the attention's q/k/v, and one t × t attention matrix.
        let (v, c, f) = (self.model.vocab, self.model.d_model, self.model.ffn);
        let (b, s) = (t.data.batch, t.data.seq);
        check_tensor("the logits", &[("batch", b), ("seq", s), ("vocab", v)])?;
        check_tensor(
            "the MLP activation",
            &[("batch", b), ("seq", s), ("ffn", f)],
        )?;
        check_tensor(
            "the q/k/v activation",
            &[("batch", b), ("seq", s), ("3", 3), ("d_model", c)],
        )?;
        check_tensor("an attention matrix", &[("seq", s), ("seq", s)])?;
        // The strides belong to the synthetic task only (a data file ignores them): token
        // ids 0..vocab with strides 1..=max_stride need max_stride < vocab.
        if t.data.data.is_empty() {
            if t.data.max_stride == 0 {
                return Err(EngineError::Config("max_stride must be at least 1".into()));
            }
            if v < 2 {
                return Err(EngineError::Config(format!(
                    "vocab {v} is too small: the synthetic progression task needs at least 2 \
                     tokens"
                )));
            }
            if t.data.max_stride >= v {
                return Err(EngineError::Config(format!(
                    "max_stride ({}) must be smaller than the vocabulary size ({v}): lower \
                     max_stride or raise vocab",
                    t.data.max_stride
                )));
            }
        }
        if t.data.val_batches == 0 {
            return Err(EngineError::Config("val_batches must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&t.optimizer.min_lr_ratio) {
            return Err(EngineError::Config("min_lr_ratio must be in [0, 1]".into()));
        }
        if !(t.recipe.loss_scale.is_finite() && t.recipe.loss_scale >= 0.0) {
            return Err(EngineError::Config(
                "loss_scale must be ≥ 0 (0: dynamic for fp16)".into(),
            ));
        }
        if t.execution.loss_every == 0 {
            return Err(EngineError::Config(
                "loss_every must be at least 1 (1 reads the loss back after every step)".into(),
            ));
        }
        t.recipe.delayed_scaling().validate()?;
        Ok(())
    }

    /// Steps the learning-rate schedule spans: `optimizer.schedule_steps`, or the run's steps
    /// where that is 0.
    pub fn schedule_steps(&self) -> u64 {
        match self.train.optimizer.schedule_steps {
            0 => self.train.steps,
            n => n,
        }
    }

    /// Learning rate at 0-based `step`: linear warm-up, then cosine decay over
    /// [`Config::schedule_steps`], then the final rate.
    pub fn lr_at(&self, step: u64) -> f32 {
        let t = &self.train;
        let lr = t.optimizer.lr as f64;
        if step < t.optimizer.warmup {
            return (lr * (step + 1) as f64 / t.optimizer.warmup as f64) as f32;
        }
        let decay_steps = self
            .schedule_steps()
            .saturating_sub(t.optimizer.warmup)
            .max(1);
        let progress = ((step - t.optimizer.warmup) as f64 / decay_steps as f64).min(1.0);
        let min_lr = lr * t.optimizer.min_lr_ratio as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        (min_lr + coeff * (lr - min_lr)) as f32
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn position(text: &str, offset: usize) -> (usize, usize) {
    // toml's spans start on character boundaries; past the end means the end.
    let before = text.get(..offset).unwrap_or(text);
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

/// "line L, column C: " for where `section` (or `key` in it) is written in `text`; empty when
/// it cannot be found.
fn key_position(text: &str, section: &str, key: Option<&str>) -> String {
    let Ok(doc) = toml::de::DeTable::parse(text) else {
        return String::new();
    };
    let find = || {
        let (k, v) = doc
            .get_ref()
            .iter()
            .find(|(k, _)| *k.get_ref() == section)?;
        let Some(key) = key else {
            return Some(k.span());
        };
        let toml::de::DeValue::Table(t) = v.get_ref() else {
            return None;
        };
        let (k, _) = t.iter().find(|(k, _)| *k.get_ref() == key)?;
        Some(k.span())
    };
    find().map_or(String::new(), |span| {
        let (line, col) = position(text, span.start);
        format!("line {line}, column {col}: ")
    })
}

/// The fields `to_toml` leaves out while they hold their default (`skip_serializing_if`), by
/// section: absent from a serialised base config, yet known, so a file that sets them (a run's
/// own config.toml, `--print-config` output) reads back. A test checks the list against the
/// struct definitions.
const SKIPPED_WHEN_EMPTY: [(&str, &str); 3] = [
    ("train", "tokenizer"),
    ("train", "tokenizer_hash"),
    ("train", "schedule_steps"),
];

fn skipped_when_empty(section: &str, key: &str) -> bool {
    SKIPPED_WHEN_EMPTY.contains(&(section, key))
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

    /// Every file duet writes reads back as an override file: a config with the fields that are
    /// left out while empty set (a tokenizer, a resumed run's schedule), as a run's config.toml
    /// and `--print-config` write it.
    #[test]
    fn written_configs_read_back_with_their_optional_fields() {
        let mut cfg = Config::preset(Preset::Tiny);
        cfg.train.data.tokenizer = "runs/a/tokenizer.json".into();
        cfg.train.data.tokenizer_hash = "0123abcd".into();
        cfg.train.optimizer.schedule_steps = 400;
        let text = cfg.to_toml();
        for k in ["tokenizer =", "tokenizer_hash =", "schedule_steps ="] {
            assert!(text.contains(k), "{k} is not written");
        }
        let back = Config::from_toml_str(&text, Config::preset(Preset::Tiny)).unwrap();
        assert_eq!(back, cfg);
        assert_eq!(Config::from_toml_exact(&text).unwrap(), cfg);
        // Still refused: a key nothing knows.
        let bad = text.replace("[train]\n", "[train]\ntokeniser = \"x\"\n");
        let e = Config::from_toml_str(&bad, Config::preset(Preset::Tiny)).unwrap_err();
        assert!(
            e.to_string().contains("unknown field train.tokeniser"),
            "{e}"
        );
    }

    /// The list of fields left out while empty is every `skip_serializing_if` field of this file.
    #[test]
    fn skipped_when_empty_lists_every_skipped_field() {
        let src = include_str!("config.rs");
        let mut lines = src.lines();
        let mut found = Vec::new();
        while let Some(l) = lines.next() {
            if l.trim_start().starts_with("#[serde(") && l.contains("skip_serializing_if") {
                let field = lines
                    .find(|l| l.trim_start().starts_with("pub "))
                    .and_then(|l| l.trim_start().strip_prefix("pub "))
                    .and_then(|l| l.split(':').next())
                    .expect("a field after the attribute");
                found.push(field.to_string());
            }
        }
        let listed: Vec<String> = SKIPPED_WHEN_EMPTY
            .iter()
            .map(|(_, k)| k.to_string())
            .collect();
        assert_eq!(found, listed);
    }

    /// A checkpoint's config must name only known keys, though the groups are flattened.
    #[test]
    fn exact_toml_refuses_unknown_keys_and_accepts_defaulted_ones() {
        let cfg = Config::preset(Preset::Tiny);
        let text = cfg.to_toml();
        assert_eq!(Config::from_toml_exact(&text).unwrap(), cfg);
        let extra = text.replace("[train]\n", "[train]\nlabel_smoothing = 0.1\n");
        assert_eq!(
            Config::from_toml_exact(&extra).unwrap_err(),
            "unknown field train.label_smoothing"
        );
        let extra = text.replace("[model]\n", "[model]\nrotary = true\n");
        let e = Config::from_toml_exact(&extra).unwrap_err();
        assert!(e.contains("unknown field") && e.contains("rotary"), "{e}");
        // A field added later with a default: older files without it still load.
        let older: String = text
            .lines()
            .filter(|l| !l.starts_with("recompute_gelu"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(older, text);
        assert_eq!(Config::from_toml_exact(&older).unwrap(), cfg);
    }

    #[test]
    fn toml_overrides_fields() {
        let base = Config::preset(Preset::Default);
        let c = Config::from_toml_str("[model]\nlayers = 6\n[train]\nlr = 0.01\n", base.clone())
            .unwrap();
        assert_eq!(c.model.layers, 6);
        assert_eq!(c.model.d_model, base.model.d_model);
        assert_eq!(c.train.optimizer.lr, 0.01);
        assert!(Config::from_toml_str("[model]\nlayerz = 6\n", base.clone()).is_err());
        assert!(Config::from_toml_str("[modle]\nlayers = 6\n", base.clone()).is_err());
        assert!(Config::from_toml_str("[model]\nlayers = -1\n", base).is_err());
    }

    #[test]
    fn graphs_default_on_and_toml_can_turn_them_off() {
        let base = Config::preset(Preset::Seed);
        assert!(base.train.execution.graphs);
        let c = Config::from_toml_str("[train]\ngraphs = false\n", base.clone()).unwrap();
        assert!(!c.train.execution.graphs);
        assert!(Config::from_toml_str("[train]\ngraphs = \"no\"\n", base).is_err());
    }

    #[test]
    fn validation_rejects_bad_shapes() {
        let mut c = Config::preset(Preset::Default);
        c.model.heads = 3;
        assert!(c.validate().unwrap_err().to_string().contains("divide"));
        let mut c = Config::preset(Preset::Default);
        c.train.data.seq = c.model.max_seq + 1;
        assert!(c.validate().unwrap_err().to_string().contains("max_seq"));
        let mut c = Config::preset(Preset::Default);
        c.model.layers = 0;
        assert!(c.validate().is_err());
        for p in [Preset::Default, Preset::Seed, Preset::Large, Preset::Tiny] {
            Config::preset(p).validate().unwrap();
        }
    }

    /// Absurd sizes are refused with checked arithmetic; a model of about 1e12 parameters with
    /// a 256k vocabulary and an 8k context is not.
    #[test]
    fn validation_limits_sizes_without_rejecting_real_models() {
        let err = |f: &dyn Fn(&mut Config)| {
            let mut c = Config::preset(Preset::Tiny);
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(err(&|c| c.model.ffn = usize::MAX).contains("the MLP weight"));
        assert!(err(&|c| c.model.max_seq = usize::MAX).contains("the position embedding"));
        assert!(err(&|c| c.model.layers = usize::MAX).contains("more than 2^40"));
        assert!(err(&|c| c.model.layers = MAX_LAYERS + 1).contains("layers (65537)"));
        assert!(err(&|c| c.model.vocab = 1).contains("vocab 1 is too small"));
        assert!(err(&|c| c.model.vocab = 5).contains("max_stride (8) must be smaller"));
        assert!(
            err(&|c| {
                c.model.d_model = 1_000_000_000;
                c.model.heads = 1;
            })
            .contains("the attention weight")
        );
        assert!(err(&|c| c.train.data.batch = usize::MAX).contains("the logits"));
        assert_eq!(
            ModelConfig {
                layers: usize::MAX,
                ..Config::preset(Preset::Tiny).model
            }
            .num_params(),
            usize::MAX,
            "saturates, does not wrap"
        );
        let mut big = Config::preset(Preset::Large);
        big.model = ModelConfig {
            vocab: 256_000,
            d_model: 25_600,
            heads: 200,
            ffn: 102_400,
            layers: 128,
            max_seq: 8192,
        };
        big.train.data.batch = 8;
        big.train.data.seq = 8192;
        big.validate().unwrap();
        assert!(big.model.num_params() > 1_000_000_000_000);
        // A data file does not use the synthetic task's strides.
        let mut c = Config::preset(Preset::Tiny);
        c.model.vocab = 5;
        c.train.data.data = vec!["tokens.bin".into()];
        c.validate().unwrap();
    }

    /// Errors in a TOML file name the line, the column and the key.
    #[test]
    fn toml_errors_say_where() {
        let base = Config::preset(Preset::Default);
        let err = |text: &str| {
            Config::from_toml_str(text, base.clone())
                .unwrap_err()
                .to_string()
        };
        assert!(err("[model]\nlayers = 1.2.3\n").contains("line 2, column "));
        assert!(err("[model]\nlayers = \"one\"\n").contains(
            "line 2, column 1: bad value for model.layers: invalid type: string \"one\", \
                 expected usize"
        ));
        assert!(err("layers = 1\n").contains(
            "line 1, column 1: 'layers' is a key outside any section: put it under [model]"
        ));
        assert!(err("lr = 1\n[model]\n").contains("put it under [train]"));
        assert!(err("x = 1\n").contains("put it under [model] or [train]"));
        assert!(err("model = 1\n").contains("'model' must be a table"));
        assert!(
            err("\n[train]\nstepz = 1\n").contains("line 3, column 1: unknown field train.stepz")
        );
        assert!(err("[modle]\n").contains("unknown section [modle]"));
    }

    #[test]
    fn lr_schedule_warms_up_and_decays() {
        let c = Config::preset(Preset::Default);
        assert!(c.lr_at(0) < c.lr_at(c.train.optimizer.warmup - 1));
        assert!((c.lr_at(c.train.optimizer.warmup) - c.train.optimizer.lr).abs() < 1e-6);
        let end = c.lr_at(c.train.steps);
        assert!((end - c.train.optimizer.lr * c.train.optimizer.min_lr_ratio).abs() < 1e-6);
        // A run extended past its schedule (a resume raising --steps) keeps the final rate;
        // the steps inside the schedule keep their rates.
        let mut longer = c.clone();
        longer.train.optimizer.schedule_steps = c.train.steps;
        longer.train.steps = 3 * c.train.steps;
        for step in [
            0,
            c.train.optimizer.warmup,
            c.train.steps / 2,
            c.train.steps - 1,
        ] {
            assert_eq!(longer.lr_at(step), c.lr_at(step), "step {step}");
        }
        assert_eq!(longer.lr_at(2 * c.train.steps), end);
        // 0 (configs from before the field): the run's steps.
        longer.train.optimizer.schedule_steps = 0;
        assert!(longer.lr_at(c.train.steps) > end);
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
        assert_eq!(
            (c.train.data.seq, c.train.data.batch, c.train.optimizer.lr),
            (256, 32, 3e-4)
        );
    }

    /// `data` reads as the single string earlier versions wrote, or as a list; the new data
    /// fields default when absent (files from before them) and `val_batches` must be positive.
    #[test]
    fn data_is_a_string_or_a_list_and_old_configs_read() {
        let base = Config::preset(Preset::Tiny);
        let c = Config::from_toml_str("[train]\ndata = \"corpus.txt\"\n", base.clone()).unwrap();
        assert_eq!(c.train.data.data, ["corpus.txt"]);
        let c = Config::from_toml_str("[train]\ndata = [\"a.bin\", \"b.bin\"]\nval_data = \"v.bin\"\ndata_format = \"nanogpt\"\n", base.clone()).unwrap();
        assert_eq!(c.train.data.data, ["a.bin", "b.bin"]);
        assert_eq!(c.train.data.val_data, ["v.bin"]);
        assert_eq!(c.train.data.data_format, DataFormat::Nanogpt);
        let c = Config::from_toml_str("[train]\ndata = \"\"\n", base.clone()).unwrap();
        assert!(
            c.train.data.data.is_empty(),
            "an empty string is the synthetic task"
        );
        // A config as an earlier duet wrote it: one string, none of the new keys.
        let mut old: toml::Table = toml::from_str(&base.to_toml()).unwrap();
        let train = old["train"].as_table_mut().unwrap();
        for k in ["val_data", "data_format", "val_batches"] {
            train.remove(k).unwrap();
        }
        train.insert("data".into(), "/data/corpus.txt".into());
        let back = Config::from_toml_exact(&toml::to_string(&old).unwrap()).unwrap();
        assert_eq!(back.train.data.data, ["/data/corpus.txt"]);
        assert_eq!(
            back.train.data.val_batches,
            crate::dataset::DEFAULT_VAL_BATCHES
        );
        assert_eq!(back.train.data.data_format, DataFormat::Auto);
        // Written again, it reads back the same.
        assert_eq!(Config::from_toml_exact(&back.to_toml()).unwrap(), back);
        let mut c = base;
        c.train.data.val_batches = 0;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("val_batches")
        );
    }
}
