//! The loop of a training run: steps queued `loss_every` at a time and read back together,
//! the validation cadence, the metrics log, checkpoint saves and interrupts. The command line
//! (`duet train`) decides what to show; everything that makes a run resumable with the same
//! numbers happens here.

use crate::checkpoint::write_atomic;
use crate::dataset::io_message;
use crate::saves::{CheckpointDir, Saved, save_to};
use crate::trace::TraceWriter;
use crate::train::{StepReport, Trainer};
use crate::{EngineError, Result};
use duet_device::Device;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Amax-history entries the metrics log carries per FP8 operand.
pub const FP8_REPORT_ENTRIES: usize = 4;

/// What a run does between its steps.
#[derive(Clone, Debug, Default)]
pub struct RunPlan {
    /// The run stops after this step (`--steps`, or earlier with `--stop-after`).
    pub last_step: u64,
    /// Compute the validation loss every N steps (0: never inside the loop).
    pub val_every: u64,
    /// Save a checkpoint into `saves` every N steps before the last (0: never inside the
    /// loop; the caller saves at the end).
    pub save_every: u64,
    pub saves: Option<CheckpointDir>,
    /// Also compute the validation loss at every save step (`--keep-best` ranks the saves by
    /// it).
    pub validate_at_saves: bool,
    /// Steps at which the caller logs a line (0: none): a read-back group ends there, so the
    /// line sees its own step.
    pub log_every: u64,
    /// Rank 0, or a single-process run: the one that writes files.
    pub is_main: bool,
}

/// One step as the loop reports it.
#[derive(Clone, Debug)]
pub struct StepLog {
    pub report: StepReport,
    /// At the validation cadence.
    pub val_loss: Option<f32>,
    /// Seconds the run has trained at the end of this step: since the loop started, plus the
    /// time of the invocations before a resume (from the resumed metrics log).
    pub elapsed_s: f64,
    pub tokens_per_s: f64,
}

/// How the loop ended.
#[derive(Clone, Debug, Default)]
pub struct RunSummary {
    /// Steps this loop ran.
    pub ran: u64,
    pub last_loss: f32,
    /// Steps skipped for inf/NaN gradients, and the last loss scale (loss scaling only).
    pub skipped: u64,
    pub last_scale: Option<f32>,
    /// Stopped by the interrupt flag (after a step every rank finished).
    pub interrupted: bool,
    pub seconds: f64,
    /// A metrics or trace write failed (a full disk, a closed pipe): the run stopped after the
    /// step every rank finished, as an interrupt stops it, so that the caller saves a
    /// checkpoint and names the file.
    pub log_failure: Option<LogFailure>,
    /// The last step saved into `plan.saves` inside the loop.
    pub saved_step: Option<u64>,
    /// The last validation loss computed inside the loop, and its step.
    pub last_val: Option<(u64, f32)>,
    /// The run diverged without a non-finite loss: the gradient norm was not finite for
    /// [`NONFINITE_GRAD_STEPS`] consecutive steps that no loss scaler skipped (clipping turns
    /// such a gradient into a zero update, so the loss can stay finite and huge forever). The
    /// run stopped after the step every rank finished, as an interrupt stops it; the caller
    /// saves a checkpoint and fails.
    pub nonfinite_grads: Option<NonFiniteGrads>,
    /// A data file changed while the run read it (a shard truncated: a batch or the validation
    /// windows could not be read). The run stopped at the step before the batch, as an
    /// interrupt stops it, so that the caller saves a checkpoint and names the file. Only
    /// for a single process: a rank of a data-parallel run returns the error (the others
    /// would wait for it in a collective).
    pub data_changed: Option<DataChanged>,
}

/// A data file that changed while the run read it ([`RunSummary::data_changed`]).
#[derive(Clone, Debug)]
pub struct DataChanged {
    pub path: String,
    /// What changed (the [`EngineError::DataChanged`] message).
    pub message: String,
}

impl DataChanged {
    /// The failure in `e` when it is a data file that changed and `trainer` is a single process
    /// (which can stop and save); `e` itself otherwise.
    fn of<D: Device>(trainer: &Trainer<D>, e: EngineError) -> Result<DataChanged> {
        match e {
            EngineError::DataChanged { path, message } if trainer.dist().is_none() => {
                Ok(DataChanged { path, message })
            }
            e => Err(e),
        }
    }
}

/// How many consecutive steps with a non-finite gradient norm (outside the FP16 loss scaler's
/// skips) stop a run as diverged.
pub const NONFINITE_GRAD_STEPS: u64 = 5;

/// A run of consecutive steps whose gradient norm was not finite ([`RunSummary::nonfinite_grads`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NonFiniteGrads {
    /// The first and the last step of the run of steps.
    pub first: u64,
    pub last: u64,
}

impl NonFiniteGrads {
    /// Counts a step: `Some` once [`NONFINITE_GRAD_STEPS`] consecutive steps had a non-finite
    /// gradient norm that no loss scaler skipped; a finite norm or a skipped step starts over.
    fn observe(
        streak: &mut Option<NonFiniteGrads>,
        step: u64,
        grad_norm: f32,
        skipped: bool,
    ) -> Option<NonFiniteGrads> {
        if grad_norm.is_finite() || skipped {
            *streak = None;
            return None;
        }
        let s = streak.get_or_insert(NonFiniteGrads {
            first: step,
            last: step,
        });
        s.last = step;
        (s.last - s.first + 1 >= NONFINITE_GRAD_STEPS).then_some(*s)
    }
}

/// Which log a [`LogFailure`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogKind {
    Metrics,
    Trace,
}

/// A failed write to the metrics log or the trace.
#[derive(Clone, Debug)]
pub struct LogFailure {
    pub log: LogKind,
    /// The step whose line (or an earlier buffered one) could not be written: the file holds
    /// complete lines up to some step before it (a resume trims a half-written line).
    pub step: u64,
    pub message: String,
}

/// Runs a log write; an I/O error becomes a [`LogFailure`] (the log is given up: `*live` is
/// cleared), any other error (a device read for the record) is returned.
fn log_write(
    failure: &mut Option<LogFailure>,
    live: &mut bool,
    log: LogKind,
    step: u64,
    write: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if !*live {
        return Ok(());
    }
    match write() {
        Ok(()) => Ok(()),
        Err(EngineError::Io { message, .. }) => {
            *live = false;
            failure.get_or_insert(LogFailure { log, step, message });
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// How many steps to queue before reading their losses back: `loss_every`, cut short at the
/// run's last step and at the next multiple of each nonzero interval in `events` (log lines,
/// validations, checkpoint saves: those need the trainer at their step).
pub fn steps_to_read_back(step: u64, last_step: u64, loss_every: u64, events: &[u64]) -> u64 {
    let mut k = loss_every.max(1).min(last_step.saturating_sub(step)).max(1);
    for &every in events.iter().filter(|&&e| e > 0) {
        k = k.min(every - step % every);
    }
    k
}

/// Writes a checkpoint from rank 0. Under ZeRO every rank takes part in gathering the
/// optimizer state, so every rank must call this.
pub fn save_checkpoint<D: Device>(trainer: &Trainer<D>, path: &Path, is_main: bool) -> Result<()> {
    let zero = trainer.dist().is_some_and(|d| d.zero());
    if is_main || zero {
        let ck = trainer.checkpoint()?;
        if is_main {
            ck.save(path)?;
        }
    }
    Ok(())
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// The metrics log: one JSON object per step (`step`, `loss`, `lr`, `grad_norm`,
/// `tokens_per_s`, `elapsed_s`, `memory_bytes`, and `val_loss`, `loss_scale`/`skipped`, `fp8`
/// where they apply).
/// One logged step of the loss curve: (step, loss, validation loss).
pub type CurvePoint = (u64, f32, Option<f32>);

pub struct MetricsLog {
    path: PathBuf,
    w: BufWriter<File>,
    /// (step, loss, validation loss) of every line logged, those kept from a resumed run's file
    /// included: the loss curve is drawn from here, never by reading the file back (which may
    /// be a pipe: `--metrics /dev/stdout`).
    curve: Vec<CurvePoint>,
    /// A stream (see [`is_stream`]) is flushed line by line, so its lines never split around the
    /// run's other output.
    flush_each_line: bool,
    /// `elapsed_s` of the last line kept from a resumed run's file: the run's time before this
    /// invocation, so that `elapsed_s` counts the whole run (the checkpoint holds no wall
    /// clock, so that its bytes do not depend on the run's speed).
    elapsed_before: f64,
    /// The same records as CSV, for spreadsheets and plotting scripts ([`CSV_COLUMNS`]).
    csv: Option<(PathBuf, BufWriter<File>)>,
}

/// The columns of the metrics CSV (`--out`'s metrics.csv), one row per metrics line; empty
/// cells where a value does not apply (no validation at that step, no loss scaler).
pub const CSV_COLUMNS: [&str; 9] = [
    "step",
    "loss",
    "val_loss",
    "lr",
    "grad_norm",
    "tokens_per_s",
    "elapsed_s",
    "memory_bytes",
    "loss_scale",
];

/// One CSV row of a metrics record (a JSON object).
fn csv_row(v: &serde_json::Value) -> String {
    CSV_COLUMNS
        .iter()
        .map(|c| match &v[*c] {
            serde_json::Value::Null => String::new(),
            x => x.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The process's own stdout or stderr when `path` names it (`/dev/stdout`, `/dev/fd/1`,
/// `/proc/self/fd/1`, and stderr's): written through the same open file (a duplicate of the
/// descriptor, sharing its offset) instead of reopening the path, which would give a second
/// offset into a redirected file and overwrite the run's printed lines or be overwritten by them.
fn own_std_stream(path: &Path) -> Option<std::io::Result<File>> {
    use std::os::fd::AsFd;
    let s = path.to_str()?;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned().map(File::from);
    match s {
        "/dev/stdout" | "/dev/fd/1" | "/proc/self/fd/1" => Some(dup(std::io::stdout().as_fd())),
        "/dev/stderr" | "/dev/fd/2" | "/proc/self/fd/2" => Some(dup(std::io::stderr().as_fd())),
        _ => None,
    }
}

/// Whether `path` is a stream to write to and never read back, truncate or trim: a pipe, a
/// terminal or another device, or anything named under /dev or /proc (`/dev/stdout` redirected
/// to a file is a regular file, which truncating would cut the run's own printed lines from).
fn is_stream(path: &Path) -> bool {
    path.starts_with("/dev")
        || path.starts_with("/proc")
        || std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

impl MetricsLog {
    /// Opens `path`: truncated for a new run; for a run resumed at `resume_step`, first cut to
    /// the complete lines up to that step (a killed run may have logged further, or half a
    /// line; the resumed run logs those steps again, with the same values), then appended to.
    /// Returns the log and the number of lines dropped.
    pub fn open(path: &Path, resume_step: Option<u64>) -> Result<(Self, usize)> {
        Self::open_with_csv(path, resume_step, None)
    }

    /// [`MetricsLog::open`], also writing every record as a CSV row to `csv` (rewritten from
    /// the kept lines when resuming, so the two files always hold the same steps).
    pub fn open_with_csv(
        path: &Path,
        resume_step: Option<u64>,
        csv: Option<&Path>,
    ) -> Result<(Self, usize)> {
        // A pipe or device (`/dev/stdout`) is only written: nothing to trim or read back.
        let regular = !is_stream(path);
        let (dropped, curve, kept) = match resume_step {
            Some(step) if regular => Self::trim(path, step)?,
            _ => (0, Vec::new(), Vec::new()),
        };
        let elapsed_before = kept
            .last()
            .and_then(|v| v["elapsed_s"].as_f64())
            .unwrap_or(0.0);
        let csv = match csv {
            Some(p) => {
                let mut text = CSV_COLUMNS.join(",");
                text.push('\n');
                for v in &kept {
                    text.push_str(&csv_row(v));
                    text.push('\n');
                }
                write_atomic(p, text.as_bytes()).map_err(|e| {
                    io_error(
                        p,
                        format!("cannot write the metrics CSV: {}", io_message(&e)),
                    )
                })?;
                let f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(p)
                    .map_err(|e| {
                        io_error(
                            p,
                            format!("cannot open the metrics CSV: {}", io_message(&e)),
                        )
                    })?;
                Some((p.to_path_buf(), BufWriter::new(f)))
            }
            None => None,
        };
        let append = resume_step.is_some() || !regular;
        let f = match own_std_stream(path) {
            Some(f) => f,
            None => std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(path),
        }
        .map_err(|e| {
            io_error(
                path,
                format!("cannot create the metrics file: {}", io_message(&e)),
            )
        })?;
        let log = Self {
            path: path.to_path_buf(),
            w: BufWriter::new(f),
            curve,
            flush_each_line: !regular,
            elapsed_before,
            csv,
        };
        Ok((log, dropped))
    }

    /// Seconds the run had trained before this invocation (from the resumed metrics file).
    pub fn elapsed_before(&self) -> f64 {
        self.elapsed_before
    }

    /// Cuts the file to its complete lines up to `step`; returns the lines dropped, the curve
    /// of those kept and the kept step records.
    fn trim(path: &Path, step: u64) -> Result<(usize, Vec<CurvePoint>, Vec<serde_json::Value>)> {
        let Ok(text) = std::fs::read_to_string(path) else {
            // Missing or unreadable: opening it reports what matters.
            return Ok((0, Vec::new(), Vec::new()));
        };
        let mut kept = String::with_capacity(text.len());
        let mut dropped = 0usize;
        let mut curve = Vec::new();
        let mut records = Vec::new();
        for line in text.split_inclusive('\n') {
            let v = serde_json::from_str::<serde_json::Value>(line);
            let keep = v
                .as_ref()
                .is_ok_and(|v| v["step"].as_u64().is_none_or(|s| s <= step));
            if keep {
                kept.push_str(line.trim_end_matches('\n'));
                kept.push('\n');
                if let Ok(v) = &v
                    && let (Some(s), Some(l)) = (v["step"].as_u64(), v["loss"].as_f64())
                {
                    curve.push((s, l as f32, v["val_loss"].as_f64().map(|x| x as f32)));
                    records.push(v.clone());
                }
            } else if !line.trim().is_empty() {
                dropped += 1;
            }
        }
        if kept != text {
            write_atomic(path, kept.as_bytes())
                .map_err(|e| io_error(path, format!("cannot rewrite: {}", io_message(&e))))?;
        }
        Ok((dropped, curve, records))
    }

    /// (step, loss, validation loss) of every logged step, in order.
    pub fn curve(&self) -> &[CurvePoint] {
        &self.curve
    }

    /// Closes the log (its buffered lines are written first; an error there was reported by the
    /// run's last flush) and keeps its curve.
    pub fn into_curve(mut self) -> Vec<CurvePoint> {
        let _ = self.flush();
        std::mem::take(&mut self.curve)
    }

    fn write<D: Device>(&mut self, trainer: &Trainer<D>, s: &StepLog) -> Result<()> {
        let r = &s.report;
        let mut line = serde_json::json!({
            "step": r.step, "loss": r.loss, "lr": r.lr, "grad_norm": r.grad_norm,
            "tokens_per_s": s.tokens_per_s, "elapsed_s": s.elapsed_s,
            "memory_bytes": trainer.model().device().memory_stats().current,
        });
        if let Some(v) = s.val_loss {
            line["val_loss"] = v.into();
        }
        if let Some(ls) = r.loss_scale {
            line["loss_scale"] = ls.into();
            line["skipped"] = r.skipped.into();
        }
        if let Some(ops) = trainer.model().fp8_report(FP8_REPORT_ENTRIES)? {
            line["fp8"] = serde_json::to_value(ops).map_err(|e| io_error(&self.path, e))?;
        }
        self.curve.push((r.step, r.loss, s.val_loss));
        writeln!(self.w, "{line}").map_err(|e| io_error(&self.path, io_message(&e)))?;
        if let Some((p, w)) = &mut self.csv {
            writeln!(w, "{}", csv_row(&line)).map_err(|e| io_error(p, io_message(&e)))?;
        }
        if self.flush_each_line {
            self.flush()?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.w
            .flush()
            .map_err(|e| io_error(&self.path, io_message(&e)))?;
        if let Some((p, w)) = &mut self.csv {
            w.flush().map_err(|e| io_error(p, io_message(&e)))?;
        }
        Ok(())
    }
}

/// The caller's hook after each step (and its save, if it had one).
pub type OnStep<'a, D> = dyn FnMut(&Trainer<D>, &StepLog, Option<&Saved>) -> Result<()> + 'a;

/// Runs `trainer` to `plan.last_step`: queues steps and reads them back together, writes the
/// trace and the metrics of every step, validates and saves at their cadence, calls `on_step`
/// for each step after its save (the caller's progress display; with what the save did), and
/// stops early, after a step every rank
/// finished, once `interrupt` is set. A single process whose data file changed under it
/// stops at the step before the batch it could not read ([`RunSummary::data_changed`]).
pub fn run<D: Device, W: Write>(
    trainer: &mut Trainer<D>,
    plan: &RunPlan,
    mut metrics: Option<&mut MetricsLog>,
    mut trace: Option<&mut TraceWriter<W>>,
    interrupt: &AtomicBool,
    on_step: &mut OnStep<'_, D>,
) -> Result<RunSummary> {
    let start = Instant::now();
    // elapsed_s counts the whole run: the time of the invocations before a resume too.
    let before = metrics.as_ref().map_or(0.0, |m| m.elapsed_before());
    let first_step = trainer.step();
    let mut sum = RunSummary {
        last_loss: f32::NAN,
        ..RunSummary::default()
    };
    // Steps are queued `loss_every` at a time and their losses read back together, except
    // where a step's own device state is needed right after it: the trace records the model
    // after every step, and the metrics log carries every step's FP8 scaling state. Ranks
    // of a data-parallel run (which synchronise every step anyway) go one step at a time,
    // so that all of them check for an interrupt after the same step.
    let per_step = trace.is_some()
        || (metrics.is_some() && trainer.model().fp8_enabled())
        || trainer.dist().is_some();
    let save_every = if plan.saves.is_some() {
        plan.save_every
    } else {
        0
    };
    let events = [plan.val_every, save_every, plan.log_every];
    let loss_every = trainer.config().train.execution.loss_every;
    // Whether each log is still written (a failed write gives it up).
    let (mut metrics_live, mut trace_live) = (metrics.is_some(), trace.is_some());
    let mut failure: Option<LogFailure> = None;
    let mut streak: Option<NonFiniteGrads> = None;
    while trainer.step() < plan.last_step {
        let k = if per_step {
            1
        } else {
            steps_to_read_back(trainer.step(), plan.last_step, loss_every, &events)
        };
        let reports = match trainer.train_steps(k as usize) {
            Ok(r) => r,
            Err(e) => {
                // A data file that changed (any other error is returned): no step of the call
                // ran, the trainer is at the step before the batch it could not read.
                sum.data_changed = Some(DataChanged::of(trainer, e)?);
                break;
            }
        };
        let read_back = start.elapsed().as_secs_f64();
        let queued = reports.len();
        for (i, r) in reports.into_iter().enumerate() {
            sum.skipped += r.skipped as u64;
            if sum.nonfinite_grads.is_none() {
                sum.nonfinite_grads =
                    NonFiniteGrads::observe(&mut streak, r.step, r.grad_norm, r.skipped);
            }
            sum.last_scale = r.loss_scale;
            if let Some(tw) = trace.as_deref_mut() {
                log_write(
                    &mut failure,
                    &mut trace_live,
                    LogKind::Trace,
                    r.step,
                    || {
                        tw.record(
                            trainer.model(),
                            r.step,
                            r.loss,
                            r.grad_norm,
                            r.lr,
                            r.loss_scale,
                        )
                    },
                )?;
            }
            sum.last_loss = r.loss;
            let save_step = save_every > 0 && r.step.is_multiple_of(save_every);
            let val_loss = validate(trainer, plan, r.step, save_step, &mut sum)?;
            // The earlier steps of a read-back group ended before it (each took `seconds`).
            let elapsed_s = before
                + match queued - 1 - i {
                    0 => start.elapsed().as_secs_f64(),
                    later => (read_back - later as f64 * r.seconds).max(0.0),
                };
            let log = StepLog {
                tokens_per_s: r.tokens as f64 / r.seconds.max(1e-9),
                report: r,
                val_loss,
                elapsed_s,
            };
            if let Some(m) = metrics.as_deref_mut() {
                let step = log.report.step;
                log_write(
                    &mut failure,
                    &mut metrics_live,
                    LogKind::Metrics,
                    step,
                    || m.write(trainer, &log),
                )?;
            }
            let step = log.report.step;
            let mut saved: Option<Saved> = None;
            if let Some(saves) = &plan.saves
                && save_every > 0
                && step.is_multiple_of(save_every)
                && step < plan.last_step
            {
                // A read-back group ends at every save step, so the trainer is at this step.
                debug_assert_eq!(trainer.step(), step);
                // The metrics reach at least the checkpoint's step on disk (a kill after
                // this leaves nothing missing; a resume trims what runs ahead).
                if let Some(m) = metrics.as_deref_mut() {
                    log_write(
                        &mut failure,
                        &mut metrics_live,
                        LogKind::Metrics,
                        step,
                        || m.flush(),
                    )?;
                }
                saved = save_to(trainer, saves, log.val_loss, plan.is_main)?;
                sum.saved_step = Some(step);
            }
            on_step(trainer, &log, saved.as_ref())?;
        }
        // Every rank stops after the same step: at an interrupt, and when rank 0 could not
        // write its logs (the caller saves a checkpoint and names the file).
        let failed =
            failure.is_some() || sum.nonfinite_grads.is_some() || sum.data_changed.is_some();
        let stop = interrupt.load(Ordering::SeqCst) || failed;
        if trainer.any_rank(stop)? {
            sum.interrupted = interrupt.load(Ordering::SeqCst) || !failed;
            break;
        }
    }
    flush_logs(
        trainer.step(),
        metrics,
        trace,
        &mut failure,
        [&mut metrics_live, &mut trace_live],
    )?;
    sum.log_failure = failure;
    sum.ran = trainer.step() - first_step;
    sum.seconds = start.elapsed().as_secs_f64();
    Ok(sum)
}

/// The validation loss at `step` of [`run`] when it is due there (the validation cadence, or
/// a save step that `--keep-best` ranks), recorded in `sum`. None when not due, or when its
/// windows could not be read (`sum.data_changed`: the run stops after this group of steps).
fn validate<D: Device>(
    trainer: &mut Trainer<D>,
    plan: &RunPlan,
    step: u64,
    save_step: bool,
    sum: &mut RunSummary,
) -> Result<Option<f32>> {
    let due = (plan.val_every > 0 && step.is_multiple_of(plan.val_every))
        || (plan.validate_at_saves && save_step && step < plan.last_step);
    if !due {
        return Ok(None);
    }
    match trainer.validation_loss() {
        Ok(v) => {
            sum.last_val = Some((step, v));
            Ok(Some(v))
        }
        Err(e) => {
            let failure = DataChanged::of(trainer, e)?;
            sum.data_changed.get_or_insert(failure);
            Ok(None)
        }
    }
}

/// The end of [`run`]: the metrics log and the trace flushed (each only while it is `live`).
fn flush_logs<W: Write>(
    step: u64,
    metrics: Option<&mut MetricsLog>,
    trace: Option<&mut TraceWriter<W>>,
    failure: &mut Option<LogFailure>,
    [metrics_live, trace_live]: [&mut bool; 2],
) -> Result<()> {
    if let Some(m) = metrics {
        log_write(failure, metrics_live, LogKind::Metrics, step, || m.flush())?;
    }
    if let Some(tw) = trace {
        log_write(failure, trace_live, LogKind::Trace, step, || tw.flush())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{NONFINITE_GRAD_STEPS, NonFiniteGrads, steps_to_read_back};

    /// Issue 51 item 16: consecutive non-finite gradient norms stop the run; a finite norm or
    /// a step the loss scaler skipped starts the count over.
    #[test]
    fn consecutive_nonfinite_grad_norms_are_divergence() {
        let mut streak = None;
        let mut hit = None;
        for step in 1..=20u64 {
            // Steps 3–5 inf, step 6 finite, step 7 inf but skipped by the scaler, 8.. inf.
            let (norm, skipped) = match step {
                3..=5 => (f32::INFINITY, false),
                7 => (f32::NAN, true),
                8.. => (f32::NAN, false),
                _ => (1.0, false),
            };
            if let Some(h) = NonFiniteGrads::observe(&mut streak, step, norm, skipped) {
                hit = Some(h);
                break;
            }
        }
        assert_eq!(
            hit,
            Some(NonFiniteGrads {
                first: 8,
                last: 8 + NONFINITE_GRAD_STEPS - 1
            })
        );
    }

    #[test]
    fn read_back_groups_end_at_every_event_and_the_last_step() {
        // No events: loss_every at a time, cut at the end.
        assert_eq!(steps_to_read_back(0, 100, 10, &[0, 0, 0]), 10);
        assert_eq!(steps_to_read_back(95, 100, 10, &[0, 0, 0]), 5);
        // The next log line (every 4), validation (every 7) or save (every 3).
        assert_eq!(steps_to_read_back(0, 100, 10, &[0, 0, 4]), 4);
        assert_eq!(steps_to_read_back(5, 100, 10, &[7, 0, 0]), 2);
        assert_eq!(steps_to_read_back(4, 100, 10, &[7, 3, 0]), 2);
        // At an event step, the group runs to the next one.
        assert_eq!(steps_to_read_back(8, 100, 10, &[0, 0, 4]), 4);
        // loss_every 1 is one step at a time.
        assert_eq!(steps_to_read_back(0, 100, 1, &[50, 0, 0]), 1);
        // Every group is at least one step.
        assert_eq!(steps_to_read_back(100, 100, 10, &[]), 1);
    }
}
