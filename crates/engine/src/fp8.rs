//! FP8 training with delayed scaling, modelled on Transformer Engine's `DelayedScaling` recipe.
//!
//! Every linear layer runs its three GEMMs in FP8: the forward `y = x·Wᵀ` on E4M3 copies of the
//! input and the weight, and the backward `dx = dy·W`, `dW += dyᵀ·x` with the output gradient in
//! E5M2 (recipe HYBRID) or E4M3 (recipe E4M3). Each operand (input, weight, output gradient) of
//! each linear layer has its own scale. A quantisation kernel multiplies by the *current* scale
//! while recording the tensor's amax; after every training step the amaxes are pushed into a
//! history and the scales for the next step are computed from it:
//!
//! `amax = max(history)` (or the most recent entry), `scale = fp8_max / amax / 2^margin`; an amax
//! that is zero or not finite keeps the previous scale, a scale that overflows is clamped to
//! `f32::MAX`. The GEMMs receive `scale_inv = 1/scale` for each operand, and accumulate as
//! [`Fp8FastAccum`] says (by default fast in the forward GEMMs only).
//!
//! Where things live: the scales, their inverses, the amaxes of the current step and the amax
//! histories are f32 buffers on the device (one slot per operand; the inverses `stride` apart,
//! [`Capabilities::fp8_scale_inv_stride`](duet_device::Capabilities), so the GEMM library reads them in place), updated by
//! [`duet_device::Fp8Ops::fp8_scaling_update`] with no host round trip; the host keeps a copy of the histories
//! and scales, brought up to date when asked for (checkpoints, reports).

use crate::{EngineError, Result};
use duet_device::{Buffer, DType, Device, DeviceExt, DeviceInfo, Fp8ScalingUpdate};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::{Mutex, MutexGuard};

/// Longest amax history accepted.
pub const MAX_HISTORY: usize = 1024;

/// Which FP8 format each pass uses (TE's `Format`; pure E5M2 is refused as in TE).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Recipe {
    /// E4M3 for inputs and weights in the forward pass, E5M2 for gradients in the backward pass.
    #[default]
    Hybrid,
    /// E4M3 everywhere.
    E4m3,
}

impl std::str::FromStr for Fp8Recipe {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "hybrid" => Ok(Self::Hybrid),
            "e4m3" => Ok(Self::E4m3),
            other => Err(EngineError::Config(format!(
                "unknown FP8 format '{other}' (expected hybrid or e4m3)"
            ))),
        }
    }
}

impl fmt::Display for Fp8Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Hybrid => "hybrid",
            Self::E4m3 => "e4m3",
        })
    }
}

/// How the amax that sets the next scale is taken from the history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AmaxAlgo {
    #[default]
    Max,
    MostRecent,
}

impl std::str::FromStr for AmaxAlgo {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "max" => Ok(Self::Max),
            "most_recent" | "most-recent" => Ok(Self::MostRecent),
            other => Err(EngineError::Config(format!(
                "unknown amax_compute_algo '{other}' (expected max or most_recent)"
            ))),
        }
    }
}

impl fmt::Display for AmaxAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Max => "max",
            Self::MostRecent => "most_recent",
        })
    }
}

/// Which FP8 GEMMs accumulate in the tensor cores' fast mode (cuBLASLt's `FAST_ACCUM`: the
/// products are summed without the periodic promotion to full FP32 accumulators; faster, less
/// exact over long sums). `Forward` is what Transformer Engine's and torchao's default recipes
/// do: fast forward GEMMs, exact accumulation for the input and weight gradients, whose sums
/// run over many more terms (the weight gradient over every token). Backends without the mode
/// (CPU, HIP) accumulate exactly whatever the setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fp8FastAccum {
    None,
    #[default]
    Forward,
    All,
}

impl Fp8FastAccum {
    /// Whether the forward GEMMs (E4M3 · E4M3 in the HYBRID recipe) accumulate fast.
    pub fn forward(self) -> bool {
        self != Self::None
    }

    /// Whether the input- and weight-gradient GEMMs accumulate fast.
    pub fn backward(self) -> bool {
        self == Self::All
    }
}

impl std::str::FromStr for Fp8FastAccum {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "forward" => Ok(Self::Forward),
            "all" => Ok(Self::All),
            other => Err(EngineError::Config(format!(
                "unknown fp8 fast_accum '{other}' (expected none, forward or all)"
            ))),
        }
    }
}

impl fmt::Display for Fp8FastAccum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Forward => "forward",
            Self::All => "all",
        })
    }
}

/// The delayed-scaling settings (and the FP8 GEMMs' accumulation mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DelayedScaling {
    pub recipe: Fp8Recipe,
    pub amax_history_len: usize,
    pub algo: AmaxAlgo,
    pub margin: i32,
    pub fast_accum: Fp8FastAccum,
}

/// `hybrid, amax history 16 (max), margin 0, fast accumulation: forward`.
impl fmt::Display for DelayedScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, amax history {} ({}), margin {}, fast accumulation: {}",
            self.recipe, self.amax_history_len, self.algo, self.margin, self.fast_accum
        )
    }
}

impl Default for DelayedScaling {
    fn default() -> Self {
        Self {
            recipe: Fp8Recipe::Hybrid,
            amax_history_len: 16,
            algo: AmaxAlgo::Max,
            margin: 0,
            fast_accum: Fp8FastAccum::default(),
        }
    }
}

impl DelayedScaling {
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_HISTORY).contains(&self.amax_history_len) {
            return Err(EngineError::Config(format!(
                "fp8 amax_history_len must be in 1..={MAX_HISTORY}, got {}",
                self.amax_history_len
            )));
        }
        if self.margin.abs() > 64 {
            return Err(EngineError::Config(format!(
                "fp8 margin must be in -64..=64, got {}",
                self.margin
            )));
        }
        Ok(())
    }
}

/// The FP8 encodings of one vendor family: OCP (NVIDIA sm_89+, AMD gfx950) or FNUZ (AMD gfx942).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Family {
    Ocp,
    Fnuz,
}

impl Fp8Family {
    /// The family a device's FP8 hardware uses: FNUZ on gfx942 (MI300), OCP everywhere else
    /// (the CPU emulates both; it defaults to OCP).
    pub fn of_device(info: &DeviceInfo) -> Self {
        if info.fp8_is_fnuz() {
            Self::Fnuz
        } else {
            Self::Ocp
        }
    }

    /// "ocp" or "fnuz" (as traces record it).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ocp => "ocp",
            Self::Fnuz => "fnuz",
        }
    }

    /// The family named by [`Fp8Family::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ocp" => Some(Self::Ocp),
            "fnuz" => Some(Self::Fnuz),
            _ => None,
        }
    }

    /// (forward dtype, backward dtype) for a recipe.
    pub fn dtypes(self, recipe: Fp8Recipe) -> (DType, DType) {
        let (e4m3, e5m2) = match self {
            Self::Ocp => (DType::F8E4M3, DType::F8E5M2),
            Self::Fnuz => (DType::F8E4M3Fnuz, DType::F8E5M2Fnuz),
        };
        match recipe {
            Fp8Recipe::Hybrid => (e4m3, e5m2),
            Fp8Recipe::E4m3 => (e4m3, e4m3),
        }
    }
}

/// Which FP8 encodings a run uses (`fp8_family` in the config, `--fp8-family`): the device's
/// own (the default: FNUZ on gfx942, OCP elsewhere, OCP on the CPU), or one named. The CPU
/// emulates both, so `fnuz` there is the reference for gfx942's FP8; a GPU runs only its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8FamilyChoice {
    #[default]
    Device,
    Ocp,
    Fnuz,
}

impl Fp8FamilyChoice {
    /// The family named, `None` for the device's.
    pub fn named(self) -> Option<Fp8Family> {
        match self {
            Self::Device => None,
            Self::Ocp => Some(Fp8Family::Ocp),
            Self::Fnuz => Some(Fp8Family::Fnuz),
        }
    }

    /// The family a run on `info` uses: the one named where the device computes it (the CPU
    /// emulates both; a GPU only its own hardware's), else an error naming both.
    pub fn resolve(self, info: &DeviceInfo) -> Result<Fp8Family> {
        let own = Fp8Family::of_device(info);
        match self.named() {
            None => Ok(own),
            Some(f) if f == own || info.backend == "cpu" => Ok(f),
            Some(f) => Err(EngineError::Config(format!(
                "fp8_family {}: the {} device ({}) computes FP8 in {} encodings only (the CPU \
                 emulates both)",
                f.as_str(),
                info.backend,
                info.name,
                own.as_str()
            ))),
        }
    }
}

impl std::str::FromStr for Fp8FamilyChoice {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "device" => Ok(Self::Device),
            "ocp" => Ok(Self::Ocp),
            "fnuz" => Ok(Self::Fnuz),
            other => Err(EngineError::Config(format!(
                "unknown FP8 family '{other}' (expected device, ocp or fnuz)"
            ))),
        }
    }
}

/// The new scale from an amax: `fp8_max / amax / 2^margin`; `prev` when the amax is zero,
/// negative or not finite; clamped to `f32::MAX` when it overflows. Computed in f64 and rounded
/// once, so it does not depend on the compiler's float contraction.
pub fn compute_scale(amax: f32, prev: f32, fp8_max: f32, margin: i32) -> f32 {
    duet_device::fp8_delayed_scale(amax, prev, fp8_max, margin)
}

/// One operand's amax history (most recent first) and current scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperandScaling {
    pub fp8_max: f32,
    pub scale: f32,
    /// Most recent first; at most `amax_history_len` entries. (JSON has no inf/NaN: they are
    /// written as `null` and read back as NaN, which the update treats the same way — the
    /// previous scale is kept while such an entry decides the amax.)
    #[serde(deserialize_with = "nulls_as_nan")]
    pub history: Vec<f32>,
}

fn nulls_as_nan<'de, De: serde::Deserializer<'de>>(
    d: De,
) -> std::result::Result<Vec<f32>, De::Error> {
    let v: Vec<Option<f32>> = Deserialize::deserialize(d)?;
    Ok(v.into_iter().map(|x| x.unwrap_or(f32::NAN)).collect())
}

impl OperandScaling {
    pub fn new(fp8_max: f32) -> Self {
        Self {
            fp8_max,
            scale: 1.0,
            history: Vec::new(),
        }
    }

    /// Pushes this step's amax and recomputes the scale (TE's delayed-scaling update).
    pub fn update(&mut self, amax: f32, cfg: &DelayedScaling) {
        self.history.insert(0, amax);
        self.history.truncate(cfg.amax_history_len);
        // The rule every backend's `Fp8Ops::fp8_scaling_update` applies (a NaN entry poisons
        // the max like torch.max does, and the previous scale stays).
        self.scale = duet_device::fp8_history_scale(
            &self.history,
            amax,
            self.scale,
            self.fp8_max,
            cfg.algo == AmaxAlgo::MostRecent,
            cfg.margin,
        );
    }
}

/// The operands of one linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Input,
    Weight,
    GradOutput,
}

impl Operand {
    pub const ALL: [Operand; 3] = [Self::Input, Self::Weight, Self::GradOutput];
    pub fn name(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Weight => "weight",
            Self::GradOutput => "grad_output",
        }
    }
}

/// One operand's state for reports and the metrics log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperandReport {
    /// e.g. `h.0.attn.c_attn.input`.
    pub name: String,
    pub dtype: String,
    pub scale: f32,
    /// The first (most recent) entries of the amax history.
    pub amax_history: Vec<f32>,
}

/// Per-operand FP8 metadata of a model: device-side scales/amaxes and host-side histories.
pub struct Fp8State<D: Device> {
    pub cfg: DelayedScaling,
    pub fwd: DType,
    pub bwd: DType,
    names: Vec<String>,
    dtypes: Vec<DType>,
    /// The host's view of the scales and histories, brought up to date from the device when
    /// asked for (checkpoints, reports); the per-step update runs on the device.
    host: Mutex<HostView>,
    /// f32 per operand: the scale the quantisation kernels multiply by.
    pub scale: D::Buffer,
    /// f32, operand `i`'s 1/scale (given to the FP8 GEMMs) at `i · inv_stride` ([`Self::inv`]).
    pub scale_inv: D::Buffer,
    /// [`Capabilities::fp8_scale_inv_stride`](duet_device::Capabilities) of the device.
    pub inv_stride: usize,
    /// f32 per operand: the amax recorded since the last update.
    pub amax: D::Buffer,
    /// f32 per operand × `cfg.amax_history_len`: the amax histories, newest first (entries not
    /// yet written are 0).
    history: D::Buffer,
    /// f32 per operand: the format's largest finite value.
    fp8_max: D::Buffer,
}

/// See [`Fp8State::host`].
struct HostView {
    ops: Vec<OperandScaling>,
    /// Device updates since `ops` was last read back (each lengthens a short history by one).
    unsynced: usize,
}

impl<D: Device> Fp8State<D> {
    /// The lengths (f32 elements) of the metadata buffers [`Fp8State::new`] takes for
    /// `linears` linear layers: scale, scale_inv (`inv_stride` per operand, see
    /// [`duet_device::Capabilities::fp8_scale_inv_stride`]), amax, amax history and fp8_max.
    /// The model's buffer table plans and allocates them.
    pub fn buffer_lens(cfg: &DelayedScaling, linears: usize, inv_stride: usize) -> [usize; 5] {
        let n = linears * Operand::ALL.len();
        [n, n * inv_stride.max(1), n, n * cfg.amax_history_len, n]
    }

    /// [`Fp8State::new`] in buffers of its own (a model uses its buffer table's instead).
    pub fn allocate(
        dev: &D,
        cfg: DelayedScaling,
        family: Fp8Family,
        linears: &[String],
    ) -> Result<Self> {
        let stride = dev.capabilities().fp8_scale_inv_stride;
        let lens = Self::buffer_lens(&cfg, linears.len(), stride);
        let [a, b, c, d, e] = lens.map(|len| dev.alloc(DType::F32, len));
        Self::new(dev, cfg, family, linears, [a?, b?, c?, d?, e?])
    }

    /// Metadata for `names.len()` linear layers (3 operands each, slot `3·i + operand`), in
    /// `bufs`: f32 buffers of the [`Fp8State::buffer_lens`] (scale, scale_inv, amax, amax
    /// history, fp8_max; the model's buffer table allocates them), initialised here.
    pub fn new(
        dev: &D,
        cfg: DelayedScaling,
        family: Fp8Family,
        linears: &[String],
        bufs: [D::Buffer; 5],
    ) -> Result<Self> {
        cfg.validate()?;
        let (fwd, bwd) = family.dtypes(cfg.recipe);
        let mut names = Vec::new();
        let mut dtypes = Vec::new();
        let mut ops = Vec::new();
        for l in linears {
            for o in Operand::ALL {
                let d = if o == Operand::GradOutput { bwd } else { fwd };
                names.push(format!("{l}.{}", o.name()));
                dtypes.push(d);
                ops.push(OperandScaling::new(d.max_finite().expect("fp8 dtype")));
            }
        }
        let inv_stride = dev.capabilities().fp8_scale_inv_stride.max(1);
        let lens = Self::buffer_lens(&cfg, linears.len(), inv_stride);
        for (b, len) in bufs.iter().zip(lens) {
            if b.dtype() != DType::F32 || b.len() != len {
                return Err(EngineError::Config(format!(
                    "fp8 scaling metadata: a {} buffer of {} elements where f32 × {len} is planned",
                    b.dtype(),
                    b.len()
                )));
            }
        }
        let [mut scale, mut scale_inv, mut amax, mut history, mut fp8_max] = bufs;
        dev.fill(&mut scale, 1.0)?;
        dev.fill(&mut scale_inv, 1.0)?;
        dev.fill(&mut amax, 0.0)?;
        dev.fill(&mut history, 0.0)?;
        let maxes: Vec<f32> = ops.iter().map(|o| o.fp8_max).collect();
        dev.upload(&maxes, &mut fp8_max, 0)?;
        Ok(Self {
            cfg,
            fwd,
            bwd,
            names,
            dtypes,
            host: Mutex::new(HostView { ops, unsynced: 0 }),
            scale,
            scale_inv,
            inv_stride,
            amax,
            history,
            fp8_max,
        })
    }

    /// Slot of `operand` of linear layer `i`.
    pub fn slot(i: usize, operand: Operand) -> usize {
        3 * i + operand as usize
    }

    /// The index of slot `slot`'s inverse scale in [`Self::scale_inv`] (what the FP8 GEMMs take
    /// as their scale slots).
    pub fn inv(&self, slot: usize) -> usize {
        slot * self.inv_stride
    }

    /// The host's view, brought up to date with the device's histories and scales.
    fn synced(&self, dev: &D) -> Result<MutexGuard<'_, HostView>> {
        let mut host = self.host.lock().unwrap_or_else(|e| e.into_inner());
        if host.unsynced > 0 {
            let len = self.cfg.amax_history_len;
            let hist: Vec<f32> = dev.download(&self.history)?;
            let scale: Vec<f32> = dev.download(&self.scale)?;
            let steps = host.unsynced;
            for (i, op) in host.ops.iter_mut().enumerate() {
                let kept = (op.history.len() + steps).min(len);
                op.history = hist[i * len..i * len + kept].to_vec();
                op.scale = scale[i];
            }
            host.unsynced = 0;
        }
        Ok(host)
    }

    /// Every operand's scaling (read back from the device).
    pub fn operands(&self, dev: &D) -> Result<Vec<OperandScaling>> {
        Ok(self.synced(dev)?.ops.clone())
    }

    /// The delayed-scaling update after a step, on the device ([`duet_device::Fp8Ops::fp8_scaling_update`]):
    /// every operand's amax goes into its history, the scales follow, the amaxes restart at 0.
    /// Queues device work only (a recorded step can include it).
    pub fn update(&mut self, dev: &D) -> Result<()> {
        dev.exec(Fp8ScalingUpdate {
            amax: &mut self.amax,
            history: &mut self.history,
            scale: &mut self.scale,
            scale_inv: &mut self.scale_inv,
            inv_stride: self.inv_stride,
            fp8_max: &self.fp8_max,
            len: self.cfg.amax_history_len,
            most_recent: self.cfg.algo == AmaxAlgo::MostRecent,
            margin: self.cfg.margin,
        })?;
        self.host_mut().unsynced += 1;
        Ok(())
    }

    /// A recorded step that contains [`Fp8State::update`] was replayed: the device ran one more
    /// update than the host queued, so the host view is read back before its next use.
    pub fn note_replayed_update(&mut self) {
        self.host_mut().unsynced += 1;
    }

    /// Device updates not read back yet (see [`Fp8State::set_pending_updates`]).
    pub fn pending_updates(&mut self) -> usize {
        self.host_mut().unsynced
    }

    /// Puts back the count of [`Fp8State::pending_updates`], for a caller whose queued updates
    /// never ran (a recording that failed).
    pub fn set_pending_updates(&mut self, n: usize) {
        self.host_mut().unsynced = n;
    }

    /// The host view, through the exclusive borrow (no lock taken).
    fn host_mut(&mut self) -> &mut HostView {
        self.host.get_mut().unwrap_or_else(|e| e.into_inner())
    }

    /// Every operand's scale and full amax history (for checkpoints).
    pub fn export(&self, dev: &D) -> Result<Vec<OperandScaling>> {
        self.operands(dev)
    }

    /// Restores what [`Fp8State::export`] returned (the same model shape and recipe) and writes
    /// the scales and histories to the device; the amaxes recorded so far are cleared.
    pub fn import(&mut self, dev: &D, ops: &[OperandScaling]) -> Result<()> {
        let len = self.cfg.amax_history_len;
        let host = self.host_mut();
        if ops.len() != host.ops.len() {
            return Err(EngineError::Config(format!(
                "FP8 state has {} operands, the model has {}",
                ops.len(),
                host.ops.len()
            )));
        }
        for (dst, src) in host.ops.iter().zip(ops) {
            if src.fp8_max != dst.fp8_max {
                return Err(EngineError::Config(format!(
                    "FP8 state was saved for a format with max {}, the model uses {}",
                    src.fp8_max, dst.fp8_max
                )));
            }
        }
        let mut hist = vec![0.0f32; host.ops.len() * len];
        for (i, (dst, src)) in host.ops.iter_mut().zip(ops).enumerate() {
            dst.scale = src.scale;
            dst.history = src.history.iter().take(len).copied().collect();
            hist[i * len..i * len + dst.history.len()].copy_from_slice(&dst.history);
        }
        host.unsynced = 0;
        let scale: Vec<f32> = host.ops.iter().map(|o| o.scale).collect();
        let mut inv = vec![1.0f32; scale.len() * self.inv_stride];
        for (i, &s) in scale.iter().enumerate() {
            inv[self.inv(i)] = duet_device::fp8_scale_inv(s);
        }
        dev.upload(&scale, &mut self.scale, 0)?;
        dev.upload(&inv, &mut self.scale_inv, 0)?;
        dev.upload(&hist, &mut self.history, 0)?;
        dev.fill(&mut self.amax, 0.0)?;
        Ok(())
    }

    /// Scale and the first `entries` amax-history entries of every operand.
    pub fn report(&self, dev: &D, entries: usize) -> Result<Vec<OperandReport>> {
        let host = self.synced(dev)?;
        Ok(host
            .ops
            .iter()
            .zip(&self.names)
            .zip(&self.dtypes)
            .map(|((o, n), d)| OperandReport {
                name: n.clone(),
                dtype: d.to_string(),
                scale: o.scale,
                amax_history: o.history.iter().take(entries).copied().collect(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duet_device::Runtime;

    fn cfg(len: usize, algo: AmaxAlgo, margin: i32) -> DelayedScaling {
        DelayedScaling {
            recipe: Fp8Recipe::Hybrid,
            amax_history_len: len,
            algo,
            margin,
            fast_accum: Fp8FastAccum::default(),
        }
    }

    #[test]
    fn fast_accum_parses_and_defaults_to_the_forward_gemms() {
        assert_eq!(Fp8FastAccum::default(), Fp8FastAccum::Forward);
        for (s, v, fwd, bwd) in [
            ("none", Fp8FastAccum::None, false, false),
            ("Forward", Fp8FastAccum::Forward, true, false),
            (" all ", Fp8FastAccum::All, true, true),
        ] {
            let p: Fp8FastAccum = s.parse().unwrap();
            assert_eq!(p, v);
            assert_eq!((p.forward(), p.backward()), (fwd, bwd));
            assert_eq!(p.to_string().parse::<Fp8FastAccum>().unwrap(), p);
        }
        assert_eq!(
            DelayedScaling::default().to_string(),
            "hybrid, amax history 16 (max), margin 0, fast accumulation: forward"
        );
        let e = "fast".parse::<Fp8FastAccum>().unwrap_err().to_string();
        assert!(e.contains("none, forward or all"), "{e}");
    }

    /// Feeds `amaxes` one step at a time; returns (scale, history) after each step.
    fn run(c: &DelayedScaling, fp8_max: f32, amaxes: &[f32]) -> Vec<(f32, Vec<f32>)> {
        let mut op = OperandScaling::new(fp8_max);
        amaxes
            .iter()
            .map(|&a| {
                op.update(a, c);
                (op.scale, op.history.clone())
            })
            .collect()
    }

    #[test]
    fn max_over_a_rolling_history() {
        let r = run(
            &cfg(3, AmaxAlgo::Max, 0),
            448.0,
            &[2.0, 4.0, 1.0, 0.5, 0.25],
        );
        let scales: Vec<f32> = r.iter().map(|x| x.0).collect();
        // 448/2; 448/max(4,2); 448/max(1,4,2); 448/max(.5,1,4); 4 has left the window: 448/1.
        assert_eq!(scales, [224.0, 112.0, 112.0, 112.0, 448.0]);
        assert_eq!(r[4].1, [0.25, 0.5, 1.0], "most recent first, length 3");
    }

    #[test]
    fn most_recent_ignores_older_entries() {
        let r = run(
            &cfg(3, AmaxAlgo::MostRecent, 0),
            448.0,
            &[2.0, 4.0, 1.0, 0.5, 0.25],
        );
        let scales: Vec<f32> = r.iter().map(|x| x.0).collect();
        assert_eq!(scales, [224.0, 112.0, 448.0, 896.0, 1792.0]);
    }

    #[test]
    fn margin_divides_by_a_power_of_two() {
        let r = run(&cfg(16, AmaxAlgo::Max, 2), 57344.0, &[7.0]);
        assert_eq!(r[0].0, (57344.0f64 / 7.0 / 4.0) as f32);
        let r = run(&cfg(16, AmaxAlgo::Max, 1), 240.0, &[3.0, 3.0]);
        assert_eq!(r[1].0, 40.0);
    }

    #[test]
    fn zero_and_non_finite_amax_keep_the_scale() {
        let c = cfg(2, AmaxAlgo::MostRecent, 0);
        let r = run(&c, 448.0, &[0.0, 2.0, 0.0, f32::INFINITY, f32::NAN, 8.0]);
        let scales: Vec<f32> = r.iter().map(|x| x.0).collect();
        // Starts at 1; zero keeps 1; 2 → 224; zero, inf and NaN keep 224; 8 → 56.
        assert_eq!(scales, [1.0, 224.0, 224.0, 224.0, 224.0, 56.0]);
        // With max, a zero entry never lowers the max: [0, 2] still gives 448/2.
        let r = run(&cfg(4, AmaxAlgo::Max, 0), 448.0, &[2.0, 0.0]);
        assert_eq!(r[1].0, 224.0);
        // A NaN in the window keeps the previous scale until it leaves the window.
        let r = run(&cfg(2, AmaxAlgo::Max, 0), 448.0, &[2.0, f32::NAN, 4.0, 4.0]);
        let scales: Vec<f32> = r.iter().map(|x| x.0).collect();
        assert_eq!(scales, [224.0, 224.0, 224.0, 112.0]);
    }

    #[test]
    fn recipe_dtypes_and_validation() {
        assert_eq!(
            Fp8Family::Ocp.dtypes(Fp8Recipe::Hybrid),
            (DType::F8E4M3, DType::F8E5M2)
        );
        assert_eq!(
            Fp8Family::Fnuz.dtypes(Fp8Recipe::E4m3),
            (DType::F8E4M3Fnuz, DType::F8E4M3Fnuz)
        );
        let gfx = DeviceInfo {
            arch: "gfx942:sramecc+:xnack-".into(),
            ..DeviceInfo::default()
        };
        assert_eq!(Fp8Family::of_device(&gfx), Fp8Family::Fnuz);
        assert!(cfg(0, AmaxAlgo::Max, 0).validate().is_err());
        assert!(cfg(1025, AmaxAlgo::Max, 0).validate().is_err());
        cfg(1024, AmaxAlgo::Max, 0).validate().unwrap();
        assert_eq!(
            "most_recent".parse::<AmaxAlgo>().unwrap(),
            AmaxAlgo::MostRecent
        );
        assert!("e5m2".parse::<Fp8Recipe>().is_err(), "pure E5M2 is refused");
    }

    /// Issue 53: `--fp8-family` picks the encodings; the CPU computes both, a GPU only its own.
    #[test]
    fn a_named_fp8_family_is_refused_where_the_device_lacks_it() {
        let info = |backend: &str, arch: &str| DeviceInfo {
            backend: backend.into(),
            name: format!("{backend} test device"),
            arch: arch.into(),
            ..DeviceInfo::default()
        };
        let (cpu, h100, mi300, mi355) = (
            info("cpu", "x86_64"),
            info("cuda", "sm_90"),
            info("hip", "gfx942:sramecc+:xnack-"),
            info("hip", "gfx950"),
        );
        let choice = |s: &str| s.parse::<Fp8FamilyChoice>().unwrap();
        assert_eq!(choice("device").resolve(&cpu).unwrap(), Fp8Family::Ocp);
        assert_eq!(choice("fnuz").resolve(&cpu).unwrap(), Fp8Family::Fnuz);
        assert_eq!(choice("ocp").resolve(&cpu).unwrap(), Fp8Family::Ocp);
        assert_eq!(choice("device").resolve(&mi300).unwrap(), Fp8Family::Fnuz);
        assert_eq!(choice("fnuz").resolve(&mi300).unwrap(), Fp8Family::Fnuz);
        assert_eq!(choice("ocp").resolve(&mi355).unwrap(), Fp8Family::Ocp);
        let e = choice("fnuz").resolve(&h100).unwrap_err().to_string();
        assert!(
            e.contains("fp8_family fnuz") && e.contains("in ocp encodings only"),
            "{e}"
        );
        let e = choice("ocp").resolve(&mi300).unwrap_err().to_string();
        assert!(e.contains("in fnuz encodings only"), "{e}");
        assert!("e4m3".parse::<Fp8FamilyChoice>().is_err());
    }

    #[test]
    fn state_survives_json_with_non_finite_amaxes() {
        let c = cfg(4, AmaxAlgo::Max, 0);
        let mut op = OperandScaling::new(448.0);
        for a in [2.0, f32::INFINITY, 1.0] {
            op.update(a, &c);
        }
        let json = serde_json::to_string(&op).unwrap();
        let back: OperandScaling = serde_json::from_str(&json).unwrap();
        assert_eq!(back.scale, op.scale);
        assert_eq!(back.history[0], 1.0);
        assert!(back.history[1].is_nan(), "inf comes back as NaN");
        // Both keep the previous scale while in the window.
        let (mut a, mut b) = (op.clone(), back);
        for x in [0.5, 0.25, 0.125, 0.1] {
            a.update(x, &c);
            b.update(x, &c);
            assert_eq!(a.scale, b.scale);
        }
    }

    #[test]
    fn scale_formula_and_edge_cases() {
        assert_eq!(compute_scale(2.0, 1.0, 448.0, 0), 224.0);
        assert_eq!(compute_scale(2.0, 1.0, 448.0, 1), 112.0);
        assert_eq!(compute_scale(2.0, 1.0, 448.0, -1), 448.0);
        assert_eq!(
            compute_scale(0.0, 3.0, 448.0, 0),
            3.0,
            "amax 0 keeps the scale"
        );
        assert_eq!(compute_scale(f32::NAN, 3.0, 448.0, 0), 3.0);
        assert_eq!(compute_scale(f32::INFINITY, 3.0, 448.0, 0), 3.0);
        assert_eq!(compute_scale(1e-45, 1.0, 57344.0, 0), f32::MAX, "clamped");
    }

    /// A replayed recorded step runs the device's scaling update without the host queueing it
    /// ([`Fp8State::update`]). With [`Fp8State::note_replayed_update`] after each replay, the
    /// host view (reports, checkpoints) follows the device step by step, as for updates the host
    /// queued; without it, it stays at the last queued update (what graphed CUDA runs had:
    /// their traces and checkpoints kept the recording step's scales).
    #[test]
    fn replayed_updates_are_read_back() {
        let dev = duet_cpu::CpuDevice::new(Some(1)).unwrap();
        let c = cfg(4, AmaxAlgo::Max, 0);
        let layers = ["l0".to_string()];
        let state = || Fp8State::allocate(&dev, c, Fp8Family::Ocp, &layers).unwrap();
        let (mut queued, mut noted, mut unnoted) = (state(), state(), state());
        // The device-side update alone, as a replayed graph runs it.
        let device_update = |st: &mut Fp8State<duet_cpu::CpuDevice>| {
            dev.exec(Fp8ScalingUpdate {
                amax: &mut st.amax,
                history: &mut st.history,
                scale: &mut st.scale,
                scale_inv: &mut st.scale_inv,
                inv_stride: st.inv_stride,
                fp8_max: &st.fp8_max,
                len: st.cfg.amax_history_len,
                most_recent: false,
                margin: 0,
            })
            .unwrap();
        };
        let amaxes = [[1.5f32, 0.25, 3e-4], [2.0, 0.3, 5e-4], [0.5, 0.2, 1e-3]];
        let mut first = None;
        for (step, a) in amaxes.iter().enumerate() {
            for st in [&mut queued, &mut noted, &mut unnoted] {
                dev.upload(a, &mut st.amax, 0).unwrap();
            }
            queued.update(&dev).unwrap();
            if step == 0 {
                // The first step (and the recording) queue the update on the host.
                noted.update(&dev).unwrap();
                unnoted.update(&dev).unwrap();
            } else {
                device_update(&mut noted);
                noted.note_replayed_update();
                device_update(&mut unnoted);
            }
            // A trace reads every step.
            let want = format!("{:?}", queued.report(&dev, 4).unwrap());
            assert_eq!(
                format!("{:?}", noted.report(&dev, 4).unwrap()),
                want,
                "step {step}"
            );
            let got = unnoted.report(&dev, 4).unwrap();
            let first = first.get_or_insert_with(|| format!("{got:?}"));
            assert_eq!(
                &format!("{got:?}"),
                first,
                "step {step}: the view without the notes"
            );
        }
        let r = queued.report(&dev, 4).unwrap();
        assert_eq!(r[0].amax_history, vec![0.5, 2.0, 1.5]);
        assert_eq!(
            format!("{:?}", noted.export(&dev).unwrap()),
            format!("{:?}", queued.export(&dev).unwrap())
        );
    }
}
