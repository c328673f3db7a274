//! `duet tokenize`: text files to llm.c token shards.
//!
//! Every input file is one document. Folders are walked recursively in name order, taking the
//! files ending in .txt, .md, .rst or .py (`--all-files`: every file), skipping hidden files and
//! folders; a file named on the command line is always taken. Each document is encoded on its
//! own (in parallel) with the end-of-text token prepended, as llm.c's `fineweb.py` does (byte
//! tokens have none: documents are then concatenated as they are). The validation split is the
//! start of the token stream — the first `--val-docs` documents, or the first `--val-fraction`
//! of the tokens — written as `<name>_val_000000.bin`; the rest is cut into
//! `<name>_train_000001.bin`, `_000002`, … of `--shard-tokens` tokens each (llm.c's naming).
//! The tokenizer is saved as `tokenizer.json` next to the shards, so `--tokenizer DIR` of
//! `duet train` and `duet generate` finds it.
//!
//! The corpus is held in memory while it is encoded (its text, then 4 bytes a token).

use crate::CliResult;
use clap::Args;
use duet_tokenize::shard::{TokenWidth, write_shard};
use duet_tokenize::{TOKENIZER_FILE, Tokenizer, train_bpe};
use rayon::prelude::*;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// The extensions a folder's files are taken by (without `--all-files`).
pub const TEXT_EXTENSIONS: [&str; 4] = ["txt", "md", "rst", "py"];

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Text files or folders (walked recursively: .txt, .md, .rst and .py files, or every file
    /// with --all-files; hidden ones skipped). Each file is one document.
    #[arg(required = true, value_name = "PATH")]
    inputs: Vec<PathBuf>,
    /// Folder for the shards and tokenizer.json (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Tokenizer: a tokenizer.json, a folder with tokenizer.json or GPT-2's encoder.json +
    /// vocab.bpe (or vocab.json + merges.txt), or `bytes` [default: bytes unless --train-bpe].
    #[arg(long, value_name = "PATH", conflicts_with = "train_bpe")]
    tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE tokenizer of at most VOCAB tokens on the inputs instead (saved as
    /// tokenizer.json in --out).
    #[arg(long, value_name = "VOCAB")]
    train_bpe: Option<usize>,
    /// Shard name prefix [default: the first input's file or folder name].
    #[arg(long)]
    name: Option<String>,
    /// Tokens per training shard.
    #[arg(long, value_name = "N", default_value_t = 100_000_000)]
    shard_tokens: usize,
    /// The first F of the tokens form the validation shard (0: none).
    #[arg(
        long,
        value_name = "F",
        default_value_t = 0.1,
        conflicts_with = "val_docs"
    )]
    val_fraction: f64,
    /// The first N documents form the validation shard instead of --val-fraction.
    #[arg(long, value_name = "N")]
    val_docs: Option<usize>,
    /// Take every file of a folder, not only .txt, .md, .rst and .py.
    #[arg(long)]
    all_files: bool,
}

/// The documents of `inputs`, in order.
fn collect_files(inputs: &[PathBuf], all: bool) -> CliResult<Vec<PathBuf>> {
    fn walk(dir: &Path, all: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let p = e.path();
            let ty = e.file_type()?;
            if ty.is_dir() {
                walk(&p, all, out)?;
            } else if p.is_file()
                && (all
                    || p.extension()
                        .and_then(|x| x.to_str())
                        .is_some_and(|x| TEXT_EXTENSIONS.contains(&x)))
            {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for i in inputs {
        if i.is_dir() {
            walk(i, all, &mut files).map_err(|e| format!("{}: {e}", i.display()))?;
        } else if i.is_file() {
            files.push(i.clone());
        } else {
            return Err(format!("{}: no such file or folder", i.display()).into());
        }
    }
    if files.is_empty() {
        return Err(format!(
            "no documents found (folders are searched for .{} files; --all-files takes every file)",
            TEXT_EXTENSIONS.join(", .")
        )
        .into());
    }
    Ok(files)
}

fn progress(total: u64, what: &str) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("a template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    Some(pb)
}

pub fn run(a: &TokenizeArgs) -> CliResult<()> {
    if a.shard_tokens == 0 {
        return Err("--shard-tokens must be at least 1".into());
    }
    if !(0.0..1.0).contains(&a.val_fraction) {
        return Err("--val-fraction must be in [0, 1)".into());
    }
    let files = collect_files(&a.inputs, a.all_files)?;
    let docs: Vec<String> = files
        .par_iter()
        .map(|p| {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            String::from_utf8(bytes)
                .map_err(|_| format!("{}: not UTF-8 text (skip it, or convert it)", p.display()))
        })
        .collect::<Result<_, String>>()?;
    let total_bytes: u64 = docs.iter().map(|d| d.len() as u64).sum();
    eprintln!(
        "{} documents, {}",
        docs.len(),
        duet_device::human_bytes(total_bytes)
    );
    let tok = match (&a.tokenizer, a.train_bpe) {
        (Some(p), _) => Tokenizer::from_path(p)?,
        (None, Some(v)) => {
            eprintln!("training a byte-level BPE tokenizer of at most {v} tokens");
            let t = train_bpe(docs.iter(), v)?;
            eprintln!("trained: {} tokens", t.vocab_size());
            t
        }
        (None, None) => {
            eprintln!("note: byte tokens (no --tokenizer or --train-bpe)");
            Tokenizer::bytes()
        }
    };
    let width = TokenWidth::for_vocab(tok.vocab_size());
    if tok.eot().is_none() {
        eprintln!(
            "note: the tokenizer has no {} token: documents are concatenated without a separator",
            duet_tokenize::EOT_TEXT
        );
    }
    // Encode, in parallel over documents, each with the end-of-text token first.
    let pb = progress(total_bytes, "encoding");
    let encoded: Vec<Vec<u32>> = docs
        .par_iter()
        .map(|d| {
            let mut ids = Vec::with_capacity(d.len() / 3 + 1);
            ids.extend(tok.eot());
            ids.extend(tok.encode(d)?);
            if let Some(pb) = &pb {
                pb.inc(d.len() as u64);
            }
            Ok(ids)
        })
        .collect::<Result<_, duet_tokenize::Error>>()?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    drop(docs);
    let total: usize = encoded.iter().map(Vec::len).sum();
    let val_tokens = match a.val_docs {
        Some(n) => {
            if n >= encoded.len() {
                return Err(format!(
                    "--val-docs {n} leaves no training documents (there are {})",
                    encoded.len()
                )
                .into());
            }
            encoded[..n].iter().map(Vec::len).sum()
        }
        None if a.val_fraction > 0.0 => ((a.val_fraction * total as f64).round() as usize).max(1),
        None => 0,
    };
    if val_tokens >= total {
        return Err(format!("{total} tokens: too few to split off a validation set").into());
    }
    let stream: Vec<u32> = encoded.into_iter().flatten().collect();
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => a.inputs[0]
            .canonicalize()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "data".into()),
    };
    let write = |path: PathBuf, tokens: &[u32]| -> CliResult<()> {
        write_shard(&path, tokens, width).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {} ({} tokens)", path.display(), tokens.len());
        Ok(())
    };
    let (val, train) = stream.split_at(val_tokens);
    if !val.is_empty() {
        write(a.out.join(format!("{name}_val_000000.bin")), val)?;
    }
    let mut shards = 0;
    for (i, chunk) in train.chunks(a.shard_tokens).enumerate() {
        write(a.out.join(format!("{name}_train_{:06}.bin", i + 1)), chunk)?;
        shards += 1;
    }
    let tj = a.out.join(TOKENIZER_FILE);
    tok.save(&tj)?;
    eprintln!(
        "{total} tokens ({} validation, {} training in {shards} shards of uint{}), vocabulary {}; \
         tokenizer {} ({}, blake3 {})",
        val.len(),
        train.len(),
        width.bytes() * 8,
        tok.vocab_size(),
        tj.display(),
        tok.kind_name(),
        &tok.hash()[..16]
    );
    Ok(())
}

/// `duet train --out DIR`: the run's tokenizer (`train.tokenizer` of its config) saved as
/// DIR/tokenizer.json, where `duet generate` finds it next to the checkpoint. It must still be
/// the tokenizer the run recorded (a resumed run reads the path again).
pub(crate) fn copy_run_tokenizer(cfg: &duet_engine::Config, dir: &Path) -> CliResult<()> {
    let d = &cfg.train.data;
    if d.tokenizer.is_empty() {
        return Ok(());
    }
    let dst = dir.join(TOKENIZER_FILE);
    // Resuming in the run's own folder: the copy made at the start is the tokenizer.
    if let Ok(t) = Tokenizer::from_path(&dst)
        && t.hash() == d.tokenizer_hash
    {
        return Ok(());
    }
    let tok = Tokenizer::from_path(Path::new(&d.tokenizer))?;
    if tok.hash() != d.tokenizer_hash {
        return Err(format!(
            "the tokenizer {} changed since the run recorded it (blake3 {}, now {})",
            d.tokenizer,
            d.tokenizer_hash,
            tok.hash()
        )
        .into());
    }
    tok.save(&dst)?;
    Ok(())
}
