//! `duet tokenize` end to end, and a run that records its tokenizer and generates text with it.

mod common;

use common::{assert_success, duet, tmp};
use duet_tokenize::Tokenizer;
use duet_tokenize::shard::{TokenWidth, parse_shard};
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The corpus: the README's and the user guide's paragraphs as documents in a folder tree, with
/// files that are not taken (another extension, hidden).
fn corpus(name: &str) -> (std::path::PathBuf, Vec<String>) {
    let dir = tmp(name);
    let readme = concat!(
        include_str!("../README.md"),
        "\n\n",
        include_str!("../docs/user-guide.md")
    );
    let half = (readme.len() / 2..)
        .find(|&i| readme.is_char_boundary(i))
        .unwrap();
    let cut = readme[half..].find("\n\n").map_or(half, |i| half + i);
    let docs = vec![
        "A first, short document.\n".to_string(),
        readme[..cut].to_string(),
        readme[cut..].to_string(),
    ];
    std::fs::create_dir_all(dir.join("b/c")).unwrap();
    std::fs::write(dir.join("a.txt"), &docs[0]).unwrap();
    std::fs::write(dir.join("b/c/x.md"), &docs[1]).unwrap();
    std::fs::write(dir.join("b/y.rst"), &docs[2]).unwrap();
    std::fs::write(dir.join("b/skip.bin"), b"\xff\xfe not text").unwrap();
    std::fs::write(dir.join(".hidden.txt"), "hidden").unwrap();
    (dir, docs)
}

#[test]
fn tokenize_trains_a_bpe_and_writes_llmc_shards() {
    let (input, docs) = corpus("corpus");
    let out = tmp("shards");
    let run = duet(&[
        "tokenize",
        s(&input),
        "--out",
        s(&out),
        "--train-bpe",
        "400",
        "--shard-tokens",
        "3000",
        "--val-docs",
        "1",
        "--name",
        "readme",
    ]);
    assert_success(&run);
    let tok = Tokenizer::from_path(&out.join("tokenizer.json")).unwrap();
    assert!(tok.vocab_size() <= 400 && tok.vocab_size() > 300);
    let eot = tok.eot().expect("an end-of-text token");
    // Documents in name order (a.txt, b/c/x.md, b/y.rst), each after the end-of-text token.
    let expect: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| [vec![eot], tok.encode(d).unwrap()].concat())
        .collect();
    let read = |name: &str| {
        let bytes = std::fs::read(out.join(name)).unwrap();
        // The engine's reader takes the uint16 shards.
        let tokens = duet_engine::dataset::parse_llmc_shard(Path::new(name), &bytes).unwrap();
        assert_eq!(
            parse_shard(&bytes).unwrap(),
            (TokenWidth::U16, tokens.clone())
        );
        tokens
    };
    assert_eq!(read("readme_val_000000.bin"), expect[0]);
    let train_tokens = expect[1].len() + expect[2].len();
    let shards = train_tokens.div_ceil(3000);
    assert!(shards >= 2, "{train_tokens} tokens");
    let mut train = Vec::new();
    for i in 1..=shards {
        let t = read(&format!("readme_train_{i:06}.bin"));
        assert!(t.len() == 3000 || i == shards);
        train.extend(t);
    }
    assert!(
        !out.join(format!("readme_train_{:06}.bin", shards + 1))
            .exists()
    );
    assert_eq!(train, [&expect[1][..], &expect[2][..]].concat());
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), shards + 2, "{names:?}");

    // The given tokenizer again, a validation fraction, all files: the non-UTF-8 file fails.
    let out2 = tmp("shards2");
    let args = [
        "tokenize",
        s(&input),
        "--out",
        s(&out2),
        "--tokenizer",
        s(&out),
        "--val-fraction",
        "0.25",
    ];
    assert_success(&duet(&args));
    let val = read_any(&out2.join("corpus_val_000000.bin"));
    let train = read_any(&out2.join("corpus_train_000001.bin"));
    let all: Vec<u32> = expect.concat();
    assert_eq!(val.len(), (all.len() as f64 * 0.25).round() as usize);
    assert_eq!([val, train].concat(), all);
    // (Into the same folder: --overwrite; a run that fails removes nothing.)
    let bad = duet(&[&args[..], &["--all-files", "--overwrite"]].concat());
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("skip.bin: not UTF-8 text"),
        "{}",
        stderr(&bad)
    );
    assert!(out2.join("corpus_train_000001.bin").exists() && out2.join("tokenizer.json").exists());
    // Byte tokens by default: no separator, the text's bytes.
    let out3 = tmp("shards3");
    assert_success(&duet(&[
        "tokenize",
        s(&input.join("a.txt")),
        "--out",
        s(&out3),
        "--val-fraction",
        "0",
    ]));
    assert_eq!(
        read_any(&out3.join("a_train_000001.bin")),
        docs[0].bytes().map(u32::from).collect::<Vec<_>>()
    );
    assert!(!out3.join("a_val_000000.bin").exists());
}

fn read_any(p: &Path) -> Vec<u32> {
    parse_shard(&std::fs::read(p).unwrap()).unwrap().1
}

/// The metadata of a safetensors file.
fn metadata(path: &Path) -> serde_json::Map<String, serde_json::Value> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].as_object().unwrap().clone()
}

#[test]
fn a_run_records_its_tokenizer_and_generates_text_with_it() {
    let (input, _) = corpus("corpus-run");
    let shards = tmp("run-shards");
    assert_success(&duet(&[
        "tokenize",
        s(&input),
        "--out",
        s(&shards),
        "--train-bpe",
        "300",
        "--val-docs",
        "1",
        "--name",
        "d",
    ]));
    let tok = Tokenizer::from_path(&shards).unwrap();
    let run = tmp("run-tok");
    let data = shards.join("d_train_000001.bin");
    let train = |extra: &[&str], out: &Path| {
        duet(
            &[
                &[
                    "train",
                    "--preset",
                    "tiny",
                    "--log-every",
                    "0",
                    "--steps",
                    "3",
                    "--seq",
                    "32",
                    "--max-seq",
                    "32",
                    "--data",
                    s(&data),
                    "--out",
                    s(out),
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let out = train(&["--tokenizer", s(&shards)], &run);
    assert_success(&out);
    // The vocabulary covers the tokenizer (raised from the shard's largest id + 1).
    assert!(
        stderr(&out).contains(&format!("vocab set to {}", tok.vocab_size())),
        "{}",
        stderr(&out)
    );
    let copy = Tokenizer::from_path(&run.join("tokenizer.json")).unwrap();
    assert_eq!(copy.hash(), tok.hash());
    let meta = metadata(&run.join("checkpoint.safetensors"));
    assert_eq!(meta["tokenizer_hash"], tok.hash());
    let cfg = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        cfg.contains(&format!("tokenizer_hash = \"{}\"", tok.hash())),
        "{cfg}"
    );

    // Text in, text out (sampled by default; the prompt's text comes back first), past the
    // 32-token context.
    let prompt = "The engine trains";
    let gen_args = ["generate", "--checkpoint", s(&run), "--prompt", prompt];
    let out = duet(&[&gen_args[..], &["--max-new", "40"]].concat());
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with(prompt), "{text}");
    assert!(!stderr(&out).contains("stopped after"), "{}", stderr(&out));
    // Ids, labelled: the prompt's are the tokenizer's.
    let ids: Vec<String> = tok
        .encode(prompt)
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let out = duet(&[
        "generate",
        "--checkpoint",
        s(&run),
        "--tokens",
        &ids.join(","),
        "--max-new",
        "3",
    ]);
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("prompt: {}\nnew: ", ids.join(","))),
        "{stdout}"
    );
    // Greedy decoding by the flag is reproducible.
    let greedy = |_: ()| {
        let out = duet(&[&gen_args[..], &["--temperature", "0", "--max-new", "8"]].concat());
        assert_success(&out);
        out.stdout
    };
    assert_eq!(greedy(()), greedy(()));

    // Another tokenizer next to the checkpoint is refused; --tokenizer overrides with a warning.
    let other = train_other_tokenizer(&input);
    std::fs::copy(other.join("tokenizer.json"), run.join("tokenizer.json")).unwrap();
    let out = duet(&gen_args);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not the tokenizer the model was trained with"),
        "{}",
        stderr(&out)
    );
    let out = duet(&[&gen_args[..], &["--tokenizer", s(&shards)]].concat());
    assert_success(&out);
    // Without it, the run's tokenizer is asked for.
    std::fs::remove_file(run.join("tokenizer.json")).unwrap();
    let out = duet(&gen_args);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("give it with --tokenizer"),
        "{}",
        stderr(&out)
    );

    // A tokenizer with text data is refused (the text would be read as bytes); so is a --vocab
    // that does not cover it.
    let txt = input.join("b/y.rst");
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--data",
        s(&txt),
        "--tokenizer",
        s(&shards),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("tokenize it first"),
        "{}",
        stderr(&out)
    );
    let out = train(
        &["--tokenizer", s(&shards), "--vocab", "100"],
        &tmp("run-v"),
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("does not cover the tokenizer's"),
        "{}",
        stderr(&out)
    );
}

fn train_other_tokenizer(input: &Path) -> std::path::PathBuf {
    let out = tmp("other-tok");
    assert_success(&duet(&[
        "tokenize",
        s(&input.join("a.txt")),
        "--out",
        s(&out),
        "--train-bpe",
        "260",
        "--val-fraction",
        "0",
    ]));
    out
}
