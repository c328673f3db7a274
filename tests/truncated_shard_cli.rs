//! Issue 51 item 8: a shard truncated while a run maps it killed the run with SIGBUS (exit
//! 135, nothing named, nothing saved). The run now stops at a step boundary, saves a
//! checkpoint, names the file and exits 1; restoring the file resumes the run.

mod common;

use common::{assert_success, duet, tmp};
use duet_engine::checkpoint::Checkpoint;
use duet_engine::dataset::write_llmc_shard;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The steps of the run: far more than it can take before the test truncates its shard (it
/// stops a few steps after that, once its prefetched batches are used).
const STEPS: &str = "1000000";

#[test]
fn a_shard_truncated_during_the_run_stops_it_with_a_checkpoint_naming_the_file() {
    // Found by a training batch (read ahead on the data thread), or first by the validation
    // after the next step (its windows are read when it runs).
    for val_every in ["0", "1"] {
        truncated_during_the_run(val_every);
    }
}

fn truncated_during_the_run(val_every: &str) {
    let data = tmp(&format!("truncated-data-{val_every}"));
    std::fs::create_dir_all(&data).unwrap();
    let shard = data.join("d_train_000001.bin");
    // 200,000 uint16 tokens: about 100 pages, every one of which faults once truncated.
    let tokens: Vec<u16> = (0..200_000u32).map(|i| (i * 13 % 500) as u16).collect();
    write_llmc_shard(&shard, &tokens).unwrap();
    let original = std::fs::read(&shard).unwrap();
    let run = tmp(&format!("truncated-run-{val_every}"));
    let cwd = tmp("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args([
            "train",
            "--preset",
            "tiny",
            "--data",
            s(&data),
            "--steps",
            STEPS,
            "--log-every",
            "1",
            "--val-every",
            val_every,
            "--out",
            s(&run),
        ])
        .current_dir(&cwd)
        .env_remove("DUET_BACKEND")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs duet");
    let pid = child.id();
    // A run that never stops (the bug this guards against, in another form) is killed; `done`
    // once it has been waited for (its id may then be another process's).
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !done.load(SeqCst) {
                if start.elapsed() > Duration::from_secs(300) {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut all = String::new();
    // Truncated once the run has taken its first step: the shard is mapped and being read.
    // The run cannot get far past it meanwhile: its progress lines fill the pipe's buffer
    // unless the test reads them.
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        all.push_str(&line);
        if line.starts_with("step 1/") {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&shard)
                .unwrap()
                .set_len(0)
                .unwrap();
            break;
        }
    }
    stderr.read_to_string(&mut all).unwrap();
    let status = child.wait().unwrap();
    done.store(true, SeqCst);
    watchdog.join().unwrap();
    assert_eq!(
        status.signal(),
        None,
        "killed by a signal ({status}): {all}"
    );
    assert_eq!(status.code(), Some(1), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    let err = all.trim_end().lines().last().unwrap_or_default();
    assert!(err.starts_with("error: "), "{all}");
    assert_eq!(all.matches("error").count(), 1, "one error: {all}");
    assert!(
        err.contains(&format!(
            "data file {} changed while the run read it",
            s(&shard)
        )),
        "{err}"
    );
    assert!(err.contains("0 bytes"), "{err}");
    let ck_path = run.join("checkpoint.safetensors");
    assert!(err.contains(&format!("saved to {}", s(&ck_path))), "{err}");
    // The checkpoint is at a step the run finished, before the truncation could stop it.
    let ck = Checkpoint::load(&ck_path).unwrap();
    assert!(ck.step >= 1 && ck.step < 1000, "{}", ck.step);
    assert!(
        err.contains(&format!("training stopped after step {}", ck.step)),
        "{err}"
    );
    // Restored, the shard resumes the run (its content is the run's again).
    std::fs::write(&shard, &original).unwrap();
    let steps = (ck.step + 3).to_string();
    assert_success(&duet(&[
        "train",
        "--resume",
        s(&run),
        "--out",
        s(&run),
        "--steps",
        &steps,
        "--log-every",
        "0",
    ]));
    assert_eq!(
        Checkpoint::load(&ck_path).unwrap().step,
        ck.step + 3,
        "the resumed run ends at its last step"
    );
}
