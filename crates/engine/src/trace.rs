//! Deterministic training traces (`duet train --trace run.jsonl`) and their comparison
//! (`duet parity a.jsonl b.jsonl`).
//!
//! A trace is JSON lines: one header (config, seed, backend, device, precision, duet version),
//! then one record per step with the loss, gradient norm, learning rate, loss scale and, per
//! parameter tensor, its L2 norm and a few values at fixed positions. Two runs of the same config
//! and seed on different machines can then be compared step by step without sharing a machine.
//! Infinities and NaN, which JSON numbers cannot hold, are the strings "inf", "-inf" and "NaN"
//! (older traces have `null` for all three).

use crate::config::Config;
use crate::dataset::io_message;
use crate::fp8::{Fp8Family, Fp8Recipe};
use crate::model::Gpt;
use crate::{EngineError, Result};
use duet_device::{Buffer, DType, Device, DeviceExt, SumSquares};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

/// Number of fixed sample positions recorded per parameter tensor.
pub const SAMPLES_PER_TENSOR: usize = 4;

/// First line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    pub kind: String,
    pub duet_version: String,
    pub git_rev: String,
    pub backend: String,
    pub device: String,
    pub precision: String,
    pub seed: u64,
    pub config: Config,
    /// FP8 runs: the encodings the device's FP8 hardware uses ("ocp" or "fnuz",
    /// [`crate::fp8::Fp8Family`]). Absent in other runs and in traces written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_family: Option<String>,
}

/// Per-tensor record: L2 norm and the values at [`sample_positions`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorTrace {
    pub numel: usize,
    #[serde(with = "num")]
    pub norm: f64,
    #[serde(with = "num::vec")]
    pub samples: Vec<f32>,
}

/// One step of a trace (values after the step's update).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTrace {
    pub kind: String,
    pub step: u64,
    #[serde(with = "num")]
    pub loss: f32,
    #[serde(with = "num")]
    pub grad_norm: f32,
    #[serde(with = "num")]
    pub lr: f32,
    #[serde(default, with = "num::opt")]
    pub loss_scale: Option<f32>,
    pub params: BTreeMap<String, TensorTrace>,
    /// FP8 runs: per GEMM operand, the scale in use and the most recent amax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<BTreeMap<String, Fp8Trace>>,
}

/// One FP8 operand's scaling state after a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fp8Trace {
    #[serde(with = "num")]
    pub scale: f32,
    /// The most recent amax (the history's first entry).
    #[serde(with = "num")]
    pub amax: f32,
    /// The whole amax history, most recent first (`amax` again, then the older entries the
    /// scale is computed from). Empty in traces written before it was recorded.
    #[serde(default, with = "num::vec", skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<f32>,
}

/// A non-finite value read from a trace that does not say which one it was: traces written
/// before duet told them apart have `null` for inf, -inf and NaN alike (serde_json's default).
/// It is a NaN with a payload of its own, so [`compare`] can take it as "non-finite, kind
/// unknown" and match it against any non-finite value instead of calling it a NaN.
pub const UNKNOWN_NONFINITE_F32: f32 = f32::from_bits(0x7fc0_0001);
/// [`UNKNOWN_NONFINITE_F32`] for the f64 tensor norms.
pub const UNKNOWN_NONFINITE_F64: f64 = f64::from_bits(0x7ff8_0000_0000_0001);

/// The JSON form of the traced numbers. JSON numbers cannot hold inf or NaN, so those are
/// written as the strings "inf", "-inf" and "NaN"; `null` from older traces reads back as the
/// unknown non-finite value ([`UNKNOWN_NONFINITE_F32`]). Finite values are plain numbers, as
/// before, so older duet versions still read traces of runs that stayed finite.
mod num {
    use serde::de::{self, Deserializer, Visitor};
    use serde::{Deserialize, Serialize, Serializer};
    use std::marker::PhantomData;

    pub(super) trait Float: Copy {
        const UNKNOWN: Self;
        fn from_f64(v: f64) -> Self;
        fn to_f64(self) -> f64;
        fn serialize_number<S: Serializer>(self, s: S) -> Result<S::Ok, S::Error>;
    }

    impl Float for f32 {
        const UNKNOWN: Self = super::UNKNOWN_NONFINITE_F32;
        fn from_f64(v: f64) -> Self {
            // What serde_json's own f32 reading does: parse as f64, round once.
            v as f32
        }
        fn to_f64(self) -> f64 {
            self as f64
        }
        fn serialize_number<S: Serializer>(self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_f32(self)
        }
    }

    impl Float for f64 {
        const UNKNOWN: Self = super::UNKNOWN_NONFINITE_F64;
        fn from_f64(v: f64) -> Self {
            v
        }
        fn to_f64(self) -> f64 {
            self
        }
        fn serialize_number<S: Serializer>(self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_f64(self)
        }
    }

    struct Json<T>(T);

    impl<T: Float> Serialize for Json<T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let v = self.0.to_f64();
            if v.is_nan() {
                s.serialize_str("NaN")
            } else if v == f64::INFINITY {
                s.serialize_str("inf")
            } else if v == f64::NEG_INFINITY {
                s.serialize_str("-inf")
            } else {
                self.0.serialize_number(s)
            }
        }
    }

    struct JsonVisitor<T>(PhantomData<T>);

    impl<T: Float> Visitor<'_> for JsonVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(r#"a number, null, "inf", "-inf" or "NaN""#)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
            Ok(T::from_f64(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
            Ok(T::from_f64(v as f64))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
            Ok(T::from_f64(v as f64))
        }
        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            Ok(T::UNKNOWN)
        }
        fn visit_none<E: de::Error>(self) -> Result<T, E> {
            Ok(T::UNKNOWN)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
            match v {
                "NaN" => Ok(T::from_f64(f64::NAN)),
                "inf" => Ok(T::from_f64(f64::INFINITY)),
                "-inf" => Ok(T::from_f64(f64::NEG_INFINITY)),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
    }

    impl<'de, T: Float> Deserialize<'de> for Json<T> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(JsonVisitor(PhantomData)).map(Json)
        }
    }

    pub(super) fn serialize<T: Float, S: Serializer>(x: &T, s: S) -> Result<S::Ok, S::Error> {
        Json(*x).serialize(s)
    }

    pub(super) fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        Json::deserialize(d).map(|j| j.0)
    }

    /// `Option<f32>`: `null` stays `None` (no loss scale), as in every trace written so far.
    pub(super) mod opt {
        use super::*;

        pub(in super::super) fn serialize<T: Float, S: Serializer>(
            x: &Option<T>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            x.map(Json).serialize(s)
        }

        pub(in super::super) fn deserialize<'de, T: Float, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<T>, D::Error> {
            Ok(Option::<Json<T>>::deserialize(d)?.map(|j| j.0))
        }
    }

    pub(super) mod vec {
        use super::*;

        pub(in super::super) fn serialize<T: Float, S: Serializer>(
            x: &[T],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            s.collect_seq(x.iter().map(|v| Json(*v)))
        }

        pub(in super::super) fn deserialize<'de, T: Float, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<T>, D::Error> {
            Ok(Vec::<Json<T>>::deserialize(d)?
                .into_iter()
                .map(|j| j.0)
                .collect())
        }
    }
}

/// The fixed positions sampled from a tensor of `numel` elements: spread over the tensor, the
/// same for every backend and run.
pub fn sample_positions(numel: usize) -> Vec<usize> {
    if numel == 0 {
        return vec![];
    }
    (0..SAMPLES_PER_TENSOR)
        .map(|k| ((2 * k + 1) * numel / (2 * SAMPLES_PER_TENSOR) + 7 * k) % numel)
        .collect()
}

/// Writes a trace as the run goes.
pub struct TraceWriter<W: Write> {
    out: W,
    norms: Option<Vec<f32>>,
}

impl<W: Write> TraceWriter<W> {
    pub fn new(mut out: W, header: &TraceHeader) -> Result<Self> {
        writeln!(
            out,
            "{}",
            serde_json::to_string(header).expect("header serialises")
        )
        .map_err(io_err("trace"))?;
        Ok(Self { out, norms: None })
    }

    /// Records the state of `model` after a step.
    pub fn record<D: Device>(
        &mut self,
        model: &Gpt<D>,
        step: u64,
        loss: f32,
        grad_norm: f32,
        lr: f32,
        loss_scale: Option<f32>,
    ) -> Result<()> {
        let dev = &**model.device();
        let specs = model.specs();
        // Per-tensor squared norms on the device, one read for all of them.
        let mut norm_buf = dev.alloc(DType::F32, specs.len())?;
        for (i, p) in model.params().iter().enumerate() {
            dev.exec(SumSquares {
                x: p,
                out: &mut norm_buf,
                slot: i,
            })?;
        }
        let sq: Vec<f32> = dev.download(&norm_buf)?;
        self.norms = Some(sq.clone());
        let mut params = BTreeMap::new();
        for ((spec, p), s) in specs.iter().zip(model.params()).zip(sq) {
            let mut samples = Vec::with_capacity(SAMPLES_PER_TENSOR);
            for pos in sample_positions(spec.numel()) {
                let bytes = dev.download_bytes(p, pos, 1)?;
                samples.push(p.dtype().bytes_to_f32(&bytes)?[0]);
            }
            params.insert(
                spec.name.clone(),
                TensorTrace {
                    numel: spec.numel(),
                    norm: (s as f64).sqrt(),
                    samples,
                },
            );
        }
        let fp8 = model.fp8_report(usize::MAX)?.map(|ops| {
            ops.into_iter()
                .map(|o| {
                    let amax = o.amax_history.first().copied().unwrap_or(0.0);
                    (
                        o.name,
                        Fp8Trace {
                            scale: o.scale,
                            amax,
                            history: o.amax_history,
                        },
                    )
                })
                .collect()
        });
        let rec = StepTrace {
            kind: "step".into(),
            step,
            loss,
            grad_norm,
            lr,
            loss_scale,
            params,
            fp8,
        };
        writeln!(
            self.out,
            "{}",
            serde_json::to_string(&rec).expect("record serialises")
        )
        .map_err(io_err("trace"))?;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(io_err("trace"))
    }
}

fn io_err(what: &'static str) -> impl Fn(std::io::Error) -> EngineError {
    move |e| EngineError::Io {
        path: what.into(),
        message: io_message(&e),
    }
}

/// A trace read back from disk.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub steps: Vec<StepTrace>,
}

/// The longest trace line read (a step record of the largest presets is a few kilobytes).
pub const MAX_TRACE_LINE: usize = 16 << 20;

/// The next line of `r` without its newline, at most [`MAX_TRACE_LINE`] bytes; `None` at the end.
fn read_bounded_line<R: BufRead>(r: &mut R) -> Option<std::io::Result<String>> {
    let mut buf = Vec::new();
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Some(Err(e)),
        };
        if chunk.is_empty() {
            return (!buf.is_empty()).then(|| finish_line(buf));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        if buf.len() + take > MAX_TRACE_LINE + 1 {
            return Some(Err(std::io::Error::other(format!(
                "a line longer than {} MiB: not a duet trace",
                MAX_TRACE_LINE >> 20
            ))));
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(take);
        if done {
            buf.pop();
            return Some(finish_line(buf));
        }
    }
}

fn finish_line(mut buf: Vec<u8>) -> std::io::Result<String> {
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    String::from_utf8(buf).map_err(|_| std::io::Error::other("a line is not UTF-8 text"))
}

/// The header's `config` key by key against the parsed [`Config`] written back: its groups
/// are flattened into `train`, which serde cannot check by itself (`deny_unknown_fields` does
/// not reach through `flatten`), so a key that does not come back was not understood. Keys a
/// missing field's default fills (traces from before that field existed) are fine. `Err` names
/// the first unknown key (`section.key`).
fn unknown_config_keys(
    header: &serde_json::Value,
    cfg: &Config,
) -> std::result::Result<(), String> {
    let Some(read) = header.get("config").and_then(|c| c.as_object()) else {
        return Ok(());
    };
    let known = serde_json::to_value(cfg).expect("config serialises");
    for (section, v) in read {
        let Some(keys) = v.as_object() else { continue };
        let Some(have) = known.get(section).and_then(|s| s.as_object()) else {
            return Err(section.clone());
        };
        if let Some(k) = keys.keys().find(|k| !have.contains_key(*k)) {
            return Err(format!("{section}.{k}"));
        }
    }
    Ok(())
}

impl Trace {
    pub fn read(path: &Path) -> Result<Trace> {
        if let Ok(m) = std::fs::metadata(path)
            && !m.is_file()
            && !path.starts_with("/dev/fd")
            && !path.starts_with("/proc/self/fd")
        {
            return Err(EngineError::Io {
                path: path.display().to_string(),
                message: "is not a regular file (a trace is a file written by duet train --trace)"
                    .into(),
            });
        }
        let file = std::fs::File::open(path).map_err(|e| EngineError::Io {
            path: path.display().to_string(),
            message: io_message(&e),
        })?;
        Self::parse(std::io::BufReader::new(file)).map_err(|m| EngineError::Io {
            path: path.display().to_string(),
            message: m,
        })
    }

    pub fn parse<R: BufRead>(r: R) -> std::result::Result<Trace, String> {
        // Lines are bounded: one endless line (`duet parity /dev/zero ...`) must end in an
        // error, not in an allocation failure that aborts the process.
        let mut r = r;
        let mut lines = std::iter::from_fn(move || read_bounded_line(&mut r)).enumerate();
        let header: TraceHeader = match lines.next() {
            Some((_, Ok(l))) => {
                let header: TraceHeader = serde_json::from_str(&l)
                    .map_err(|e| format!("line 1 is not a duet trace header: {e}"))?;
                let read: serde_json::Value =
                    serde_json::from_str(&l).map_err(|e| format!("line 1: {e}"))?;
                unknown_config_keys(&read, &header.config).map_err(|k| {
                    format!("line 1: the header's configuration has an unknown field {k}")
                })?;
                header
            }
            Some((_, Err(e))) => return Err(e.to_string()),
            None => return Err("empty file, not a duet trace".into()),
        };
        if header.kind != "header" {
            return Err(format!(
                "line 1 has kind '{}', expected 'header'",
                header.kind
            ));
        }
        let mut steps = Vec::new();
        for (i, line) in lines {
            let line = line.map_err(|e| e.to_string())?;
            if line.trim().is_empty() {
                continue;
            }
            let s: StepTrace = serde_json::from_str(&line)
                .map_err(|e| format!("line {}: not a trace step record: {e}", i + 1))?;
            steps.push(s);
        }
        Ok(Trace { header, steps })
    }
}

/// Relative tolerance for comparing two traces of `precision` at 1-based `step`: tight for FP32,
/// looser for the 16-bit formats and FP8, growing with the step count because training amplifies
/// rounding differences.
pub fn tolerance(precision: &str, step: u64) -> f64 {
    let base = match precision {
        "fp32" => 5e-5,
        "bf16" => 2e-2,
        "fp16" => 5e-3,
        "fp8" => 5e-2,
        _ => 5e-2,
    };
    base * (1.0 + step as f64 / 10.0)
}

/// Result of comparing two traces.
#[derive(Clone, Debug, PartialEq)]
pub enum ParityOutcome {
    /// Every compared quantity stayed within tolerance; the worst ratios (error / tolerance).
    /// `nonfinite` counts the values that were inf or NaN alike in both traces (a skipped FP16
    /// step's gradient norm, say), which match without a ratio.
    Match {
        steps: usize,
        worst: Vec<(f64, String)>,
        nonfinite: usize,
    },
    /// The first quantity that left tolerance, or that was inf or NaN in one trace and not the
    /// same in the other (then `rel_err` is infinite; see [`format_value`] for `a` and `b`).
    Diverged {
        step: u64,
        quantity: String,
        a: f64,
        b: f64,
        rel_err: f64,
        tol: f64,
    },
    /// The steps both traces have match, but one trace has more: the other run stopped early
    /// (a crash, a kill, a trace cut short) or went on longer. Lengths are step records; `last`
    /// is each trace's last step number.
    LengthDiffers {
        steps: usize,
        a_steps: usize,
        b_steps: usize,
        a_last: u64,
        b_last: u64,
    },
}

/// A traced value for a message: `{:.9e}` when finite, else inf, -inf, NaN, or "non-finite"
/// for [`UNKNOWN_NONFINITE_F64`] (an older trace's `null`, which may have been any of them).
pub fn format_value(x: f64) -> String {
    match Kind::of(x) {
        Kind::Finite => format!("{x:.9e}"),
        Kind::Unknown => "non-finite (null)".into(),
        _ => format!("{x}"),
    }
}

/// What a traced value is, for comparing non-finite values by kind.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Finite,
    Nan,
    Inf,
    NegInf,
    /// [`UNKNOWN_NONFINITE_F64`]: one of the three above, not recorded which.
    Unknown,
}

impl Kind {
    fn of(x: f64) -> Kind {
        if x.is_finite() {
            Kind::Finite
        } else if x.to_bits() == UNKNOWN_NONFINITE_F64.to_bits() {
            Kind::Unknown
        } else if x.is_nan() {
            Kind::Nan
        } else if x > 0.0 {
            Kind::Inf
        } else {
            Kind::NegInf
        }
    }

    /// Whether two non-finite values agree: the same kind, or an unknown one against any.
    fn agrees(self, other: Kind) -> bool {
        self == other || self == Kind::Unknown || other == Kind::Unknown
    }
}

/// `x` as f64 for comparing, keeping [`UNKNOWN_NONFINITE_F32`] recognisable (a NaN's payload
/// need not survive a float conversion).
fn widen(x: f32) -> f64 {
    if x.to_bits() == UNKNOWN_NONFINITE_F32.to_bits() {
        UNKNOWN_NONFINITE_F64
    } else {
        x as f64
    }
}

/// Why two traces cannot be compared.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("traces are not comparable: {0}")]
pub struct Incompatible(pub String);

/// The `train` keys of the execution group ([`crate::config::ExecutionConfig`]): settings that
/// change how a step executes, not what it computes (CUDA graphs, the loss read-back interval,
/// GEMM autotuning, activation checkpointing and the GELU recompute; each documented to give
/// the same bits, autotuning the same values up to the last bits). Traces that differ only in
/// these are comparable; comparing them is how those claims are checked. Taken from the type,
/// so a new execution setting is one automatically.
pub fn execution_settings() -> Vec<String> {
    let v = serde_json::to_value(&Config::preset(crate::config::Preset::Tiny).train.execution)
        .expect("execution settings serialise");
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// The header's config as JSON, without the [`execution_settings`].
fn run_config(t: &Trace) -> serde_json::Value {
    let mut v = serde_json::to_value(&t.header.config).expect("config");
    if let Some(train) = v.get_mut("train").and_then(|t| t.as_object_mut()) {
        for k in execution_settings() {
            train.remove(&k);
        }
    }
    v
}

/// The [`execution_settings`] in which two traces differ, as `train.name: a vs b`.
pub fn execution_differences(a: &Trace, b: &Trace) -> Vec<String> {
    let ca = serde_json::to_value(&a.header.config).expect("config");
    let cb = serde_json::to_value(&b.header.config).expect("config");
    execution_settings()
        .iter()
        .filter_map(|k| {
            let (x, y) = (&ca["train"][k], &cb["train"][k]);
            (x != y).then(|| format!("train.{k}: {x} vs {y}"))
        })
        .collect()
}

/// The largest finite value of the FP8 format operand `name` (`<layer>.input`, `.weight` or
/// `.grad_output`) is stored in under `recipe` on a device of `family`.
fn fp8_operand_max(family: Fp8Family, recipe: Fp8Recipe, name: &str) -> f64 {
    let (fwd, bwd) = family.dtypes(recipe);
    let dt = if name.ends_with(".grad_output") {
        bwd
    } else {
        fwd
    };
    duet_device::Fp8Format::of(dt).map_or(1.0, |f| f.max_finite() as f64)
}

/// One quantity compared: (quantity, a, b, scale the error is relative to).
type Check = (String, f64, f64, f64);

/// How the FP8 scales of two traces compare: the traces' FP8 families where they differ, and
/// the recipe (which picks each operand's format).
#[derive(Clone, Copy)]
struct Fp8Scales {
    families: Option<(Fp8Family, Fp8Family)>,
    recipe: Fp8Recipe,
}

/// Compares two traces step by step. `precision` picks the tolerance; when the traces' precisions
/// differ, the looser one applies. Configs must agree except in the [`execution_settings`].
pub fn compare(a: &Trace, b: &Trace) -> std::result::Result<ParityOutcome, Incompatible> {
    check_comparable(a, b)?;
    // The tolerance comes from the configuration's precision (the same in both, checked
    // above).
    let precision = a.header.config.train.recipe.precision.as_str();
    let tol_of = |step| tolerance(precision, step);
    let family = |h: &TraceHeader| h.fp8_family.as_deref().and_then(Fp8Family::parse);
    let families = match (family(&a.header), family(&b.header)) {
        (Some(x), Some(y)) if x != y => Some((x, y)),
        _ => None,
    };
    let scales = Fp8Scales {
        families,
        recipe: a.header.config.train.recipe.fp8_format,
    };
    let n = a.steps.len().min(b.steps.len());
    if n == 0 {
        let which = match (a.steps.is_empty(), b.steps.is_empty()) {
            (true, true) => "neither trace has",
            (true, false) => "the first trace has",
            _ => "the second trace has",
        };
        return Err(Incompatible(format!("{which} no step records")));
    }
    let mut tally = Tally::default();
    for (sa, sb) in a.steps.iter().zip(&b.steps).take(n) {
        if sa.step != sb.step {
            return Err(Incompatible(format!(
                "step numbers differ: {} vs {}",
                sa.step, sb.step
            )));
        }
        let tol = tol_of(sa.step);
        let checks = step_checks(sa, sb, scales)?;
        if let Some(diverged) = tally.judge(sa.step, checks, tol) {
            return Ok(diverged);
        }
    }
    if a.steps.len() != b.steps.len() {
        return Ok(ParityOutcome::LengthDiffers {
            steps: n,
            a_steps: a.steps.len(),
            b_steps: b.steps.len(),
            a_last: a.steps.last().map_or(0, |s| s.step),
            b_last: b.steps.last().map_or(0, |s| s.step),
        });
    }
    let mut worst: Vec<(f64, String)> = tally.worst.into_iter().map(|(k, v)| (v, k)).collect();
    worst.sort_by(|x, y| y.0.total_cmp(&x.0));
    Ok(ParityOutcome::Match {
        steps: n,
        worst,
        nonfinite: tally.nonfinite,
    })
}

/// Two traces are comparable when their seeds and configurations agree (but for the
/// [`execution_settings`]) and each header's precision label is its configuration's.
fn check_comparable(a: &Trace, b: &Trace) -> std::result::Result<(), Incompatible> {
    if a.header.seed != b.header.seed {
        return Err(Incompatible(format!(
            "field 'seed' differs: {} vs {}",
            a.header.seed, b.header.seed
        )));
    }
    let (ca, cb) = (run_config(a), run_config(b));
    if ca != cb {
        let field = first_difference("config", &ca, &cb).unwrap_or_else(|| "config".into());
        return Err(Incompatible(format!("field '{field}' differs")));
    }
    // The tolerance comes from the configuration's precision (the same in both, checked
    // above); a header whose `precision` label disagrees with its own configuration is refused
    // (two fp32 traces labelled fp8 would otherwise be judged at FP8's 5%).
    for (which, t) in [("first", a), ("second", b)] {
        let own = t.header.config.train.recipe.precision.as_str();
        if t.header.precision != own {
            return Err(Incompatible(format!(
                "the {which} trace's header says precision '{}' but its configuration has '{own}'",
                t.header.precision
            )));
        }
    }
    Ok(())
}

/// The quantities of one step to compare: loss, gradient norm, learning rate, the loss scale,
/// the FP8 scaling state and every tensor's norm and samples. What one trace records the
/// other must record too.
fn step_checks(
    sa: &StepTrace,
    sb: &StepTrace,
    scales: Fp8Scales,
) -> std::result::Result<Vec<Check>, Incompatible> {
    let mut checks: Vec<Check> = vec![
        (
            "loss".into(),
            widen(sa.loss),
            widen(sb.loss),
            (sb.loss as f64).abs(),
        ),
        (
            "grad_norm".into(),
            widen(sa.grad_norm),
            widen(sb.grad_norm),
            (sb.grad_norm as f64).abs(),
        ),
        (
            "lr".into(),
            widen(sa.lr),
            widen(sb.lr),
            (sb.lr as f64).abs(),
        ),
    ];
    check_recorded_alike(sa, sb)?;
    if let (Some(x), Some(y)) = (sa.loss_scale, sb.loss_scale) {
        checks.push(("loss_scale".into(), widen(x), widen(y), (y as f64).abs()));
    }
    if let (Some(fa), Some(fb)) = (&sa.fp8, &sb.fp8) {
        fp8_checks(fa, fb, scales, &mut checks)?;
    }
    param_checks(sa, sb, &mut checks)?;
    Ok(checks)
}

/// What one step records in one trace it records in the other, in both directions: the loss
/// scale, FP8 scaling; the first trace has every FP8 operand and tensor of the second (the
/// other direction is checked as they are compared).
fn check_recorded_alike(sa: &StepTrace, sb: &StepTrace) -> std::result::Result<(), Incompatible> {
    // What one trace records the other must record too, in both directions.
    if sa.loss_scale.is_some() != sb.loss_scale.is_some() {
        return Err(Incompatible(format!(
            "step {}: the loss scale is recorded in only the {} trace",
            sa.step,
            if sa.loss_scale.is_some() {
                "first"
            } else {
                "second"
            }
        )));
    }
    if sa.fp8.is_some() != sb.fp8.is_some() {
        return Err(Incompatible(format!(
            "step {}: FP8 scaling is recorded in only the {} trace",
            sa.step,
            if sa.fp8.is_some() { "first" } else { "second" }
        )));
    }
    if let (Some(fa), Some(fb)) = (&sa.fp8, &sb.fp8)
        && let Some(name) = fb.keys().find(|k| !fa.contains_key(*k))
    {
        return Err(Incompatible(format!(
            "FP8 operand {name} is missing from the first trace"
        )));
    }
    if let Some(name) = sb.params.keys().find(|k| !sa.params.contains_key(*k)) {
        return Err(Incompatible(format!(
            "tensor {name} is missing from the first trace"
        )));
    }
    Ok(())
}

/// Each FP8 operand's scale and amax (`fa` against `fb`) into `checks`.
fn fp8_checks(
    fa: &BTreeMap<String, Fp8Trace>,
    fb: &BTreeMap<String, Fp8Trace>,
    scales: Fp8Scales,
    checks: &mut Vec<Check>,
) -> std::result::Result<(), Incompatible> {
    for (name, x) in fa {
        let Some(y) = fb.get(name) else {
            return Err(Incompatible(format!(
                "FP8 operand {name} is missing from the second trace"
            )));
        };
        // Across FP8 families (an OCP device against an FNUZ one) the same amax gives
        // scales in the ratio of the formats' maxima (E4M3: 448 vs 240): the scales
        // are compared as fractions of their format's max.
        let (xs, ys, what) = match scales.families {
            Some((fam_a, fam_b)) => {
                let max = |f: Fp8Family| fp8_operand_max(f, scales.recipe, name);
                (
                    widen(x.scale) / max(fam_a),
                    widen(y.scale) / max(fam_b),
                    format!("fp8 {name}.scale / format max"),
                )
            }
            None => (widen(x.scale), widen(y.scale), format!("fp8 {name}.scale")),
        };
        checks.push((what, xs, ys, ys.abs()));
        checks.push((
            format!("fp8 {name}.amax"),
            widen(x.amax),
            widen(y.amax),
            (y.amax as f64).abs(),
        ));
        // The older entries of the histories (traces that record them): the amaxes the
        // scale is computed from, a resumed run's from before its trace began included.
        if x.history.len() != y.history.len() && !x.history.is_empty() && !y.history.is_empty() {
            return Err(Incompatible(format!(
                "FP8 operand {name} keeps an amax history of {} entries in the first trace, {} \
                 in the second",
                x.history.len(),
                y.history.len()
            )));
        }
        for (i, (&hx, &hy)) in x.history.iter().zip(&y.history).enumerate().skip(1) {
            checks.push((
                format!("fp8 {name}.amax_history[{i}]"),
                widen(hx),
                widen(hy),
                (hy as f64).abs(),
            ));
        }
    }
    Ok(())
}

/// Each tensor's norm and samples (`sa`'s against `sb`'s) into `checks`.
fn param_checks(
    sa: &StepTrace,
    sb: &StepTrace,
    checks: &mut Vec<Check>,
) -> std::result::Result<(), Incompatible> {
    for (name, ta) in &sa.params {
        let Some(tb) = sb.params.get(name) else {
            return Err(Incompatible(format!(
                "tensor {name} is missing from the second trace"
            )));
        };
        if ta.samples.len() != tb.samples.len() || ta.numel != tb.numel {
            return Err(Incompatible(format!(
                "tensor {name}: {} elements and {} samples vs {} elements and {} samples",
                ta.numel,
                ta.samples.len(),
                tb.numel,
                tb.samples.len()
            )));
        }
        checks.push((format!("{name}.norm"), ta.norm, tb.norm, tb.norm.abs()));
        // Samples are judged against the tensor's RMS so a value near zero cannot blow up
        // the relative error; a non-finite norm gives no RMS to judge by (an infinite one
        // would pass any sample).
        let rms = tb.norm / (tb.numel.max(1) as f64).sqrt();
        let rms = if rms.is_finite() { rms } else { 0.0 };
        for (k, (x, y)) in ta.samples.iter().zip(&tb.samples).enumerate() {
            checks.push((
                format!("{name}[sample {k}]"),
                widen(*x),
                widen(*y),
                (*y as f64).abs().max(rms),
            ));
        }
    }
    Ok(())
}

/// The comparison so far: per kind of quantity the worst error as a fraction of the
/// tolerance, and how many values were non-finite alike in both traces.
#[derive(Default)]
struct Tally {
    worst: BTreeMap<String, f64>,
    nonfinite: usize,
}

impl Tally {
    /// Judges the `checks` of `step` at tolerance `tol`: the first out of tolerance is the
    /// divergence returned; the others go into the tally.
    fn judge(&mut self, step: u64, checks: Vec<Check>, tol: f64) -> Option<ParityOutcome> {
        for (quantity, x, y, scale) in checks {
            let (kx, ky) = (Kind::of(x), Kind::of(y));
            // Finite values are judged by relative error. Non-finite ones carry no magnitude:
            // the same kind in both traces (a skipped FP16 step's inf gradient norm) is the
            // same behaviour, anything else is a divergence.
            let err = match (kx, ky) {
                (Kind::Finite, Kind::Finite) => (x - y).abs() / scale.max(1e-30),
                (Kind::Finite, _) | (_, Kind::Finite) => f64::INFINITY,
                _ if kx.agrees(ky) => {
                    self.nonfinite += 1;
                    continue;
                }
                _ => f64::INFINITY,
            };
            if err > tol {
                return Some(ParityOutcome::Diverged {
                    step,
                    quantity,
                    a: x,
                    b: y,
                    rel_err: err,
                    tol,
                });
            }
            let key = quantity
                .split(['[', '.'])
                .next()
                .unwrap_or(&quantity)
                .to_string();
            let key = if quantity.starts_with("transformer.") {
                "parameters".to_string()
            } else if quantity.starts_with("fp8 ") {
                "fp8 scaling".to_string()
            } else {
                key
            };
            let e = self.worst.entry(key).or_insert(0.0);
            *e = e.max(err / tol);
        }
        None
    }
}

/// The dotted path of the first field where two JSON values differ.
fn first_difference(path: &str, a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                match y.get(k) {
                    Some(vb) => {
                        if let Some(p) = first_difference(&format!("{path}.{k}"), va, vb) {
                            return Some(p);
                        }
                    }
                    None => return Some(format!("{path}.{k}")),
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{path}.{k}"))
        }
        _ if a != b => Some(path.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, loss: f32, grad_norm: f32, norm: f64) -> StepTrace {
        StepTrace {
            kind: "step".into(),
            step,
            loss,
            grad_norm,
            lr: 1e-3,
            loss_scale: Some(f32::INFINITY),
            params: BTreeMap::from([(
                "w".to_string(),
                TensorTrace {
                    numel: 4,
                    norm,
                    samples: vec![0.5, f32::NAN, f32::NEG_INFINITY, -0.25],
                },
            )]),
            fp8: None,
        }
    }

    fn trace(steps: Vec<StepTrace>) -> Trace {
        let mut config = Config::preset(crate::Preset::Tiny);
        config.train.recipe.precision = crate::Precision::Fp16;
        Trace {
            header: TraceHeader {
                kind: "header".into(),
                duet_version: "test".into(),
                git_rev: "test".into(),
                backend: "cpu".into(),
                device: "cpu".into(),
                precision: "fp16".into(),
                seed: config.train.data.seed,
                config,
                fp8_family: None,
            },
            steps,
        }
    }

    fn bits(s: &StepTrace) -> Vec<u64> {
        let w = &s.params["w"];
        let mut v = vec![
            s.loss.to_bits() as u64,
            s.grad_norm.to_bits() as u64,
            s.loss_scale.unwrap().to_bits() as u64,
            w.norm.to_bits(),
        ];
        v.extend(w.samples.iter().map(|x| x.to_bits() as u64));
        v
    }

    /// An OCP device's trace against an FNUZ one's: the same amaxes give scales in the ratio
    /// of the formats' maxima (E4M3 448 vs 240; E5M2 57344 in both), which is a match once the
    /// families are known, and a divergence when they are not (or are the same).
    #[test]
    fn fp8_scales_across_families_compare_as_fractions_of_the_format_max() {
        let with_fp8 = |e4m3_max: f32| {
            let mut s = step(1, 2.5, 1.0, 0.75);
            s.loss_scale = None;
            s.params.get_mut("w").unwrap().samples = vec![0.5, 0.25, 1.0, -0.25];
            let amax = 3.0f32;
            s.fp8 = Some(BTreeMap::from([
                (
                    "h.0.attn.c_attn.input".to_string(),
                    Fp8Trace {
                        scale: e4m3_max / amax,
                        amax,
                        history: Vec::new(),
                    },
                ),
                (
                    "h.0.attn.c_attn.grad_output".to_string(),
                    Fp8Trace {
                        scale: 57344.0 / amax,
                        amax,
                        history: Vec::new(),
                    },
                ),
            ]));
            s
        };
        let mut a = trace(vec![with_fp8(448.0)]);
        let mut b = trace(vec![with_fp8(240.0)]);
        for t in [&mut a, &mut b] {
            t.header.precision = "fp8".into();
            t.header.config.train.recipe.precision = crate::Precision::Fp8;
        }
        // Unknown families (traces from before the field): the scales differ.
        assert!(
            matches!(compare(&a, &b), Ok(ParityOutcome::Diverged { .. })),
            "{:?}",
            compare(&a, &b)
        );
        a.header.fp8_family = Some("ocp".into());
        b.header.fp8_family = Some("fnuz".into());
        match compare(&a, &b) {
            Ok(ParityOutcome::Match { worst, .. }) => {
                assert!(worst.iter().any(|(_, k)| k == "fp8 scaling"), "{worst:?}");
            }
            other => panic!("expected a match across families, got {other:?}"),
        }
        // The same family on both sides: compared as they are (and they differ).
        b.header.fp8_family = Some("ocp".into());
        assert!(matches!(
            compare(&a, &b),
            Ok(ParityOutcome::Diverged { .. })
        ));
    }

    /// The amax histories are compared entry by entry: an older entry that differs (a resumed
    /// run's from before its trace began) is named; traces without histories still compare,
    /// and histories of different lengths are not comparable.
    #[test]
    fn fp8_amax_histories_are_compared_entry_by_entry() {
        let with_history = |history: Vec<f32>| {
            let mut s = step(1, 2.5, 1.0, 0.75);
            s.loss_scale = None;
            s.params.get_mut("w").unwrap().samples = vec![0.5, 0.25, 1.0, -0.25];
            s.fp8 = Some(BTreeMap::from([(
                "h.0.mlp.c_fc.input".to_string(),
                Fp8Trace {
                    scale: 448.0 / 3.0,
                    amax: history.first().copied().unwrap_or(3.0),
                    history,
                },
            )]));
            trace(vec![s])
        };
        let fp8 = |mut t: Trace| {
            t.header.precision = "fp8".into();
            t.header.config.train.recipe.precision = crate::Precision::Fp8;
            t
        };
        let a = fp8(with_history(vec![3.0, 2.0, 5.0, 0.0]));
        let b = fp8(with_history(vec![3.0, 2.0, 4.0, 0.0]));
        match compare(&a, &b) {
            Ok(ParityOutcome::Diverged { quantity, .. }) => {
                assert_eq!(quantity, "fp8 h.0.mlp.c_fc.input.amax_history[2]")
            }
            other => panic!("expected the history to diverge, got {other:?}"),
        }
        assert!(matches!(compare(&a, &a), Ok(ParityOutcome::Match { .. })));
        let old = fp8(with_history(Vec::new()));
        assert!(matches!(compare(&a, &old), Ok(ParityOutcome::Match { .. })));
        let short = fp8(with_history(vec![3.0, 2.0]));
        assert!(matches!(compare(&a, &short), Err(Incompatible(_))));
    }

    /// A trace that records less than the other is not comparable, whichever comes first; a
    /// header whose precision label disagrees with its configuration is refused.
    #[test]
    fn compare_needs_the_same_records_in_both_directions() {
        let full = trace(vec![step(1, 2.5, 1.0, 0.75)]);
        let check_both = |x: &Trace, y: &Trace, needle: &str| {
            for (p, q) in [(x, y), (y, x)] {
                match compare(p, q) {
                    Err(Incompatible(m)) => assert!(m.contains(needle), "{m}"),
                    other => panic!("expected incomparable ({needle}), got {other:?}"),
                }
            }
        };
        let mut no_params = full.clone();
        no_params.steps[0].params.clear();
        check_both(&full, &no_params, "is missing from the");
        let mut fewer = full.clone();
        fewer.steps[0].params.get_mut("w").unwrap().samples.pop();
        check_both(&full, &fewer, "samples");
        let mut no_scale = full.clone();
        no_scale.steps[0].loss_scale = None;
        check_both(&full, &no_scale, "loss scale is recorded in only");
        let mut with_fp8 = full.clone();
        with_fp8.steps[0].fp8 = Some(BTreeMap::from([(
            "h.0.attn.c_attn.input".to_string(),
            Fp8Trace {
                scale: 1.0,
                amax: 1.0,
                history: vec![1.0],
            },
        )]));
        check_both(&full, &with_fp8, "FP8 scaling is recorded in only");
        let mut labelled = full.clone();
        labelled.header.precision = "fp8".into();
        check_both(&full, &labelled, "its configuration has 'fp16'");
        // The complete trace against itself still matches.
        assert!(matches!(
            compare(&full, &full),
            Ok(ParityOutcome::Match { .. })
        ));
    }

    #[test]
    fn endless_lines_and_devices_are_errors_not_aborts() {
        // One line without end (what /dev/zero gives), bounded.
        let endless = std::io::Read::take(std::io::repeat(b'x'), (MAX_TRACE_LINE + 10) as u64);
        let e = Trace::parse(std::io::BufReader::new(endless)).unwrap_err();
        assert!(e.contains("longer than"), "{e}");
        let e = Trace::read(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Ordinary lines still read, the last one without its newline too.
        let t = "{\"kind\":\"header\"}\r\nx";
        let mut r = std::io::BufReader::new(t.as_bytes());
        assert_eq!(
            read_bounded_line(&mut r).unwrap().unwrap(),
            "{\"kind\":\"header\"}"
        );
        assert_eq!(read_bounded_line(&mut r).unwrap().unwrap(), "x");
        assert!(read_bounded_line(&mut r).is_none());
    }

    #[test]
    fn trace_numbers_keep_inf_and_nan_apart_and_read_old_nulls() {
        let s = step(3, 2.5, f32::INFINITY, f64::NAN);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains(r#""grad_norm":"inf""#), "{json}");
        assert!(
            json.contains(r#""samples":[0.5,"NaN","-inf",-0.25]"#),
            "{json}"
        );
        let back: StepTrace = serde_json::from_str(&json).unwrap();
        assert_eq!(bits(&back), bits(&s));

        // What serde_json wrote before: null for every non-finite value; a null loss scale is
        // no loss scale, as it always was.
        let old = json
            .replace(r#""inf""#, "null")
            .replace(r#""-inf""#, "null")
            .replace(r#""NaN""#, "null");
        let back: StepTrace = serde_json::from_str(&old).unwrap();
        assert_eq!(back.grad_norm.to_bits(), UNKNOWN_NONFINITE_F32.to_bits());
        assert_eq!(
            back.params["w"].norm.to_bits(),
            UNKNOWN_NONFINITE_F64.to_bits()
        );
        assert_eq!(back.loss_scale, None);

        let err = serde_json::from_str::<StepTrace>(&json.replace(r#""inf""#, r#""big""#));
        assert!(err.is_err());
    }

    #[test]
    fn trace_compare_takes_non_finite_values_by_kind() {
        let a = trace(vec![
            step(1, 2.5, 1.0, 0.75),
            step(2, 2.4, f32::INFINITY, 0.7),
        ]);
        // A trace always matches itself, non-finite values included.
        match compare(&a, &a).unwrap() {
            ParityOutcome::Match {
                steps, nonfinite, ..
            } => assert_eq!((steps, nonfinite), (2, 7)),
            other => panic!("expected a match, got {other:?}"),
        }
        // An old trace's null (kind unknown) agrees with any non-finite value.
        let mut old = a.clone();
        old.steps[1].grad_norm = UNKNOWN_NONFINITE_F32;
        assert!(matches!(
            compare(&a, &old).unwrap(),
            ParityOutcome::Match { .. }
        ));
        // Non-finite against finite, and inf against NaN, diverge at that step and quantity.
        for (x, finite) in [(1.0, true), (f32::NAN, false), (f32::NEG_INFINITY, false)] {
            let mut b = a.clone();
            b.steps[1].grad_norm = x;
            match compare(&a, &b).unwrap() {
                ParityOutcome::Diverged {
                    step,
                    quantity,
                    rel_err,
                    b,
                    ..
                } => {
                    assert_eq!((step, quantity.as_str()), (2, "grad_norm"));
                    assert_eq!(b.is_finite(), finite);
                    assert!(rel_err.is_infinite());
                }
                other => panic!("expected a divergence, got {other:?}"),
            }
        }
        assert_eq!(format_value(f64::INFINITY), "inf");
        assert_eq!(format_value(UNKNOWN_NONFINITE_F64), "non-finite (null)");
    }

    #[test]
    fn trace_compare_reports_a_trace_that_ends_early() {
        let a = trace(vec![step(1, 2.5, 1.0, 0.75), step(2, 2.4, 0.9, 0.7)]);
        let mut short = a.clone();
        short.steps.truncate(1);
        let want = ParityOutcome::LengthDiffers {
            steps: 1,
            a_steps: 2,
            b_steps: 1,
            a_last: 2,
            b_last: 1,
        };
        assert_eq!(compare(&a, &short).unwrap(), want);
        // A divergence in the common steps comes first.
        short.steps[0].loss = 3.0;
        assert!(matches!(
            compare(&a, &short).unwrap(),
            ParityOutcome::Diverged { step: 1, .. }
        ));
        short.steps.clear();
        let err = compare(&a, &short).unwrap_err().to_string();
        assert!(
            err.contains("the second trace has no step records"),
            "{err}"
        );
    }

    /// Issue 51 item 14: a header whose configuration names a field duet does not know (its
    /// groups are flattened, so serde drops such a field silently) is refused, naming it; a
    /// header as duet writes it, and one missing a field that has a default, read back.
    #[test]
    fn a_header_config_with_an_unknown_field_is_refused() {
        let t = trace(vec![step(1, 2.0, 1.0, 3.0)]);
        let header = serde_json::to_string(&t.header).unwrap();
        let step = serde_json::to_string(&t.steps[0]).unwrap();
        let parse = |h: &str| Trace::parse(std::io::Cursor::new(format!("{h}\n{step}\n")));
        assert_eq!(parse(&header).unwrap().header, t.header);
        let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
        v["config"]["train"]["label_smoothing"] = serde_json::json!(0.1);
        let e = parse(&v.to_string()).unwrap_err();
        assert!(e.contains("unknown field train.label_smoothing"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
        v["config"]["rope"] = serde_json::json!({"theta": 10000});
        let e = parse(&v.to_string()).unwrap_err();
        assert!(e.contains("unknown field") && e.contains("rope"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&header).unwrap();
        v["config"]["train"]
            .as_object_mut()
            .unwrap()
            .remove("recompute_gelu");
        assert_eq!(parse(&v.to_string()).unwrap().header, t.header);
    }
}
