//! The GPT model: parameters, a memory plan made once, and an explicit forward and backward pass
//! written as flat per-layer loops over device buffers (after llm.c's `gpt2_forward` /
//! `gpt2_backward`).
//!
//! Architecture (GPT-2 / nanoGPT): token + position embedding; per block
//! `x + proj(attn(LN1(x)))`, then `x + fc2(gelu(fc1(LN2(x))))`; final LayerNorm; the LM head is
//! tied to the token embedding. Weights use PyTorch's `(out_features, in_features)` layout and
//! nanoGPT's names, so a linear layer is `y = x·Wᵀ + b`.

use crate::config::ModelConfig;
use crate::fp8::{DelayedScaling, Fp8Family, Fp8State, Operand, OperandReport};
use crate::precision::Precision;
use crate::rng::Rng;
use crate::{EngineError, Result};
use duet_device::{
    AdamWFp8Out, Buffer, DType, DeviceError, DeviceExt, Epilogue, Fp8QuantJob, Fused, GemmDesc,
};
use half::{bf16, f16};
use rayon::prelude::*;
use std::sync::Arc;

/// The callback of [`Gpt::backward_hooked`]: `(ready group, every gradient)`.
pub type GradsReady<'a, B> = dyn FnMut(usize, &[B]) -> Result<()> + 'a;

/// LayerNorm epsilon (PyTorch's default).
pub const LN_EPS: f32 = 1e-5;

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

    fn shape(self, c: usize, f: usize) -> Vec<usize> {
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
}

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

    /// Whether mixed precision keeps the working copy in the activation dtype (with an FP32
    /// master in the optimizer): matrices, embeddings and the linear layers' biases (which the
    /// GEMM epilogue adds, as PyTorch autocast casts them); LayerNorm parameters stay f32.
    pub fn low_precision(&self) -> bool {
        self.decay || (self.name.ends_with(".bias") && !self.name.contains("ln_"))
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
        },
        ParamSpec {
            name: "transformer.wpe.weight".into(),
            shape: vec![cfg.max_seq, c],
            decay: true,
            init: Init::Normal(std),
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
            });
        }
    }
    specs.push(ParamSpec {
        name: "transformer.ln_f.weight".into(),
        shape: vec![c],
        decay: false,
        init: Init::Ones,
    });
    specs.push(ParamSpec {
        name: "transformer.ln_f.bias".into(),
        shape: vec![c],
        decay: false,
        init: Init::Zeros,
    });
    specs
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
const INIT_CHUNK: usize = 1 << 14;

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

/// Activations one block saves for its backward pass.
struct BlockActs<B> {
    ln1: B,
    ln1_mean: B,
    ln1_rstd: B,
    /// The attention's input (q, k and v are split from it again in the backward pass, and the
    /// attention probabilities recomputed: no `t × t` matrix is kept per block).
    qkv: B,
    attc: B,
    /// Residual stream after attention.
    res2: B,
    ln2: B,
    ln2_mean: B,
    ln2_rstd: B,
    /// The MLP's hidden pre-activation.
    fch: B,
    /// gelu(fch), where the plan keeps it ([`PrecisionPlan::keep_gelu_output`]); empty when the
    /// backward pass recomputes it (and always in FP8, which never writes it).
    gelu: B,
    /// Residual stream after the MLP (the block's output).
    res3: B,
    /// Fused (flash) attention only: the log-sum-exp of each attention row (f32,
    /// `b × nh × t`), what its backward pass needs instead of the probabilities. Empty when
    /// the unfused ops run.
    lse: B,
}

/// Scratch buffers the forward and backward passes reuse across blocks. The three score-sized
/// buffers hold one chunk of `Dims::ab` attention matrices (`ab × t × t`), not all `b·nh`.
struct Scratch<B> {
    /// Scores, and in the backward pass their gradient.
    scores: B,
    probs: B,
    dprobs: B,
    /// Heads split from a block's `qkv` (`b × nh × t × hs` each).
    q: B,
    k: B,
    v: B,
    dresid: B,
    d_c: B,
    d_c2: B,
    dq: B,
    dk: B,
    dv: B,
    dqkv: B,
    /// The gradient of the MLP's hidden activation; empty where it shares `d_f2` (see
    /// [`GradIo::Shared`]).
    d_f: B,
    /// gelu(fch): the MLP's hidden activation (forward), recomputed for the weight gradient
    /// and then overwritten by its gradient when `d_f` is empty.
    d_f2: B,
}

impl<B> Scratch<B> {
    /// Scratch for `n` tokens of width `c`, FFN width `f` and `att` score elements per
    /// attention chunk, in the activation dtype `act`.
    /// `heads`: whether the split q/k/v buffers (and their gradients) of the unfused
    /// attention are needed.
    #[allow(clippy::too_many_arguments)]
    fn alloc<D: Fused<Buffer = B>>(
        dev: &D,
        act: DType,
        n: usize,
        c: usize,
        f: usize,
        att: usize,
        heads: bool,
        one_mlp_grad: bool,
    ) -> Result<Self> {
        let a = |len: usize| dev.alloc(act, len);
        let h = if heads { n * c } else { 0 };
        Ok(Self {
            scores: a(att)?,
            probs: a(att)?,
            dprobs: a(att)?,
            q: a(h)?,
            k: a(h)?,
            v: a(h)?,
            dresid: a(n * c)?,
            d_c: a(n * c)?,
            d_c2: a(h)?,
            dq: a(h)?,
            dk: a(h)?,
            dv: a(h)?,
            dqkv: a(n * 3 * c)?,
            d_f: a(if one_mlp_grad { 0 } else { n * f })?,
            d_f2: a(n * f)?,
        })
    }
}

/// Bytes held by each category of buffer (the memory plan).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The model's (working) weights.
    pub params: u64,
    pub grads: u64,
    /// What AdamW holds for this model: f32 moments and, for weights whose working copy is not
    /// f32, the FP32 master weights.
    pub optimizer: u64,
    pub activations: u64,
    pub scratch: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations + self.scratch
    }
}

/// How a model stores its weights and activations (see [`crate::precision`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrecisionPlan {
    pub precision: Precision,
    /// Delayed-scaling settings (fp8 only).
    pub fp8: DelayedScaling,
    /// FP8 encodings; `None` picks the device's ([`Fp8Family::of_device`]).
    pub fp8_family: Option<Fp8Family>,
    /// Store the linear layers' weight gradients in the activation dtype instead of f32 (see
    /// [`crate::precision::WeightGradDtype`]); ignored when the activations are f32.
    pub low_precision_weight_grads: bool,
    /// Keep the MLP's GELU output for the backward pass (n × ffn per block more memory) instead
    /// of recomputing it there; FP8 never writes it, so this changes nothing in FP8.
    pub keep_gelu_output: bool,
    /// Activation checkpointing: keep only the input of every segment of this many blocks and
    /// recompute the segment in the backward pass (0 = off).
    pub checkpoint_every: usize,
    /// Ranks the optimizer state is split over (ZeRO-1); 0 or 1 = not split. Only the memory
    /// estimate uses it: the sharded optimizer lives outside the model.
    pub optimizer_shards: usize,
}

impl PrecisionPlan {
    pub fn new(precision: Precision) -> Self {
        Self {
            precision,
            ..Self::default()
        }
    }
}

/// The linear layers of a block, in FP8 metadata order.
const LINEARS: [(BlockParam, &str); 4] = [
    (BlockParam::AttnW, "attn.c_attn"),
    (BlockParam::ProjW, "attn.c_proj"),
    (BlockParam::FcW, "mlp.c_fc"),
    (BlockParam::FcProjW, "mlp.c_proj"),
];

/// The FP8 weight codes an optimizer update writes ([`Gpt::update_params_with_fp8_codes`],
/// [`crate::optim::AdamW::queue_device_step_fp8`]).
pub struct Fp8WeightCodes<'a, B> {
    /// One per linear layer's weight matrix.
    pub outs: Vec<AdamWFp8Out<'a, B>>,
    pub scale: &'a B,
    pub amax: &'a mut B,
}

/// Where the FP8 weight codes stand. Delayed scaling quantises the weights of a step with the
/// scales set after the previous step, so the optimizer can write them
/// ([`Gpt::update_params_with_fp8_codes`]) and the next forward pass skip the quantisation. The
/// amax slots of the weights must then hold what the separate path would have recorded: the
/// max over every quantisation of the weights since the last scaling update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fp8Codes {
    /// `w8` and `w8t` are the codes of the current weights at the current scales, their amaxes
    /// recorded: the forward pass does not quantise the weights.
    fresh: bool,
    /// Those amaxes were recorded by the optimizer for a forward pass that has not run yet (the
    /// separate path records them when that pass quantises).
    unclaimed: bool,
    /// Unclaimed amaxes of weights that have since changed: the weights' slots are zeroed
    /// before anything records into them or reads them.
    reset: bool,
}

impl Fp8Codes {
    /// After the optimizer wrote them.
    pub(crate) const WRITTEN: Self = Self {
        fresh: true,
        unclaimed: true,
        reset: false,
    };
    /// After a forward pass quantised the weights (or used the optimizer's codes).
    const QUANTISED: Self = Self {
        fresh: true,
        unclaimed: false,
        reset: false,
    };

    /// The weights change: the codes no longer match, and unclaimed amaxes no longer belong.
    fn stale(&mut self) {
        self.reset |= self.unclaimed;
        self.fresh = false;
        self.unclaimed = false;
    }
}

/// FP8 copies of the linear layers' operands and their scaling metadata.
struct Fp8Bufs<D: Fused> {
    state: Fp8State<D>,
    /// What `w8`, `w8t` and the weights' amax slots hold (see [`Fp8Codes`]).
    codes: Fp8Codes,
    /// Per kind of linear layer: the input (used by the forward GEMM only, so reused by every
    /// layer). Per linear layer (`4·layer + kind`): the input's transpose (kept for the weight
    /// gradient), the weight and its transpose (for the input gradient), all quantised at the
    /// start of the forward pass in one call.
    x8: Vec<D::Buffer>,
    x8t: Vec<D::Buffer>,
    w8: Vec<D::Buffer>,
    w8t: Vec<D::Buffer>,
    /// Per kind of linear layer: the output gradient and its transpose (reused by every layer).
    dy8: Vec<D::Buffer>,
    dy8t: Vec<D::Buffer>,
    /// Receives the amaxes of a checkpointed segment's recomputation, so the recompute neither
    /// records an amax twice nor touches the scaling history.
    amax_discard: D::Buffer,
}

/// Whether parameter `i` (in [`param_specs`] order) is a linear layer's weight matrix.
fn is_linear_weight(cfg: &ModelConfig, i: usize) -> bool {
    (2..2 + cfg.layers * BlockParam::ALL.len()).contains(&i) && {
        let p = BlockParam::ALL[(i - 2) % BlockParam::ALL.len()];
        LINEARS.iter().any(|&(w, _)| w == p)
    }
}

/// Every linear layer's weight codes (`w8`, `w8t`: linear layer `4·layer + kind`'s codes and
/// transposed codes), each with its weight's index in [`param_specs`] order, its shape and its
/// slot of the FP8 scales and amaxes: what the optimizer writes
/// ([`Gpt::update_params_with_fp8_codes`]) or the forward pass quantises.
fn weight_code_outs<'a, D: Fused>(
    cfg: &ModelConfig,
    w8: &'a mut [D::Buffer],
    w8t: &'a mut [D::Buffer],
) -> Vec<AdamWFp8Out<'a, D::Buffer>> {
    w8.iter_mut()
        .zip(w8t.iter_mut())
        .enumerate()
        .map(|(id, (w8, w8t))| {
            let (l, kind) = (id / LINEARS.len(), id % LINEARS.len());
            let (cols, rows) = linear_dims(cfg, kind);
            AdamWFp8Out {
                tensor: param_index(l, LINEARS[kind].0),
                dst: w8,
                dst_t: Some(w8t),
                rows,
                cols,
                slot: Fp8State::<D>::slot(id, Operand::Weight),
            }
        })
        .collect()
}

/// `(in_features, out_features)` of linear kind `k` (see [`LINEARS`]).
fn linear_dims(cfg: &ModelConfig, k: usize) -> (usize, usize) {
    let (c, f) = (cfg.d_model, cfg.ffn);
    [(c, 3 * c), (c, c), (c, f), (f, c)][k]
}

/// Copies host f32 values into a float buffer of any of f32, f16, bf16 (rounding once).
pub(crate) fn upload_f32_as<D: Fused>(dev: &D, src: &[f32], dst: &mut D::Buffer) -> Result<()> {
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

/// A GPT model bound to a device, with buffers planned for batch `b` and sequence length `t`.
pub struct Gpt<D: Fused> {
    dev: Arc<D>,
    cfg: ModelConfig,
    b: usize,
    t: usize,
    specs: Vec<ParamSpec>,
    params: Vec<D::Buffer>,
    grads: Vec<D::Buffer>,
    tokens: D::Buffer,
    targets: D::Buffer,
    encoded: D::Buffer,
    /// Activations of the blocks: one slot per block, or per block of a segment when
    /// checkpointing (see [`Gpt::slot`]).
    blocks: Vec<BlockActs<D::Buffer>>,
    /// Checkpointing: the input of each segment of `checkpoint_every` blocks.
    seg_inputs: Vec<D::Buffer>,
    checkpoint_every: usize,
    lnf: D::Buffer,
    lnf_mean: D::Buffer,
    lnf_rstd: D::Buffer,
    logits: D::Buffer,
    losses: D::Buffer,
    dlogits: D::Buffer,
    scratch: Scratch<D::Buffer>,
    plan: MemoryPlan,
    /// `d_model` zeros (clears the key-bias gradient).
    zeros_c: D::Buffer,
    /// Number of non-ignored targets in the last `loss` call.
    last_count: usize,
    precision: Precision,
    /// Activation dtype.
    act: DType,
    /// Attention runs fused (see [`Fused::flash_attention_forward`]).
    flash: bool,
    /// The logits' gradient in the activation dtype (mixed precision only).
    dlogits_lp: Option<D::Buffer>,
    /// Multiplies the loss gradient (FP16 loss scaling).
    loss_scale: f32,
    fp8: Option<Fp8Bufs<D>>,
}

impl<D: Fused> Gpt<D> {
    /// Plans and allocates every buffer for batch `b` × sequence `t`, and uploads `weights`
    /// (host f32 in [`param_specs`] order). FP32 throughout.
    pub fn new(
        dev: Arc<D>,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        weights: &[Vec<f32>],
    ) -> Result<Self> {
        Self::with_precision(dev, cfg, b, t, weights, PrecisionPlan::default())
    }

    /// Like [`Gpt::new`] in a given precision: the weight matrices (and embeddings) and the
    /// activations in the precision's activation dtype; biases, LayerNorm parameters, LayerNorm
    /// statistics, logits, losses and every parameter gradient in f32.
    pub fn with_precision(
        dev: Arc<D>,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        weights: &[Vec<f32>],
        plan: PrecisionPlan,
    ) -> Result<Self> {
        cfg.validate()?;
        if b == 0 || t == 0 || t > cfg.max_seq {
            return Err(EngineError::Config(format!(
                "batch {b} × seq {t} is invalid for a model with max_seq {}",
                cfg.max_seq
            )));
        }
        let needed = estimate_memory(cfg, b, t, &plan);
        if let Some((free, _)) = dev.memory_stats().driver
            && needed > free
        {
            return Err(out_of_memory(needed, free, plan.checkpoint_every));
        }
        Self::allocate(dev, cfg, b, t, weights, plan).map_err(|e| match e {
            EngineError::Device(DeviceError::OutOfMemory { free, .. }) => {
                out_of_memory(needed, free, plan.checkpoint_every)
            }
            other => other,
        })
    }

    fn allocate(
        dev: Arc<D>,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        weights: &[Vec<f32>],
        plan: PrecisionPlan,
    ) -> Result<Self> {
        let specs = param_specs(cfg);
        let f32 = DType::F32;
        let act = plan.precision.activation_dtype();
        let mut params = Vec::with_capacity(specs.len());
        let mut grads = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            // FP8: the linear layers' weights reach the GEMMs only as FP8 codes, quantised
            // from these f32 weights (which the optimizer updates in place: no master copy,
            // no 16-bit copy).
            let fp8_weight = plan.precision == Precision::Fp8 && is_linear_weight(cfg, i);
            let dtype = if s.low_precision() && !fp8_weight {
                act
            } else {
                f32
            };
            params.push(dev.alloc(dtype, s.numel())?);
            let low_grad = plan.low_precision_weight_grads && is_linear_weight(cfg, i);
            grads.push(dev.alloc(if low_grad { act } else { f32 }, s.numel())?);
        }
        let (c, f, nh, v) = (cfg.d_model, cfg.ffn, cfg.heads, cfg.vocab);
        let n = b * t;
        // Fused attention where the backend has it for this dtype and head size: then no score
        // matrix and no split q/k/v exist at all.
        let flash = dev.capabilities().flash_attention(act, c / nh.max(1));
        let att = if flash {
            0
        } else {
            attention_chunk(b * nh, t) * t * t
        };
        let a = |len: usize| dev.alloc(act, len);
        let a32 = |len: usize| dev.alloc(f32, len);
        // With checkpointing, one segment's worth of block activations is reused by every
        // segment, and only each segment's input is kept.
        let ckpt = plan.checkpoint_every;
        let slots = if ckpt > 0 {
            ckpt.min(cfg.layers)
        } else {
            cfg.layers
        };
        let seg_inputs = if ckpt > 0 {
            (0..cfg.layers.div_ceil(ckpt))
                .map(|_| a(n * c))
                .collect::<std::result::Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let mut blocks = Vec::with_capacity(slots);
        // FP8 keeps the LayerNorm outputs only as FP8 transposes (see Scratch::ln).
        let is_fp8 = plan.precision == Precision::Fp8;
        let ln_len = if is_fp8 { 0 } else { n * c };
        for _ in 0..slots {
            blocks.push(BlockActs {
                ln1: a(ln_len)?,
                ln1_mean: a32(n)?,
                ln1_rstd: a32(n)?,
                qkv: a(n * 3 * c)?,
                attc: a(n * c)?,
                res2: a(n * c)?,
                ln2: a(ln_len)?,
                ln2_mean: a32(n)?,
                ln2_rstd: a32(n)?,
                fch: a(n * f)?,
                gelu: a(if plan.keep_gelu_output && !is_fp8 {
                    n * f
                } else {
                    0
                })?,
                res3: a(n * c)?,
                lse: a32(if flash { b * nh * t } else { 0 })?,
            });
        }
        // The MLP's hidden gradient can overwrite the recomputed GELU output (d_f2) where the
        // GELU backward needs no separate pass: fused into the GEMM, or into FP8's quantisation.
        let one_mlp_grad =
            plan.precision == Precision::Fp8 || dev.capabilities().gemm_epilogue(act);
        let scratch = Scratch::alloc(&*dev, act, n, c, f, att, !flash, one_mlp_grad)?;
        let fp8 = if plan.precision == Precision::Fp8 {
            // FP8 tensor-core GEMMs (cuBLASLt, hipBLASLt) need every dimension of the linear
            // layers' GEMMs to be a multiple of 16; enforced on every backend so a config that
            // trains on the CPU also trains on a GPU.
            if !(c.is_multiple_of(16) && f.is_multiple_of(16) && n.is_multiple_of(16)) {
                return Err(EngineError::Config(format!(
                    "fp8 needs d_model, ffn and batch × seq to be multiples of 16 \
                     (got {c}, {f} and {b} × {t} = {n})"
                )));
            }
            let family = plan
                .fp8_family
                .unwrap_or_else(|| Fp8Family::of_device(&dev.info()));
            let mut names = Vec::new();
            for l in 0..cfg.layers {
                for (_, name) in LINEARS {
                    names.push(format!("h.{l}.{name}"));
                }
            }
            let state = Fp8State::new(&*dev, plan.fp8, family, &names)?;
            let (fwd, bwd) = (state.fwd, state.bwd);
            let amax_discard = dev.alloc(DType::F32, state.amax.len())?;
            let mut bufs = Fp8Bufs {
                amax_discard,
                state,
                codes: Fp8Codes::default(),
                x8: vec![],
                x8t: vec![],
                w8: vec![],
                w8t: vec![],
                dy8: vec![],
                dy8t: vec![],
            };
            for _ in 0..cfg.layers {
                for k in 0..LINEARS.len() {
                    let (fi, fo) = linear_dims(cfg, k);
                    bufs.x8t.push(dev.alloc(fwd, n * fi)?);
                    bufs.w8.push(dev.alloc(fwd, fo * fi)?);
                    bufs.w8t.push(dev.alloc(fwd, fo * fi)?);
                }
            }
            for k in 0..LINEARS.len() {
                let (fi, fo) = linear_dims(cfg, k);
                bufs.x8.push(dev.alloc(fwd, n * fi)?);
                bufs.dy8.push(dev.alloc(bwd, n * fo)?);
                bufs.dy8t.push(dev.alloc(bwd, n * fo)?);
            }
            Some(bufs)
        } else {
            None
        };
        let dlogits_lp = if act == f32 { None } else { Some(a(n * v)?) };
        let bytes = |bs: &[&D::Buffer]| bs.iter().map(|b| b.size_bytes() as u64).sum::<u64>();
        let mut act_bufs: Vec<&D::Buffer> = seg_inputs.iter().collect();
        for k in &blocks {
            act_bufs.extend([
                &k.ln1,
                &k.ln1_mean,
                &k.ln1_rstd,
                &k.qkv,
                &k.attc,
                &k.res2,
                &k.ln2,
                &k.ln2_mean,
                &k.ln2_rstd,
                &k.fch,
                &k.gelu,
                &k.res3,
                &k.lse,
            ]);
        }
        let sc = &scratch;
        let mut scratch_bufs: Vec<&D::Buffer> = vec![
            &sc.scores, &sc.probs, &sc.dprobs, &sc.q, &sc.k, &sc.v, &sc.dresid, &sc.d_c, &sc.d_c2,
            &sc.dq, &sc.dk, &sc.dv, &sc.dqkv, &sc.d_f, &sc.d_f2,
        ];
        scratch_bufs.extend(dlogits_lp.iter());
        if let Some(q) = &fp8 {
            act_bufs.extend(q.x8t.iter());
            scratch_bufs.extend(
                q.x8.iter()
                    .chain(&q.w8)
                    .chain(&q.w8t)
                    .chain(&q.dy8)
                    .chain(&q.dy8t),
            );
        }
        // encoded, lnf (act); lnf stats, logits, dlogits, losses (f32).
        let head = (2 * n * c * act.size_bytes() + 4 * (2 * n + 2 * n * v + n)) as u64;
        let masters: u64 = params
            .iter()
            .filter(|p| p.dtype() != f32)
            .map(|p| 4 * p.len() as u64)
            .sum();
        let plan_bytes = MemoryPlan {
            params: bytes(&params.iter().collect::<Vec<_>>()),
            grads: bytes(&grads.iter().collect::<Vec<_>>()),
            // ZeRO-1: each rank holds only its shard of the optimizer state (two f32 moments
            // per parameter, plus the masters).
            optimizer: (8 * specs.iter().map(|s| s.numel() as u64).sum::<u64>() + masters)
                .div_ceil(plan.optimizer_shards.max(1) as u64),
            activations: bytes(&act_bufs) + head,
            scratch: bytes(&scratch_bufs),
        };
        let mut model = Self {
            tokens: dev.alloc(DType::I32, n)?,
            targets: dev.alloc(DType::I32, n)?,
            encoded: a(n * c)?,
            lnf: a(n * c)?,
            lnf_mean: a32(n)?,
            lnf_rstd: a32(n)?,
            logits: a32(n * v)?,
            losses: a32(n)?,
            dlogits: a32(n * v)?,
            blocks,
            seg_inputs,
            checkpoint_every: ckpt,
            scratch,
            params,
            grads,
            specs,
            cfg: cfg.clone(),
            b,
            t,
            plan: plan_bytes,
            zeros_c: a32(c)?,
            last_count: 0,
            precision: plan.precision,
            act,
            flash,
            dlogits_lp,
            loss_scale: 1.0,
            fp8,
            dev,
        };
        model.set_weights(weights)?;
        Ok(model)
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Storage dtype of the activations.
    pub fn activation_dtype(&self) -> DType {
        self.act
    }

    /// Sets the factor the loss gradient is multiplied by (FP16 loss scaling; 1 disables).
    pub fn set_loss_scale(&mut self, scale: f32) {
        self.loss_scale = scale;
    }

    pub fn loss_scale(&self) -> f32 {
        self.loss_scale
    }

    /// FP8 only: folds the amaxes recorded since the last call into the histories and sets the
    /// scales the next step uses. A no-op in other precisions.
    pub fn fp8_update(&mut self) -> Result<()> {
        // Amaxes the optimizer recorded for a forward pass that did not run are not folded in.
        self.forget_fp8_codes()?;
        if let Some(q) = &mut self.fp8 {
            q.state.update(&*self.dev)?;
        }
        Ok(())
    }

    /// FP8 only: every operand's scale and amax history (what a checkpoint needs to resume
    /// delayed scaling exactly), in metadata order (layer, linear, operand).
    /// Whether the model runs its linear layers in FP8.
    pub fn fp8_enabled(&self) -> bool {
        self.fp8.is_some()
    }

    pub fn fp8_state(&self) -> Result<Option<Vec<crate::fp8::OperandScaling>>> {
        self.fp8
            .as_ref()
            .map(|q| q.state.export(&*self.dev))
            .transpose()
    }

    /// FP8 only: restores [`Gpt::fp8_state`]; an error in other precisions or for a different
    /// model shape or format.
    pub fn set_fp8_state(&mut self, ops: &[crate::fp8::OperandScaling]) -> Result<()> {
        match &mut self.fp8 {
            Some(q) => {
                q.state.import(&*self.dev, ops)?;
                self.forget_fp8_codes()
            }
            None => Err(EngineError::Config(format!(
                "the model runs in {}, it has no FP8 state",
                self.precision
            ))),
        }
    }

    /// FP8 only: a recorded training step (which ends with [`Gpt::fp8_update`]) was replayed,
    /// so the scales and amax histories moved on the device without the host queueing the
    /// update; the next report or export reads them back.
    pub(crate) fn fp8_note_replayed_update(&mut self) {
        if let Some(q) = &mut self.fp8 {
            q.state.note_replayed_update();
        }
    }

    /// FP8 scaling updates queued or replayed since the host last read the state back (0 in
    /// other precisions).
    pub(crate) fn fp8_pending_updates(&mut self) -> usize {
        self.fp8.as_mut().map_or(0, |q| q.state.pending_updates())
    }

    /// Puts back [`Gpt::fp8_pending_updates`] after queued work that never ran.
    pub(crate) fn set_fp8_pending_updates(&mut self, n: usize) {
        if let Some(q) = &mut self.fp8 {
            q.state.set_pending_updates(n);
        }
    }

    /// FP8 only: per layer and operand, the current scale and the first `entries` amax-history
    /// entries (most recent first).
    pub fn fp8_report(&self, entries: usize) -> Result<Option<Vec<OperandReport>>> {
        self.fp8
            .as_ref()
            .map(|q| q.state.report(&*self.dev, entries))
            .transpose()
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn batch_size(&self) -> usize {
        self.b
    }

    pub fn seq_len(&self) -> usize {
        self.t
    }

    pub fn device(&self) -> &Arc<D> {
        &self.dev
    }

    pub fn specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    pub fn memory_plan(&self) -> &MemoryPlan {
        &self.plan
    }

    pub fn params(&self) -> &[D::Buffer] {
        &self.params
    }

    /// Parameters and their gradients, for the optimizer.
    pub fn params_and_grads(&mut self) -> (&mut [D::Buffer], &[D::Buffer]) {
        self.stale_fp8_codes();
        (&mut self.params, &self.grads)
    }

    /// The weights may change: the FP8 weight codes no longer match them (the next forward
    /// pass quantises them).
    fn stale_fp8_codes(&mut self) {
        if let Some(q) = &mut self.fp8 {
            q.codes.stale();
        }
    }

    /// The scales change: the weight codes no longer match them, and amaxes the optimizer
    /// recorded for a forward pass that has not run are zeroed (the next forward pass
    /// quantises the weights and records them again).
    fn forget_fp8_codes(&mut self) -> Result<()> {
        self.stale_fp8_codes();
        self.apply_fp8_amax_reset()?;
        if let Some(q) = &mut self.fp8 {
            q.codes = Fp8Codes::default();
        }
        Ok(())
    }

    /// Zeroes the weights' amax slots if [`Fp8Codes::reset`] says so (a small upload per
    /// linear layer; only after the weights were replaced between an update that wrote the
    /// codes and the forward pass).
    fn apply_fp8_amax_reset(&mut self) -> Result<()> {
        let Some(q) = self.fp8.as_mut().filter(|q| q.codes.reset) else {
            return Ok(());
        };
        for id in 0..q.w8.len() {
            let slot = Fp8State::<D>::slot(id, Operand::Weight);
            self.dev.upload(&[0.0f32], &mut q.state.amax, slot)?;
        }
        q.codes.reset = false;
        Ok(())
    }

    /// Runs `update` (an optimizer step) on the parameters and gradients, handing it, in FP8,
    /// the weight codes to write: each linear layer's weight matrix (its index in
    /// [`param_specs`] order), its codes and transposed codes, and its slot of the scales and
    /// amaxes ([`duet_device::Fused::adamw_clipped_fp8`]). Call it after [`Gpt::fp8_update`]:
    /// the codes then take the scales the next step quantises with, and the amaxes land in the
    /// slots that update just reset, so the next forward pass, which skips the weight
    /// quantisation when `update` succeeded, computes exactly what it would have. In other
    /// precisions `update` gets `None`.
    pub fn update_params_with_fp8_codes(
        &mut self,
        update: impl FnOnce(
            &mut [D::Buffer],
            &[D::Buffer],
            Option<Fp8WeightCodes<'_, D::Buffer>>,
        ) -> Result<()>,
    ) -> Result<()> {
        self.stale_fp8_codes();
        self.apply_fp8_amax_reset()?;
        let cfg = &self.cfg;
        let codes = self.fp8.as_mut().map(|q| Fp8WeightCodes {
            outs: weight_code_outs::<D>(cfg, &mut q.w8, &mut q.w8t),
            scale: &q.state.scale,
            amax: &mut q.state.amax,
        });
        update(&mut self.params, &self.grads, codes)?;
        if let Some(q) = &mut self.fp8 {
            q.codes = Fp8Codes::WRITTEN;
        }
        Ok(())
    }

    /// FP8: whether the weight codes match the current weights and scales (written by the last
    /// update, [`Gpt::update_params_with_fp8_codes`], or by a forward pass since), so that the
    /// next forward pass does not quantise the weights.
    pub fn fp8_codes_fresh(&self) -> bool {
        self.fp8.as_ref().is_some_and(|q| q.codes.fresh)
    }

    /// Where the FP8 weight codes stand, for a caller that records a step (recording runs
    /// nothing, so it puts back what they were) or replays one (which leaves them as the
    /// recorded step did).
    pub(crate) fn fp8_codes(&self) -> Fp8Codes {
        self.fp8.as_ref().map(|q| q.codes).unwrap_or_default()
    }

    pub(crate) fn set_fp8_codes(&mut self, codes: Fp8Codes) {
        if let Some(q) = &mut self.fp8 {
            q.codes = codes;
        }
    }

    /// FP8: quantises the weights now unless their codes are fresh (as the next forward pass
    /// would), so that a step recorded or replayed afterwards needs no quantisation and no
    /// upload inside it.
    pub(crate) fn ensure_fp8_codes(&mut self) -> Result<()> {
        self.quantize_fp8_weights()
    }

    /// The gradients, writable (data parallelism stores the reduced sums back into them).
    pub fn grads_mut(&mut self) -> &mut [D::Buffer] {
        &mut self.grads
    }

    /// FP8 only: the device amaxes recorded since the last [`Gpt::fp8_update`] (data
    /// parallelism reduces them over the ranks first).
    pub fn fp8_amax_mut(&mut self) -> Option<&mut D::Buffer> {
        self.fp8.as_mut().map(|q| &mut q.state.amax)
    }

    pub fn grads(&self) -> &[D::Buffer] {
        &self.grads
    }

    /// Replaces every weight (host f32, [`param_specs`] order), rounded to each tensor's working
    /// dtype. In mixed precision the FP32 masters live in the optimizer: set them too
    /// ([`crate::optim::AdamW::set_master_weights`]) or the next step overwrites these.
    pub fn set_weights(&mut self, weights: &[Vec<f32>]) -> Result<()> {
        check_weights(&self.specs, weights)?;
        self.stale_fp8_codes();
        for (w, buf) in weights.iter().zip(&mut self.params) {
            upload_f32_as(&*self.dev, w, buf)?;
        }
        Ok(())
    }

    /// Reads every weight back to the host.
    pub fn weights(&self) -> Result<Vec<Vec<f32>>> {
        self.params
            .iter()
            .map(|p| Ok(self.dev.download_f32(p)?))
            .collect()
    }

    /// Reads every gradient back to the host.
    pub fn gradients(&self) -> Result<Vec<Vec<f32>>> {
        self.grads
            .iter()
            .map(|g| Ok(self.dev.download_f32(g)?))
            .collect()
    }

    /// Logits of the last forward pass (`b·t × vocab`).
    pub fn logits(&self) -> Result<Vec<f32>> {
        Ok(self.dev.download_f32(&self.logits)?)
    }

    fn check_tokens(&self, what: &str, tokens: &[i32], allow_negative: bool) -> Result<()> {
        if tokens.len() != self.b * self.t {
            return Err(EngineError::Config(format!(
                "{what}: got {} tokens, the model is planned for {} × {}",
                tokens.len(),
                self.b,
                self.t
            )));
        }
        let v = self.cfg.vocab as i32;
        if let Some(&bad) = tokens
            .iter()
            .find(|&&x| x >= v || (x < 0 && !allow_negative))
        {
            return Err(EngineError::Config(format!(
                "{what}: token {bad} is outside the vocabulary 0..{v}"
            )));
        }
        Ok(())
    }

    /// The activation slot block `l` uses.
    fn slot(&self, l: usize) -> usize {
        if self.checkpoint_every > 0 {
            l % self.checkpoint_every
        } else {
            l
        }
    }

    /// FP8 only: the amaxes recorded since the last [`Gpt::fp8_update`], per operand slot
    /// (`3·linear + operand`, operands input, weight, output gradient).
    pub fn fp8_recorded_amax(&self) -> Result<Option<Vec<f32>>> {
        let Some(q) = &self.fp8 else {
            return Ok(None);
        };
        let mut amax: Vec<f32> = self.dev.download(&q.state.amax)?;
        if q.codes.unclaimed || q.codes.reset {
            // Recorded by the optimizer for a forward pass that has not run (or no longer
            // belonging to the weights): not recorded yet as far as the scaling is concerned.
            for id in 0..q.w8.len() {
                amax[Fp8State::<D>::slot(id, Operand::Weight)] = 0.0;
            }
        }
        Ok(Some(amax))
    }

    /// FP8 only: clears the amaxes recorded since the last update (for inspection and tests).
    pub fn fp8_clear_recorded_amax(&mut self) -> Result<()> {
        if let Some(q) = &mut self.fp8 {
            // The next forward pass records the weights' amaxes again.
            q.codes = Fp8Codes::default();
            self.dev.fill(&mut q.state.amax, 0.0)?;
        }
        Ok(())
    }

    /// Activation checkpointing interval (0 = off).
    pub fn checkpoint_every(&self) -> usize {
        self.checkpoint_every
    }

    fn dims(&self) -> Dims {
        let (c, nh) = (self.cfg.d_model, self.cfg.heads);
        Dims {
            b: self.b,
            t: self.t,
            c,
            nh,
            hs: c / nh,
            f: self.cfg.ffn,
            n: self.b * self.t,
            ab: attention_chunk(self.b * nh, self.t),
            flash: self.flash,
        }
    }

    /// Runs block `l`'s forward pass from its input (the previous block's output, or the saved
    /// segment input). `record` is false when a checkpointed segment is recomputed.
    fn run_block_forward(&mut self, l: usize, record: bool) -> Result<()> {
        let dims = self.dims();
        let k = self.slot(l);
        let every = self.checkpoint_every;
        let dev = &*self.dev;
        let (x, a): (&D::Buffer, &mut BlockActs<D::Buffer>) =
            if every > 0 && l.is_multiple_of(every) {
                (&self.seg_inputs[l / every], &mut self.blocks[k])
            } else if l == 0 {
                (&self.encoded, &mut self.blocks[k])
            } else {
                let prev = if every > 0 { (l - 1) % every } else { l - 1 };
                let (xa, a) = two_mut(&mut self.blocks, prev, k);
                (&xa.res3, a)
            };
        block_forward(
            dev,
            &self.params,
            &mut self.fp8,
            record,
            l,
            x,
            a,
            &mut self.scratch,
            dims,
        )
    }

    /// FP8: every linear layer's weight quantised (and transposed, for the input gradient) in one
    /// call, recording the weights' amaxes, unless the optimizer already wrote those codes
    /// (`codes_fresh`); the checkpointed segments' recomputation reuses the codes (the weights
    /// have not changed), so it quantises no weight again.
    fn quantize_fp8_weights(&mut self) -> Result<()> {
        if let Some(q) = self.fp8.as_mut().filter(|q| q.codes.fresh) {
            // This pass is the one the optimizer recorded the amaxes for.
            q.codes.unclaimed = false;
            return Ok(());
        }
        self.apply_fp8_amax_reset()?;
        let Some(q) = self.fp8.as_mut() else {
            return Ok(());
        };
        let mut jobs: Vec<Fp8QuantJob<'_, D::Buffer>> =
            weight_code_outs::<D>(&self.cfg, &mut q.w8, &mut q.w8t)
                .into_iter()
                .map(|o| Fp8QuantJob {
                    src: &self.params[o.tensor],
                    dst: o.dst,
                    dst_t: o.dst_t,
                    rows: o.rows,
                    cols: o.cols,
                    slot: o.slot,
                })
                .collect();
        let st = &mut q.state;
        self.dev
            .quantize_fp8_many(&mut jobs, &st.scale, &mut st.amax)?;
        q.codes = Fp8Codes::QUANTISED;
        Ok(())
    }

    /// Runs the forward pass on `tokens` (`b·t`, row-major), up to the logits.
    pub fn forward(&mut self, tokens: &[i32]) -> Result<()> {
        self.check_tokens("forward", tokens, false)?;
        self.dev.upload(tokens, &mut self.tokens, 0)?;
        self.forward_loaded()
    }

    /// Uploads a training batch (checked like [`Gpt::forward`] and [`Gpt::loss`]) for
    /// [`Gpt::forward_loaded`] and [`Gpt::queue_loss_loaded`]; returns the number of targets
    /// that count (not ignored).
    pub fn load_batch(&mut self, tokens: &[i32], targets: &[i32]) -> Result<usize> {
        self.check_tokens("forward", tokens, false)?;
        let count = self.check_targets(targets)?;
        self.dev.upload(tokens, &mut self.tokens, 0)?;
        self.dev.upload(targets, &mut self.targets, 0)?;
        self.last_count = count;
        Ok(count)
    }

    /// The forward pass on the tokens already on the device (no host data involved: a
    /// recordable sequence of device ops).
    pub fn forward_loaded(&mut self) -> Result<()> {
        let dev = self.dev.clone();
        dev.in_range("forward", || self.forward_blocks())
    }

    fn forward_blocks(&mut self) -> Result<()> {
        let d = self.dims();
        let v = self.cfg.vocab;
        self.quantize_fp8_weights()?;
        {
            let dev = &*self.dev;
            let p = &self.params;
            dev.embedding_forward(&self.tokens, &p[0], &p[1], &mut self.encoded, d.b, d.t, d.c)?;
        }
        let every = self.checkpoint_every;
        let dev = self.dev.clone();
        for l in 0..self.cfg.layers {
            if every > 0 && l % every == 0 {
                // Keep this segment's input: the backward pass recomputes the segment from it.
                let src = if l == 0 {
                    &self.encoded
                } else {
                    &self.blocks[self.slot(l - 1)].res3
                };
                self.dev
                    .copy(src, 0, &mut self.seg_inputs[l / every], 0, d.n * d.c)?;
            }
            dev.in_range(&format!("forward block {l}"), || {
                self.run_block_forward(l, true)
            })?;
        }
        let dev = &*self.dev;
        let p = &self.params;
        let last = match self.cfg.layers {
            0 => &self.encoded,
            layers => &self.blocks[self.slot(layers - 1)].res3,
        };
        let nparams = p.len();
        dev.layernorm_forward(
            last,
            &p[nparams - 2],
            &p[nparams - 1],
            &mut self.lnf,
            &mut self.lnf_mean,
            &mut self.lnf_rstd,
            d.n,
            d.c,
            LN_EPS,
        )?;
        // Tied LM head: logits = lnf · wteᵀ.
        dev.gemm(
            &GemmDesc::new(false, true, d.n, v, d.c),
            &self.lnf,
            &p[0],
            &mut self.logits,
        )?;
        Ok(())
    }

    /// Mean cross-entropy of the last forward pass against `targets` (negative = ignored).
    /// With `with_grad`, also prepares the logits' gradient for [`Gpt::backward`].
    pub fn loss(&mut self, targets: &[i32], with_grad: bool) -> Result<f32> {
        self.queue_loss(targets, with_grad)?;
        self.read_loss()
    }

    /// [`Gpt::loss`] without reading the result back: the per-row losses stay on the device
    /// until [`Gpt::read_loss`], so a training step can queue its backward pass and update
    /// first and synchronise once at its end.
    pub fn queue_loss(&mut self, targets: &[i32], with_grad: bool) -> Result<()> {
        let count = self.check_targets(targets)?;
        self.last_count = count;
        self.dev.upload(targets, &mut self.targets, 0)?;
        self.queue_loss_loaded(with_grad)
    }

    /// Checks training targets; returns how many count (are not ignored).
    fn check_targets(&self, targets: &[i32]) -> Result<usize> {
        self.check_tokens("loss", targets, true)?;
        let count = targets.iter().filter(|&&x| x >= 0).count();
        if count == 0 {
            return Err(EngineError::Config("loss: every target is ignored".into()));
        }
        Ok(count)
    }

    /// [`Gpt::queue_loss`] on the targets already on the device ([`Gpt::load_batch`]).
    pub fn queue_loss_loaded(&mut self, with_grad: bool) -> Result<()> {
        let count = self.last_count.max(1);
        let dev = &*self.dev;
        let n = self.b * self.t;
        let dlogits = if with_grad {
            Some(&mut self.dlogits)
        } else {
            None
        };
        dev.cross_entropy(
            &self.logits,
            &self.targets,
            &mut self.losses,
            dlogits,
            n,
            self.cfg.vocab,
            self.loss_scale / count as f32,
        )?;
        if let (true, Some(lp)) = (with_grad, self.dlogits_lp.as_mut()) {
            dev.cast(&self.dlogits, lp, 1.0)?;
        }
        Ok(())
    }

    /// The mean loss of the last [`Gpt::queue_loss`] (waits for the device).
    pub fn read_loss(&self) -> Result<f32> {
        let losses: Vec<f32> = self.dev.download(&self.losses)?;
        let sum: f64 = losses.iter().map(|&x| x as f64).sum();
        Ok((sum / self.last_count.max(1) as f64) as f32)
    }

    /// Prepares the gradients for [`Gpt::backward`]: zeroes every gradient the backward pass
    /// accumulates into (all but the linear layers' weight gradients, which it writes).
    pub fn zero_grads(&mut self) -> Result<()> {
        // The linear layers' weight gradients are written (not added) by their weight-gradient
        // GEMMs (beta 0): only the rest needs clearing.
        let cfg = &self.cfg;
        let written = |i: usize| is_linear_weight(cfg, i);
        let mut rest: Vec<&mut D::Buffer> = self
            .grads
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !written(*i))
            .map(|(_, g)| g)
            .collect();
        Ok(self.dev.zero_many(&mut rest)?)
    }

    /// Backward pass from the gradient prepared by `loss(.., true)` into the parameter gradients:
    /// the linear layers' weight gradients are written, the others accumulated onto what
    /// [`Gpt::zero_grads`] cleared (call it first; two backward passes do not add up). With
    /// checkpointing, each segment
    /// but the last (whose activations the forward pass left in place) is first recomputed from
    /// its saved input.
    pub fn backward(&mut self) -> Result<()> {
        self.backward_hooked(&mut |_, _| Ok(()))
    }

    /// [`Gpt::backward`], calling `ready(group, grads)` as soon as a group of gradients is
    /// final (data parallelism starts reducing them while the pass goes on). Groups, in order:
    /// 0 the final LayerNorm, `1 + k` block `layers − 1 − k`, `layers + 1` the embeddings
    /// (see [`crate::dist::ready_groups`]).
    pub fn backward_hooked(&mut self, ready: &mut GradsReady<'_, D::Buffer>) -> Result<()> {
        let dev = self.dev.clone();
        dev.in_range("backward", || self.backward_blocks(ready))
    }

    fn backward_blocks(&mut self, ready: &mut GradsReady<'_, D::Buffer>) -> Result<()> {
        let d = self.dims();
        let v = self.cfg.vocab;
        let layers = self.cfg.layers;
        {
            let dev = &*self.dev;
            let p = &self.params;
            let g = &mut self.grads;
            let s = &mut self.scratch;
            let dlogits = self.dlogits_lp.as_ref().unwrap_or(&self.dlogits);
            let np = p.len();
            // LM head: logits = lnf · wteᵀ.
            dev.gemm(
                &GemmDesc::new(false, false, d.n, d.c, v),
                dlogits,
                &p[0],
                &mut s.d_c,
            )?;
            dev.gemm(
                &GemmDesc::new(true, false, v, d.c, d.n).beta(1.0),
                dlogits,
                &self.lnf,
                &mut g[0],
            )?;
            // Final LayerNorm: its input gradient starts the residual stream gradient.
            dev.fill(&mut s.dresid, 0.0)?;
            let last = match layers {
                0 => &self.encoded,
                _ => {
                    &self.blocks[if self.checkpoint_every > 0 {
                        (layers - 1) % self.checkpoint_every
                    } else {
                        layers - 1
                    }]
                    .res3
                }
            };
            // dresid becomes the last block's output gradient: its column sum is that block's
            // mlp.c_proj bias gradient (16-bit runs; FP8 sums it in the quantisation).
            let sum = (layers > 0 && self.fp8.is_none())
                .then(|| param_index(layers - 1, BlockParam::FcProjB));
            let (gw, gb, dsum) = ln_grads(g, np - 2, np - 1, sum);
            layernorm_backward(
                dev,
                &s.d_c,
                last,
                &p[np - 2],
                &self.lnf_mean,
                &self.lnf_rstd,
                &mut s.dresid,
                gw,
                gb,
                dsum,
                d.n,
                d.c,
            )?;
        }
        ready(0, &self.grads)?;
        let every = self.checkpoint_every;
        let seg_len = if every > 0 { every } else { layers.max(1) };
        let segments = layers.div_ceil(seg_len);
        for seg in (0..segments).rev() {
            let (lo, hi) = (seg * seg_len, ((seg + 1) * seg_len).min(layers));
            if every > 0 && seg + 1 < segments {
                for l in lo..hi {
                    self.run_block_forward(l, false)?;
                }
            }
            for l in (lo..hi).rev() {
                let k = self.slot(l);
                let x = if every > 0 && l % every == 0 {
                    &self.seg_inputs[l / every]
                } else if l == 0 {
                    &self.encoded
                } else {
                    &self.blocks[self.slot(l - 1)].res3
                };
                self.dev.in_range(&format!("backward block {l}"), || {
                    block_backward(
                        &*self.dev,
                        &self.params,
                        &mut self.grads,
                        &mut self.scratch,
                        &mut self.fp8,
                        &self.zeros_c,
                        l,
                        x,
                        &self.blocks[k],
                        d,
                    )
                })?;
                ready(layers - l, &self.grads)?;
            }
        }
        let (gwte, gwpe) = two_mut(&mut self.grads, 0, 1);
        self.dev.embedding_backward(
            &self.tokens,
            &self.scratch.dresid,
            gwte,
            gwpe,
            d.b,
            d.t,
            d.c,
        )?;
        ready(layers + 1, &self.grads)
    }

    /// The per-position losses of the last queued loss (f32, `b·t`) on the device:
    /// [`Gpt::read_loss`] sums them and divides by the counted targets. For copying them aside
    /// without a host synchronisation.
    pub fn row_losses(&self) -> &D::Buffer {
        &self.losses
    }
}

/// An estimate of the bytes a model plans for (weights, gradients, optimizer state,
/// activations and scratch), computed from the shapes before anything is allocated.
pub fn estimate_memory(cfg: &ModelConfig, b: usize, t: usize, plan: &PrecisionPlan) -> u64 {
    let act = plan.precision.activation_dtype().size_bytes() as u64;
    let (c, f, nh, v, l) = (
        cfg.d_model as u64,
        cfg.ffn as u64,
        cfg.heads as u64,
        cfg.vocab as u64,
        cfg.layers as u64,
    );
    let (b, t) = (b as u64, t as u64);
    let n = b * t;
    // One chunk of attention matrices (scratch; no block keeps a t × t matrix).
    let att = attention_chunk((b * nh) as usize, t as usize) as u64 * t * t;
    let params = cfg.num_params() as u64;
    let lowp = act != 4;
    // Weights (worst case: all in the activation dtype), grads (the linear layers' in the
    // activation dtype where the plan says so), and the optimizer state (f32 masters in mixed
    // precision, m and v), divided over the ZeRO-1 shards.
    let shards = plan.optimizer_shards.max(1) as u64;
    let linear_weights = l * (3 * c * c + c * c + 2 * f * c);
    // FP8 keeps the linear layers' weights in f32 with no master copy.
    let f32_weights = if plan.precision == Precision::Fp8 {
        linear_weights
    } else {
        0
    };
    let masters = if lowp { 4 * (params - f32_weights) } else { 0 };
    let optimizer = (masters + 2 * 4 * params).div_ceil(shards);
    let grads = if plan.low_precision_weight_grads && lowp {
        4 * (params - linear_weights) + act * linear_weights
    } else {
        4 * params
    };
    let weights = (params - f32_weights) * act + 4 * f32_weights + grads + optimizer;
    let kept_gelu = if plan.keep_gelu_output && plan.precision != Precision::Fp8 {
        n * f
    } else {
        0
    };
    let per_block = act * (n * c * 8 + n * f + kept_gelu) + 4 * 4 * n;
    let slots = if plan.checkpoint_every > 0 {
        (plan.checkpoint_every as u64).min(l)
    } else {
        l
    };
    let seg = if plan.checkpoint_every > 0 {
        l.div_ceil(plan.checkpoint_every as u64) * n * c * act
    } else {
        0
    };
    let scratch =
        act * (3 * att + n * (12 * c + 2 * f)) + 4 * (2 * n * v + 4 * n) + act * 2 * n * c;
    let fp8 = if plan.precision == Precision::Fp8 {
        // Per linear: the input's transpose, the weight and its transpose; per kind: the
        // input, the output gradient (and transpose). The blocks keep no LayerNorm
        // outputs (2·n·c fewer per block): they exist only inside the quantisation.
        let w = 3 * c * c + c * c + f * c + c * f;
        (l * (n * (c + c + c + f) + 2 * w) + n * (c + c + c + f) + 2 * n * (3 * c + c + f + c))
            .saturating_sub(act * 2 * n * c * slots)
    } else {
        0
    };
    weights + per_block * slots + seg + scratch + fp8
}

fn out_of_memory(needed: u64, free: u64, checkpoint_every: usize) -> EngineError {
    let hint = if checkpoint_every == 0 {
        "turn on activation checkpointing (--checkpoint) or use a smaller --batch"
    } else {
        "checkpoint more often (--checkpoint-every 1) or use a smaller --batch"
    };
    EngineError::OutOfMemory {
        needed,
        free,
        hint: hint.into(),
    }
}

/// The shapes a block works with.
#[derive(Clone, Copy, Debug)]
struct Dims {
    b: usize,
    t: usize,
    c: usize,
    nh: usize,
    hs: usize,
    f: usize,
    n: usize,
    /// Attention matrices (of the `b·nh`) handled per chunk; divides `b·nh`.
    ab: usize,
    /// The backend's fused attention runs (see [`Fused::flash_attention_forward`]).
    flash: bool,
}

/// Score-matrix elements the attention works on at once: 16 Mi (32 MiB in bf16), so the
/// scratch does not grow with `b·nh·t²` (the seed model runs in 2 chunks of 192 heads: 3 × 24
/// MiB of bf16 scratch instead of 3 × 48 MiB, and no block keeps its 48 MiB of probabilities),
/// while the number of launches stays small (each chunk is 3 launches forward, 8 backward).
const ATTENTION_CHUNK_ELEMS: usize = 1 << 24;

/// The number of attention matrices per chunk: the largest divisor of `bh` (= batch × heads)
/// whose `t × t` score matrices fit in [`ATTENTION_CHUNK_ELEMS`] (at least 1).
fn attention_chunk(bh: usize, t: usize) -> usize {
    let fit = (ATTENTION_CHUNK_ELEMS / (t * t).max(1)).clamp(1, bh.max(1));
    (1..=fit).rev().find(|d| bh.is_multiple_of(*d)).unwrap_or(1)
}

/// One block's forward pass from `x` into its activations `a`.
#[allow(clippy::too_many_arguments)]
fn block_forward<D: Fused>(
    dev: &D,
    p: &[D::Buffer],
    q8: &mut Option<Fp8Bufs<D>>,
    record: bool,
    l: usize,
    x: &D::Buffer,
    a: &mut BlockActs<D::Buffer>,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
) -> Result<()> {
    let Dims {
        b,
        t,
        c,
        nh,
        hs,
        f,
        n,
        ..
    } = d;
    let scale = 1.0 / (hs as f32).sqrt();
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    // Attention. FP8 keeps no LayerNorm output: it exists only inside the quantisation of
    // the next layer's input.
    let fp8 = q8.is_some();
    let ln1 = if fp8 {
        LinearInput::LayerNormOf {
            x,
            gamma: w(BlockParam::Ln1W),
            beta: w(BlockParam::Ln1B),
            mean: &mut a.ln1_mean,
            rstd: &mut a.ln1_rstd,
        }
    } else {
        dev.layernorm_forward(
            x,
            w(BlockParam::Ln1W),
            w(BlockParam::Ln1B),
            &mut a.ln1,
            &mut a.ln1_mean,
            &mut a.ln1_rstd,
            n,
            c,
            LN_EPS,
        )?;
        LinearInput::Plain(&a.ln1)
    };
    linear_act_forward(
        dev,
        q8.as_mut().map(|q| (q, 4 * l)),
        record,
        ln1,
        w(BlockParam::AttnW),
        w(BlockParam::AttnB),
        &mut a.qkv,
        None,
        None,
        n,
        c,
        3 * c,
    )?;
    if d.flash {
        dev.flash_attention_forward(&a.qkv, &mut a.attc, &mut a.lse, b, t, nh, hs, scale)?;
    } else {
        dev.split_heads(&a.qkv, &mut s.q, &mut s.k, &mut s.v, b, t, nh, hs)?;
        attention_forward(dev, s, d, scale)?;
        dev.merge_heads(&s.d_c2, &mut a.attc, b, t, nh, hs, false)?;
    }
    linear_forward(
        dev,
        q8.as_mut().map(|q| (q, 4 * l + 1)),
        record,
        &a.attc,
        w(BlockParam::ProjW),
        w(BlockParam::ProjB),
        &mut a.res2,
        Some(x),
        n,
        c,
        c,
    )?;
    // MLP.
    // gelu(fch) lives in the block's activations where the plan keeps it, else in scratch (the
    // backward pass recomputes it). FP8 never writes it: the GELU runs inside the quantisation
    // of the next layer's input.
    let keep_gelu = !a.gelu.is_empty();
    if fp8 {
        let ln2 = LinearInput::LayerNormOf {
            x: &a.res2,
            gamma: w(BlockParam::Ln2W),
            beta: w(BlockParam::Ln2B),
            mean: &mut a.ln2_mean,
            rstd: &mut a.ln2_rstd,
        };
        linear_act_forward(
            dev,
            q8.as_mut().map(|q| (q, 4 * l + 2)),
            record,
            ln2,
            w(BlockParam::FcW),
            w(BlockParam::FcB),
            &mut a.fch,
            None,
            None,
            n,
            c,
            f,
        )?;
    } else {
        dev.layernorm_forward(
            &a.res2,
            w(BlockParam::Ln2W),
            w(BlockParam::Ln2B),
            &mut a.ln2,
            &mut a.ln2_mean,
            &mut a.ln2_rstd,
            n,
            c,
            LN_EPS,
        )?;
        linear_gelu_forward(
            dev,
            None,
            record,
            &a.ln2,
            w(BlockParam::FcW),
            w(BlockParam::FcB),
            &mut a.fch,
            if keep_gelu { &mut a.gelu } else { &mut s.d_f2 },
            n,
            c,
            f,
        )?;
    }
    linear_act_forward(
        dev,
        q8.as_mut().map(|q| (q, 4 * l + 3)),
        record,
        match (fp8, keep_gelu) {
            (true, _) => LinearInput::GeluOf(&a.fch),
            (false, true) => LinearInput::Plain(&a.gelu),
            (false, false) => LinearInput::Plain(&s.d_f2),
        },
        w(BlockParam::FcProjW),
        w(BlockParam::FcProjB),
        &mut a.res3,
        Some(&a.res2),
        None,
        n,
        f,
        c,
    )?;
    Ok(())
}

/// One block's backward pass: consumes `s.dresid` (the gradient of the block's output) and
/// leaves the gradient of its input there; accumulates the block's parameter gradients.
#[allow(clippy::too_many_arguments)]
fn block_backward<D: Fused>(
    dev: &D,
    p: &[D::Buffer],
    g: &mut [D::Buffer],
    s: &mut Scratch<D::Buffer>,
    q8: &mut Option<Fp8Bufs<D>>,
    zeros_c: &D::Buffer,
    l: usize,
    x: &D::Buffer,
    a: &BlockActs<D::Buffer>,
    d: Dims,
) -> Result<()> {
    let Dims {
        b,
        t,
        c,
        nh,
        hs,
        f,
        n,
        ..
    } = d;
    let scale = 1.0 / (hs as f32).sqrt();
    let w = |bp: BlockParam| &p[param_index(l, bp)];
    let gi = |bp: BlockParam| param_index(l, bp);
    // res3 = res2 + gelu(fch) · FcProjWᵀ + FcProjB; dresid passes through unchanged. The weight
    // gradient needs gelu(fch): kept by the forward pass, or recomputed into d_f2 (bit for bit
    // what the forward pass used; FP8 keeps its own transposed copy instead).
    let keep_gelu = !a.gelu.is_empty();
    let fp8 = q8.is_some();
    if !fp8 && !keep_gelu {
        dev.gelu_forward(&a.fch, &mut s.d_f2)?;
    }
    let one_buffer = s.d_f.is_empty();
    let fused_gelu = {
        let (gw, gb) = two_mut(g, gi(BlockParam::FcProjW), gi(BlockParam::FcProjB));
        let io = match (keep_gelu, one_buffer) {
            (true, _) => GradIo::Split {
                x: &a.gelu,
                dx: if one_buffer { &mut s.d_f2 } else { &mut s.d_f },
            },
            (false, true) => GradIo::Shared(&mut s.d_f2),
            (false, false) => GradIo::Split {
                x: &s.d_f2,
                dx: &mut s.d_f,
            },
        };
        // mlp.c_proj's bias gradient came out of the LayerNorm backward that wrote dresid
        // (16-bit runs; FP8 sums it in the quantisation of dresid).
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, 4 * l + 3)),
            &s.dresid,
            io,
            w(BlockParam::FcProjW),
            gw,
            fp8.then_some(gb),
            Some(&a.fch),
            None,
            n,
            f,
            c,
        )?
    };
    // The gradient of fch: fused into the GEMM above, into FP8's quantisation below, or a
    // separate pass into d_f2.
    let gelu_in_quantize = q8.is_some();
    let unfused = !fused_gelu && !gelu_in_quantize;
    if unfused && one_buffer {
        return Err(DeviceError::InvalidArgument(
            "the backend's fused GEMM epilogues were switched off after the model was built \
             (its memory plan relies on them): build the model again"
                .into(),
        )
        .into());
    }
    if unfused {
        dev.gelu_backward(&a.fch, &s.d_f, &mut s.d_f2)?;
    }
    let d_hidden = if one_buffer || unfused {
        &s.d_f2
    } else {
        &s.d_f
    };
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::FcW), gi(BlockParam::FcB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, 4 * l + 2)),
            d_hidden,
            GradIo::Split {
                x: &a.ln2,
                dx: &mut s.d_c,
            },
            w(BlockParam::FcW),
            gw,
            Some(gb),
            None,
            gelu_in_quantize.then_some(&a.fch),
            n,
            c,
            f,
        )?;
    }
    {
        // dresid becomes the gradient of res2: its column sum is attn.c_proj's bias gradient.
        let sum = (!fp8).then(|| gi(BlockParam::ProjB));
        let (gw, gb, dsum) = ln_grads(g, gi(BlockParam::Ln2W), gi(BlockParam::Ln2B), sum);
        layernorm_backward(
            dev,
            &s.d_c,
            &a.res2,
            w(BlockParam::Ln2W),
            &a.ln2_mean,
            &a.ln2_rstd,
            &mut s.dresid,
            gw,
            gb,
            dsum,
            n,
            c,
        )?;
    }
    // res2 = x + attc · ProjWᵀ + ProjB.
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::ProjW), gi(BlockParam::ProjB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, 4 * l + 1)),
            &s.dresid,
            GradIo::Split {
                x: &a.attc,
                dx: &mut s.d_c,
            },
            w(BlockParam::ProjW),
            gw,
            fp8.then_some(gb),
            None,
            None,
            n,
            c,
            c,
        )?;
    }
    if d.flash {
        dev.flash_attention_backward(
            &a.qkv,
            &a.attc,
            &s.d_c,
            &a.lse,
            &mut s.dqkv,
            b,
            t,
            nh,
            hs,
            scale,
        )?;
    } else {
        // attc = merge(atty): the gradient goes back through the inverse permutation.
        dev.merge_heads(&s.d_c, &mut s.d_c2, b, t, nh, hs, true)?;
        // q, k and v are split from the saved qkv again (the forward pass kept no copy).
        dev.split_heads(&a.qkv, &mut s.q, &mut s.k, &mut s.v, b, t, nh, hs)?;
        attention_backward(dev, s, d, scale)?;
        dev.split_heads_backward(&s.dq, &s.dk, &s.dv, &mut s.dqkv, b, t, nh, hs)?;
    }
    {
        let (gw, gb) = two_mut(g, gi(BlockParam::AttnW), gi(BlockParam::AttnB));
        linear_backward(
            dev,
            q8.as_mut().map(|q| (q, 4 * l)),
            &s.dqkv,
            GradIo::Split {
                x: &a.ln1,
                dx: &mut s.d_c,
            },
            w(BlockParam::AttnW),
            gw,
            Some(gb),
            None,
            None,
            n,
            c,
            3 * c,
        )?;
        // The key bias adds q_i·b to a whole row of scores, which the softmax ignores: its
        // gradient is exactly zero, and what a GEMM leaves there is rounding noise that Adam
        // would turn into lr-sized random updates (different on every backend). Make it exactly
        // zero.
        dev.copy(zeros_c, 0, gb, c, c)?;
    }
    {
        // dresid becomes the gradient of this block's input, the previous block's res3: its
        // column sum is that block's mlp.c_proj bias gradient.
        let sum = (l > 0 && !fp8).then(|| param_index(l - 1, BlockParam::FcProjB));
        let (gw, gb, dsum) = ln_grads(g, gi(BlockParam::Ln1W), gi(BlockParam::Ln1B), sum);
        layernorm_backward(
            dev,
            &s.d_c,
            x,
            w(BlockParam::Ln1W),
            &a.ln1_mean,
            &a.ln1_rstd,
            &mut s.dresid,
            gw,
            gb,
            dsum,
            n,
            c,
        )?;
    }
    Ok(())
}

/// [`Device::layernorm_backward`], with `dsum += Σ_rows dx` (after the update) in the same pass
/// where given: the bias gradient of the linear layer whose output `dx` is the gradient of.
#[allow(clippy::too_many_arguments)]
fn layernorm_backward<D: Fused>(
    dev: &D,
    dout: &D::Buffer,
    x: &D::Buffer,
    gamma: &D::Buffer,
    mean: &D::Buffer,
    rstd: &D::Buffer,
    dx: &mut D::Buffer,
    dgamma: &mut D::Buffer,
    dbeta: &mut D::Buffer,
    dsum: Option<&mut D::Buffer>,
    n: usize,
    c: usize,
) -> Result<()> {
    match dsum {
        Some(dsum) => dev
            .layernorm_backward_colsum(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, dsum, n, c)?,
        None => dev.layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, n, c)?,
    }
    Ok(())
}

/// Causal attention `y = softmax(scale · q·kᵀ) · v` over the `b·nh` heads in `s.q`, `s.k`,
/// `s.v`, `d.ab` heads at a time (no `t × t` matrix beyond one chunk is ever written); `y`
/// (head layout) goes to `s.d_c2`, which the backward pass only uses later for its own gradient.
fn attention_forward<D: Fused>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    for j in (0..d.b * d.nh).step_by(ab) {
        attention_probs(dev, s, j, d, scale)?;
        let mut pv = GemmDesc::batched(false, false, t, hs, t, ab);
        (pv.b_offset, pv.c_offset) = (j * t * hs, j * t * hs);
        dev.gemm(&pv, &s.probs, &s.v, &mut s.d_c2)?;
    }
    Ok(())
}

/// Backward of [`attention_forward`]: from `dy` in `s.d_c2` and `s.q`, `s.k`, `s.v`, writes
/// `s.dq`, `s.dk`, `s.dv`. Each chunk's probabilities are recomputed exactly as the forward
/// pass computed them (same ops, same shapes, so the same bits).
fn attention_backward<D: Fused>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    for j in (0..d.b * d.nh).step_by(ab) {
        let off = j * t * hs;
        attention_probs(dev, s, j, d, scale)?;
        // dP = dy · vᵀ, dv = Pᵀ · dy.
        let mut dp = GemmDesc::batched(false, true, t, t, hs, ab);
        (dp.a_offset, dp.b_offset) = (off, off);
        dev.gemm(&dp, &s.d_c2, &s.v, &mut s.dprobs)?;
        let mut dv = GemmDesc::batched(true, false, t, hs, t, ab);
        (dv.b_offset, dv.c_offset) = (off, off);
        dev.gemm(&dv, &s.probs, &s.d_c2, &mut s.dv)?;
        // dS (into the scores buffer, free again), then dq = dS · k, dk = dSᵀ · q.
        dev.softmax_causal_backward(&s.probs, &s.dprobs, &mut s.scores, ab, t, scale)?;
        let mut dq = GemmDesc::batched(false, false, t, hs, t, ab);
        (dq.b_offset, dq.c_offset) = (off, off);
        dev.gemm(&dq, &s.scores, &s.k, &mut s.dq)?;
        let mut dk = GemmDesc::batched(true, false, t, hs, t, ab);
        (dk.b_offset, dk.c_offset) = (off, off);
        dev.gemm(&dk, &s.scores, &s.q, &mut s.dk)?;
    }
    Ok(())
}

/// The causal attention probabilities of the chunk of `d.ab` heads starting at head `j`
/// (of the `b·nh` in `s.q`, `s.k`): `s.probs = softmax(scale · q·kᵀ)`, via `s.scores`.
fn attention_probs<D: Fused>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    j: usize,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    let mut qk = GemmDesc::batched(false, true, t, t, hs, ab);
    (qk.a_offset, qk.b_offset) = (j * t * hs, j * t * hs);
    dev.gemm(&qk, &s.q, &s.k, &mut s.scores)?;
    dev.softmax_causal_forward(&s.scores, &mut s.probs, ab, t, scale)?;
    Ok(())
}

/// `out = residual + x · Wᵀ + bias` (no residual: `x · Wᵀ + bias`) for `x` (`n × k`), `W`
/// (`m × k`), `out` and `residual` (`n × m`). With
/// `q8` (FP8 buffers and the linear layer's index) the GEMM runs on FP8 copies of `x` and `W`
/// quantised with their current scales (recording their amaxes); the transposed copies are kept
/// for the backward pass. Bias (and GELU, see [`linear_gelu_forward`]) are fused into the GEMM
/// where the backend offers the epilogue, else separate ops.
#[allow(clippy::too_many_arguments)]
fn linear_forward<D: Fused>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    x: &D::Buffer,
    w: &D::Buffer,
    bias: &D::Buffer,
    out: &mut D::Buffer,
    residual: Option<&D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    linear_act_forward(
        dev,
        q8,
        record,
        LinearInput::Plain(x),
        w,
        bias,
        out,
        residual,
        None,
        n,
        k,
        m,
    )
}

/// [`linear_forward`] into `pre` followed by `out = gelu(pre)`: one GEMM with a fused
/// bias + GELU epilogue where the backend has one (16-bit and FP8 GEMMs).
#[allow(clippy::too_many_arguments)]
fn linear_gelu_forward<D: Fused>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    x: &D::Buffer,
    w: &D::Buffer,
    bias: &D::Buffer,
    pre: &mut D::Buffer,
    out: &mut D::Buffer,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    linear_act_forward(
        dev,
        q8,
        record,
        LinearInput::Plain(x),
        w,
        bias,
        out,
        None,
        Some(pre),
        n,
        k,
        m,
    )
}

/// The input of a linear layer: a tensor, or (FP8 only, computed inside the quantisation of
/// the layer's input, never written) the GELU or the LayerNorm of one.
enum LinearInput<'a, B> {
    Plain(&'a B),
    /// `gelu(pre)` ([`Fused::quantize_fp8_gelu`]).
    GeluOf(&'a B),
    /// `layernorm(x)`, whose statistics are written to `mean` and `rstd`
    /// ([`Fused::layernorm_forward_fp8`]).
    LayerNormOf {
        x: &'a B,
        gamma: &'a B,
        beta: &'a B,
        mean: &'a mut B,
        rstd: &'a mut B,
    },
}

/// A linear layer's GEMM operands: its 16-bit input, or the FP8 input and weight with the
/// inverse scales and the two scale slots.
enum Operands<'a, B> {
    Plain(&'a B),
    Fp8(&'a B, &'a B, &'a B, usize, usize),
}

/// The body of [`linear_forward`] (`gelu_pre` None) and [`linear_gelu_forward`] (no
/// residual); FP8 layers also take their input as a GELU or LayerNorm ([`LinearInput`]).
#[allow(clippy::too_many_arguments)]
fn linear_act_forward<D: Fused>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    record: bool,
    input: LinearInput<'_, D::Buffer>,
    w: &D::Buffer,
    bias: &D::Buffer,
    out: &mut D::Buffer,
    residual: Option<&D::Buffer>,
    gelu_pre: Option<&mut D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    let fast = q8
        .as_ref()
        .is_some_and(|(q, _)| q.state.cfg.fast_accum.forward());
    let desc = GemmDesc::new(false, true, n, m, k).fp8_fast_accum(fast);
    // FP8: the operands' FP8 copies, inverse scales and scale slots.
    // The GEMM's operands: the 16-bit input (with `w`), or the FP8 copies of both.
    let operands = match (q8, input) {
        (None, LinearInput::Plain(x)) => Operands::Plain(x),
        (None, _) => {
            return Err(DeviceError::InvalidArgument(
                "linear_forward: a GELU or LayerNorm on the input rides on the FP8 quantisation \
                 only"
                    .into(),
            )
            .into());
        }
        (Some((q, id)), input) => {
            let st = &mut q.state;
            let (sx, sw) = (
                Fp8State::<D>::slot(id, Operand::Input),
                Fp8State::<D>::slot(id, Operand::Weight),
            );
            let amax = if record {
                &mut st.amax
            } else {
                &mut q.amax_discard
            };
            let kind = id % LINEARS.len();
            let (x8, x8t) = (&mut q.x8[kind], Some(&mut q.x8t[id]));
            match input {
                LinearInput::Plain(x) => dev.quantize_fp8(x, x8, x8t, n, k, &st.scale, amax, sx)?,
                LinearInput::GeluOf(pre) => {
                    dev.quantize_fp8_gelu(pre, x8, x8t, n, k, &st.scale, amax, sx)?
                }
                LinearInput::LayerNormOf {
                    x,
                    gamma,
                    beta,
                    mean,
                    rstd,
                } => dev.layernorm_forward_fp8(
                    x, gamma, beta, mean, rstd, x8, x8t, n, k, LN_EPS, &st.scale, amax, sx,
                )?,
            }
            // The weight's codes come from the start of the forward pass
            // (Gpt::quantize_fp8_weights).
            Operands::Fp8(
                &q.x8[kind],
                &q.w8[id],
                &st.scale_inv,
                st.inv(sx),
                st.inv(sw),
            )
        }
    };
    let fused = match operands {
        Operands::Plain(_) => dev.capabilities().gemm_epilogue(out.dtype()),
        Operands::Fp8(..) => dev.capabilities().fp8_gemm_epilogue(out.dtype()),
    };
    if fused {
        let epi = linear_epilogue(bias, residual, gelu_pre);
        match operands {
            Operands::Plain(x) => dev.gemm_epilogue(&desc, x, w, out, epi)?,
            Operands::Fp8(x8, w8, si, sx, sw) => {
                dev.gemm_fp8_epilogue(&desc, x8, w8, out, si, sx, sw, epi)?
            }
        }
        return Ok(());
    }
    // The separate ops: the residual is copied into the GEMM's output, which adds onto it.
    let (target, gelu_out) = match gelu_pre {
        Some(pre) => (pre, Some(out)),
        None => (out, None),
    };
    let unfused_desc = match residual {
        Some(r) => {
            dev.copy(r, 0, target, 0, n * m)?;
            desc.beta(1.0)
        }
        None => desc,
    };
    match operands {
        Operands::Plain(x) => dev.gemm(&unfused_desc, x, w, target)?,
        Operands::Fp8(x8, w8, si, sx, sw) => {
            dev.gemm_fp8(&unfused_desc, x8, w8, target, si, sx, sw)?
        }
    }
    dev.bias_add(target, bias, n, m)?;
    if let Some(out) = gelu_out {
        dev.gelu_forward(target, out)?;
    }
    Ok(())
}

/// The fused epilogue of a linear layer's GEMM: bias, and GELU or a residual.
fn linear_epilogue<'a, B>(
    bias: &'a B,
    residual: Option<&'a B>,
    gelu_pre: Option<&'a mut B>,
) -> Epilogue<'a, B> {
    match (gelu_pre, residual) {
        (Some(pre), _) => Epilogue::BiasGelu { bias, pre },
        (None, Some(residual)) => Epilogue::BiasResidual { bias, residual },
        (None, None) => Epilogue::Bias(bias),
    }
}

/// Where a linear layer's backward pass finds its input `x` and puts the input gradient `dx`.
enum GradIo<'a, B> {
    Split {
        x: &'a B,
        dx: &'a mut B,
    },
    /// One buffer holds `x` on entry and `dx` on return: the weight gradient (which reads `x`)
    /// runs before the input gradient overwrites it.
    Shared(&'a mut B),
}

impl<'a, B> GradIo<'a, B> {
    fn x(&self) -> &B {
        match self {
            Self::Split { x, .. } => x,
            Self::Shared(buf) => buf,
        }
    }

    fn into_dx(self) -> &'a mut B {
        match self {
            Self::Split { dx, .. } => dx,
            Self::Shared(buf) => buf,
        }
    }
}

/// Backward of [`linear_forward`]: `dW = doutᵀ · x` (written: [`Gpt::zero_grads`] leaves
/// these gradients alone), `dbias += Σ_rows dout` (unless `dbias` is None: a LayerNorm
/// backward computed it already, [`Fused::layernorm_backward_colsum`]; FP8 layers always
/// compute their own), then
/// `dx = dout · W` (overwrites). With `q8`, `dout` is quantised (E5M2 in the HYBRID recipe) and
/// both GEMMs run in FP8 on the copies the forward pass made, in the K-major layout FP8 GEMMs
/// need.
///
/// GELU: with `dgelu_pre` (the pre-activation of a GELU whose output was this layer's input
/// `x`), `dx` becomes the gradient of that pre-activation where the backend fuses the GELU
/// backward into the 16-bit GEMM; returns whether it did (else the caller applies
/// `gelu_backward`, or passes `dout_gelu_pre` to the next layer). With `dout_gelu_pre` (FP8
/// only), `dout` is the gradient of `gelu(dout_gelu_pre)`, this layer's output: the GELU
/// backward runs inside the quantisation ([`Fused::quantize_fp8_grad`]).
#[allow(clippy::too_many_arguments)]
fn linear_backward<D: Fused>(
    dev: &D,
    q8: Option<(&mut Fp8Bufs<D>, usize)>,
    dout: &D::Buffer,
    io: GradIo<'_, D::Buffer>,
    w: &D::Buffer,
    dw: &mut D::Buffer,
    dbias: Option<&mut D::Buffer>,
    dgelu_pre: Option<&D::Buffer>,
    dout_gelu_pre: Option<&D::Buffer>,
    n: usize,
    k: usize,
    m: usize,
) -> Result<bool> {
    match q8 {
        None => {
            if dout_gelu_pre.is_some() {
                return Err(DeviceError::InvalidArgument(
                    "linear_backward: the GELU backward rides on the FP8 quantisation only".into(),
                )
                .into());
            }
            let x = io.x();
            // Written, not added: a linear layer's weight is used once per step.
            let dw_desc = GemmDesc::new(true, false, m, k, n);
            match dbias {
                // The bias gradient comes out of the weight-gradient GEMM (written, not added:
                // it is the bias's only contribution in a step, onto zeroed gradients).
                Some(dbias) if dev.capabilities().gemm_epilogue(dout.dtype()) => {
                    dev.gemm_epilogue(&dw_desc, dout, x, dw, Epilogue::BiasGradA { dbias })?
                }
                Some(dbias) => {
                    dev.gemm(&dw_desc, dout, x, dw)?;
                    dev.bias_backward(dout, dbias, n, m)?;
                }
                None => dev.gemm(&dw_desc, dout, x, dw)?,
            }
            let dx = io.into_dx();
            let desc = GemmDesc::new(false, false, n, k, m);
            match dgelu_pre {
                Some(pre) if dev.capabilities().gemm_epilogue(dx.dtype()) => {
                    dev.gemm_epilogue(&desc, dout, w, dx, Epilogue::DGelu { pre })?;
                    Ok(true)
                }
                _ => {
                    dev.gemm(&desc, dout, w, dx)?;
                    Ok(false)
                }
            }
        }
        Some((q, id)) => {
            let kind = id % LINEARS.len();
            let st = &mut q.state;
            let sy = Fp8State::<D>::slot(id, Operand::GradOutput);
            let (sx, sw) = (
                Fp8State::<D>::slot(id, Operand::Input),
                Fp8State::<D>::slot(id, Operand::Weight),
            );
            // The bias gradient (of the GELU backward's result, where there is one) comes
            // out of the quantisation pass.
            let dbias = dbias.ok_or_else(|| {
                DeviceError::InvalidArgument(
                    "linear_backward: an FP8 layer computes its own bias gradient".into(),
                )
            })?;
            let (dy8, dy8t) = (&mut q.dy8[kind], Some(&mut q.dy8t[kind]));
            dev.quantize_fp8_grad(
                dout,
                dout_gelu_pre,
                dy8,
                dy8t,
                dbias,
                n,
                m,
                &st.scale,
                &mut st.amax,
                sy,
            )?;
            // dW (m × k) = dyᵀ (stored m × n) · x = dyᵀ · (xᵀ stored k × n)ᵀ.
            let fast = st.cfg.fast_accum.backward();
            dev.gemm_fp8(
                &GemmDesc::new(false, true, m, k, n).fp8_fast_accum(fast),
                &q.dy8t[kind],
                &q.x8t[id],
                dw,
                &st.scale_inv,
                st.inv(sy),
                st.inv(sx),
            )?;
            let dx = io.into_dx();
            // dx (n × k) = dy (n × m) · W (m × k) = dy · (Wᵀ stored k × m)ᵀ.
            dev.gemm_fp8(
                &GemmDesc::new(false, true, n, k, m).fp8_fast_accum(fast),
                &q.dy8[kind],
                &q.w8t[id],
                dx,
                &st.scale_inv,
                st.inv(sy),
                st.inv(sw),
            )?;
            Ok(false)
        }
    }
}

/// A LayerNorm's weight and bias gradients (`w`, `b`) and, where given, the gradient its
/// backward pass also sums the residual gradient into (`sum`, a linear layer's bias).
fn ln_grads<B>(
    g: &mut [B],
    w: usize,
    b: usize,
    sum: Option<usize>,
) -> (&mut B, &mut B, Option<&mut B>) {
    match sum {
        Some(s) => {
            let [gw, gb, gs] = g.get_disjoint_mut([w, b, s]).expect("distinct parameters");
            (gw, gb, Some(gs))
        }
        None => {
            let (gw, gb) = two_mut(g, w, b);
            (gw, gb, None)
        }
    }
}

/// Two distinct mutable elements of a slice.
fn two_mut<T>(v: &mut [T], i: usize, j: usize) -> (&mut T, &mut T) {
    assert_ne!(i, j, "two_mut needs distinct indices");
    if i < j {
        let (lo, hi) = v.split_at_mut(j);
        (&mut lo[i], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(i);
        (&mut hi[0], &mut lo[j])
    }
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

    #[test]
    fn attention_chunk_divides_and_fits() {
        assert_eq!(attention_chunk(384, 256), 192); // the seed model: 2 chunks
        assert_eq!(attention_chunk(512, 256), 256); // the large model: 2 chunks
        assert_eq!(attention_chunk(128, 48), 128); // small models: one chunk
        assert_eq!(attention_chunk(7, 8192), 1);
        assert_eq!(attention_chunk(1, 1), 1);
        for (bh, t) in [(384, 256), (100, 300), (97, 512), (12, 2048)] {
            let ab = attention_chunk(bh, t);
            assert!(bh.is_multiple_of(ab) && (ab == 1 || ab * t * t <= ATTENTION_CHUNK_ELEMS));
        }
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

    /// The chunked attention computes what one pass over all heads computes (forward and
    /// backward), for chunks of 1, 2 and 3 of 6 heads.
    #[test]
    fn chunked_attention_matches_one_pass() {
        use duet_cpu::CpuDevice;
        let dev = CpuDevice::new(Some(2)).unwrap();
        let (b, nh, t, hs) = (2, 3, 7, 4);
        let (c, n) = (nh * hs, b * t);
        let mut rng = Rng::new(7);
        let mut rand = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.normal() as f32).collect::<Vec<f32>>()
        };
        let (q, k, v, dy) = (rand(n * c), rand(n * c), rand(n * c), rand(n * c));
        let run = |ab: usize| -> Vec<Vec<f32>> {
            let d = Dims {
                b,
                t,
                c,
                nh,
                hs,
                f: 8,
                n,
                ab,
                flash: false,
            };
            let mut s = Scratch::alloc(&dev, DType::F32, n, c, 8, ab * t * t, true, false).unwrap();
            dev.upload(&q, &mut s.q, 0).unwrap();
            dev.upload(&k, &mut s.k, 0).unwrap();
            dev.upload(&v, &mut s.v, 0).unwrap();
            let scale = 0.5;
            attention_forward(&dev, &mut s, d, scale).unwrap();
            let y = dev.download_f32(&s.d_c2).unwrap();
            dev.upload(&dy, &mut s.d_c2, 0).unwrap();
            attention_backward(&dev, &mut s, d, scale).unwrap();
            let out = [&s.dq, &s.dk, &s.dv].map(|x| dev.download_f32(x).unwrap());
            let mut all = vec![y];
            all.extend(out);
            all
        };
        let whole = run(b * nh);
        assert!(whole[0].iter().all(|x| x.is_finite()) && whole[0].iter().any(|&x| x != 0.0));
        for ab in [1, 2, 3] {
            let chunked = run(ab);
            for (w, c) in whole.iter().zip(&chunked) {
                for (x, y) in w.iter().zip(c) {
                    assert!(
                        (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                        "ab {ab}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
