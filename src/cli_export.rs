//! `duet export`: a checkpoint's model for other tools (see [`duet_engine::export`]).

use crate::CliResult;
use clap::Args;
use duet_engine::export::{CONFIG_FILE, ExportFormat, WEIGHTS_FILE, export};
use duet_engine::init::{ShapeRequest, load_init_weights};
use std::path::{Path, PathBuf};

/// Tokenizer files copied from the run's folder when present (`duet train --tokenizer` puts
/// `tokenizer.json` there).
pub const TOKENIZER_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
];

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The folder to write (created when missing).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// The model: a checkpoint written by `duet train` (the file or its --out folder), or any
    /// file --init-from takes.
    #[arg(long, value_name = "FILE_OR_RUN_DIR")]
    checkpoint: PathBuf,
    /// hf: Hugging Face GPT-2 (config.json + model.safetensors for
    /// GPT2LMHeadModel.from_pretrained); nanogpt: a state dict with nanoGPT's names
    /// (model.safetensors + config.json with its model args).
    #[arg(long, default_value = "hf", value_name = "hf|nanogpt")]
    format: String,
    /// The head count, for a source file that does not record it (default: a duet checkpoint's
    /// config, or n_head of a config.json beside the file).
    #[arg(long)]
    heads: Option<usize>,
    /// Replace config.json, model.safetensors and tokenizer files already in DIR.
    #[arg(long)]
    overwrite: bool,
}

pub fn run(a: &ExportArgs) -> CliResult<()> {
    let format: ExportFormat = a.format.parse()?;
    let given = ShapeRequest {
        heads: a.heads,
        ..ShapeRequest::default()
    };
    let src = load_init_weights(&a.checkpoint, &given, None)?;
    for note in &src.notes {
        eprintln!("warning: {note}");
    }
    // The run's folder: where `duet train --out` put the checkpoint (and the tokenizer).
    let run_dir = src
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let tokenizer: Vec<PathBuf> = TOKENIZER_FILES
        .iter()
        .map(|f| run_dir.join(f))
        .filter(|p| p.is_file())
        .collect();
    // transformers' AutoTokenizer takes a folder's model_type (gpt2) for the tokenizer class
    // unless tokenizer_config.json names one; GPT2Tokenizer would ignore tokenizer.json.
    let has = |name: &str| tokenizer.iter().any(|p| p.ends_with(name));
    let tokenizer_config = (format == ExportFormat::HuggingFace
        && has("tokenizer.json")
        && !has("tokenizer_config.json"))
    .then(|| {
        let v = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": src.model.max_seq,
        });
        serde_json::to_string_pretty(&v).expect("JSON serialises") + "\n"
    });
    if !a.overwrite {
        let names = [CONFIG_FILE, WEIGHTS_FILE]
            .into_iter()
            .chain(tokenizer.iter().filter_map(|p| p.file_name()?.to_str()))
            .chain(tokenizer_config.as_ref().map(|_| "tokenizer_config.json"));
        for name in names {
            let p = a.dir.join(name);
            if p.exists() {
                return Err(format!(
                    "{} already exists: give --overwrite to replace it, or choose another folder",
                    p.display()
                )
                .into());
            }
        }
    }
    let mut written = export(&a.dir, &src.model, &src.weights, format)?;
    for from in &tokenizer {
        let to = a.dir.join(from.file_name().expect("a file name"));
        // Exporting into the run's own folder: the file is already there.
        if std::fs::canonicalize(from).ok() != std::fs::canonicalize(&to).ok() || !to.exists() {
            std::fs::copy(from, &to)
                .map_err(|e| format!("cannot copy {} to {}: {e}", from.display(), to.display()))?;
        }
        written.push(to);
    }
    if let Some(json) = &tokenizer_config {
        let to = a.dir.join("tokenizer_config.json");
        std::fs::write(&to, json).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
        written.push(to);
    }
    let m = &src.model;
    println!(
        "exported {} ({}: vocab {}, d_model {}, heads {}, ffn {}, layers {}, context {}) as {}:",
        src.path.display(),
        src.format,
        m.vocab,
        m.d_model,
        m.heads,
        m.ffn,
        m.layers,
        m.max_seq,
        match format {
            ExportFormat::HuggingFace => "Hugging Face GPT-2",
            ExportFormat::NanoGpt => "a nanoGPT state dict",
        }
    );
    for p in &written {
        println!("  {}", p.display());
    }
    if tokenizer.is_empty() && format == ExportFormat::HuggingFace {
        eprintln!(
            "note: {} holds no tokenizer.json: the folder has the model only (token ids in and \
             out)",
            run_dir.display()
        );
    }
    Ok(())
}
