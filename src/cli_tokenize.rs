//! `duet tokenize`: text files to llm.c token shards.
//!
//! Every input file is one document; a file given twice (or through a folder and by name, or a
//! hard link) is one document. Folders are walked recursively in name order, taking the files
//! ending in .txt, .md, .rst or .py (`--all-files`: every file), skipping hidden files and
//! folders; a file named on the command line is always taken. Each document is encoded on its
//! own (in parallel) with the end-of-text token prepended, as llm.c's `fineweb.py` does (byte
//! tokens have none: documents are then concatenated as they are). The validation split is the
//! start of the token stream — the first `--val-docs` documents, or the first `--val-fraction`
//! of the tokens — written as `<name>_val_000000.bin`; the rest is cut into
//! `<name>_train_000001.bin`, `_000002`, … of `--shard-tokens` tokens each (llm.c's naming).
//! The tokenizer is saved as `tokenizer.json` next to the shards, so `--tokenizer DIR` of
//! `duet train` and `duet generate` finds it.
//!
//! `--out` is one data set: a folder that already holds shards (`*.bin`, what `duet train
//! --data DIR` reads) or a `tokenizer.json` is refused unless `--overwrite`, which removes them
//! once the corpus is encoded (only llm.c shards and the tokenizer are ever removed). No input —
//! a document or the `--tokenizer` file — is written over or removed.
//!
//! Documents are read as they are encoded; their tokens are held (4 bytes a token) until the
//! shards are written. The memory this takes (with the tokenizers crate's working memory for
//! the documents in flight, about 100 bytes a byte of text) is checked against what this
//! process may allocate before the corpus is read.
//!
//! Supervised fine-tuning data (`--sft`, or detected: every input a `.jsonl` file whose first
//! line is a prompt–completion or conversation record) is tokenized into SFT shards instead:
//! see [`sft`].

use crate::CliResult;
use clap::Args;
use duet_engine::dataset::{at_path, open_regular, read_regular};
use duet_tokenize::shard::{TokenWidth, is_shard_header, write_shard_parts};
use duet_tokenize::{TOKENIZER_FILE, Tokenizer, TrainProgress, train_bpe_with};
use rayon::prelude::*;
use std::collections::HashMap;
use std::io::{IsTerminal, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

mod sft;

/// The extensions a folder's files are taken by (without `--all-files`).
pub const TEXT_EXTENSIONS: [&str; 4] = ["txt", "md", "rst", "py"];

/// Documents sampled for the round-trip check and the tokens-per-byte estimate.
const SAMPLE_DOCS: usize = 16;
/// Bytes read from the start of each sampled document.
const SAMPLE_BYTES: u64 = 64 << 10;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// Text files or folders (walked recursively: .txt, .md, .rst and .py files, or every file
    /// with --all-files; hidden ones skipped). Each file is one document, taken once however
    /// often it is given.
    #[arg(required = true, value_name = "PATH")]
    inputs: Vec<PathBuf>,
    /// Folder for the shards and tokenizer.json (created if missing). One that already holds
    /// shards (*.bin) or a tokenizer.json is refused without --overwrite.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Replace the shards (*.bin) and tokenizer.json already in --out: they are removed once
    /// the corpus is encoded, so that no stale shard is left to train on.
    #[arg(long)]
    overwrite: bool,
    /// Tokenizer: a tokenizer.json, a folder with tokenizer.json or GPT-2's encoder.json +
    /// vocab.bpe (or vocab.json + merges.txt), or `bytes` [default: bytes unless --train-bpe].
    #[arg(long, value_name = "PATH", conflicts_with = "train_bpe")]
    tokenizer: Option<PathBuf>,
    /// Train a byte-level BPE tokenizer of at most VOCAB tokens (257 to 1048576) on the inputs
    /// instead (saved as tokenizer.json in --out).
    #[arg(long, value_name = "VOCAB")]
    train_bpe: Option<usize>,
    /// Shard name prefix, a file name (no path separators) [default: the first input's file
    /// or folder name].
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
    /// The inputs are supervised fine-tuning records, one JSON object a line:
    /// {"prompt", "completion"} or {"messages": [{"role", "content"}, …]} (folders give their
    /// .jsonl files); written as SFT shards of whole examples whose completion or assistant
    /// tokens are the targets [default: on when every input is a .jsonl file whose first line
    /// is such a record]. --val-fraction and --val-docs count examples.
    #[arg(long, conflicts_with = "train_bpe")]
    sft: bool,
    /// The chat template of conversations: a tokenizer_config.json (its `chat_template`) or a
    /// folder holding one [default: the tokenizer_config.json beside --tokenizer].
    #[arg(long, value_name = "PATH")]
    chat_template: Option<PathBuf>,
}

/// A file's identity: (device, inode).
type FileId = (u64, u64);

fn file_id(m: &std::fs::Metadata) -> FileId {
    (m.dev(), m.ino())
}

/// One input document.
struct Doc {
    path: PathBuf,
    len: u64,
    id: FileId,
}

/// The documents of `inputs`, in order, each file once (by identity: the same file given
/// twice, through a folder and by name, or through a hard link).
fn collect_files(inputs: &[PathBuf], all: bool, exts: &[&str]) -> CliResult<Vec<Doc>> {
    fn walk(dir: &Path, all: bool, exts: &[&str], out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let p = e.path();
            let ty = e.file_type()?;
            if ty.is_dir() {
                walk(&p, all, exts, out)?;
            } else if p.is_file()
                && (all
                    || p.extension()
                        .and_then(|x| x.to_str())
                        .is_some_and(|x| exts.contains(&x)))
            {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for i in inputs {
        match std::fs::metadata(i) {
            Ok(m) if m.is_dir() => walk(i, all, exts, &mut files).map_err(|e| at_path(i, &e))?,
            Ok(m) if m.is_file() => files.push(i.clone()),
            Ok(_) => {
                // open_regular names what the file is (a FIFO, a device) without opening it.
                let why = open_regular(i)
                    .err()
                    .map_or_else(|| "not a regular file".to_string(), |e| e.to_string());
                return Err(format!("{}: {why}", i.display()).into());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("{}: no such file or folder", i.display()).into());
            }
            Err(e) => return Err(at_path(i, &e).into()),
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut docs = Vec::new();
    let given = files.len();
    for path in files {
        let m = std::fs::metadata(&path).map_err(|e| at_path(&path, &e))?;
        let id = file_id(&m);
        if seen.insert(id) {
            docs.push(Doc {
                path,
                len: m.len(),
                id,
            });
        }
    }
    if docs.len() < given {
        eprintln!(
            "note: {} of the inputs' files are files already taken (given twice, through a \
             folder and by name, or hard links): each file is tokenized once",
            given - docs.len()
        );
    }
    if docs.is_empty() {
        return Err(format!(
            "no documents found (folders are searched for .{} files; --all-files takes every file)",
            exts.join(", .")
        )
        .into());
    }
    Ok(docs)
}

/// A document's text.
fn read_doc(p: &Path) -> Result<String, String> {
    let bytes = read_regular(p).map_err(|e| at_path(p, &e))?;
    String::from_utf8(bytes)
        .map_err(|_| format!("{}: not UTF-8 text (skip it, or convert it)", p.display()))
}

/// The first `limit` bytes of a document's text (cut at a character boundary).
fn read_prefix(p: &Path, limit: u64) -> CliResult<String> {
    let mut bytes = Vec::new();
    open_regular(p)
        .and_then(|f| f.take(limit).read_to_end(&mut bytes))
        .map_err(|e| at_path(p, &e))?;
    match std::str::from_utf8(&bytes) {
        Ok(s) => Ok(s.to_owned()),
        // A character cut by the limit.
        Err(e) if e.error_len().is_none() => {
            Ok(String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned())
        }
        Err(_) => Err(format!("{}: not UTF-8 text (skip it, or convert it)", p.display()).into()),
    }
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

/// The checks that need no file: flag values and the shard name.
fn check_args(a: &TokenizeArgs) -> CliResult<()> {
    if a.shard_tokens == 0 {
        return Err("--shard-tokens must be at least 1".into());
    }
    if !(0.0..1.0).contains(&a.val_fraction) {
        return Err("--val-fraction must be in [0, 1)".into());
    }
    if let Some(n) = &a.name
        && (n.is_empty() || n.contains(['/', '\\']))
    {
        return Err(format!(
            "--name {n:?}: the shard name prefix is a file name, without path separators (--out \
             picks the folder)"
        )
        .into());
    }
    if let Some(v) = a.train_bpe {
        duet_tokenize::check_train_vocab(v).map_err(|e| format!("--train-bpe: {e}"))?;
    }
    Ok(())
}

/// The shard name prefix: `--name`, else the first input's file or folder name.
fn shard_name(a: &TokenizeArgs) -> String {
    match &a.name {
        Some(n) => n.clone(),
        None => a.inputs[0]
            .canonicalize()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "data".into()),
    }
}

/// Whether this run writes a file named `file` in --out (its temporaries included).
fn is_output_name(file: &str, name: &str) -> bool {
    let f = file.strip_suffix(".tmp").unwrap_or(file);
    if f == TOKENIZER_FILE {
        return true;
    }
    let Some(rest) = f.strip_prefix(name).and_then(|r| r.strip_suffix(".bin")) else {
        return false;
    };
    let number = |n: &str| n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit());
    rest == "_val_000000" || rest.strip_prefix("_train_").is_some_and(number)
}

/// `--out` as this run found it: the files an `--overwrite` replaces.
struct OutFolder {
    replaced: Vec<PathBuf>,
}

fn list(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths
        .iter()
        .take(3)
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    match paths.len() {
        n if n > 3 => format!("{} and {} more", names.join(", "), n - 3),
        _ => names.join(", "),
    }
}

/// Checks `--out` before anything is read: no input is a file this run writes or replaces; a
/// folder holding shards (`*.bin`, what `duet train --data DIR` takes) or a tokenizer.json is
/// refused without `--overwrite`, and with it every such `.bin` must be an llm.c shard (nothing
/// else is removed).
fn check_out(
    a: &TokenizeArgs,
    name: &str,
    inputs: &HashMap<FileId, PathBuf>,
) -> CliResult<OutFolder> {
    let dir = &a.out;
    let shown = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("--out {shown} exists and is not a folder").into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(OutFolder {
                replaced: Vec::new(),
            });
        }
        Err(e) => {
            return Err(format!("--out {shown}: {}", duet_engine::dataset::io_message(&e)).into());
        }
    }
    let mut held = Vec::new();
    for e in std::fs::read_dir(dir)
        .map_err(|e| format!("--out {shown}: {}", duet_engine::dataset::io_message(&e)))?
    {
        let e =
            e.map_err(|e| format!("--out {shown}: {}", duet_engine::dataset::io_message(&e)))?;
        let (p, file) = (e.path(), e.file_name().to_string_lossy().into_owned());
        let meta = std::fs::metadata(&p).ok();
        let shard = file.ends_with(".bin") && meta.as_ref().is_some_and(|m| m.is_file());
        let tokenizer = file == TOKENIZER_FILE;
        let written = is_output_name(&file, name);
        if (shard || tokenizer || written)
            && let Some(input) = meta.as_ref().and_then(|m| inputs.get(&file_id(m)))
        {
            let also = match std::fs::canonicalize(input).ok() == std::fs::canonicalize(&p).ok() {
                true => String::new(),
                false => format!(" (as {})", input.display()),
            };
            return Err(format!(
                "{} is an input of this run{also} and this run would {} it: write the shards to \
                 another --out",
                p.display(),
                if written { "write over" } else { "remove" }
            )
            .into());
        }
        if shard || tokenizer {
            held.push(p);
        }
    }
    held.sort();
    if held.is_empty() {
        return Ok(OutFolder { replaced: held });
    }
    if !a.overwrite {
        return Err(format!(
            "--out {shown} already holds {}: `duet train --data {shown}` would mix them with \
             this run's shards; give --overwrite to replace them (they are removed), or another \
             --out",
            list(&held)
        )
        .into());
    }
    for p in &held {
        let is_tokenizer = p.file_name().is_some_and(|f| f == TOKENIZER_FILE);
        let mut header = Vec::new();
        let readable = open_regular(p)
            .and_then(|f| f.take(8).read_to_end(&mut header))
            .is_ok();
        if !readable || !(is_tokenizer || is_shard_header(&header)) {
            return Err(format!(
                "{} is not {}: --overwrite replaces only llm.c shards and tokenizer.json; move it \
                 out of {shown} (duet train reads every .bin file of a folder)",
                p.display(),
                if is_tokenizer {
                    "a file"
                } else {
                    "an llm.c shard"
                }
            )
            .into());
        }
    }
    Ok(OutFolder { replaced: held })
}

impl OutFolder {
    /// Removes the files `--overwrite` replaces.
    fn clear(&self) -> CliResult<()> {
        for p in &self.replaced {
            std::fs::remove_file(p).map_err(|e| at_path(p, &e))?;
        }
        if !self.replaced.is_empty() {
            eprintln!("--overwrite: removed {}", list(&self.replaced));
        }
        Ok(())
    }
}

/// Checks that this process may allocate `held` bytes and, for each of the largest documents
/// in flight at once (one a thread), its text and `per_doc(len)` bytes; `what` names the work.
fn check_memory(
    what: &str,
    docs: &[Doc],
    held: u64,
    per_doc: impl Fn(u64) -> u64,
) -> CliResult<()> {
    let mut lens: Vec<u64> = docs.iter().map(|d| d.len).collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    let in_flight = lens
        .iter()
        .take(rayon::current_num_threads())
        .map(|&l| l.saturating_add(per_doc(l)))
        .fold(0, u64::saturating_add);
    let total: u64 = lens.iter().sum();
    duet_engine::check_host_memory(held.saturating_add(in_flight), || {
        format!(
            "{what} ({} documents, {}; the largest {})",
            docs.len(),
            duet_device::human_bytes(total),
            duet_device::human_bytes(lens[0])
        )
    })
    .map_err(|e| {
        format!(
            "{e}. A token is held as 4 bytes until the shards are written, and the tokenizers \
             crate holds about 100 bytes a byte of each document it works on: tokenize the \
             corpus in parts, or split very large files into smaller documents"
        )
        .into()
    })
}

/// Trains the BPE of `--train-bpe` on the documents (read as the trainer takes them), showing
/// progress.
fn train_on(docs: &[Doc], vocab: usize, total_bytes: u64) -> CliResult<Tokenizer> {
    // The trainer's tables are sized by the vocabulary, at most 257 + the corpus's bytes.
    let table =
        duet_tokenize::train_memory(vocab.min(257usize.saturating_add(total_bytes as usize)));
    check_memory("training the tokenizer", docs, table, |l| {
        l.saturating_mul(80)
    })?;
    eprintln!("training a byte-level BPE tokenizer of at most {vocab} tokens");
    let t0 = std::time::Instant::now();
    let pb = progress(total_bytes, "training: reading words");
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let texts = docs.iter().map_while(|d| {
        let mut failed = failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_some() {
            return None;
        }
        read_doc(&d.path).map_err(|e| *failed = Some(e)).ok()
    });
    let spinner: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);
    let report = |p: TrainProgress| match (p, &pb) {
        (TrainProgress::Document { bytes }, Some(pb)) => pb.inc(bytes as u64),
        (TrainProgress::Document { .. }, None) => {}
        (TrainProgress::Merging, pb) => {
            if let Some(pb) = pb {
                pb.finish_and_clear();
                let s = indicatif::ProgressBar::new_spinner();
                s.set_message("training: computing merges");
                s.enable_steady_tick(std::time::Duration::from_millis(200));
                *spinner.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
            } else {
                eprintln!(
                    "training: read the words of {} in {:.1} s; computing merges",
                    duet_device::human_bytes(total_bytes),
                    t0.elapsed().as_secs_f64()
                );
            }
        }
    };
    let trained = train_bpe_with(texts, vocab, &report);
    if let Some(s) = spinner.into_inner().unwrap_or_else(|e| e.into_inner()) {
        s.finish_and_clear();
    }
    if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e.into());
    }
    let t = trained?;
    eprintln!(
        "trained: {} tokens in {:.1} s",
        t.vocab_size(),
        t0.elapsed().as_secs_f64()
    );
    Ok(t)
}

/// Encodes up to [`SAMPLE_DOCS`] documents spread over the corpus (the first [`SAMPLE_BYTES`]
/// of each) and decodes them again: a warning names the first whose text does not come back
/// (characters the vocabulary drops or replaces). Returns the samples' tokens per byte.
fn sample(tok: &Tokenizer, docs: &[Doc]) -> CliResult<f64> {
    let n = docs.len().min(SAMPLE_DOCS);
    let (mut bytes, mut tokens) = (0usize, 0usize);
    let mut lossy: Vec<(&Doc, String)> = Vec::new();
    for k in 0..n {
        let d = &docs[k * docs.len() / n];
        let text = read_prefix(&d.path, SAMPLE_BYTES)?;
        let rt = tok.round_trip(&text).map_err(|e| at_path(&d.path, &e))?;
        bytes += text.len();
        tokens += rt.tokens;
        if let Some(diff) = rt.difference {
            lossy.push((d, diff));
        }
    }
    if let Some((d, diff)) = lossy.first() {
        eprintln!(
            "warning: {} does not give back the text of {} of {n} sampled documents (compared \
             after its normalisation): in {}, {diff}. Characters outside its vocabulary are \
             dropped or replaced by its unknown token",
            tok.origin(),
            lossy.len(),
            d.path.display()
        );
    }
    Ok(if bytes == 0 {
        1.0
    } else {
        tokens as f64 / bytes as f64
    })
}

/// Reads and encodes every document (in parallel), each with the end-of-text token first.
fn encode_all(tok: &Tokenizer, docs: &[Doc], total_bytes: u64) -> CliResult<Vec<Vec<u32>>> {
    let pb = progress(total_bytes, "encoding");
    let encoded = docs
        .par_iter()
        .map(|d| -> CliResult<Vec<u32>> {
            let text = read_doc(&d.path)?;
            let mut ids = tok.encode(&text).map_err(|e| at_path(&d.path, &e))?;
            if let Some(eot) = tok.eot() {
                ids.insert(0, eot);
            }
            ids.shrink_to_fit();
            if let Some(pb) = &pb {
                pb.inc(text.len() as u64);
            }
            Ok(ids)
        })
        .collect::<CliResult<Vec<_>>>()?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    Ok(encoded)
}

/// Consecutive runs of the token stream held as one vector a document.
struct Cursor<'a> {
    docs: &'a [Vec<u32>],
    doc: usize,
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// The next `n` tokens (fewer at the end), as slices of the documents.
    fn take(&mut self, mut n: usize) -> Vec<&'a [u32]> {
        let mut parts = Vec::new();
        while n > 0 && self.doc < self.docs.len() {
            let d = &self.docs[self.doc];
            let k = (d.len() - self.pos).min(n);
            if k > 0 {
                parts.push(&d[self.pos..self.pos + k]);
            }
            self.pos += k;
            n -= k;
            if self.pos == d.len() {
                self.doc += 1;
                self.pos = 0;
            }
        }
        parts
    }
}

/// The tokens of the validation shard: the first `--val-docs` documents, or the first
/// `--val-fraction` of the tokens.
fn val_tokens(a: &TokenizeArgs, encoded: &[Vec<u32>], total: usize) -> CliResult<usize> {
    let val = match a.val_docs {
        Some(n) => encoded[..n].iter().map(Vec::len).sum(),
        None if a.val_fraction > 0.0 => ((a.val_fraction * total as f64).round() as usize).max(1),
        None => 0,
    };
    if val >= total {
        return Err(format!("{total} tokens: too few to split off a validation set").into());
    }
    Ok(val)
}

/// The tokenizer of `--tokenizer`, `--train-bpe` or byte tokens.
fn tokenizer_for(a: &TokenizeArgs, given: Option<Tokenizer>, docs: &[Doc]) -> CliResult<Tokenizer> {
    let total_bytes = docs.iter().map(|d| d.len).sum();
    Ok(match (given, a.train_bpe) {
        (Some(t), _) => t,
        (None, Some(v)) => train_on(docs, v, total_bytes)?,
        (None, None) => {
            eprintln!("note: byte tokens (no --tokenizer or --train-bpe)");
            Tokenizer::bytes()
        }
    })
}

pub fn run(a: &TokenizeArgs) -> CliResult<()> {
    check_args(a)?;
    // The tokenizer first: a bad path or file fails before the corpus is read.
    let given = match &a.tokenizer {
        Some(p) => {
            let t = Tokenizer::from_path(p)?;
            t.check_for_data()?;
            Some(t)
        }
        None => None,
    };
    if a.sft || sft::detected(&a.inputs) {
        return sft::run(a, given);
    }
    if a.chat_template.is_some() {
        return Err("--chat-template renders the conversations of SFT data (--sft)".into());
    }
    let docs = collect_files(&a.inputs, a.all_files, &TEXT_EXTENSIONS)?;
    if let Some(n) = a.val_docs
        && n >= docs.len()
    {
        return Err(format!(
            "--val-docs {n} leaves no training documents (there are {})",
            docs.len()
        )
        .into());
    }
    let mut inputs: HashMap<FileId, PathBuf> =
        docs.iter().map(|d| (d.id, d.path.clone())).collect();
    for p in a.tokenizer.iter().flat_map(|p| Tokenizer::files_of(p)) {
        if let Ok(m) = std::fs::metadata(&p) {
            inputs.insert(file_id(&m), p);
        }
    }
    let name = shard_name(a);
    let out = check_out(a, &name, &inputs)?;
    let total_bytes: u64 = docs.iter().map(|d| d.len).sum();
    eprintln!(
        "{} documents, {}",
        docs.len(),
        duet_device::human_bytes(total_bytes)
    );
    let tok = tokenizer_for(a, given, &docs)?;
    let width = TokenWidth::for_vocab(tok.vocab_size());
    if tok.eot().is_none() {
        eprintln!(
            "note: the tokenizer has no {} token: documents are concatenated without a separator",
            duet_tokenize::EOT_TEXT
        );
    }
    let per_byte = if tok.is_bytes() {
        1.0
    } else {
        sample(&tok, &docs)?
    };
    // The tokens held until the shards are written (4 bytes each, the estimate 10 % over the
    // samples'), and the tokenizers crate's working memory for the documents in flight.
    let tokens = |bytes: u64| (bytes as f64 * per_byte * 1.1) as u64 + 1;
    let held = tokens(total_bytes).saturating_mul(4);
    check_memory("encoding the corpus", &docs, held, |l| {
        tok.encode_memory(l, tokens(l))
    })?;
    let encoded = encode_all(&tok, &docs, total_bytes)?;
    let total: usize = encoded.iter().map(Vec::len).sum();
    let val = val_tokens(a, &encoded, total)?;
    out.clear()?;
    std::fs::create_dir_all(&a.out).map_err(|e| at_path(&a.out, &e))?;
    let write = |path: PathBuf, parts: &[&[u32]]| -> CliResult<()> {
        write_shard_parts(&path, parts, width).map_err(|e| at_path(&path, &e))?;
        let n: usize = parts.iter().map(|p| p.len()).sum();
        eprintln!("wrote {} ({n} tokens)", path.display());
        Ok(())
    };
    let mut cursor = Cursor {
        docs: &encoded,
        doc: 0,
        pos: 0,
    };
    if val > 0 {
        write(
            a.out.join(format!("{name}_val_000000.bin")),
            &cursor.take(val),
        )?;
    }
    let train = total - val;
    let shards = train.div_ceil(a.shard_tokens);
    for i in 0..shards {
        let path = a.out.join(format!("{name}_train_{:06}.bin", i + 1));
        write(path, &cursor.take(a.shard_tokens))?;
    }
    let tj = a.out.join(TOKENIZER_FILE);
    tok.save(&tj)?;
    eprintln!(
        "{total} tokens ({val} validation, {train} training in {shards} shards of uint{}), \
         vocabulary {}; tokenizer {} ({}, blake3 {})",
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
