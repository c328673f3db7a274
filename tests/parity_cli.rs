//! `duet train --trace` and `duet parity`: exit codes 0 (match), 1 (divergence), 2 (unreadable or
//! incompatible traces).

mod common;

use common::{assert_success, duet, tmp};

fn train_trace(path: &std::path::Path, threads: &str, extra: &[&str]) {
    let mut args = vec![
        "train",
        "--preset",
        "tiny",
        "--steps",
        "6",
        "--log-every",
        "0",
        "--threads",
        threads,
        "--trace",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = duet(&args);
    assert_success(&out);
}

#[test]
fn parity_exit_codes() {
    let (a, b, c) = (tmp("a.jsonl"), tmp("b.jsonl"), tmp("c.jsonl"));
    train_trace(&a, "1", &[]);
    train_trace(&b, "2", &[]);
    let out = duet(&["parity", a.to_str().unwrap(), b.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("match over 6 steps"), "{stdout}");

    // A changed learning rate is a different config: not comparable, and the field is named.
    train_trace(&c, "2", &["--lr", "2e-3"]);
    let out = duet(&["parity", a.to_str().unwrap(), c.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.train.lr"));

    // Execution settings (here activation checkpointing, the GELU kept, the loss read back
    // after every step) do not make traces incomparable: the CPU backend gives the same bits,
    // so they match, and the differing settings are named.
    let e = tmp("e.jsonl");
    train_trace(
        &e,
        "1",
        &[
            "--checkpoint-every",
            "1",
            "--keep-gelu",
            "--loss-every",
            "1",
        ],
    );
    let out = duet(&["parity", a.to_str().unwrap(), e.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("match over 6 steps"), "{stdout}");
    for k in ["checkpoint_every", "recompute_gelu", "loss_every"] {
        assert!(stdout.contains(&format!("train.{k}: ")), "{k}: {stdout}");
    }
    assert!(stdout.contains("parameters 0.000"), "{stdout}");

    // A trace whose step 4 loss was altered diverges there.
    let text = std::fs::read_to_string(&b).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut rec: serde_json::Value = serde_json::from_str(&lines[4]).unwrap();
    assert_eq!(rec["step"], 4);
    rec["loss"] = serde_json::json!(rec["loss"].as_f64().unwrap() * 1.01);
    lines[4] = rec.to_string();
    std::fs::write(&c, lines.join("\n")).unwrap();
    let out = duet(&["parity", a.to_str().unwrap(), c.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("diverged at step 4: loss"), "{stdout}");

    // Unreadable input.
    std::fs::write(&c, "not json\n").unwrap();
    let out = duet(&["parity", a.to_str().unwrap(), c.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let out = duet(&["parity", a.to_str().unwrap(), "/nonexistent/trace.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/trace.jsonl"));
}
