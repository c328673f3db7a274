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
//! Both files are written in a fixed order, so one model always gives the same bytes; and both
//! load back with [`crate::init::load_init_weights`].

use crate::config::ModelConfig;
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

/// `GPT2Config` for `cfg` as pretty JSON (keys sorted, as `save_pretrained` writes them).
pub fn hf_config_json(cfg: &ModelConfig) -> String {
    let gpt2_vocab = cfg.vocab == GPT2_VOCAB;
    let eos = if gpt2_vocab {
        serde_json::json!(GPT2_VOCAB - 1)
    } else {
        // GPT2Config's default (50256) is no token of this vocabulary.
        serde_json::Value::Null
    };
    let v = serde_json::json!({
        "activation_function": "gelu_new",
        "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.0,
        "bos_token_id": eos,
        "embd_pdrop": 0.0,
        "eos_token_id": eos,
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

/// Writes `config.json` and `model.safetensors` of `format` into `dir` (created when missing;
/// each file atomically). Returns the files written.
pub fn export(
    dir: &Path,
    cfg: &ModelConfig,
    weights: &[Vec<f32>],
    format: ExportFormat,
) -> Result<Vec<PathBuf>> {
    let bytes = weights_bytes(cfg, weights, format)?;
    let io = |p: &Path, e: std::io::Error| EngineError::Io {
        path: p.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let config = dir.join(CONFIG_FILE);
    crate::checkpoint::write_atomic(&config, config_json(cfg, format).as_bytes())
        .map_err(|e| io(&config, e))?;
    let model = dir.join(WEIGHTS_FILE);
    crate::checkpoint::write_atomic(&model, &bytes).map_err(|e| io(&model, e))?;
    Ok(vec![config, model])
}
