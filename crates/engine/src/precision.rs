//! Training precisions: the `--precision` setting, capability gating with fallback, and FP16
//! dynamic loss scaling.
//!
//! In every precision the optimizer keeps FP32 master weights (see [`crate::optim::AdamW`]);
//! what changes is the dtype of the working copy of the weight matrices and of the activations:
//!
//! | precision | activations, weight matrices | GEMMs | gradients of the linear layers' weights |
//! |---|---|---|---|
//! | fp32 | f32 | f32 | f32 |
//! | bf16 | bf16 | bf16 in, f32 accumulate | bf16 (f32 with `weight_grad_dtype = "f32"` or several ranks) |
//! | fp16 | f16 (loss-scaled gradients) | f16 in, f32 accumulate | f32 |
//! | fp8  | bf16; the linear layers' GEMMs in FP8 (delayed scaling, see [`crate::fp8`]) | FP8 in, f32 accumulate | bf16 (as for bf16) |
//!
//! LayerNorm statistics, biases and LayerNorm parameters, the logits, the softmax/cross-entropy,
//! the losses and the other parameters' gradients stay f32 in every mode.

use crate::fp8::{DelayedScaling, Fp8Family};
use crate::{EngineError, Result};
use duet_device::{DType, Device, DeviceInfo, GemmFp8, QuantizeFp8};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Storage of the linear layers' weight gradients (`train.weight_grad_dtype`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightGradDtype {
    /// bf16 in bf16 and fp8 runs on one device, f32 otherwise (see [`Self::low_precision`]).
    #[default]
    Auto,
    F32,
}

impl WeightGradDtype {
    /// Whether the linear layers' weight gradients are stored in the activation dtype.
    ///
    /// Their GEMMs accumulate in f32 and round the result once to bf16: the values PyTorch
    /// autocast gives its optimizer (its weight-gradient GEMMs write bf16, then cast to the f32
    /// `.grad`), in half the bytes for the GEMM's write, the norm and AdamW's read. fp16 keeps
    /// f32 (loss-scaled gradients would overflow f16 where f32 does not), and so do
    /// data-parallel runs, whatever their world size (gradients are summed over ranks in f32
    /// buckets).
    pub fn low_precision(self, precision: Precision, data_parallel: bool) -> bool {
        self == Self::Auto
            && matches!(precision, Precision::Bf16 | Precision::Fp8)
            && !data_parallel
    }
}

/// The numeric precision of a training run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp32,
    Bf16,
    Fp16,
    Fp8,
}

impl Precision {
    pub const ALL: [Precision; 4] = [Self::Fp32, Self::Bf16, Self::Fp16, Self::Fp8];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
            Self::Fp8 => "fp8",
        }
    }

    /// Storage type of activations and of the working copy of the weight matrices.
    pub fn activation_dtype(self) -> DType {
        match self {
            Self::Fp32 => DType::F32,
            Self::Bf16 | Self::Fp8 => DType::BF16,
            Self::Fp16 => DType::F16,
        }
    }

    /// Whether the hardware described by `info` can run this precision natively.
    pub fn supported_by(self, info: &DeviceInfo) -> bool {
        match self {
            Self::Fp32 | Self::Fp16 => true,
            Self::Bf16 => info.supports_bf16,
            Self::Fp8 => info.supports_fp8 && info.supports_bf16,
        }
    }

    /// The next precision to try when this one is not supported.
    fn fallback(self) -> Option<Precision> {
        match self {
            Self::Fp8 => Some(Self::Bf16),
            Self::Bf16 => Some(Self::Fp16),
            Self::Fp16 => Some(Self::Fp32),
            Self::Fp32 => None,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WeightGradDtype {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "f32" | "fp32" => Ok(Self::F32),
            other => Err(EngineError::Config(format!(
                "unknown weight gradient dtype '{other}' (expected auto or f32)"
            ))),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "f32" => Ok(Self::Fp32),
            "bf16" => Ok(Self::Bf16),
            "fp16" | "f16" => Ok(Self::Fp16),
            "fp8" | "f8" => Ok(Self::Fp8),
            other => Err(EngineError::Config(format!(
                "unknown precision '{other}' (expected fp32, bf16, fp16 or fp8)"
            ))),
        }
    }
}

/// Picks the precision to run on `info` when `requested` is asked for: the request itself if the
/// hardware supports it, else the first supported fallback (fp8 → bf16 → fp16 → fp32) together
/// with a one-line warning. With `strict`, an unsupported request is an error instead.
pub fn resolve_precision(
    requested: Precision,
    info: &DeviceInfo,
    strict: bool,
) -> Result<(Precision, Option<String>)> {
    if requested.supported_by(info) {
        return Ok((requested, None));
    }
    let why = |p: Precision| match p {
        Precision::Fp8 => "FP8 (sm_89+ or gfx942+)",
        Precision::Bf16 => "BF16 (sm_80+)",
        _ => "it",
    };
    if strict {
        return Err(EngineError::Config(format!(
            "--precision {requested} was requested with --strict, but {} ({}) does not support {}",
            info.name,
            info.arch,
            why(requested)
        )));
    }
    let mut p = requested;
    while let Some(next) = p.fallback() {
        p = next;
        if p.supported_by(info) {
            break;
        }
    }
    Ok((
        p,
        Some(format!(
            "warning: {} ({}) does not support {}; falling back from --precision {requested} to {p}",
            info.name,
            info.arch,
            why(requested)
        )),
    ))
}

/// [`resolve_precision`] for a concrete device: besides what [`DeviceInfo`] claims, FP8 is
/// only chosen when the backend actually implements the FP8 ops (a 16 × 16 quantisation and
/// FP8 GEMM are tried once); a backend that answers `Unsupported` falls back like hardware
/// without FP8 does (or fails with `strict`).
pub fn resolve_precision_on<D: Device>(
    dev: &D,
    requested: Precision,
    strict: bool,
) -> Result<(Precision, Option<String>)> {
    let mut info = dev.info();
    if requested == Precision::Fp8
        && info.supports_fp8
        && let Err(why) = probe_fp8(dev, &info)?
    {
        if strict {
            return Err(EngineError::Config(format!(
                "--precision fp8 was requested with --strict, but the {} backend cannot run it: {why}",
                info.backend
            )));
        }
        info.supports_fp8 = false;
        let (p, _) = resolve_precision(requested, &info, false)?;
        return Ok((
            p,
            Some(format!(
                "warning: the {} backend cannot run FP8 ({why}); falling back from --precision fp8 to {p}",
                info.backend
            )),
        ));
    }
    resolve_precision(requested, &info, strict)
}

/// Tries the FP8 ops once: `Ok(Err(reason))` when the backend reports them unsupported.
fn probe_fp8<D: Device>(dev: &D, info: &DeviceInfo) -> Result<std::result::Result<(), String>> {
    use duet_device::{DeviceError, GemmDesc};
    let (fwd, _) = crate::fp8::Fp8Family::of_device(info).dtypes(crate::fp8::Fp8Recipe::Hybrid);
    let n = 16;
    let src = dev.alloc(DType::BF16, n * n)?;
    let mut q = dev.alloc(fwd, n * n)?;
    let mut scale = dev.alloc(DType::F32, 1)?;
    dev.fill(&mut scale, 1.0)?;
    let mut amax = dev.alloc(DType::F32, 1)?;
    let mut out = dev.alloc(DType::BF16, n * n)?;
    let r = dev
        .exec(QuantizeFp8 {
            src: &src,
            dst: &mut q,
            dst_t: None,
            rows: n,
            cols: n,
            scale: &scale,
            amax: &mut amax,
            slot: 0,
        })
        .and_then(|_| {
            dev.exec(GemmFp8 {
                desc: &GemmDesc::new(false, true, n, n, n),
                a: &q,
                b: &q,
                c: &mut out,
                scale_inv: &scale,
                a_slot: 0,
                b_slot: 0,
            })
        })
        .and_then(|_| dev.synchronize());
    match r {
        Ok(()) => Ok(Ok(())),
        Err(DeviceError::Unsupported { op, dtype }) => {
            Ok(Err(format!("{op} does not support {dtype}")))
        }
        Err(e) => Err(e.into()),
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
    /// Rows of logits the LM head and the loss handle at once (0 = automatic: all `b·t` rows
    /// where their logits take at most [`crate::model::memory::LOGITS_CHUNK_BYTES`], else the
    /// fewest equal chunks that do; see [`crate::model::memory::logits_chunk_rows`]).
    pub logits_chunk_rows: usize,
}

impl PrecisionPlan {
    pub fn new(precision: Precision) -> Self {
        Self {
            precision,
            ..Self::default()
        }
    }
}

/// FP16 loss scaling after PyTorch's `GradScaler`: a static factor, or a dynamic one that halves
/// (and skips the step) whenever a gradient is inf/NaN and doubles after `growth_interval`
/// consecutive finite steps.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    scale: f32,
    dynamic: bool,
    growth_interval: u32,
    clean_steps: u32,
    skipped_total: u64,
}

/// Initial dynamic scale (2^16).
pub const DYNAMIC_INIT_SCALE: f32 = 65536.0;
/// Consecutive finite steps before a dynamic scale doubles.
pub const GROWTH_INTERVAL: u32 = 2000;

impl LossScaler {
    /// A fixed scale (1.0 disables scaling).
    pub fn fixed(scale: f32) -> Self {
        Self {
            scale,
            dynamic: false,
            growth_interval: GROWTH_INTERVAL,
            clean_steps: 0,
            skipped_total: 0,
        }
    }

    /// The dynamic scaler: start at 2^16, backoff 0.5, growth ×2 every 2000 clean steps.
    pub fn dynamic() -> Self {
        Self::dynamic_with(DYNAMIC_INIT_SCALE, GROWTH_INTERVAL)
    }

    pub fn dynamic_with(init: f32, growth_interval: u32) -> Self {
        Self {
            scale: init,
            dynamic: true,
            growth_interval: growth_interval.max(1),
            clean_steps: 0,
            skipped_total: 0,
        }
    }

    /// The scaler for a precision and the `loss_scale` setting (0 = dynamic; fp16 only).
    pub fn for_precision(p: Precision, loss_scale: f32) -> Self {
        match p {
            Precision::Fp16 if loss_scale == 0.0 => Self::dynamic(),
            Precision::Fp16 => Self::fixed(loss_scale),
            _ if loss_scale > 0.0 => Self::fixed(loss_scale),
            _ => Self::fixed(1.0),
        }
    }

    pub fn scale(&self) -> f32 {
        self.scale
    }

    pub fn is_dynamic(&self) -> bool {
        self.dynamic
    }

    /// Steps skipped so far because of inf/NaN gradients.
    pub fn skipped_total(&self) -> u64 {
        self.skipped_total
    }

    /// Records the outcome of one step; returns whether the optimizer step must be skipped.
    /// A non-finite gradient always skips the step (applying it would destroy the weights);
    /// a dynamic scale additionally halves.
    pub fn update(&mut self, grads_finite: bool) -> bool {
        if !grads_finite {
            self.skipped_total += 1;
            self.clean_steps = 0;
            if self.dynamic {
                self.scale = (self.scale * 0.5).max(f32::MIN_POSITIVE);
            }
            return true;
        }
        if self.dynamic {
            self.clean_steps += 1;
            if self.clean_steps >= self.growth_interval {
                self.clean_steps = 0;
                let grown = self.scale * 2.0;
                if grown.is_finite() {
                    self.scale = grown;
                }
            }
        }
        false
    }
}

/// Checkpoint support: the scaler's resumable state.
impl LossScaler {
    /// (current scale, consecutive clean steps).
    pub fn checkpoint_state(&self) -> (f32, u64) {
        (self.scale, self.clean_steps as u64)
    }

    pub fn restore_state(&mut self, scale: f32, clean_steps: u64) {
        self.scale = scale;
        self.clean_steps = clean_steps.min(u32::MAX as u64) as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(bf16: bool, fp8: bool) -> DeviceInfo {
        DeviceInfo {
            backend: "test".into(),
            name: "gpu".into(),
            arch: "sm_75".into(),
            supports_bf16: bf16,
            supports_fp8: fp8,
            ..DeviceInfo::default()
        }
    }

    #[test]
    fn fallback_chain_and_strict() {
        let old = info(false, false);
        let (p, w) = resolve_precision(Precision::Fp8, &old, false).unwrap();
        assert_eq!(p, Precision::Fp16);
        assert!(
            w.unwrap()
                .contains("falling back from --precision fp8 to fp16")
        );
        let (p, w) = resolve_precision(Precision::Fp8, &info(true, false), false).unwrap();
        assert_eq!(p, Precision::Bf16);
        assert!(!w.unwrap().contains('\n'));
        assert_eq!(
            resolve_precision(Precision::Bf16, &info(true, true), true).unwrap(),
            (Precision::Bf16, None)
        );
        assert!(resolve_precision(Precision::Bf16, &old, true).is_err());
        assert_eq!(
            resolve_precision(Precision::Fp16, &old, true).unwrap().0,
            Precision::Fp16
        );
        for p in Precision::ALL {
            assert_eq!(p.as_str().parse::<Precision>().unwrap(), p);
        }
        assert!("fp4".parse::<Precision>().is_err());
    }

    #[test]
    fn fp8_probe_on_a_real_device() {
        let cpu = duet_cpu::CpuDevice::new(Some(1)).unwrap();
        assert_eq!(
            resolve_precision_on(&cpu, Precision::Fp8, true).unwrap(),
            (Precision::Fp8, None)
        );
        assert_eq!(
            resolve_precision_on(&cpu, Precision::Bf16, true).unwrap(),
            (Precision::Bf16, None)
        );
    }

    #[test]
    fn dynamic_scaler_halves_skips_and_grows() {
        let mut s = LossScaler::dynamic_with(1024.0, 3);
        assert!(!s.update(true));
        assert!(!s.update(true));
        assert_eq!(s.scale(), 1024.0);
        assert!(!s.update(true));
        assert_eq!(s.scale(), 2048.0, "doubles after 3 clean steps");
        assert!(s.update(false), "inf/NaN skips the step");
        assert_eq!(s.scale(), 1024.0);
        assert!(!s.update(true));
        assert!(!s.update(true));
        assert!(s.update(false));
        assert_eq!(
            s.scale(),
            512.0,
            "the clean-step counter restarts after an overflow"
        );
        assert_eq!(s.skipped_total(), 2);
        let mut f = LossScaler::fixed(1024.0);
        assert!(f.update(false));
        assert_eq!(f.scale(), 1024.0, "a static scale never changes");
        assert_eq!(LossScaler::dynamic().scale(), 65536.0);
        assert!(LossScaler::for_precision(Precision::Fp16, 0.0).is_dynamic());
        assert!(!LossScaler::for_precision(Precision::Fp16, 1024.0).is_dynamic());
        assert_eq!(LossScaler::for_precision(Precision::Bf16, 0.0).scale(), 1.0);
    }
}
