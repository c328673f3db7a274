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
        "exceeds the model's maximum sequence length",
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
        "--stop-after 0: nothing to train",
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
        "1",
        "--log-every",
        "0",
    ];
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
