//! Helpers shared by the command-line tests.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the `duet` binary with `args` (ignoring any `DUET_BACKEND` of the caller) in a folder
/// private to this test process: what a run writes into the current folder (a run on data
/// without `--out` saves into `runs/`) stays out of the repository.
pub fn duet(args: &[&str]) -> Output {
    let cwd = tmp("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(args)
        .current_dir(&cwd)
        .env_remove("DUET_BACKEND")
        .output()
        .expect("runs duet")
}

/// A path for `name` in a folder private to this test process. The folder is named by the
/// process id, so one left behind by an earlier process with the same id (ids are reused) is
/// emptied on this process's first call: no test finds another run's files there.
pub fn tmp(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("duet-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    dir.join(name)
}

/// Fails the test with duet's stderr unless the run succeeded.
pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "duet failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
