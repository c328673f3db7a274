//! `duet generate`: continue a prompt from a checkpoint with a KV cache.

use crate::CliResult;
use crate::backends::{OnDevice, dispatch};
use clap::Args;
use duet_device::{BackendKind, Device};
use duet_engine::EngineError;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::config::Config;
use duet_engine::generate::{Generator, Sampling, WeightFormat, check_prompt_len};
use duet_tokenize::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A checkpoint written by `duet train` (the file or its --out folder).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Text prompt: encoded with the run's tokenizer, or as bytes for a model trained on a
    /// UTF-8 text file; prompt and continuation are printed as text.
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. "3,7,11,15"; prints the prompt's and the new
    /// ids, labelled.
    #[arg(long)]
    tokens: Option<String>,
    /// The tokenizer (a tokenizer.json or a folder holding one or GPT-2's files) [default: the
    /// tokenizer.json next to the checkpoint, else byte tokens].
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_new: usize,
    /// Sampling temperature; 0 = greedy [default: 0.8 for a model trained on data (nanoGPT's
    /// sample.py), 0 for the synthetic task].
    #[arg(long)]
    temperature: Option<f32>,
    /// Sample among the k most likely tokens, 0 = all [default: 200 when sampling a model
    /// trained on data, else 0].
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when prompt and new tokens fill the context (max_seq) instead of sliding the window
    /// (by default the KV cache is re-filled with the last max_seq − 1 tokens whenever it is
    /// full: about max_seq / 2 positions of compute per new token past the context).
    #[arg(long)]
    stop_at_context: bool,
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

/// The run's tokenizer: `--tokenizer`, else the tokenizer.json next to the checkpoint; `None`
/// when there is neither (a byte-token run, or one whose tokenizer was not recorded).
fn find_tokenizer(a: &GenerateArgs, ck_path: &Path, cfg: &Config) -> CliResult<Option<Tokenizer>> {
    let recorded = &cfg.train.data.tokenizer_hash;
    if let Some(p) = &a.tokenizer {
        let tok = Tokenizer::from_path(p)?;
        if !recorded.is_empty() && tok.hash() != recorded {
            eprintln!(
                "warning: --tokenizer {} is not the tokenizer the model was trained with (blake3 \
                 {}, the run's {}): its ids may mean other text",
                p.display(),
                &tok.hash()[..16],
                &recorded[..recorded.len().min(16)]
            );
        }
        return Ok(Some(tok));
    }
    let beside = ck_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(duet_tokenize::TOKENIZER_FILE);
    if !beside.is_file() {
        return Ok(None);
    }
    let tok = Tokenizer::from_path(&beside)?;
    if !recorded.is_empty() && tok.hash() != recorded {
        return Err(format!(
            "{} is not the tokenizer the model was trained with (blake3 {}, the run's {}): \
             give the run's tokenizer with --tokenizer",
            beside.display(),
            &tok.hash()[..16],
            &recorded[..recorded.len().min(16)]
        )
        .into());
    }
    Ok(Some(tok))
}

/// The text of `ids`; an id the tokenizer does not know (a padded vocabulary's) is U+FFFD.
fn decode_lossy(tok: &Tokenizer, ids: &[i32]) -> CliResult<String> {
    let mut text = String::new();
    for run in
        ids.chunk_by(|a, b| (*a as usize) < tok.vocab_size() && (*b as usize) < tok.vocab_size())
    {
        if run.len() == 1 && run[0] as usize >= tok.vocab_size() {
            text.push('\u{fffd}');
        } else {
            let u: Vec<u32> = run.iter().map(|&t| t as u32).collect();
            text.push_str(&tok.decode(&u)?);
        }
    }
    Ok(text)
}

fn join_ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

pub fn run(a: &GenerateArgs) -> CliResult<()> {
    let path = crate::cli_train::checkpoint_path(&a.checkpoint);
    let ck = Checkpoint::load(&path)?;
    let vocab = ck.config.model.vocab;
    let tok = find_tokenizer(a, &path, &ck.config)?;
    let (prompt, text) = match (&a.prompt, &a.tokens) {
        (Some(p), _) => match &tok {
            Some(tok) => {
                let ids = tok.encode(p)?;
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(format!(
                        "the tokenizer's token {bad} is outside the model's vocabulary 0..{vocab}"
                    )
                    .into());
                }
                (ids.into_iter().map(|t| t as i32).collect(), true)
            }
            None => {
                if !ck.config.train.data.tokenizer_hash.is_empty() {
                    return Err(format!(
                        "the model was trained with the tokenizer {} and there is no \
                         tokenizer.json next to the checkpoint: give it with --tokenizer",
                        ck.config.train.data.tokenizer
                    )
                    .into());
                }
                // The vocabulary's size alone cannot tell: a shard's 50257 ids cover 0..256
                // too, and the text would go in as the wrong tokens and come out as ids modulo
                // 256.
                if let Some(why) = not_bytes(&ck.config) {
                    return Err(format!(
                        "this model's tokens are not bytes ({why}): give --tokens ids, e.g. \
                         --tokens 3,7,11,15, or its --tokenizer"
                    )
                    .into());
                }
                (p.bytes().map(|b| b as i32).collect::<Vec<i32>>(), true)
            }
        },
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
    // A model trained on data samples by default (nanoGPT's sample.py: temperature 0.8,
    // top-k 200); the synthetic task's answers are checked greedily.
    let trained_on_data = !ck.config.train.data.data.is_empty();
    let temperature = a
        .temperature
        .unwrap_or(if trained_on_data { 0.8 } else { 0.0 });
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err("--temperature must be ≥ 0".into());
    }
    let top_k = match a.top_k {
        Some(k) if k > 0 && temperature == 0.0 => {
            return Err(
                "--top-k samples among the k most likely tokens, which needs --temperature > 0 \
                 (temperature 0 is greedy: the single most likely token)"
                    .into(),
            );
        }
        Some(k) => k,
        None if trained_on_data && temperature > 0.0 => 200,
        None => 0,
    };
    let context = ck.config.model.max_seq;
    // Before the weights go to the device; the generator checks the same rule.
    if a.stop_at_context
        && let Err(e) = check_prompt_len(prompt.len(), context)
    {
        return Err(match e {
            EngineError::Config(m) => m.into(),
            other => other.into(),
        });
    }
    if !a.stop_at_context && prompt.len() >= context {
        eprintln!(
            "note: the prompt's {} tokens do not fit the model's context of {context}: the last \
             {} are used",
            prompt.len(),
            context - 1
        );
    }
    let kind: BackendKind = a.backend.parse()?;
    let sampling = Sampling {
        temperature,
        top_k,
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
            slide: !a.stop_at_context,
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
        let all: Vec<i32> = prompt.iter().chain(&out).copied().collect();
        match &tok {
            Some(tok) => println!("{}", decode_lossy(tok, &all)?),
            None => {
                let bytes: Vec<u8> = all.iter().map(|&t| t as u8).collect();
                println!("{}", String::from_utf8_lossy(&bytes));
            }
        }
    } else {
        println!("prompt: {}", join_ids(&prompt));
        println!("new: {}", join_ids(&out));
    }
    Ok(())
}

struct GenTask {
    ck: Checkpoint,
    prompt: Vec<i32>,
    max_new: usize,
    sampling: Sampling,
    /// Past the context: slide the window (else stop).
    slide: bool,
    format: WeightFormat,
}

impl OnDevice for GenTask {
    type Output = Vec<i32>;

    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<Vec<i32>> {
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
        let keep = self.ck.config.model.max_seq - 1;
        Ok(if self.slide && keep > 0 {
            g.generate_sliding(&self.prompt, self.max_new, &self.sampling, keep)?
        } else {
            g.generate(&self.prompt, self.max_new, &self.sampling)?
        })
    }
}
