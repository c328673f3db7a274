//! Initial weights from a file (`duet train --init-from`): a duet checkpoint, a nanoGPT state
//! dict saved as safetensors, or a Hugging Face GPT-2 `model.safetensors`.
//!
//! The three hold the same model under (nearly) the same names; they differ in
//! - **names**: nanoGPT and HF's `GPT2LMHeadModel` use `transformer.h.0.attn.c_attn.weight`, HF's
//!   `GPT2Model` (the hub's `gpt2` file) drops the `transformer.` prefix, `torch.compile` adds
//!   `_orig_mod.` and DDP `module.` (both stripped);
//! - **layout**: nanoGPT's `nn.Linear` stores `(out, in)` as duet does, HF's `Conv1D` `(in, out)`
//!   for `c_attn`, `c_proj`, `c_fc` and `mlp.c_proj` (transposed here). The attention weight
//!   tells them apart: `(3·d_model, d_model)` is nanoGPT's, `(d_model, 3·d_model)` HF's;
//! - **buffers**: `attn.bias` (the causal mask) and `attn.masked_bias` are skipped; `lm_head.weight`
//!   must equal the token embedding (duet ties them) and is otherwise ignored;
//! - **dtype**: f32, f16, bf16 and f64 tensors are read as f32.
//!
//! A duet checkpoint is recognised by its metadata and read with [`Checkpoint::from_bytes`]; only
//! its weights and model config are used (the optimizer state, step and data position are not:
//! `--init-from` starts a new run).
//!
//! The model's shape comes from the file: vocab and d_model from the token embedding, the context
//! from the position embedding, ffn from the MLP, the layer count from the block indices. The head
//! count cannot be read from shapes: it comes from a duet checkpoint's config, else from a
//! `config.json` next to the file (`n_head`, as HF's GPT2Config and nanoGPT's model args name
//! it), else from `--heads`, else from the configured model when its width is the file's.

use crate::checkpoint::{self, Checkpoint};
use crate::config::ModelConfig;
use crate::dataset::io_message;
use crate::model::{BlockParam, param_index, param_specs};
use crate::{EngineError, Result};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// What kind of file the weights came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// A checkpoint written by `duet train`.
    Duet,
    /// A state dict with nanoGPT's names in `nn.Linear`'s `(out, in)` layout.
    NanoGpt,
    /// Hugging Face's GPT-2 (`Conv1D` weights in `(in, out)` layout).
    HuggingFace,
}

impl std::fmt::Display for SourceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Duet => "duet checkpoint",
            Self::NanoGpt => "nanoGPT state dict",
            Self::HuggingFace => "Hugging Face GPT-2 model",
        })
    }
}

/// The model-shape fields given explicitly (command-line flags): each must agree with the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeRequest {
    pub vocab: Option<usize>,
    pub d_model: Option<usize>,
    pub heads: Option<usize>,
    pub ffn: Option<usize>,
    pub layers: Option<usize>,
    pub max_seq: Option<usize>,
}

/// Weights read from a file, with the model they fit.
#[derive(Clone, Debug)]
pub struct InitWeights {
    pub format: SourceFormat,
    /// The safetensors file read (a folder given resolves to the file inside it).
    pub path: PathBuf,
    /// The model's shape, from the file.
    pub model: ModelConfig,
    /// FP32 weights in [`param_specs`] order, real sizes (no padded rows).
    pub weights: Vec<Vec<f32>>,
    /// Where the head count came from, for the log line.
    pub heads_from: String,
    /// Things worth a warning (e.g. a config.json naming another activation).
    pub notes: Vec<String>,
}

/// The weight matrices HF's GPT-2 stores as `Conv1D`, `(in, out)`.
const CONV1D: [BlockParam; 4] = [
    BlockParam::AttnW,
    BlockParam::ProjW,
    BlockParam::FcW,
    BlockParam::FcProjW,
];

fn err(path: &Path, message: impl Into<String>) -> EngineError {
    EngineError::Io {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// The file `path` names: itself, or in a folder its `checkpoint.safetensors` (a duet run's
/// `--out`) or `model.safetensors` (a Hugging Face model folder or `duet export`'s output).
pub fn resolve_path(path: &Path) -> Result<PathBuf> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    for name in [checkpoint::files::CHECKPOINT, "model.safetensors"] {
        let p = path.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(err(
        path,
        format!(
            "the folder holds neither {} (a duet run) nor model.safetensors (a Hugging Face \
             model)",
            checkpoint::files::CHECKPOINT
        ),
    ))
}

/// Reads initial weights from `path` (a file, or a folder as [`resolve_path`] takes), detecting
/// its format. `given` are the shape fields set explicitly (each must agree with the file);
/// `configured` is the model the run would otherwise have, whose head count is used when nothing
/// else gives one and its width is the file's.
pub fn load_init_weights(
    path: &Path,
    given: &ShapeRequest,
    configured: Option<&ModelConfig>,
) -> Result<InitWeights> {
    let path = resolve_path(path)?;
    if let Ok(m) = std::fs::metadata(&path) {
        crate::check_host_memory(m.len().saturating_mul(2), || {
            format!("loading the weights of {}", path.display())
        })?;
    }
    let bytes = crate::dataset::read_regular(&path).map_err(|e| err(&path, io_message(&e)))?;
    let config_json = path
        .parent()
        .map(|d| d.join("config.json"))
        .filter(|p| p.is_file())
        .map(|p| -> Result<(PathBuf, serde_json::Value)> {
            let text = std::fs::read_to_string(&p).map_err(|e| err(&p, io_message(&e)))?;
            let v =
                serde_json::from_str(&text).map_err(|e| err(&p, format!("not valid JSON: {e}")))?;
            Ok((p, v))
        })
        .transpose()?;
    let init =
        from_bytes(&bytes, config_json.as_ref(), given, configured).map_err(|m| err(&path, m))?;
    Ok(InitWeights { path, ..init })
}

/// The bytes of a safetensors file, with an optional `config.json` (its path and value).
pub fn from_bytes(
    bytes: &[u8],
    config_json: Option<&(PathBuf, serde_json::Value)>,
    given: &ShapeRequest,
    configured: Option<&ModelConfig>,
) -> std::result::Result<InitWeights, String> {
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| not_safetensors(bytes, e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    if meta.get(checkpoint::keys::FORMAT).map(String::as_str) == Some(checkpoint::FORMAT) {
        let ck = Checkpoint::from_bytes(bytes)?;
        check_given(&ck.config.model, given, "the checkpoint's")?;
        return Ok(InitWeights {
            format: SourceFormat::Duet,
            path: PathBuf::new(),
            model: ck.config.model,
            weights: ck.weights,
            heads_from: "the checkpoint's config".into(),
            notes: Vec::new(),
        });
    }
    let st = SafeTensors::deserialize(bytes).map_err(|e| not_safetensors(bytes, e))?;
    state_dict(&st, config_json, given, configured)
}

/// Why `bytes` is not a safetensors file, with a hint for PyTorch's own formats.
fn not_safetensors(bytes: &[u8], e: safetensors::SafeTensorError) -> String {
    let hint = if bytes.starts_with(b"PK\x03\x04") {
        " (it is a zip archive, as torch.save writes: save the state dict with \
         safetensors.torch.save_file(model.state_dict(), \"model.safetensors\") first)"
    } else if bytes.first() == Some(&0x80) {
        " (it looks like a Python pickle: save the state dict with \
         safetensors.torch.save_file first)"
    } else {
        ""
    };
    format!(
        "not a safetensors file{hint}: {e}; --init-from takes a duet checkpoint, a nanoGPT state \
         dict or a Hugging Face GPT-2 model.safetensors"
    )
}

/// `name` under nanoGPT's / `GPT2LMHeadModel`'s names (duet's): `_orig_mod.` and `module.`
/// stripped, `transformer.` added where a `GPT2Model` file lacks it.
fn canonical(name: &str) -> String {
    let mut n = name;
    while let Some(rest) = n
        .strip_prefix("_orig_mod.")
        .or_else(|| n.strip_prefix("module."))
    {
        n = rest;
    }
    if n.starts_with("transformer.") || n.starts_with("lm_head.") {
        n.to_string()
    } else {
        format!("transformer.{n}")
    }
}

/// Buffers a GPT-2 state dict may hold that are no weights: the causal masks.
fn is_buffer(canonical: &str) -> bool {
    canonical.ends_with(".attn.bias") || canonical.ends_with(".attn.masked_bias")
}

/// A tensor's values as f32.
fn to_f32(name: &str, t: &TensorView<'_>) -> std::result::Result<Vec<f32>, String> {
    let d = t.data();
    let v: Vec<f32> = match t.dtype() {
        Dtype::F32 => d
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        other => {
            return Err(format!(
                "tensor '{name}' is {other:?}: only F32, F16, BF16 and F64 weights are read"
            ));
        }
    };
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        return Err(format!("tensor '{name}' holds a non-finite value at {i}"));
    }
    Ok(v)
}

/// `rows × cols` row-major → `cols × rows`.
pub(crate) fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// Each shape field given explicitly must be the file's.
fn check_given(
    m: &ModelConfig,
    given: &ShapeRequest,
    whose: &str,
) -> std::result::Result<(), String> {
    let pairs = [
        ("--vocab", given.vocab, m.vocab),
        ("--d-model", given.d_model, m.d_model),
        ("--heads", given.heads, m.heads),
        ("--ffn", given.ffn, m.ffn),
        ("--layers", given.layers, m.layers),
        ("--max-seq", given.max_seq, m.max_seq),
    ];
    let bad: Vec<String> = pairs
        .iter()
        .filter_map(|&(flag, g, have)| {
            g.filter(|&g| g != have)
                .map(|g| format!("{flag} {g} (the file's is {have})"))
        })
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the model's shape comes from the file, and {whose} model disagrees with {}: drop \
             those flags",
            bad.join(", ")
        ))
    }
}

/// A state dict's tensors under their canonical names ([`canonical`]).
struct Tensors<'a, 'data> {
    st: &'a SafeTensors<'data>,
    /// canonical name → name in the file
    names: BTreeMap<String, String>,
}

impl<'a, 'data> Tensors<'a, 'data> {
    /// The tensors of `st`; two names of the same weight are refused.
    fn new(st: &'a SafeTensors<'data>) -> std::result::Result<Self, String> {
        // canonical name → name in the file
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        for name in st.names() {
            let c = canonical(name);
            if let Some(prev) = names.insert(c.clone(), name.to_string()) {
                return Err(format!(
                    "tensors '{prev}' and '{name}' are the same weight ({c}) twice"
                ));
            }
        }
        Ok(Self { st, names })
    }

    /// The tensor of canonical name `canon`, with its name in the file.
    fn get(&self, canon: &str) -> std::result::Result<(String, TensorView<'data>), String> {
        let name = self
            .names
            .get(canon)
            .ok_or_else(|| format!("tensor '{canon}' is missing (not a GPT-2 state dict?)"))?;
        Ok((
            name.clone(),
            self.st.tensor(name).map_err(|e| e.to_string())?,
        ))
    }
}

/// The model's shape as the tensors give it (all but the head count), and the layout.
struct FileShape {
    vocab: usize,
    /// d_model.
    c: usize,
    max_seq: usize,
    layers: usize,
    ffn: usize,
    format: SourceFormat,
    /// The token embedding's name in the file.
    wte_name: String,
}

/// The shape from the token and position embeddings, the block indices and the first block's
/// attention and MLP weights (whose layout tells nanoGPT's from Hugging Face's).
fn file_shape(tensors: &Tensors<'_, '_>) -> std::result::Result<FileShape, String> {
    let (wte_name, wte) = tensors.get("transformer.wte.weight")?;
    let &[vocab, c] = wte.shape() else {
        return Err(format!(
            "tensor '{wte_name}' has shape {:?}, expected (vocab, d_model)",
            wte.shape()
        ));
    };
    let (wpe_name, wpe) = tensors.get("transformer.wpe.weight")?;
    let max_seq = match wpe.shape() {
        &[t, cc] if cc == c => t,
        s => {
            return Err(format!(
                "tensor '{wpe_name}' has shape {s:?}, expected (positions, {c}) (d_model {c} \
                 from '{wte_name}')"
            ));
        }
    };
    let layers = block_count(&tensors.names)?;
    let (attn_name, attn) = tensors.get("transformer.h.0.attn.c_attn.weight")?;
    let format = match attn.shape() {
        &[a, b] if a == 3 * c && b == c => SourceFormat::NanoGpt,
        &[a, b] if a == c && b == 3 * c => SourceFormat::HuggingFace,
        s => {
            return Err(format!(
                "tensor '{attn_name}' has shape {s:?}: expected ({}, {c}) (nanoGPT's nn.Linear) \
                 or ({c}, {}) (Hugging Face's Conv1D) for d_model {c}",
                3 * c,
                3 * c
            ));
        }
    };
    let (fc_name, fc) = tensors.get("transformer.h.0.mlp.c_fc.weight")?;
    let ffn = match (format, fc.shape()) {
        (SourceFormat::HuggingFace, &[cc, f]) if cc == c => f,
        (SourceFormat::NanoGpt, &[f, cc]) if cc == c => f,
        (_, s) => {
            return Err(format!(
                "tensor '{fc_name}' has shape {s:?}, expected {} for d_model {c}",
                if format == SourceFormat::HuggingFace {
                    format!("({c}, ffn)")
                } else {
                    format!("(ffn, {c})")
                }
            ));
        }
    };
    Ok(FileShape {
        vocab,
        c,
        max_seq,
        layers,
        ffn,
        format,
        wte_name,
    })
}

/// The number of transformer blocks (`transformer.h.N.`) among the canonical `names`: at least
/// one, numbered from 0 without a gap.
fn block_count(names: &BTreeMap<String, String>) -> std::result::Result<usize, String> {
    let mut blocks = BTreeSet::new();
    for canon in names.keys() {
        if let Some(rest) = canon.strip_prefix("transformer.h.") {
            let idx = rest.split('.').next().unwrap_or("");
            let i: usize = idx
                .parse()
                .map_err(|_| format!("tensor '{}' has no block index", names[canon]))?;
            blocks.insert(i);
        }
    }
    let layers = blocks.len();
    if layers == 0 {
        return Err("the file holds no transformer blocks (transformer.h.0...)".into());
    }
    if blocks.iter().next_back() != Some(&(layers - 1)) {
        let missing = (0..layers).find(|i| !blocks.contains(i)).unwrap_or(0);
        return Err(format!(
            "block {missing} is missing (the file has blocks {:?})",
            blocks
        ));
    }
    Ok(layers)
}

/// A `config.json` beside the file (its path and value): its sizes must be the tensors'; an
/// activation or LayerNorm epsilon other than duet's goes into `notes`. Its head count
/// (`n_head`) and where it came from, when it has one.
fn config_json_heads(
    config_json: Option<&(PathBuf, serde_json::Value)>,
    shape: &FileShape,
    notes: &mut Vec<String>,
) -> std::result::Result<Option<(usize, String)>, String> {
    let Some((p, v)) = config_json else {
        return Ok(None);
    };
    let field = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    for (key, have) in [
        ("vocab_size", shape.vocab),
        ("n_embd", shape.c),
        ("n_layer", shape.layers),
        ("n_positions", shape.max_seq),
        ("block_size", shape.max_seq),
    ] {
        if let Some(want) = field(key)
            && want != have as u64
        {
            return Err(format!(
                "{} says {key} {want}, but the weights have {have}",
                p.display()
            ));
        }
    }
    let ffn = shape.ffn;
    if let Some(f) = field("n_inner")
        && f != ffn as u64
    {
        return Err(format!(
            "{} says n_inner {f}, but the weights have ffn {ffn}",
            p.display()
        ));
    }
    if let Some(act) = v.get("activation_function").and_then(|a| a.as_str())
        && !matches!(act, "gelu_new" | "gelu_pytorch_tanh")
    {
        notes.push(format!(
            "{} names the activation '{act}'; duet's MLP uses GELU's tanh approximation \
             (gelu_new)",
            p.display()
        ));
    }
    if let Some(eps) = v.get("layer_norm_epsilon").and_then(|e| e.as_f64())
        && (eps - crate::model::LN_EPS as f64).abs() > 1e-12
    {
        notes.push(format!(
            "{} has layer_norm_epsilon {eps}; duet's LayerNorm uses {}",
            p.display(),
            crate::model::LN_EPS
        ));
    }
    Ok(field("n_head").map(|h| (h as usize, format!("n_head in {}", p.display()))))
}

/// The head count and where it came from: config.json's (`from_json`), else `--heads`, else
/// the configured model's if it is `c` wide.
fn resolve_heads(
    from_json: Option<(usize, String)>,
    given: &ShapeRequest,
    configured: Option<&ModelConfig>,
    c: usize,
) -> std::result::Result<(usize, String), String> {
    let (mut heads, mut heads_from) = match from_json {
        Some((h, from)) => (Some(h), from),
        None => (None, String::new()),
    };
    match (heads, given.heads) {
        (Some(h), Some(g)) if h != g => {
            return Err(format!(
                "--heads {g} disagrees with the file's config ({heads_from} is {h}): drop --heads"
            ));
        }
        (None, Some(g)) => {
            heads = Some(g);
            heads_from = "--heads".into();
        }
        _ => {}
    }
    if let Some(m) = configured.filter(|m| heads.is_none() && m.d_model == c) {
        heads = Some(m.heads);
        heads_from = "the configured model (the preset or --config)".into();
    }
    let Some(heads) = heads else {
        return Err(format!(
            "cannot tell the number of attention heads (d_model {c}) from the tensors: give \
             --heads N (GPT-2 124M has 12), or put the model's config.json (n_head) next to the \
             file"
        ));
    };
    Ok((heads, heads_from))
}

/// The weights of `model` in [`param_specs`] order (HF's `Conv1D` matrices transposed), each
/// tensor's shape checked; and the canonical names read.
fn read_params(
    tensors: &Tensors<'_, '_>,
    model: &ModelConfig,
    format: SourceFormat,
) -> std::result::Result<(Vec<Vec<f32>>, BTreeSet<String>), String> {
    let (c, ffn, vocab, max_seq) = (model.d_model, model.ffn, model.vocab, model.max_seq);
    let specs = param_specs(model);
    let conv1d: BTreeSet<usize> = (0..model.layers)
        .flat_map(|l| CONV1D.map(|p| param_index(l, p)))
        .collect();
    let mut weights = Vec::with_capacity(specs.len());
    let mut used = BTreeSet::new();
    for (i, s) in specs.iter().enumerate() {
        let (name, t) = tensors.get(&s.name)?;
        let transposed = format == SourceFormat::HuggingFace && conv1d.contains(&i);
        let want: Vec<usize> = if transposed {
            vec![s.shape[1], s.shape[0]]
        } else {
            s.shape.clone()
        };
        if t.shape() != want.as_slice() {
            return Err(format!(
                "tensor '{name}' has shape {:?}, expected {want:?} ({} layout, d_model {c}, ffn \
                 {ffn}, vocab {vocab}, context {max_seq})",
                t.shape(),
                format
            ));
        }
        let v = to_f32(&name, &t)?;
        weights.push(if transposed {
            transpose(&v, want[0], want[1])
        } else {
            v
        });
        used.insert(s.name.clone());
    }
    Ok((weights, used))
}

/// An `lm_head.weight` in the file must be the token embedding (`wte`, read): duet ties them.
/// Marked in `used` when present.
fn check_lm_head(
    tensors: &Tensors<'_, '_>,
    shape: &FileShape,
    wte: &[f32],
    used: &mut BTreeSet<String>,
) -> std::result::Result<(), String> {
    let (vocab, c, wte_name) = (shape.vocab, shape.c, &shape.wte_name);
    if let Some(head) = tensors.names.get("lm_head.weight") {
        let t = tensors.st.tensor(head).map_err(|e| e.to_string())?;
        if t.shape() != [vocab, c] {
            return Err(format!(
                "tensor '{head}' has shape {:?}, expected [{vocab}, {c}] (the tied token \
                 embedding)",
                t.shape()
            ));
        }
        if to_f32(head, &t)? != wte {
            return Err(format!(
                "tensor '{head}' differs from the token embedding '{wte_name}': duet ties the \
                 LM head to the embedding and cannot load an untied head"
            ));
        }
        used.insert("lm_head.weight".into());
    }
    Ok(())
}

/// A nanoGPT or Hugging Face state dict.
fn state_dict(
    st: &SafeTensors<'_>,
    config_json: Option<&(PathBuf, serde_json::Value)>,
    given: &ShapeRequest,
    configured: Option<&ModelConfig>,
) -> std::result::Result<InitWeights, String> {
    let tensors = Tensors::new(st)?;
    let shape = file_shape(&tensors)?;
    // The head count: config.json, else --heads, else the configured model if it is this wide.
    let mut notes = Vec::new();
    let from_json = config_json_heads(config_json, &shape, &mut notes)?;
    let (heads, heads_from) = resolve_heads(from_json, given, configured, shape.c)?;
    let layers = shape.layers;
    let model = ModelConfig {
        vocab: shape.vocab,
        d_model: shape.c,
        heads,
        ffn: shape.ffn,
        layers,
        max_seq: shape.max_seq,
    };
    model
        .validate()
        .map_err(|e| format!("the file's model is not valid: {e} (heads from {heads_from})"))?;
    check_given(&model, given, "the file's")?;
    let (weights, mut used) = read_params(&tensors, &model, shape.format)?;
    check_lm_head(&tensors, &shape, &weights[0], &mut used)?;
    if let Some(name) = tensors
        .names
        .iter()
        .find(|(canon, _)| !used.contains(*canon) && !is_buffer(canon))
        .map(|(_, name)| name)
    {
        return Err(format!(
            "unexpected tensor '{name}': not part of a GPT-2 model of {layers} blocks (duet \
             loads token and position embeddings, LayerNorms with biases, attention and MLP with \
             biases, a tied LM head)"
        ));
    }
    Ok(InitWeights {
        format: shape.format,
        path: PathBuf::new(),
        model,
        weights,
        heads_from,
        notes,
    })
}
