//! `duet generate`: continue a prompt from a checkpoint with a KV cache.

use crate::CliResult;
use crate::backends::{OnDevice, dispatch};
use clap::Args;
use duet_device::{BackendKind, Fused};
use duet_engine::EngineError;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::config::Config;
use duet_engine::generate::{Generator, Sampling, WeightFormat, check_prompt_len};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint written by `duet train` (the file or its --out folder).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Text prompt (byte tokens; for models trained on UTF-8 text files).
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. "3,7,11,15".
    #[arg(long)]
    tokens: Option<String>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_new: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Hold the linear layers' weights in FP8 (E4M3, one scale per matrix): a quarter of their
    /// f32 memory, dequantised before each GEMM.
    #[arg(long)]
    fp8: bool,
    #[arg(long, env = "DUET_BACKEND", default_value = "cpu")]
    backend: String,
    #[arg(long)]
    threads: Option<usize>,
}

/// Why a model's token ids are not bytes, from the data it was trained on; `None` for a model
/// trained on a UTF-8 text file, whose tokens are the text's bytes.
fn not_bytes(cfg: &Config) -> Option<String> {
    let data = &cfg.train.data.data;
    if data.is_empty() {
        return Some("trained on the synthetic progression task".into());
    }
    // The rule the data set reads the files by (`--data-format`, else a `.bin` is a shard).
    let format = cfg.train.data.data_format;
    if data
        .iter()
        .any(|d| !duet_engine::dataset::is_text(Path::new(d), format))
    {
        return Some(match format {
            duet_engine::dataset::DataFormat::Nanogpt => "trained on nanoGPT token shards".into(),
            _ => "trained on an llm.c token shard".into(),
        });
    }
    let vocab = cfg.model.vocab;
    (vocab < 256).then(|| format!("a vocabulary of {vocab} tokens does not cover the 256 bytes"))
}

pub fn run(a: &GenerateArgs) -> CliResult<()> {
    let path = crate::cli_train::checkpoint_path(&a.checkpoint);
    let ck = Checkpoint::load(&path)?;
    let vocab = ck.config.model.vocab;
    let (prompt, text) = match (&a.prompt, &a.tokens) {
        (Some(p), _) => {
            // The vocabulary's size alone cannot tell: a shard's 50257 ids cover 0..256 too,
            // and the text would go in as the wrong tokens and come out as ids modulo 256.
            if let Some(why) = not_bytes(&ck.config) {
                return Err(format!(
                    "this model's tokens are not bytes ({why}): give --tokens ids, e.g. \
                     --tokens 3,7,11,15"
                )
                .into());
            }
            (p.bytes().map(|b| b as i32).collect::<Vec<i32>>(), true)
        }
        (None, Some(t)) => {
            let ids: Result<Vec<i32>, _> = t.split(',').map(|x| x.trim().parse::<i32>()).collect();
            let ids =
                ids.map_err(|_| format!("--tokens must be comma-separated integers, got '{t}'"))?;
            if let Some(bad) = ids.iter().find(|&&x| x < 0 || x as usize >= vocab) {
                return Err(format!("token {bad} is outside the vocabulary 0..{vocab}").into());
            }
            (ids, false)
        }
        (None, None) => return Err("give a --prompt or --tokens".into()),
    };
    if prompt.is_empty() {
        return Err("the prompt is empty".into());
    }
    if !(a.temperature.is_finite() && a.temperature >= 0.0) {
        return Err("--temperature must be ≥ 0".into());
    }
    if a.top_k > 0 && a.temperature == 0.0 {
        return Err(
            "--top-k samples among the k most likely tokens, which needs --temperature > 0 \
             (temperature 0 is greedy: the single most likely token)"
                .into(),
        );
    }
    let context = ck.config.model.max_seq;
    // Before the weights go to the device; the generator checks the same rule.
    if let Err(e) = check_prompt_len(prompt.len(), context) {
        return Err(match e {
            EngineError::Config(m) => m.into(),
            other => other.into(),
        });
    }
    let kind: BackendKind = a.backend.parse()?;
    let sampling = Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        seed: a.seed,
    };
    let out = dispatch(
        kind,
        a.threads,
        GenTask {
            ck,
            prompt: prompt.clone(),
            max_new: a.max_new,
            sampling,
            format: if a.fp8 {
                WeightFormat::Fp8
            } else {
                WeightFormat::F32
            },
        },
    )?;
    if out.len() < a.max_new {
        eprintln!(
            "stopped after {} new tokens (--max-new {}): the model's context is {context} tokens, \
             filled by the prompt's {} and the new ones",
            out.len(),
            a.max_new,
            prompt.len()
        );
    }
    if text {
        let bytes: Vec<u8> = prompt.iter().chain(&out).map(|&t| t as u8).collect();
        println!("{}", String::from_utf8_lossy(&bytes));
    } else {
        let ids: Vec<String> = out.iter().map(i32::to_string).collect();
        println!("{}", ids.join(","));
    }
    Ok(())
}

struct GenTask {
    ck: Checkpoint,
    prompt: Vec<i32>,
    max_new: usize,
    sampling: Sampling,
    format: WeightFormat,
}

impl OnDevice for GenTask {
    type Output = Vec<i32>;

    fn run<D: Fused>(self, dev: Arc<D>) -> CliResult<Vec<i32>> {
        let mut g =
            Generator::from_weights(dev, &self.ck.config.model, &self.ck.weights, self.format)?;
        eprintln!(
            "weights: {} on the device ({})",
            duet_device::human_bytes(g.weight_bytes()),
            if self.format == WeightFormat::Fp8 {
                "linear layers in FP8"
            } else {
                "f32"
            }
        );
        Ok(g.generate(&self.prompt, self.max_new, &self.sampling)?)
    }
}
