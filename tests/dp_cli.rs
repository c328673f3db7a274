//! `duet train --gpus` and torchrun-style launches: what is refused, and how (no GPU needed).

use std::process::Command;

fn duet(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_duet"));
    c.args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("DUET_BACKEND");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run duet");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn uneven_global_batch_is_refused_before_anything_starts() {
    let (ok, err) = duet(
        &[
            "train",
            "--preset",
            "tiny",
            "--backend",
            "cuda",
            "--gpus",
            "2",
            "--batch",
            "15",
        ],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("--batch 15") && err.contains("multiple of 2"),
        "{err}"
    );
}

#[test]
fn the_cpu_backend_has_no_multi_process_collective() {
    let (ok, err) = duet(&["train", "--preset", "tiny", "--gpus", "2"], &[]);
    assert!(!ok);
    assert!(err.contains("needs a GPU backend"), "{err}");
    // A rank started by an external launcher gets the same answer.
    let (ok, err) = duet(
        &["train", "--preset", "tiny", "--steps", "1"],
        &[("RANK", "0"), ("WORLD_SIZE", "1")],
    );
    assert!(!ok);
    assert!(err.contains("needs a GPU backend"), "{err}");
}

#[test]
fn bad_launch_variables_and_zero_stage_are_named() {
    let (ok, err) = duet(
        &["train", "--preset", "tiny", "--steps", "1"],
        &[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
    );
    assert!(!ok);
    assert!(err.contains("RANK=2 must be below WORLD_SIZE=2"), "{err}");
    let (ok, err) = duet(&["train", "--preset", "tiny", "--zero", "3"], &[]);
    assert!(!ok);
    assert!(err.contains("--zero takes 0 or 1"), "{err}");
}
