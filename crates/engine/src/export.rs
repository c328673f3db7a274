//! Exporting a model's weights for other tools (`duet export`): Hugging Face's GPT-2
//! (`GPT2LMHeadModel.from_pretrained(dir)` loads the folder) and nanoGPT's state dict.
//!
//! **Hugging Face** (`--format hf`): `config.json` (a `GPT2Config`) and `model.safetensors` in
//! the layout `GPT2LMHeadModel.save_pretrained` writes: the names of its state dict
//! (`transformer.wte.weight`, `transformer.h.{i}.attn.c_attn.weight`, ...), the `Conv1D` weights
//! (`c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj`) transposed to `(in, out)`, no `lm_head.weight`
//! (tied: transformers points it at the token embedding), no `attn.bias` masks (non-persistent
//! buffers transformers builds itself), metadata `format = pt` (which `from_pretrained` requires).
//! duet's model is GPT-2's: biases on every linear layer and LayerNorm, GELU's tanh
//! approximation (`gelu_new`), LayerNorm epsilon [`LN_EPS`], no dropout.
//!
//! **nanoGPT** (`--format nanogpt`): `model.safetensors` with nanoGPT's names in `nn.Linear`'s
//! `(out, in)` layout and `lm_head.weight` (a copy of the embedding, as nanoGPT's tied state dict
//! has it), loadable with `load_state_dict(strict=True)`, and `config.json` with nanoGPT's model
//! args (`n_layer`, `n_head`, `n_embd`, `block_size`, `vocab_size`, `bias`, `dropout`; `n_inner`
//! only when the MLP is not nanoGPT's 4·`n_embd`).
//!
//! Both files are written in a fixed order, so one model always gives the same bytes, and
//! together or not at all ([`write_all_or_nothing`]); both load back with
//! [`crate::init::load_init_weights`].

use crate::config::ModelConfig;
use crate::dataset::io_message;
use crate::init::transpose;
use crate::model::{BlockParam, LN_EPS, check_weights, param_index, param_specs};
use crate::{EngineError, Result};
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The weights file of both formats.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The model description of both formats.
pub const CONFIG_FILE: &str = "config.json";
/// GPT-2's vocabulary; its end-of-text token (also its BOS) is the last id.
pub const GPT2_VOCAB: usize = 50257;

/// An export format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    HuggingFace,
    NanoGpt,
}

impl std::str::FromStr for ExportFormat {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hf" | "huggingface" => Ok(Self::HuggingFace),
            "nanogpt" => Ok(Self::NanoGpt),
            other => Err(EngineError::Config(format!(
                "unknown export format '{other}' (expected hf or nanogpt)"
            ))),
        }
    }
}

/// [`LN_EPS`] as the f64 it stands for (1e-5, not f32's 9.99999974e-6).
fn ln_eps() -> f64 {
    LN_EPS.to_string().parse().expect("a float")
}

/// `GPT2Config` for `cfg` as pretty JSON (keys sorted, as `save_pretrained` writes them), with
/// GPT-2's special tokens for its 50257-token vocabulary ([`hf_config_json_with`]).
pub fn hf_config_json(cfg: &ModelConfig) -> String {
    hf_config_json_with(cfg, None)
}

/// The end-of-text token [`hf_config_json_with`] names for `cfg`: `eos` when it is a token of
/// the vocabulary, else GPT-2's 50256 for GPT-2's vocabulary, else none.
pub fn hf_eos(cfg: &ModelConfig, eos: Option<u32>) -> Option<usize> {
    eos.map(|id| id as usize)
        .filter(|&id| id < cfg.vocab)
        .or((cfg.vocab == GPT2_VOCAB).then_some(GPT2_VOCAB - 1))
}

/// [`hf_config_json`] with the end-of-text token `eos` (the tokenizer's `<|endoftext|>`) as
/// `bos_token_id`, `eos_token_id` and `pad_token_id` (GPT-2's convention: one token for all
/// three; transformers' pipelines and `generate` stop at it and pad with it). Without one,
/// GPT-2's vocabulary gets GPT-2's 50256 and any other vocabulary null (`GPT2Config`'s default
/// 50256 is no token of it).
pub fn hf_config_json_with(cfg: &ModelConfig, eos: Option<u32>) -> String {
    let eos = hf_eos(cfg, eos);
    let id = match eos {
        Some(id) => serde_json::json!(id),
        None => serde_json::Value::Null,
    };
    let mut v = serde_json::json!({
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.0,
        "bos_token_id": id,
        "embd_pdrop": 0.0,
        "eos_token_id": id,
        "initializer_range": 0.02,
        "layer_norm_epsilon": ln_eps(),
        "model_type": "gpt2",
        "n_embd": cfg.d_model,
        "n_head": cfg.heads,
        "n_inner": cfg.ffn,
        "n_layer": cfg.layers,
        "n_positions": cfg.max_seq,
        "reorder_and_upcast_attn": false,
        "resid_pdrop": 0.0,
        "scale_attn_by_inverse_layer_idx": false,
        "scale_attn_weights": true,
        "tie_word_embeddings": true,
        "dtype": "float32",
        "use_cache": true,
        "vocab_size": cfg.vocab,
    });
    if eos.is_some() {
        v["pad_token_id"] = id;
    }
    let mut s = serde_json::to_string_pretty(&v).expect("JSON serialises");
    s.push('\n');
    s
}

/// nanoGPT's `GPTConfig` (its `model_args`) for `cfg` as pretty JSON.
pub fn nanogpt_config_json(cfg: &ModelConfig) -> String {
    let mut v = serde_json::json!({
        "bias": true,
        "block_size": cfg.max_seq,
        "dropout": 0.0,
        "n_embd": cfg.d_model,
        "n_head": cfg.heads,
        "n_layer": cfg.layers,
        "vocab_size": cfg.vocab,
    });
    // nanoGPT's MLP is 4·n_embd wide and its GPTConfig has no such field: named only when the
    // model's differs (nanoGPT itself would need changing to load it).
    if cfg.ffn != 4 * cfg.d_model {
        v["n_inner"] = serde_json::json!(cfg.ffn);
    }
    let mut s = serde_json::to_string_pretty(&v).expect("JSON serialises");
    s.push('\n');
    s
}

/// One exported tensor: name, shape, f32 values.
pub type Tensor = (String, Vec<usize>, Vec<f32>);

/// The tensors of `format` (name, shape, f32 values) for `weights` ([`param_specs`] order).
pub fn tensors(
    cfg: &ModelConfig,
    weights: &[Vec<f32>],
    format: ExportFormat,
) -> Result<Vec<Tensor>> {
    let specs = param_specs(cfg);
    check_weights(&specs, weights)?;
    let conv1d: Vec<usize> = (0..cfg.layers)
        .flat_map(|l| {
            [
                BlockParam::AttnW,
                BlockParam::ProjW,
                BlockParam::FcW,
                BlockParam::FcProjW,
            ]
            .map(|p| param_index(l, p))
        })
        .collect();
    let mut out = Vec::with_capacity(specs.len() + 1);
    for (i, (s, w)) in specs.iter().zip(weights).enumerate() {
        if format == ExportFormat::HuggingFace && conv1d.contains(&i) {
            let (rows, cols) = (s.shape[0], s.shape[1]);
            out.push((s.name.clone(), vec![cols, rows], transpose(w, rows, cols)));
        } else {
            out.push((s.name.clone(), s.shape.clone(), w.clone()));
        }
    }
    if format == ExportFormat::NanoGpt {
        out.push((
            "lm_head.weight".into(),
            specs[0].shape.clone(),
            weights[0].clone(),
        ));
    }
    Ok(out)
}

/// The safetensors bytes of `format`'s weights file.
pub fn weights_bytes(
    cfg: &ModelConfig,
    weights: &[Vec<f32>],
    format: ExportFormat,
) -> Result<Vec<u8>> {
    let owned: Vec<(String, Vec<usize>, Vec<u8>)> = tensors(cfg, weights, format)?
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = owned
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), d).expect("consistent view"),
            )
        })
        .collect();
    // transformers' from_pretrained refuses a safetensors file without format pt/tf/flax/mlx.
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(meta))
        .map_err(|e| EngineError::Config(format!("cannot serialise the weights: {e}")))
}

/// The config file of `format`.
pub fn config_json(cfg: &ModelConfig, format: ExportFormat) -> String {
    match format {
        ExportFormat::HuggingFace => hf_config_json(cfg),
        ExportFormat::NanoGpt => nanogpt_config_json(cfg),
    }
}

/// Writes `config.json` and `model.safetensors` of `format` into `dir` (created when missing),
/// both or neither ([`write_all_or_nothing`]). Returns the files written.
pub fn export(
    dir: &Path,
    cfg: &ModelConfig,
    weights: &[Vec<f32>],
    format: ExportFormat,
) -> Result<Vec<PathBuf>> {
    let files = [
        (
            CONFIG_FILE.to_string(),
            config_json(cfg, format).into_bytes(),
        ),
        (
            WEIGHTS_FILE.to_string(),
            weights_bytes(cfg, weights, format)?,
        ),
    ];
    write_all_or_nothing(dir, &files)
}

fn io_err(p: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Io {
        path: p.display().to_string(),
        message: e.to_string(),
    }
}

/// `dir/.name.tag-pid`: a file of this process beside `name` (a run folder's stale temporaries
/// are named alike and swept by [`crate::checkpoint::remove_stale_temporaries`]).
fn beside(dir: &Path, name: &str, tag: &str) -> PathBuf {
    dir.join(format!(".{name}.{tag}-{}", std::process::id()))
}

/// Writes `files` (name, bytes) into `dir` (created when missing), all of them or none: each
/// goes to a temporary file in `dir` first (written and fsynced); only when every one is there
/// are they renamed over their names, the files they replace kept aside (hard links) until the
/// last rename succeeded. A failure on the way — a full disk, a file-size limit, an unwritable
/// name — removes what this call wrote and puts back what it replaced, so the folder keeps its
/// old files (never a new `config.json` beside the old weights), and the error names the file.
/// Returns the files written, in order.
pub fn write_all_or_nothing(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<Vec<PathBuf>> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, io_message(&e)))?;
    let targets: Vec<PathBuf> = files.iter().map(|(n, _)| dir.join(n)).collect();
    let temps: Vec<PathBuf> = files.iter().map(|(n, _)| beside(dir, n, "tmp")).collect();
    let remove_all = |paths: &[PathBuf]| {
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
    };
    for (i, (_, bytes)) in files.iter().enumerate() {
        let written = std::fs::File::create(&temps[i])
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()));
        if let Err(e) = written {
            remove_all(&temps[..=i]);
            return Err(io_err(
                &targets[i],
                format!("cannot write it: {}", io_message(&e)),
            ));
        }
    }
    // Whether each name held a file, and that file kept aside until every rename is done
    // (None where the file system has no hard links: it is then replaced without a way back).
    let existed: Vec<bool> = targets
        .iter()
        .map(|t| std::fs::symlink_metadata(t).is_ok())
        .collect();
    let backups: Vec<Option<PathBuf>> = files
        .iter()
        .zip(&targets)
        .zip(&existed)
        .map(|(((n, _), t), &old)| {
            let b = beside(dir, n, "old.tmp");
            let _ = std::fs::remove_file(&b);
            (old && std::fs::hard_link(t, &b).is_ok()).then_some(b)
        })
        .collect();
    for i in 0..files.len() {
        if let Err(e) = std::fs::rename(&temps[i], &targets[i]) {
            // Undo the renames done: the old file back, or none where there was none.
            for j in 0..i {
                match (&backups[j], existed[j]) {
                    (Some(b), _) => {
                        let _ = std::fs::rename(b, &targets[j]);
                    }
                    (None, false) => {
                        let _ = std::fs::remove_file(&targets[j]);
                    }
                    (None, true) => {}
                }
            }
            remove_all(&temps[i..]);
            remove_all(&backups.iter().flatten().cloned().collect::<Vec<_>>());
            return Err(io_err(
                &targets[i],
                format!("cannot replace it: {}", io_message(&e)),
            ));
        }
    }
    remove_all(&backups.into_iter().flatten().collect::<Vec<_>>());
    // The renames themselves, durable.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Preset};

    fn tmp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("duet-export-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A replacement that fails at its second file (here a name taken by a folder, which no
    /// file can be renamed over) leaves the first file as it was and nothing of its own.
    #[test]
    fn a_failed_replacement_leaves_the_old_files() {
        let dir = tmp_dir("all-or-nothing");
        let files = |a: &str, b: &str| {
            vec![
                ("a.json".to_string(), a.as_bytes().to_vec()),
                ("b.bin".to_string(), b.as_bytes().to_vec()),
            ]
        };
        write_all_or_nothing(&dir, &files("old a", "old b")).unwrap();
        write_all_or_nothing(&dir, &files("new a", "new b")).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("a.json")).unwrap(),
            "new a"
        );
        assert_eq!(listing(&dir), ["a.json", "b.bin"]);

        std::fs::remove_file(dir.join("b.bin")).unwrap();
        std::fs::create_dir(dir.join("b.bin")).unwrap();
        std::fs::write(dir.join("b.bin").join("x"), "in the way").unwrap();
        let e = write_all_or_nothing(&dir, &files("newer a", "newer b")).unwrap_err();
        assert!(e.to_string().contains("b.bin"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join("a.json")).unwrap(),
            "new a"
        );
        assert_eq!(listing(&dir), ["a.json", "b.bin"]);

        // A name that held nothing holds nothing after a failure either.
        std::fs::remove_file(dir.join("a.json")).unwrap();
        assert!(write_all_or_nothing(&dir, &files("a", "b")).is_err());
        assert_eq!(listing(&dir), ["b.bin"]);
    }

    #[test]
    fn the_end_of_text_token_is_bos_eos_and_pad() {
        let cfg = Config::preset(Preset::Tiny).model;
        let v = |json: String| serde_json::from_str::<serde_json::Value>(&json).unwrap();
        let with = v(hf_config_json_with(&cfg, Some(0)));
        for k in ["bos_token_id", "eos_token_id", "pad_token_id"] {
            assert_eq!(with[k], 0, "{k}");
        }
        let without = v(hf_config_json(&cfg));
        assert!(without["eos_token_id"].is_null() && without.get("pad_token_id").is_none());
        // An id past the vocabulary is no token of it.
        assert!(v(hf_config_json_with(&cfg, Some(cfg.vocab as u32)))["eos_token_id"].is_null());
        let gpt2 = ModelConfig {
            vocab: GPT2_VOCAB,
            ..cfg
        };
        assert_eq!(v(hf_config_json(&gpt2))["eos_token_id"], 50256);
    }
}
