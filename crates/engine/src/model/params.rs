use crate::config::ModelConfig;
use crate::rng::Rng;
use crate::{EngineError, Result};
use duet_device::{Buffer, DType, Device, DeviceExt};
use half::{bf16, f16};
use rayon::prelude::*;

/// Per-block parameter tensors, in storage order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockParam {
    Ln1W,
    Ln1B,
    AttnW,
    AttnB,
    ProjW,
    ProjB,
    Ln2W,
    Ln2B,
    FcW,
    FcB,
    FcProjW,
    FcProjB,
}

impl BlockParam {
    /// What the tensor is ([`ParamRole`]).
    pub fn role(self) -> ParamRole {
        match self {
            Self::Ln1W | Self::Ln1B | Self::Ln2W | Self::Ln2B => ParamRole::Norm,
            Self::AttnW | Self::ProjW | Self::FcW | Self::FcProjW => ParamRole::Matrix,
            Self::AttnB | Self::ProjB | Self::FcB | Self::FcProjB => ParamRole::LinearBias,
        }
    }

    pub const ALL: [BlockParam; 12] = [
        Self::Ln1W,
        Self::Ln1B,
        Self::AttnW,
        Self::AttnB,
        Self::ProjW,
        Self::ProjB,
        Self::Ln2W,
        Self::Ln2B,
        Self::FcW,
        Self::FcB,
        Self::FcProjW,
        Self::FcProjB,
    ];

    fn suffix(self) -> &'static str {
        match self {
            Self::Ln1W => "ln_1.weight",
            Self::Ln1B => "ln_1.bias",
            Self::AttnW => "attn.c_attn.weight",
            Self::AttnB => "attn.c_attn.bias",
            Self::ProjW => "attn.c_proj.weight",
            Self::ProjB => "attn.c_proj.bias",
            Self::Ln2W => "ln_2.weight",
            Self::Ln2B => "ln_2.bias",
            Self::FcW => "mlp.c_fc.weight",
            Self::FcB => "mlp.c_fc.bias",
            Self::FcProjW => "mlp.c_proj.weight",
            Self::FcProjB => "mlp.c_proj.bias",
        }
    }

    pub(crate) fn shape(self, c: usize, f: usize) -> Vec<usize> {
        match self {
            Self::Ln1W | Self::Ln1B | Self::Ln2W | Self::Ln2B | Self::ProjB | Self::FcProjB => {
                vec![c]
            }
            Self::AttnW => vec![3 * c, c],
            Self::AttnB => vec![3 * c],
            Self::ProjW => vec![c, c],
            Self::FcW => vec![f, c],
            Self::FcB => vec![f],
            Self::FcProjW => vec![c, f],
        }
    }
}

/// Name, shape and initialisation of one parameter tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    /// Whether AdamW's decoupled weight decay applies (matrices and embeddings, not biases/LN).
    pub decay: bool,
    pub init: Init,
    /// Zero rows the device holds past `shape[0]` (the token embedding, whose rows are also
    /// the LM head's: the vocabulary padded to [`VOCAB_PAD`] so the LM-head GEMMs run on a
    /// fast path). Host weights, checkpoints and traces never see them.
    pub pad_rows: usize,
    /// What the tensor is to the model, which decides how a precision stores it.
    pub role: ParamRole,
}

/// What a parameter tensor is: mixed precision keeps embeddings, matrices and the linear
/// layers' biases in the activation dtype (with FP32 masters), normalisation parameters in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamRole {
    Embedding,
    /// A linear layer's weight matrix.
    Matrix,
    /// A linear layer's bias (the GEMM epilogue adds it, as PyTorch autocast casts it).
    LinearBias,
    /// A normalisation layer's scale or shift.
    Norm,
}

/// The token embedding / LM head is held with its rows padded to a multiple of this (GPT-2's
/// 50257 → 50304, as nanoGPT and llm.c do): an odd vocabulary puts cuBLAS on a slow path (124 ms
/// against 73 ms a step for GPT-2 on the H200). The padded rows are zero and stay zero: their
/// logits take no part in the softmax or the loss ([`duet_device::LossOps::cross_entropy_padded`]),
/// so their gradient, AdamW moments and update are exactly zero.
pub const VOCAB_PAD: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    Zeros,
    Ones,
    Normal(f32),
}

impl ParamSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements the device holds: [`ParamSpec::numel`] plus the padded rows.
    pub fn device_numel(&self) -> usize {
        self.numel() + self.pad_rows * self.shape[1..].iter().product::<usize>()
    }

    /// Whether mixed precision keeps the working copy in the activation dtype (with an FP32
    /// master in the optimizer): matrices, embeddings and the linear layers' biases (which the
    /// GEMM epilogue adds, as PyTorch autocast casts them); LayerNorm parameters stay f32.
    pub fn low_precision(&self) -> bool {
        self.role != ParamRole::Norm
    }
}

/// Index of a parameter in [`param_specs`] order: wte, wpe, 12 per block, ln_f weight and bias.
pub fn param_index(layer: usize, p: BlockParam) -> usize {
    2 + layer * BlockParam::ALL.len() + p as usize
}

/// The parameter tensors in storage order (the order of checkpoints and optimizer state).
pub fn param_specs(cfg: &ModelConfig) -> Vec<ParamSpec> {
    let (c, f) = (cfg.d_model, cfg.ffn);
    let std = 0.02f32;
    // GPT-2 scales the residual projections by 1/√(2·layers).
    let proj_std = std / (2.0 * cfg.layers as f32).sqrt();
    let mut specs = vec![
        ParamSpec {
            name: "transformer.wte.weight".into(),
            shape: vec![cfg.vocab, c],
            decay: true,
            init: Init::Normal(std),
            pad_rows: cfg.vocab.next_multiple_of(VOCAB_PAD) - cfg.vocab,
            role: ParamRole::Embedding,
        },
        ParamSpec {
            name: "transformer.wpe.weight".into(),
            shape: vec![cfg.max_seq, c],
            decay: true,
            init: Init::Normal(std),
            pad_rows: 0,
            role: ParamRole::Embedding,
        },
    ];
    for l in 0..cfg.layers {
        for p in BlockParam::ALL {
            let shape = p.shape(c, f);
            let init = match p {
                BlockParam::Ln1W | BlockParam::Ln2W => Init::Ones,
                BlockParam::AttnW | BlockParam::FcW => Init::Normal(std),
                BlockParam::ProjW | BlockParam::FcProjW => Init::Normal(proj_std),
                _ => Init::Zeros,
            };
            specs.push(ParamSpec {
                name: format!("transformer.h.{l}.{}", p.suffix()),
                decay: shape.len() == 2,
                shape,
                init,
                pad_rows: 0,
                role: p.role(),
            });
        }
    }
    specs.push(ParamSpec {
        name: "transformer.ln_f.weight".into(),
        shape: vec![c],
        decay: false,
        init: Init::Ones,
        pad_rows: 0,
        role: ParamRole::Norm,
    });
    specs.push(ParamSpec {
        name: "transformer.ln_f.bias".into(),
        shape: vec![c],
        decay: false,
        init: Init::Zeros,
        pad_rows: 0,
        role: ParamRole::Norm,
    });
    specs
}

/// The vocabulary as the device holds it (rows of the token embedding / LM head).
pub fn padded_vocab(cfg: &ModelConfig) -> usize {
    cfg.vocab.next_multiple_of(VOCAB_PAD)
}

/// Host tensors read back from device buffers (`specs` order) cut to their real size (the
/// padded rows dropped).
pub fn unpad(specs: &[ParamSpec], mut tensors: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    for (t, s) in tensors.iter_mut().zip(specs) {
        t.truncate(s.numel());
    }
    tensors
}

/// Host tensors (real sizes, `specs` order) in the device's layout: padded tensors get their
/// zero rows (a copy of those tensors only).
pub fn pad<'a>(specs: &[ParamSpec], tensors: &'a [Vec<f32>]) -> Vec<std::borrow::Cow<'a, [f32]>> {
    tensors
        .iter()
        .zip(specs)
        .map(|(t, s)| {
            if s.pad_rows == 0 || t.len() != s.numel() {
                std::borrow::Cow::Borrowed(t.as_slice())
            } else {
                let mut p = t.clone();
                p.resize(s.device_numel(), 0.0);
                std::borrow::Cow::Owned(p)
            }
        })
        .collect()
}

/// Checks that `weights` (host f32) hold one tensor of the right size per spec.
pub fn check_weights(specs: &[ParamSpec], weights: &[Vec<f32>]) -> Result<()> {
    if weights.len() != specs.len() {
        return Err(EngineError::Config(format!(
            "expected {} weight tensors, got {}",
            specs.len(),
            weights.len()
        )));
    }
    for (spec, w) in specs.iter().zip(weights) {
        if w.len() != spec.numel() {
            return Err(EngineError::Config(format!(
                "{} has {} values, expected {} (shape {:?})",
                spec.name,
                w.len(),
                spec.numel(),
                spec.shape
            )));
        }
    }
    Ok(())
}

/// Elements per parallel chunk of [`init_weights`].
pub(super) const INIT_CHUNK: usize = 1 << 14;

/// Initial weights for `cfg` drawn from `seed` (host f32, [`param_specs`] order).
///
/// Tensor `i` draws from its own stream `Rng::derive(seed, 1000 + i)`, element `k` from that
/// stream's normals `k` (two outputs each). The work runs in parallel chunks, each starting
/// its stream at its first element with [`Rng::skip`], so the values are those of drawing the
/// elements one after another, whatever the thread count (the large preset's 605 M values took
/// 18 s on one core).
pub fn init_weights(cfg: &ModelConfig, seed: u64) -> Vec<Vec<f32>> {
    param_specs(cfg)
        .par_iter()
        .enumerate()
        .map(|(i, spec)| {
            let rng = Rng::derive(seed, 1000 + i as u64);
            let n = spec.numel();
            match spec.init {
                Init::Zeros => vec![0.0; n],
                Init::Ones => vec![1.0; n],
                Init::Normal(std) => {
                    let mut w = vec![0.0f32; n];
                    w.par_chunks_mut(INIT_CHUNK)
                        .enumerate()
                        .for_each(|(c, chunk)| {
                            let mut r = rng.clone();
                            r.skip(2 * (c * INIT_CHUNK) as u64);
                            for x in chunk {
                                *x = (r.normal() * std as f64) as f32;
                            }
                        });
                    w
                }
            }
        })
        .collect()
}

/// Copies host f32 values into a float buffer of any of f32, f16, bf16 (rounding once).
pub(crate) fn upload_f32_as<D: Device>(dev: &D, src: &[f32], dst: &mut D::Buffer) -> Result<()> {
    match dst.dtype() {
        DType::F32 => dev.upload(src, dst, 0)?,
        DType::BF16 => {
            let v: Vec<bf16> = src.iter().map(|&x| bf16::from_f32(x)).collect();
            dev.upload(&v, dst, 0)?
        }
        DType::F16 => {
            let v: Vec<f16> = src.iter().map(|&x| f16::from_f32(x)).collect();
            dev.upload(&v, dst, 0)?
        }
        other => {
            return Err(EngineError::Config(format!(
                "cannot upload weights into a {other} buffer"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Preset};

    #[test]
    fn specs_count_matches_num_params() {
        for p in [Preset::Default, Preset::Seed, Preset::Large, Preset::Tiny] {
            let cfg = Config::preset(p).model;
            let total: usize = param_specs(&cfg).iter().map(ParamSpec::numel).sum();
            assert_eq!(total, cfg.num_params());
        }
        let cfg = Config::preset(Preset::Tiny).model;
        let specs = param_specs(&cfg);
        assert_eq!(
            specs[param_index(1, BlockParam::FcProjB)].name,
            "transformer.h.1.mlp.c_proj.bias"
        );
        assert_eq!(specs.len(), 2 + 12 * cfg.layers + 2);
    }

    /// The parallel initialisation gives the values of drawing every tensor's elements one after
    /// another from its stream (tensors of several chunks and a partial last chunk included).
    #[test]
    fn init_weights_are_the_sequential_draws() {
        let cfg = ModelConfig {
            vocab: 96,
            d_model: 128,
            heads: 4,
            ffn: 4 * 128 + 8,
            layers: 2,
            max_seq: 40,
        };
        let specs = param_specs(&cfg);
        assert!(specs.iter().any(|s| s.numel() > 3 * INIT_CHUNK + 1));
        let w = init_weights(&cfg, 5);
        assert_eq!(w.len(), specs.len());
        for (i, (spec, got)) in specs.iter().zip(&w).enumerate() {
            let mut rng = Rng::derive(5, 1000 + i as u64);
            let want: Vec<f32> = match spec.init {
                Init::Zeros => vec![0.0; spec.numel()],
                Init::Ones => vec![1.0; spec.numel()],
                Init::Normal(std) => (0..spec.numel())
                    .map(|_| (rng.normal() * std as f64) as f32)
                    .collect(),
            };
            assert_eq!(got.len(), want.len(), "tensor {i}");
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "tensor {i}"
            );
        }
        assert_ne!(init_weights(&cfg, 6)[1], w[1]);
    }
}
