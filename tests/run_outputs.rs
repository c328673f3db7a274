//! What a training run leaves and prints for batch jobs (issue 31): log lines when stderr is not
//! a terminal, step-numbered checkpoints with `--keep`/`--keep-best`, the metrics CSV, the run
//! settings restored on resume, the fixed learning-rate schedule, cumulative elapsed time,
//! `--print-config`, quiet broken pipes and `--backend auto`'s choice.

mod common;

use common::{assert_success, duet, tmp};
use std::path::Path;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn numbered(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint-0"))
        .collect();
    v.sort();
    v
}

const TINY: [&str; 6] = [
    "--preset",
    "tiny",
    "--threads",
    "2",
    "--eval-sequences",
    "0",
];

/// Without a terminal (the test captures stderr) a run logs a line every 10 steps with the
/// step, loss, lr, grad norm, ms/step, tokens/s and ETA, validates ten times by default (one
/// line each), and keeps the newest --keep step-numbered checkpoints, the latest as
/// checkpoint.safetensors, and the CSV twin of metrics.jsonl.
#[test]
fn batch_job_logs_validations_and_kept_checkpoints() {
    let dir = tmp("batch-run");
    let mut args = vec![
        "train",
        "--steps",
        "40",
        "--save-every",
        "10",
        "--keep",
        "2",
    ];
    args.extend(TINY);
    args.extend(["--out", dir.to_str().unwrap()]);
    let out = duet(&args);
    assert_success(&out);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("ms/step")).collect();
    assert_eq!(lines.len(), 4, "a line every 10 steps: {err}");
    for (i, l) in lines.iter().enumerate() {
        assert!(
            l.starts_with(&format!("step {}/40 | loss ", 10 * (i + 1))),
            "{l}"
        );
        for part in ["| lr ", "| grad norm ", " tok/s", "| ETA "] {
            assert!(l.contains(part), "{part} missing from {l}");
        }
    }
    let vals = err
        .lines()
        .filter(|l| l.contains("| validation loss "))
        .count();
    assert_eq!(vals, 10, "validation every ceil(40/10) = 4 steps: {err}");
    assert!(err.contains("validation every 4 steps"), "{err}");
    // Saves at 10, 20, 30 and the end; the newest two kept.
    assert_eq!(
        numbered(&dir),
        [
            "checkpoint-00000030.safetensors",
            "checkpoint-00000040.safetensors"
        ]
    );
    let latest = std::fs::read(dir.join("checkpoint.safetensors")).unwrap();
    let last = std::fs::read(dir.join("checkpoint-00000040.safetensors")).unwrap();
    assert_eq!(latest, last, "checkpoint.safetensors is the latest save");
    // The CSV holds the same steps and values as the JSON lines.
    let m = metrics(&dir);
    let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().collect();
    assert!(rows[0].starts_with("step,loss,val_loss,lr,"), "{}", rows[0]);
    assert_eq!(rows.len(), m.len() + 1);
    for (row, rec) in rows[1..].iter().zip(&m) {
        let cells: Vec<&str> = row.split(',').collect();
        assert_eq!(cells[0], rec["step"].to_string());
        assert_eq!(cells[1], rec["loss"].to_string());
        match rec.get("val_loss") {
            Some(v) => assert_eq!(cells[2], v.to_string()),
            None => assert_eq!(cells[2], ""),
        }
    }
}

/// --keep-best keeps the save with the lowest validation loss (validated at every save), and
/// a resume without flags restores --save-every, --keep and --keep-best from the checkpoint.
#[test]
fn keep_best_and_resumed_settings() {
    let dir = tmp("best-run");
    let d = dir.to_str().unwrap();
    let mut args = vec![
        "train",
        "--steps",
        "30",
        "--save-every",
        "5",
        "--keep",
        "1",
        "--keep-best",
        "--val-every",
        "0",
        "--stop-after",
        "15",
    ];
    args.extend(TINY);
    args.extend(["--out", d]);
    let first = duet(&args);
    assert_success(&first);
    let out = duet(&["train", "--resume", d, "--out", d, "--threads", "2"]);
    assert_success(&out);
    // --keep 1 survived the resume: one numbered file, the last.
    assert_eq!(numbered(&dir), ["checkpoint-00000030.safetensors"]);
    // Every save validated (--val-every 0 kept on resume): in the loop at 5, 10, 20, 25 (the
    // metrics) and at the end of each invocation, 15 and 30 (the summary line).
    let m = metrics(&dir);
    let mut saves: Vec<(u64, f64)> = m
        .iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["val_loss"].as_f64()?)))
        .collect();
    assert_eq!(
        saves.iter().map(|s| s.0).collect::<Vec<_>>(),
        [5, 10, 20, 25],
        "validated at the saves only"
    );
    let summary_val = |o: &std::process::Output| -> f64 {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("validation loss "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("a validation summary line")
    };
    saves.push((15, summary_val(&first)));
    saves.push((30, summary_val(&out)));
    let best = saves.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    let meta = duet_meta(&dir.join("checkpoint-best.safetensors"));
    assert_eq!(
        meta["step"],
        best.0.to_string(),
        "the best save's step: {saves:?}"
    );
    let v: f64 = meta["val_loss"].as_str().unwrap().parse().unwrap();
    assert!((v - best.1).abs() < 1e-4, "{v} vs {saves:?}");
    // Elapsed time counts the whole run: it never goes back at the resumed step.
    let el: Vec<f64> = m.iter().map(|r| r["elapsed_s"].as_f64().unwrap()).collect();
    assert!(
        el.windows(2).all(|w| w[1] >= w[0]),
        "elapsed_s went back: {el:?}"
    );
}

/// The `__metadata__` of a safetensors file.
fn duet_meta(p: &Path) -> serde_json::Map<String, serde_json::Value> {
    let b = std::fs::read(p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let v: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    v["__metadata__"].as_object().unwrap().clone()
}

/// Raising --steps on resume continues at the final learning rate (said in a note) instead
/// of stretching the cosine: the resumed steps before the old end keep their rates.
#[test]
fn extending_a_run_keeps_its_schedule() {
    let a = tmp("sched-a");
    let b = tmp("sched-b");
    let mut args = vec!["train", "--steps", "20", "--log-every", "0"];
    args.extend(TINY);
    let run = |dir: &Path, extra: &[&str]| {
        let mut v = args.clone();
        v.extend(["--out", dir.to_str().unwrap()]);
        v.extend(extra);
        assert_success(&duet(&v));
    };
    run(&a, &[]);
    run(&b, &["--stop-after", "10"]);
    let d = b.to_str().unwrap();
    let out = duet(&[
        "train",
        "--resume",
        d,
        "--out",
        d,
        "--steps",
        "30",
        "--threads",
        "2",
    ]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("steps 21..30 continue at its final rate"),
        "{}",
        stderr(&out)
    );
    let (ma, mb) = (metrics(&a), metrics(&b));
    let lr = |m: &[serde_json::Value], s: usize| m[s - 1]["lr"].as_f64().unwrap();
    for s in 1..=20 {
        assert_eq!(
            lr(&mb, s),
            lr(&ma, s),
            "step {s}: the schedule of the first 20 steps"
        );
    }
    // The final rate: the peak × min_lr_ratio (0.1 in the tiny preset), below step 20's.
    let peak = (1..=20).map(|s| lr(&ma, s)).fold(0.0, f64::max);
    let last = lr(&mb, 21);
    assert!((last - 0.1 * peak).abs() < 1e-9 * peak, "{last} vs {peak}");
    assert!(last < lr(&ma, 20));
    for s in 21..=30 {
        assert_eq!(lr(&mb, s), last, "step {s}: the final rate");
    }
}

/// --print-config prints the resolved TOML (which --config reads back to the same run) and
/// trains nothing.
#[test]
fn print_config_prints_and_exits() {
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--lr",
        "0.004",
        "--print-config",
    ]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("lr = 0.004"), "{text}");
    assert!(text.contains("[model]"), "{text}");
    assert!(!stderr(&out).contains("trained"), "{}", stderr(&out));
    let f = tmp("printed.toml");
    std::fs::write(&f, text.as_bytes()).unwrap();
    let again = duet(&["train", "--config", f.to_str().unwrap(), "--print-config"]);
    assert_success(&again);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        text,
        "the printed configuration reads back as itself"
    );
}

/// Help lines show the preset defaults of flags whose default is the preset's.
#[test]
fn help_shows_preset_defaults() {
    let out = duet(&["train", "--help"]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--lr <LR>",
        "--layers <LAYERS>",
        "--batch <BATCH>",
        "--steps <STEPS>",
    ] {
        let line = text
            .lines()
            .skip_while(|l| !l.contains(flag))
            .take(2)
            .collect::<String>();
        assert!(line.contains("with --preset default]"), "{flag}: {line}");
    }
}

/// A closed stdout (`duet … | head`) ends duet quietly: no panic message, status 141, not 101.
#[test]
fn broken_pipe_ends_quietly() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args([
            "train",
            "--preset",
            "tiny",
            "--steps",
            "3",
            "--threads",
            "2",
            "--log-every",
            "1",
        ])
        .env_remove("DUET_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before duet prints
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

/// --backend auto says which backend it chose and why the others were not.
#[test]
fn backend_auto_says_what_it_chose() {
    let out = duet(&[
        "train",
        "--backend",
        "auto",
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--threads",
        "2",
    ]);
    assert_success(&out);
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("backend auto: "))
        .unwrap_or_else(|| panic!("no choice line: {err}"));
    if line.starts_with("backend auto: cpu") {
        assert!(line.contains("cuda not available: "), "{line}");
        assert!(line.contains("hip not available: "), "{line}");
    }
}

/// `--stop-after 0` saves the initial state (step 0: the seed's weights, fresh optimizer) and
/// trains nothing; the run then resumes from it as if it had never stopped, and
/// `--record-batches` writes exactly the batches of the steps it trains.
#[test]
fn initial_checkpoint_and_recorded_batches() {
    let (a, b) = (tmp("init-a"), tmp("init-b"));
    let rec = tmp("init-b.batches");
    let mut args = vec![
        "train",
        "--steps",
        "6",
        "--log-every",
        "0",
        "--val-every",
        "0",
    ];
    args.extend(TINY);
    let run = |dir: &Path, extra: &[&str]| {
        let mut v = args.clone();
        v.extend(["--out", dir.to_str().unwrap()]);
        v.extend(extra);
        let o = duet(&v);
        assert_success(&o);
        o
    };
    run(&a, &[]);
    let o = run(&b, &["--stop-after", "0"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained no steps (the run is at step 0)"));
    let meta = duet_meta(&b.join("checkpoint-00000000.safetensors"));
    assert_eq!(meta["step"], "0");
    let d = b.to_str().unwrap();
    let r = rec.to_str().unwrap();
    assert_success(&duet(&[
        "train",
        "--resume",
        d,
        "--out",
        d,
        "--threads",
        "2",
        "--record-batches",
        r,
    ]));
    let loss = |m: &[serde_json::Value]| -> Vec<String> {
        m.iter().map(|r| r["loss"].to_string()).collect()
    };
    assert_eq!(
        loss(&metrics(&b)),
        loss(&metrics(&a)),
        "resumed from step 0"
    );
    // The header, then 6 steps of batch × seq inputs and batch × seq targets.
    let bytes = std::fs::read(&rec).unwrap();
    assert_eq!(&bytes[..8], b"DUETBAT1");
    let bsz = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let seq = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    assert_eq!(
        bytes.len(),
        16 + 6 * 2 * bsz * seq * 4,
        "six steps recorded"
    );
    let i32s: Vec<i32> = bytes[16..]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // The synthetic task: every input a token of the vocabulary, targets a token or ignored.
    assert!(
        i32s.iter().all(|&x| (-1..96).contains(&x)),
        "tokens of vocab 96"
    );
    assert!(
        i32s.chunks(bsz * seq)
            .step_by(2)
            .all(|inp| inp.iter().all(|&x| x >= 0))
    );
}

/// Issue 51 item 13: a run killed after linking a save as the latest but before linking it as
/// the best left `checkpoint-best` on an older, worse save for good. A resume with
/// `--keep-best` compares the latest's validation loss with the best's and re-links.
#[test]
fn a_resume_relinks_a_better_latest_as_the_best() {
    let dir = tmp("best-relink");
    let d = dir.to_str().unwrap();
    let mut args = vec![
        "train",
        "--steps",
        "30",
        "--save-every",
        "5",
        "--keep",
        "0",
        "--keep-best",
        "--val-every",
        "0",
        "--stop-after",
        "10",
    ];
    args.extend(TINY);
    args.extend(["--out", d]);
    assert_success(&duet(&args));
    let val = |p: &Path| -> f64 { duet_meta(p)["val_loss"].as_str().unwrap().parse().unwrap() };
    let (five, latest, best) = (
        dir.join("checkpoint-00000005.safetensors"),
        dir.join("checkpoint.safetensors"),
        dir.join("checkpoint-best.safetensors"),
    );
    assert!(
        val(&latest) < val(&five),
        "the test needs step 10 to validate better than 5"
    );
    assert_eq!(duet_meta(&best)["step"], "10");
    // The kill: the best name still on step 5's save.
    std::fs::remove_file(&best).unwrap();
    std::fs::hard_link(&five, &best).unwrap();
    let out = duet(&[
        "train",
        "--resume",
        d,
        "--out",
        d,
        "--threads",
        "2",
        "--stop-after",
        "1",
    ]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("checkpoint-best.safetensors now holds the latest checkpoint"),
        "{stderr}"
    );
    // The best is step 10's save again, or the end-of-run save at 11 if it validated better
    // still; never step 5's.
    let step = duet_meta(&best)["step"].as_str().unwrap().to_string();
    assert!(step == "10" || step == "11", "best at step {step}");
    assert!(val(&best) <= val(&dir.join("checkpoint-00000010.safetensors")));
}

/// On a terminal the progress bar is drawn only once every line before the loop is out: no
/// line starts behind an empty bar (`░░░ 0/6validation every 1 steps …`), and no bar is
/// left behind. The terminal is a
/// pseudo-terminal from util-linux's `script`.
#[test]
fn terminal_bar_starts_after_the_setup_lines() {
    let out_dir = tmp("bar-run");
    let cmd = format!(
        "{} train --preset tiny --threads 2 --eval-sequences 0 --steps 6 --out {}",
        env!("CARGO_BIN_EXE_duet"),
        out_dir.display()
    );
    let o = std::process::Command::new("script")
        .args(["-q", "-e", "-c", &cmd, "/dev/null"])
        .env_remove("DUET_BACKEND")
        .env("COLUMNS", "160")
        .output()
        .expect("util-linux's `script` (Debian: bsdutils) runs the pseudo-terminal");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "the run failed: {text}");
    assert!(text.contains('█'), "no progress bar was drawn: {text}");
    // Every bar drawn is the styled one (`… step 3/6 | loss …`).
    for seg in text.split(['\n', '\r', '\u{1b}']) {
        assert!(
            !seg.contains(['░', '█']) || seg.contains(" step "),
            "a bar other than the run's: {seg:?}"
        );
    }
    for line in ["memory plan", "validation every"] {
        let at = text
            .find(line)
            .unwrap_or_else(|| panic!("`{line}` missing: {text}"));
        let start = text[..at].rfind(['\n', '\r']).map_or(0, |i| i + 1);
        let before = &text[start..at];
        assert!(
            !before.contains(['░', '█']),
            "`{line}` printed behind a bar: {before:?}{line}"
        );
    }
}
