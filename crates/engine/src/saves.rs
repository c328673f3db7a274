//! A run's checkpoints in its `--out` folder: step-numbered files
//! (`checkpoint-00000500.safetensors`), the newest `keep` of them kept, `checkpoint.safetensors`
//! always the latest (what `--resume DIR` loads) and, with `keep_best`,
//! `checkpoint-best.safetensors` the one with the lowest validation loss so far.
//!
//! The latest and best names are hard links to a step-numbered file (one copy on disk; a copy
//! where the filesystem has no hard links), each replaced atomically (link under a temporary
//! name, then renamed over), so every name always holds a complete checkpoint. A checkpoint
//! saved at a step with a validation loss records it in its metadata ([`VAL_LOSS`]), which is
//! how a resumed run knows the best so far.

use crate::checkpoint::{Checkpoint, files, write_atomic};
use crate::dataset::io_message;
use crate::train::Trainer;
use crate::{EngineError, Result};
use duet_device::Device;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Checkpoint metadata key: the validation loss at the checkpoint's step, where one was
/// computed (decimal f32).
pub const VAL_LOSS: &str = "val_loss";

/// The best checkpoint's name in the folder.
pub const BEST: &str = "checkpoint-best.safetensors";

/// Where and how a run keeps its checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointDir {
    pub dir: PathBuf,
    /// Step-numbered checkpoints kept: the newest `keep` (0 keeps all).
    pub keep: usize,
    /// Also keep the checkpoint with the lowest validation loss as [`BEST`].
    pub keep_best: bool,
    /// Metadata written into every checkpoint saved here besides the trainer's (the run's
    /// settings that `duet train --resume` restores, as JSON).
    pub stamp: Vec<(String, String)>,
}

/// What one save did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Saved {
    pub path: PathBuf,
    /// The new best (its validation loss), when this save became [`BEST`].
    pub best: Option<f32>,
    /// Step-numbered files removed to keep `keep`.
    pub removed: Vec<PathBuf>,
}

fn io(path: &Path, what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Io {
        path: path.display().to_string(),
        message: format!("{what}: {e}"),
    }
}

impl CheckpointDir {
    /// `checkpoint.safetensors`: the latest save.
    pub fn latest(&self) -> PathBuf {
        self.dir.join(files::CHECKPOINT)
    }

    /// The step-numbered file of `step`.
    pub fn numbered(&self, step: u64) -> PathBuf {
        self.dir.join(format!("checkpoint-{step:08}.safetensors"))
    }

    pub fn best(&self) -> PathBuf {
        self.dir.join(BEST)
    }

    /// The step-numbered checkpoints in the folder, by step.
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>> {
        let mut v = Vec::new();
        let rd = std::fs::read_dir(&self.dir)
            .map_err(|e| io(&self.dir, "cannot list", io_message(&e)))?;
        for entry in rd {
            let entry = entry.map_err(|e| io(&self.dir, "cannot list", io_message(&e)))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let step = name
                .strip_prefix("checkpoint-")
                .and_then(|n| n.strip_suffix(".safetensors"))
                .filter(|n| n.len() >= 8 && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(step) = step {
                v.push((step, entry.path()));
            }
        }
        v.sort();
        Ok(v)
    }

    /// The validation loss recorded in [`BEST`], if it exists and records one.
    pub fn best_val_loss(&self) -> Option<f32> {
        read_metadata(&self.best())
            .ok()?
            .get(VAL_LOSS)?
            .parse()
            .ok()
    }

    /// With `keep_best`, on resume: a run killed between linking a save as the latest and as
    /// the best left [`BEST`] on an older, worse checkpoint, and the better one would be lost
    /// once `keep` rotates it out. When the latest checkpoint records a finite validation loss
    /// below the best's (or there is no best), [`BEST`] is linked to it. Returns that loss when
    /// it re-linked.
    pub fn repair_best(&self) -> Result<Option<f32>> {
        if !self.keep_best || !self.latest().exists() {
            return Ok(None);
        }
        let latest_val = read_metadata(&self.latest())?
            .get(VAL_LOSS)
            .and_then(|v| v.parse::<f32>().ok())
            .filter(|v| v.is_finite());
        let Some(v) = latest_val else {
            return Ok(None);
        };
        if self.best_val_loss().is_some_and(|b| b <= v) {
            return Ok(None);
        }
        let bytes = std::fs::read(self.latest())
            .map_err(|e| io(&self.latest(), "cannot read checkpoint", io_message(&e)))?;
        link_over(&self.latest(), &self.best(), &bytes)?;
        Ok(Some(v))
    }

    /// Saves `ck` (at its step) as its step-numbered file, points the latest name at it and,
    /// with `keep_best`, the best name when `val_loss` beats the best so far; then removes the
    /// step-numbered files beyond `keep` (never the one just written).
    pub fn save(&self, ck: &Checkpoint, val_loss: Option<f32>) -> Result<Saved> {
        let mut ck = ck.clone();
        ck.extra.extend(self.stamp.iter().cloned());
        if let Some(v) = val_loss {
            ck.extra.insert(VAL_LOSS.into(), v.to_string());
        }
        let bytes = ck.to_bytes()?;
        let path = self.numbered(ck.step);
        write_atomic(&path, &bytes)
            .map_err(|e| io(&path, "cannot write checkpoint", io_message(&e)))?;
        link_over(&path, &self.latest(), &bytes)?;
        let mut saved = Saved {
            path: path.clone(),
            ..Saved::default()
        };
        if self.keep_best
            && let Some(v) = val_loss.filter(|v| v.is_finite())
            && self.best_val_loss().is_none_or(|b| v < b)
        {
            link_over(&path, &self.best(), &bytes)?;
            saved.best = Some(v);
        }
        if self.keep > 0 {
            let all = self.list()?;
            let excess = all.len().saturating_sub(self.keep);
            for (_, p) in all.into_iter().take(excess) {
                if p == path {
                    continue;
                }
                std::fs::remove_file(&p).map_err(|e| io(&p, "cannot remove", io_message(&e)))?;
                saved.removed.push(p);
            }
        }
        Ok(saved)
    }
}

/// Saves the trainer's checkpoint into `saves` from rank 0 (every rank calls it: under ZeRO
/// each takes part in gathering the optimizer state); `None` on the other ranks.
pub fn save_to<D: Device>(
    trainer: &Trainer<D>,
    saves: &CheckpointDir,
    val_loss: Option<f32>,
    is_main: bool,
) -> Result<Option<Saved>> {
    let zero = trainer.dist().is_some_and(|d| d.zero());
    if !(is_main || zero) {
        return Ok(None);
    }
    let ck = trainer.checkpoint()?;
    if !is_main {
        return Ok(None);
    }
    saves.save(&ck, val_loss).map(Some)
}

/// Makes `name` a hard link to `target` (a copy of `bytes` where links are not supported),
/// replacing whatever `name` was in one rename.
fn link_over(target: &Path, name: &Path, bytes: &[u8]) -> Result<()> {
    let file = name.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = name.with_file_name(format!(
        ".{}.tmp-{}",
        file.unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    match std::fs::hard_link(target, &tmp) {
        Ok(()) => std::fs::rename(&tmp, name).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(name, "cannot replace", io_message(&e))
        }),
        Err(_) => write_atomic(name, bytes)
            .map_err(|e| io(name, "cannot write checkpoint", io_message(&e))),
    }
}

/// The `__metadata__` of a safetensors file, reading only its header.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| io(path, "cannot open", io_message(&e)))?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| io(path, "not a safetensors file", e))?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(io(path, "not a safetensors file", "header over 100 MB"));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| io(path, "not a safetensors file", e))?;
    let v: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| io(path, "not a safetensors file", e))?;
    Ok(v["__metadata__"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default())
}
