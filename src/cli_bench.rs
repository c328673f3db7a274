//! `duet bench`: step times, throughput, peak memory and MFU of a configuration, for one
//! precision or several in one run.

use crate::backends::{OnDevice, dispatch};
use crate::settings::{backend_kind, build_config, resolve_precision, warn_unused_fp8_flags};
use crate::{CliResult, ModelArgs};
use duet_device::{
    DType, Device, DeviceError, DeviceExt, Gemm, GemmDesc, GemmFp8, Telemetry, human_bytes,
};
use duet_engine::{Config, Precision, Trainer};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub fn bench(a: &ModelArgs, warmup: u64, iters: u64, json: Option<&Path>) -> CliResult<()> {
    if let Some(flag) = crate::settings::bench_refused_flag(a) {
        return Err(format!(
            "{flag} is a `duet train` flag: duet bench times steps on synthetic batches of the \
             model's shape (--batch, --seq and the model flags set it)"
        )
        .into());
    }
    // `--precision fp32,bf16,fp16,fp8` (or `all`) benchmarks each in one run on one device.
    let list = a
        .precision
        .precision
        .as_deref()
        .filter(|p| p.contains(',') || *p == "all");
    let precisions: Vec<Precision> = match list {
        Some("all") => Precision::ALL.to_vec(),
        Some(l) => l
            .split(',')
            .map(|p| p.parse::<Precision>())
            .collect::<Result<_, _>>()?,
        None => vec![],
    };
    let cfg = if precisions.is_empty() {
        build_config(a)?
    } else {
        let mut one = a.clone();
        one.precision.precision = None;
        build_config(&one)?
    };
    if iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    // A --json path that cannot be written is found before the (possibly long) benchmark runs.
    if let Some(p) = json {
        let parent = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(format!(
                "cannot write {}: {} is not a directory",
                p.display(),
                parent.display()
            )
            .into());
        }
        if p.is_dir() {
            return Err(format!("cannot write {}: it is a directory", p.display()).into());
        }
    }
    let cfgs = if precisions.is_empty() {
        vec![cfg]
    } else {
        precisions
            .iter()
            .map(|&p| {
                let mut c = cfg.clone();
                c.train.recipe.precision = p;
                c
            })
            .collect()
    };
    let run_precisions: Vec<Precision> = cfgs.iter().map(|c| c.train.recipe.precision).collect();
    warn_unused_fp8_flags(a, &run_precisions);
    let kind = backend_kind(a)?;
    let mut runs = dispatch(
        kind,
        a.device.threads,
        BenchTask {
            cfgs,
            warmup,
            iters,
            strict: a.device.strict,
        },
    )?;
    if let Some(e) = runs
        .iter()
        .all(|r| r.get("error").is_some())
        .then(|| runs[0]["error"].as_str().unwrap_or("?").to_string())
    {
        return Err(format!("bench failed: {e}").into());
    }
    // The human summary (stderr) for one precision as for several; the JSON on stdout.
    eprintln!(
        "precision  ms/step (median)  ms/step (min)  tokens/s   TFLOP/s    MFU   peak memory{}",
        if runs.iter().any(|r| !r["telemetry"].is_null()) {
            "  GPU (timed steps)"
        } else {
            ""
        }
    );
    for r in &runs {
        if let Some(e) = r["error"].as_str() {
            eprintln!("{:<10} error: {e}", r["precision"].as_str().unwrap_or("?"));
            continue;
        }
        eprintln!(
            "{:<10} {:>16.2} {:>14.2} {:>9.0} {:>9} {:>5.1}%   {:>11}{}",
            r["precision"].as_str().unwrap_or("?"),
            r["ms_per_step_median"].as_f64().unwrap_or(f64::NAN),
            r["ms_per_step_min"].as_f64().unwrap_or(f64::NAN),
            r["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
            three_digits(r["model_tflops"].as_f64().unwrap_or(f64::NAN)),
            100.0 * r["mfu"].as_f64().unwrap_or(f64::NAN),
            human_bytes(r["peak_memory_bytes"].as_u64().unwrap_or(0)),
            telemetry_note(&r["telemetry"])
        );
    }
    let out = if runs.len() == 1 {
        runs.remove(0)
    } else {
        serde_json::Value::Array(runs)
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    if let Some(p) = json {
        std::fs::write(p, serde_json::to_string_pretty(&out)? + "\n")
            .map_err(|e| format!("cannot write {}", duet_engine::dataset::at_path(p, &e)))?;
    }
    Ok(())
}

struct BenchTask {
    cfgs: Vec<Config>,
    warmup: u64,
    iters: u64,
    strict: bool,
}

impl OnDevice for BenchTask {
    type Output = Vec<serde_json::Value>;

    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<Vec<serde_json::Value>> {
        let mut out = Vec::with_capacity(self.cfgs.len());
        let mut ceilings: Vec<(DType, Result<Option<f64>, String>)> = Vec::new();
        for cfg in &self.cfgs {
            let mut cfg = cfg.clone();
            resolve_precision(&mut cfg, &*dev, self.strict)?;
            // A precision that fails (an unsupported GEMM, out of memory) is recorded with its
            // error and the others still run.
            let mut r = match bench_one(&dev, &cfg, self.warmup, self.iters) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("bench {}: {e}", cfg.train.recipe.precision);
                    serde_json::json!({
                        "backend": dev.info().backend,
                        "precision": cfg.train.recipe.precision.as_str(),
                        "model": cfg.model,
                        "batch": cfg.train.data.batch,
                        "seq": cfg.train.data.seq,
                        "error": e.to_string(),
                        "git_rev": env!("DUET_GIT_REV"),
                    })
                }
            };
            // MFU against a GEMM ceiling measured here, in the GEMM dtype the precision uses
            // (measured after the trainer is dropped so its memory is free again).
            let dtype = ceiling_dtype(&*dev, cfg.train.recipe.precision, &cfg);
            let ceiling = match ceilings.iter().find(|(d, _)| *d == dtype) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = gemm_ceiling(&*dev, dtype).map_err(|e| e.to_string());
                    ceilings.push((dtype, c.clone()));
                    c
                }
            };
            r["gemm_ceiling_dtype"] = dtype.to_string().into();
            match ceiling {
                Ok(c) => {
                    r["gemm_ceiling_tflops"] = c.into();
                    if let (Some(t), Some(c)) = (r["model_tflops"].as_f64(), c) {
                        r["mfu"] = (t / c).into();
                    }
                }
                Err(e) => r["gemm_ceiling_error"] = e.into(),
            }
            out.push(r);
        }
        Ok(out)
    }
}

/// A rate with three significant digits (a CPU's 0.162 TFLOP/s, not 0.2; a GPU's 412).
fn three_digits(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    let decimals = (2 - x.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{x:.decimals$}")
}

/// Dense matmul FLOPs of one training step: the forward's GEMMs (four linears per block, the
/// two attention products over the full T × T score matrix, the tied LM head) times three
/// (forward, input gradients, weight gradients). `scripts/bench/torch_ref.py` uses the same
/// count, so model TFLOP/s compare directly.
pub fn train_flops(cfg: &Config) -> f64 {
    let m = &cfg.model;
    let (b, t) = (cfg.train.data.batch as f64, cfg.train.data.seq as f64);
    let (c, f, v, l) = (
        m.d_model as f64,
        m.ffn as f64,
        m.vocab as f64,
        m.layers as f64,
    );
    let n = b * t;
    let per_layer = 2.0 * n * c * 3.0 * c + 2.0 * n * c * c + 4.0 * n * c * f + 4.0 * b * t * t * c;
    3.0 * (l * per_layer + 2.0 * n * c * v)
}

/// The vendor's dense peak TFLOP/s of the GEMM dtype `p` runs in (bf16/f16 for bf16 and fp16
/// runs, FP8 for fp8; none for fp32), for the MFU of
/// `duet train`'s log lines: H100/H200 SXM 989 / 1979, A100 312 (no FP8), MI300X 1307 / 2615,
/// MI325X as MI300X, MI355X 2500 / 5000. None for other devices and the CPU (their lines show
/// no MFU; `duet bench` measures a GEMM ceiling instead).
pub fn nominal_peak_tflops(info: &duet_device::DeviceInfo, p: Precision) -> Option<f64> {
    let n = info.name.to_ascii_uppercase();
    let (bf16, fp8) = if n.contains("H100") || n.contains("H200") || n.contains("GH200") {
        (989.0, Some(1979.0))
    } else if n.contains("A100") {
        (312.0, None)
    } else if n.contains("MI300X") || n.contains("MI325X") {
        (1307.0, Some(2615.0))
    } else if n.contains("MI355X") || n.contains("MI350X") {
        (2500.0, Some(5000.0))
    } else {
        return None;
    };
    match p {
        Precision::Fp8 => fp8,
        Precision::Fp32 => None,
        _ => Some(bf16),
    }
}

/// The GEMM input dtype a precision's linear layers run in.
fn ceiling_dtype<D: Device>(dev: &D, p: Precision, cfg: &Config) -> DType {
    match p {
        Precision::Fp8 => {
            duet_engine::fp8::Fp8Family::of_device(&dev.info())
                .dtypes(cfg.train.recipe.fp8_format)
                .0
        }
        other => other.activation_dtype(),
    }
}

/// TFLOP/s of one large square GEMM `C = X·Xᵀ` in `dtype` (random data; FP8 through
/// `gemm_fp8` with unit scales), timed over repeated launches between two synchronisations.
/// `None` when the backend cannot run that GEMM.
fn gemm_ceiling<D: Device>(dev: &D, dtype: DType) -> CliResult<Option<f64>> {
    let info = dev.info();
    let size: usize = if info.backend == "cpu" { 256 } else { 8192 };
    let reps = if info.backend == "cpu" { 3 } else { 20 };
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let host: Vec<f32> = (0..size * size)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let src = dev.upload_new(&host)?;
    drop(host);
    let mut x = dev.alloc(dtype, size * size)?;
    dev.cast(&src, &mut x, 1.0)?;
    drop(src);
    let out_dtype = if dtype.is_fp8() { DType::BF16 } else { dtype };
    let mut c = dev.alloc(out_dtype, size * size)?;
    let desc = GemmDesc::new(false, true, size, size, size);
    let scale_inv = dev.upload_new(&[1.0f32])?;
    let mut launch = || -> duet_device::Result<()> {
        if dtype.is_fp8() {
            dev.exec(GemmFp8 {
                desc: &desc,
                a: &x,
                b: &x,
                c: &mut c,
                scale_inv: &scale_inv,
                a_slot: 0,
                b_slot: 0,
            })
        } else {
            dev.exec(Gemm {
                desc: &desc,
                a: &x,
                b: &x,
                c: &mut c,
            })
        }
    };
    for _ in 0..2 {
        match launch() {
            Ok(()) => {}
            Err(DeviceError::Unsupported { .. }) | Err(DeviceError::InvalidArgument(_)) => {
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    dev.synchronize()?;
    let s = Instant::now();
    for _ in 0..reps {
        launch()?;
    }
    dev.synchronize()?;
    let secs = s.elapsed().as_secs_f64();
    Ok(Some(
        2.0 * (size as f64).powi(3) * reps as f64 / secs / 1e12,
    ))
}

/// Step times, throughput and peak memory of one configuration (the trainer is dropped
/// afterwards). Every step is timed on the host clock between two device synchronisations
/// (a step ends with the device idle, so this is the step's wall time); the steps are also
/// timed back to back with one synchronisation at the end, which gives the mean.
fn bench_one<D: Device>(
    dev: &Arc<D>,
    cfg: &Config,
    warmup: u64,
    iters: u64,
) -> CliResult<serde_json::Value> {
    let mut trainer = Trainer::new(dev.clone(), cfg.clone())?;
    for _ in 0..warmup {
        trainer.train_step()?;
    }
    dev.synchronize()?;
    dev.reset_peak_memory();
    let mut times = Vec::with_capacity(iters.min(1 << 16) as usize);
    let mut last_loss = f32::NAN;
    // Clocks and power after each timed step (outside its timing: the step has finished on
    // the device); the first reading, which may load the library, comes before the timing.
    let has_telemetry = dev.telemetry().is_some();
    let mut samples = Vec::new();
    for _ in 0..iters {
        let ms = dev.time_ms(|| -> CliResult<()> {
            last_loss = trainer.train_step()?.loss;
            Ok(())
        })?;
        times.push(ms);
        if has_telemetry {
            samples.extend(dev.telemetry());
        }
    }
    let s = Instant::now();
    for _ in 0..iters {
        trainer.train_step()?;
    }
    dev.synchronize()?;
    let mean_back_to_back = s.elapsed().as_secs_f64() * 1e3 / iters as f64;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let tokens = (cfg.train.data.batch * cfg.train.data.seq) as f64;
    let flops = train_flops(cfg);
    let info = dev.info();
    let mem = dev.memory_stats();
    let plan = trainer.memory_plan();
    Ok(serde_json::json!({
        "backend": info.backend,
        "device": info.name,
        "precision": cfg.train.recipe.precision.as_str(),
        "model": cfg.model,
        "batch": cfg.train.data.batch,
        "seq": cfg.train.data.seq,
        "warmup_steps": warmup,
        "iters": iters,
        "ms_per_step_median": median,
        "ms_per_step_min": times[0],
        "ms_per_step_mean_back_to_back": mean_back_to_back,
        "tokens_per_s": tokens / (median / 1e3),
        "flops_per_step": flops,
        "model_tflops": flops / (median / 1e3) / 1e12,
        "peak_memory_bytes": mem.peak,
        "memory_plan_bytes": plan.total(),
        "loss": last_loss,
        "timing": format!(
            "{} around each step (a step ends by reading its loss back)",
            dev.timer_kind()
        ),
        "graphs": cfg.train.execution.graphs,
        "step_recorded": trainer.step_recorded(),
        "gemm_autotune": cfg.train.execution.gemm_autotune,
        "fp8_fast_accum": cfg.train.recipe.fp8_fast_accum,
        "weight_grad_dtype": cfg.train.recipe.weight_grad_dtype,
        "recompute_gelu": cfg.train.execution.recompute_gelu,
        "logits_chunk_rows": trainer.model().logit_rows(),
        "telemetry": telemetry_summary(&samples),
        "git_rev": env!("DUET_GIT_REV"),
    }))
}

/// The device's clocks and power over a benchmark's timed steps (one reading after each):
/// medians and extremes of the readings and the share of readings with the clocks held down by
/// the power limit or by temperature; null without readings (a backend without telemetry).
fn telemetry_summary(samples: &[Telemetry]) -> serde_json::Value {
    if samples.is_empty() {
        return serde_json::Value::Null;
    }
    let n = samples.len();
    let median = |f: &dyn Fn(&Telemetry) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[n / 2]
    };
    let max = |f: &dyn Fn(&Telemetry) -> f64| samples.iter().map(f).fold(f64::MIN, f64::max);
    let min = |f: &dyn Fn(&Telemetry) -> f64| samples.iter().map(f).fold(f64::MAX, f64::min);
    let share =
        |f: &dyn Fn(&Telemetry) -> bool| samples.iter().filter(|t| f(t)).count() as f64 / n as f64;
    let clock = |t: &Telemetry| t.sm_clock_mhz as f64;
    let power = |t: &Telemetry| t.power_w;
    serde_json::json!({
        "samples": n,
        "sm_clock_mhz_median": median(&clock),
        "sm_clock_mhz_min": min(&clock),
        "sm_clock_mhz_max": max(&clock),
        "power_w_median": median(&power),
        "power_w_max": max(&power),
        // The share of power readings that are instantaneous (the others are the driver's
        // trailing average, about one second: a short run repeats one value).
        "power_instant_share": share(&|t| t.power_instant),
        "power_limit_w": median(&|t| t.power_limit_w),
        "temperature_c_max": max(&|t| t.temperature_c as f64),
        "power_capped_share": share(&|t| t.power_capped),
        "thermal_slowdown_share": share(&|t| t.thermal_slowdown),
    })
}

/// The bench table's note on a run's telemetry summary: the median SM clock, and how often the
/// power limit or heat held the clocks down; empty without readings.
fn telemetry_note(t: &serde_json::Value) -> String {
    let Some(mhz) = t["sm_clock_mhz_median"].as_f64() else {
        return String::new();
    };
    let mut note = format!("  {mhz:.0} MHz");
    for (key, what) in [
        ("power_capped_share", "power-capped"),
        ("thermal_slowdown_share", "thermal slowdown"),
    ] {
        let share = t[key].as_f64().unwrap_or(0.0);
        if share > 0.0 {
            note += &format!(", {what} {:.0}%", 100.0 * share);
        }
    }
    note
}

#[cfg(test)]
mod tests {
    use super::{Telemetry, telemetry_note, telemetry_summary};

    #[test]
    fn telemetry_summary_of_the_readings() {
        assert!(telemetry_summary(&[]).is_null());
        let t = |mhz: u32, w: f64, capped: bool| Telemetry {
            sm_clock_mhz: mhz,
            power_w: w,
            power_instant: true,
            power_limit_w: 700.0,
            temperature_c: mhz / 30,
            power_capped: capped,
            thermal_slowdown: false,
        };
        let s = telemetry_summary(&[
            t(1980, 420.5, false),
            t(1650, 699.0, true),
            t(1425, 701.0, true),
            t(1755, 650.0, true),
        ]);
        assert_eq!(s["samples"], 4);
        // The upper median of an even count, like the step times'.
        assert_eq!(s["sm_clock_mhz_median"], 1755.0);
        assert_eq!(s["sm_clock_mhz_min"], 1425.0);
        assert_eq!(s["sm_clock_mhz_max"], 1980.0);
        assert_eq!(s["power_w_median"], 699.0);
        assert_eq!(s["power_w_max"], 701.0);
        assert_eq!(s["power_limit_w"], 700.0);
        assert_eq!(s["temperature_c_max"], 66.0);
        assert_eq!(s["power_capped_share"], 0.75);
        assert_eq!(s["thermal_slowdown_share"], 0.0);
        assert_eq!(s["power_instant_share"], 1.0);
        let mut averaged = t(1980, 300.0, false);
        averaged.power_instant = false;
        assert_eq!(
            telemetry_summary(&[t(1980, 300.0, false), averaged])["power_instant_share"],
            0.5
        );
        // The bench table's note.
        assert_eq!(telemetry_note(&s), "  1755 MHz, power-capped 75%");
        assert_eq!(
            telemetry_note(&telemetry_summary(&[t(1980, 120.0, false)])),
            "  1980 MHz"
        );
        assert_eq!(telemetry_note(&serde_json::Value::Null), "");
    }
}
