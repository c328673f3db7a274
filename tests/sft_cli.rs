//! Supervised fine-tuning data through the command line: `duet tokenize` of a JSONL of
//! prompt–completion pairs and conversations (a ChatML template from a tokenizer_config.json)
//! into SFT shards whose learned tokens are the completions and assistant turns, then `duet
//! train` on them: the loss falls, a resumed run continues with the same bits, `--no-truncate`
//! refuses long examples, and bad lines name their file and line.

mod common;

use common::{assert_success, duet, tmp};
use duet_tokenize::shard::parse_sft_shard;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A small repetitive chat set: `dir/chat.jsonl` (40 records, conversations and prompt–
/// completion pairs alternating) and `dir/tokenizer_config.json` with a ChatML template.
fn chat_set(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = serde_json::json!({ "chat_template": CHATML, "eos_token": "<|im_end|>" });
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let mut lines = String::new();
    for i in 0..40 {
        let (a, b) = (i % 7, i % 5);
        let rec = if i % 2 == 0 {
            serde_json::json!({ "messages": [
                { "role": "user", "content": format!("add {a} {b}") },
                { "role": "assistant", "content": format!("{}", a + b) },
            ]})
        } else {
            serde_json::json!({ "prompt": format!("sum {a}+{b}="), "completion": format!("{}.", a + b) })
        };
        lines.push_str(&rec.to_string());
        lines.push('\n');
    }
    let p = dir.join("chat.jsonl");
    std::fs::write(&p, lines).unwrap();
    p
}

fn tokenize(dir: &Path, out: &Path) -> String {
    let r = duet(&[
        "tokenize",
        s(&dir.join("chat.jsonl")),
        "--chat-template",
        s(&dir.join("tokenizer_config.json")),
        "--out",
        s(out),
    ]);
    assert_success(&r);
    String::from_utf8_lossy(&r.stderr).into_owned()
}

/// The learned tokens of an example, as text (byte tokens).
fn learned_text(e: &duet_tokenize::chat::Example) -> String {
    let b: Vec<u8> = e
        .ids
        .iter()
        .zip(&e.target)
        .filter(|(_, t)| **t)
        .map(|(&i, _)| i as u8)
        .collect();
    String::from_utf8(b).unwrap()
}

#[test]
fn tokenize_writes_sft_shards_with_the_answers_learned() {
    let dir = tmp("sft-tok");
    chat_set(&dir);
    let out = dir.join("out");
    let err = tokenize(&dir, &out);
    assert!(
        err.contains("40 examples (4 validation, 36 training in 1 SFT shards)"),
        "{err}"
    );
    let val = parse_sft_shard(&std::fs::read(out.join("chat_val_000000.bin")).unwrap()).unwrap();
    let train =
        parse_sft_shard(&std::fs::read(out.join("chat_train_000001.bin")).unwrap()).unwrap();
    assert_eq!((val.len(), train.len()), (4, 36));
    // Record 0 (a conversation): the assistant's turn; record 1: the completion.
    assert_eq!(learned_text(&val[0]), "0<|im_end|>\n");
    assert_eq!(
        String::from_utf8(val[0].ids.iter().map(|&i| i as u8).collect()).unwrap(),
        "<|im_start|>user\nadd 0 0<|im_end|>\n<|im_start|>assistant\n0<|im_end|>\n"
    );
    assert_eq!(learned_text(&val[1]), "2.");
    assert!(out.join("tokenizer.json").is_file());

    // A conversation without a template, and a bad line, name the file and line.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": \"a\", \"completion\": \"b\"}\n[1]\n").unwrap();
    let r = duet(&["tokenize", s(&bad), "--out", s(&dir.join("o2"))]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && e.contains("bad.jsonl:2"), "{e}");
    let r = duet(&[
        "tokenize",
        "--sft",
        s(&dir.join("chat.jsonl")),
        "--out",
        s(&dir.join("o3")),
    ]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && e.contains("chat.jsonl:1") && e.contains("chat template"),
        "{e}"
    );
}

fn train(data: &Path, out: &Path, steps: &str, seq: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "train",
        "--preset",
        "tiny",
        "--backend",
        "cpu",
        "--data",
        s(data),
        "--seq",
        seq,
        "--max-seq",
        "128",
        "--lr",
        "0.01",
        "--warmup",
        "2",
        "--steps",
        steps,
        "--log-every",
        "0",
        "--out",
        s(out),
    ];
    args.extend(extra);
    duet(&args)
}

fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss").and_then(|x| x.as_f64()))
        .collect()
}

#[test]
fn training_on_sft_shards_learns_and_resumes_exactly() {
    let dir = tmp("sft-train");
    chat_set(&dir);
    let data = dir.join("out");
    tokenize(&dir, &data);
    let run = dir.join("run");
    let r = train(&data, &run, "30", "96", &[]);
    assert_success(&r);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("SFT data: 36 training examples"), "{err}");
    let l = losses(&run);
    assert_eq!(l.len(), 30);
    assert!(l.iter().all(|x| x.is_finite()), "{l:?}");
    let head: f64 = l[..5].iter().sum::<f64>() / 5.0;
    let tail: f64 = l[25..].iter().sum::<f64>() / 5.0;
    assert!(tail < head * 0.8, "the loss does not fall: {l:?}");

    // 10 steps, then a resume to 30: the same weights as the straight run.
    let part = dir.join("part");
    assert_success(&train(&data, &part, "30", "96", &["--stop-after", "10"]));
    let r = duet(&[
        "train",
        "--resume",
        s(&part),
        "--out",
        s(&part),
        "--steps",
        "30",
        "--log-every",
        "0",
    ]);
    assert_success(&r);
    let load = |p: &Path| {
        duet_engine::checkpoint::Checkpoint::load(&p.join("checkpoint.safetensors"))
            .unwrap()
            .weights
    };
    assert!(load(&part) == load(&run), "the resumed run differs");

    // Examples longer than --seq + 1: cut with a note, or refused with --no-truncate.
    let short = dir.join("short");
    let r = train(&data, &short, "1", "48", &[]);
    assert_success(&r);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("are longer than --seq 48 + 1 tokens"), "{err}");
    let r = train(&data, &dir.join("short2"), "1", "48", &["--no-truncate"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("--no-truncate") && err.contains("chat_"),
        "{err}"
    );
}
