//! `duet export --format hf`: the special tokens Hugging Face pipelines need, and a replacement
//! that fails midway leaving the folder as it was.

mod common;

use common::{assert_success, duet, tmp};
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn hf_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/engine/tests/fixtures/hf")
}

/// A run on BPE token shards with its tokenizer (`<|endoftext|>` is id 0), into `tmp(name)`.
fn bpe_run(name: &str) -> PathBuf {
    let text = "the quick brown fox jumps over the lazy dog; the dog sleeps. ".repeat(200);
    let tok = duet_tokenize::train_bpe([text.as_str()].into_iter(), 300).unwrap();
    assert_eq!(tok.eot(), Some(0));
    let dir = tmp(&format!("{name}-data"));
    std::fs::create_dir_all(&dir).unwrap();
    let shard = dir.join("t_train_000001.bin");
    let tokens = tok.encode(&text).unwrap();
    duet_tokenize::shard::write_shard(&shard, &tokens, duet_tokenize::shard::TokenWidth::U16)
        .unwrap();
    let tj = dir.join("bpe.json");
    tok.save(&tj).unwrap();
    let run = tmp(name);
    assert_success(&duet(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--log-every",
        "0",
        "--data",
        s(&shard),
        "--tokenizer",
        s(&tj),
        "--out",
        s(&run),
    ]));
    run
}

/// The exported config names the tokenizer's end-of-text token as bos, eos and pad, and the
/// tokenizer files name `<|endoftext|>` as its special tokens, so transformers' pipelines,
/// `generate` and `Trainer` take the folder as it is (they were null: the trained BPE names
/// `<|endoftext|>` but `eos_token_id` was left out).
#[test]
fn the_export_names_the_special_tokens() {
    let run = bpe_run("export-bpe");
    let dir = tmp("export-bpe-hf");
    let out = duet(&["export", s(&dir), "--checkpoint", s(&run)]);
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(
            "end-of-text token 0 (<|endoftext|>): bos_token_id, eos_token_id and pad_token_id"
        ),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let config = json(&dir.join("config.json"));
    for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
        assert_eq!(config[k], 0, "{k}: {config}");
    }
    let tc = json(&dir.join("tokenizer_config.json"));
    assert_eq!(tc["tokenizer_class"], "PreTrainedTokenizerFast");
    let map = json(&dir.join("special_tokens_map.json"));
    for k in ["bos_token", "eos_token", "pad_token", "unk_token"] {
        assert_eq!(tc[k], "<|endoftext|>", "{k}: {tc}");
        assert_eq!(map[k], "<|endoftext|>", "{k}: {map}");
    }
    // The tokenizer.json itself knows the token, as the id the config names.
    let tok = duet_tokenize::Tokenizer::from_path(&dir.join("tokenizer.json")).unwrap();
    assert_eq!(tok.eot(), Some(0));
    // nanoGPT's model args have no such fields.
    let nano = tmp("export-bpe-nano");
    assert_success(&duet(&[
        "export",
        s(&nano),
        "--format",
        "nanogpt",
        "--checkpoint",
        s(&run),
    ]));
    assert!(
        json(&nano.join("config.json"))
            .get("eos_token_id")
            .is_none()
    );
}

/// `--overwrite` whose weights cannot be written (a file-size limit here, as a full disk would
/// do after the small config.json) leaves the old config.json with the old weights, and no
/// temporary file; it used to leave the new config.json beside the old weights.
#[test]
fn a_failed_overwrite_keeps_the_old_export() {
    let dir = tmp("export-partial");
    assert_success(&duet(&[
        "export",
        s(&dir),
        "--checkpoint",
        s(&hf_fixture()),
    ]));
    let before: Vec<Vec<u8>> = ["config.json", "model.safetensors"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    let run = bpe_run("export-partial-run");
    // `ulimit -f 16`: 8 KiB (dash) or 16 KiB (bash) per file; the weights are larger.
    let out = std::process::Command::new("sh")
        .args(["-c", "ulimit -f 16 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_duet"))
        .args(["export", s(&dir), "--checkpoint", s(&run), "--overwrite"])
        .env_remove("DUET_BACKEND")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.safetensors") && err.contains("file too large"),
        "{err}"
    );
    for (f, old) in ["config.json", "model.safetensors"].iter().zip(&before) {
        assert!(std::fs::read(dir.join(f)).unwrap() == *old, "{f} changed");
    }
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["config.json", "model.safetensors"]);
    // Without the limit the same command replaces everything.
    assert_success(&duet(&[
        "export",
        s(&dir),
        "--checkpoint",
        s(&run),
        "--overwrite",
    ]));
    assert_eq!(json(&dir.join("config.json"))["eos_token_id"], 0);
}
