//! The buffer table: every buffer a model allocates, with its dtype, length and the part of the
//! memory plan it counts towards, computed once from the shapes and the precision plan (after
//! llm.c's tensor specs). [`Gpt::with_precision`](super::Gpt::with_precision) allocates exactly
//! this table and [`estimate_memory`] sums it, so the estimate and the allocation agree to the
//! byte.

use super::fp8_codes::{LINEARS, is_linear_weight, linear_dims};
use super::params::param_specs;
use crate::EngineError;
use crate::config::ModelConfig;
use crate::fp8::{Fp8Family, Fp8State};
use crate::precision::{Precision, PrecisionPlan};
use duet_device::{DType, Device};

/// Declares a struct whose fields are all buffers (`B`), with `try_map` (allocate a table of
/// [`BufSpec`]s field by field) and `each` (visit every buffer). One field list, so a buffer
/// cannot be planned and not allocated, or the reverse.
macro_rules! buffers {
    ($(#[$sm:meta])* $vis:vis struct $name:ident<B> { $($(#[$fm:meta])* $f:ident),* $(,)? }) => {
        $(#[$sm])*
        #[derive(Clone)]
        $vis struct $name<B> { $($(#[$fm])* pub(super) $f: B,)* }
        impl<B> $name<B> {
            pub(super) fn try_map<C, E>(
                self,
                f: &mut impl FnMut(B) -> std::result::Result<C, E>,
            ) -> std::result::Result<$name<C>, E> {
                Ok($name { $($f: f(self.$f)?,)* })
            }
            #[allow(dead_code)]
            pub(super) fn each<'a>(&'a self, f: &mut impl FnMut(&'a B)) {
                $(f(&self.$f);)*
            }
        }
    };
}

buffers! {
/// Activations one block saves for its backward pass.
pub(super) struct BlockActs<B> {
    ln1,
    ln1_mean,
    ln1_rstd,
    /// The attention's input (q, k and v are split from it again in the backward pass, and the
    /// attention probabilities recomputed: no `t × t` matrix is kept per block).
    qkv,
    attc,
    /// Residual stream after attention.
    res2,
    ln2,
    ln2_mean,
    ln2_rstd,
    /// The MLP's hidden pre-activation.
    fch,
    /// gelu(fch), where the plan keeps it ([`PrecisionPlan::keep_gelu_output`]); empty when the
    /// backward pass recomputes it (and always in FP8, which never writes it).
    gelu,
    /// Residual stream after the MLP (the block's output).
    res3,
    /// Fused (flash) attention only: the log-sum-exp of each attention row (f32,
    /// `b × nh × t`), what its backward pass needs instead of the probabilities. Empty when
    /// the unfused ops run.
    lse,
}
}

buffers! {
/// Scratch buffers the forward and backward passes reuse across blocks. The three score-sized
/// buffers hold one chunk of `Dims::ab` attention matrices (`ab × t × t`), not all `b·nh`.
pub(super) struct Scratch<B> {
    /// Scores, and in the backward pass their gradient.
    scores,
    probs,
    dprobs,
    /// Heads split from a block's `qkv` (`b × nh × t × hs` each).
    q,
    k,
    v,
    dresid,
    d_c,
    d_c2,
    dq,
    dk,
    dv,
    dqkv,
    /// The gradient of the MLP's hidden activation; empty where it shares `d_f2` (see
    /// [`GradIo::Shared`]).
    d_f,
    /// gelu(fch): the MLP's hidden activation (forward), recomputed for the weight gradient
    /// and then overwritten by its gradient when `d_f` is empty.
    d_f2,
}
}

/// The shapes a block works with.
#[derive(Clone, Copy, Debug)]
pub(super) struct Dims {
    pub(super) b: usize,
    pub(super) t: usize,
    pub(super) c: usize,
    pub(super) nh: usize,
    pub(super) hs: usize,
    pub(super) f: usize,
    pub(super) n: usize,
    /// Attention matrices (of the `b·nh`) handled per chunk; divides `b·nh`.
    pub(super) ab: usize,
    /// The backend's fused attention runs (see [`duet_device::AttentionOps::flash_attention_forward`]).
    pub(super) flash: bool,
}

/// Score-matrix elements the attention works on at once: 16 Mi (32 MiB in bf16), so the
/// scratch does not grow with `b·nh·t²` (the seed model runs in 2 chunks of 192 heads: 3 × 24
/// MiB of bf16 scratch instead of 3 × 48 MiB, and no block keeps its 48 MiB of probabilities),
/// while the number of launches stays small (each chunk is 3 launches forward, 8 backward).
pub(super) const ATTENTION_CHUNK_ELEMS: usize = 1 << 24;

/// The number of attention matrices per chunk: the largest divisor of `bh` (= batch × heads)
/// whose `t × t` score matrices fit in [`ATTENTION_CHUNK_ELEMS`] (at least 1).
pub(super) fn attention_chunk(bh: usize, t: usize) -> usize {
    let fit = (ATTENTION_CHUNK_ELEMS / (t * t).max(1)).clamp(1, bh.max(1));
    (1..=fit).rev().find(|d| bh.is_multiple_of(*d)).unwrap_or(1)
}

/// The most bytes of logits the LM head writes at once by default (1 GiB): a larger `b·t ×
/// padded vocab` matrix is handled in chunks of rows, each through the LM head, the loss (its
/// gradient written over the chunk's logits) and the LM head's two backward GEMMs before the
/// next, so the logits never exist whole (llm.c keeps them whole: 3.3 GB at GPT-2's B 32,
/// T 1024 in bf16, 0.8 GB a chunk here).
pub const LOGITS_CHUNK_BYTES: usize = 1 << 30;

/// The logits' default budget where the plan keeps the GELU outputs (512 MiB): the
/// `layers × b·t × ffn` activations they add are paid for partly by smaller chunks (GPT-2 at
/// B 32 in bf16: chunks of 4096 rows instead of 8192, 0.4 GB less).
pub const LOGITS_CHUNK_BYTES_KEPT_GELU: usize = 1 << 29;

/// Chunks are not made smaller than this many rows (the LM head's GEMMs stay large).
const LOGITS_CHUNK_MIN_ROWS: usize = 512;

/// The rows of logits handled at once for `n` rows of `vp` (padded) columns of `elem_bytes`
/// each: `requested` if it is positive (at most `n`, and a divisor of `n`: else an error), or
/// the automatic choice — `n` where the logits fit in `budget` bytes ([`LOGITS_CHUNK_BYTES`],
/// or [`LOGITS_CHUNK_BYTES_KEPT_GELU`] where the GELU outputs are kept), else `n / k` for the
/// smallest divisor `k` of `n` that makes a chunk fit, not going below
/// [`LOGITS_CHUNK_MIN_ROWS`] rows. Every backend chooses the same, so they compute the same
/// sums.
pub fn logits_chunk_rows(
    n: usize,
    vp: usize,
    elem_bytes: usize,
    requested: usize,
    budget: usize,
) -> Result<usize, String> {
    if requested > 0 {
        if requested > n || !n.is_multiple_of(requested) {
            return Err(format!(
                "logits chunk rows {requested} must divide batch × seq = {n}"
            ));
        }
        return Ok(requested);
    }
    let fits = |rows: usize| rows * vp * elem_bytes <= budget;
    let mut best = n;
    for k in 1..=n {
        if !n.is_multiple_of(k) {
            continue;
        }
        let rows = n / k;
        if rows < LOGITS_CHUNK_MIN_ROWS.min(n) {
            break;
        }
        best = rows;
        if fits(rows) {
            break;
        }
    }
    Ok(best)
}

/// Which part of the [`MemoryPlan`] a buffer counts towards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Params,
    Grads,
    Activations,
    Scratch,
}

/// One entry of the buffer table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufSpec {
    pub dtype: DType,
    pub len: usize,
    pub kind: Kind,
}

impl BufSpec {
    pub fn bytes(&self) -> u64 {
        (self.len * self.dtype.size_bytes()) as u64
    }
}

/// FP8 copies of the linear layers' operands (see [`super::fp8_codes::Fp8Bufs`]).
pub(super) struct Fp8Layout<B> {
    pub(super) x8: Vec<B>,
    pub(super) x8t: Vec<B>,
    pub(super) w8: Vec<B>,
    pub(super) w8t: Vec<B>,
    pub(super) dy8: Vec<B>,
    pub(super) dy8t: Vec<B>,
    pub(super) amax_discard: B,
    /// The scaling metadata [`Fp8State::new`] takes ([`Fp8State::buffer_lens`]).
    pub(super) state: Vec<B>,
    /// The FP8 encodings the codes use.
    pub(super) family: Fp8Family,
}

/// Every buffer of a model, as specs ([`Buffers::plan`]) or allocated.
pub(super) struct Buffers<B> {
    pub(super) params: Vec<B>,
    pub(super) grads: Vec<B>,
    pub(super) tokens: B,
    pub(super) targets: B,
    pub(super) encoded: B,
    pub(super) blocks: Vec<BlockActs<B>>,
    pub(super) seg_inputs: Vec<B>,
    pub(super) lnf: B,
    pub(super) lnf_mean: B,
    pub(super) lnf_rstd: B,
    /// The LM head's output in the activation dtype (`n × padded vocab`); the loss writes the
    /// logits' gradient over it (`LossOps::cross_entropy_in_place`), so no second buffer of that
    /// size exists.
    pub(super) logits: B,
    pub(super) losses: B,
    /// With the logits in chunks ([`logits_chunk_rows`] below `b·t`): one chunk's targets and
    /// losses (the loss kernels work on whole buffers); empty otherwise.
    pub(super) chunk_targets: B,
    pub(super) chunk_losses: B,
    /// Rows of logits per chunk (`b·t` when they exist whole).
    pub(super) logit_rows: usize,
    pub(super) zeros_c: B,
    pub(super) scratch: Scratch<B>,
    pub(super) fp8: Option<Fp8Layout<B>>,
    /// Attention runs fused (see [`duet_device::AttentionOps::flash_attention_forward`]): no score
    /// matrices, no split heads.
    pub(super) flash: bool,
}

fn map_vec<B, C, E>(
    v: Vec<B>,
    f: &mut impl FnMut(B) -> std::result::Result<C, E>,
) -> std::result::Result<Vec<C>, E> {
    v.into_iter().map(&mut *f).collect()
}

impl<B> Buffers<B> {
    /// Allocates (or otherwise maps) every entry, in table order.
    pub(super) fn try_map<C, E>(
        self,
        f: &mut impl FnMut(B) -> std::result::Result<C, E>,
    ) -> std::result::Result<Buffers<C>, E> {
        Ok(Buffers {
            params: map_vec(self.params, f)?,
            grads: map_vec(self.grads, f)?,
            tokens: f(self.tokens)?,
            targets: f(self.targets)?,
            encoded: f(self.encoded)?,
            blocks: self
                .blocks
                .into_iter()
                .map(|k| k.try_map(f))
                .collect::<std::result::Result<_, _>>()?,
            seg_inputs: map_vec(self.seg_inputs, f)?,
            lnf: f(self.lnf)?,
            lnf_mean: f(self.lnf_mean)?,
            lnf_rstd: f(self.lnf_rstd)?,
            logits: f(self.logits)?,
            losses: f(self.losses)?,
            chunk_targets: f(self.chunk_targets)?,
            chunk_losses: f(self.chunk_losses)?,
            logit_rows: self.logit_rows,
            zeros_c: f(self.zeros_c)?,
            scratch: self.scratch.try_map(f)?,
            fp8: match self.fp8 {
                None => None,
                Some(q) => Some(Fp8Layout {
                    x8: map_vec(q.x8, f)?,
                    x8t: map_vec(q.x8t, f)?,
                    w8: map_vec(q.w8, f)?,
                    w8t: map_vec(q.w8t, f)?,
                    dy8: map_vec(q.dy8, f)?,
                    dy8t: map_vec(q.dy8t, f)?,
                    amax_discard: f(q.amax_discard)?,
                    state: map_vec(q.state, f)?,
                    family: q.family,
                }),
            },
            flash: self.flash,
        })
    }
}

impl Buffers<BufSpec> {
    /// The table for batch `b` × sequence `t` on `dev` (whose capabilities decide whether
    /// attention runs fused and whether the MLP's GELU backward needs its own buffer).
    pub(super) fn plan<D: Device>(
        dev: &D,
        cfg: &ModelConfig,
        b: usize,
        t: usize,
        plan: &PrecisionPlan,
    ) -> Result<Self, EngineError> {
        let f32 = DType::F32;
        let act = plan.precision.activation_dtype();
        let is_fp8 = plan.precision == Precision::Fp8;
        // The MLP's GELU outputs stay for the backward pass (FP8 never stores them).
        let keeps_gelu = plan.keep_gelu_output && !is_fp8;
        let spec = |dtype: DType, len: usize, kind: Kind| BufSpec { dtype, len, kind };
        let (params, grads) = Self::param_and_grad_specs(cfg, plan);
        // The logits have the padded vocabulary's columns (see `VOCAB_PAD`).
        let (c, f, nh, v) = (
            cfg.d_model,
            cfg.ffn,
            cfg.heads,
            super::params::padded_vocab(cfg),
        );
        let n = b * t;
        let budget = if keeps_gelu {
            LOGITS_CHUNK_BYTES_KEPT_GELU
        } else {
            LOGITS_CHUNK_BYTES
        };
        let logit_rows = logits_chunk_rows(n, v, act.size_bytes(), plan.logits_chunk_rows, budget)
            .map_err(EngineError::Config)?;
        let chunk = if logit_rows < n { logit_rows } else { 0 };
        // Fused attention where the backend has it for this dtype and head size: then no score
        // matrix and no split q/k/v exist at all.
        let caps = dev.capabilities();
        let flash = caps.flash_attention(act, cfg.head_size());
        let att = if flash {
            0
        } else {
            attention_chunk(b * nh, t) * t * t
        };
        let a = |len: usize| spec(act, len, Kind::Activations);
        let a32 = |len: usize| spec(f32, len, Kind::Activations);
        let s = |len: usize| spec(act, len, Kind::Scratch);
        // With checkpointing, one segment's worth of block activations is reused by every
        // segment, and only each segment's input is kept.
        let ckpt = plan.checkpoint_every;
        let slots = if ckpt > 0 {
            ckpt.min(cfg.layers)
        } else {
            cfg.layers
        };
        let segments = if ckpt > 0 {
            cfg.layers.div_ceil(ckpt)
        } else {
            0
        };
        // FP8 keeps the LayerNorm outputs only as FP8 transposes.
        let ln_len = if is_fp8 { 0 } else { n * c };
        let block = BlockActs {
            ln1: a(ln_len),
            ln1_mean: a32(n),
            ln1_rstd: a32(n),
            qkv: a(n * 3 * c),
            attc: a(n * c),
            res2: a(n * c),
            ln2: a(ln_len),
            ln2_mean: a32(n),
            ln2_rstd: a32(n),
            fch: a(n * f),
            gelu: a(if keeps_gelu { n * f } else { 0 }),
            res3: a(n * c),
            lse: a32(if flash { b * nh * t } else { 0 }),
        };
        // The MLP's hidden gradient can overwrite the recomputed GELU output (d_f2) where the
        // GELU backward needs no separate pass: fused into the GEMM, or into FP8's quantisation.
        let one_mlp_grad = is_fp8 || caps.gemm_epilogue(act);
        let h = if flash { 0 } else { n * c };
        let scratch = Scratch {
            scores: s(att),
            probs: s(att),
            dprobs: s(att),
            q: s(h),
            k: s(h),
            v: s(h),
            dresid: s(n * c),
            d_c: s(n * c),
            d_c2: s(h),
            dq: s(h),
            dk: s(h),
            dv: s(h),
            dqkv: s(n * 3 * c),
            d_f: s(if one_mlp_grad { 0 } else { n * f }),
            d_f2: s(n * f),
        };
        let fp8 = is_fp8.then(|| Self::fp8_layout(dev, cfg, plan, n));
        Ok(Buffers {
            params,
            grads,
            tokens: spec(DType::I32, n, Kind::Activations),
            targets: spec(DType::I32, n, Kind::Activations),
            encoded: a(n * c),
            blocks: vec![block; slots],
            seg_inputs: vec![a(n * c); segments],
            lnf: a(n * c),
            lnf_mean: a32(n),
            lnf_rstd: a32(n),
            logits: a(logit_rows * v),
            losses: a32(n),
            chunk_targets: spec(DType::I32, chunk, Kind::Activations),
            chunk_losses: a32(chunk),
            logit_rows,
            zeros_c: spec(f32, c, Kind::Scratch),
            scratch,
            fp8,
            flash,
        })
    }

    /// The parameters' and their gradients' buffers, in [`param_specs`] order: each in the
    /// activation dtype where its kind and the precision plan allow, else f32.
    fn param_and_grad_specs(
        cfg: &ModelConfig,
        plan: &PrecisionPlan,
    ) -> (Vec<BufSpec>, Vec<BufSpec>) {
        let f32 = DType::F32;
        let act = plan.precision.activation_dtype();
        let is_fp8 = plan.precision == Precision::Fp8;
        let spec = |dtype: DType, len: usize, kind: Kind| BufSpec { dtype, len, kind };
        let specs = param_specs(cfg);
        let mut params = Vec::with_capacity(specs.len());
        let mut grads = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            // FP8: the linear layers' weights reach the GEMMs only as FP8 codes, quantised
            // from these f32 weights (which the optimizer updates in place: no master copy,
            // no 16-bit copy).
            let fp8_weight = is_fp8 && is_linear_weight(cfg, i);
            let dtype = if s.low_precision() && !fp8_weight {
                act
            } else {
                f32
            };
            params.push(spec(dtype, s.device_numel(), Kind::Params));
            let low_grad = plan.low_precision_weight_grads && is_linear_weight(cfg, i);
            grads.push(spec(
                if low_grad { act } else { f32 },
                s.device_numel(),
                Kind::Grads,
            ));
        }
        (params, grads)
    }

    /// FP8's buffers for `n` rows on `dev`: the FP8 codes of every linear layer's input,
    /// weight and output gradient (and their transposes), and the scaling state.
    fn fp8_layout<D: Device>(
        dev: &D,
        cfg: &ModelConfig,
        plan: &PrecisionPlan,
        n: usize,
    ) -> Fp8Layout<BufSpec> {
        let f32 = DType::F32;
        let spec = |dtype: DType, len: usize, kind: Kind| BufSpec { dtype, len, kind };
        let caps = dev.capabilities();
        let family = plan
            .fp8_family
            .unwrap_or_else(|| Fp8Family::of_device(&dev.info()));
        let (fwd, bwd) = family.dtypes(plan.fp8.recipe);
        let mut q = Fp8Layout {
            x8: vec![],
            x8t: vec![],
            w8: vec![],
            w8t: vec![],
            dy8: vec![],
            dy8t: vec![],
            amax_discard: spec(f32, 0, Kind::Scratch),
            state: vec![],
            family,
        };
        for _ in 0..cfg.layers {
            for k in 0..LINEARS.len() {
                let (fi, fo) = linear_dims(cfg, k);
                q.x8t.push(spec(fwd, n * fi, Kind::Activations));
                q.w8.push(spec(fwd, fo * fi, Kind::Scratch));
                q.w8t.push(spec(fwd, fo * fi, Kind::Scratch));
            }
        }
        for k in 0..LINEARS.len() {
            let (fi, fo) = linear_dims(cfg, k);
            q.x8.push(spec(fwd, n * fi, Kind::Scratch));
            q.dy8.push(spec(bwd, n * fo, Kind::Scratch));
            q.dy8t.push(spec(bwd, n * fo, Kind::Scratch));
        }
        let lens = Fp8State::<D>::buffer_lens(
            &plan.fp8,
            cfg.layers * LINEARS.len(),
            caps.fp8_scale_inv_stride,
        );
        q.amax_discard.len = lens[2];
        q.state = lens
            .iter()
            .map(|&len| spec(f32, len, Kind::Scratch))
            .collect();
        q
    }

    /// Bytes per kind, and the optimizer state AdamW allocates for these parameters: two f32
    /// moments each, an f32 master copy of every parameter whose working copy is not f32, and
    /// its scalars; split over `optimizer_shards` ranks under ZeRO-1 (there the per-rank shard
    /// is rounded up, an estimate rather than an exact count).
    pub(super) fn memory_plan(&self, optimizer_shards: usize) -> MemoryPlan {
        let mut m = MemoryPlan::default();
        self.each(&mut |s| {
            let slot = match s.kind {
                Kind::Params => &mut m.params,
                Kind::Grads => &mut m.grads,
                Kind::Activations => &mut m.activations,
                Kind::Scratch => &mut m.scratch,
            };
            *slot += s.bytes();
        });
        let moments: u64 = self.params.iter().map(|p| 8 * p.len as u64).sum();
        let masters: u64 = self
            .params
            .iter()
            .filter(|p| p.dtype != DType::F32)
            .map(|p| 4 * p.len as u64)
            .sum();
        let scalars = 4 * duet_device::ADAMW_SCALARS as u64;
        m.optimizer = (moments + masters + scalars).div_ceil(optimizer_shards.max(1) as u64);
        m
    }

    /// Visits every spec.
    fn each(&self, f: &mut impl FnMut(&BufSpec)) {
        let mut g = |b: &BufSpec| f(b);
        self.params.iter().chain(&self.grads).for_each(&mut g);
        [&self.tokens, &self.targets, &self.encoded]
            .into_iter()
            .for_each(&mut g);
        for k in &self.blocks {
            k.each(&mut g);
        }
        self.seg_inputs.iter().for_each(&mut g);
        [
            &self.lnf,
            &self.lnf_mean,
            &self.lnf_rstd,
            &self.logits,
            &self.losses,
            &self.chunk_targets,
            &self.chunk_losses,
            &self.zeros_c,
        ]
        .into_iter()
        .for_each(&mut g);
        self.scratch.each(&mut g);
        if let Some(q) = &self.fp8 {
            q.x8.iter()
                .chain(&q.x8t)
                .chain(&q.w8)
                .chain(&q.w8t)
                .chain(&q.dy8)
                .chain(&q.dy8t)
                .chain(std::iter::once(&q.amax_discard))
                .chain(&q.state)
                .for_each(&mut g);
        }
    }
}

/// Bytes held by each category of buffer (the memory plan), summed from the buffer table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The model's (working) weights.
    pub params: u64,
    pub grads: u64,
    /// What AdamW holds for this model: f32 moments, its scalars and, for weights whose
    /// working copy is not f32, the FP32 master weights (not allocated by the model).
    pub optimizer: u64,
    /// What the forward pass keeps for the backward pass (and the batch's tokens).
    pub activations: u64,
    /// Buffers reused across blocks, FP8 operand copies and scaling metadata.
    pub scratch: u64,
}

impl MemoryPlan {
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations + self.scratch
    }

    /// What the model itself allocates (everything but the optimizer state).
    pub fn model_bytes(&self) -> u64 {
        self.total() - self.optimizer
    }
}

/// The memory plan of a model for batch `b` × sequence `t` on `dev`, before anything is
/// allocated: the same table the model allocates.
pub fn estimate_memory<D: Device>(
    dev: &D,
    cfg: &ModelConfig,
    b: usize,
    t: usize,
    plan: &PrecisionPlan,
) -> Result<MemoryPlan, EngineError> {
    Ok(Buffers::plan(dev, cfg, b, t, plan)?.memory_plan(plan.optimizer_shards))
}

pub(crate) fn out_of_memory(needed: u64, free: u64, checkpoint_every: usize) -> EngineError {
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
