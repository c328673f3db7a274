//! `duet eval`: a model's loss and perplexity over a data set, computed as a training run's
//! validation is: the same evenly spaced windows of the data ([`DataSet::validation_batches`]),
//! the same forward pass and loss, the mean of the batches' mean losses.

use crate::CliResult;
use crate::backends::{OnDevice, dispatch};
use clap::Args;
use duet_device::{BackendKind, Device};
use duet_engine::config::ModelConfig;
use duet_engine::dataset::{DataFiles, DataFormat, DataSet, resolve_data};
use duet_engine::generate::{ModelFile, load_model};
use duet_engine::precision::PrecisionPlan;
use duet_engine::{Gpt, Precision};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The model: a checkpoint written by `duet train` (the file or its --out folder), a
    /// Hugging Face GPT-2 folder (as `duet export` writes one) or any file --init-from takes.
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// The data set: files, folders or globs, as train's --val-data takes them: UTF-8 text (byte
    /// tokens) or token shards; a folder gives its `*val*.bin` shards, else its `.bin` shards
    /// not named `*train*`. Every file is evaluated whole.
    #[arg(long, value_name = "PATH", required = true, num_args = 1.., value_delimiter = ',')]
    data: Vec<String>,
    /// auto, text, llmc or nanogpt, as train's --data-format [default: the checkpoint's run's,
    /// else auto]
    #[arg(long, value_name = "FORMAT")]
    data_format: Option<String>,
    /// Sequences per batch [default: the checkpoint's --batch, else 8].
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per sequence [default: the checkpoint's --seq, else the model's context].
    #[arg(long)]
    seq: Option<usize>,
    /// Most batches, evenly spaced over the data [default: all: every window of --seq tokens
    /// once]. A run's validation takes its --val-batches (8 unless set) over its validation
    /// data: the same number on the same data, batch and seq gives the run's validation loss.
    #[arg(long, value_name = "N")]
    max_batches: Option<usize>,
    /// The head count, for a model file that does not record it.
    #[arg(long)]
    heads: Option<usize>,
    /// cpu, cuda, hip or auto.
    #[arg(long, env = "DUET_BACKEND", default_value = "cpu")]
    backend: String,
    /// CPU worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Refuses data tokenized with another tokenizer than the model's (a `tokenizer.json` beside
/// the data files whose hash is not the one the checkpoint recorded).
fn check_tokenizer(m: &ModelFile, files: &[PathBuf]) -> CliResult<()> {
    let Some(ck) = &m.checkpoint else {
        return Ok(());
    };
    let recorded = &ck.config.train.data.tokenizer_hash;
    let mut dirs: Vec<&Path> = files.iter().filter_map(|f| f.parent()).collect();
    dirs.dedup();
    for d in dirs {
        let p = d.join(duet_tokenize::TOKENIZER_FILE);
        let Ok(tok) = duet_tokenize::Tokenizer::from_path(&p) else {
            continue;
        };
        if tok.hash() != recorded.as_str() {
            let model = if recorded.is_empty() {
                "byte tokens".to_string()
            } else {
                format!("blake3 {}", &recorded[..recorded.len().min(16)])
            };
            return Err(format!(
                "{} is not the tokenizer the model was trained with (blake3 {}, the model's \
                 {model}): the data's token ids would mean other text",
                p.display(),
                &tok.hash()[..16]
            )
            .into());
        }
    }
    Ok(())
}

pub fn run(a: &EvalArgs) -> CliResult<()> {
    let m = load_model(&a.checkpoint, a.heads)?;
    for note in &m.notes {
        eprintln!("warning: {note}");
    }
    let run = m.checkpoint.as_ref().map(|ck| &ck.config);
    let b = a.batch.or(run.map(|c| c.train.data.batch)).unwrap_or(8);
    let t = a
        .seq
        .or(run.map(|c| c.train.data.seq))
        .unwrap_or(m.model.max_seq);
    if b == 0 || t == 0 {
        return Err("--batch and --seq must be at least 1".into());
    }
    if t > m.model.max_seq {
        return Err(format!(
            "--seq {t} exceeds the model's context (max_seq {})",
            m.model.max_seq
        )
        .into());
    }
    let format: DataFormat = match &a.data_format {
        Some(f) => f.parse()?,
        None => run.map_or(DataFormat::Auto, |c| c.train.data.data_format),
    };
    let resolved = resolve_data(&[], &a.data, format)?;
    check_tokenizer(&m, &resolved.val)?;
    // The files are the data set's validation part, whole (the training part, which nothing
    // reads here, is the same files).
    let files = DataFiles {
        train: resolved.val.clone(),
        ..resolved
    };
    let data = DataSet::scan(&files, t)?;
    if data.vocab_needed > m.model.vocab {
        return Err(format!(
            "{} holds token ids up to {} but the model's vocabulary is {}: the data was not \
             tokenized for this model",
            data.largest_token_shard().path.display(),
            data.vocab_needed - 1,
            m.model.vocab
        )
        .into());
    }
    let max_batches = a.max_batches.unwrap_or(usize::MAX);
    if max_batches == 0 {
        return Err("--max-batches must be at least 1".into());
    }
    let windows = data.val_tokens().saturating_sub(1) / t;
    let n_batches = windows.div_ceil(b).clamp(1, max_batches);
    // The batches' token ids, made on the host before the model runs.
    duet_engine::check_host_memory((n_batches * b * t * 8) as u64, || {
        format!("the {n_batches} evaluation batches of {b} × {t} tokens (lower --max-batches)")
    })?;
    let batches = data.validation_batches(b, t, max_batches)?;
    let count = batches.len();
    eprintln!(
        "evaluating {} ({}) on {} batches of {b} × {t} tokens from {} file(s)",
        m.path.display(),
        m.format,
        count,
        files.val.len()
    );
    let (precision, plan, fp8_state) = match &m.checkpoint {
        Some(ck) => {
            let t_cfg = &ck.config.train;
            let chunk = t_cfg.execution.logits_chunk_rows;
            let plan = PrecisionPlan {
                fp8: t_cfg.recipe.delayed_scaling(),
                logits_chunk_rows: if chunk > 0 && (b * t).is_multiple_of(chunk) {
                    chunk
                } else {
                    0
                },
                ..PrecisionPlan::default()
            };
            let fp8 = ck.extra.get(duet_engine::train::FP8_STATE_KEY).cloned();
            (t_cfg.recipe.precision, plan, fp8)
        }
        None => (Precision::Fp32, PrecisionPlan::default(), None),
    };
    let kind: BackendKind = a.backend.parse()?;
    let loss = dispatch(
        kind,
        a.threads,
        EvalTask {
            model: m.model,
            weights: m.weights,
            b,
            t,
            precision,
            plan,
            fp8_state,
            batches,
        },
    )?;
    println!(
        "loss {loss:.6} | perplexity {:.4} | {count} batches of {b} × {t} tokens ({} predicted)",
        (loss as f64).exp(),
        count * b * t
    );
    Ok(())
}

struct EvalTask {
    model: ModelConfig,
    weights: Vec<Vec<f32>>,
    b: usize,
    t: usize,
    /// The run's precision, resolved against the device as a resumed run's is.
    precision: Precision,
    plan: PrecisionPlan,
    /// The run's FP8 scaling state (JSON), for an FP8 run.
    fp8_state: Option<String>,
    batches: Vec<(Vec<i32>, Vec<i32>)>,
}

impl OnDevice for EvalTask {
    type Output = f32;

    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<f32> {
        let (precision, warning) =
            duet_engine::precision::resolve_precision_on(&*dev, self.precision, false)?;
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        let plan = PrecisionPlan {
            precision,
            ..self.plan
        };
        let estimate =
            duet_engine::model::estimate_memory(&*dev, &self.model, self.b, self.t, &plan)?;
        if dev.info().backend == "cpu" {
            duet_engine::check_host_memory(estimate.total(), || {
                format!(
                    "the model for batches of {} × {} (lower --batch or --seq)",
                    self.b, self.t
                )
            })?;
        }
        let mut model = Gpt::with_precision(dev, &self.model, self.b, self.t, &self.weights, plan)?;
        drop(self.weights);
        if let (true, Some(json)) = (model.fp8_enabled(), &self.fp8_state) {
            let ops: Vec<duet_engine::fp8::OperandScaling> = serde_json::from_str(json)
                .map_err(|e| format!("the checkpoint's FP8 state: {e}"))?;
            model.set_fp8_state(&ops)?;
        }
        // As the trainer's validation: the mean of the batches' mean losses.
        let mut total = 0f64;
        for (x, y) in &self.batches {
            model.forward(x)?;
            total += model.loss(y, false)? as f64;
        }
        Ok((total / self.batches.len() as f64) as f32)
    }
}
