//! One training run on a device (or one rank of a data-parallel group): builds the trainer,
//! prints what it runs, hands the loop to [`duet_engine::run`] and reports.

use super::outputs::{interrupted_path, open_log};
use super::{DEFAULT_LOG_EVERY, INTERRUPTED, RUN_SETTINGS_KEY, RunSettings, TrainOutcome};
use crate::CliResult;
use crate::backends::OnDevice;
use crate::cli_dist::RankTask;
use crate::settings::resolve_precision;
use duet_device::{Fused, human_bytes};
use duet_engine::checkpoint::{Checkpoint, files};
use duet_engine::run::{
    CurvePoint, FP8_REPORT_ENTRIES, LogKind, MetricsLog, RunPlan, RunSummary, StepLog,
    save_checkpoint,
};
use duet_engine::saves::{CheckpointDir, save_to};
use duet_engine::trace::{TraceHeader, TraceWriter};
use duet_engine::{Config, Precision, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Seconds as `1h02m03s` / `2m03s` / `3s`.
fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// One line per FP8 operand: scale and the first amax-history entries.
pub(super) fn print_fp8_report<D: Fused>(trainer: &Trainer<D>) {
    let report = match trainer.model().fp8_report(FP8_REPORT_ENTRIES) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warning: reading the fp8 scaling state back failed: {e}");
            None
        }
    };
    if let Some(ops) = report {
        eprintln!("fp8 delayed scaling (scale, amax history most recent first):");
        for o in ops {
            let hist: Vec<String> = o.amax_history.iter().map(|a| format!("{a:.4e}")).collect();
            eprintln!(
                "  {:<28} {:<10} scale {:>12.5e}  amax [{}]",
                o.name,
                o.dtype,
                o.scale,
                hist.join(", ")
            );
        }
    }
}

pub(super) struct TrainTask {
    pub(super) cfg: Config,
    pub(super) resume: Option<Checkpoint>,
    /// `--init-from`: the initial weights (instead of the seed's), for a new run.
    pub(super) init: Option<Vec<Vec<f32>>>,
    /// Opened (truncated, or appended to when resuming) once the model is built.
    pub(super) metrics: Option<MetricsLog>,
    pub(super) metrics_path: Option<PathBuf>,
    pub(super) trace: Option<PathBuf>,
    pub(super) out: Option<PathBuf>,
    pub(super) settings: RunSettings,
    pub(super) stop_after: Option<u64>,
    pub(super) strict: bool,
    pub(super) fp8_report: bool,
    pub(super) record_batches: Option<PathBuf>,
    /// Set when this process is one rank of a data-parallel run.
    pub(super) dp: Option<duet_engine::dist::DpOptions>,
    /// Rank 0 (or a single-process run): the one that logs and writes files.
    pub(super) is_main: bool,
}

impl RankTask for TrainTask {
    type Output = TrainOutcome;

    fn fingerprint(&self) -> String {
        format!(
            "{}\n{:?}\n{:?}",
            self.cfg.to_toml(),
            self.dp,
            self.resume.as_ref().map(|c| c.step)
        )
    }

    fn run_in_group<D: Fused>(
        self,
        dev: Arc<D>,
        comm: Arc<dyn duet_device::Collective<D>>,
    ) -> CliResult<TrainOutcome> {
        self.run_with(dev, Some(comm))
    }
}

impl OnDevice for TrainTask {
    type Output = TrainOutcome;

    fn run<D: Fused>(self, dev: Arc<D>) -> CliResult<TrainOutcome> {
        self.run_with(dev, None)
    }
}

impl TrainTask {
    /// The training run on `dev`; with `comm`, as one rank of a data-parallel group.
    fn run_with<D: Fused>(
        mut self,
        dev: Arc<D>,
        comm: Option<Arc<dyn duet_device::Collective<D>>>,
    ) -> CliResult<TrainOutcome> {
        let info = dev.info();
        resolve_precision(&mut self.cfg, &*dev, self.strict)?;
        let cfg = self.cfg.clone();
        let (m, t) = (&cfg.model, &cfg.train);
        let main = self.is_main;
        // Other ranks print nothing but errors.
        macro_rules! say {
            ($($arg:tt)*) => {
                if main {
                    eprintln!($($arg)*);
                }
            };
        }
        say!(
            "duet: {} on {} ({}) | {} | {} params: vocab {}, d_model {}, heads {}, ffn {}, layers {} | batch {} × seq {}, {} steps, lr {}{}",
            info.backend,
            info.name,
            info.arch,
            if t.recipe.precision == Precision::Fp8 {
                format!("fp8 ({})", t.recipe.delayed_scaling())
            } else {
                t.recipe.precision.to_string()
            },
            m.num_params(),
            m.vocab,
            m.d_model,
            m.heads,
            m.ffn,
            m.layers,
            t.data.batch,
            t.data.seq,
            t.steps,
            t.optimizer.lr,
            if t.data.data.is_empty() {
                String::new()
            } else {
                format!(" | data {}", t.data.describe())
            }
        );
        let resuming = self.resume.is_some();
        let dp = match (&comm, self.dp) {
            (Some(c), Some(o)) => Some((c.clone(), o)),
            _ => None,
        };
        let mut trainer = match (self.resume.take(), dp, self.init.take()) {
            (Some(mut ck), dp, _) => {
                // What a resume may change (settings::fixed_on_resume): the step count and the
                // whole execution group; the precision is the checkpoint's, resolved against
                // this device.
                ck.config.train.recipe.precision = cfg.train.recipe.precision;
                ck.config.train.steps = cfg.train.steps;
                ck.config.train.optimizer.schedule_steps = cfg.train.optimizer.schedule_steps;
                ck.config.train.execution = cfg.train.execution.clone();
                say!("resuming from step {}", ck.step);
                match dp {
                    Some((c, o)) => Trainer::from_checkpoint_data_parallel(dev.clone(), &ck, c, o)?,
                    None => Trainer::from_checkpoint(dev.clone(), &ck)?,
                }
            }
            (None, dp, Some(w)) => Trainer::from_init_weights(dev.clone(), cfg.clone(), &w, dp)?,
            (None, Some((c, o)), None) => {
                Trainer::new_data_parallel(dev.clone(), cfg.clone(), c, o)?
            }
            (None, None, None) => Trainer::new(dev.clone(), cfg.clone())?,
        };
        if let Some(d) = trainer.dist() {
            let w = d.world_size();
            say!(
                "data parallel: {w} ranks over {}, global batch {} = {w} × {}, {} gradient buckets reduced {}{}",
                d.comm().describe(),
                t.data.batch,
                t.data.batch / w,
                d.buckets().len(),
                if d.overlaps() {
                    "during the backward pass"
                } else {
                    "after the backward pass"
                },
                match d.sharded_state_bytes() {
                    Some(b) => format!(
                        ", ZeRO-1: this rank holds {} of optimizer state",
                        human_bytes(b)
                    ),
                    None => String::new(),
                }
            );
        }
        let plan = trainer.model().memory_plan().clone();
        say!(
            "memory plan: params {}, grads {}, optimizer {}, activations {}, scratch {}",
            human_bytes(plan.params),
            human_bytes(plan.grads),
            human_bytes(plan.optimizer),
            human_bytes(plan.activations),
            human_bytes(plan.scratch)
        );
        if t.execution.checkpoint_every > 0 {
            say!(
                "activation checkpointing: every {} blocks (segments recomputed in the backward pass)",
                t.execution.checkpoint_every
            );
        }
        if let Some(p) = &self.metrics_path {
            // --out's metrics.jsonl gets its CSV twin (a --metrics path elsewhere does not: a
            // file beside it might be the user's).
            let csv = self
                .out
                .as_ref()
                .filter(|d| d.join(files::METRICS) == *p)
                .map(|d| d.join(files::METRICS_CSV));
            let (log, dropped) =
                MetricsLog::open_with_csv(p, resuming.then(|| trainer.step()), csv.as_deref())?;
            if dropped > 0 {
                say!(
                    "{}: dropped {dropped} line(s) past the checkpoint's step {} (or cut off by a \
                     kill)",
                    p.display(),
                    trainer.step()
                );
            }
            self.metrics = Some(log);
        }
        if let Some(p) = &self.record_batches {
            trainer.record_batches(p)?;
        }
        let first_step = trainer.step();
        let last_step = match self.stop_after {
            Some(n) => (first_step + n).min(t.steps),
            None => t.steps,
        };
        // A terminal gets the progress bar; a batch job (stderr a file or pipe: tee, nohup,
        // Slurm, CI) gets a line every DEFAULT_LOG_EVERY steps unless --log-every says.
        let log_every = match self.settings.log_every {
            None if !std::io::stderr().is_terminal() => Some(DEFAULT_LOG_EVERY),
            l => l,
        };
        let bar = match log_every {
            None if main => {
                let bar = ProgressBar::new(t.steps);
                bar.set_position(first_step);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{bar:30} step {pos}/{len} | {msg} | {elapsed_precise} ETA {eta_precise}",
                    )
                    .expect("valid template"),
                );
                Some(bar)
            }
            _ => None,
        };
        let mut tracer = match self.trace.take() {
            Some(path) => {
                let w = open_log(&path, false, "trace")?;
                let header = TraceHeader {
                    kind: "header".into(),
                    duet_version: env!("CARGO_PKG_VERSION").into(),
                    git_rev: env!("DUET_GIT_REV").into(),
                    backend: info.backend.clone(),
                    device: info.name.clone(),
                    precision: t.recipe.precision.to_string(),
                    seed: t.data.seed,
                    config: cfg.clone(),
                    fp8_family: trainer.model().fp8_enabled().then(|| {
                        duet_engine::fp8::Fp8Family::of_device(&info)
                            .as_str()
                            .into()
                    }),
                };
                Some((path, TraceWriter::new(w, &header)?))
            }
            None => None,
        };
        // What would only fail after training, checked before it.
        let has_val = trainer.has_validation_data();
        let val_every = match self.settings.val_every {
            Some(n) => n,
            None if has_val => super::default_val_every(t.steps),
            None => 0,
        };
        if self.settings.val_every.is_none() && val_every > 0 {
            say!("validation every {val_every} steps (--val-every; 0: only at the end)");
        }
        if !has_val && self.settings.keep_best {
            say!(
                "note: --keep-best: this run has no validation data, so no best checkpoint is kept"
            );
        }
        if !has_val && val_every > 0 {
            return Err(format!(
                "--val-every: the synthetic task's held-out progressions do not fill one batch \
                 of {} (lower --batch, or raise --vocab / --max-stride)",
                t.data.batch
            )
            .into());
        }
        if !has_val {
            say!(
                "note: no validation loss at the end: the held-out progressions do not fill one \
                 batch of {}",
                t.data.batch
            );
        }
        let min_seq = duet_engine::train::PROMPT_LEN + duet_engine::train::GEN_LEN - 1;
        if main && t.data.eval_sequences > 0 && t.data.data.is_empty() && t.data.seq < min_seq {
            return Err(format!(
                "--eval-sequences: the generation check needs seq ≥ {min_seq} (prompt {} + {} \
                 generated), got {} (raise --seq, or --eval-sequences 0)",
                duet_engine::train::PROMPT_LEN,
                duet_engine::train::GEN_LEN,
                t.data.seq
            )
            .into());
        }
        // The run's settings go into every checkpoint saved into --out (the resume restores
        // them), with the resolved log cadence of a batch job kept as given.
        let settings_json = serde_json::to_string(&RunSettings {
            val_every: Some(val_every),
            ..self.settings.clone()
        })?;
        let saves = self.out.as_ref().map(|d| CheckpointDir {
            dir: d.clone(),
            keep: self.settings.keep,
            keep_best: self.settings.keep_best,
            stamp: vec![(RUN_SETTINGS_KEY.to_string(), settings_json.clone())],
        });
        let plan = RunPlan {
            last_step,
            val_every,
            save_every: self.settings.save_every,
            saves: saves.clone(),
            validate_at_saves: self.settings.keep_best && has_val,
            log_every: log_every.unwrap_or(0),
            is_main: main,
        };
        let (fp8_report, steps) = (self.fp8_report, t.steps);
        // The loss curve so far (a resumed run's from its metrics), redrawn at every save.
        let mut curve: Vec<CurvePoint> = self
            .metrics
            .as_ref()
            .map(|m| m.curve().to_vec())
            .unwrap_or_default();
        let plot_path = self.out.as_ref().map(|d| d.join(files::LOSS_PLOT));
        let mfu_peak = crate::cli_bench::nominal_peak_tflops(&info, t.recipe.precision);
        let flops_per_step = crate::cli_bench::train_flops(&cfg);
        let loop_start = Instant::now();
        let mut last_val: Option<(u64, f32)> = None;
        let mut on_step = |trainer: &Trainer<D>,
                           s: &StepLog,
                           saved: Option<&duet_engine::saves::Saved>|
         -> duet_engine::Result<()> {
            let r = &s.report;
            curve.push((r.step, r.loss, s.val_loss));
            if let Some(v) = s.val_loss {
                last_val = Some((r.step, v));
            }
            // The last validation loss stays in the bar until the next one.
            let val = last_val
                .map(|(st, v)| format!(" | val {v:.4} (step {st})"))
                .unwrap_or_default();
            let msg = format!("loss {:.4}{val} | {:.0} tok/s", r.loss, s.tokens_per_s);
            let line_due = log_every.is_some_and(|n| n > 0 && r.step.is_multiple_of(n));
            match &bar {
                Some(bar) => {
                    bar.set_message(msg);
                    bar.inc(1);
                }
                None if main && line_due => {
                    let scale = match r.loss_scale {
                        Some(ls) => format!(
                            " | loss scale {ls}{}",
                            if r.skipped { " (step skipped)" } else { "" }
                        ),
                        None => String::new(),
                    };
                    let mfu = match mfu_peak {
                        Some(peak) => format!(
                            " | MFU {:.1}%",
                            100.0 * flops_per_step / r.seconds.max(1e-9) / 1e12 / peak
                        ),
                        None => String::new(),
                    };
                    let done = r.step - first_step;
                    let eta = loop_start.elapsed().as_secs_f64() / done.max(1) as f64
                        * (last_step - r.step) as f64;
                    eprintln!(
                        "step {}/{steps} | loss {:.4} | lr {:.2e} | grad norm {:.3} | {:.1} \
                         ms/step | {:.0} tok/s{mfu}{scale} | ETA {}",
                        r.step,
                        r.loss,
                        r.lr,
                        r.grad_norm,
                        r.seconds * 1e3,
                        s.tokens_per_s,
                        hms(eta)
                    );
                    if fp8_report {
                        print_fp8_report(trainer);
                    }
                }
                _ => {}
            }
            if main
                && bar.is_none()
                && log_every.is_some()
                && let Some(v) = s.val_loss
            {
                eprintln!("step {}/{steps} | validation loss {v:.4}", r.step);
            }
            if let (Some(sv), true) = (saved, main) {
                if bar.is_none() && log_every.is_some() {
                    eprintln!(
                        "step {}/{steps} | checkpoint saved to {}{}",
                        r.step,
                        sv.path.display(),
                        sv.best
                            .map(|b| format!(" (best validation loss so far: {b:.4})"))
                            .unwrap_or_default()
                    );
                }
                if let Some(svg) = &plot_path
                    && let Err(e) = crate::plot::write_loss_plot(&curve, svg)
                {
                    eprintln!("warning: redrawing the loss plot failed: {e}");
                }
            }
            Ok(())
        };
        super::TRAINING_LOOPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let summary = duet_engine::run::run(
            &mut trainer,
            &plan,
            self.metrics.as_mut(),
            tracer.as_mut().map(|(_, tw)| tw),
            &INTERRUPTED,
            &mut on_step,
        );
        super::TRAINING_LOOPS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        let summary = summary?;
        let RunSummary {
            ran,
            last_loss,
            skipped,
            last_scale,
            interrupted,
            seconds: train_secs,
            log_failure,
            saved_step,
            last_val: loop_val,
        } = summary;
        if let Some(bar) = &bar {
            bar.finish();
        }
        // The log is closed here; its curve stays for the loss plot.
        let curve = self.metrics.take().map(MetricsLog::into_curve);
        let trace_path = tracer.take().map(|(path, _)| path);
        if let (Some(path), None) = (&trace_path, &log_failure) {
            eprintln!("trace written to {}", path.display());
        }
        let mem = dev.memory_stats();
        // Rank 0 reports; every rank still takes part in the collectives below.
        macro_rules! report {
            ($($arg:tt)*) => {
                if main {
                    println!($($arg)*);
                }
            };
        }
        report!(
            "trained {} steps (to step {}) in {:.1}s ({:.0} tokens/s), final loss {:.4}, peak memory {}",
            ran,
            trainer.step(),
            train_secs,
            (ran as usize * t.data.batch * t.data.seq) as f64 / train_secs.max(1e-9),
            last_loss,
            human_bytes(mem.peak)
        );
        if let Some(ls) = last_scale {
            report!("loss scale {ls} at the end; {skipped} step(s) skipped for inf/NaN gradients");
        }
        if self.fp8_report && main {
            print_fp8_report(&trainer);
        }
        // A failed log write stops the run as an interrupt does: the checkpoint is saved first.
        let stopped = interrupted || log_failure.is_some();
        let ck_path = match &self.out {
            Some(dir) => Some(dir.join(files::CHECKPOINT)),
            None if stopped => Some(interrupted_path()),
            None => None,
        };
        // Into --out: step-numbered, latest and best names (saves); elsewhere one file.
        let save = |trainer: &Trainer<D>,
                    p: &std::path::Path,
                    val: Option<f32>|
         -> duet_engine::Result<Option<duet_engine::saves::Saved>> {
            match &saves {
                Some(sv) => save_to(trainer, sv, val, main),
                None => save_checkpoint(trainer, p, main).map(|()| None),
            }
        };
        // The loss plot, drawn at the end, on interrupt and after a failed log write too.
        let draw_plot = |curve: &Option<Vec<CurvePoint>>| -> CliResult<()> {
            if let (Some(dir), Some(curve)) = (&self.out, curve)
                && main
            {
                let svg = dir.join(files::LOSS_PLOT);
                crate::plot::write_loss_plot(curve, &svg)?;
                println!("loss curve written to {}", svg.display());
            }
            Ok(())
        };
        let resume_cmd = |p: &std::path::Path| match &self.out {
            Some(dir) => format!("duet train --resume {0} --out {0}", dir.display()),
            None => format!("duet train --resume {}", p.display()),
        };
        if let Some(f) = log_failure {
            let (what, path) = match f.log {
                LogKind::Metrics => ("the metrics file", self.metrics_path.as_deref()),
                LogKind::Trace => ("the trace", trace_path.as_deref()),
            };
            let path = path.map(|p| p.display().to_string()).unwrap_or_default();
            let mut msg = format!(
                "writing {what} {path} failed at step {}: {}; training stopped after step {}",
                f.step,
                f.message,
                trainer.step()
            );
            let p = ck_path.expect("a stopped run always saves");
            if let Err(e) = draw_plot(&curve) {
                eprintln!("warning: drawing the loss plot failed: {e}");
            }
            match save(&trainer, &p, None) {
                Ok(_) => msg.push_str(&format!(
                    "; checkpoint at step {} saved to {}; {what} keeps its complete lines from \
                     before step {} (a resumed run appends from step {}); make room and resume \
                     with: {} (and the same log options)",
                    trainer.step(),
                    p.display(),
                    f.step,
                    trainer.step() + 1,
                    resume_cmd(&p)
                )),
                Err(e) => {
                    let kept = match saved_step {
                        Some(s) => format!("the checkpoint saved at step {s} is unchanged"),
                        None if p.exists() => format!("{} is unchanged", p.display()),
                        None => "no checkpoint was saved".to_string(),
                    };
                    msg.push_str(&format!(
                        "; saving the checkpoint to {} failed too: {e} ({kept})",
                        p.display()
                    ));
                }
            }
            return Err(msg.into());
        }
        // The final validation loss (the loop's own when it validated at this step), before
        // the save so that --keep-best sees it.
        let final_val = if ran > 0 && has_val && !interrupted {
            Some(match loop_val {
                Some((st, v)) if st == trainer.step() => v,
                _ => trainer.validation_loss()?,
            })
        } else {
            None
        };
        if let Some(p) = &ck_path {
            let saved = save(&trainer, p, final_val)?;
            let shown = saved.as_ref().map_or(p.clone(), |s| s.path.clone());
            report!(
                "checkpoint at step {} saved to {}{}",
                trainer.step(),
                shown.display(),
                match (&saved, &saves) {
                    (Some(s), Some(sv)) => format!(
                        " (and {}{})",
                        sv.latest().display(),
                        s.best
                            .map(|_| format!(", {}", sv.best().display()))
                            .unwrap_or_default()
                    ),
                    _ => String::new(),
                }
            );
        }
        if interrupted {
            draw_plot(&curve)?;
            let p = ck_path.expect("interrupted runs always save");
            say!(
                "interrupted at step {}; resume with: {}",
                trainer.step(),
                resume_cmd(&p)
            );
            return Ok(TrainOutcome::Interrupted);
        }
        if let Some(v) = final_val {
            match trainer.unigram_entropy() {
                Some(h) => report!(
                    "validation loss {v:.4} nats/token (the file's unigram entropy is {h:.4})"
                ),
                None => report!("validation loss {v:.4}"),
            }
        }
        draw_plot(&curve)?;
        // Generation uses no collectives: rank 0 alone runs it.
        if main && t.data.eval_sequences > 0 && t.data.data.is_empty() && trainer.step() == t.steps
        {
            let eval_start = Instant::now();
            let e = trainer.evaluate_generation(t.data.eval_sequences)?;
            println!(
                "greedy generation on {} held-out progressions (prompt {}, generate {}): {:.1}% exact, {:.2}% of tokens keep the stride ({:.1}s)",
                e.sequences,
                duet_engine::train::PROMPT_LEN,
                duet_engine::train::GEN_LEN,
                100.0 * e.accuracy(),
                100.0 * e.token_accuracy,
                eval_start.elapsed().as_secs_f64()
            );
        }
        Ok(TrainOutcome::Finished)
    }
}
