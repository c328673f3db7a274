//! The GPT model: parameters, a memory plan made once, and an explicit forward and backward pass
//! written as flat per-layer loops over device buffers (after llm.c's `gpt2_forward` /
//! `gpt2_backward`).
//!
//! Architecture (GPT-2 / nanoGPT): token + position embedding; per block
//! `x + proj(attn(LN1(x)))`, then `x + fc2(gelu(fc1(LN2(x))))`; final LayerNorm; the LM head is
//! tied to the token embedding. Weights use PyTorch's `(out_features, in_features)` layout and
//! nanoGPT's names, so a linear layer is `y = x·Wᵀ + b`.

use crate::config::ModelConfig;
use crate::rng::Rng;
use crate::{EngineError, Result};
use duet_device::{DType, Device, DeviceExt, GemmDesc};
use std::sync::Arc;

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

/// Initial weights for `cfg` drawn from `seed` (host f32, [`param_specs`] order).
pub fn init_weights(cfg: &ModelConfig, seed: u64) -> Vec<Vec<f32>> {
    param_specs(cfg)
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let mut rng = Rng::derive(seed, 1000 + i as u64);
            let n = spec.numel();
            match spec.init {
                Init::Zeros => vec![0.0; n],
                Init::Ones => vec![1.0; n],
                Init::Normal(std) => (0..n).map(|_| (rng.normal() * std as f64) as f32).collect(),
            }
        })
        .collect()
}

/// Activations one block saves for its backward pass.
struct BlockActs<B> {
    ln1: B,
    ln1_mean: B,
    ln1_rstd: B,
    qkv: B,
    q: B,
    k: B,
    v: B,
    probs: B,
    atty: B,
    attc: B,
    /// Residual stream after attention.
    res2: B,
    ln2: B,
    ln2_mean: B,
    ln2_rstd: B,
    fch: B,
    fch_gelu: B,
    /// Residual stream after the MLP (the block's output).
    res3: B,
}

/// Scratch buffers the backward pass reuses across blocks.
struct Scratch<B> {
    scores: B,
    dprobs: B,
    dscores: B,
    dresid: B,
    d_c: B,
    d_c2: B,
    dq: B,
    dk: B,
    dv: B,
    dqkv: B,
    d_f: B,
    d_f2: B,
}

/// Bytes held by each category of buffer (the memory plan).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    pub params: u64,
    pub grads: u64,
    pub activations: u64,
    pub scratch: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.activations + self.scratch
    }
}

/// A GPT model bound to a device, with buffers planned for batch `b` and sequence length `t`.
pub struct Gpt<D: Device> {
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
    blocks: Vec<BlockActs<D::Buffer>>,
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
}

fn alloc_all<D: Device>(dev: &D, dtype: DType, lens: &[usize]) -> Result<Vec<D::Buffer>> {
    lens.iter().map(|&n| Ok(dev.alloc(dtype, n)?)).collect()
}

impl<D: Device> Gpt<D> {
    /// Plans and allocates every buffer for batch `b` × sequence `t`, and uploads `weights`
    /// (host f32 in [`param_specs`] order).
    pub fn new(
        dev: Arc<D>,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        weights: &[Vec<f32>],
    ) -> Result<Self> {
        cfg.validate()?;
        if b == 0 || t == 0 || t > cfg.max_seq {
            return Err(EngineError::Config(format!(
                "batch {b} × seq {t} is invalid for a model with max_seq {}",
                cfg.max_seq
            )));
        }
        let specs = param_specs(cfg);
        let f32 = DType::F32;
        let lens: Vec<usize> = specs.iter().map(ParamSpec::numel).collect();
        let params = alloc_all(&*dev, f32, &lens)?;
        let grads = alloc_all(&*dev, f32, &lens)?;
        let (c, f, nh, v) = (cfg.d_model, cfg.ffn, cfg.heads, cfg.vocab);
        let n = b * t;
        let att = b * nh * t * t;
        let a = |len: usize| dev.alloc(f32, len);
        let mut blocks = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            blocks.push(BlockActs {
                ln1: a(n * c)?,
                ln1_mean: a(n)?,
                ln1_rstd: a(n)?,
                qkv: a(n * 3 * c)?,
                q: a(n * c)?,
                k: a(n * c)?,
                v: a(n * c)?,
                probs: a(att)?,
                atty: a(n * c)?,
                attc: a(n * c)?,
                res2: a(n * c)?,
                ln2: a(n * c)?,
                ln2_mean: a(n)?,
                ln2_rstd: a(n)?,
                fch: a(n * f)?,
                fch_gelu: a(n * f)?,
                res3: a(n * c)?,
            });
        }
        let scratch = Scratch {
            scores: a(att)?,
            dprobs: a(att)?,
            dscores: a(att)?,
            dresid: a(n * c)?,
            d_c: a(n * c)?,
            d_c2: a(n * c)?,
            dq: a(n * c)?,
            dk: a(n * c)?,
            dv: a(n * c)?,
            dqkv: a(n * 3 * c)?,
            d_f: a(n * f)?,
            d_f2: a(n * f)?,
        };
        let param_bytes = 4 * lens.iter().sum::<usize>() as u64;
        let per_block = 4 * (n * (c * 8 + 3 * c + 2 * f + 4) + att) as u64;
        let plan = MemoryPlan {
            params: param_bytes,
            grads: param_bytes,
            activations: per_block * cfg.layers as u64
                + 4 * (n * (2 * c + 2 * v + 3) + 2 * n) as u64,
            scratch: 4 * (3 * att + n * (9 * c + 2 * f)) as u64,
        };
        let mut model = Self {
            tokens: dev.alloc(DType::I32, n)?,
            targets: dev.alloc(DType::I32, n)?,
            encoded: a(n * c)?,
            lnf: a(n * c)?,
            lnf_mean: a(n)?,
            lnf_rstd: a(n)?,
            logits: a(n * v)?,
            losses: a(n)?,
            dlogits: a(n * v)?,
            blocks,
            scratch,
            params,
            grads,
            specs,
            cfg: cfg.clone(),
            b,
            t,
            plan,
            zeros_c: a(c)?,
            last_count: 0,
            dev,
        };
        model.set_weights(weights)?;
        Ok(model)
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
        (&mut self.params, &self.grads)
    }

    pub fn grads(&self) -> &[D::Buffer] {
        &self.grads
    }

    /// Replaces every weight (host f32, [`param_specs`] order).
    pub fn set_weights(&mut self, weights: &[Vec<f32>]) -> Result<()> {
        if weights.len() != self.specs.len() {
            return Err(EngineError::Config(format!(
                "expected {} weight tensors, got {}",
                self.specs.len(),
                weights.len()
            )));
        }
        for ((spec, w), buf) in self.specs.iter().zip(weights).zip(&mut self.params) {
            if w.len() != spec.numel() {
                return Err(EngineError::Config(format!(
                    "{} has {} values, expected {} (shape {:?})",
                    spec.name,
                    w.len(),
                    spec.numel(),
                    spec.shape
                )));
            }
            self.dev.upload(w, buf, 0)?;
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

    /// Runs the forward pass on `tokens` (`b·t`, row-major), up to the logits.
    pub fn forward(&mut self, tokens: &[i32]) -> Result<()> {
        self.check_tokens("forward", tokens, false)?;
        let dev = &*self.dev;
        let (b, t, c, nh, f, v) = (
            self.b,
            self.t,
            self.cfg.d_model,
            self.cfg.heads,
            self.cfg.ffn,
            self.cfg.vocab,
        );
        let hs = c / nh;
        let n = b * t;
        let p = &self.params;
        dev.upload(tokens, &mut self.tokens, 0)?;
        dev.embedding_forward(&self.tokens, &p[0], &p[1], &mut self.encoded, b, t, c)?;
        let scale = 1.0 / (hs as f32).sqrt();
        for l in 0..self.cfg.layers {
            let (done, rest) = self.blocks.split_at_mut(l);
            let x = if l == 0 {
                &self.encoded
            } else {
                &done[l - 1].res3
            };
            let a = &mut rest[0];
            let w = |bp: BlockParam| &p[param_index(l, bp)];
            // Attention.
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
            linear_forward(
                dev,
                &a.ln1,
                w(BlockParam::AttnW),
                w(BlockParam::AttnB),
                &mut a.qkv,
                n,
                c,
                3 * c,
                0.0,
            )?;
            dev.split_heads(&a.qkv, &mut a.q, &mut a.k, &mut a.v, b, t, nh, hs)?;
            dev.gemm(
                &GemmDesc::batched(false, true, t, t, hs, b * nh),
                &a.q,
                &a.k,
                &mut self.scratch.scores,
            )?;
            dev.softmax_causal_forward(&self.scratch.scores, &mut a.probs, b * nh, t, scale)?;
            dev.gemm(
                &GemmDesc::batched(false, false, t, hs, t, b * nh),
                &a.probs,
                &a.v,
                &mut a.atty,
            )?;
            dev.merge_heads(&a.atty, &mut a.attc, b, t, nh, hs, false)?;
            dev.copy(x, 0, &mut a.res2, 0, n * c)?;
            linear_forward(
                dev,
                &a.attc,
                w(BlockParam::ProjW),
                w(BlockParam::ProjB),
                &mut a.res2,
                n,
                c,
                c,
                1.0,
            )?;
            // MLP.
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
            linear_forward(
                dev,
                &a.ln2,
                w(BlockParam::FcW),
                w(BlockParam::FcB),
                &mut a.fch,
                n,
                c,
                f,
                0.0,
            )?;
            dev.gelu_forward(&a.fch, &mut a.fch_gelu)?;
            dev.copy(&a.res2, 0, &mut a.res3, 0, n * c)?;
            linear_forward(
                dev,
                &a.fch_gelu,
                w(BlockParam::FcProjW),
                w(BlockParam::FcProjB),
                &mut a.res3,
                n,
                f,
                c,
                1.0,
            )?;
        }
        let last = self.blocks.last().map(|a| &a.res3).unwrap_or(&self.encoded);
        let nparams = p.len();
        dev.layernorm_forward(
            last,
            &p[nparams - 2],
            &p[nparams - 1],
            &mut self.lnf,
            &mut self.lnf_mean,
            &mut self.lnf_rstd,
            n,
            c,
            LN_EPS,
        )?;
        // Tied LM head: logits = lnf · wteᵀ.
        dev.gemm(
            &GemmDesc::new(false, true, n, v, c),
            &self.lnf,
            &p[0],
            &mut self.logits,
        )?;
        Ok(())
    }

    /// Mean cross-entropy of the last forward pass against `targets` (negative = ignored).
    /// With `with_grad`, also prepares the logits' gradient for [`Gpt::backward`].
    pub fn loss(&mut self, targets: &[i32], with_grad: bool) -> Result<f32> {
        self.check_tokens("loss", targets, true)?;
        let count = targets.iter().filter(|&&x| x >= 0).count();
        if count == 0 {
            return Err(EngineError::Config("loss: every target is ignored".into()));
        }
        self.last_count = count;
        let dev = &*self.dev;
        let n = self.b * self.t;
        dev.upload(targets, &mut self.targets, 0)?;
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
            1.0 / count as f32,
        )?;
        let losses: Vec<f32> = dev.download(&self.losses)?;
        let sum: f64 = losses.iter().map(|&x| x as f64).sum();
        Ok((sum / count as f64) as f32)
    }

    /// Zeroes every parameter gradient.
    pub fn zero_grads(&mut self) -> Result<()> {
        for g in &mut self.grads {
            self.dev.fill(g, 0.0)?;
        }
        Ok(())
    }

    /// Backward pass from the gradient prepared by `loss(.., true)`; accumulates into the
    /// parameter gradients (call [`Gpt::zero_grads`] first).
    pub fn backward(&mut self) -> Result<()> {
        let dev = &*self.dev;
        let (b, t, c, nh, f, v) = (
            self.b,
            self.t,
            self.cfg.d_model,
            self.cfg.heads,
            self.cfg.ffn,
            self.cfg.vocab,
        );
        let hs = c / nh;
        let n = b * t;
        let scale = 1.0 / (hs as f32).sqrt();
        let p = &self.params;
        let g = &mut self.grads;
        let s = &mut self.scratch;
        let np = p.len();

        // LM head: logits = lnf · wteᵀ.
        dev.gemm(
            &GemmDesc::new(false, false, n, c, v),
            &self.dlogits,
            &p[0],
            &mut s.d_c,
        )?;
        dev.gemm(
            &GemmDesc::new(true, false, v, c, n).beta(1.0),
            &self.dlogits,
            &self.lnf,
            &mut g[0],
        )?;
        // Final LayerNorm: its input gradient starts the residual stream gradient.
        dev.fill(&mut s.dresid, 0.0)?;
        let last = self.blocks.last().map(|a| &a.res3).unwrap_or(&self.encoded);
        {
            let (gw, gb) = two_mut(g, np - 2, np - 1);
            dev.layernorm_backward(
                &s.d_c,
                last,
                &p[np - 2],
                &self.lnf_mean,
                &self.lnf_rstd,
                &mut s.dresid,
                gw,
                gb,
                n,
                c,
            )?;
        }

        for l in (0..self.cfg.layers).rev() {
            let x = if l == 0 {
                &self.encoded
            } else {
                &self.blocks[l - 1].res3
            };
            let a = &self.blocks[l];
            let w = |bp: BlockParam| &p[param_index(l, bp)];
            let gi = |bp: BlockParam| param_index(l, bp);

            // res3 = res2 + fch_gelu · FcProjWᵀ + FcProjB; dresid passes through unchanged.
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::FcProjW), gi(BlockParam::FcProjB));
                linear_backward(
                    dev,
                    &s.dresid,
                    &a.fch_gelu,
                    w(BlockParam::FcProjW),
                    &mut s.d_f,
                    gw,
                    gb,
                    n,
                    f,
                    c,
                )?;
            }
            dev.gelu_backward(&a.fch, &s.d_f, &mut s.d_f2)?;
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::FcW), gi(BlockParam::FcB));
                linear_backward(
                    dev,
                    &s.d_f2,
                    &a.ln2,
                    w(BlockParam::FcW),
                    &mut s.d_c,
                    gw,
                    gb,
                    n,
                    c,
                    f,
                )?;
            }
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::Ln2W), gi(BlockParam::Ln2B));
                dev.layernorm_backward(
                    &s.d_c,
                    &a.res2,
                    w(BlockParam::Ln2W),
                    &a.ln2_mean,
                    &a.ln2_rstd,
                    &mut s.dresid,
                    gw,
                    gb,
                    n,
                    c,
                )?;
            }
            // res2 = x + attc · ProjWᵀ + ProjB.
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::ProjW), gi(BlockParam::ProjB));
                linear_backward(
                    dev,
                    &s.dresid,
                    &a.attc,
                    w(BlockParam::ProjW),
                    &mut s.d_c,
                    gw,
                    gb,
                    n,
                    c,
                    c,
                )?;
            }
            // attc = merge(atty): the gradient goes back through the inverse permutation.
            dev.merge_heads(&s.d_c, &mut s.d_c2, b, t, nh, hs, true)?;
            // atty = P · v.
            dev.gemm(
                &GemmDesc::batched(false, true, t, t, hs, b * nh),
                &s.d_c2,
                &a.v,
                &mut s.dprobs,
            )?;
            dev.gemm(
                &GemmDesc::batched(true, false, t, hs, t, b * nh),
                &a.probs,
                &s.d_c2,
                &mut s.dv,
            )?;
            // P = softmax(scale · q·kᵀ).
            dev.softmax_causal_backward(&a.probs, &s.dprobs, &mut s.dscores, b * nh, t, scale)?;
            dev.gemm(
                &GemmDesc::batched(false, false, t, hs, t, b * nh),
                &s.dscores,
                &a.k,
                &mut s.dq,
            )?;
            dev.gemm(
                &GemmDesc::batched(true, false, t, hs, t, b * nh),
                &s.dscores,
                &a.q,
                &mut s.dk,
            )?;
            dev.split_heads_backward(&s.dq, &s.dk, &s.dv, &mut s.dqkv, b, t, nh, hs)?;
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::AttnW), gi(BlockParam::AttnB));
                linear_backward(
                    dev,
                    &s.dqkv,
                    &a.ln1,
                    w(BlockParam::AttnW),
                    &mut s.d_c,
                    gw,
                    gb,
                    n,
                    c,
                    3 * c,
                )?;
                // The key bias adds q_i·b to a whole row of scores, which the softmax ignores:
                // its gradient is exactly zero, and what a GEMM leaves there is rounding noise
                // that Adam would turn into lr-sized random updates (different on every
                // backend). Make it exactly zero.
                dev.copy(&self.zeros_c, 0, gb, c, c)?;
            }
            {
                let (gw, gb) = two_mut(g, gi(BlockParam::Ln1W), gi(BlockParam::Ln1B));
                dev.layernorm_backward(
                    &s.d_c,
                    x,
                    w(BlockParam::Ln1W),
                    &a.ln1_mean,
                    &a.ln1_rstd,
                    &mut s.dresid,
                    gw,
                    gb,
                    n,
                    c,
                )?;
            }
        }
        let (gwte, gwpe) = two_mut(g, 0, 1);
        dev.embedding_backward(&self.tokens, &s.dresid, gwte, gwpe, b, t, c)?;
        Ok(())
    }
}

/// `out = beta·out + x · Wᵀ + bias` for `x` (`n × k`), `W` (`m × k`), `out` (`n × m`).
#[allow(clippy::too_many_arguments)]
fn linear_forward<D: Device>(
    dev: &D,
    x: &D::Buffer,
    w: &D::Buffer,
    bias: &D::Buffer,
    out: &mut D::Buffer,
    n: usize,
    k: usize,
    m: usize,
    beta: f32,
) -> Result<()> {
    dev.gemm(&GemmDesc::new(false, true, n, m, k).beta(beta), x, w, out)?;
    dev.bias_add(out, bias, n, m)?;
    Ok(())
}

/// Backward of [`linear_forward`]: `dx = dout · W` (overwrites), `dW += doutᵀ · x`,
/// `dbias += Σ_rows dout`.
#[allow(clippy::too_many_arguments)]
fn linear_backward<D: Device>(
    dev: &D,
    dout: &D::Buffer,
    x: &D::Buffer,
    w: &D::Buffer,
    dx: &mut D::Buffer,
    dw: &mut D::Buffer,
    dbias: &mut D::Buffer,
    n: usize,
    k: usize,
    m: usize,
) -> Result<()> {
    dev.gemm(&GemmDesc::new(false, false, n, k, m), dout, w, dx)?;
    dev.gemm(&GemmDesc::new(true, false, m, k, n).beta(1.0), dout, x, dw)?;
    dev.bias_backward(dout, dbias, n, m)?;
    Ok(())
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
}
