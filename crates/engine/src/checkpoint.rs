//! Checkpoints in safetensors.
//!
//! Tensors: the weights under nanoGPT's names (`transformer.h.0.attn.c_attn.weight`, ... and
//! `lm_head.weight`, a copy of the tied token embedding), so `torch` / nanoGPT can load them; and
//! the optimizer state as `optim.m.<name>` and `optim.v.<name>` (FP32). The weights are the FP32
//! master weights. Metadata: `format` = `duet-checkpoint`, `version`, the config (TOML), the step,
//! the data sampler's RNG state, the loss-scaler state and the duet version.
//!
//! Writes are atomic: a temporary file in the same folder, flushed to disk, then renamed over the
//! destination. A failed save leaves the previous checkpoint untouched.

use crate::config::Config;
use crate::dataset::io_message;
use crate::model::param_specs;
use crate::{EngineError, Result};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

pub const FORMAT: &str = "duet-checkpoint";
pub const VERSION: &str = "1";

/// The files a run gathers in its `--out` folder.
pub mod files {
    /// The latest checkpoint (what `--resume DIR` loads).
    pub const CHECKPOINT: &str = "checkpoint.safetensors";
    /// The run's configuration as TOML (what `--config` reads).
    pub const CONFIG: &str = "config.toml";
    /// One JSON object per step (see [`crate::run::MetricsLog`]).
    pub const METRICS: &str = "metrics.jsonl";
    /// The same records as CSV ([`crate::run::CSV_COLUMNS`]).
    pub const METRICS_CSV: &str = "metrics.csv";
    /// The loss curve, drawn from the metrics at the end.
    pub const LOSS_PLOT: &str = "loss.svg";
}

/// The safetensors metadata keys of a checkpoint.
pub mod keys {
    pub const FORMAT: &str = "format";
    pub const VERSION: &str = "version";
    /// The config, as TOML.
    pub const CONFIG: &str = "config";
    pub const STEP: &str = "step";
    pub const DATA_STATE: &str = "data_state";
    pub const LOSS_SCALE: &str = "loss_scale";
    pub const LOSS_SCALE_CLEAN_STEPS: &str = "loss_scale_clean_steps";
    pub const DUET_VERSION: &str = "duet_version";
    /// blake3 of the run's tokenizer (its canonical tokenizer.json), when the run has one
    /// (`train.data.tokenizer_hash` of the config; absent in older checkpoints and without a
    /// tokenizer). Written for readers that do not parse the config; loading reads the config's.
    pub const TOKENIZER_HASH: &str = "tokenizer_hash";
    /// Every key, in the order they are written.
    pub const ALL: [&str; 9] = [
        FORMAT,
        VERSION,
        CONFIG,
        STEP,
        DATA_STATE,
        LOSS_SCALE,
        LOSS_SCALE_CLEAN_STEPS,
        DUET_VERSION,
        TOKENIZER_HASH,
    ];
}

/// Everything needed to continue a run exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    pub config: Config,
    /// Steps completed.
    pub step: u64,
    /// FP32 master weights in `param_specs` order.
    pub weights: Vec<Vec<f32>>,
    pub adam_m: Vec<Vec<f32>>,
    pub adam_v: Vec<Vec<f32>>,
    /// State of the data sampler after the last consumed batch.
    pub data_state: u64,
    /// Loss scaler: (scale, clean steps since the last change), when one is in use.
    pub loss_scaler: Option<(f32, u64)>,
    /// Free-form extra state (e.g. FP8 scaling metadata as JSON), stored as metadata.
    pub extra: HashMap<String, String>,
}

fn ck_err(path: &Path, message: impl Into<String>) -> EngineError {
    EngineError::Checkpoint {
        path: path.display().to_string(),
        message: message.into(),
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Replaces `path` with `bytes` so that a crash leaves either the old file or the new one:
/// a temporary file in the same folder, fsync, rename (the temporary file is removed when a step
/// fails).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?
        .to_string_lossy()
        .to_string();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Removes the temporary files [`write_atomic`] leaves in `dir` when a process is killed between
/// creating and renaming one (`.<name>.tmp-<pid>`; a SIGKILL during a save leaves them forever).
/// Only for a folder the caller holds exclusively (`duet train`'s `--out`, under its lock): no
/// other process's save can be in flight there. Returns the removed files and their total size.
pub fn remove_stale_temporaries(dir: &Path) -> std::io::Result<(Vec<std::path::PathBuf>, u64)> {
    let mut removed = Vec::new();
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((stem, pid)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")) else {
            continue;
        };
        let ours = pid == std::process::id().to_string();
        if stem.is_empty() || ours || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        std::fs::remove_file(entry.path())?;
        bytes += meta.len();
        removed.push(entry.path());
    }
    removed.sort();
    Ok((removed, bytes))
}

/// The same safetensors file with its JSON header's keys (the tensors' and `__metadata__`'s) in
/// sorted order: `safetensors::serialize` writes the metadata from a `HashMap`, whose order
/// differs from one map to the next, so two identical checkpoints had different bytes. The data
/// section is unchanged (its offsets are relative to its start); the header is padded with
/// spaces to 8 bytes as the format requires.
fn canonical_header(bytes: Vec<u8>) -> std::result::Result<Vec<u8>, String> {
    use std::collections::BTreeMap;
    let n = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
        .ok_or("no header length")?;
    let header = bytes.get(8..8 + n).ok_or("header past the end")?;
    let value: serde_json::Value = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    let top = value.as_object().ok_or("header is not an object")?;
    let mut sorted: BTreeMap<&str, serde_json::Value> = BTreeMap::new();
    for (k, v) in top {
        let v = match (k.as_str(), v.as_object()) {
            ("__metadata__", Some(m)) => {
                serde_json::to_value(m.iter().collect::<BTreeMap<&String, &serde_json::Value>>())
                    .map_err(|e| e.to_string())?
            }
            _ => v.clone(),
        };
        sorted.insert(k, v);
    }
    let mut json = serde_json::to_vec(&sorted).map_err(|e| e.to_string())?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len() + bytes.len() - 8 - n);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    Ok(out)
}

impl Checkpoint {
    /// Serialises to safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let specs = param_specs(&self.config.model);
        let n = specs.len();
        if self.weights.len() != n || self.adam_m.len() != n || self.adam_v.len() != n {
            return Err(EngineError::Config(
                "checkpoint state does not match the model".into(),
            ));
        }
        let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(3 * n + 1);
        for (i, s) in specs.iter().enumerate() {
            owned.push((s.name.clone(), s.shape.clone(), f32_bytes(&self.weights[i])));
            owned.push((
                format!("optim.m.{}", s.name),
                s.shape.clone(),
                f32_bytes(&self.adam_m[i]),
            ));
            owned.push((
                format!("optim.v.{}", s.name),
                s.shape.clone(),
                f32_bytes(&self.adam_v[i]),
            ));
        }
        owned.push((
            "lm_head.weight".into(),
            specs[0].shape.clone(),
            f32_bytes(&self.weights[0]),
        ));
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(name, shape, data)| {
                (
                    name.clone(),
                    TensorView::new(Dtype::F32, shape.clone(), data).expect("consistent view"),
                )
            })
            .collect();
        let mut meta = self.extra.clone();
        meta.insert(keys::FORMAT.into(), FORMAT.into());
        meta.insert(keys::VERSION.into(), VERSION.into());
        meta.insert(keys::CONFIG.into(), self.config.to_toml());
        meta.insert(keys::STEP.into(), self.step.to_string());
        meta.insert(keys::DATA_STATE.into(), self.data_state.to_string());
        if let Some((scale, clean)) = self.loss_scaler {
            meta.insert(keys::LOSS_SCALE.into(), scale.to_string());
            meta.insert(keys::LOSS_SCALE_CLEAN_STEPS.into(), clean.to_string());
        }
        meta.insert(keys::DUET_VERSION.into(), env!("CARGO_PKG_VERSION").into());
        let hash = &self.config.train.data.tokenizer_hash;
        if !hash.is_empty() {
            meta.insert(keys::TOKENIZER_HASH.into(), hash.clone());
        }
        let bytes = safetensors::serialize(views, Some(meta))
            .map_err(|e| EngineError::Config(format!("cannot serialise checkpoint: {e}")))?;
        canonical_header(bytes)
            .map_err(|e| EngineError::Config(format!("cannot serialise checkpoint: {e}")))
    }

    /// Writes atomically ([`write_atomic`]).
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        write_atomic(path, &bytes)
            .map_err(|e| ck_err(path, format!("cannot write checkpoint: {}", io_message(&e))))
    }

    pub fn load(path: &Path) -> Result<Checkpoint> {
        // The file, then its tensors parsed into f32 vectors: twice its size, checked before
        // either is allocated.
        if let Ok(m) = std::fs::metadata(path) {
            crate::check_host_memory(m.len().saturating_mul(2), || {
                format!("loading the checkpoint {}", path.display())
            })?;
        }
        let bytes = crate::dataset::read_regular(path).map_err(|e| ck_err(path, io_message(&e)))?;
        Self::from_bytes(&bytes).map_err(|m| ck_err(path, m))
    }

    /// Parses and validates: format, config, every tensor present with the right dtype and shape,
    /// and finite values.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Checkpoint, String> {
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| format!("not a safetensors file (truncated or corrupt): {e}"))?;
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| format!("not a safetensors file (truncated or corrupt): {e}"))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let get = |k: &str| {
            meta.get(k)
                .ok_or_else(|| format!("missing metadata '{k}' (not a duet checkpoint?)"))
        };
        if get(keys::FORMAT)? != FORMAT {
            return Err(format!(
                "metadata format is '{}', expected '{FORMAT}'",
                get(keys::FORMAT)?
            ));
        }
        if get(keys::VERSION)? != VERSION {
            return Err(format!(
                "checkpoint version {} is not supported (expected {VERSION})",
                get(keys::VERSION)?
            ));
        }
        let config = Config::from_toml_exact(get(keys::CONFIG)?)
            .map_err(|e| format!("bad config in checkpoint: {e}"))?;
        config
            .validate()
            .map_err(|e| format!("bad config in checkpoint: {e}"))?;
        let step: u64 = get(keys::STEP)?
            .parse()
            .map_err(|_| "bad step in checkpoint".to_string())?;
        let data_state: u64 = get(keys::DATA_STATE)?
            .parse()
            .map_err(|_| "bad data_state".to_string())?;
        let loss_scaler = match (
            meta.get(keys::LOSS_SCALE),
            meta.get(keys::LOSS_SCALE_CLEAN_STEPS),
        ) {
            (Some(s), Some(c)) => Some((
                s.parse().map_err(|_| "bad loss_scale".to_string())?,
                c.parse()
                    .map_err(|_| "bad loss_scale_clean_steps".to_string())?,
            )),
            _ => None,
        };
        let read = |name: &str, shape: &[usize]| -> std::result::Result<Vec<f32>, String> {
            let t = st
                .tensor(name)
                .map_err(|_| format!("tensor '{name}' is missing"))?;
            if t.dtype() != Dtype::F32 {
                return Err(format!("tensor '{name}' is {:?}, expected F32", t.dtype()));
            }
            if t.shape() != shape {
                return Err(format!(
                    "tensor '{name}' has shape {:?}, the config needs {shape:?}",
                    t.shape()
                ));
            }
            let v: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(format!("tensor '{name}' holds a non-finite value at {i}"));
            }
            Ok(v)
        };
        let specs = param_specs(&config.model);
        let mut weights = Vec::with_capacity(specs.len());
        let mut adam_m = Vec::with_capacity(specs.len());
        let mut adam_v = Vec::with_capacity(specs.len());
        for s in &specs {
            weights.push(read(&s.name, &s.shape)?);
            adam_m.push(read(&format!("optim.m.{}", s.name), &s.shape)?);
            adam_v.push(read(&format!("optim.v.{}", s.name), &s.shape)?);
        }
        let reserved = keys::ALL;
        let extra = meta
            .into_iter()
            .filter(|(k, _)| !reserved.contains(&k.as_str()))
            .collect();
        Ok(Checkpoint {
            config,
            step,
            weights,
            adam_m,
            adam_v,
            data_state,
            loss_scaler,
            extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temporaries_of_killed_saves_are_removed_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("duet-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stale = [".checkpoint.safetensors.tmp-12345", ".config.toml.tmp-7"];
        let kept = [
            "checkpoint.safetensors",
            ".checkpoint.safetensors.tmp-",
            ".checkpoint.safetensors.tmp-12x",
            "notes.tmp-3",
            ".duet.lock",
        ];
        for f in stale.iter().chain(&kept) {
            std::fs::write(dir.join(f), b"0123456789").unwrap();
        }
        // This process's own temporary is never touched.
        let own = format!(".checkpoint.safetensors.tmp-{}", std::process::id());
        std::fs::write(dir.join(&own), b"x").unwrap();
        let (removed, bytes) = remove_stale_temporaries(&dir).unwrap();
        let names: Vec<String> = removed
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            vec![".checkpoint.safetensors.tmp-12345", ".config.toml.tmp-7"]
        );
        assert_eq!(bytes, 20);
        for f in kept.iter().map(|s| s.to_string()).chain([own]) {
            assert!(dir.join(&f).exists(), "{f} was removed");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
    use crate::config::Preset;
    use crate::model::init_weights;

    fn sample() -> Checkpoint {
        let config = Config::preset(Preset::Tiny);
        let weights = init_weights(&config.model, 3);
        let adam_m = weights
            .iter()
            .map(|w| w.iter().map(|x| x * 0.5).collect())
            .collect();
        let adam_v = weights
            .iter()
            .map(|w| w.iter().map(|x| x * x).collect())
            .collect();
        Checkpoint {
            config,
            step: 7,
            weights,
            adam_m,
            adam_v,
            data_state: 12345,
            loss_scaler: Some((1024.0, 3)),
            extra: HashMap::from([("fp8".to_string(), "{}".to_string())]),
        }
    }

    /// The same checkpoint serialised again gives the same bytes (each serialisation builds its
    /// metadata map afresh, in another hash order, as two runs do), and the header is sorted.
    #[test]
    fn checkpoint_bytes_are_reproducible() {
        let mut c = sample();
        for i in 0..6 {
            c.extra.insert(format!("extra.{i}"), i.to_string());
        }
        let first = c.to_bytes().unwrap();
        for _ in 0..8 {
            assert!(
                c.clone().to_bytes().unwrap() == first,
                "checkpoint bytes differ"
            );
        }
        let n = u64::from_le_bytes(first[..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let header = std::str::from_utf8(&first[8..8 + n]).unwrap();
        let at = |k: &str| header.find(&format!("\"{k}\"")).unwrap();
        assert!(at("config") < at("data_state") && at("data_state") < at("duet_version"));
        assert_eq!(Checkpoint::from_bytes(&first).unwrap(), c);
    }

    #[test]
    fn roundtrip() {
        let c = sample();
        let back = Checkpoint::from_bytes(&c.to_bytes().unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn corrupt_and_truncated_are_errors() {
        let bytes = sample().to_bytes().unwrap();
        assert!(
            Checkpoint::from_bytes(&bytes[..bytes.len() / 2])
                .unwrap_err()
                .contains("truncated")
        );
        assert!(Checkpoint::from_bytes(b"garbage").is_err());
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(
            Checkpoint::from_bytes(&bad)
                .unwrap_err()
                .contains("non-finite")
        );
    }

    #[test]
    fn atomic_save_keeps_the_old_file_on_failure() {
        let dir = std::env::temp_dir().join(format!("duet-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.safetensors");
        let c = sample();
        c.save(&path).unwrap();
        let before = std::fs::read(&path).unwrap();
        // A checkpoint that cannot be serialised (wrong tensor count) must not touch the file.
        let mut broken = c.clone();
        broken.weights.pop();
        assert!(broken.save(&path).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // Saving into a missing folder fails cleanly.
        assert!(c.save(&dir.join("nope/c.safetensors")).is_err());
        assert_eq!(Checkpoint::load(&path).unwrap(), c);
    }
}
