//! Autoregressive generation with a KV cache: each new token runs the model on one position,
//! attending to the keys and values cached for the earlier ones; a prompt (and, past the
//! context, the window kept) is run in one batched pass over all its positions (the prefill).
//!
//! Everything runs on the device except the attention softmax of one position over the cached
//! ones (a few hundred numbers per head), which is done on the host, and the sampling.
//!
//! The generator holds its own copy of the weights, in f32 or — like Transformer Engine's
//! `fp8_model_init` — with the linear layers' matrices in FP8 (E4M3 with a per-tensor scale, OCP
//! or FNUZ as the device uses), a quarter of their f32 size; each is dequantised into a scratch
//! matrix right before its GEMM.

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::fp8::{Fp8Family, Fp8Recipe};
use crate::init::{ShapeRequest, SourceFormat};
use crate::model::{BlockParam, Gpt, LN_EPS, check_weights, param_index, param_specs};
use crate::rng::Rng;
use crate::train::argmax;
use crate::{EngineError, Result};
use duet_device::{
    AddAssign, BiasAdd, Buffer, DType, Device, DeviceExt, EmbeddingForward, Fp8Format, GeluForward,
    Gemm, GemmDesc, LayerNormForward, MergeHeads, SoftmaxCausalForward, SplitHeads,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the generator stores the linear layers' weight matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// E4M3 with one scale per matrix (the device's FP8 family).
    Fp8,
}

/// The linear layers' weight matrices of a block.
const LINEAR_WEIGHTS: [BlockParam; 4] = [
    BlockParam::AttnW,
    BlockParam::ProjW,
    BlockParam::FcW,
    BlockParam::FcProjW,
];

/// How to pick the next token, and when to stop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Nucleus sampling: keep only the fewest most likely tokens whose probabilities (after the
    /// temperature and top-k) sum to at least this (1 = all).
    pub top_p: f32,
    pub seed: u64,
    /// Stop after sampling this token (the end-of-text token): it is the last one returned.
    pub eos: Option<i32>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
            eos: None,
        }
    }
}

/// Picks a token from `logits` (one row): the argmax at temperature 0; else a draw from the
/// softmax of `logits / temperature` over the `top_k` most likely tokens, cut to the nucleus of
/// probability `top_p` (Hugging Face's order: temperature, top-k, top-p).
pub fn sample(logits: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.top_k > 0 {
        idx.truncate(s.top_k);
    }
    let max = logits[idx[0]] as f64;
    let mut w: Vec<f64> = idx
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / s.temperature as f64).exp())
        .collect();
    let mut total: f64 = w.iter().sum();
    if s.top_p < 1.0 {
        // The most likely token alone when even it exceeds top_p.
        let mut cum = 0.0;
        let keep = w
            .iter()
            .position(|&wi| {
                cum += wi / total;
                cum >= s.top_p as f64
            })
            .map_or(w.len(), |k| k + 1);
        idx.truncate(keep);
        w.truncate(keep);
        total = w.iter().sum();
    }
    let mut u = rng.uniform() * total;
    for (k, &wi) in w.iter().enumerate() {
        if u < wi {
            return idx[k];
        }
        u -= wi;
    }
    *idx.last().expect("non-empty")
}

/// What a generator has computed, for measuring its cost (not its time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GenStats {
    /// Positions the model ran (one a step, the window's length a prefill).
    pub positions: u64,
    /// Passes through the model: a step or a whole prefill is one.
    pub passes: u64,
    /// Prefills (a prompt, and past the context each re-fill of the window).
    pub prefills: u64,
    /// Re-fills of the window past the context ([`Generator::generate_sliding`]).
    pub refills: u64,
}

/// The weights as the generator holds them.
struct Weights<D: Device> {
    /// [`param_specs`] order; the linear matrices in FP8 with [`WeightFormat::Fp8`].
    params: Vec<D::Buffer>,
    /// Per parameter: the factor that turns stored values back into weights (1 for f32).
    scale_inv: Vec<f32>,
    /// FP8 only: one f32 scratch matrix per kind of linear layer, dequantised before each GEMM.
    wtmp: Vec<D::Buffer>,
}

impl<D: Device> Weights<D> {
    fn get(&self, l: usize, p: BlockParam) -> &D::Buffer {
        &self.params[param_index(l, p)]
    }

    /// The weight matrix of linear kind `kind` in layer `l`, as f32 (dequantised into its
    /// scratch matrix when stored in FP8).
    fn linear(&mut self, dev: &D, l: usize, kind: usize) -> Result<&D::Buffer> {
        let i = param_index(l, LINEAR_WEIGHTS[kind]);
        if self.params[i].dtype() == DType::F32 {
            return Ok(&self.params[i]);
        }
        dev.cast(&self.params[i], &mut self.wtmp[kind], self.scale_inv[i])?;
        Ok(&self.wtmp[kind])
    }
}

/// The activations of `n` positions run together.
struct Acts<D: Device> {
    n: usize,
    /// The residual stream, `n × d_model`.
    x: D::Buffer,
    ln: D::Buffer,
    mean: D::Buffer,
    rstd: D::Buffer,
    qkv: D::Buffer,
    /// `(heads, n, head size)` each.
    q: D::Buffer,
    k: D::Buffer,
    v: D::Buffer,
    /// The attention output, heads merged: `n × d_model`.
    y: D::Buffer,
    h: D::Buffer,
    hg: D::Buffer,
}

impl<D: Device> Acts<D> {
    fn alloc(dev: &D, cfg: &ModelConfig, n: usize) -> Result<Self> {
        let (c, f) = (cfg.d_model, cfg.ffn);
        let a = |len: usize| dev.alloc(DType::F32, len);
        Ok(Self {
            n,
            x: a(n * c)?,
            ln: a(n * c)?,
            mean: a(n)?,
            rstd: a(n)?,
            qkv: a(3 * n * c)?,
            q: a(n * c)?,
            k: a(n * c)?,
            v: a(n * c)?,
            y: a(n * c)?,
            h: a(n * f)?,
            hg: a(n * f)?,
        })
    }
}

/// A prefill's buffers for `acts.n` positions (allocated at the first prefill of that length).
struct PrefillBufs<D: Device> {
    acts: Acts<D>,
    tokens: D::Buffer,
    /// `heads × n × n`.
    scores: D::Buffer,
    probs: D::Buffer,
    /// The attention output in `(heads, n, head size)` layout.
    yh: D::Buffer,
}

impl<D: Device> PrefillBufs<D> {
    fn alloc(dev: &D, cfg: &ModelConfig, n: usize) -> Result<Self> {
        let a = |len: usize| dev.alloc(DType::F32, len);
        Ok(Self {
            acts: Acts::alloc(dev, cfg, n)?,
            tokens: dev.alloc(DType::I32, n)?,
            scores: a(cfg.heads * n * n)?,
            probs: a(cfg.heads * n * n)?,
            yh: a(n * cfg.d_model)?,
        })
    }
}

/// LayerNorm 1 and the QKV projection of the `a.n` rows of `a.x`, split into heads: `a.q`,
/// `a.k`, `a.v` in `(heads, n, head size)` layout.
fn attention_inputs<D: Device>(
    dev: &D,
    w: &mut Weights<D>,
    cfg: &ModelConfig,
    l: usize,
    a: &mut Acts<D>,
) -> Result<()> {
    let (c, nh, n) = (cfg.d_model, cfg.heads, a.n);
    dev.exec(LayerNormForward {
        x: &a.x,
        gamma: w.get(l, BlockParam::Ln1W),
        beta: w.get(l, BlockParam::Ln1B),
        out: &mut a.ln,
        mean: &mut a.mean,
        rstd: &mut a.rstd,
        n,
        c,
        eps: LN_EPS,
    })?;
    dev.exec(Gemm {
        desc: &GemmDesc::new(false, true, n, 3 * c, c),
        a: &a.ln,
        b: w.linear(dev, l, 0)?,
        c: &mut a.qkv,
    })?;
    dev.exec(BiasAdd {
        x: &mut a.qkv,
        bias: w.get(l, BlockParam::AttnB),
        rows: n,
        c: 3 * c,
    })?;
    dev.exec(SplitHeads {
        qkv: &a.qkv,
        q: &mut a.q,
        k: &mut a.k,
        v: &mut a.v,
        b: 1,
        t: n,
        nh,
        hs: c / nh,
    })?;
    Ok(())
}

/// The rest of block `l` from the merged attention output `a.y`: the output projection added
/// to the residual `a.x`, then LayerNorm 2 and the MLP added to it.
fn block_rest<D: Device>(
    dev: &D,
    w: &mut Weights<D>,
    cfg: &ModelConfig,
    l: usize,
    a: &mut Acts<D>,
) -> Result<()> {
    let (c, f, n) = (cfg.d_model, cfg.ffn, a.n);
    dev.exec(Gemm {
        desc: &GemmDesc::new(false, true, n, c, c).beta(1.0),
        a: &a.y,
        b: w.linear(dev, l, 1)?,
        c: &mut a.x,
    })?;
    dev.exec(BiasAdd {
        x: &mut a.x,
        bias: w.get(l, BlockParam::ProjB),
        rows: n,
        c,
    })?;
    dev.exec(LayerNormForward {
        x: &a.x,
        gamma: w.get(l, BlockParam::Ln2W),
        beta: w.get(l, BlockParam::Ln2B),
        out: &mut a.ln,
        mean: &mut a.mean,
        rstd: &mut a.rstd,
        n,
        c,
        eps: LN_EPS,
    })?;
    dev.exec(Gemm {
        desc: &GemmDesc::new(false, true, n, f, c),
        a: &a.ln,
        b: w.linear(dev, l, 2)?,
        c: &mut a.h,
    })?;
    dev.exec(BiasAdd {
        x: &mut a.h,
        bias: w.get(l, BlockParam::FcB),
        rows: n,
        c: f,
    })?;
    dev.exec(GeluForward {
        x: &a.h,
        out: &mut a.hg,
    })?;
    dev.exec(Gemm {
        desc: &GemmDesc::new(false, true, n, c, f).beta(1.0),
        a: &a.hg,
        b: w.linear(dev, l, 3)?,
        c: &mut a.x,
    })?;
    dev.exec(BiasAdd {
        x: &mut a.x,
        bias: w.get(l, BlockParam::FcProjB),
        rows: n,
        c,
    })?;
    Ok(())
}

/// Weights, per-layer key/value caches, one position's activations and (allocated by the first
/// prefill) a prefill's.
pub struct Generator<D: Device> {
    dev: Arc<D>,
    cfg: ModelConfig,
    w: Weights<D>,
    k_cache: Vec<D::Buffer>,
    v_cache: Vec<D::Buffer>,
    /// One position's activations ([`Generator::step`]; the final LayerNorm's input).
    one: Acts<D>,
    /// The position embedding's row of a step.
    x2: D::Buffer,
    /// A step's attention scores: `heads × max_seq`.
    scores: D::Buffer,
    logits: D::Buffer,
    prefill: Option<PrefillBufs<D>>,
    /// Positions cached so far.
    len: usize,
    /// Tokens the sliding window keeps at a re-fill ([`sliding_keep`] unless set).
    keep: usize,
    stats: GenStats,
}

/// The tokens [`Generator::generate_sliding`] keeps when it re-fills a full cache: half the
/// context, so a re-fill (one batched pass over `max_seq / 2` positions) comes every
/// `max_seq / 2 + 1` new tokens, and every token is predicted from at least `max_seq / 2`
/// tokens before it.
pub fn sliding_keep(max_seq: usize) -> usize {
    (max_seq / 2).max(1)
}

impl<D: Device> Generator<D> {
    /// A generator with f32 copies of `model`'s weights.
    pub fn new(model: &Gpt<D>) -> Result<Self> {
        let weights = model.weights()?;
        Self::from_weights(
            model.device().clone(),
            model.config(),
            &weights,
            WeightFormat::F32,
        )
    }

    /// A generator for `weights` (host f32, [`param_specs`] order) with caches for up to
    /// `cfg.max_seq` positions.
    pub fn from_weights(
        dev: Arc<D>,
        cfg: &ModelConfig,
        weights: &[Vec<f32>],
        format: WeightFormat,
    ) -> Result<Self> {
        cfg.validate()?;
        let specs = param_specs(cfg);
        check_weights(&specs, weights)?;
        let (c, f, nh, t, v) = (cfg.d_model, cfg.ffn, cfg.heads, cfg.max_seq, cfg.vocab);
        let fp8 = match format {
            WeightFormat::F32 => None,
            WeightFormat::Fp8 => {
                let (dtype, _) = Fp8Family::of_device(&dev.info()).dtypes(Fp8Recipe::Hybrid);
                Some((dtype, Fp8Format::of(dtype).expect("an fp8 dtype")))
            }
        };
        let linear: Vec<usize> = (0..cfg.layers)
            .flat_map(|l| LINEAR_WEIGHTS.map(|bp| param_index(l, bp)))
            .collect();
        let mut params = Vec::with_capacity(specs.len());
        let mut scale_inv = Vec::with_capacity(specs.len());
        for (i, w) in weights.iter().enumerate() {
            match fp8 {
                Some((dtype, fmt)) if linear.contains(&i) => {
                    // Per-tensor scale: the largest magnitude maps to the format's largest value.
                    let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
                    let scale = if amax > 0.0 && amax.is_finite() {
                        fmt.max_finite() / amax
                    } else {
                        1.0
                    };
                    let codes: Vec<u8> = w.iter().map(|&x| fmt.encode(x * scale)).collect();
                    let mut buf = dev.alloc(dtype, codes.len())?;
                    dev.upload(&codes, &mut buf, 0)?;
                    params.push(buf);
                    scale_inv.push(1.0 / scale);
                }
                _ => {
                    params.push(dev.upload_new(w)?);
                    scale_inv.push(1.0);
                }
            }
        }
        let a = |n: usize| dev.alloc(DType::F32, n);
        let wtmp = if fp8.is_some() {
            vec![a(3 * c * c)?, a(c * c)?, a(f * c)?, a(c * f)?]
        } else {
            Vec::new()
        };
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.layers {
            k_cache.push(a(nh * t * (c / nh))?);
            v_cache.push(a(nh * t * (c / nh))?);
        }
        Ok(Self {
            one: Acts::alloc(&*dev, cfg, 1)?,
            x2: a(c)?,
            scores: a(nh * t)?,
            logits: a(v)?,
            k_cache,
            v_cache,
            w: Weights {
                params,
                scale_inv,
                wtmp,
            },
            prefill: None,
            cfg: cfg.clone(),
            dev,
            len: 0,
            keep: sliding_keep(t),
            stats: GenStats::default(),
        })
    }

    /// Bytes of device memory the weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.w.params.iter().map(|p| p.size_bytes() as u64).sum()
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Empties the cache (a new sequence).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// What the generator has computed so far.
    pub fn stats(&self) -> GenStats {
        self.stats
    }

    /// The tokens [`Generator::generate_sliding`] keeps at a re-fill: 1 to `max_seq − 1`
    /// (default [`sliding_keep`]).
    pub fn set_keep(&mut self, keep: usize) -> Result<()> {
        let tmax = self.cfg.max_seq;
        if keep == 0 || keep >= tmax {
            return Err(EngineError::Config(format!(
                "the sliding window keeps 1..{} tokens (max_seq {tmax} − 1), not {keep}",
                tmax.saturating_sub(1)
            )));
        }
        self.keep = keep;
        Ok(())
    }

    fn check_token(&self, tok: i32) -> Result<()> {
        let v = self.cfg.vocab;
        if tok < 0 || tok as usize >= v {
            return Err(EngineError::Config(format!(
                "token {tok} is outside the vocabulary 0..{v}"
            )));
        }
        Ok(())
    }

    /// Runs one position (token `tok` at position `len`), appends its keys and values to the
    /// cache and returns the logits for the next token.
    pub fn step(&mut self, tok: i32) -> Result<Vec<f32>> {
        let (c, nh, tmax) = (self.cfg.d_model, self.cfg.heads, self.cfg.max_seq);
        let hs = c / nh;
        let pos = self.len;
        if pos >= tmax {
            return Err(EngineError::Config(format!(
                "the context is full: the model's max_seq is {tmax}"
            )));
        }
        self.check_token(tok)?;
        let dev = &*self.dev;
        let (w, a) = (&mut self.w, &mut self.one);
        // Embedding: wte[tok] + wpe[pos].
        dev.copy(&w.params[0], tok as usize * c, &mut a.x, 0, c)?;
        dev.copy(&w.params[1], pos * c, &mut self.x2, 0, c)?;
        dev.exec(AddAssign {
            dst: &mut a.x,
            src: &self.x2,
        })?;
        let scale = 1.0 / (hs as f32).sqrt();
        for l in 0..self.cfg.layers {
            attention_inputs(dev, w, &self.cfg, l, a)?;
            for h in 0..nh {
                let dst = h * tmax * hs + pos * hs;
                dev.copy(&a.k, h * hs, &mut self.k_cache[l], dst, hs)?;
                dev.copy(&a.v, h * hs, &mut self.v_cache[l], dst, hs)?;
            }
            let n = pos + 1;
            // scores[h, j] = q_h · k_h[j] for the n cached positions.
            let qk = GemmDesc {
                ldc: tmax,
                stride_a: hs,
                stride_b: tmax * hs,
                stride_c: tmax,
                ..GemmDesc::batched(false, true, 1, n, hs, nh)
            };
            dev.exec(Gemm {
                desc: &qk,
                a: &a.q,
                b: &self.k_cache[l],
                c: &mut self.scores,
            })?;
            // Softmax over the cached positions, on the host.
            let mut sc: Vec<f32> = dev.download(&self.scores)?;
            for h in 0..nh {
                let row = &mut sc[h * tmax..h * tmax + n];
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x * scale));
                let mut total = 0f32;
                for x in row.iter_mut() {
                    *x = (*x * scale - m).exp();
                    total += *x;
                }
                row.iter_mut().for_each(|x| *x /= total);
            }
            dev.upload(&sc, &mut self.scores, 0)?;
            let pv = GemmDesc {
                lda: tmax,
                stride_a: tmax,
                stride_b: tmax * hs,
                stride_c: hs,
                ..GemmDesc::batched(false, false, 1, hs, n, nh)
            };
            // One position: heads already lie in (nh, hs) order = the merged layout.
            dev.exec(Gemm {
                desc: &pv,
                a: &self.scores,
                b: &self.v_cache[l],
                c: &mut a.y,
            })?;
            block_rest(dev, w, &self.cfg, l, a)?;
        }
        self.len += 1;
        self.stats.positions += 1;
        self.stats.passes += 1;
        self.head()
    }

    /// Runs `tokens` at positions `0..n` of an empty cache in one pass — each layer's GEMMs
    /// over all `n` rows, the causal softmax on the device, as the training forward pass does —
    /// fills the cache with their keys and values and returns the logits after the last.
    fn prefill(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        let (c, nh, tmax) = (self.cfg.d_model, self.cfg.heads, self.cfg.max_seq);
        let (hs, n) = (c / nh, tokens.len());
        if self.len != 0 || n == 0 || n > tmax {
            return Err(EngineError::Config(format!(
                "a prefill runs 1..{tmax} tokens into an empty cache, not {n} after {}",
                self.len
            )));
        }
        for &t in tokens {
            self.check_token(t)?;
        }
        let dev = &*self.dev;
        if self.prefill.as_ref().is_none_or(|p| p.acts.n != n) {
            self.prefill = None;
            self.prefill = Some(PrefillBufs::alloc(dev, &self.cfg, n)?);
        }
        let p = self.prefill.as_mut().expect("allocated above");
        let w = &mut self.w;
        dev.upload(tokens, &mut p.tokens, 0)?;
        dev.exec(EmbeddingForward {
            tokens: &p.tokens,
            wte: &w.params[0],
            wpe: &w.params[1],
            out: &mut p.acts.x,
            b: 1,
            t: n,
            c,
        })?;
        let scale = 1.0 / (hs as f32).sqrt();
        for l in 0..self.cfg.layers {
            attention_inputs(dev, w, &self.cfg, l, &mut p.acts)?;
            for h in 0..nh {
                let (src, dst) = (h * n * hs, h * tmax * hs);
                dev.copy(&p.acts.k, src, &mut self.k_cache[l], dst, n * hs)?;
                dev.copy(&p.acts.v, src, &mut self.v_cache[l], dst, n * hs)?;
            }
            dev.exec(Gemm {
                desc: &GemmDesc::batched(false, true, n, n, hs, nh),
                a: &p.acts.q,
                b: &p.acts.k,
                c: &mut p.scores,
            })?;
            dev.exec(SoftmaxCausalForward {
                scores: &p.scores,
                probs: &mut p.probs,
                batch: nh,
                t: n,
                scale,
            })?;
            dev.exec(Gemm {
                desc: &GemmDesc::batched(false, false, n, hs, n, nh),
                a: &p.probs,
                b: &p.acts.v,
                c: &mut p.yh,
            })?;
            dev.exec(MergeHeads {
                y: &p.yh,
                out: &mut p.acts.y,
                b: 1,
                t: n,
                nh,
                hs,
                backward: false,
            })?;
            block_rest(dev, w, &self.cfg, l, &mut p.acts)?;
        }
        // The last position's residual stream goes through the head.
        dev.copy(&p.acts.x, (n - 1) * c, &mut self.one.x, 0, c)?;
        self.len = n;
        self.stats.positions += n as u64;
        self.stats.passes += 1;
        self.stats.prefills += 1;
        self.head()
    }

    /// The final LayerNorm and the tied LM head on `one.x` (one row): the next token's logits.
    fn head(&mut self) -> Result<Vec<f32>> {
        let (c, v) = (self.cfg.d_model, self.cfg.vocab);
        let dev = &*self.dev;
        let np = self.w.params.len();
        let a = &mut self.one;
        dev.exec(LayerNormForward {
            x: &a.x,
            gamma: &self.w.params[np - 2],
            beta: &self.w.params[np - 1],
            out: &mut a.ln,
            mean: &mut a.mean,
            rstd: &mut a.rstd,
            n: 1,
            c,
            eps: LN_EPS,
        })?;
        dev.exec(Gemm {
            desc: &GemmDesc::new(false, true, 1, v, c),
            a: &a.ln,
            b: &self.w.params[0],
            c: &mut self.logits,
        })?;
        Ok(dev.download(&self.logits)?)
    }

    /// Feeds `tokens` after the cached positions and returns the logits after the last: into
    /// an empty cache in one prefill, else a step each.
    pub fn feed(&mut self, tokens: &[i32]) -> Result<Vec<f32>> {
        if self.len == 0 && tokens.len() > 1 {
            return self.prefill(tokens);
        }
        let mut logits = Vec::new();
        for &t in tokens {
            logits = self.step(t)?;
        }
        Ok(logits)
    }

    /// Feeds `prompt`, then generates up to `max_new` tokens: the cached positions, the prompt
    /// and the new tokens together never exceed the context (`max_seq`), so the output stops
    /// early when it is full, or after the end-of-text token ([`Sampling::eos`]). A prompt that
    /// leaves no room for a new token is refused ([`check_prompt_len`]).
    pub fn generate(&mut self, prompt: &[i32], max_new: usize, s: &Sampling) -> Result<Vec<i32>> {
        if prompt.is_empty() {
            return Err(EngineError::Config("the prompt is empty".into()));
        }
        let tmax = self.cfg.max_seq;
        check_prompt_len(self.len + prompt.len(), tmax)?;
        // Sized by what the context allows, not by `max_new` (which may be anything a user
        // typed, up to usize::MAX).
        let n = max_new.min(tmax - self.len - prompt.len());
        let mut rng = Rng::derive(s.seed, 7);
        let mut logits = self.feed(prompt)?;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            check_finite(&logits, || format!("at position {}", self.len))?;
            let next = sample(&logits, s, &mut rng) as i32;
            out.push(next);
            // The last token is only sampled: running it would fill a position for nothing.
            if i + 1 == n || s.eos == Some(next) {
                break;
            }
            logits = self.step(next)?;
        }
        Ok(out)
    }

    /// Like [`Generator::generate`] but past the context: a sliding window. Starting from an
    /// empty cache, it feeds the prompt's last `max_seq − 1` tokens (all of a shorter prompt)
    /// in one prefill; whenever the cache is full, it empties it and feeds the last `keep`
    /// tokens of the sequence (the prompt and the new tokens; [`Generator::set_keep`], default
    /// [`sliding_keep`]: `max_seq / 2`) again in one prefill before the next token. Every token
    /// is so predicted from at least `keep` tokens before it once the sequence is longer than
    /// that (nanoGPT's `sample.py` crops to the last `max_seq` and runs them all every token).
    ///
    /// The cost: every new token is one pass through the model (a step, or a re-fill's
    /// prefill); past the context a re-fill of `keep` positions comes every `max_seq − keep + 1`
    /// tokens, so with `keep = max_seq / 2` a token costs under two positions of compute on
    /// average, against one within the context. Until the context is full the tokens are those
    /// of [`Generator::generate`] with the same sampling.
    pub fn generate_sliding(
        &mut self,
        prompt: &[i32],
        max_new: usize,
        s: &Sampling,
    ) -> Result<Vec<i32>> {
        if prompt.is_empty() {
            return Err(EngineError::Config("the prompt is empty".into()));
        }
        let tmax = self.cfg.max_seq;
        let keep = self.keep;
        if tmax < 2 {
            return Err(EngineError::Config(format!(
                "a context of {tmax} token cannot slide: nothing would be kept"
            )));
        }
        self.len = 0;
        let mut rng = Rng::derive(s.seed, 7);
        let start = prompt.len().saturating_sub(tmax - 1);
        // The window's tokens: at most `max_seq` + 1 (`keep` after each re-fill, one more a
        // step).
        let mut window: Vec<i32> = prompt[start..].to_vec();
        let mut logits = self.feed(&window)?;
        let mut out = Vec::new();
        for i in 0..max_new {
            check_finite(&logits, || format!("after {} new tokens", out.len()))?;
            let next = sample(&logits, s, &mut rng) as i32;
            out.push(next);
            window.push(next);
            if i + 1 == max_new || s.eos == Some(next) {
                break;
            }
            if self.len == tmax {
                window.drain(..window.len() - keep);
                self.len = 0;
                self.stats.refills += 1;
                logits = self.prefill(&window)?;
            } else {
                logits = self.step(next)?;
            }
        }
        Ok(out)
    }
}

/// Finite but extreme weights can overflow to inf/NaN logits, from which argmax would "pick"
/// token 0 without a word.
fn check_finite(logits: &[f32], at: impl FnOnce() -> String) -> Result<()> {
    match logits.iter().find(|x| !x.is_finite()) {
        Some(bad) => Err(EngineError::Config(format!(
            "the model's logits {} are not finite ({bad}): its weights overflow (a diverged or \
             corrupt checkpoint?)",
            at()
        ))),
        None => Ok(()),
    }
}

/// A sample from a model in training (`duet train --sample-every`): up to `max_new` tokens
/// after `prompt` ([`Generator::generate_sliding`]), from a generator holding an f32 copy of
/// the weights `model` holds now; the model itself is not touched.
pub fn sample_from_model<D: Device>(
    model: &Gpt<D>,
    prompt: &[i32],
    max_new: usize,
    s: &Sampling,
) -> Result<Vec<i32>> {
    let mut g = Generator::new(model)?;
    if model.config().max_seq < 2 {
        return g.generate(prompt, max_new, s);
    }
    g.generate_sliding(prompt, max_new, s)
}

/// A model read from a file to generate from or evaluate ([`load_model`]).
pub struct ModelFile {
    /// The file read (a folder given resolves to the file in it).
    pub path: PathBuf,
    pub format: SourceFormat,
    pub model: ModelConfig,
    /// f32, [`param_specs`] order.
    pub weights: Vec<Vec<f32>>,
    /// A duet checkpoint: its run (config, step, metadata; the weights moved to `weights`, the
    /// optimizer state dropped).
    pub checkpoint: Option<Checkpoint>,
    /// Another format: the `eos_token_id` of a `config.json` beside the file (a Hugging Face
    /// model's, or one `duet export` wrote).
    pub eos_token_id: Option<u32>,
    /// Things worth a warning (from the `--init-from` loader).
    pub notes: Vec<String>,
}

/// Whether `path` is a duet checkpoint, from its safetensors header alone (the format named in
/// its metadata); a file that cannot be read as one is left to the loaders to report.
fn is_duet_checkpoint(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = crate::dataset::open_regular(path) else {
        return false;
    };
    let mut len = [0u8; 8];
    if f.read_exact(&mut len).is_err() {
        return false;
    }
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return false;
    }
    let mut header = vec![0u8; len as usize];
    if f.read_exact(&mut header).is_err() {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(&header).is_ok_and(|v| {
        v["__metadata__"][crate::checkpoint::keys::FORMAT] == crate::checkpoint::FORMAT
    })
}

/// Reads a model to generate from or evaluate: a checkpoint written by `duet train` (the file
/// or its `--out` folder), or any file `--init-from` takes ([`crate::init::load_init_weights`]:
/// a Hugging Face GPT-2 folder, one `duet export` wrote, a nanoGPT state dict; `heads` for a
/// file whose head count nothing else gives).
pub fn load_model(path: &Path, heads: Option<usize>) -> Result<ModelFile> {
    let file = crate::init::resolve_path(path)?;
    if is_duet_checkpoint(&file) {
        let mut ck = Checkpoint::load(&file)?;
        if let Some(h) = heads.filter(|&h| h != ck.config.model.heads) {
            return Err(EngineError::Config(format!(
                "--heads {h}: the checkpoint's model has {} heads",
                ck.config.model.heads
            )));
        }
        let weights = std::mem::take(&mut ck.weights);
        (ck.adam_m, ck.adam_v) = (Vec::new(), Vec::new());
        return Ok(ModelFile {
            path: file,
            format: SourceFormat::Duet,
            model: ck.config.model.clone(),
            weights,
            checkpoint: Some(ck),
            eos_token_id: None,
            notes: Vec::new(),
        });
    }
    let given = ShapeRequest {
        heads,
        ..ShapeRequest::default()
    };
    let init = crate::init::load_init_weights(&file, &given, None)?;
    // The loader has read and checked the config.json beside the file already.
    let eos_token_id = init
        .path
        .parent()
        .map(|d| d.join("config.json"))
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["eos_token_id"].as_u64())
        .and_then(|id| u32::try_from(id).ok())
        .filter(|&id| (id as usize) < init.model.vocab);
    Ok(ModelFile {
        path: init.path,
        format: init.format,
        model: init.model,
        weights: init.weights,
        checkpoint: None,
        eos_token_id,
        notes: init.notes,
    })
}

/// Refuses a prompt of `len` tokens that leaves no room for a new token in a context of
/// `max_seq`: prompt and generated tokens together never exceed the context, which is the
/// number of positions the model has embeddings (and the KV cache has room) for.
pub fn check_prompt_len(len: usize, max_seq: usize) -> Result<()> {
    if len >= max_seq {
        return Err(EngineError::Config(format!(
            "the prompt has {len} tokens but the model's context is {max_seq}: prompt and \
             generated tokens must fit in it together, so a prompt can have at most {} tokens",
            max_seq.saturating_sub(1)
        )));
    }
    Ok(())
}
