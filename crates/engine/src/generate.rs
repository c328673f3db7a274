//! Autoregressive generation with a KV cache: each new token runs the model on one position,
//! attending to the keys and values cached for the earlier ones.
//!
//! Everything runs on the device except the attention softmax over the cached positions (a few
//! hundred numbers per head), which is done on the host, and the sampling.

use crate::model::{BlockParam, Gpt, LN_EPS, param_index};
use crate::rng::Rng;
use crate::train::argmax;
use crate::{EngineError, Result};
use duet_device::{DType, Device, DeviceExt, GemmDesc};

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

/// Per-layer key/value caches and one-position activations.
pub struct Generator<'m, D: Device> {
    model: &'m Gpt<D>,
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

impl<'m, D: Device> Generator<'m, D> {
    /// Caches for up to the model's `max_seq` positions. The model's parameters must be f32.
    pub fn new(model: &'m Gpt<D>) -> Result<Self> {
        let dev = &**model.device();
        let cfg = model.config();
        let (c, f, nh, t, v) = (cfg.d_model, cfg.ffn, cfg.heads, cfg.max_seq, cfg.vocab);
        if let Some(p) = model
            .params()
            .iter()
            .find(|p| duet_device::Buffer::dtype(*p) != DType::F32)
        {
            return Err(EngineError::Config(format!(
                "generation needs f32 weights, the model holds {}",
                duet_device::Buffer::dtype(p)
            )));
        }
        let a = |n: usize| dev.alloc(DType::F32, n);
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for _ in 0..cfg.layers {
            k_cache.push(a(nh * t * (c / nh))?);
            v_cache.push(a(nh * t * (c / nh))?);
        }
        Ok(Self {
            model,
            k_cache,
            v_cache,
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
            len: 0,
        })
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
        let model = self.model;
        let dev = &**model.device();
        let cfg = model.config();
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
        let p = model.params();
        let np = p.len();
        // Embedding: wte[tok] + wpe[pos].
        dev.copy(&p[0], tok as usize * c, &mut self.x, 0, c)?;
        dev.copy(&p[1], pos * c, &mut self.x2, 0, c)?;
        dev.add_assign(&mut self.x, &self.x2)?;
        let scale = 1.0 / (hs as f32).sqrt();
        for l in 0..cfg.layers {
            let w = |bp: BlockParam| &p[param_index(l, bp)];
            dev.layernorm_forward(
                &self.x,
                w(BlockParam::Ln1W),
                w(BlockParam::Ln1B),
                &mut self.ln,
                &mut self.mean,
                &mut self.rstd,
                1,
                c,
                LN_EPS,
            )?;
            dev.gemm(
                &GemmDesc::new(false, true, 1, 3 * c, c),
                &self.ln,
                w(BlockParam::AttnW),
                &mut self.qkv,
            )?;
            dev.bias_add(&mut self.qkv, w(BlockParam::AttnB), 1, 3 * c)?;
            dev.split_heads(
                &self.qkv,
                &mut self.q,
                &mut self.k,
                &mut self.v,
                1,
                1,
                nh,
                hs,
            )?;
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
            dev.gemm(&qk, &self.q, &self.k_cache[l], &mut self.scores)?;
            // Softmax over the cached positions, on the host.
            let mut s: Vec<f32> = dev.download(&self.scores)?;
            for h in 0..nh {
                let row = &mut s[h * tmax..h * tmax + n];
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x * scale));
                let mut total = 0f32;
                for x in row.iter_mut() {
                    *x = (*x * scale - m).exp();
                    total += *x;
                }
                row.iter_mut().for_each(|x| *x /= total);
            }
            dev.upload(&s, &mut self.scores, 0)?;
            let pv = GemmDesc {
                lda: tmax,
                stride_a: tmax,
                stride_b: tmax * hs,
                stride_c: hs,
                ..GemmDesc::batched(false, false, 1, hs, n, nh)
            };
            dev.gemm(&pv, &self.scores, &self.v_cache[l], &mut self.y)?;
            // One position: heads already lie in (nh, hs) order = the merged layout.
            dev.gemm(
                &GemmDesc::new(false, true, 1, c, c).beta(1.0),
                &self.y,
                w(BlockParam::ProjW),
                &mut self.x,
            )?;
            dev.bias_add(&mut self.x, w(BlockParam::ProjB), 1, c)?;
            dev.layernorm_forward(
                &self.x,
                w(BlockParam::Ln2W),
                w(BlockParam::Ln2B),
                &mut self.ln,
                &mut self.mean,
                &mut self.rstd,
                1,
                c,
                LN_EPS,
            )?;
            dev.gemm(
                &GemmDesc::new(false, true, 1, f, c),
                &self.ln,
                w(BlockParam::FcW),
                &mut self.h,
            )?;
            dev.bias_add(&mut self.h, w(BlockParam::FcB), 1, f)?;
            dev.gelu_forward(&self.h, &mut self.hg)?;
            dev.gemm(
                &GemmDesc::new(false, true, 1, c, f).beta(1.0),
                &self.hg,
                w(BlockParam::FcProjW),
                &mut self.x,
            )?;
            dev.bias_add(&mut self.x, w(BlockParam::FcProjB), 1, c)?;
        }
        dev.layernorm_forward(
            &self.x,
            &p[np - 2],
            &p[np - 1],
            &mut self.ln,
            &mut self.mean,
            &mut self.rstd,
            1,
            c,
            LN_EPS,
        )?;
        dev.gemm(
            &GemmDesc::new(false, true, 1, v, c),
            &self.ln,
            &p[0],
            &mut self.logits,
        )?;
        self.len += 1;
        Ok(dev.download(&self.logits)?)
    }

    /// Feeds `prompt`, then generates `max_new` tokens (stopping early when the context is full).
    pub fn generate(&mut self, prompt: &[i32], max_new: usize, s: &Sampling) -> Result<Vec<i32>> {
        if prompt.is_empty() {
            return Err(EngineError::Config("the prompt is empty".into()));
        }
        let mut rng = Rng::derive(s.seed, 7);
        let mut logits = Vec::new();
        for &t in prompt {
            logits = self.step(t)?;
        }
        let tmax = self.model.config().max_seq;
        let mut out = Vec::with_capacity(max_new);
        for i in 0..max_new {
            let next = sample(&logits, s, &mut rng) as i32;
            out.push(next);
            if i + 1 == max_new || self.len >= tmax {
                break;
            }
            logits = self.step(next)?;
        }
        Ok(out)
    }
}
