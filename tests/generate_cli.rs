//! `duet generate` past the context, from Hugging Face folders, with top-p, several samples and
//! the end-of-text token; `duet train --sample-every`; `duet eval`.

mod common;

use common::{assert_success, duet, tmp};
use duet_cpu::CpuDevice;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::config::{Config, Preset};
use duet_engine::export::{self, ExportFormat};
use duet_engine::generate::{Generator, Sampling, WeightFormat};
use duet_engine::model::{init_weights, param_specs};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails with exit code 1 and an `error:` line holding `needle`, without a panic.
fn assert_error(args: &[&str], needle: &str) {
    let out = duet(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or("");
    assert!(line.contains(needle), "'{needle}' not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

fn hf_fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/engine/tests/fixtures/hf")
}

/// `n` words of a small vocabulary, in a fixed pseudo-random order.
fn corpus(n: usize) -> String {
    let words = "the quick brown fox jumps over a lazy dog and then runs far into the woods \
                 while small birds sing their songs"
        .split(' ')
        .collect::<Vec<_>>();
    let mut x = 12345u64;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            words[(x >> 33) as usize % words.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The flags of a small model trained briefly (context 32).
const SMALL: [&str; 20] = [
    "--preset",
    "tiny",
    "--log-every",
    "0",
    "--layers",
    "1",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--ffn",
    "128",
    "--seq",
    "32",
    "--max-seq",
    "32",
    "--batch",
    "8",
    "--lr",
    "1e-2",
];

/// A byte-token model trained on a text file into `tmp(name)`, with `extra` flags.
fn text_run(name: &str, steps: &str, extra: &[&str]) -> (PathBuf, Output) {
    let text = tmp(&format!("{name}.txt"));
    std::fs::write(&text, corpus(8000)).unwrap();
    let run = tmp(name);
    let mut args = vec![
        "train",
        "--data",
        s(&text),
        "--steps",
        steps,
        "--out",
        s(&run),
    ];
    args.extend(SMALL);
    args.extend(extra);
    let out = duet(&args);
    assert_success(&out);
    (run, out)
}

/// A byte-level BPE of 300 tokens trained on the corpus (`<|endoftext|>` is id 0).
fn bpe() -> duet_tokenize::Tokenizer {
    let text = corpus(4000);
    duet_tokenize::train_bpe([text.as_str()].into_iter(), 300).unwrap()
}

/// `generate --tokens` output: the prompt's ids and each sample's new ids.
fn labelled(out: &Output) -> (String, Vec<Vec<i32>>) {
    let text = stdout(out);
    let mut lines = text.lines();
    let prompt = lines
        .next()
        .and_then(|l| l.strip_prefix("prompt: "))
        .unwrap();
    let samples = lines
        .map(|l| {
            l.strip_prefix("new: ")
                .unwrap_or_else(|| panic!("not a `new: ` line: {text}"))
                .split(',')
                .filter(|x| !x.is_empty())
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect();
    (prompt.to_string(), samples)
}

fn ids(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

/// Past the context the window keeps `max_seq / 2` tokens and is re-filled in one batched pass:
/// the command's tokens are the engine's with that window, not those of the window of
/// `max_seq − 1` it kept before (one re-fill a token; see the engine's
/// `past_the_context_a_token_costs_one_pass_and_under_two_positions` for the count), and the
/// help says so.
#[test]
fn past_the_context_the_window_keeps_half_of_it() {
    let (run, _) = text_run("slide", "40", &[]);
    let ck = Checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    let prompt: Vec<i32> = b"the quick brown fox".iter().map(|&b| b as i32).collect();
    let n = 150;
    let out = duet(&[
        "generate",
        "--checkpoint",
        s(&run),
        "--tokens",
        &ids(&prompt),
        "--temperature",
        "1",
        "--top-k",
        "0",
        "--seed",
        "3",
        "--max-new",
        &n.to_string(),
    ]);
    assert_success(&out);
    let (_, samples) = labelled(&out);
    let sampling = Sampling {
        temperature: 1.0,
        seed: 3,
        ..Sampling::default()
    };
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let engine = |keep: Option<usize>| {
        let m = &ck.config.model;
        let mut g =
            Generator::from_weights(dev.clone(), m, &ck.weights, WeightFormat::F32).unwrap();
        if let Some(k) = keep {
            g.set_keep(k).unwrap();
        }
        g.generate_sliding(&prompt, n, &sampling).unwrap()
    };
    assert_eq!(samples, [engine(None)]);
    assert_ne!(
        samples[0],
        engine(Some(31)),
        "the old window gives the same tokens: this test cannot tell them apart"
    );
    let help = stdout(&duet(&["generate", "--help"]));
    assert!(help.contains("last max_seq / 2 tokens"), "{help}");
}

/// A Hugging Face GPT-2 folder generates as transformers does (its greedy continuations of the
/// fixture's prompts), and a text prompt without a tokenizer is refused.
#[test]
fn generates_from_a_hugging_face_folder() {
    let fx = hf_fixture();
    let bytes = std::fs::read(fx.join("reference.safetensors")).unwrap();
    let r = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let i32s = |name: &str| -> Vec<i32> {
        r.tensor(name)
            .unwrap()
            .data()
            .chunks(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    for i in 0..2 {
        let (prompt, want) = (i32s(&format!("prompt.{i}")), i32s(&format!("greedy.{i}")));
        let out = duet(&[
            "generate",
            "--checkpoint",
            s(&fx),
            "--tokens",
            &ids(&prompt),
            "--max-new",
            &want.len().to_string(),
            "--temperature",
            "0",
            "--stop-at-context",
        ]);
        assert_success(&out);
        assert_eq!(labelled(&out).1, [want], "prompt {prompt:?}");
    }
    // Sampling (the default for a model trained on data) and past its context of 16.
    let out = duet(&[
        "generate",
        "--checkpoint",
        s(&fx.join("model.safetensors")),
        "--tokens",
        "1,2,3",
        "--max-new",
        "40",
    ]);
    assert_success(&out);
    assert_eq!(labelled(&out).1[0].len(), 40);
    assert_error(
        &["generate", "--checkpoint", s(&fx), "--prompt", "hi"],
        "this model's tokens are not bytes (a Hugging Face GPT-2 model with no tokenizer beside it)",
    );
}

/// A model whose every prediction is token 0 (`<|endoftext|>` of the BPE), in a Hugging Face
/// folder: the final LayerNorm's output is its bias whatever the input, a multiple of token 0's
/// embedding.
fn eos_model(dir: &Path, tok: Option<&duet_tokenize::Tokenizer>, eos_in_config: bool) {
    let cfg = duet_engine::ModelConfig {
        vocab: 300,
        max_seq: 16,
        ..Config::preset(Preset::Tiny).model
    };
    let mut w = init_weights(&cfg, 1);
    let np = param_specs(&cfg).len();
    let c = cfg.d_model;
    w[0][..c].iter_mut().for_each(|x| *x = 1.0);
    w[np - 2].iter_mut().for_each(|x| *x = 0.0);
    w[np - 1].iter_mut().for_each(|x| *x = 10.0);
    let config = export::hf_config_json_with(&cfg, eos_in_config.then_some(0));
    let files = [
        ("config.json".to_string(), config.into_bytes()),
        (
            "model.safetensors".to_string(),
            export::weights_bytes(&cfg, &w, ExportFormat::HuggingFace).unwrap(),
        ),
    ];
    export::write_all_or_nothing(dir, &files).unwrap();
    if let Some(t) = tok {
        t.save(&dir.join("tokenizer.json")).unwrap();
    }
}

/// A sample ends with the end-of-text token (the tokenizer's, else the config's
/// eos_token_id), which the text leaves out; --ignore-eos goes on.
#[test]
fn a_sample_ends_at_the_end_of_text_token() {
    let tok = bpe();
    assert_eq!(tok.eot(), Some(0));
    let dir = tmp("eos-model");
    eos_model(&dir, Some(&tok), false);
    let generate = |extra: &[&str]| {
        let out = duet(
            &[
                &["generate", "--checkpoint", s(&dir), "--max-new", "10"],
                extra,
            ]
            .concat(),
        );
        assert_success(&out);
        out
    };
    let out = generate(&["--prompt", "the quick", "--temperature", "0"]);
    assert_eq!(stdout(&out), "the quick\n");
    assert!(
        stderr(&out).contains("stopped at the end-of-text token 0 after 1 new tokens"),
        "{}",
        stderr(&out)
    );
    let out = generate(&["--tokens", "5,6"]);
    assert_eq!(labelled(&out).1, [vec![0]]);
    let out = generate(&["--tokens", "5,6", "--ignore-eos"]);
    assert_eq!(labelled(&out).1, [vec![0; 10]]);
    // No tokenizer: the config.json's eos_token_id.
    let bare = tmp("eos-model-bare");
    eos_model(&bare, None, true);
    let out = duet(&["generate", "--checkpoint", s(&bare), "--tokens", "5,6"]);
    assert_success(&out);
    assert_eq!(labelled(&out).1, [vec![0]]);
}

/// --top-p and --num-samples: sample i is the single sample of seed --seed + i; greedy settings
/// that would make them meaningless are refused.
#[test]
fn top_p_and_several_samples() {
    let (run, _) = text_run("samples", "20", &[]);
    let base = [
        "generate",
        "--checkpoint",
        s(&run),
        "--tokens",
        "116,104,101,32",
        "--max-new",
        "20",
        "--temperature",
        "1.5",
        "--top-p",
        "0.9",
    ];
    let with = |extra: &[&str]| {
        let out = duet(&[&base[..], extra].concat());
        assert_success(&out);
        labelled(&out).1
    };
    let three = with(&["--num-samples", "3", "--seed", "7"]);
    assert_eq!(three.len(), 3);
    for (i, sample) in three.iter().enumerate() {
        assert_eq!(sample.len(), 20);
        let single = with(&["--seed", &(7 + i).to_string()]);
        assert_eq!(single.len(), 1);
        assert_eq!(*sample, single[0], "{i}");
    }
    assert!(three[0] != three[1] || three[1] != three[2], "{three:?}");
    // Text: one line of dashes between two samples.
    let out = duet(&[
        "generate",
        "--checkpoint",
        s(&run),
        "--prompt",
        "the",
        "--num-samples",
        "2",
        "--max-new",
        "5",
    ]);
    assert_success(&out);
    assert_eq!(stdout(&out).matches("\n---------------\n").count(), 1);
    let run_s = s(&run);
    let g = ["generate", "--checkpoint", run_s, "--tokens", "1"];
    for p in ["0", "1.5", "NaN"] {
        assert_error(
            &[&g[..], &["--top-p", p]].concat(),
            "--top-p must be in (0, 1]",
        );
    }
    assert_error(
        &[&g[..], &["--top-p", "0.5", "--temperature", "0"]].concat(),
        "--top-p samples among the most likely tokens, which needs --temperature > 0",
    );
    assert_error(
        &[&g[..], &["--num-samples", "2", "--temperature", "0"]].concat(),
        "--num-samples 2 draws different samples, which needs --temperature > 0",
    );
    assert_error(
        &[&g[..], &["--num-samples", "0"]].concat(),
        "--num-samples must be at least 1",
    );
}

/// `--sample-every N` prints a sample every N steps (after the end-of-text token with a
/// tokenizer, else after a newline), without changing a number of the run; a run whose tokens
/// are not text is refused.
#[test]
fn training_prints_samples_every_n_steps() {
    let tok = bpe();
    let dir = tmp("sample-shards");
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = tok.encode(&corpus(6000)).unwrap();
    let shard = dir.join("c_train_000001.bin");
    duet_tokenize::shard::write_shard(&shard, &tokens, duet_tokenize::shard::TokenWidth::U16)
        .unwrap();
    let tj = dir.join("bpe.json");
    tok.save(&tj).unwrap();
    let run = tmp("sample-run");
    let mut args = vec![
        "train",
        "--data",
        s(&shard),
        "--tokenizer",
        s(&tj),
        "--steps",
        "4",
        "--sample-every",
        "2",
        "--out",
        s(&run),
    ];
    args.extend(SMALL);
    let out = duet(&args);
    assert_success(&out);
    let text = stdout(&out);
    assert!(
        text.contains("sample at step 2:\n") && text.contains("sample at step 4:\n"),
        "{text}"
    );
    assert!(!text.contains("sample at step 1:") && !text.contains("sample at step 3:"));

    // Byte tokens; the same losses as without samples.
    let losses = |run: &Path| -> Vec<String> {
        std::fs::read_to_string(run.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].to_string())
            .collect()
    };
    let (a, out) = text_run("sampled", "6", &["--sample-every", "3"]);
    assert_eq!(stdout(&out).matches("sample at step").count(), 2);
    let (b, _) = text_run("unsampled", "6", &[]);
    assert_eq!(losses(&a), losses(&b));
    assert_error(
        &[
            "train",
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--sample-every",
            "1",
        ],
        "--sample-every: the synthetic task has no text to sample",
    );
}

/// `duet eval` gives a run's validation loss on its validation data (the same windows: as many
/// batches as the run's --val-batches) and the loss over the whole data set by default, with its
/// perplexity; a Hugging Face folder evaluates too; data the model cannot read is refused.
#[test]
fn eval_reports_loss_and_perplexity() {
    let val = tmp("eval-val.txt");
    std::fs::write(&val, corpus(3000)).unwrap();
    let (run, _) = text_run(
        "eval-run",
        "6",
        &["--val-data", s(&val), "--val-every", "6"],
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    let val_loss = last["val_loss"].as_f64().unwrap();
    let eval = |extra: &[&str]| -> (f64, f64, String) {
        let out = duet(&[&["eval", "--checkpoint", s(&run), "--data", s(&val)], extra].concat());
        assert_success(&out);
        let line = stdout(&out);
        let num = |key: &str| -> f64 {
            let rest = &line[line.find(key).unwrap() + key.len()..];
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        (num("loss "), num("perplexity "), line)
    };
    let (loss, ppl, line) = eval(&["--max-batches", "8"]);
    assert!((loss - val_loss).abs() < 1e-5, "{line} against {val_loss}");
    assert!((ppl - loss.exp()).abs() < 1e-3 * ppl, "{line}");
    assert!(line.contains("8 batches of 8 × 32 tokens"), "{line}");
    let (all, _, line) = eval(&[]);
    // Every window of 32 tokens once (the last batch's rows spread over the rest).
    let windows = (std::fs::metadata(&val).unwrap().len() as usize - 1) / 32;
    let batches = format!("| {} batches of 8 × 32 tokens", windows.div_ceil(8));
    assert!(line.contains(&batches), "{line}: not {batches}");
    assert!(all.is_finite() && (all - loss).abs() < 0.5, "{line}");

    // A Hugging Face folder on token ids it knows (nanoGPT's headerless uint16).
    let ids = tmp("eval-ids.bin");
    let bytes: Vec<u8> = (0..2000u16)
        .flat_map(|i| ((i * 7 + 3) % 96).to_le_bytes())
        .collect();
    std::fs::write(&ids, bytes).unwrap();
    let fx = hf_fixture();
    let out = duet(&[
        "eval",
        "--checkpoint",
        s(&fx),
        "--data",
        s(&ids),
        "--data-format",
        "nanogpt",
    ]);
    assert_success(&out);
    assert!(
        stdout(&out).contains("batches of 8 × 16 tokens"),
        "{}",
        stdout(&out)
    );
    assert_error(
        &["eval", "--checkpoint", s(&fx), "--data", s(&val)],
        "the model's vocabulary is 96",
    );
    assert_error(
        &[
            "eval",
            "--checkpoint",
            s(&fx),
            "--data",
            s(&ids),
            "--seq",
            "17",
        ],
        "--seq 17 exceeds the model's context (max_seq 16)",
    );
    assert_error(
        &[
            "eval",
            "--checkpoint",
            s(&run),
            "--data",
            "/nonexistent/val.bin",
        ],
        "/nonexistent/val.bin",
    );
}
