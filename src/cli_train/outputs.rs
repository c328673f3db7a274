//! The files a training run reads and writes: overwrite checks, the `--out` lock, checkpoint
//! paths.

use super::TrainOptions;
use crate::CliResult;
use duet_engine::Config;
use duet_engine::checkpoint::files;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// Whether two paths name the same file, the second of which need not exist yet (its folder is
/// resolved instead). Two existing paths are the same file when they are the same inode of the
/// same device: hard links and bind mounts too, which no spelling or canonical path shows (a
/// hard link of the corpus given as `--metrics` used to pass, and the corpus was replaced by
/// JSON). Otherwise compared after resolving `.`, `..` and links.
pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
        return x.dev() == y.dev() && x.ino() == y.ino();
    }
    let resolve = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = std::fs::canonicalize(p) {
            return Some(c);
        }
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
    };
    match (resolve(a), resolve(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum LogKind {
    Metrics,
    Trace,
    /// `--record-batches`: a batch record (it starts with `DUETBAT1`).
    Batches,
}

/// Whether writing `--metrics`/`--trace` to `p` replaces nothing but duet's own log of `kind`:
/// `p` does not exist, is empty, is not a regular file (a pipe or device is written, never
/// read), or its first line is a metrics record (`"step"`) / a trace header (`"kind":
/// "header"`). Only the first line is read (at most 64 KiB).
fn is_duet_log(p: &Path, kind: LogKind) -> bool {
    use std::io::Read;
    let Ok(meta) = std::fs::metadata(p) else {
        return true;
    };
    if !meta.is_file() || meta.len() == 0 {
        return true;
    }
    let mut head = vec![0u8; 64 << 10];
    let n = match std::fs::File::open(p).and_then(|mut f| f.read(&mut head)) {
        Ok(n) => n,
        Err(_) => return false,
    };
    if kind == LogKind::Batches {
        return head[..n].starts_with(duet_engine::train::BATCH_RECORD_MAGIC);
    }
    let first = head[..n].split(|&b| b == b'\n').next().unwrap_or(&[]);
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(first) else {
        return false;
    };
    match kind {
        LogKind::Metrics => v.get("step").is_some_and(|s| s.is_u64()),
        LogKind::Trace => v.get("kind").and_then(|k| k.as_str()) == Some("header"),
        LogKind::Batches => false,
    }
}

fn not_duet_log(what: &str, p: &Path) -> Box<dyn std::error::Error + Send + Sync> {
    let kind = match what {
        "--trace" => "duet trace",
        "--record-batches" => "duet batch record",
        _ => "duet metrics log",
    };
    format!(
        "{what} {} exists and is not a {kind} (a checkpoint, a corpus or another file would be \
         truncated): choose another path, or give --overwrite to replace it",
        p.display()
    )
    .into()
}

/// Whether `dir` is another duet run's `--out` folder right now: it holds a `.duet.lock` that
/// some process has locked.
fn locked_by_another_run(dir: &Path) -> bool {
    let lock = dir.join(".duet.lock");
    let Ok(f) = std::fs::OpenOptions::new().read(true).open(&lock) else {
        return false;
    };
    matches!(f.try_lock_shared(), Err(std::fs::TryLockError::WouldBlock))
}

/// Refuses a run whose output files (metrics, trace, and in `--out` the checkpoint, config and
/// loss plot) would overwrite one of its inputs (data, config, the checkpoint it resumes
/// from) or one another: it would destroy the input, or interleave two logs into one file.
pub(super) fn check_no_overwrite(
    opts: &TrainOptions,
    cfg: &Config,
    metrics: Option<&Path>,
    trace: Option<&Path>,
) -> CliResult<()> {
    // (what, path, whether it is a checkpoint)
    let mut inputs: Vec<(String, PathBuf, bool)> = Vec::new();
    for d in &cfg.train.data.data {
        inputs.push(("--data".into(), PathBuf::from(d), false));
    }
    for d in &cfg.train.data.val_data {
        inputs.push(("--val-data".into(), PathBuf::from(d), false));
    }
    if let Some(c) = &opts.model.base.config {
        inputs.push(("--config".into(), c.clone(), false));
    }
    if let Some(r) = &opts.resume {
        inputs.push((
            "the checkpoint resumed from".into(),
            checkpoint_path(r),
            true,
        ));
    }
    let mut outputs: Vec<(String, PathBuf, bool)> = Vec::new();
    if let Some(m) = metrics {
        outputs.push(("the metrics file".into(), m.to_path_buf(), false));
    }
    if let Some(t) = trace {
        outputs.push(("the trace".into(), t.to_path_buf(), false));
    }
    if let Some(r) = &opts.record_batches {
        outputs.push(("--record-batches".into(), r.clone(), false));
    }
    if let Some(dir) = &opts.out {
        for f in [files::CHECKPOINT, files::CONFIG, files::LOSS_PLOT] {
            outputs.push((format!("--out's {f}"), dir.join(f), f == files::CHECKPOINT));
        }
    }
    // A log file inside another run's locked --out would overwrite that run's files.
    // (The run's own --out is checked when it takes the folder's lock.)
    for (what, p, _) in &outputs {
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let own = opts.out.as_deref().is_some_and(|o| same_file(dir, o));
        if !own && locked_by_another_run(dir) {
            return Err(format!(
                "{what} ({}) is inside {}, the --out folder of a duet run that is running now: \
                 choose another path",
                p.display(),
                dir.display()
            )
            .into());
        }
    }
    for (i, (what, p, p_ck)) in outputs.iter().enumerate() {
        for (other, q, q_ck) in inputs.iter().chain(&outputs[..i]) {
            // Resuming in place rewrites the checkpoint it started from, as intended.
            if same_file(p, q) && !(*p_ck && *q_ck) {
                return Err(format!(
                    "{what} ({}) is the same file as {other}: choose another path",
                    p.display()
                )
                .into());
            }
        }
    }
    // --metrics and --trace truncate (a resumed run's metrics are trimmed and appended to):
    // only a file that reads as duet's own log of that kind is replaced without --overwrite.
    if !opts.overwrite {
        for (what, p, kind) in [
            ("--metrics", opts.metrics.as_deref(), LogKind::Metrics),
            ("--trace", opts.trace.as_deref(), LogKind::Trace),
            (
                "--record-batches",
                opts.record_batches.as_deref(),
                LogKind::Batches,
            ),
        ] {
            let Some(p) = p else { continue };
            // (A resumed run trims its metrics file and appends: the same rule.)
            if !is_duet_log(p, kind) {
                return Err(not_duet_log(what, p));
            }
        }
    }
    Ok(())
}

/// Takes the `--out` folder's lock file, so that two runs never write into one folder.
pub(super) fn lock_out(dir: &Path) -> CliResult<File> {
    let path = dir.join(".duet.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}", duet_engine::dataset::at_path(&path, &e)))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another duet run is writing into {} (it holds {})",
            dir.display(),
            path.display()
        )
        .into()),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(format!("cannot lock {}", duet_engine::dataset::at_path(&path, &e)).into())
        }
    }
}

/// Where a run without `--out` saves its checkpoint when interrupted: duet-interrupted.safetensors,
/// or the first of duet-interrupted-2.safetensors, -3, ... that does not exist (another run's
/// checkpoint is never overwritten).
pub(super) fn interrupted_path() -> PathBuf {
    (1..)
        .map(|i| match i {
            1 => PathBuf::from("duet-interrupted.safetensors"),
            i => PathBuf::from(format!("duet-interrupted-{i}.safetensors")),
        })
        .find(|p| !p.exists())
        .expect("an unused name")
}

/// A checkpoint path given as the file or the `--out` folder holding it.
pub(crate) fn checkpoint_path(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join(files::CHECKPOINT)
    } else {
        p.to_path_buf()
    }
}

/// Checks that a log file can be written without touching an existing one (a run that fails
/// before training must not destroy the previous run's logs), and locks a regular file for the
/// run's life: the returned handle holds the lock until it is dropped, so a second run given
/// the same file is refused here, before it truncates anything, instead of tearing the first
/// run's log (pipes and devices are not locked).
pub(super) fn lock_log(path: &Path, what: &str) -> CliResult<Option<File>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| {
            format!(
                "cannot create {what} file {}",
                duet_engine::dataset::at_path(path, &e)
            )
        })?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "{what} file {} is being written by another duet run now (it holds a lock on \
             the file): choose another path",
            path.display()
        )
        .into()),
        Err(std::fs::TryLockError::Error(e)) => Err(format!(
            "cannot lock {what} file {}",
            duet_engine::dataset::at_path(path, &e)
        )
        .into()),
    }
}

pub(super) fn open_log(path: &Path, append: bool, what: &str) -> CliResult<BufWriter<File>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| {
            format!(
                "cannot create {what} file {}",
                duet_engine::dataset::at_path(path, &e)
            )
        })?;
    Ok(BufWriter::new(f))
}
