//! `duet generate`: continue a prompt from a checkpoint or a Hugging Face GPT-2 folder with a KV
//! cache; and the samples `duet train --sample-every` prints ([`TrainingSamples`]).

use crate::CliResult;
use crate::backends::{OnDevice, dispatch};
use clap::Args;
use duet_device::{BackendKind, Device};
use duet_engine::config::{Config, ModelConfig};
use duet_engine::generate::{
    Generator, ModelFile, Sampling, WeightFormat, check_prompt_len, load_model, sample_from_model,
};
use duet_engine::run::StepLog;
use duet_engine::{EngineError, Trainer};
use duet_tokenize::Tokenizer;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The model: a checkpoint written by `duet train` (the file or its --out folder), a
    /// Hugging Face GPT-2 folder (config.json + model.safetensors, as `duet export` writes one)
    /// or any file --init-from takes.
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Text prompt: encoded with the model's tokenizer, or as bytes for a model trained on a
    /// UTF-8 text file; prompt and continuation are printed as text.
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. "3,7,11,15"; prints the prompt's and the new
    /// ids, labelled.
    #[arg(long)]
    tokens: Option<String>,
    /// The tokenizer (a tokenizer.json or a folder holding one or GPT-2's files) [default: the
    /// tokenizer beside the model (tokenizer.json, or GPT-2's vocab.json + merges.txt), else
    /// byte tokens].
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Tokens to generate (per sample).
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
    /// Nucleus sampling: sample among the fewest most likely tokens whose probabilities (after
    /// --temperature and --top-k) sum to at least P, in (0, 1]; 1 = all [default: 1].
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Samples to generate from the prompt, sample i with seed --seed + i, each printed after
    /// the one before it and a line of dashes.
    #[arg(long, value_name = "N", default_value_t = 1)]
    num_samples: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Go on past the end-of-text token (by default a sample ends with the tokenizer's
    /// <|endoftext|>, or a Hugging Face model's eos_token_id).
    #[arg(long)]
    ignore_eos: bool,
    /// Stop when prompt and new tokens fill the context (max_seq) instead of sliding the window.
    /// By default, when the KV cache is full it is re-filled with the last max_seq / 2 tokens
    /// in one batched pass: under two positions of compute per new token past the context,
    /// each token predicted from at least max_seq / 2 before it. (The window kept max_seq − 1
    /// tokens before, re-filled one position a token: text past the context differs from
    /// that.)
    #[arg(long)]
    stop_at_context: bool,
    /// Hold the linear layers' weights in FP8 (E4M3, one scale per matrix): a quarter of their
    /// f32 memory, dequantised before each GEMM.
    #[arg(long)]
    fp8: bool,
    /// The head count, for a model file that does not record it (default: a duet checkpoint's
    /// config, or n_head of a config.json beside the file).
    #[arg(long)]
    heads: Option<usize>,
    #[arg(long, env = "DUET_BACKEND", default_value = "cpu")]
    backend: String,
    #[arg(long)]
    threads: Option<usize>,
}

/// Why a duet run's token ids are not bytes, from the data it was trained on; `None` for a
/// model trained on a UTF-8 text file, whose tokens are the text's bytes.
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

/// Whether `dir` holds a tokenizer [`Tokenizer::from_path`] reads from a folder.
fn has_tokenizer(dir: &Path) -> bool {
    dir.join(duet_tokenize::TOKENIZER_FILE).is_file()
        || [("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe")]
            .iter()
            .any(|(v, m)| dir.join(v).is_file() && dir.join(m).is_file())
}

/// The model's tokenizer: `--tokenizer`, else the one beside the model file; `None` when there
/// is neither (a byte-token run, or one whose tokenizer was not recorded).
fn find_tokenizer(given: Option<&Path>, m: &ModelFile) -> CliResult<Option<Tokenizer>> {
    let recorded = m
        .checkpoint
        .as_ref()
        .map_or("", |ck| ck.config.train.data.tokenizer_hash.as_str());
    if let Some(p) = given {
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
    let dir = m.path.parent().unwrap_or(Path::new("."));
    if !has_tokenizer(dir) {
        return Ok(None);
    }
    let tok = Tokenizer::from_path(dir)?;
    if !recorded.is_empty() && tok.hash() != recorded {
        let json = dir.join(duet_tokenize::TOKENIZER_FILE);
        let named = if json.is_file() { json.as_path() } else { dir };
        return Err(format!(
            "{} is not the tokenizer the model was trained with (blake3 {}, the run's {}): \
             give the run's tokenizer with --tokenizer",
            named.display(),
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

/// The prompt's token ids from `--prompt` (encoded) or `--tokens`, and whether it is text.
fn prompt_ids(
    a: &GenerateArgs,
    m: &ModelFile,
    tok: Option<&Tokenizer>,
) -> CliResult<(Vec<i32>, bool)> {
    let vocab = m.model.vocab;
    let (ids, text) = match (&a.prompt, &a.tokens) {
        (Some(p), _) => match tok {
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
                if let Some(ck) = &m.checkpoint
                    && !ck.config.train.data.tokenizer_hash.is_empty()
                {
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
                let why = match &m.checkpoint {
                    Some(ck) => not_bytes(&ck.config),
                    None => Some(format!("a {} with no tokenizer beside it", m.format)),
                };
                if let Some(why) = why {
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
    if ids.is_empty() {
        return Err("the prompt is empty".into());
    }
    Ok((ids, text))
}

/// The sampling settings of the flags, with the defaults for the model, and the end-of-text
/// token a sample ends at.
fn sampling(a: &GenerateArgs, m: &ModelFile, tok: Option<&Tokenizer>) -> CliResult<Sampling> {
    // A model trained on data samples by default (nanoGPT's sample.py: temperature 0.8,
    // top-k 200); the synthetic task's answers are checked greedily.
    let trained_on_data = m
        .checkpoint
        .as_ref()
        .is_none_or(|ck| !ck.config.train.data.data.is_empty());
    let temperature = a
        .temperature
        .unwrap_or(if trained_on_data { 0.8 } else { 0.0 });
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err("--temperature must be ≥ 0".into());
    }
    let greedy_refused = |what: &str| -> CliResult<Sampling> {
        Err(format!(
            "{what}, which needs --temperature > 0 (temperature 0 is greedy: the single most \
             likely token)"
        )
        .into())
    };
    let top_k = match a.top_k {
        Some(k) if k > 0 && temperature == 0.0 => {
            return greedy_refused("--top-k samples among the k most likely tokens");
        }
        Some(k) => k,
        None if trained_on_data && temperature > 0.0 => 200,
        None => 0,
    };
    let top_p = a.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(format!("--top-p must be in (0, 1], got {top_p}").into());
    }
    if top_p < 1.0 && temperature == 0.0 {
        return greedy_refused("--top-p samples among the most likely tokens");
    }
    if a.num_samples == 0 {
        return Err("--num-samples must be at least 1".into());
    }
    if a.num_samples > 1 && temperature == 0.0 {
        return greedy_refused(&format!(
            "--num-samples {} draws different samples",
            a.num_samples
        ));
    }
    let eos = match tok {
        _ if a.ignore_eos => None,
        Some(t) => t.eot(),
        None => m.eos_token_id,
    }
    .map(|e| e as i32)
    .filter(|&e| (e as usize) < m.model.vocab);
    Ok(Sampling {
        temperature,
        top_k,
        top_p,
        seed: a.seed,
        eos,
    })
}

pub fn run(a: &GenerateArgs) -> CliResult<()> {
    let m = load_model(&a.checkpoint, a.heads)?;
    for note in &m.notes {
        eprintln!("warning: {note}");
    }
    let tok = find_tokenizer(a.tokenizer.as_deref(), &m)?;
    let (prompt, text) = prompt_ids(a, &m, tok.as_ref())?;
    let sampling = sampling(a, &m, tok.as_ref())?;
    let context = m.model.max_seq;
    let slide = !a.stop_at_context && context >= 2;
    // Before the weights go to the device; the generator checks the same rule.
    if !slide && let Err(e) = check_prompt_len(prompt.len(), context) {
        return Err(match e {
            EngineError::Config(m) => m.into(),
            other => other.into(),
        });
    }
    if slide && prompt.len() >= context {
        eprintln!(
            "note: the prompt's {} tokens do not fit the model's context of {context}: the last \
             {} are used",
            prompt.len(),
            context - 1
        );
    }
    let kind: BackendKind = a.backend.parse()?;
    let samples = dispatch(
        kind,
        a.threads,
        GenTask {
            model: m.model.clone(),
            weights: m.weights,
            prompt: prompt.clone(),
            max_new: a.max_new,
            sampling,
            samples: a.num_samples,
            slide,
            format: if a.fp8 {
                WeightFormat::Fp8
            } else {
                WeightFormat::F32
            },
        },
    )?;
    if !text {
        println!("prompt: {}", join_ids(&prompt));
    }
    for (i, out) in samples.iter().enumerate() {
        let ended = sampling.eos.filter(|&e| out.last() == Some(&e));
        let which = if samples.len() > 1 {
            format!("sample {}: ", i + 1)
        } else {
            String::new()
        };
        if let Some(e) = ended {
            eprintln!(
                "{which}stopped at the end-of-text token {e} after {} new tokens (--ignore-eos \
                 goes on)",
                out.len()
            );
        } else if out.len() < a.max_new {
            eprintln!(
                "{which}stopped after {} new tokens (--max-new {}): the model's context is \
                 {context} tokens, filled by the prompt's {} and the new ones",
                out.len(),
                a.max_new,
                prompt.len()
            );
        }
        if i > 0 && text {
            println!("---------------");
        }
        if !text {
            println!("new: {}", join_ids(out));
            continue;
        }
        // The end-of-text token ends the text; it is not part of it.
        let new = &out[..out.len() - ended.map_or(0, |_| 1)];
        let all: Vec<i32> = prompt.iter().chain(new).copied().collect();
        match &tok {
            Some(tok) => println!("{}", decode_lossy(tok, &all)?),
            None => {
                let bytes: Vec<u8> = all.iter().map(|&t| t as u8).collect();
                println!("{}", String::from_utf8_lossy(&bytes));
            }
        }
    }
    Ok(())
}

struct GenTask {
    model: ModelConfig,
    weights: Vec<Vec<f32>>,
    prompt: Vec<i32>,
    max_new: usize,
    sampling: Sampling,
    /// Samples to draw, the i-th with seed `sampling.seed + i`.
    samples: usize,
    /// Past the context: slide the window (else stop).
    slide: bool,
    format: WeightFormat,
}

impl OnDevice for GenTask {
    type Output = Vec<Vec<i32>>;

    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<Vec<Vec<i32>>> {
        let mut g = Generator::from_weights(dev, &self.model, &self.weights, self.format)?;
        drop(self.weights);
        eprintln!(
            "weights: {} on the device ({})",
            duet_device::human_bytes(g.weight_bytes()),
            if self.format == WeightFormat::Fp8 {
                "linear layers in FP8"
            } else {
                "f32"
            }
        );
        let mut out = Vec::with_capacity(self.samples);
        for i in 0..self.samples {
            let s = Sampling {
                seed: self.sampling.seed.wrapping_add(i as u64),
                ..self.sampling
            };
            g.reset();
            out.push(if self.slide {
                g.generate_sliding(&self.prompt, self.max_new, &s)?
            } else {
                g.generate(&self.prompt, self.max_new, &s)?
            });
        }
        Ok(out)
    }
}

/// `duet train --sample-every N`: every N steps (rank 0), a sample of the model in training —
/// [`TrainingSamples::TOKENS`] tokens after the end-of-text token (the start of a new document,
/// as llm.c samples), or after a newline for a model of byte tokens — printed with its step.
/// Sampled as `duet generate` does by default (temperature 0.8, top-k 200) with the run's seed,
/// from a copy of the weights: the run computes the same numbers with or without it.
pub(crate) struct TrainingSamples {
    every: u64,
    /// The step of the last sample (or the one before this invocation's first).
    last: Option<u64>,
    tok: Tokenizer,
    prompt: Vec<i32>,
    sampling: Sampling,
}

impl TrainingSamples {
    /// Tokens a sample has (llm.c's `genT`).
    pub(crate) const TOKENS: usize = 64;

    /// The sampler of a run with `cfg` (`None` without `--sample-every`, or on a rank other than
    /// 0); `out` is its folder, which holds its tokenizer.json. A run whose tokens are not text
    /// is refused (before it starts).
    pub(crate) fn new(
        cfg: &Config,
        every: u64,
        is_main: bool,
        out: Option<&Path>,
    ) -> CliResult<Option<Self>> {
        if every == 0 || !is_main {
            return Ok(None);
        }
        let d = &cfg.train.data;
        if d.data.is_empty() {
            return Err(
                "--sample-every: the synthetic task has no text to sample (its \
                        generation check runs at the end of the run)"
                    .into(),
            );
        }
        let tok = if !d.tokenizer.is_empty() {
            // The run's copy in --out (a resumed run's path may be relative to elsewhere).
            let copy = out
                .map(|o| o.join(duet_tokenize::TOKENIZER_FILE))
                .filter(|p| p.is_file());
            let path = copy.unwrap_or_else(|| PathBuf::from(&d.tokenizer));
            Tokenizer::from_path(&path)
                .map_err(|e| format!("--sample-every: the run's tokenizer: {e}"))?
        } else if let Some(why) = not_bytes(cfg) {
            return Err(format!(
                "--sample-every: this run's tokens are not text ({why}): give the data's \
                 --tokenizer"
            )
            .into());
        } else {
            Tokenizer::bytes()
        };
        let prompt = vec![tok.eot().map_or(b'\n' as i32, |e| e as i32)];
        if prompt[0] as usize >= cfg.model.vocab {
            return Err(format!(
                "--sample-every: the tokenizer's token {} is outside the model's vocabulary",
                prompt[0]
            )
            .into());
        }
        Ok(Some(Self {
            every,
            last: None,
            tok,
            prompt,
            sampling: Sampling {
                temperature: 0.8,
                top_k: 200,
                seed: d.seed,
                ..Sampling::default()
            },
        }))
    }

    /// After each step of the loop: a sample once the trainer has passed a multiple of N
    /// (at the last step read back together with it: steps are queued `--loss-every` at a
    /// time), printed above the progress bar when there is one.
    pub(crate) fn on_step<D: Device>(
        &mut self,
        trainer: &Trainer<D>,
        s: &StepLog,
        bar: Option<&ProgressBar>,
    ) -> duet_engine::Result<()> {
        let step = trainer.step();
        let last = *self.last.get_or_insert(s.report.step.saturating_sub(1));
        if s.report.step != step || step / self.every <= last / self.every {
            return Ok(());
        }
        self.last = Some(step);
        let new = sample_from_model(trainer.model(), &self.prompt, Self::TOKENS, &self.sampling)?;
        // The end-of-text token ends the text.
        let end = new
            .iter()
            .position(|&t| Some(t) == self.tok.eot().map(|e| e as i32))
            .unwrap_or(new.len());
        let text = decode_lossy(&self.tok, &new[..end])
            .map_err(|e| EngineError::Config(format!("decoding a sample: {e}")))?;
        let show = || println!("sample at step {step}:\n{text}\n---------------");
        match bar {
            Some(b) => b.suspend(show),
            None => show(),
        }
        Ok(())
    }
}
