//! `duet tokenize --sft`: supervised fine-tuning records to SFT shards.
//!
//! Each non-blank line of a `.jsonl` input is one record ([`Record::parse`]): `{"prompt",
//! "completion"}` (the prompt's tokens, then the completion's and the end-of-text token, the
//! completion's learned) or `{"messages": [{"role", "content"}, …]}`, rendered with the chat
//! template (`--chat-template`, else the `tokenizer_config.json` beside `--tokenizer`) and its
//! assistant turns learned ([`encode_record`]). A bad line fails the run naming `FILE:LINE`.
//! Examples without a learned token are left out (with a count). The validation split is the
//! first `--val-docs` examples or the first `--val-fraction` of them (at least one), written as
//! `<name>_val_000000.bin`; the rest fill `<name>_train_000001.bin`, … of about
//! `--shard-tokens` tokens each (whole examples). The format: [`duet_tokenize::shard`].
//!
//! Without `--sft`, the inputs are SFT data when every one is a `.jsonl` file and the first
//! line of the first is a record.

use super::{FileId, TokenizeArgs, check_out, collect_files, file_id, read_doc, shard_name};
use crate::CliResult;
use duet_engine::dataset::at_path;
use duet_tokenize::chat::{ChatTemplate, Example, Record, TOKENIZER_CONFIG_FILE, encode_record};
use duet_tokenize::shard::write_sft_shard;
use duet_tokenize::{TOKENIZER_FILE, Tokenizer};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Whether `inputs` are SFT data without `--sft`: all `.jsonl` files, the first line of the
/// first a record.
pub(super) fn detected(inputs: &[PathBuf]) -> bool {
    let jsonl = |p: &PathBuf| p.is_file() && p.extension().is_some_and(|e| e == "jsonl");
    if !inputs.iter().all(jsonl) {
        return false;
    }
    let Ok(text) = read_doc(&inputs[0]) else {
        return false;
    };
    let first = text.lines().find(|l| !l.trim().is_empty());
    let is_record = first.is_some_and(|l| Record::parse(l, "").is_ok());
    if is_record {
        eprintln!(
            "note: {} holds SFT records (.jsonl, a prompt–completion or conversation a line): \
             writing SFT shards (--sft)",
            inputs[0].display()
        );
    }
    is_record
}

/// The chat template: `--chat-template`'s (an error now when it cannot be read), else the
/// `tokenizer_config.json` beside `--tokenizer`; Err: why there is none (said when a
/// conversation needs it).
fn template(a: &TokenizeArgs) -> CliResult<Result<ChatTemplate, String>> {
    if let Some(p) = &a.chat_template {
        return Ok(Ok(ChatTemplate::load(p)?));
    }
    let Some(tok) = &a.tokenizer else {
        return Ok(Err(
            "byte tokens have no chat template: give --chat-template".into(),
        ));
    };
    let dir = match tok.is_dir() {
        true => tok.as_path(),
        false => tok.parent().unwrap_or(Path::new(".")),
    };
    let file = dir.join(TOKENIZER_CONFIG_FILE);
    if !file.exists() {
        return Ok(Err(format!(
            "no {} beside the tokenizer: give --chat-template",
            file.display()
        )));
    }
    Ok(ChatTemplate::load(&file).map_err(|e| e.to_string()))
}

/// Every record of the inputs, encoded (in parallel), in order.
fn encode_all(
    tok: &Tokenizer,
    docs: &[super::Doc],
    template: &Result<ChatTemplate, String>,
) -> CliResult<Vec<Example>> {
    let mut records = Vec::new();
    for d in docs {
        let text = read_doc(&d.path)?;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let what = format!("{}:{}", d.path.display(), i + 1);
            let r = Record::parse(line, &what)?;
            records.push((what, r));
        }
    }
    if records.is_empty() {
        return Err("the inputs hold no records".into());
    }
    records
        .par_iter()
        .map(|(what, r)| -> CliResult<Example> {
            let t = match (r, template) {
                (Record::Messages(_), Err(why)) => {
                    return Err(
                        format!("{what}: a conversation needs a chat template: {why}").into(),
                    );
                }
                (_, t) => t.as_ref().ok(),
            };
            encode_record(tok, t, r).map_err(|e| format!("{what}: {e}").into())
        })
        .collect()
}

/// Writes `examples` as SFT shard `path`, saying so.
fn write(path: &Path, examples: &[&Example]) -> CliResult<()> {
    write_sft_shard(path, examples).map_err(|e| at_path(path, &e))?;
    let n: usize = examples.iter().map(|e| e.ids.len()).sum();
    let learned: usize = examples.iter().map(|e| e.targets()).sum();
    eprintln!(
        "wrote {} ({} examples, {learned} learned of {n} tokens)",
        path.display(),
        examples.len()
    );
    Ok(())
}

pub(super) fn run(a: &TokenizeArgs, given: Option<Tokenizer>) -> CliResult<()> {
    let docs = collect_files(&a.inputs, a.all_files, &["jsonl"])?;
    let mut inputs: HashMap<FileId, PathBuf> =
        docs.iter().map(|d| (d.id, d.path.clone())).collect();
    for p in a.tokenizer.iter().flat_map(|p| Tokenizer::files_of(p)) {
        if let Ok(m) = std::fs::metadata(&p) {
            inputs.insert(file_id(&m), p);
        }
    }
    let name = shard_name(a);
    let out = check_out(a, &name, &inputs)?;
    let template = template(a)?;
    let tok = given.unwrap_or_else(|| {
        eprintln!("note: byte tokens (no --tokenizer)");
        Tokenizer::bytes()
    });
    let mut examples = encode_all(&tok, &docs, &template)?;
    let all = examples.len();
    examples.retain(|e| e.targets() > 0);
    if examples.len() < all {
        eprintln!(
            "note: {} of {all} examples have no learned token (an empty completion or \
             assistant turn): left out",
            all - examples.len()
        );
    }
    let n = examples.len();
    let n_val = match a.val_docs {
        Some(k) => k,
        None if a.val_fraction > 0.0 => ((a.val_fraction * n as f64).round() as usize).max(1),
        None => 0,
    };
    if n_val >= n {
        return Err(format!(
            "{n} examples: too few to split off {n_val} for validation and train on the rest"
        )
        .into());
    }
    out.clear()?;
    std::fs::create_dir_all(&a.out).map_err(|e| at_path(&a.out, &e))?;
    let refs: Vec<&Example> = examples.iter().collect();
    if n_val > 0 {
        write(
            &a.out.join(format!("{name}_val_000000.bin")),
            &refs[..n_val],
        )?;
    }
    let mut shards = 0;
    let mut rest = &refs[n_val..];
    while !rest.is_empty() {
        // Whole examples, up to --shard-tokens tokens (at least one example).
        let (mut k, mut tokens) = (0, 0);
        while k < rest.len() && (k == 0 || tokens + rest[k].ids.len() <= a.shard_tokens) {
            tokens += rest[k].ids.len();
            k += 1;
        }
        shards += 1;
        let path = a.out.join(format!("{name}_train_{shards:06}.bin"));
        write(&path, &rest[..k])?;
        rest = &rest[k..];
    }
    let tj = a.out.join(TOKENIZER_FILE);
    tok.save(&tj)?;
    let total: usize = examples.iter().map(|e| e.ids.len()).sum();
    let learned: usize = examples.iter().map(|e| e.targets()).sum();
    eprintln!(
        "{n} examples ({n_val} validation, {} training in {shards} SFT shards): {learned} \
         learned tokens of {total}, vocabulary {}; tokenizer {} ({}, blake3 {})",
        n - n_val,
        tok.vocab_size(),
        tj.display(),
        tok.kind_name(),
        &tok.hash()[..16]
    );
    Ok(())
}
