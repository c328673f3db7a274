//! What a new run takes without being told: the folder a run on data saves into, the context
//! of the model it starts from (`--init-from`), and the tokenizer beside its shards.

mod common;

use common::{assert_success, duet, tmp};
use duet_tokenize::Tokenizer;
use std::path::Path;
use std::process::{Command, Output};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `duet args` run in the folder `dir`.
fn duet_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(args)
        .current_dir(dir)
        .env_remove("DUET_BACKEND")
        .output()
        .expect("runs duet")
}

/// Fails unless the run failed with exit status 1 and a one-line error, its last line, naming
/// every needle.
fn assert_refused(out: &Output, needles: &[&str]) {
    let all = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let err = all.trim_end().lines().last().unwrap_or_default();
    assert!(err.starts_with("error: "), "{all}");
    assert_eq!(all.matches("error").count(), 1, "one error: {all}");
    for n in needles {
        assert!(err.contains(n), "'{n}' not in {err}");
    }
}

/// The configuration `--print-config` printed.
fn printed_config(out: &Output) -> duet_engine::Config {
    assert_success(out);
    let text = String::from_utf8_lossy(&out.stdout);
    let toml = text.split("# run settings").next().unwrap();
    duet_engine::Config::from_toml_exact(toml).unwrap()
}

fn corpus(dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("corpus.txt");
    std::fs::write(
        &p,
        "the quick brown fox jumps over the lazy dog. ".repeat(100),
    )
    .unwrap();
    p
}

/// The run folders under `dir/runs`, sorted.
fn runs(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir.join("runs")) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A run on data without `--out` saves into runs/<date>-<time>/ and says so first; a second
/// run gets its own folder; the synthetic task still saves nothing.
#[test]
fn a_data_run_without_out_saves_into_runs() {
    let dir = tmp("default-runs");
    corpus(&dir);
    let args = [
        "train",
        "--preset",
        "tiny",
        "--data",
        "corpus.txt",
        "--steps",
        "2",
        "--log-every",
        "0",
    ];
    let first = duet_in(&dir, &args);
    assert_success(&first);
    let err = stderr(&first);
    let line = err
        .lines()
        .take(3)
        .find(|l| l.starts_with("saving this run into runs/"))
        .unwrap_or_else(|| panic!("not announced first: {err}"));
    let made = runs(&dir);
    assert_eq!(made.len(), 1, "{made:?}");
    let name = &made[0];
    assert!(line.contains(&format!("runs/{name}/")), "{line}");
    // YYYY-MM-DD-HHMMSS
    let shape: String = name
        .chars()
        .map(|c| if c.is_ascii_digit() { '9' } else { c })
        .collect();
    assert_eq!(shape, "9999-99-99-999999", "{name}");
    let run = dir.join("runs").join(name);
    for f in ["checkpoint.safetensors", "config.toml", "metrics.jsonl"] {
        assert!(run.join(f).is_file(), "{f} missing in {}", run.display());
    }
    assert!(
        String::from_utf8_lossy(&first.stdout).contains(&format!("runs/{name}")),
        "{}",
        String::from_utf8_lossy(&first.stdout)
    );
    // Another run (in the same second or not) gets another folder.
    assert_success(&duet_in(&dir, &args));
    let made = runs(&dir);
    assert_eq!(made.len(), 2, "{made:?}");
    assert!(made.iter().all(|r| {
        dir.join("runs")
            .join(r)
            .join("checkpoint.safetensors")
            .is_file()
    }));
    // It resumes like any --out folder.
    let run_s = format!("runs/{name}");
    let out = duet_in(
        &dir,
        &[
            "train",
            "--resume",
            &run_s,
            "--out",
            &run_s,
            "--steps",
            "3",
            "--log-every",
            "0",
        ],
    );
    assert_success(&out);
    assert_eq!(runs(&dir).len(), 2);
    // The synthetic task without --out saves nothing, as before.
    let synthetic = tmp("default-runs-synthetic");
    std::fs::create_dir_all(&synthetic).unwrap();
    let out = duet_in(
        &synthetic,
        &[
            "train",
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--log-every",
            "0",
        ],
    );
    assert_success(&out);
    assert!(!synthetic.join("runs").exists());
    assert!(
        !stderr(&out).contains("saving this run"),
        "{}",
        stderr(&out)
    );
}

/// `--init-from` takes the model's context from the file, and the sequence length with it.
#[test]
fn init_from_takes_the_context_of_the_file() {
    let dir = tmp("init-context");
    let corpus = corpus(&dir);
    // A model with a 96-token context (the default preset's is 64, its sequence 48).
    let src = dir.join("src");
    assert_success(&duet(&[
        "train",
        "--preset",
        "tiny",
        "--max-seq",
        "96",
        "--seq",
        "96",
        "--data",
        s(&corpus),
        "--steps",
        "1",
        "--stop-after",
        "0",
        "--out",
        s(&src),
    ]));
    let base = [
        "train",
        "--init-from",
        s(&src),
        "--data",
        s(&corpus),
        "--steps",
        "1",
    ];
    // No --seq: the file's context.
    let out = duet(&[&base[..], &["--print-config"]].concat());
    let cfg = printed_config(&out);
    assert_eq!((cfg.model.max_seq, cfg.train.data.seq), (96, 96));
    assert!(stderr(&out).contains("seq set to 96"), "{}", stderr(&out));
    // --seq up to the file's context, past the preset's max_seq.
    let cfg = printed_config(&duet(
        &[&base[..], &["--seq", "80", "--print-config"]].concat(),
    ));
    assert_eq!((cfg.model.max_seq, cfg.train.data.seq), (96, 80));
    // Past it: refused, naming --seq and the file's context.
    assert_refused(
        &duet(&[&base[..], &["--seq", "200"]].concat()),
        &["--seq 200", "96 positions", "src"],
    );
    // And it trains at the file's context.
    let run = dir.join("run");
    let out = duet(&[&base[..], &["--out", s(&run), "--log-every", "0"]].concat());
    assert_success(&out);
    let ck =
        duet_engine::checkpoint::Checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    assert_eq!(ck.config.train.data.seq, 96);
}

/// `train --data DIR` takes the tokenizer.json that `duet tokenize` wrote beside the shards,
/// and refuses another.
#[test]
fn a_run_takes_the_tokenizer_beside_its_shards() {
    let dir = tmp("shards-tokenizer");
    let text = dir.join("text");
    std::fs::create_dir_all(&text).unwrap();
    let readme = include_str!("../README.md");
    std::fs::write(text.join("a.txt"), readme).unwrap();
    std::fs::write(text.join("b.txt"), include_str!("../docs/user-guide.md")).unwrap();
    let shards = dir.join("shards");
    assert_success(&duet(&[
        "tokenize",
        s(&text),
        "--out",
        s(&shards),
        "--train-bpe",
        "300",
    ]));
    let tok = Tokenizer::from_path(&shards.join("tokenizer.json")).unwrap();
    let base = [
        "train",
        "--preset",
        "tiny",
        "--data",
        s(&shards),
        "--steps",
        "1",
        "--print-config",
    ];
    let out = duet(&base);
    let cfg = printed_config(&out);
    let beside = std::fs::canonicalize(shards.join("tokenizer.json")).unwrap();
    assert_eq!(cfg.train.data.tokenizer, s(&beside));
    assert_eq!(cfg.train.data.tokenizer_hash, tok.hash());
    assert!(cfg.model.vocab >= tok.vocab_size());
    assert!(
        stderr(&out).contains("beside the shards"),
        "{}",
        stderr(&out)
    );
    // The same tokenizer given: fine.
    let cfg = printed_config(&duet(&[&base[..], &["--tokenizer", s(&shards)]].concat()));
    assert_eq!(cfg.train.data.tokenizer_hash, tok.hash());
    // Another: refused, naming both and their hashes.
    let bytes = Tokenizer::bytes();
    assert_refused(
        &duet(&[&base[..], &["--tokenizer", "bytes"]].concat()),
        &[
            "--tokenizer bytes",
            &bytes.hash()[..16],
            s(&shards.join("tokenizer.json")),
            &tok.hash()[..16],
        ],
    );
}
