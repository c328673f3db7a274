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

/// `lines` (a trace's lines) with the step record of `step` changed by `edit`.
fn edit_step(lines: &[String], step: u64, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut out: Vec<String> = lines.to_vec();
    let i = step as usize; // line 0 is the header, line i step i
    let mut rec: serde_json::Value = serde_json::from_str(&out[i]).unwrap();
    assert_eq!(rec["step"], step);
    edit(&mut rec);
    out[i] = rec.to_string();
    out.join("\n") + "\n"
}

/// Runs `duet parity a b`: (exit code, stdout, stderr).
fn parity(a: &std::path::Path, b: &std::path::Path) -> (Option<i32>, String, String) {
    let out = duet(&["parity", a.to_str().unwrap(), b.to_str().unwrap()]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn parity_reads_non_finite_values() {
    // An FP16 run whose loss scale overflows the gradients (skipped steps, inf gradient norm)
    // and a run that diverges: each trace must read back and match itself.
    let f16 = tmp("nf-fp16.jsonl");
    let args = [
        "--precision",
        "fp16",
        "--batch",
        "1",
        "--seq",
        "2",
        "--lr",
        "0.05",
    ];
    train_trace(&f16, "1", &args);
    let (code, stdout, stderr) = parity(&f16, &f16);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("match over 6 steps"), "{stdout}");

    // lr 1e30 makes every weight infinite after step 1 (the run then stops with an error).
    let dv = tmp("nf-diverged.jsonl");
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--steps",
        "3",
        "--log-every",
        "0",
        "--lr",
        "1e30",
        "--trace",
        dv.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let text = std::fs::read_to_string(&dv).unwrap();
    assert!(
        text.contains("\"inf\"") || text.contains("\"NaN\""),
        "{text}"
    );
    let (code, stdout, stderr) = parity(&dv, &dv);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("inf or NaN in both"), "{stdout}");

    // Traces written before inf and NaN were told apart have null for both; they read, match
    // themselves and match the same run written now.
    let old = tmp("nf-old.jsonl");
    let nulls = text
        .replace("\"-inf\"", "null")
        .replace("\"inf\"", "null")
        .replace("\"NaN\"", "null");
    std::fs::write(&old, nulls).unwrap();
    for (a, b) in [(&old, &old), (&old, &dv), (&dv, &old)] {
        let (code, stdout, stderr) = parity(a, b);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
    }

    // Non-finite in one trace and finite in the other diverges, and so do two different
    // non-finite values; the same one in both does not.
    let (a, b) = (tmp("nf-a.jsonl"), tmp("nf-b.jsonl"));
    train_trace(&a, "1", &[]);
    let lines: Vec<String> = std::fs::read_to_string(&a)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let set = |v: serde_json::Value| move |r: &mut serde_json::Value| r["grad_norm"] = v.clone();
    std::fs::write(&b, edit_step(&lines, 2, set(serde_json::Value::Null))).unwrap();
    let (code, stdout, _) = parity(&a, &b);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("diverged at step 2: grad_norm: ")
            && stdout.contains("non-finite in one trace only"),
        "{stdout}"
    );
    let (code, stdout, stderr) = parity(&b, &b);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    std::fs::write(&a, edit_step(&lines, 2, set("inf".into()))).unwrap();
    std::fs::write(&b, edit_step(&lines, 2, set("NaN".into()))).unwrap();
    let (code, stdout, _) = parity(&a, &b);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("diverged at step 2: grad_norm: inf vs NaN (different non-finite values)"),
        "{stdout}"
    );
}

#[test]
fn parity_fails_when_a_trace_ends_early() {
    let (full, short) = (tmp("len-full.jsonl"), tmp("len-short.jsonl"));
    train_trace(&full, "1", &[]);
    let lines: Vec<String> = std::fs::read_to_string(&full)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    // The header and steps 1-3: a run that stopped after step 3.
    std::fs::write(&short, lines[..4].join("\n") + "\n").unwrap();
    for (a, b) in [(&full, &short), (&short, &full)] {
        let (code, stdout, stderr) = parity(a, b);
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        let want = format!(
            "{} ends after step 3; {} has 6 steps",
            short.display(),
            full.display()
        );
        assert!(stdout.contains(&want), "{stdout}");
        assert!(!stdout.contains("match over"), "{stdout}");
    }

    // A divergence within the steps both have is reported first.
    let mut cut = lines[..4].to_vec();
    let mut rec: serde_json::Value = serde_json::from_str(&cut[2]).unwrap();
    rec["loss"] = serde_json::json!(rec["loss"].as_f64().unwrap() * 1.01);
    cut[2] = rec.to_string();
    std::fs::write(&short, cut.join("\n") + "\n").unwrap();
    let (code, stdout, _) = parity(&full, &short);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("diverged at step 2: loss"), "{stdout}");
}
