//! The GPT model: parameters, a memory plan made once, and an explicit forward and backward pass
//! written as flat per-layer loops over device buffers (after llm.c's `gpt2_forward` /
//! `gpt2_backward`).
//!
//! Architecture (GPT-2 / nanoGPT): token + position embedding; per block
//! `x + proj(attn(LN1(x)))`, then `x + fc2(gelu(fc1(LN2(x))))`; final LayerNorm; the LM head is
//! tied to the token embedding. Weights use PyTorch's `(out_features, in_features)` layout and
//! nanoGPT's names, so a linear layer is `y = x·Wᵀ + b`.
//!
//! Where things are: [`params`] (the parameter tensors, their names, shapes and
//! initialisation), [`memory`] (the buffer table every allocation and the memory estimate come
//! from), `blocks` (one transformer block's forward and backward pass), `attention`, `linear`
//! (the linear layers, their GEMM epilogues and FP8 operands) and `fp8_codes` (the FP8 copies of
//! the weights and what state they are in). How a model stores its numbers is
//! [`crate::precision::PrecisionPlan`].

#[macro_use]
pub mod memory;
mod attention;
mod blocks;
mod fp8_codes;
mod linear;
pub mod params;

use blocks::{block_backward, block_forward, layernorm_backward, ln_grads, two_mut};
pub(crate) use fp8_codes::Fp8Codes;
pub use fp8_codes::Fp8WeightCodes;
use fp8_codes::{Fp8Bufs, LINEARS, is_linear_weight};
use memory::attention_chunk;
pub(crate) use memory::out_of_memory as out_of_memory_error;
use memory::{BlockActs, BufSpec, Buffers, Dims, Scratch, out_of_memory};
pub use memory::{MemoryPlan, estimate_memory};
use params::upload_f32_as;
pub use params::{
    BlockParam, Init, ParamRole, ParamSpec, VOCAB_PAD, check_weights, init_weights, pad,
    padded_vocab, param_index, param_specs, unpad,
};

use crate::config::ModelConfig;
use crate::fp8::Fp8State;
use crate::precision::{Precision, PrecisionPlan};
use crate::{EngineError, Result};
use duet_device::{
    CrossEntropyInPlace, CrossEntropyPadded, DType, Device, DeviceError, DeviceExt,
    EmbeddingBackward, EmbeddingForward, Gemm, GemmDesc, LayerNormForward,
};
use std::sync::Arc;
/// The callback of [`Gpt::backward_hooked`]: `(ready group, every gradient)`.
pub type GradsReady<'a, B> = dyn FnMut(usize, &[B]) -> Result<()> + 'a;

/// LayerNorm epsilon (PyTorch's default).
pub const LN_EPS: f32 = 1e-5;

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
    /// Activations of the blocks: one slot per block, or per block of a segment when
    /// checkpointing (see [`Gpt::slot`]).
    blocks: Vec<BlockActs<D::Buffer>>,
    /// Checkpointing: the input of each segment of `checkpoint_every` blocks.
    seg_inputs: Vec<D::Buffer>,
    checkpoint_every: usize,
    lnf: D::Buffer,
    lnf_mean: D::Buffer,
    lnf_rstd: D::Buffer,
    /// The logits (activation dtype, `logit_rows × padded vocab`); after a loss with its
    /// gradient, that gradient (written over them).
    logits: D::Buffer,
    losses: D::Buffer,
    /// Rows of logits handled at once: `b·t` (the logits whole), or a divisor of it (see
    /// [`memory::logits_chunk_rows`]): then the LM head runs in the loss, chunk by chunk.
    logit_rows: usize,
    /// Chunked logits only: the chunk's targets and losses.
    chunk_targets: D::Buffer,
    chunk_losses: D::Buffer,
    scratch: Scratch<D::Buffer>,
    plan: MemoryPlan,
    /// `d_model` zeros (clears the key-bias gradient).
    zeros_c: D::Buffer,
    /// Number of non-ignored targets in the last `loss` call.
    last_count: usize,
    precision: Precision,
    /// Activation dtype.
    act: DType,
    /// Attention runs fused (see [`duet_device::AttentionOps::flash_attention_forward`]).
    flash: bool,
    /// Multiplies the loss gradient (FP16 loss scaling).
    loss_scale: f32,
    fp8: Option<Fp8Bufs<D>>,
}

impl<D: Device> Gpt<D> {
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
        let table = Buffers::plan(&*dev, cfg, b, t, &plan)?;
        let memory = table.memory_plan(plan.optimizer_shards);
        let needed = memory.total();
        if let Some((free, _)) = dev.memory_stats().driver
            && needed > free
        {
            return Err(out_of_memory(needed, free, plan.checkpoint_every));
        }
        Self::allocate(dev, cfg, b, t, weights, plan, table, memory).map_err(|e| match e {
            EngineError::Device(DeviceError::OutOfMemory { free, .. }) => {
                out_of_memory(needed, free, plan.checkpoint_every)
            }
            other => other,
        })
    }

    /// Allocates the buffer table (see [`memory`]) and uploads the weights.
    #[allow(clippy::too_many_arguments)]
    fn allocate(
        dev: Arc<D>,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        weights: &[Vec<f32>],
        plan: PrecisionPlan,
        table: Buffers<BufSpec>,
        memory: MemoryPlan,
    ) -> Result<Self> {
        let act = plan.precision.activation_dtype();
        let (c, f, n) = (cfg.d_model, cfg.ffn, b * t);
        // FP8 tensor-core GEMMs (cuBLASLt, hipBLASLt) need every dimension of the linear
        // layers' GEMMs to be a multiple of 16; enforced on every backend so a config that
        // trains on the CPU also trains on a GPU.
        if plan.precision == Precision::Fp8
            && !(c.is_multiple_of(16) && f.is_multiple_of(16) && n.is_multiple_of(16))
        {
            return Err(EngineError::Config(format!(
                "fp8 needs d_model, ffn and batch × seq to be multiples of 16 \
                 (got {c}, {f} and {b} × {t} = {n})"
            )));
        }
        let bufs = table.try_map(&mut |s: BufSpec| dev.alloc(s.dtype, s.len))?;
        let fp8 = match bufs.fp8 {
            None => None,
            Some(q) => {
                let mut names = Vec::new();
                for l in 0..cfg.layers {
                    for (_, name) in LINEARS {
                        names.push(format!("h.{l}.{name}"));
                    }
                }
                let state: [D::Buffer; 5] = q.state.try_into().map_err(|v: Vec<_>| {
                    EngineError::Config(format!("fp8 state: {} buffers planned, not 5", v.len()))
                })?;
                let state = Fp8State::new(&*dev, plan.fp8, q.family, &names, state)?;
                Some(Fp8Bufs {
                    state,
                    codes: Fp8Codes::default(),
                    x8: q.x8,
                    x8t: q.x8t,
                    w8: q.w8,
                    w8t: q.w8t,
                    dy8: q.dy8,
                    dy8t: q.dy8t,
                    amax_discard: q.amax_discard,
                })
            }
        };
        let mut model = Self {
            tokens: bufs.tokens,
            targets: bufs.targets,
            encoded: bufs.encoded,
            lnf: bufs.lnf,
            lnf_mean: bufs.lnf_mean,
            lnf_rstd: bufs.lnf_rstd,
            logits: bufs.logits,
            losses: bufs.losses,
            logit_rows: bufs.logit_rows,
            chunk_targets: bufs.chunk_targets,
            chunk_losses: bufs.chunk_losses,
            blocks: bufs.blocks,
            seg_inputs: bufs.seg_inputs,
            checkpoint_every: plan.checkpoint_every,
            scratch: bufs.scratch,
            params: bufs.params,
            grads: bufs.grads,
            specs: param_specs(cfg),
            cfg: cfg.clone(),
            b,
            t,
            plan: memory,
            zeros_c: bufs.zeros_c,
            last_count: 0,
            precision: plan.precision,
            act,
            flash: bufs.flash,
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

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn batch_size(&self) -> usize {
        self.b
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

    /// The gradients, writable (data parallelism stores the reduced sums back into them).
    pub fn grads_mut(&mut self) -> &mut [D::Buffer] {
        &mut self.grads
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

    /// Reads every weight back to the host (real sizes: padded rows dropped).
    pub fn weights(&self) -> Result<Vec<Vec<f32>>> {
        let w = self
            .params
            .iter()
            .map(|p| Ok(self.dev.download_f32(p)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(unpad(&self.specs, w))
    }

    /// Reads every gradient back to the host (real sizes: padded rows dropped).
    pub fn gradients(&self) -> Result<Vec<Vec<f32>>> {
        let g = self
            .grads
            .iter()
            .map(|g| Ok(self.dev.download_f32(g)?))
            .collect::<Result<Vec<_>>>()?;
        Ok(unpad(&self.specs, g))
    }

    /// Logits of the last forward pass (`b·t × vocab`; the padded vocabulary's columns are
    /// dropped). After [`Gpt::loss`] with the gradient, the buffer holds the logits' gradient
    /// instead (the loss writes it over them, as llm.c's fused classifier does). With the
    /// logits in chunks ([`Gpt::logits_chunked`]) they are computed again here from the final
    /// LayerNorm's output, a chunk at a time, into a buffer of one chunk's size.
    pub fn logits(&self) -> Result<Vec<f32>> {
        let (v, vp) = (self.cfg.vocab, padded_vocab(&self.cfg));
        let all = if self.logits_chunked() {
            let (n, rows) = (self.b * self.t, self.logit_rows);
            let mut chunk = self.dev.alloc(self.act, rows * vp)?;
            let mut all = Vec::with_capacity(n * vp);
            for r0 in (0..n).step_by(rows) {
                self.lm_head_chunk(r0, &mut chunk)?;
                all.extend(self.dev.download_f32(&chunk)?);
            }
            all
        } else {
            self.dev.download_f32(&self.logits)?
        };
        if v == vp {
            return Ok(all);
        }
        Ok(all.chunks(vp).flat_map(|row| &row[..v]).copied().collect())
    }

    /// Whether the logits are handled in chunks of rows (the LM head then runs in the loss).
    pub fn logits_chunked(&self) -> bool {
        self.logit_rows < self.b * self.t
    }

    /// Rows of logits handled at once (`b·t` when they exist whole).
    pub fn logit_rows(&self) -> usize {
        self.logit_rows
    }

    /// The LM head on rows `r0 .. r0 + logit_rows` of the final LayerNorm's output:
    /// `out = lnf[rows] · wteᵀ`.
    fn lm_head_chunk(&self, r0: usize, out: &mut D::Buffer) -> Result<()> {
        lm_head_rows(
            &*self.dev,
            &self.cfg,
            &self.lnf,
            &self.params[0],
            r0,
            self.logit_rows,
            out,
        )
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
            hs: self.cfg.head_size(),
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
        // The LM head's rows: the padded vocabulary.
        let v = padded_vocab(&self.cfg);
        self.quantize_fp8_weights()?;
        {
            let dev = &*self.dev;
            let p = &self.params;
            dev.exec(EmbeddingForward {
                tokens: &self.tokens,
                wte: &p[0],
                wpe: &p[1],
                out: &mut self.encoded,
                b: d.b,
                t: d.t,
                c: d.c,
            })?;
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
        dev.exec(LayerNormForward {
            x: last,
            gamma: &p[nparams - 2],
            beta: &p[nparams - 1],
            out: &mut self.lnf,
            mean: &mut self.lnf_mean,
            rstd: &mut self.lnf_rstd,
            n: d.n,
            c: d.c,
            eps: LN_EPS,
        })?;
        // Tied LM head: logits = lnf · wteᵀ (in chunks the loss runs it, chunk by chunk).
        if !self.logits_chunked() {
            dev.exec(Gemm {
                desc: &GemmDesc::new(false, true, d.n, v, d.c),
                a: &self.lnf,
                b: &p[0],
                c: &mut self.logits,
            })?;
        }
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
    ///
    /// With the logits in chunks ([`Gpt::logits_chunked`]), each chunk of rows goes through the
    /// LM head, the loss and, with the gradient, the LM head's backward GEMMs before the next:
    /// the final LayerNorm's input gradient (`d_c`) and the tied embedding's gradient, which
    /// the first chunk writes and the others add to ([`Gpt::zero_grads`] then leaves it alone;
    /// the embedding's own backward adds its part in [`Gpt::backward`]).
    pub fn queue_loss_loaded(&mut self, with_grad: bool) -> Result<()> {
        if self.logits_chunked() {
            return self.queue_loss_chunked(with_grad);
        }
        let count = self.last_count.max(1);
        let dev = &*self.dev;
        let n = self.b * self.t;
        let (v, vp, scale) = (
            self.cfg.vocab,
            padded_vocab(&self.cfg),
            self.loss_scale / count as f32,
        );
        // With the gradient: written over the logits in their own dtype (the loss stays f32),
        // so the logits exist once, never in f32 beside a 16-bit copy.
        if with_grad {
            dev.exec(CrossEntropyInPlace {
                logits: &mut self.logits,
                targets: &self.targets,
                losses: &mut self.losses,
                n,
                v,
                ld: vp,
                grad_scale: scale,
            })?;
        } else {
            dev.exec(CrossEntropyPadded {
                logits: &self.logits,
                targets: &self.targets,
                losses: &mut self.losses,
                dlogits: None,
                n,
                v,
                ld: vp,
                grad_scale: scale,
            })?;
        }
        Ok(())
    }

    fn queue_loss_chunked(&mut self, with_grad: bool) -> Result<()> {
        let count = self.last_count.max(1);
        let dev = self.dev.clone();
        let (n, c, rows) = (self.b * self.t, self.cfg.d_model, self.logit_rows);
        let (v, vp, scale) = (
            self.cfg.vocab,
            padded_vocab(&self.cfg),
            self.loss_scale / count as f32,
        );
        for r0 in (0..n).step_by(rows) {
            lm_head_rows(
                &*dev,
                &self.cfg,
                &self.lnf,
                &self.params[0],
                r0,
                rows,
                &mut self.logits,
            )?;
            dev.copy(&self.targets, r0, &mut self.chunk_targets, 0, rows)?;
            if with_grad {
                dev.exec(CrossEntropyInPlace {
                    logits: &mut self.logits,
                    targets: &self.chunk_targets,
                    losses: &mut self.chunk_losses,
                    n: rows,
                    v,
                    ld: vp,
                    grad_scale: scale,
                })?;
                // The LM head's backward for these rows: d_c[rows] = dlogits · wte, and
                // dwte (+)= dlogitsᵀ · lnf[rows].
                let mut dx = GemmDesc::new(false, false, rows, c, vp);
                dx.c_offset = r0 * c;
                dev.exec(Gemm {
                    desc: &dx,
                    a: &self.logits,
                    b: &self.params[0],
                    c: &mut self.scratch.d_c,
                })?;
                let mut dw = GemmDesc::new(true, false, vp, c, rows);
                dw.b_offset = r0 * c;
                if r0 > 0 {
                    dw = dw.beta(1.0);
                }
                dev.exec(Gemm {
                    desc: &dw,
                    a: &self.logits,
                    b: &self.lnf,
                    c: &mut self.grads[0],
                })?;
            } else {
                dev.exec(CrossEntropyPadded {
                    logits: &self.logits,
                    targets: &self.chunk_targets,
                    losses: &mut self.chunk_losses,
                    dlogits: None,
                    n: rows,
                    v,
                    ld: vp,
                    grad_scale: scale,
                })?;
            }
            dev.copy(&self.chunk_losses, 0, &mut self.losses, r0, rows)?;
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
        // So is the tied embedding's with the logits in chunks: the loss wrote its LM-head part.
        let cfg = &self.cfg;
        let chunked = self.logits_chunked();
        let written = |i: usize| is_linear_weight(cfg, i) || (chunked && i == 0);
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
        let v = padded_vocab(&self.cfg);
        let layers = self.cfg.layers;
        {
            let dev = &*self.dev;
            let p = &self.params;
            let g = &mut self.grads;
            let s = &mut self.scratch;
            // The loss wrote the logits' gradient over the logits (in chunks it also ran the LM
            // head's backward).
            let dlogits = &self.logits;
            let np = p.len();
            // LM head: logits = lnf · wteᵀ.
            if self.logit_rows == d.n {
                dev.exec(Gemm {
                    desc: &GemmDesc::new(false, false, d.n, d.c, v),
                    a: dlogits,
                    b: &p[0],
                    c: &mut s.d_c,
                })?;
                dev.exec(Gemm {
                    desc: &GemmDesc::new(true, false, v, d.c, d.n).beta(1.0),
                    a: dlogits,
                    b: &self.lnf,
                    c: &mut g[0],
                })?;
            }
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
        self.dev.exec(EmbeddingBackward {
            tokens: &self.tokens,
            dout: &self.scratch.dresid,
            dwte: gwte,
            dwpe: gwpe,
            b: d.b,
            t: d.t,
            c: d.c,
        })?;
        ready(layers + 1, &self.grads)
    }

    /// The per-position losses of the last queued loss (f32, `b·t`) on the device:
    /// [`Gpt::read_loss`] sums them and divides by the counted targets. For copying them aside
    /// without a host synchronisation.
    pub fn row_losses(&self) -> &D::Buffer {
        &self.losses
    }
}

/// The tied LM head on `rows` rows of the final LayerNorm's output from row `r0`:
/// `out = lnf[r0 .. r0 + rows] · wteᵀ` (`rows × padded vocab`).
fn lm_head_rows<D: Device>(
    dev: &D,
    cfg: &ModelConfig,
    lnf: &D::Buffer,
    wte: &D::Buffer,
    r0: usize,
    rows: usize,
    out: &mut D::Buffer,
) -> Result<()> {
    let (c, vp) = (cfg.d_model, padded_vocab(cfg));
    let mut desc = GemmDesc::new(false, true, rows, vp, c);
    desc.a_offset = r0 * c;
    Ok(dev.exec(Gemm {
        desc: &desc,
        a: lnf,
        b: wte,
        c: out,
    })?)
}
