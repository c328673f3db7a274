//! Autoregressive generation with a KV cache: each new token runs the model on one position,
//! attending to the keys and values cached for the earlier ones.
//!
//! Everything runs on the device except the attention softmax over the cached positions (a few
//! hundred numbers per head), which is done on the host, and the sampling.
//!
//! The generator holds its own copy of the weights, in f32 or — like Transformer Engine's
//! `fp8_model_init` — with the linear layers' matrices in FP8 (E4M3 with a per-tensor scale, OCP
//! or FNUZ as the device uses), a quarter of their f32 size; each is dequantised into a scratch
//! matrix right before its GEMM.

use crate::config::ModelConfig;
use crate::fp8::{Fp8Family, Fp8Recipe};
use crate::model::{BlockParam, Gpt, LN_EPS, check_weights, param_index, param_specs};
use crate::rng::Rng;
use crate::train::argmax;
use crate::{EngineError, Result};
use duet_device::{
    AddAssign, BiasAdd, Buffer, DType, Device, DeviceExt, Fp8Format, GeluForward, Gemm, GemmDesc,
    LayerNormForward, SplitHeads,
};
use std::sync::Arc;

/// How the generator stores the linear layers' weight matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    /// E4M3 with one scale per matrix (the device's FP8 family).
    Fp8,
}

/// The weight matrix of linear kind `kind` in layer `l`, as f32 (dequantised into its scratch
/// matrix when stored in FP8).
fn linear_weight<'a, D: Device>(
    dev: &D,
    params: &'a [D::Buffer],
    wtmp: &'a mut [D::Buffer],
    scale_inv: &[f32],
    l: usize,
    kind: usize,
) -> Result<&'a D::Buffer> {
    let i = param_index(l, LINEAR_WEIGHTS[kind]);
    if params[i].dtype() == DType::F32 {
        return Ok(&params[i]);
    }
    dev.cast(&params[i], &mut wtmp[kind], scale_inv[i])?;
    Ok(&wtmp[kind])
}

/// The linear layers' weight matrices of a block.
const LINEAR_WEIGHTS: [BlockParam; 4] = [
    BlockParam::AttnW,
    BlockParam::ProjW,
    BlockParam::FcW,
    BlockParam::FcProjW,
];

/// How to pick the next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
        }
    }
}

/// Picks a token from `logits` (one row).
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
    let w: Vec<f64> = idx
        .iter()
        .map(|&i| ((logits[i] as f64 - max) / s.temperature as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut u = rng.uniform() * total;
    for (k, &wi) in w.iter().enumerate() {
        if u < wi {
            return idx[k];
        }
        u -= wi;
    }
    *idx.last().expect("non-empty")
}

/// Weights, per-layer key/value caches and one-position activations.
pub struct Generator<D: Device> {
    dev: Arc<D>,
    cfg: ModelConfig,
    /// [`param_specs`] order; the linear matrices in FP8 with [`WeightFormat::Fp8`].
    params: Vec<D::Buffer>,
    /// Per parameter: the factor that turns stored values back into weights (1 for f32).
    scale_inv: Vec<f32>,
    /// FP8 only: one f32 scratch matrix per kind of linear layer, dequantised before each GEMM.
    wtmp: Vec<D::Buffer>,
    k_cache: Vec<D::Buffer>,
    v_cache: Vec<D::Buffer>,
    x: D::Buffer,
    x2: D::Buffer,
    ln: D::Buffer,
    mean: D::Buffer,
    rstd: D::Buffer,
    qkv: D::Buffer,
    q: D::Buffer,
    k: D::Buffer,
    v: D::Buffer,
    scores: D::Buffer,
    y: D::Buffer,
    h: D::Buffer,
    hg: D::Buffer,
    logits: D::Buffer,
    /// Positions cached so far.
    len: usize,
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
            x: a(c)?,
            x2: a(c)?,
            ln: a(c)?,
            mean: a(1)?,
            rstd: a(1)?,
            qkv: a(3 * c)?,
            q: a(c)?,
            k: a(c)?,
            v: a(c)?,
            scores: a(nh * t)?,
            y: a(c)?,
            h: a(f)?,
            hg: a(f)?,
            logits: a(v)?,
            k_cache,
            v_cache,
            params,
            scale_inv,
            wtmp,
            cfg: cfg.clone(),
            dev,
            len: 0,
        })
    }

    /// Bytes of device memory the weights take.
    pub fn weight_bytes(&self) -> u64 {
        self.params.iter().map(|p| p.size_bytes() as u64).sum()
    }

    /// Positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs one position (token `tok` at position `len`), appends its keys and values to the
    /// cache and returns the logits for the next token.
    pub fn step(&mut self, tok: i32) -> Result<Vec<f32>> {
        let dev = self.dev.clone();
        let dev = &*dev;
        let cfg = self.cfg.clone();
        let (c, f, nh, tmax, v) = (cfg.d_model, cfg.ffn, cfg.heads, cfg.max_seq, cfg.vocab);
        let hs = c / nh;
        let pos = self.len;
        if pos >= tmax {
            return Err(EngineError::Config(format!(
                "the context is full: the model's max_seq is {tmax}"
            )));
        }
        if tok < 0 || tok as usize >= v {
            return Err(EngineError::Config(format!(
                "token {tok} is outside the vocabulary 0..{v}"
            )));
        }
        let np = self.params.len();
        // Embedding: wte[tok] + wpe[pos].
        dev.copy(&self.params[0], tok as usize * c, &mut self.x, 0, c)?;
        dev.copy(&self.params[1], pos * c, &mut self.x2, 0, c)?;
        dev.exec(AddAssign {
            dst: &mut self.x,
            src: &self.x2,
        })?;
        let scale = 1.0 / (hs as f32).sqrt();
        for l in 0..cfg.layers {
            let pi = |bp: BlockParam| param_index(l, bp);
            dev.exec(LayerNormForward {
                x: &self.x,
                gamma: &self.params[pi(BlockParam::Ln1W)],
                beta: &self.params[pi(BlockParam::Ln1B)],
                out: &mut self.ln,
                mean: &mut self.mean,
                rstd: &mut self.rstd,
                n: 1,
                c,
                eps: LN_EPS,
            })?;
            let w = linear_weight(dev, &self.params, &mut self.wtmp, &self.scale_inv, l, 0)?;
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, 1, 3 * c, c),
                a: &self.ln,
                b: w,
                c: &mut self.qkv,
            })?;
            dev.exec(BiasAdd {
                x: &mut self.qkv,
                bias: &self.params[pi(BlockParam::AttnB)],
                rows: 1,
                c: 3 * c,
            })?;
            dev.exec(SplitHeads {
                qkv: &self.qkv,
                q: &mut self.q,
                k: &mut self.k,
                v: &mut self.v,
                b: 1,
                t: 1,
                nh,
                hs,
            })?;
            for h in 0..nh {
                let dst = h * tmax * hs + pos * hs;
                dev.copy(&self.k, h * hs, &mut self.k_cache[l], dst, hs)?;
                dev.copy(&self.v, h * hs, &mut self.v_cache[l], dst, hs)?;
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
                a: &self.q,
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
            dev.exec(Gemm {
                desc: &pv,
                a: &self.scores,
                b: &self.v_cache[l],
                c: &mut self.y,
            })?;
            // One position: heads already lie in (nh, hs) order = the merged layout.
            let w = linear_weight(dev, &self.params, &mut self.wtmp, &self.scale_inv, l, 1)?;
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, 1, c, c).beta(1.0),
                a: &self.y,
                b: w,
                c: &mut self.x,
            })?;
            dev.exec(BiasAdd {
                x: &mut self.x,
                bias: &self.params[pi(BlockParam::ProjB)],
                rows: 1,
                c,
            })?;
            dev.exec(LayerNormForward {
                x: &self.x,
                gamma: &self.params[pi(BlockParam::Ln2W)],
                beta: &self.params[pi(BlockParam::Ln2B)],
                out: &mut self.ln,
                mean: &mut self.mean,
                rstd: &mut self.rstd,
                n: 1,
                c,
                eps: LN_EPS,
            })?;
            let w = linear_weight(dev, &self.params, &mut self.wtmp, &self.scale_inv, l, 2)?;
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, 1, f, c),
                a: &self.ln,
                b: w,
                c: &mut self.h,
            })?;
            dev.exec(BiasAdd {
                x: &mut self.h,
                bias: &self.params[pi(BlockParam::FcB)],
                rows: 1,
                c: f,
            })?;
            dev.exec(GeluForward {
                x: &self.h,
                out: &mut self.hg,
            })?;
            let w = linear_weight(dev, &self.params, &mut self.wtmp, &self.scale_inv, l, 3)?;
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, 1, c, f).beta(1.0),
                a: &self.hg,
                b: w,
                c: &mut self.x,
            })?;
            dev.exec(BiasAdd {
                x: &mut self.x,
                bias: &self.params[pi(BlockParam::FcProjB)],
                rows: 1,
                c,
            })?;
        }
        dev.exec(LayerNormForward {
            x: &self.x,
            gamma: &self.params[np - 2],
            beta: &self.params[np - 1],
            out: &mut self.ln,
            mean: &mut self.mean,
            rstd: &mut self.rstd,
            n: 1,
            c,
            eps: LN_EPS,
        })?;
        dev.exec(Gemm {
            desc: &GemmDesc::new(false, true, 1, v, c),
            a: &self.ln,
            b: &self.params[0],
            c: &mut self.logits,
        })?;
        self.len += 1;
        Ok(dev.download(&self.logits)?)
    }

    /// Feeds `prompt`, then generates up to `max_new` tokens: the cached positions, the prompt
    /// and the new tokens together never exceed the context (`max_seq`), so the output stops
    /// early when it is full. A prompt that leaves no room for a new token is refused
    /// ([`check_prompt_len`]).
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
        let mut logits = Vec::new();
        for &t in prompt {
            logits = self.step(t)?;
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            // Finite but extreme weights can overflow to inf/NaN logits, from which argmax
            // would "pick" token 0 without a word.
            if let Some(bad) = logits.iter().find(|x| !x.is_finite()) {
                return Err(EngineError::Config(format!(
                    "the model's logits at position {} are not finite ({bad}): its weights \
                     overflow (a diverged or corrupt checkpoint?)",
                    self.len
                )));
            }
            let next = sample(&logits, s, &mut rng) as i32;
            out.push(next);
            // The last token is only sampled: running it would fill a position for nothing.
            if i + 1 < n {
                logits = self.step(next)?;
            }
        }
        Ok(out)
    }
}

impl<D: Device> Generator<D> {
    /// Like [`Generator::generate`] but past the context: a sliding window. Starting from an
    /// empty cache, it feeds the prompt's last `keep` tokens when the prompt does not fit the
    /// context (`max_seq`), else the whole prompt; whenever the cache is full, it empties it and
    /// feeds the last `keep` tokens of the sequence again (the prompt and the new tokens) before
    /// the next one, so every token is predicted from at least `keep` tokens before it once the
    /// sequence is longer than that (nanoGPT's `sample.py` crops to the last `max_seq`).
    ///
    /// The cost: each re-fill runs `keep` positions, and it comes every `max_seq − keep`
    /// tokens, so past the context a new token costs about `keep / (max_seq − keep) + 1`
    /// positions (with `keep = max_seq − 1`, the most context: `max_seq / 2` positions a token
    /// on average, against one within the context). Until the context is full the tokens are
    /// those of [`Generator::generate`] with the same sampling.
    pub fn generate_sliding(
        &mut self,
        prompt: &[i32],
        max_new: usize,
        s: &Sampling,
        keep: usize,
    ) -> Result<Vec<i32>> {
        if prompt.is_empty() {
            return Err(EngineError::Config("the prompt is empty".into()));
        }
        let tmax = self.cfg.max_seq;
        if keep == 0 || keep >= tmax {
            return Err(EngineError::Config(format!(
                "the sliding window keeps 1..{} tokens (max_seq {tmax} − 1), not {keep}",
                tmax.saturating_sub(1)
            )));
        }
        self.len = 0;
        let mut rng = Rng::derive(s.seed, 7);
        let start = if prompt.len() >= tmax {
            prompt.len() - keep
        } else {
            0
        };
        // The window's tokens: at most `max_seq` (`keep` after each re-fill, one more a step).
        let mut window: Vec<i32> = prompt[start..].to_vec();
        let mut logits = Vec::new();
        for &t in &window {
            logits = self.step(t)?;
        }
        let mut out = Vec::new();
        for i in 0..max_new {
            if let Some(bad) = logits.iter().find(|x| !x.is_finite()) {
                return Err(EngineError::Config(format!(
                    "the model's logits after {} new tokens are not finite ({bad}): its weights \
                     overflow (a diverged or corrupt checkpoint?)",
                    out.len()
                )));
            }
            let next = sample(&logits, s, &mut rng) as i32;
            out.push(next);
            window.push(next);
            if i + 1 == max_new {
                break;
            }
            if self.len == tmax {
                window.drain(..window.len() - keep);
                self.len = 0;
                for &t in &window {
                    logits = self.step(t)?;
                }
            } else {
                logits = self.step(next)?;
            }
        }
        Ok(out)
    }
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
