//! Issue 51 items 2 and 9: what a run's log files may replace, and two runs on one log file.

mod common;
use common::*;

/// `--record-batches FILE` truncated any file, another run's checkpoint included; it now
/// follows `--metrics`' rule: an existing file that is not a batch record is refused unless
/// `--overwrite`.
#[test]
fn record_batches_refuses_a_file_that_is_not_a_batch_record() {
    let dir = tmp("record-batches");
    let a = dir.join("a");
    assert_success(&duet(&[
        "train",
        "--steps",
        "1",
        "--eval-sequences",
        "0",
        "--out",
        a.to_str().unwrap(),
    ]));
    let ck = a.join("checkpoint.safetensors");
    let before = std::fs::read(&ck).unwrap();
    let r = duet(&[
        "train",
        "--steps",
        "1",
        "--eval-sequences",
        "0",
        "--record-batches",
        ck.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--record-batches") && stderr.contains("is not a duet batch record"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&ck).unwrap(),
        before,
        "the checkpoint was touched"
    );
    // A batch record is replaced; --overwrite replaces anything.
    let rec = dir.join("batches.bin");
    for _ in 0..2 {
        assert_success(&duet(&[
            "train",
            "--steps",
            "1",
            "--eval-sequences",
            "0",
            "--record-batches",
            rec.to_str().unwrap(),
        ]));
    }
    assert!(std::fs::read(&rec).unwrap().starts_with(b"DUETBAT1"));
    let other = dir.join("notes.txt");
    std::fs::write(&other, "keep me").unwrap();
    assert_success(&duet(&[
        "train",
        "--steps",
        "1",
        "--eval-sequences",
        "0",
        "--overwrite",
        "--record-batches",
        other.to_str().unwrap(),
    ]));
    assert!(std::fs::read(&other).unwrap().starts_with(b"DUETBAT1"));
}

/// Two runs given the same `--metrics` or `--trace` file outside an `--out` both exited 0 and
/// left a torn file. A run locks its log files for its life; a second run is refused before it
/// truncates anything. (The test holds the lock itself, as a running duet would.)
#[test]
fn a_log_file_another_run_holds_is_refused() {
    let dir = tmp("log-locks");
    std::fs::create_dir_all(&dir).unwrap();
    for (flag, name) in [("--metrics", "m.jsonl"), ("--trace", "t.jsonl")] {
        let p = dir.join(name);
        assert_success(&duet(&[
            "train",
            "--steps",
            "2",
            "--eval-sequences",
            "0",
            flag,
            p.to_str().unwrap(),
        ]));
        let before = std::fs::read(&p).unwrap();
        let held = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        held.try_lock().unwrap();
        let r = duet(&[
            "train",
            "--steps",
            "2",
            "--eval-sequences",
            "0",
            flag,
            p.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains("is being written by another duet run now"),
            "{flag}: {stderr}"
        );
        assert_eq!(
            std::fs::read(&p).unwrap(),
            before,
            "{flag}: the log was touched"
        );
        drop(held);
        assert_success(&duet(&[
            "train",
            "--steps",
            "2",
            "--eval-sequences",
            "0",
            flag,
            p.to_str().unwrap(),
        ]));
    }
}
