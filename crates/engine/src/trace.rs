//! Deterministic training traces (`duet train --trace run.jsonl`) and their comparison
//! (`duet parity a.jsonl b.jsonl`).
//!
//! A trace is JSON lines: one header (config, seed, backend, device, precision, duet version),
//! then one record per step with the loss, gradient norm, learning rate, loss scale and, per
//! parameter tensor, its L2 norm and a few values at fixed positions. Two runs of the same config
//! and seed on different machines can then be compared step by step without sharing a machine.

use crate::config::Config;
use crate::model::Gpt;
use crate::{EngineError, Result};
use duet_device::{Buffer, DType, Device, DeviceExt};
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
}

/// Per-tensor record: L2 norm and the values at [`sample_positions`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorTrace {
    pub numel: usize,
    pub norm: f64,
    pub samples: Vec<f32>,
}

/// One step of a trace (values after the step's update).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTrace {
    pub kind: String,
    pub step: u64,
    pub loss: f32,
    pub grad_norm: f32,
    pub lr: f32,
    pub loss_scale: Option<f32>,
    pub params: BTreeMap<String, TensorTrace>,
    /// FP8 runs: per GEMM operand, the scale in use and the most recent amax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8: Option<BTreeMap<String, Fp8Trace>>,
}

/// One FP8 operand's scaling state after a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fp8Trace {
    pub scale: f32,
    pub amax: f32,
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
            dev.sum_squares(p, &mut norm_buf, i)?;
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
        let fp8 = model.fp8_report(1)?.map(|ops| {
            ops.into_iter()
                .map(|o| {
                    let amax = o.amax_history.first().copied().unwrap_or(0.0);
                    (
                        o.name,
                        Fp8Trace {
                            scale: o.scale,
                            amax,
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
        message: e.to_string(),
    }
}

/// A trace read back from disk.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    pub header: TraceHeader,
    pub steps: Vec<StepTrace>,
}

impl Trace {
    pub fn read(path: &Path) -> Result<Trace> {
        let file = std::fs::File::open(path).map_err(|e| EngineError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::parse(std::io::BufReader::new(file)).map_err(|m| EngineError::Io {
            path: path.display().to_string(),
            message: m,
        })
    }

    pub fn parse<R: BufRead>(r: R) -> std::result::Result<Trace, String> {
        let mut lines = r.lines().enumerate();
        let header: TraceHeader = match lines.next() {
            Some((_, Ok(l))) => serde_json::from_str(&l)
                .map_err(|e| format!("line 1 is not a duet trace header: {e}"))?,
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
    Match {
        steps: usize,
        worst: Vec<(f64, String)>,
    },
    /// The first quantity that left tolerance.
    Diverged {
        step: u64,
        quantity: String,
        a: f64,
        b: f64,
        rel_err: f64,
        tol: f64,
    },
}

/// Why two traces cannot be compared.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("traces are not comparable: {0}")]
pub struct Incompatible(pub String);

/// `train` settings that change how a step executes, not what it computes: CUDA graphs, the
/// loss read-back interval, GEMM autotuning, activation checkpointing and the GELU recompute
/// (each documented to give the same bits, autotuning the same values up to the last bits).
/// Traces that differ only in these are comparable; comparing them is how those claims are
/// checked.
pub const EXECUTION_SETTINGS: [&str; 5] = [
    "graphs",
    "loss_every",
    "gemm_autotune",
    "checkpoint_every",
    "recompute_gelu",
];

/// The header's config as JSON, without the [`EXECUTION_SETTINGS`].
fn run_config(t: &Trace) -> serde_json::Value {
    let mut v = serde_json::to_value(&t.header.config).expect("config");
    if let Some(train) = v.get_mut("train").and_then(|t| t.as_object_mut()) {
        for k in EXECUTION_SETTINGS {
            train.remove(k);
        }
    }
    v
}

/// The [`EXECUTION_SETTINGS`] in which two traces differ, as `train.name: a vs b`.
pub fn execution_differences(a: &Trace, b: &Trace) -> Vec<String> {
    let ca = serde_json::to_value(&a.header.config).expect("config");
    let cb = serde_json::to_value(&b.header.config).expect("config");
    EXECUTION_SETTINGS
        .iter()
        .filter_map(|k| {
            let (x, y) = (&ca["train"][k], &cb["train"][k]);
            (x != y).then(|| format!("train.{k}: {x} vs {y}"))
        })
        .collect()
}

/// Compares two traces step by step. `precision` picks the tolerance; when the traces' precisions
/// differ, the looser one applies. Configs must agree except in the [`EXECUTION_SETTINGS`].
pub fn compare(a: &Trace, b: &Trace) -> std::result::Result<ParityOutcome, Incompatible> {
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
    let tol_of =
        |step| tolerance(&a.header.precision, step).max(tolerance(&b.header.precision, step));
    let n = a.steps.len().min(b.steps.len());
    if n == 0 {
        return Err(Incompatible("a trace has no steps".into()));
    }
    let mut worst: BTreeMap<String, f64> = BTreeMap::new();
    for (sa, sb) in a.steps.iter().zip(&b.steps).take(n) {
        if sa.step != sb.step {
            return Err(Incompatible(format!(
                "step numbers differ: {} vs {}",
                sa.step, sb.step
            )));
        }
        let tol = tol_of(sa.step);
        let mut checks: Vec<(String, f64, f64, f64)> = vec![
            (
                "loss".into(),
                sa.loss as f64,
                sb.loss as f64,
                (sb.loss as f64).abs(),
            ),
            (
                "grad_norm".into(),
                sa.grad_norm as f64,
                sb.grad_norm as f64,
                (sb.grad_norm as f64).abs(),
            ),
            (
                "lr".into(),
                sa.lr as f64,
                sb.lr as f64,
                (sb.lr as f64).abs(),
            ),
        ];
        if let (Some(x), Some(y)) = (sa.loss_scale, sb.loss_scale) {
            checks.push(("loss_scale".into(), x as f64, y as f64, (y as f64).abs()));
        }
        if let (Some(fa), Some(fb)) = (&sa.fp8, &sb.fp8) {
            for (name, x) in fa {
                let Some(y) = fb.get(name) else {
                    return Err(Incompatible(format!(
                        "FP8 operand {name} is missing from the second trace"
                    )));
                };
                checks.push((
                    format!("fp8 {name}.scale"),
                    x.scale as f64,
                    y.scale as f64,
                    (y.scale as f64).abs(),
                ));
                checks.push((
                    format!("fp8 {name}.amax"),
                    x.amax as f64,
                    y.amax as f64,
                    (y.amax as f64).abs(),
                ));
            }
        }
        for (name, ta) in &sa.params {
            let Some(tb) = sb.params.get(name) else {
                return Err(Incompatible(format!(
                    "tensor {name} is missing from the second trace"
                )));
            };
            checks.push((format!("{name}.norm"), ta.norm, tb.norm, tb.norm.abs()));
            // Samples are judged against the tensor's RMS so a value near zero cannot blow up
            // the relative error.
            let rms = tb.norm / (tb.numel.max(1) as f64).sqrt();
            for (k, (x, y)) in ta.samples.iter().zip(&tb.samples).enumerate() {
                checks.push((
                    format!("{name}[sample {k}]"),
                    *x as f64,
                    *y as f64,
                    (*y as f64).abs().max(rms),
                ));
            }
        }
        for (quantity, x, y, scale) in checks {
            let err = (x - y).abs() / scale.max(1e-30);
            let both_nan = x.is_nan() && y.is_nan();
            let out_of_tolerance = err.is_nan() || err > tol;
            if !both_nan && out_of_tolerance {
                return Ok(ParityOutcome::Diverged {
                    step: sa.step,
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
            let r = if both_nan { 0.0 } else { err / tol };
            let e = worst.entry(key).or_insert(0.0);
            if r > *e {
                *e = r;
            }
        }
    }
    let mut worst: Vec<(f64, String)> = worst.into_iter().map(|(k, v)| (v, k)).collect();
    worst.sort_by(|x, y| y.0.total_cmp(&x.0));
    Ok(ParityOutcome::Match { steps: n, worst })
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
