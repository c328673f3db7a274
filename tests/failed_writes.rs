//! A metrics or trace write that fails (a full disk, a closed pipe) stops the run with the file
//! named and a checkpoint saved, as an interrupt does; when the checkpoint cannot be written
//! either, the previous one stays intact and both failures are named. Full disks are real:
//! `/dev/full`, and a size-limited tmpfs where the test may mount one (root; CI runs as root).

mod common;

use common::{assert_success, duet, tmp};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const TINY: [&str; 5] = ["train", "--preset", "tiny", "--log-every", "0"];

/// A tmpfs of `size` mounted at a fresh folder; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// None (after printing `SKIP <test>: <reason>`) where this process may not mount one.
    fn mount(name: &str, size: &str, test: &str) -> Option<Self> {
        let dir = tmp(name);
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                s(&dir),
            ])
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self(dir)),
            Ok(o) => {
                eprintln!(
                    "SKIP {test}: cannot mount a tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIP {test}: cannot run mount: {e}");
                None
            }
        }
    }

    /// Fills the filesystem, then frees `leave` bytes again.
    fn fill_leaving(&self, leave: u64) {
        let filler = self.0.join("filler");
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => panic!("filling {}: {e}", filler.display()),
            }
        }
        let _ = f.flush();
        let len = std::fs::metadata(&filler).unwrap().len();
        f.set_len(len.saturating_sub(leave)).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

#[test]
fn a_failed_log_write_saves_a_checkpoint_and_names_the_file() {
    for (flag, what) in [("--metrics", "the metrics file"), ("--trace", "the trace")] {
        let out_dir = tmp(&format!("devfull{flag}"));
        let out = duet(
            &[
                &TINY[..],
                &["--steps", "20", flag, "/dev/full", "--out", s(&out_dir)],
            ]
            .concat(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains(&format!("writing {what} /dev/full failed at step")),
            "{err}"
        );
        assert!(
            err.to_lowercase().contains("no space left on device"),
            "{err}"
        );
        assert!(!err.contains("os error"), "{err}");
        assert!(
            err.contains(&format!(
                "saved to {}",
                s(&out_dir.join("checkpoint.safetensors"))
            )),
            "{err}"
        );
        assert!(err.contains("resume with: duet train --resume"), "{err}");
        // The checkpoint resumes to the end.
        assert_success(&duet(&[
            "train",
            "--resume",
            s(&out_dir),
            "--out",
            s(&out_dir),
            "--log-every",
            "0",
        ]));
    }
}

#[test]
fn a_full_disk_stops_the_run_and_the_resumed_run_ends_as_an_uninterrupted_one() {
    let test = "a_full_disk_stops_the_run_and_the_resumed_run_ends_as_an_uninterrupted_one";
    let Some(fs) = Tmpfs::mount("full-metrics", "1m", test) else {
        return;
    };
    let full = tmp("full-reference");
    assert_success(&duet(
        &[&TINY[..], &["--steps", "300", "--out", s(&full)]].concat(),
    ));
    // 300 metrics lines are ~60 KB: 16 KiB of room runs out part-way.
    fs.fill_leaving(16 << 10);
    let run = tmp("full-run");
    let metrics = fs.0.join("metrics.jsonl");
    let out = duet(
        &[
            &TINY[..],
            &["--steps", "300", "--metrics", s(&metrics), "--out", s(&run)],
        ]
        .concat(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("writing the metrics file {} failed", s(&metrics))),
        "{err}"
    );
    assert!(
        err.to_lowercase().contains("no space left on device"),
        "{err}"
    );
    assert!(!err.contains("os error"), "{err}");
    assert!(err.contains("checkpoint at step"), "{err}");
    // The disk made room again: the resumed run ends where the uninterrupted one did, byte for
    // byte.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    assert_success(&duet(&[
        "train",
        "--resume",
        s(&run),
        "--out",
        s(&run),
        "--metrics",
        s(&metrics),
        "--log-every",
        "0",
    ]));
    assert_eq!(
        std::fs::read(run.join("checkpoint.safetensors")).unwrap(),
        std::fs::read(full.join("checkpoint.safetensors")).unwrap()
    );
}

#[test]
fn when_the_checkpoint_cannot_be_saved_either_the_previous_one_stays_intact() {
    let test = "when_the_checkpoint_cannot_be_saved_either_the_previous_one_stays_intact";
    let Some(fs) = Tmpfs::mount("full-both", "2m", test) else {
        return;
    };
    let run = fs.0.join("run");
    assert_success(&duet(
        &[
            &TINY[..],
            &["--steps", "300", "--stop-after", "10", "--out", s(&run)],
        ]
        .concat(),
    ));
    let ck = run.join("checkpoint.safetensors");
    let before = std::fs::read(&ck).unwrap();
    // Room for the run's config.toml and a few KiB of metrics, not for a checkpoint (~270 KB).
    fs.fill_leaving(16 << 10);
    let out = duet(&[
        "train",
        "--resume",
        s(&run),
        "--out",
        s(&run),
        "--log-every",
        "0",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(&format!(
            "writing the metrics file {} failed",
            s(&run.join("metrics.jsonl"))
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("saving the checkpoint to {} failed too", s(&ck))),
        "{err}"
    );
    assert!(err.contains("is unchanged"), "{err}");
    assert_eq!(
        std::fs::read(&ck).unwrap(),
        before,
        "the checkpoint is intact"
    );
    assert_eq!(temporaries(&run), Vec::<String>::new());
    // And it still resumes once there is room.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    assert_success(&duet(&[
        "train",
        "--resume",
        s(&run),
        "--out",
        s(&run),
        "--stop-after",
        "5",
        "--log-every",
        "0",
    ]));
}

/// A file-size limit (`ulimit -f`, issue 51): the checkpoint's write fails with "file too large"
/// and the run ends with an error naming the file, instead of being killed by SIGXFSZ (exit 153,
/// nothing said).
#[test]
fn a_file_size_limit_is_an_error_naming_the_file_not_a_kill() {
    let dir = tmp("fsize-limit");
    // 64 blocks of 512 bytes (dash) or 1 KiB (bash): far below the tiny model's checkpoint.
    let cmd = format!(
        "ulimit -f 64 && exec {} train --preset tiny --log-every 0 --steps 3 --out {}",
        env!("CARGO_BIN_EXE_duet"),
        s(&dir)
    );
    let out = Command::new("sh").args(["-c", &cmd]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        out.status.code().is_some(),
        "killed by a signal ({:?}): {err}",
        out.status
    );
    assert!(
        err.contains(s(&dir)) && err.to_lowercase().contains("file too large"),
        "{err}"
    );
}
