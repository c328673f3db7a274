//! `duet export`: a checkpoint's model for other tools (see [`duet_engine::export`]).

use crate::CliResult;
use clap::Args;
use duet_engine::export::{
    CONFIG_FILE, ExportFormat, WEIGHTS_FILE, hf_config_json_with, hf_eos, nanogpt_config_json,
    weights_bytes, write_all_or_nothing,
};
use duet_engine::generate::load_model;
use duet_tokenize::{EOT_TEXT, Tokenizer};
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
    /// Replace config.json, model.safetensors and tokenizer files already in DIR (all of them
    /// or, when a write fails, none).
    #[arg(long)]
    overwrite: bool,
}

/// The tokenizer files of `run_dir` to copy, and the end-of-text token of its tokenizer (for
/// the special tokens), `None` with a warning when the tokenizer does not load.
fn run_tokenizer(run_dir: &Path) -> (Vec<PathBuf>, Option<u32>) {
    let files: Vec<PathBuf> = TOKENIZER_FILES
        .iter()
        .map(|f| run_dir.join(f))
        .filter(|p| p.is_file())
        .collect();
    if files.is_empty() {
        return (files, None);
    }
    let eot = match Tokenizer::from_path(run_dir) {
        Ok(tok) => tok.eot(),
        Err(e) => {
            eprintln!(
                "warning: the tokenizer in {} does not load ({e}): its files are copied, but \
                 config.json names no end-of-text token from it",
                run_dir.display()
            );
            None
        }
    };
    (files, eot)
}

/// `tokenizer_config.json` and `special_tokens_map.json` for a `tokenizer.json` exported without
/// them: transformers' `AutoTokenizer` takes a folder's model_type (gpt2) for the tokenizer class
/// unless tokenizer_config.json names one (GPT2Tokenizer would ignore tokenizer.json), and
/// takes its special tokens from them (`<|endoftext|>` as bos, eos, pad and unk, as GPT-2's).
fn tokenizer_configs(max_seq: usize, eot: Option<u32>) -> Vec<(String, Vec<u8>)> {
    let json = |v: serde_json::Value| {
        (serde_json::to_string_pretty(&v).expect("JSON serialises") + "\n").into_bytes()
    };
    let mut config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_seq,
    });
    let mut out = Vec::new();
    if eot.is_some() {
        let special = serde_json::json!({
            "bos_token": EOT_TEXT,
            "eos_token": EOT_TEXT,
            "pad_token": EOT_TEXT,
            "unk_token": EOT_TEXT,
        });
        for (k, v) in special.as_object().expect("an object") {
            config[k] = v.clone();
        }
        out.push(("special_tokens_map.json".to_string(), json(special)));
    }
    out.insert(0, ("tokenizer_config.json".to_string(), json(config)));
    out
}

pub fn run(a: &ExportArgs) -> CliResult<()> {
    let format: ExportFormat = a.format.parse()?;
    let src = load_model(&a.checkpoint, a.heads)?;
    for note in &src.notes {
        eprintln!("warning: {note}");
    }
    // The run's folder: where `duet train --out` put the checkpoint (and the tokenizer).
    let run_dir = src
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let (tokenizer, eot) = run_tokenizer(&run_dir);
    let hf = format == ExportFormat::HuggingFace;
    // The end-of-text token: the tokenizer's, else what the source's config.json said.
    let eos = eot.or(src.eos_token_id).filter(|_| hf);
    let has = |name: &str| tokenizer.iter().any(|p| p.ends_with(name));
    let generated = if hf && has("tokenizer.json") && !has("tokenizer_config.json") {
        tokenizer_configs(src.model.max_seq, eot)
    } else {
        Vec::new()
    };
    let config = match format {
        ExportFormat::HuggingFace => hf_config_json_with(&src.model, eos),
        ExportFormat::NanoGpt => nanogpt_config_json(&src.model),
    };
    let mut files = vec![
        (CONFIG_FILE.to_string(), config.into_bytes()),
        (
            WEIGHTS_FILE.to_string(),
            weights_bytes(&src.model, &src.weights, format)?,
        ),
    ];
    let mut already_there = Vec::new();
    for from in &tokenizer {
        let name = from.file_name().expect("a file name");
        let to = a.dir.join(name);
        // Exporting into the run's own folder: the file is already there.
        if to.exists() && std::fs::canonicalize(from).ok() == std::fs::canonicalize(&to).ok() {
            already_there.push(to);
            continue;
        }
        let bytes = std::fs::read(from)
            .map_err(|e| format!("cannot read {}", duet_engine::dataset::at_path(from, &e)))?;
        files.push((name.to_string_lossy().into_owned(), bytes));
    }
    files.extend(generated.into_iter().filter(|(n, _)| !has(n)));
    if !a.overwrite {
        for name in files.iter().map(|(n, _)| n) {
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
    let mut written = write_all_or_nothing(&a.dir, &files)?;
    written.extend(already_there);
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
        if hf {
            "Hugging Face GPT-2"
        } else {
            "a nanoGPT state dict"
        }
    );
    for p in &written {
        println!("  {}", p.display());
    }
    match hf_eos(m, eos).filter(|_| hf) {
        Some(id) => println!(
            "end-of-text token {id}{}: bos_token_id, eos_token_id and pad_token_id",
            if eot.is_some_and(|e| e as usize == id) {
                format!(" ({EOT_TEXT})")
            } else {
                String::new()
            }
        ),
        None if hf => eprintln!(
            "note: no end-of-text token known (no tokenizer with {EOT_TEXT}): config.json's \
             bos_token_id and eos_token_id are null"
        ),
        None => {}
    }
    if tokenizer.is_empty() && hf {
        eprintln!(
            "note: {} holds no tokenizer.json: the folder has the model only (token ids in and \
             out)",
            run_dir.display()
        );
    }
    Ok(())
}
