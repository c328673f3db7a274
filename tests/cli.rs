//! The `duet` command line: bad input ends with one clear line and a non-zero exit code; a tiny
//! run trains, writes its metrics and reports the generation check.

mod common;

use common::{assert_success, duet, tmp};

/// Fails with exit code 1, one `error:` line naming `needle`, and no panic.
fn assert_clean_error(args: &[&str], needle: &str) {
    let out = duet(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} should fail with exit code 1; stderr: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: expected one line, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: '{needle}' not in: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_configs_fail_cleanly() {
    assert_clean_error(
        &["train", "--heads", "5"],
        "heads (5) must divide d_model (128)",
    );
    assert_clean_error(&["train", "--layers", "0"], "layers must be at least 1");
    assert_clean_error(&["train", "--batch", "0"], "batch must be at least 1");
    assert_clean_error(
        &["train", "--seq", "65"],
        "exceeds the model's maximum sequence length max_seq (64): lower --seq or raise --max-seq",
    );
    assert_clean_error(&["train", "--backend", "tpu"], "unknown backend 'tpu'");
    assert_clean_error(&["train", "--preset", "huge"], "unknown preset 'huge'");
    assert_clean_error(
        &["train", "--config", "/nonexistent/run.toml"],
        "/nonexistent/run.toml",
    );
    assert_clean_error(&["train", "--lr=-1"], "lr must be positive");
    assert_clean_error(
        &["train", "--precision", "fp8", "--fp8-fast-accum", "fast"],
        "unknown fp8 fast_accum 'fast' (expected none, forward or all)",
    );
    let bad = tmp("bad.toml");
    std::fs::write(&bad, "[model]\nlayerz = 3\n").unwrap();
    assert_clean_error(
        &["train", "--config", bad.to_str().unwrap()],
        "unknown field model.layerz",
    );
    std::fs::write(&bad, "[train]\nfp8_fast_accum = \"sometimes\"\n").unwrap();
    assert_clean_error(
        &["train", "--config", bad.to_str().unwrap()],
        "unknown variant `sometimes`, expected one of `none`, `forward`, `all`",
    );
    std::fs::write(&bad, "[model\n").unwrap();
    assert_clean_error(&["train", "--config", bad.to_str().unwrap()], "bad.toml");
    assert_clean_error(
        &[
            "train",
            "--preset",
            "tiny",
            "--metrics",
            "/nonexistent/dir/m.jsonl",
        ],
        "cannot create metrics file",
    );
    // A --json path that cannot be written stops the benchmark before it runs (no JSON out).
    let bench = [
        "bench",
        "--preset",
        "tiny",
        "--iters",
        "1",
        "--json",
        "/nonexistent/dir/bench.json",
    ];
    assert_clean_error(&bench, "/nonexistent/dir is not a directory");
    assert!(duet(&bench).stdout.is_empty());
    let dir = tmp("bench-json-dir");
    std::fs::create_dir_all(&dir).unwrap();
    assert_clean_error(
        &["bench", "--preset", "tiny", "--json", dir.to_str().unwrap()],
        "it is a directory",
    );
    assert_clean_error(
        &["train", "--preset", "tiny", "--steps", "0"],
        "--steps is 0: nothing to train",
    );
    assert_clean_error(
        &["train", "--preset", "tiny", "--stop-after", "0"],
        "--stop-after 0 saves the initial state (step 0) into --out: give --out",
    );
}

/// Flags that cannot take effect in the run they were given to: the run goes on, with a warning.
#[test]
fn ineffective_flags_are_warned_about() {
    let run = |args: &[&str]| {
        let out = duet(args);
        assert_success(&out);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let base = [
        "train",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--log-every",
        "0",
    ];
    // The tiny preset warms up over 2 steps: a 1-step run never reaches the peak rate.
    let err = run(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--log-every",
        "0",
    ]);
    assert!(
        err.contains("warning: the warmup (2 steps) is longer than the run (1 steps)"),
        "{err}"
    );
    let err = run(&[&base[..], &["--fp8-margin", "2", "--fp8-format", "e4m3"]].concat());
    assert!(
        err.contains(
            "warning: FP8 recipe flags (--fp8-format, --fp8-margin) take effect only with \
             --precision fp8; this run is fp32"
        ),
        "{err}"
    );
    let err = run(&[&base[..], &["--fp8-margin", "2", "--precision", "fp8"]].concat());
    assert!(!err.contains("warning"), "{err}");
    let err = run(&[&base[..], &["--zero", "1"]].concat());
    assert!(
        err.contains("warning: --zero 1 shards the optimizer state"),
        "{err}"
    );
    let bench = [
        "bench",
        "--preset",
        "tiny",
        "--iters",
        "1",
        "--warmup-steps",
        "0",
    ];
    let err = run(&[
        &bench[..],
        &["--precision", "bf16,fp8", "--fp8-margin", "1"],
    ]
    .concat());
    assert!(!err.contains("warning"), "{err}");
    let err = run(&[
        &bench[..],
        &["--precision", "bf16,fp32", "--fp8-margin", "1"],
    ]
    .concat());
    assert!(err.contains("this run is bf16, fp32"), "{err}");
}

#[test]
fn no_graphs_flag_runs() {
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--eval-sequences",
        "0",
        "--no-graphs",
    ]);
    assert_success(&out);
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = duet(&["train", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn tiny_run_trains_and_writes_metrics() {
    let metrics = tmp("metrics.jsonl");
    let cfg = tmp("run.toml");
    std::fs::write(&cfg, "[train]\nsteps = 12\nlr = 3e-3\n").unwrap();
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--config",
        cfg.to_str().unwrap(),
        "--steps",
        "15",
        "--log-every",
        "5",
        "--metrics",
        metrics.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        rows.len(),
        15,
        "the flag overrides the config file's 12 steps"
    );
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r["step"].as_u64(), Some(i as u64 + 1));
        assert!(r["loss"].as_f64().unwrap().is_finite());
    }
    let first = rows[0]["loss"].as_f64().unwrap();
    let last = rows[14]["loss"].as_f64().unwrap();
    assert!(last < first, "loss should fall: {first} → {last}");
    assert!(
        (first - (96f64).ln()).abs() < 0.5,
        "initial loss {first} near ln(96)"
    );
}

#[test]
fn generation_check_runs_on_a_small_model() {
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--seq",
        "48",
        "--max-seq",
        "48",
        "--steps",
        "3",
        "--eval-sequences",
        "8",
        "--log-every",
        "0",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_success(&out);
    assert!(
        stdout.contains("greedy generation on 8 held-out progressions"),
        "{stdout}"
    );
}

/// The small model of the generation tests: a 32-token context.
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
    "4",
    "--steps",
    "3",
];

/// Trains the small model into `tmp(name)` (on `data` when given) and returns the folder.
fn train_small(name: &str, data: Option<&std::path::Path>) -> std::path::PathBuf {
    let out = tmp(name);
    let mut args = vec!["train"];
    args.extend(SMALL);
    args.extend(["--out", out.to_str().unwrap()]);
    if let Some(d) = data {
        args.extend(["--data", d.to_str().unwrap()]);
    }
    assert_success(&duet(&args));
    out
}

/// A UTF-8 text file for byte-token models.
fn text_file() -> std::path::PathBuf {
    let path = tmp("corpus.txt");
    std::fs::write(
        &path,
        "the quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    path
}

/// An llm.c shard (1024-byte header of i32: magic, version, token count; then u16 tokens) of
/// 4000 tokens below 1000.
fn llmc_shard() -> std::path::PathBuf {
    let n = 4000u32;
    let mut bytes = Vec::new();
    for (i, w) in [20240520i32, 1, n as i32]
        .into_iter()
        .chain([0; 253])
        .enumerate()
    {
        assert!(i < 256);
        bytes.extend(w.to_le_bytes());
    }
    for i in 0..n {
        bytes.extend(((i * 37 + 11) % 1000).to_le_bytes()[..2].iter());
    }
    let path = tmp("shard.bin");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Sizes past any real model (or that overflow 64 bits) stop in the config check with one
/// line naming the limit, before anything is allocated: no capacity-overflow panic, no abort
/// allocating hundreds of GB, no wrapped parameter count.
#[test]
fn absurd_sizes_fail_cleanly() {
    let max = u64::MAX.to_string();
    fn train<'a>(flags: &[&'a str]) -> Vec<&'a str> {
        [&["train", "--preset", "tiny", "--steps", "1"], flags].concat()
    }
    assert_clean_error(
        &train(&["--ffn", &max]),
        "the MLP weight (ffn × d_model = 18446744073709551615 × 32) would have more than 2^40",
    );
    assert_clean_error(
        &train(&["--max-seq", &max]),
        "the position embedding (max_seq × d_model",
    );
    assert_clean_error(
        &train(&["--layers", &max]),
        "the model has more than 2^40 (about 1.1e12) parameters",
    );
    assert_clean_error(
        &train(&["--d-model", "1000000000", "--heads", "1"]),
        "the attention weight (3 × d_model × d_model = 3 × 1000000000 × 1000000000) would have \
         more than 2^40",
    );
    assert_clean_error(
        &train(&["--layers", "100000"]),
        "layers (100000) is more than 65536",
    );
    assert_clean_error(
        &train(&["--batch", &max]),
        "the logits (batch × seq × vocab = 18446744073709551615 × 16 × 96)",
    );
    // --max-new far past the context with --stop-at-context: the output stops at the context,
    // nothing is allocated for the rest.
    let run = train_small("run-huge", Some(&text_file()));
    // --top-k samples; with temperature 0 it would be silently greedy.
    assert_clean_error(
        &[
            "generate",
            "--checkpoint",
            run.to_str().unwrap(),
            "--prompt",
            "hi",
            "--temperature",
            "0",
            "--top-k",
            "5",
        ],
        "--top-k samples among the k most likely tokens, which needs --temperature > 0",
    );
    for max_new in [max.as_str(), "100000000000"] {
        let out = duet(&[
            "generate",
            "--checkpoint",
            run.to_str().unwrap(),
            "--prompt",
            "hi",
            "--max-new",
            max_new,
            "--stop-at-context",
        ]);
        assert_success(&out);
        // (A barely trained model's bytes need not be UTF-8 and are printed lossily: stderr
        // counts them.)
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "stopped after 30 new tokens (--max-new {max_new}): the model's context is 32 \
                 tokens, filled by the prompt's 2 and the new ones"
            )),
            "{err}"
        );
    }
}

/// A model trained on an llm.c shard (or the synthetic task) has token ids, not bytes: a text
/// prompt is refused instead of going in as bytes and coming out as ids modulo 256, and
/// --tokens prints ids.
#[test]
fn text_prompts_need_a_byte_model() {
    // A model with token ids: --prompt is refused, the message going on with `reason`;
    // --tokens gives max_new ids.
    let ids_only = |ck: &std::path::Path, reason: &str, tokens: &str, max_new: usize| {
        let ck = ck.to_str().unwrap();
        assert_clean_error(
            &["generate", "--checkpoint", ck, "--prompt", "hello"],
            &format!("this model's tokens are not bytes ({reason}"),
        );
        let n = max_new.to_string();
        let out = duet(&[
            "generate",
            "--checkpoint",
            ck,
            "--tokens",
            tokens,
            "--max-new",
            &n,
        ]);
        assert_success(&out);
        let (prompt, ids) = labelled_ids(&out.stdout);
        assert_eq!(prompt, tokens);
        assert_eq!(ids.len(), max_new);
        ids
    };
    let bin = train_small("run-bin", Some(&llmc_shard()));
    let ids = ids_only(
        &bin,
        "trained on an llm.c token shard): give --tokens ids",
        "3,999,5",
        8,
    );
    assert!(ids.iter().all(|&i| i < 1000), "{ids:?}");
    let syn = train_small("run-syn", None);
    ids_only(
        &syn,
        "trained on the synthetic progression task",
        "3,7,11",
        4,
    );

    // A model trained on text takes text and answers with it.
    let txt = train_small("run-txt", Some(&text_file()));
    let out = duet(&[
        "generate",
        "--checkpoint",
        txt.to_str().unwrap(),
        "--prompt",
        "hello",
        "--max-new",
        "4",
    ]);
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("hello"), "{stdout}");
}

/// `generate --tokens` prints `prompt: <ids>` and `new: <ids>`: the prompt's ids (as one
/// comma list) and the new ones.
fn labelled_ids(stdout: &[u8]) -> (String, Vec<usize>) {
    let stdout = String::from_utf8_lossy(stdout);
    let mut lines = stdout.lines();
    let prompt = lines.next().and_then(|l| l.strip_prefix("prompt: "));
    let new = lines.next().and_then(|l| l.strip_prefix("new: "));
    let (Some(prompt), Some(new)) = (prompt, new) else {
        panic!("not `prompt: ` and `new: ` lines: {stdout}");
    };
    let ids = new
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| x.parse().expect("a token id"))
        .collect();
    (prompt.to_string(), ids)
}

/// With --stop-at-context the prompt and the generated tokens together never exceed the
/// context (32 here): a prompt of 31 gets one new token, a prompt of 32 is refused with the
/// rule. By default the window slides: --max-new tokens come, and a long prompt is cropped.
#[test]
fn generation_never_exceeds_the_context() {
    let run = train_small("run-ctx", Some(&text_file()));
    let ck = run.to_str().unwrap();
    let prompt = "a".repeat(31);
    let out = duet(&[
        "generate",
        "--checkpoint",
        ck,
        "--prompt",
        &prompt,
        "--max-new",
        "8",
        "--stop-at-context",
    ]);
    assert_success(&out);
    assert!(out.stdout.starts_with(prompt.as_bytes()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "stopped after 1 new tokens (--max-new 8): the model's context is 32 tokens, filled \
             by the prompt's 31 and the new ones"
        ),
        "{err}"
    );
    assert_clean_error(
        &[
            "generate",
            "--checkpoint",
            ck,
            "--prompt",
            &"a".repeat(32),
            "--stop-at-context",
        ],
        "the prompt has 32 tokens but the model's context is 32: prompt and generated tokens \
         must fit in it together, so a prompt can have at most 31 tokens",
    );
    // Token ids: 3 + 29 = 32.
    let syn = train_small("run-ctx-syn", None);
    let out = duet(&[
        "generate",
        "--checkpoint",
        syn.to_str().unwrap(),
        "--tokens",
        "1,2,3",
        "--max-new",
        "100",
        "--stop-at-context",
    ]);
    assert_success(&out);
    assert_eq!(labelled_ids(&out.stdout).1.len(), 29);
    // Sliding: all 100, and a prompt longer than the context is cropped to its last 31.
    for prompt in ["1,2,3".to_string(), vec!["5"; 40].join(",")] {
        let out = duet(&[
            "generate",
            "--checkpoint",
            syn.to_str().unwrap(),
            "--tokens",
            &prompt,
            "--max-new",
            "100",
        ]);
        assert_success(&out);
        let (p, ids) = labelled_ids(&out.stdout);
        assert_eq!((p, ids.len()), (prompt, 100));
    }
    let out = duet(&[
        "generate",
        "--checkpoint",
        ck,
        "--prompt",
        &"a".repeat(40),
        "--max-new",
        "50",
    ]);
    assert_success(&out);
    assert!(out.stdout.starts_with("a".repeat(40).as_bytes()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the last 31 are used"), "{err}");
    assert!(!err.contains("stopped after"), "{err}");
}

/// Issue 50 item 11: every flag of `train --help` and `bench --help` states its default once
/// (the preset's default was appended to help texts that already named one: `[default: auto]
/// [default: auto with --preset default]`), and no empty list is shown as a default.
#[test]
fn help_states_each_default_once() {
    for cmd in ["train", "bench"] {
        let out = duet(&[cmd, "--help"]);
        assert_success(&out);
        let help = String::from_utf8_lossy(&out.stdout);
        let mut flag = String::new();
        for line in help.lines() {
            if line.trim_start().starts_with("--") || line.trim_start().starts_with('-') {
                flag = line.trim().to_string();
            }
            assert!(
                line.matches("[default").count() <= 1,
                "{cmd} --help: two defaults for {flag}: {line}"
            );
            assert!(!line.contains("[default: []"), "{cmd} --help: {line}");
        }
    }
}

/// Issue 53: `--fp8-family fnuz` runs the CPU's FNUZ encodings (the reference for gfx942's FP8):
/// the trace header says so and the numbers differ from OCP's; an unknown family is refused.
#[test]
fn fp8_family_selects_the_encodings_on_the_cpu() {
    let dir = tmp("fp8-family");
    std::fs::create_dir_all(&dir).unwrap();
    let mut traces = Vec::new();
    for fam in ["ocp", "fnuz"] {
        let t = dir.join(format!("{fam}.jsonl"));
        assert_success(&duet(&[
            "train",
            "--precision",
            "fp8",
            "--fp8-family",
            fam,
            "--steps",
            "2",
            "--eval-sequences",
            "0",
            "--trace",
            t.to_str().unwrap(),
        ]));
        let text = std::fs::read_to_string(&t).unwrap();
        let header: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(header["fp8_family"], fam, "{fam}");
        traces.push(text.lines().skip(1).collect::<Vec<_>>().join("\n"));
    }
    assert_ne!(traces[0], traces[1], "fnuz computed what ocp did");
    assert_clean_error(
        &["train", "--precision", "fp8", "--fp8-family", "e4m3"],
        "unknown FP8 family 'e4m3' (expected device, ocp or fnuz)",
    );
}

/// Issue 50 item 11: `duet bench` prints its human summary for one precision too (it printed
/// only JSON), with TFLOP/s to three significant digits (a CPU's 0.1 showed as 0.1 or 0.0).
#[test]
fn bench_summarises_one_precision_with_enough_digits() {
    let out = duet(&[
        "bench",
        "--preset",
        "tiny",
        "--precision",
        "fp32",
        "--iters",
        "2",
        "--warmup-steps",
        "1",
    ]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("fp32 "))
        .unwrap_or_else(|| panic!("no fp32 summary line:\n{stderr}"));
    let tflops = line.split_whitespace().nth(4).unwrap();
    let digits = tflops.trim_start_matches(['0', '.']).len();
    assert!(digits >= 3, "{line}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["precision"], "fp32");
}

/// Issue 50 item 11: `duet bench --help` no longer lists the train-only flags it shares through
/// the model arguments, and giving one is refused rather than ignored.
#[test]
fn bench_refuses_train_only_flags() {
    let out = duet(&["bench", "--help"]);
    assert_success(&out);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--data ",
        "--val-data",
        "--tokenizer",
        "--eval-sequences",
        "--max-stride",
    ] {
        assert!(!help.contains(flag), "bench --help lists {flag}");
    }
    assert!(help.contains("--iters") && help.contains("--batch"));
    assert_clean_error(
        &["bench", "--eval-sequences", "4"],
        "--eval-sequences is a `duet train` flag: duet bench times steps on synthetic batches",
    );
}

/// Every path a command takes, missing or under a file, is named in a message in words: no raw
/// `(os error N)` (issue 50, item 11).
#[test]
fn bad_paths_are_named_in_words() {
    let dir = tmp("bad-paths");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let missing = dir.join("missing").join("x");
    let under_file = file.join("x");
    for p in [&missing, &under_file] {
        let p = p.to_str().unwrap();
        let train = ["train", "--preset", "tiny", "--steps", "2"];
        let mut cases: Vec<Vec<&str>> = vec![
            [&train[..], &["--config", p]].concat(),
            [&train[..], &["--resume", p]].concat(),
            [&train[..], &["--init-from", p]].concat(),
            [&train[..], &["--data", p]].concat(),
            [&train[..], &["--metrics", p]].concat(),
            [&train[..], &["--trace", p]].concat(),
            vec!["generate", "--checkpoint", p, "--prompt", "hi"],
            vec!["eval", "--checkpoint", p, "--data", p],
            vec!["export", "--checkpoint", p, "exported"],
            vec!["tokenize", p, "--out", "shards"],
            vec!["parity", p, p],
        ];
        // An output folder is created where missing; under a file it cannot be.
        if p.ends_with("a.txt/x") {
            cases.push([&train[..], &["--out", p]].concat());
            cases.push(vec!["tokenize", file.to_str().unwrap(), "--out", p]);
        }
        for args in cases {
            let o = duet(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{args:?} succeeded");
            assert!(err.contains(p), "{args:?} does not name {p}: {err}");
            assert!(!err.contains("os error"), "{args:?}: {err}");
        }
    }
}
