//! The `Device` trait: the one interface every duet backend (CPU, CUDA, HIP) implements.
//!
//! Conventions shared by every op:
//! - Matrices are row-major. A "rows × cols" tensor has `cols` contiguous elements per row.
//! - Buffers carry a runtime [`DType`]. Arithmetic is always done in f32 (GEMMs accumulate in f32);
//!   f16/bf16/fp8 are storage formats. An op given a dtype it cannot handle returns
//!   [`DeviceError::Unsupported`], never a wrong answer.
//! - Ops are enqueued on the device's stream in call order; [`Device::synchronize`] waits for them.
//!   Host reads ([`DeviceExt::download`]) synchronise implicitly.
//! - "accumulate" in an op's doc means the result is added to the output (`+=`); everything else
//!   overwrites its output.
#![forbid(unsafe_code)]

pub mod args;
mod capabilities;
mod collective;
pub mod composed;
mod dtype;
mod error;
mod gemm;
mod host_memory;
pub mod knobs;
pub mod layernorm_plan;

pub use args::{HeadsDesc, RowsDesc, SoftmaxDesc, TokensDesc, cross_entropy_threads};
pub use capabilities::Capabilities;
pub use collective::{Collective, ReduceOp, check_collective_lens};
pub use dtype::{DType, Fp8Format, Fp8Kind, HostType};
pub use error::human_bytes;
pub use error::{DeviceError, Result};
pub use gemm::GemmDesc;
pub use host_memory::{HostMemory, host_memory, host_memory_report};

use std::fmt;

/// Which backend to run on. `Auto` picks the first GPU backend that loads, else the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Cpu,
    Cuda,
    Hip,
    Auto,
}

impl BackendKind {
    pub const ALL: [BackendKind; 4] = [Self::Cpu, Self::Cuda, Self::Hip, Self::Auto];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Hip => "hip",
            Self::Auto => "auto",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = DeviceError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "hip" | "rocm" => Ok(Self::Hip),
            "auto" => Ok(Self::Auto),
            other => Err(DeviceError::InvalidArgument(format!(
                "unknown backend '{other}' (expected one of: cpu, cuda, hip, auto)"
            ))),
        }
    }
}

/// What a device is and what it can do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceInfo {
    /// "cpu", "cuda" or "hip".
    pub backend: String,
    /// Marketing name, e.g. "NVIDIA H200" or "AMD Instinct MI300X".
    pub name: String,
    /// "sm_90", "gfx942", or the CPU's feature summary.
    pub arch: String,
    /// Total device memory in bytes (host RAM for the CPU).
    pub total_memory: u64,
    pub supports_bf16: bool,
    pub supports_fp8: bool,
    /// Free-form details (driver and library versions, thread count, ...).
    pub details: Vec<(String, String)>,
}

impl DeviceInfo {
    /// Whether the device's FP8 hardware uses the FNUZ encodings (AMD gfx940/gfx942, MI300)
    /// rather than OCP's (NVIDIA sm_89+, AMD gfx950; the CPU emulates both and defaults to OCP).
    pub fn fp8_is_fnuz(&self) -> bool {
        self.arch.starts_with("gfx942") || self.arch.starts_with("gfx940")
    }
}

/// Memory use as the backend sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in live buffers allocated through this device.
    pub current: u64,
    /// High-water mark of `current` since creation or the last [`Device::reset_peak_memory`].
    pub peak: u64,
    /// The driver's view: (free, total) bytes, where the backend has one.
    pub driver: Option<(u64, u64)>,
}

/// One reading of the device's clocks and power ([`Device::telemetry`]), for benchmarks: a
/// step's time depends on them, and they differ between machines of the same model (power
/// caps, cooling).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Telemetry {
    /// Streaming-multiprocessor clock, MHz.
    pub sm_clock_mhz: u32,
    /// Board power draw, W: instantaneous where the GPU reports it ([`Telemetry::power_instant`]),
    /// else the driver's trailing average (about one second on recent NVIDIA GPUs).
    pub power_w: f64,
    /// Whether `power_w` is the instantaneous draw.
    pub power_instant: bool,
    /// The power limit in force, W.
    pub power_limit_w: f64,
    /// GPU temperature, °C.
    pub temperature_c: u32,
    /// The clocks are held down by the power limit (software power cap or power brake).
    pub power_capped: bool,
    /// The clocks are held down by temperature (software or hardware thermal slowdown).
    pub thermal_slowdown: bool,
}

/// Hyper-parameters of one fused AdamW step (see [`Device::adamw`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1 − β1^t for the step number t ≥ 1.
    pub bias_correction1: f32,
    /// 1 − β2^t.
    pub bias_correction2: f32,
    /// Multiplies the gradient before use: folds in 1/loss-scale and the clipping factor.
    pub grad_scale: f32,
}

impl AdamWStep {
    /// Bias corrections for step `t` (1-based) computed in f64, then rounded once.
    pub fn bias_corrections(beta1: f32, beta2: f32, t: u64) -> (f32, f32) {
        let t = t.min(i32::MAX as u64) as i32;
        (
            (1.0 - (beta1 as f64).powi(t)) as f32,
            (1.0 - (beta2 as f64).powi(t)) as f32,
        )
    }
}

/// What a fused GEMM epilogue does after `op(A)·op(B)` ([`Fused::gemm_epilogue`]).
pub enum Epilogue<'a, B> {
    /// `C = alpha·op(A)·op(B) + beta·C + bias`: `bias` holds one value per column of C (f32
    /// or C's dtype).
    Bias(&'a B),
    /// `C = residual + op(A)·op(B) + bias`: a linear layer on a residual stream in one pass
    /// (C is only written; `residual` has C's shape and dtype, `bias` C's dtype). Needs
    /// alpha = 1, beta = 0.
    BiasResidual { bias: &'a B, residual: &'a B },
    /// `pre = op(A)·op(B) + bias` and `C = gelu(pre)` (tanh approximation); `pre` has C's
    /// shape and dtype. Needs alpha = 1, beta = 0.
    BiasGelu { bias: &'a B, pre: &'a mut B },
    /// `C = (op(A)·op(B)) ⊙ gelu'(pre)`: the GELU backward fused into the GEMM that produces
    /// the gradient of the GELU's output. Needs alpha = 1, beta = 0.
    DGelu { pre: &'a B },
    /// The usual `C = alpha·op(A)·op(B) + beta·C`, and `dbias[i] = Σ_k op(A)[i, k]` (one f32
    /// value per row of C, overwritten): a linear layer's bias gradient computed in its
    /// weight-gradient GEMM, where A is the output gradient stored `k × m` (`trans_a`).
    BiasGradA { dbias: &'a mut B },
}

/// One tensor of a multi-tensor AdamW update ([`Fused::adamw_clipped`]).
pub struct AdamWTensor<'a, B> {
    /// f32 (master) weights, updated in place.
    pub param: &'a mut B,
    pub grad: &'a B,
    pub m: &'a mut B,
    pub v: &'a mut B,
    /// The low-precision working copy written with the updated weights, if any.
    pub copy: Option<&'a mut B>,
    pub weight_decay: f32,
}

/// The FP8 codes [`Fused::adamw_clipped_fp8`] writes for one updated weight matrix.
pub struct AdamWFp8Out<'a, B> {
    /// Index of the weight in the update's tensors; the codes are those of its working copy
    /// (of its `param` when it has none) after the update.
    pub tensor: usize,
    /// FP8 codes, `rows × cols`.
    pub dst: &'a mut B,
    /// The same codes transposed (`cols × rows`, `dst`'s dtype), if wanted.
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    /// The weight's entry of `scale` and `amax`.
    pub slot: usize,
}

impl<B> AdamWFp8Out<'_, B> {
    /// The [`Fused::quantize_fp8_many`] job that writes these codes from tensor `t`'s updated
    /// weight (its working copy, else its `param`): what [`Fused::adamw_clipped_fp8`] computes.
    pub fn job<'b>(&'b mut self, t: &'b AdamWTensor<'_, B>) -> Fp8QuantJob<'b, B> {
        Fp8QuantJob {
            src: t.copy.as_deref().unwrap_or(&*t.param),
            dst: &mut *self.dst,
            dst_t: self.dst_t.as_deref_mut(),
            rows: self.rows,
            cols: self.cols,
            slot: self.slot,
        }
    }
}

/// One matrix of a multi-tensor FP8 quantisation ([`Fused::quantize_fp8_many`]): the operands of
/// one [`Device::quantize_fp8`] call but the `scale` and `amax` buffers, which every job of a
/// call shares (each job reads and updates its own `slot` of them).
pub struct Fp8QuantJob<'a, B> {
    /// `rows × cols`, f32, f16 or bf16.
    pub src: &'a B,
    /// FP8 codes of `src`, `rows × cols`.
    pub dst: &'a mut B,
    /// The same codes transposed (`cols × rows`, `dst`'s dtype), if wanted.
    pub dst_t: Option<&'a mut B>,
    pub rows: usize,
    pub cols: usize,
    /// The entry of `scale` this job multiplies by and of `amax` it records into.
    pub slot: usize,
}

impl<B: Buffer> Fp8QuantJob<'_, B> {
    /// Runs this job as one [`Device::quantize_fp8`] call on `d`.
    pub fn quantize<D: Device<Buffer = B>>(
        &mut self,
        d: &D,
        scale: &B,
        amax: &mut B,
    ) -> Result<()> {
        d.quantize_fp8(
            self.src,
            self.dst,
            self.dst_t.as_deref_mut(),
            self.rows,
            self.cols,
            scale,
            amax,
            self.slot,
        )
    }
}

/// The run-wide values of [`Fused::adamw_clipped`]. The per-step values (learning rate, bias
/// corrections) live in a device buffer, see [`ADAMW_SCALARS`], and the gradient factor is
/// derived on the device from the global gradient norm (clipping and loss-scale unscaling), so
/// one queued (or recorded) update serves every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWClipStep {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Clip the global gradient norm to this value (0 disables clipping).
    pub max_norm: f32,
    /// The factor the gradients carry (1 without loss scaling).
    pub loss_scale: f32,
}

/// Layout of the f32 scalar buffer of [`Fused::adamw_clipped`]: the sum of squares of all the
/// gradients (slot 0, accumulated by [`Fused::sum_squares_many`]), the learning rate, and the
/// bias corrections 1 − β1^t and 1 − β2^t.
pub const ADAMW_SCALARS: usize = 4;

/// FP8 delayed scaling: the scale for an amax (`fp8_max / amax / 2^margin`, computed in f64,
/// saturating at f32::MAX), or `prev` when `amax` is not a finite positive number (no data,
/// overflow, NaN). What [`Fused::fp8_scaling_update`] computes on every backend.
pub fn fp8_delayed_scale(amax: f32, prev: f32, fp8_max: f32, margin: i32) -> f32 {
    if !(amax.is_finite() && amax > 0.0) {
        return prev;
    }
    let s = (fp8_max as f64 / amax as f64) / 2f64.powi(margin);
    if s >= f32::MAX as f64 {
        f32::MAX
    } else {
        s as f32
    }
}

/// The inverse scale the FP8 GEMMs take: `1/scale` rounded once from f64.
pub fn fp8_scale_inv(scale: f32) -> f32 {
    (1.0f64 / scale as f64) as f32
}

/// One operand's delayed-scaling step on host values: pushes `amax` onto `history` (newest
/// first; the oldest entry falls off), then [`fp8_history_scale`].
pub fn fp8_history_step(
    history: &mut [f32],
    amax: f32,
    prev: f32,
    fp8_max: f32,
    most_recent: bool,
    margin: i32,
) -> f32 {
    if !history.is_empty() {
        history.rotate_right(1);
        history[0] = amax;
    }
    fp8_history_scale(history, amax, prev, fp8_max, most_recent, margin)
}

/// The scale after an amax history (newest first, `newest` its first entry): from the
/// history's max (a NaN entry makes it NaN, so the scale is kept) or, with `most_recent`, from
/// `newest` ([`fp8_delayed_scale`]).
pub fn fp8_history_scale(
    history: &[f32],
    newest: f32,
    prev: f32,
    fp8_max: f32,
    most_recent: bool,
    margin: i32,
) -> f32 {
    let a = if most_recent {
        newest
    } else {
        history.iter().copied().fold(0.0f32, |m, x| {
            if x.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(x)
            }
        })
    };
    fp8_delayed_scale(a, prev, fp8_max, margin)
}

/// AdamW's gradient factor from the sum of squares of the (loss-scaled) gradients:
/// PyTorch's `clip_grad_norm_` coefficient `max_norm / (norm + 1e-6)` where it is below 1,
/// divided by the loss scale. Every backend computes exactly this (f32 square root, the
/// unscaling in f64, rounded once), on the host or on the device.
pub fn clip_grad_scale(norm_sq: f32, max_norm: f32, loss_scale: f32) -> f32 {
    let raw = norm_sq.sqrt();
    let norm = (raw as f64 / loss_scale as f64) as f32;
    let coef = max_norm / (norm + 1e-6);
    let clip = if max_norm > 0.0 && coef < 1.0 {
        coef
    } else {
        1.0
    };
    if loss_scale == 1.0 {
        clip
    } else {
        (clip as f64 / loss_scale as f64) as f32
    }
}

/// A typed buffer owned by a device.
pub trait Buffer: Send + Sync {
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}

/// A compute device: memory, copies, a stream, GEMMs and the training kernels (the core ops
/// every backend implements). The fused paths built on them are in [`Fused`].
///
/// Every method validates shapes and dtypes before touching memory and reports problems as
/// [`DeviceError`]s (the contract's checks are in [`args`], shared by every backend). Buffers
/// passed as outputs (`&mut`) must not alias inputs; Rust's borrow rules enforce that for
/// distinct buffers.
pub trait Device: Send + Sync + Sized + 'static {
    type Buffer: Buffer;
    /// A recorded sequence of queued ops ([`Device::capture_begin`]); `()` where the backend
    /// cannot record.
    type Graph: Send;

    fn info(&self) -> DeviceInfo;

    /// The paths this device has of its own, read once when it opened.
    fn capabilities(&self) -> &Capabilities;

    // ------------------------------------------------------------------ memory and copies

    /// Allocates `len` zero-initialised elements of `dtype`.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Self::Buffer>;

    /// Copies host bytes into `dst` starting at element `offset`. The bytes must hold whole
    /// elements of `dst`'s dtype. May return before the copy completes (the host data is staged).
    fn upload_bytes(&self, src: &[u8], dst: &mut Self::Buffer, offset: usize) -> Result<()>;

    /// Copies `len` elements starting at `offset` back to the host as raw little-endian bytes.
    /// Waits for all queued work that writes `src`.
    fn download_bytes(&self, src: &Self::Buffer, offset: usize, len: usize) -> Result<Vec<u8>>;

    /// Device-to-device copy of `len` elements (same dtype).
    fn copy(
        &self,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Sets every element to `value` (converted to the buffer's dtype).
    fn fill(&self, dst: &mut Self::Buffer, value: f32) -> Result<()>;

    /// Waits until all queued work has finished, reporting any deferred error.
    fn synchronize(&self) -> Result<()>;

    /// Opens a named range on the profiler timeline (NVTX on CUDA, roctx on HIP, where their
    /// libraries load; nothing elsewhere), closed by [`Device::range_pop`]. Ranges nest. Host
    /// side only: inside a recorded graph they mark the recording, not each replay.
    fn range_push(&self, name: &str) {
        let _ = name;
    }

    /// Closes the innermost range of [`Device::range_push`].
    fn range_pop(&self) {}

    /// Starts recording: until [`Device::capture_end`], ops are recorded instead of run.
    /// Recorded ops keep the buffers and scalar arguments they were given, so what changes
    /// between replays must live in device buffers written before each replay. While recording,
    /// nothing may allocate, upload, download or synchronise (those return an error).
    fn capture_begin(&self) -> Result<()> {
        Err(no_graphs(self))
    }

    /// Ends recording and returns the graph (also after a failed op: recording always stops).
    fn capture_end(&self) -> Result<Self::Graph> {
        Err(no_graphs(self))
    }

    /// Queues a recorded graph: its ops run again, in order, on the current buffer contents.
    fn replay(&self, graph: &Self::Graph) -> Result<()> {
        let _ = graph;
        Err(no_graphs(self))
    }

    /// Runs `work` (which queues device work, and may wait for it) and returns the
    /// milliseconds the device took for it: between device events recorded before and after it
    /// where the backend has them (CUDA), else on the host clock between synchronisations.
    fn time_ms<E: From<DeviceError>>(
        &self,
        work: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        time_ms_host_clock(self, work)
    }

    /// What [`Device::time_ms`] measures with: "device events" or "host clock".
    fn timer_kind(&self) -> &'static str {
        "host clock"
    }

    fn memory_stats(&self) -> MemoryStats;
    fn reset_peak_memory(&self);

    /// The device's clocks, power and temperature now, where the backend can read them (CUDA:
    /// NVML when libnvidia-ml loads); None elsewhere. Cheap enough to sample every few
    /// milliseconds from another thread while steps run.
    fn telemetry(&self) -> Option<Telemetry> {
        None
    }

    // ------------------------------------------------------------------ GEMM

    /// `C = alpha · op(A) · op(B) + beta · C`, batched per [`GemmDesc`], FP32 accumulation.
    /// A and B share a dtype (f32, f16 or bf16); C is that dtype or f32.
    fn gemm(
        &self,
        desc: &GemmDesc,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
    ) -> Result<()>;

    /// Turns GEMM autotuning on or off where the backend has it (CUDA: each new cuBLASLt GEMM
    /// shape times the heuristic's candidates once and keeps the fastest, as PyTorch's
    /// max-autotune does). The choice depends on timings, so two runs may pick different
    /// algorithms and differ in the last bits. Returns whether the backend autotunes.
    fn set_gemm_autotune(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    // ------------------------------------------------------------------ elementwise and casts

    /// `dst = cast(src · scale)`, converting between any two float dtypes (fp8 saturates).
    fn cast(&self, src: &Self::Buffer, dst: &mut Self::Buffer, scale: f32) -> Result<()>;

    /// `x *= alpha` in place.
    fn scale(&self, x: &mut Self::Buffer, alpha: f32) -> Result<()>;

    /// `out = a + b` (residual connection). All three share a dtype and length.
    fn add(&self, a: &Self::Buffer, b: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `dst += src` (accumulate a gradient).
    fn add_assign(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<()>;

    // ------------------------------------------------------------------ model kernels

    /// `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]` for `tokens` (i32, `b·t`), `out` (`b·t × c`).
    #[allow(clippy::too_many_arguments)]
    fn embedding_forward(
        &self,
        tokens: &Self::Buffer,
        wte: &Self::Buffer,
        wpe: &Self::Buffer,
        out: &mut Self::Buffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()>;

    /// Accumulates `dwte[tokens[b,t],:] += dout[b,t,:]` and `dwpe[t,:] += Σ_b dout[b,t,:]`.
    /// Deterministic: the result does not depend on thread scheduling.
    #[allow(clippy::too_many_arguments)]
    fn embedding_backward(
        &self,
        tokens: &Self::Buffer,
        dout: &Self::Buffer,
        dwte: &mut Self::Buffer,
        dwpe: &mut Self::Buffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()>;

    /// LayerNorm over the last dimension of `x` (`n × c`): `out = (x − μ)·rstd·γ + β`, saving
    /// `mean` and `rstd` (f32, `n` each) for the backward pass.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        out: &mut Self::Buffer,
        mean: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()>;

    /// LayerNorm backward. Accumulates into `dx`, `dgamma` and `dbeta`.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        dx: &mut Self::Buffer,
        dgamma: &mut Self::Buffer,
        dbeta: &mut Self::Buffer,
        n: usize,
        c: usize,
    ) -> Result<()>;

    /// `x[r, :] += bias` for every row of `x` (`rows × c`).
    fn bias_add(
        &self,
        x: &mut Self::Buffer,
        bias: &Self::Buffer,
        rows: usize,
        c: usize,
    ) -> Result<()>;

    /// Accumulates `dbias += Σ_rows dout[r, :]`.
    fn bias_backward(
        &self,
        dout: &Self::Buffer,
        dbias: &mut Self::Buffer,
        rows: usize,
        c: usize,
    ) -> Result<()>;

    /// `out = gelu(x)` with the tanh approximation.
    fn gelu_forward(&self, x: &Self::Buffer, out: &mut Self::Buffer) -> Result<()>;

    /// `dx = gelu'(x) · dout` (overwrites `dx`).
    fn gelu_backward(
        &self,
        x: &Self::Buffer,
        dout: &Self::Buffer,
        dx: &mut Self::Buffer,
    ) -> Result<()>;

    /// Splits `qkv` (`b × t × 3 × nh × hs`) into `q`, `k`, `v` (each `b × nh × t × hs`).
    #[allow(clippy::too_many_arguments)]
    fn split_heads(
        &self,
        qkv: &Self::Buffer,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        v: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()>;

    /// Backward of [`Device::split_heads`]: writes `dqkv` from `dq`, `dk`, `dv`.
    #[allow(clippy::too_many_arguments)]
    fn split_heads_backward(
        &self,
        dq: &Self::Buffer,
        dk: &Self::Buffer,
        dv: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()>;

    /// Merges heads: `y` (`b × nh × t × hs`) → `out` (`b × t × nh·hs`). With `backward` set it
    /// does the inverse permutation (`out` layout → `y` layout), which is the gradient.
    #[allow(clippy::too_many_arguments)]
    fn merge_heads(
        &self,
        y: &Self::Buffer,
        out: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        backward: bool,
    ) -> Result<()>;

    /// Causal scaled softmax over `batch` independent `t × t` score matrices (`batch·t·t`
    /// elements; the row index within each matrix is the query position):
    /// `probs[i, j] = softmax_j(scale · scores[i, j])` for `j ≤ i`, 0 above the diagonal.
    fn softmax_causal_forward(
        &self,
        scores: &Self::Buffer,
        probs: &mut Self::Buffer,
        batch: usize,
        t: usize,
        scale: f32,
    ) -> Result<()>;

    /// Backward of the causal scaled softmax over `batch` matrices of `t × t`:
    /// `dscores = scale · P ⊙ (dP − Σ_j P·dP)` (overwrites; 0 above the diagonal).
    fn softmax_causal_backward(
        &self,
        probs: &Self::Buffer,
        dprobs: &Self::Buffer,
        dscores: &mut Self::Buffer,
        batch: usize,
        t: usize,
        scale: f32,
    ) -> Result<()>;

    /// Fused softmax + cross-entropy over `logits` (`n × v`) with i32 `targets` (`n`; a negative
    /// target is ignored: loss 0, gradient 0). Writes per-row `losses` (f32, `n`). When `dlogits`
    /// is given, also writes `dlogits = (softmax(logits) − onehot(target)) · grad_scale`.
    /// ([`Device::cross_entropy_padded`] with rows of exactly `v` logits.)
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy(
        &self,
        logits: &Self::Buffer,
        targets: &Self::Buffer,
        losses: &mut Self::Buffer,
        dlogits: Option<&mut Self::Buffer>,
        n: usize,
        v: usize,
        grad_scale: f32,
    ) -> Result<()> {
        self.cross_entropy_padded(logits, targets, losses, dlogits, n, v, v, grad_scale)
    }

    /// [`Device::cross_entropy`] over rows of `ld ≥ v` logits (`n × ld`) of which only the first
    /// `v` are the vocabulary's: a vocabulary padded to a multiple the GEMMs run fast at. The
    /// padded columns take no part in the softmax or the loss, whatever they hold, and their
    /// gradient is written 0.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_padded(
        &self,
        logits: &Self::Buffer,
        targets: &Self::Buffer,
        losses: &mut Self::Buffer,
        dlogits: Option<&mut Self::Buffer>,
        n: usize,
        v: usize,
        ld: usize,
        grad_scale: f32,
    ) -> Result<()>;

    /// Fused AdamW on f32 master weights `param` with f32 moments `m`, `v`:
    /// `g = grad·grad_scale; m = β1 m + (1−β1) g; v = β2 v + (1−β2) g²;`
    /// `param −= lr·(m/bc1 / (√(v/bc2) + ε) + wd·param)`. When `param_copy` is given, the updated
    /// weights are also written there in its dtype (the low-precision working copy).
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        param: &mut Self::Buffer,
        grad: &Self::Buffer,
        m: &mut Self::Buffer,
        v: &mut Self::Buffer,
        step: &AdamWStep,
        param_copy: Option<&mut Self::Buffer>,
    ) -> Result<()>;

    /// Accumulates `out[slot] += Σ x²` (in f32) for the global gradient L2 norm; `out` is f32.
    fn sum_squares(&self, x: &Self::Buffer, out: &mut Self::Buffer, slot: usize) -> Result<()>;

    // ------------------------------------------------------------------ FP8 (delayed scaling)

    /// FP8 quantisation with a device-resident scale, recording the amax in the same pass:
    /// `dst = encode(src · scale[slot])` (round to nearest even, saturating to ±max; NaN stays
    /// NaN) and `amax[slot] = max(amax[slot], max |src|)` (NaN elements are ignored).
    /// `src` is a `rows × cols` f32/f16/bf16 matrix, `dst` an FP8 buffer of the same length,
    /// and `dst_t`, when given, receives the same codes transposed (`cols × rows`, same dtype as
    /// `dst`) for GEMM layouts that need the other operand order. `scale` and `amax` are f32.
    ///
    /// A backend or GPU without FP8 support returns [`DeviceError::Unsupported`].
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8(
        &self,
        src: &Self::Buffer,
        dst: &mut Self::Buffer,
        dst_t: Option<&mut Self::Buffer>,
        rows: usize,
        cols: usize,
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
        slot: usize,
    ) -> Result<()>;

    /// FP8 GEMM: `C = alpha · (op(A)·sa) · (op(B)·sb) + beta · C` with `sa = scale_inv[a_slot]`,
    /// `sb = scale_inv[b_slot]` (f32, on the device), A and B FP8 (each E4M3 or E5M2 of one
    /// family, OCP or FNUZ), C f32, bf16 or f16; FP32 accumulation. Backends may restrict the
    /// layout to what their FP8 GEMM supports (cuBLASLt on sm_90: `trans_a = false`,
    /// `trans_b = true`, i.e. both operands K-major, one matrix, leading dimensions multiples of
    /// 16, not both operands E5M2) and return [`DeviceError::Unsupported`] or
    /// [`DeviceError::InvalidArgument`] otherwise.
    #[allow(clippy::too_many_arguments)]
    fn gemm_fp8(
        &self,
        desc: &GemmDesc,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
        scale_inv: &Self::Buffer,
        a_slot: usize,
        b_slot: usize,
    ) -> Result<()>;
}

/// The fused paths: each does what a sequence of core ops does, in fewer passes where the
/// backend has its own kernel for it, with the same results (bit for bit or up to the rounding
/// each method states).
///
/// **One fallback style.** Every method has a default body composed of the core ops of
/// [`Device`] (allocating temporaries where the composition needs them), so each works on every
/// backend from day one and the conformance suite checks a backend's override against it. A
/// backend overrides what it has natively and says so in its [`Capabilities`], which callers
/// read once to plan around the native paths (the engine sizes its memory plan for native
/// flash attention or for its own composed attention, and fuses GEMM epilogues only where they
/// are native: a composed default allocates per call).
pub trait Fused: Device {
    /// Sets every element of every buffer in `dsts` to zero (one launch on a GPU backend;
    /// the default calls [`Device::fill`] per buffer).
    fn zero_many(&self, dsts: &mut [&mut Self::Buffer]) -> Result<()> {
        composed::zero_many(self, dsts)
    }

    /// [`Device::cross_entropy_padded`] with the logits' gradient written over the logits
    /// (llm.c's fused classifier): `logits` (`n × ld`, any float dtype) becomes
    /// `(softmax − onehot(target))·grad_scale` on its first `v` columns and 0 on the padding;
    /// `losses` as there. The same bits as cross_entropy_padded's `dlogits`. A backend that has
    /// it natively needs no second `n × ld` buffer; the default computes into a temporary and
    /// copies it back.
    #[allow(clippy::too_many_arguments)]
    fn cross_entropy_in_place(
        &self,
        logits: &mut Self::Buffer,
        targets: &Self::Buffer,
        losses: &mut Self::Buffer,
        n: usize,
        v: usize,
        ld: usize,
        grad_scale: f32,
    ) -> Result<()> {
        composed::cross_entropy_in_place(self, logits, targets, losses, n, v, ld, grad_scale)
    }

    /// A single (unbatched) GEMM with a fused epilogue (see [`Epilogue`]); same conventions as
    /// [`Device::gemm`]. The result equals the unfused sequence up to rounding. The default
    /// composes the core ops on a dense C (`ldc = n`, no offset): [`Device::gemm`], then
    /// [`Device::bias_add`], [`Device::add_assign`], [`Device::gelu_forward`],
    /// [`Device::gelu_backward`] (through a temporary) or [`Device::bias_backward`]; the
    /// bias gradient of [`Epilogue::BiasGradA`] needs `trans_a` (A stored `k × m`).
    fn gemm_epilogue(
        &self,
        desc: &GemmDesc,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
        epilogue: Epilogue<'_, Self::Buffer>,
    ) -> Result<()> {
        composed::gemm_epilogue(self, desc, a, b, c, epilogue)
    }

    /// [`Device::layernorm_backward`] (accumulating into `dx`, `dgamma` and `dbeta`), and then
    /// `dsum[col] += Σ_rows dx[row, col]` over the `n × c` `dx` *after* the update: the values
    /// left in `dx` (its dtype's rounding), summed in f32. `dsum` (`c`, any float dtype) is the
    /// bias gradient of a linear layer whose output was added to the residual stream this
    /// LayerNorm read: with `dx` the residual-stream gradient (it holds the gradient coming down
    /// the stream and the LayerNorm's input gradient is added), the result is exactly what
    /// [`Device::bias_backward`]`(dx, dsum, n, c)` would compute after the call, without
    /// reading `dx` again.
    ///
    /// `dx`, `dgamma` and `dbeta` are bit-identical to `layernorm_backward`'s. `dsum` is
    /// deterministic (a summation order fixed by the shape), but backends may add the rows in
    /// a different order than `bias_backward`, so it can differ from that op in the last bits.
    /// The default composes the two ops.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward_colsum(
        &self,
        dout: &Self::Buffer,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        mean: &Self::Buffer,
        rstd: &Self::Buffer,
        dx: &mut Self::Buffer,
        dgamma: &mut Self::Buffer,
        dbeta: &mut Self::Buffer,
        dsum: &mut Self::Buffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        composed::layernorm_backward_colsum(
            self, dout, x, gamma, mean, rstd, dx, dgamma, dbeta, dsum, n, c,
        )
    }

    /// Fused causal self-attention straight from the QKV projection: `qkv` is
    /// `b × t × 3 × nh × hs` (the c_attn output layout), `out` (`b × t × nh·hs`, heads merged)
    /// receives `softmax_causal(scale · q·kᵀ) · v`, and `lse` (f32, `b × nh × t`) the
    /// log-sum-exp of each query row's scaled scores (over keys j ≤ i), for the backward pass.
    /// A native path writes no `t × t` matrix to memory ([`Capabilities::flash_attention`]);
    /// the default composes the unfused ops (split heads, batched GEMMs, causal softmax, merge
    /// heads) through temporaries and computes `lse` on the host from the scores: correct on
    /// every backend, for checking, not for speed (it cannot be recorded in a graph).
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_forward(
        &self,
        qkv: &Self::Buffer,
        out: &mut Self::Buffer,
        lse: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        composed::flash_attention_forward(self, qkv, out, lse, b, t, nh, hs, scale)
    }

    /// Backward of [`Fused::flash_attention_forward`]: from `dout` (`b × t × nh·hs`) and the
    /// forward pass's `qkv`, `out` and `lse`, overwrites `dqkv` (`b × t × 3 × nh × hs`).
    /// Deterministic (no floating-point atomics). The default recomputes the probabilities
    /// from `qkv` and composes the unfused backward (batched GEMMs, causal softmax backward,
    /// head permutations) through temporaries.
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_backward(
        &self,
        qkv: &Self::Buffer,
        out: &Self::Buffer,
        dout: &Self::Buffer,
        lse: &Self::Buffer,
        dqkv: &mut Self::Buffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        composed::flash_attention_backward(self, qkv, out, dout, lse, dqkv, b, t, nh, hs, scale)
    }

    /// `out[slot] += Σ_i Σ x_i²` over several tensors (f32 result, fixed summation order).
    /// Backends may fuse the tensors into one pass; the default calls [`Device::sum_squares`]
    /// per tensor.
    fn sum_squares_many(
        &self,
        xs: &[&Self::Buffer],
        out: &mut Self::Buffer,
        slot: usize,
    ) -> Result<()> {
        composed::sum_squares_many(self, xs, out, slot)
    }

    /// AdamW on many tensors reading its per-step values from `scalars` (f32, laid out as
    /// [`ADAMW_SCALARS`] says: sum of squares of the gradients, lr, bias corrections), with the
    /// gradient factor derived from the sum of squares by [`clip_grad_scale`]. On a GPU nothing
    /// travels through the host, so the step needs no host synchronisation and can be recorded
    /// once and replayed. The default reads `scalars` back and calls [`Device::adamw`] per
    /// tensor.
    fn adamw_clipped(
        &self,
        tensors: &mut [AdamWTensor<'_, Self::Buffer>],
        step: &AdamWClipStep,
        scalars: &Self::Buffer,
    ) -> Result<()> {
        composed::adamw_clipped(self, tensors, step, scalars)
    }

    /// [`Fused::adamw_clipped`], then the FP8 codes of some of the updated weights: for each
    /// `out`, exactly [`Fused::quantize_fp8_many`] of the job with `src` the working copy of
    /// tensor `out.tensor` (its `param` when it has none) and `out`'s `dst`, `dst_t`, `rows`,
    /// `cols` and `slot` (codes bit for bit, `amax[slot] = max(amax[slot], max |src|)`).
    /// Delayed scaling quantises the weights of step k + 1 with the scale set after step k, so
    /// an FP8 model can take its weight codes from the optimizer once its scaling update has
    /// run, instead of quantising the copies at the start of the next forward pass. A GPU
    /// backend writes the codes in the update's pass (the copy is not read back). The codes'
    /// operands are checked before anything runs ([`check_adamw_fp8_outs`]). The default runs
    /// the two ops one after the other.
    fn adamw_clipped_fp8(
        &self,
        tensors: &mut [AdamWTensor<'_, Self::Buffer>],
        step: &AdamWClipStep,
        scalars: &Self::Buffer,
        outs: &mut [AdamWFp8Out<'_, Self::Buffer>],
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
    ) -> Result<()> {
        composed::adamw_clipped_fp8(self, tensors, step, scalars, outs, scale, amax)
    }

    /// [`Device::quantize_fp8`] of every job, sharing `scale` and `amax` (job `j` uses entry
    /// `j.slot` of both): the results are exactly those of calling `quantize_fp8` on the jobs
    /// in order, codes and transposed codes bit for bit and every
    /// `amax[slot] = max(amax[slot], max |src|)`. Jobs may share a slot: the amax update is a
    /// max, so it does not depend on the order (or on how a backend interleaves the jobs). A
    /// GPU backend quantises the jobs in one launch (the weights of a whole model at the start
    /// of a step). Every job is checked before any is run (the errors `quantize_fp8` gives, see
    /// [`check_fp8_quant_jobs`]), so a refused call changes nothing. The default calls
    /// `quantize_fp8` per job.
    fn quantize_fp8_many(
        &self,
        jobs: &mut [Fp8QuantJob<'_, Self::Buffer>],
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
    ) -> Result<()> {
        composed::quantize_fp8_many(self, jobs, scale, amax)
    }

    /// The gradient side of an FP8 linear layer in one pass, as Transformer Engine fuses it:
    /// `g = dout` or, with `gelu_pre`, `g = gelu'(gelu_pre) ⊙ dout` rounded to `dout`'s dtype
    /// (exactly [`Device::gelu_backward`]); then `dbias[c] += Σ_rows g[r, c]` (f32, `cols`
    /// values) and [`Device::quantize_fp8`] of `g` into `dst` and `dst_t`, recording its amax.
    /// `g` itself is not written. The default runs the separate ops (with a temporary for `g`
    /// when `gelu_pre` is given); the codes equal the separate ops' bit for bit, `dbias` up to
    /// the summation order.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8_grad(
        &self,
        dout: &Self::Buffer,
        gelu_pre: Option<&Self::Buffer>,
        dst: &mut Self::Buffer,
        dst_t: Option<&mut Self::Buffer>,
        dbias: &mut Self::Buffer,
        rows: usize,
        cols: usize,
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
        slot: usize,
    ) -> Result<()> {
        composed::quantize_fp8_grad(
            self, dout, gelu_pre, dst, dst_t, dbias, rows, cols, scale, amax, slot,
        )
    }

    /// The forward side of an FP8 linear layer whose input is `gelu(pre)`: [`Device::quantize_fp8`]
    /// of `gelu(pre)` (exactly [`Device::gelu_forward`], rounded to `pre`'s dtype) without
    /// writing the activation itself. The default runs the separate ops with a temporary; the
    /// codes equal the separate ops' bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn quantize_fp8_gelu(
        &self,
        pre: &Self::Buffer,
        dst: &mut Self::Buffer,
        dst_t: Option<&mut Self::Buffer>,
        rows: usize,
        cols: usize,
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
        slot: usize,
    ) -> Result<()> {
        composed::quantize_fp8_gelu(self, pre, dst, dst_t, rows, cols, scale, amax, slot)
    }

    /// The forward side of an FP8 linear layer whose input is a LayerNorm, in one pass:
    /// [`Device::layernorm_forward`] of `x` (`n × c`, with `gamma`, `beta`, `eps`), writing `mean`
    /// and `rstd` exactly as it does, and [`Device::quantize_fp8`] of its output
    /// `out = (x − μ)·rstd·γ + β` rounded to `x`'s dtype (exactly `layernorm_forward`'s `out`)
    /// into `dst` and `dst_t` (`n` rows, `c` cols), recording
    /// `amax[slot] = max(amax[slot], max |out|)` (NaN ignored). `out` itself is not written. The
    /// default runs the separate ops with a temporary; mean, rstd, the codes and the amax equal
    /// the separate ops' bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward_fp8(
        &self,
        x: &Self::Buffer,
        gamma: &Self::Buffer,
        beta: &Self::Buffer,
        mean: &mut Self::Buffer,
        rstd: &mut Self::Buffer,
        dst: &mut Self::Buffer,
        dst_t: Option<&mut Self::Buffer>,
        n: usize,
        c: usize,
        eps: f32,
        scale: &Self::Buffer,
        amax: &mut Self::Buffer,
        slot: usize,
    ) -> Result<()> {
        composed::layernorm_forward_fp8(
            self, x, gamma, beta, mean, rstd, dst, dst_t, n, c, eps, scale, amax, slot,
        )
    }

    /// [`Device::gemm_fp8`] with a fused [`Epilogue::Bias`], [`Epilogue::BiasResidual`] or
    /// [`Epilogue::BiasGelu`] (bias, residual and `pre` in C's dtype); other epilogues are
    /// refused. The result equals `gemm_fp8` followed by the separate ops up to rounding; the
    /// default is that sequence, on a dense C.
    #[allow(clippy::too_many_arguments)]
    fn gemm_fp8_epilogue(
        &self,
        desc: &GemmDesc,
        a: &Self::Buffer,
        b: &Self::Buffer,
        c: &mut Self::Buffer,
        scale_inv: &Self::Buffer,
        a_slot: usize,
        b_slot: usize,
        epilogue: Epilogue<'_, Self::Buffer>,
    ) -> Result<()> {
        composed::gemm_fp8_epilogue(self, desc, a, b, c, scale_inv, a_slot, b_slot, epilogue)
    }

    /// FP8 delayed scaling for every operand `i < amax.len()`, on the device so a recorded step
    /// can include it: [`fp8_history_step`] on `history[i·len .. (i+1)·len]` (newest first;
    /// entries never written are 0) with `amax[i]`, `scale[i]` (the previous scale, replaced)
    /// and `fp8_max[i]`; then `scale_inv[i · inv_stride] = fp8_scale_inv(scale[i])` (the
    /// elements in between are left alone) and `amax[i] = 0`. All buffers f32; `scale_inv`
    /// holds `ops · inv_stride` elements. The default runs it on the host (downloads and
    /// uploads).
    #[allow(clippy::too_many_arguments)]
    fn fp8_scaling_update(
        &self,
        amax: &mut Self::Buffer,
        history: &mut Self::Buffer,
        scale: &mut Self::Buffer,
        scale_inv: &mut Self::Buffer,
        inv_stride: usize,
        fp8_max: &Self::Buffer,
        len: usize,
        most_recent: bool,
        margin: i32,
    ) -> Result<()> {
        composed::fp8_scaling_update(
            self,
            amax,
            history,
            scale,
            scale_inv,
            inv_stride,
            fp8_max,
            len,
            most_recent,
            margin,
        )
    }
}

/// The shape rules of the composed [`Fused::gemm_epilogue`] and [`Fused::gemm_fp8_epilogue`]:
/// one dense matrix C (`ldc = n`, no offset, `m × n` elements), and alpha = 1, beta = 0 for
/// the epilogues that need them, with `pre` and `residual` of C's length.
pub fn epilogue_shape<B: Buffer>(
    op: &'static str,
    desc: &GemmDesc,
    epilogue: &Epilogue<'_, B>,
    c_len: usize,
) -> Result<()> {
    let mn = desc.m.checked_mul(desc.n).ok_or(DeviceError::Shape {
        op,
        detail: "m × n overflows".into(),
    })?;
    if desc.batch != 1 || desc.ldc != desc.n || desc.c_offset != 0 || c_len != mn {
        return Err(DeviceError::InvalidArgument(format!(
            "{op}: an epilogue needs one dense C of m × n = {mn} elements (batch 1, ldc = n, no offset)"
        )));
    }
    let exact = |what: &str, len: usize| -> Result<()> {
        if desc.alpha != 1.0 || desc.beta != 0.0 {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: the {what} epilogue needs alpha = 1 and beta = 0"
            )));
        }
        if len != mn {
            return Err(DeviceError::Shape {
                op,
                detail: format!("the {what} epilogue's operand has {len} elements, expected {mn}"),
            });
        }
        Ok(())
    };
    match epilogue {
        Epilogue::BiasResidual { residual, .. } => exact("bias + residual", residual.len()),
        Epilogue::BiasGelu { pre, .. } => exact("bias + GELU", pre.len()),
        Epilogue::DGelu { pre } => exact("GELU backward", pre.len()),
        Epilogue::Bias(_) | Epilogue::BiasGradA { .. } => Ok(()),
    }
}

/// The rules of a native (cuBLASLt / hipBLASLt) [`Fused::gemm_epilogue`] for A of the 16-bit
/// dtype `a.dtype()`, checked the same way by both backends before they map the epilogue onto
/// their library: B in A's dtype; C in A's dtype, or f32 for Bias and BiasGradA; the shape
/// ([`GemmDesc::validate`]); batch 1; alpha 1 and beta 0 for bias + residual, bias + GELU and
/// GELU backward; a bias of `n` values in f32 or A's dtype; the residual in C's dtype and
/// length; the pre-activation in A's dtype and C's length, with `ldc` and C's offset multiples of
/// 8 (16-byte aligned rows); the bias gradient `m` f32 values with `trans_a`.
pub fn validate_lt_epilogue<B: Buffer>(
    op: &'static str,
    desc: &GemmDesc,
    a: &B,
    b: &B,
    c: &B,
    epilogue: &Epilogue<'_, B>,
) -> Result<()> {
    let dt = a.dtype();
    check_dtype(op, b, dt)?;
    let f32_out_ok = matches!(epilogue, Epilogue::Bias(_) | Epilogue::BiasGradA { .. });
    if c.dtype() != dt && !(f32_out_ok && c.dtype() == DType::F32) {
        return Err(DeviceError::DTypeMismatch {
            op,
            expected: dt,
            got: c.dtype(),
        });
    }
    desc.validate(a.len(), b.len(), c.len())?;
    if desc.batch != 1 {
        return Err(DeviceError::InvalidArgument(format!(
            "{op}: batched GEMMs have no epilogue (batch {})",
            desc.batch
        )));
    }
    let fused_only = |what: &str| -> Result<()> {
        if desc.alpha != 1.0 || desc.beta != 0.0 {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: the {what} epilogue needs alpha 1 and beta 0"
            )));
        }
        Ok(())
    };
    let aux = |pre: &B| -> Result<()> {
        check_dtype(op, pre, dt)?;
        check_len(op, "pre", pre, c.len())?;
        if !(desc.ldc.is_multiple_of(8) && desc.c_offset.is_multiple_of(8)) {
            return Err(DeviceError::InvalidArgument(format!(
                "{op}: ldc {} and the C offset {} must be multiples of 8 for a GELU epilogue",
                desc.ldc, desc.c_offset
            )));
        }
        Ok(())
    };
    let check_bias = |bias: &B| -> Result<()> {
        check_len(op, "bias", bias, desc.n)?;
        if bias.dtype() != DType::F32 && bias.dtype() != dt {
            return Err(DeviceError::DTypeMismatch {
                op,
                expected: dt,
                got: bias.dtype(),
            });
        }
        Ok(())
    };
    match epilogue {
        Epilogue::BiasResidual { bias, residual } => {
            fused_only("bias + residual")?;
            check_bias(bias)?;
            check_dtype(op, *residual, c.dtype())?;
            check_len(op, "residual", *residual, c.len())
        }
        Epilogue::Bias(bias) => check_bias(bias),
        Epilogue::BiasGelu { bias, pre } => {
            fused_only("bias + GELU")?;
            check_bias(bias)?;
            aux(pre)
        }
        Epilogue::DGelu { pre } => {
            fused_only("GELU backward")?;
            aux(pre)
        }
        Epilogue::BiasGradA { dbias } => {
            check_dtype(op, &**dbias, DType::F32)?;
            check_len(op, "dbias", &**dbias, desc.m)?;
            if !desc.trans_a {
                return Err(DeviceError::InvalidArgument(format!(
                    "{op}: the bias-gradient epilogue needs trans_a (A stored k × m)"
                )));
            }
            Ok(())
        }
    }
}

/// The error of the graph methods on a backend that cannot record.
fn no_graphs<D: Device>(dev: &D) -> DeviceError {
    DeviceError::InvalidArgument(format!(
        "the {} backend cannot record graphs",
        dev.info().backend
    ))
}

/// [`Device::time_ms`] on the host clock between synchronisations (its default; a backend whose
/// device events are missing at run time falls back to it).
pub fn time_ms_host_clock<D: Device, E: From<DeviceError>>(
    dev: &D,
    work: impl FnOnce() -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    dev.synchronize()?;
    let start = std::time::Instant::now();
    work()?;
    dev.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// Typed helpers on top of the byte-level copies.
pub trait DeviceExt: Device {
    /// Allocates a buffer holding `data`.
    fn upload_new<T: HostType>(&self, data: &[T]) -> Result<Self::Buffer> {
        let mut buf = self.alloc(T::DTYPE, data.len())?;
        self.upload(data, &mut buf, 0)?;
        Ok(buf)
    }

    fn upload<T: HostType>(&self, src: &[T], dst: &mut Self::Buffer, offset: usize) -> Result<()> {
        check_host_dtype::<T>(dst.dtype(), "upload")?;
        check_range("upload", offset, src.len(), dst.len())?;
        self.upload_bytes(T::as_bytes(src), dst, offset)
    }

    /// Reads the whole buffer back as `T` (which must match its dtype).
    fn download<T: HostType>(&self, src: &Self::Buffer) -> Result<Vec<T>> {
        self.download_range(src, 0, src.len())
    }

    fn download_range<T: HostType>(
        &self,
        src: &Self::Buffer,
        offset: usize,
        len: usize,
    ) -> Result<Vec<T>> {
        check_host_dtype::<T>(src.dtype(), "download")?;
        check_range("download", offset, len, src.len())?;
        let bytes = self.download_bytes(src, offset, len)?;
        Ok(T::from_bytes(&bytes))
    }

    /// Runs `f` inside a profiler range named `name` ([`Device::range_push`]); the range is
    /// closed whatever `f` returns.
    fn in_range<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        self.range_push(name);
        let r = f();
        self.range_pop();
        r
    }

    /// Reads any float buffer back as f32 (converting on the host).
    fn download_f32(&self, src: &Self::Buffer) -> Result<Vec<f32>> {
        let bytes = self.download_bytes(src, 0, src.len())?;
        src.dtype().bytes_to_f32(&bytes)
    }
}

impl<D: Device> DeviceExt for D {}

fn check_host_dtype<T: HostType>(buf: DType, op: &'static str) -> Result<()> {
    if T::DTYPE == buf || (T::DTYPE == DType::U8 && buf.is_fp8()) {
        Ok(())
    } else {
        Err(DeviceError::DTypeMismatch {
            op,
            expected: buf,
            got: T::DTYPE,
        })
    }
}

/// Checks the buffers of [`Fused::fp8_scaling_update`] (all f32; `history` holds `len` entries
/// per operand, `scale_inv` `inv_stride` ≥ 1, the others one) and returns the number of
/// operands.
pub fn check_fp8_scaling_args<B: Buffer>(
    amax: &B,
    history: &B,
    scale: &B,
    scale_inv: &B,
    inv_stride: usize,
    fp8_max: &B,
    len: usize,
) -> Result<usize> {
    const OP: &str = "fp8_scaling_update";
    let ops = amax.len();
    check_dtype(OP, amax, DType::F32)?;
    if inv_stride == 0 {
        return Err(DeviceError::InvalidArgument(format!(
            "{OP}: inv_stride must be at least 1"
        )));
    }
    let inv_len = ops.checked_mul(inv_stride).ok_or_else(|| {
        DeviceError::InvalidArgument(format!(
            "{OP}: {ops} operands × inv_stride {inv_stride} overflow"
        ))
    })?;
    for (b, what, n) in [
        (history, "history", ops * len),
        (scale, "scale", ops),
        (scale_inv, "scale_inv", inv_len),
        (fp8_max, "fp8_max", ops),
    ] {
        check_dtype(OP, b, DType::F32)?;
        check_len(OP, what, b, n)?;
    }
    Ok(ops)
}

/// Checks the jobs of [`Fused::quantize_fp8_many`] as [`Device::quantize_fp8`] checks its
/// operands: `src` f32, f16 or bf16 with `rows · cols` elements, `dst` an FP8 buffer of the same
/// length, `dst_t` (if any) of `dst`'s dtype and length, `scale` and `amax` f32 holding every
/// job's `slot`. Several jobs may name the same slot.
pub fn check_fp8_quant_jobs<B: Buffer>(
    op: &'static str,
    jobs: &[Fp8QuantJob<'_, B>],
    scale: &B,
    amax: &B,
) -> Result<()> {
    check_dtype(op, scale, DType::F32)?;
    check_dtype(op, amax, DType::F32)?;
    for (i, j) in jobs.iter().enumerate() {
        check_float(op, j.src)?;
        if !j.dst.dtype().is_fp8() {
            return Err(DeviceError::Unsupported {
                op: op.to_string(),
                dtype: j.dst.dtype(),
            });
        }
        let n = j
            .rows
            .checked_mul(j.cols)
            .ok_or_else(|| DeviceError::Shape {
                op,
                detail: format!("job {i}: {} × {} overflows", j.rows, j.cols),
            })?;
        check_len(op, &format!("job {i} src"), j.src, n)?;
        check_len(op, &format!("job {i} dst"), &*j.dst, n)?;
        if let Some(t) = j.dst_t.as_deref() {
            check_dtype(op, t, j.dst.dtype())?;
            check_len(op, &format!("job {i} dst_t"), t, n)?;
        }
        check_range(op, j.slot, 1, scale.len())?;
        check_range(op, j.slot, 1, amax.len())?;
    }
    Ok(())
}

/// The checks of [`Fused::adamw_clipped_fp8`]'s codes: each `out` names one of `tensors`,
/// whose working copy (or f32 `param`) is a float `rows × cols` matrix, and passes
/// [`check_fp8_quant_jobs`] as the job quantising it. (The update's own operands are checked by
/// [`Fused::adamw_clipped`] before it writes anything.)
pub fn check_adamw_fp8_outs<B: Buffer>(
    op: &'static str,
    tensors: &[AdamWTensor<'_, B>],
    outs: &mut [AdamWFp8Out<'_, B>],
    scale: &B,
    amax: &B,
) -> Result<()> {
    let mut jobs = Vec::with_capacity(outs.len());
    for (i, o) in outs.iter_mut().enumerate() {
        let t = tensors.get(o.tensor).ok_or_else(|| DeviceError::Shape {
            op,
            detail: format!("output {i} names tensor {} of {}", o.tensor, tensors.len()),
        })?;
        jobs.push(o.job(t));
    }
    check_fp8_quant_jobs(op, &jobs, scale, amax)
}

/// Checks that `[offset, offset + len)` lies inside a buffer of `cap` elements.
pub fn check_range(op: &'static str, offset: usize, len: usize, cap: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= cap => Ok(()),
        _ => Err(DeviceError::Shape {
            op,
            detail: format!("range {offset}..{offset}+{len} exceeds buffer of {cap} elements"),
        }),
    }
}

/// Checks a buffer's length against what an op expects.
pub fn check_len<B: Buffer>(op: &'static str, what: &str, buf: &B, expected: usize) -> Result<()> {
    if buf.len() == expected {
        Ok(())
    } else {
        Err(DeviceError::Shape {
            op,
            detail: format!("{what} has {} elements, expected {expected}", buf.len()),
        })
    }
}

/// Checks that a buffer is at least `expected` long.
pub fn check_min_len<B: Buffer>(
    op: &'static str,
    what: &str,
    buf: &B,
    expected: usize,
) -> Result<()> {
    if buf.len() >= expected {
        Ok(())
    } else {
        Err(DeviceError::Shape {
            op,
            detail: format!(
                "{what} has {} elements, needs at least {expected}",
                buf.len()
            ),
        })
    }
}

/// Checks a buffer's dtype.
pub fn check_dtype<B: Buffer>(op: &'static str, buf: &B, expected: DType) -> Result<()> {
    if buf.dtype() == expected {
        Ok(())
    } else {
        Err(DeviceError::DTypeMismatch {
            op,
            expected,
            got: buf.dtype(),
        })
    }
}

/// Checks that a buffer holds a float type usable for activations (f32, f16, bf16).
pub fn check_float<B: Buffer>(op: &'static str, buf: &B) -> Result<()> {
    match buf.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        dtype => Err(DeviceError::Unsupported {
            op: op.to_string(),
            dtype,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::clip_grad_scale;

    #[test]
    fn clip_grad_scale_follows_clip_grad_norm() {
        // No clipping below the threshold, or with clipping off.
        assert_eq!(clip_grad_scale(0.25, 1.0, 1.0), 1.0);
        assert_eq!(clip_grad_scale(100.0, 0.0, 1.0), 1.0);
        // Norm 2 clipped to 1: max_norm / (norm + 1e-6).
        assert_eq!(clip_grad_scale(4.0, 1.0, 1.0), 1.0 / (2.0 + 1e-6));
        // Loss-scaled gradients: the norm is unscaled first, the factor carries 1/scale.
        let s = clip_grad_scale(16.0, 1.0, 2.0);
        assert_eq!(s, ((1.0f32 / (2.0 + 1e-6)) as f64 / 2.0) as f32);
        assert_eq!(clip_grad_scale(0.25, 1.0, 4.0), 0.25);
        // Non-finite norms give no clipping factor (the step then fails or is skipped).
        assert_eq!(clip_grad_scale(f32::NAN, 1.0, 1.0), 1.0);
    }
}
