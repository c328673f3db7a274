//! One training run on a device (or one rank of a data-parallel group): builds the trainer,
//! prints what it runs ([`super::report`]), hands the loop to [`duet_engine::run`] and reports.

use super::outputs::{interrupted_path, open_log};
use super::progress::{self, Progress};
use super::report;
use super::{INTERRUPTED, RUN_SETTINGS_KEY, RunSettings, TrainOutcome};
use crate::CliResult;
use crate::backends::OnDevice;
use crate::cli_dist::RankTask;
use crate::settings::resolve_precision;
use duet_device::{Collective, Device, DeviceInfo};
use duet_engine::checkpoint::{Checkpoint, files};
use duet_engine::run::{
    CurvePoint, DataChanged, LogFailure, LogKind, MetricsLog, NONFINITE_GRAD_STEPS, NonFiniteGrads,
    RunPlan, RunSummary, StepLog, save_checkpoint,
};
use duet_engine::saves::{CheckpointDir, Saved, save_to};
use duet_engine::trace::{TraceHeader, TraceWriter};
use duet_engine::{Config, Trainer};
use indicatif::ProgressBar;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

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
    /// `--sample-every`: the samples printed during the loop.
    pub(super) samples: Option<crate::cli_generate::TrainingSamples>,
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

    fn run_in_group<D: Device>(
        self,
        dev: Arc<D>,
        comm: Arc<dyn duet_device::Collective<D>>,
    ) -> CliResult<TrainOutcome> {
        self.run_with(dev, Some(comm))
    }
}

impl OnDevice for TrainTask {
    type Output = TrainOutcome;

    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<TrainOutcome> {
        self.run_with(dev, None)
    }
}

/// The trace file being written, and where.
type Tracer = (PathBuf, TraceWriter<BufWriter<File>>);

/// What the loop leaves for the end of the run ([`TrainTask::end_run`]).
struct RunEnd {
    summary: RunSummary,
    /// The metrics log's loss curve (the log closed), for the loss plot.
    curve: Option<Vec<CurvePoint>>,
    /// The trace written (closed).
    trace_path: Option<PathBuf>,
    /// Where the checkpoints go in `--out`.
    saves: Option<CheckpointDir>,
    /// Whether the run has validation data.
    has_val: bool,
}

impl TrainTask {
    /// The training run on `dev`; with `comm`, as one rank of a data-parallel group.
    fn run_with<D: Device>(
        mut self,
        dev: Arc<D>,
        comm: Option<Arc<dyn Collective<D>>>,
    ) -> CliResult<TrainOutcome> {
        let info = dev.info();
        resolve_precision(&mut self.cfg, &*dev, self.strict)?;
        let cfg = self.cfg.clone();
        let t = &cfg.train;
        let main = self.is_main;
        // Other ranks print nothing but errors.
        if main {
            report::print_banner(&info, &cfg);
        }
        let resuming = self.resume.is_some();
        let mut trainer = self.build_trainer(&dev, comm.as_ref(), &cfg)?;
        if main {
            report::print_setup(&trainer, t);
        }
        self.open_metrics(&trainer, resuming)?;
        if let Some(p) = &self.record_batches {
            trainer.record_batches(p)?;
        }
        let first_step = trainer.step();
        let last_step = match self.stop_after {
            Some(n) => (first_step + n).min(t.steps),
            None => t.steps,
        };
        let log_every = progress::log_cadence(self.settings.log_every);
        let mut tracer = self.open_trace(&info, &trainer)?;
        // What would only fail after training, checked before it.
        let (has_val, val_every) = self.validation_cadence(&trainer)?;
        self.check_generation_fits()?;
        let saves = self.checkpoint_dir(val_every)?;
        // A resumed run killed between its latest and best links gets its best back.
        if let Some(sv) = saves.as_ref().filter(|_| main)
            && let Some(v) = sv.repair_best()?
        {
            eprintln!(
                "note: {} now holds the latest checkpoint (validation loss {v:.4}, better than \
                 the best recorded: the previous run stopped before linking it)",
                sv.best().display()
            );
        }
        let plan = RunPlan {
            last_step,
            val_every,
            save_every: self.settings.save_every,
            saves: saves.clone(),
            validate_at_saves: self.settings.keep_best && has_val,
            log_every: log_every.unwrap_or(0),
            is_main: main,
        };
        // The bar is drawn from here on: every line before the loop is printed above, not
        // through, an empty bar.
        let bar = match log_every {
            None if main => Some(progress::progress_bar(t.steps, first_step)),
            _ => None,
        };
        let mut progress = self.progress(&info, &plan, bar, log_every, first_step);
        let summary = self.run_loop(&mut trainer, &plan, &mut tracer, &mut progress)?;
        progress.finish(trainer.step() >= t.steps);
        // The log is closed here; its curve stays for the loss plot.
        let curve = self.metrics.take().map(MetricsLog::into_curve);
        let trace_path = tracer.take().map(|(path, _)| path);
        let end = RunEnd {
            summary,
            curve,
            trace_path,
            saves,
            has_val,
        };
        self.end_run(&*dev, &mut trainer, end)
    }

    /// The loop's progress display: `bar` or lines every `log_every` steps, from `first_step`
    /// to the plan's last.
    fn progress(
        &self,
        info: &DeviceInfo,
        plan: &RunPlan,
        bar: Option<ProgressBar>,
        log_every: Option<u64>,
        first_step: u64,
    ) -> Progress {
        let t = &self.cfg.train;
        Progress {
            bar,
            log_every,
            main: self.is_main,
            steps: t.steps,
            first_step,
            last_step: plan.last_step,
            // The loss curve so far (a resumed run's from its metrics), redrawn at every save.
            curve: self
                .metrics
                .as_ref()
                .map(|m| m.curve().to_vec())
                .unwrap_or_default(),
            plot_path: self.out.as_ref().map(|d| d.join(files::LOSS_PLOT)),
            mfu_peak: crate::cli_bench::nominal_peak_tflops(info, t.recipe.precision),
            flops_per_step: crate::cli_bench::train_flops(&self.cfg),
            fp8_report: self.fp8_report,
            loop_start: Instant::now(),
            last_val: None,
        }
    }

    /// The training loop ([`duet_engine::run::run`]) to the plan's last step, counted in
    /// [`super::TRAINING_LOOPS`] while it runs, with `progress` after every step.
    fn run_loop<D: Device>(
        &mut self,
        trainer: &mut Trainer<D>,
        plan: &RunPlan,
        tracer: &mut Option<Tracer>,
        progress: &mut Progress,
    ) -> duet_engine::Result<RunSummary> {
        super::TRAINING_LOOPS.fetch_add(1, SeqCst);
        let summary = duet_engine::run::run(
            trainer,
            plan,
            self.metrics.as_mut(),
            tracer.as_mut().map(|(_, tw)| tw),
            &INTERRUPTED,
            &mut |trainer: &Trainer<D>, s: &StepLog, saved: Option<&Saved>| {
                progress.on_step(trainer, s, saved)?;
                match self.samples.as_mut() {
                    Some(samples) => samples.on_step(trainer, s, progress.bar.as_ref()),
                    None => Ok(()),
                }
            },
        );
        super::TRAINING_LOOPS.fetch_sub(1, SeqCst);
        summary
    }

    /// The trainer: from the checkpoint (`--resume`), from `--init-from`'s weights or from the
    /// seed; with `comm` and the task's options, as one rank of a data-parallel group.
    fn build_trainer<D: Device>(
        &mut self,
        dev: &Arc<D>,
        comm: Option<&Arc<dyn Collective<D>>>,
        cfg: &Config,
    ) -> CliResult<Trainer<D>> {
        let dp = match (comm, self.dp) {
            (Some(c), Some(o)) => Some((c.clone(), o)),
            _ => None,
        };
        Ok(match (self.resume.take(), dp, self.init.take()) {
            (Some(mut ck), dp, _) => {
                // What a resume may change (settings::fixed_on_resume): the step count and the
                // whole execution group; the precision is the checkpoint's, resolved against
                // this device.
                ck.config.train.recipe.precision = cfg.train.recipe.precision;
                ck.config.train.steps = cfg.train.steps;
                ck.config.train.optimizer.schedule_steps = cfg.train.optimizer.schedule_steps;
                ck.config.train.execution = cfg.train.execution.clone();
                if self.is_main {
                    eprintln!("resuming from step {}", ck.step);
                }
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
        })
    }

    /// Opens the metrics log (when there is one) into `self.metrics`: truncated, or when
    /// `resuming` kept up to the trainer's step and appended to.
    fn open_metrics<D: Device>(&mut self, trainer: &Trainer<D>, resuming: bool) -> CliResult<()> {
        let Some(p) = &self.metrics_path else {
            return Ok(());
        };
        // --out's metrics.jsonl gets its CSV twin (a --metrics path elsewhere does not: a
        // file beside it might be the user's).
        let csv = self
            .out
            .as_ref()
            .filter(|d| d.join(files::METRICS) == *p)
            .map(|d| d.join(files::METRICS_CSV));
        let (log, dropped) =
            MetricsLog::open_with_csv(p, resuming.then(|| trainer.step()), csv.as_deref())?;
        if dropped > 0 && self.is_main {
            eprintln!(
                "{}: dropped {dropped} line(s) past the checkpoint's step {} (or cut off by a \
                 kill)",
                p.display(),
                trainer.step()
            );
        }
        self.metrics = Some(log);
        Ok(())
    }

    /// Creates the `--trace` file (when given) and writes its header.
    fn open_trace<D: Device>(
        &mut self,
        info: &DeviceInfo,
        trainer: &Trainer<D>,
    ) -> CliResult<Option<Tracer>> {
        let Some(path) = self.trace.take() else {
            return Ok(None);
        };
        let t = &self.cfg.train;
        let w = open_log(&path, false, "trace")?;
        let header = TraceHeader {
            kind: "header".into(),
            duet_version: env!("CARGO_PKG_VERSION").into(),
            git_rev: env!("DUET_GIT_REV").into(),
            backend: info.backend.clone(),
            device: info.name.clone(),
            precision: t.recipe.precision.to_string(),
            seed: t.data.seed,
            config: self.cfg.clone(),
            fp8_family: match trainer.model().fp8_enabled() {
                true => Some(t.recipe.fp8_family.resolve(info)?.as_str().into()),
                false => None,
            },
        };
        Ok(Some((path, TraceWriter::new(w, &header)?)))
    }

    /// Whether the run has validation data, and its validation cadence (`--val-every`, else
    /// the default for its length): notes on them, and an error where a cadence was asked of
    /// a run that cannot validate.
    fn validation_cadence<D: Device>(&self, trainer: &Trainer<D>) -> CliResult<(bool, u64)> {
        let t = &self.cfg.train;
        let main = self.is_main;
        let has_val = trainer.has_validation_data();
        let val_every = match self.settings.val_every {
            Some(n) => n,
            None if has_val => super::default_val_every(t.steps),
            None => 0,
        };
        if self.settings.val_every.is_none() && val_every > 0 && main {
            eprintln!("validation every {val_every} steps (--val-every; 0: only at the end)");
        }
        if !has_val && self.settings.keep_best && main {
            eprintln!(
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
        if !has_val && main {
            eprintln!(
                "note: no validation loss at the end: the held-out progressions do not fill one \
                 batch of {}",
                t.data.batch
            );
        }
        Ok((has_val, val_every))
    }

    /// The generation check at the end (synthetic task, rank 0) needs a prompt and its
    /// generated tokens to fit in `--seq`.
    fn check_generation_fits(&self) -> CliResult<()> {
        let t = &self.cfg.train;
        let min_seq = duet_engine::train::PROMPT_LEN + duet_engine::train::GEN_LEN - 1;
        if self.is_main
            && t.data.eval_sequences > 0
            && t.data.data.is_empty()
            && t.data.seq < min_seq
        {
            return Err(format!(
                "--eval-sequences: the generation check needs seq ≥ {min_seq} (prompt {} + {} \
                 generated), got {} (raise --seq, or --eval-sequences 0)",
                duet_engine::train::PROMPT_LEN,
                duet_engine::train::GEN_LEN,
                t.data.seq
            )
            .into());
        }
        Ok(())
    }

    /// Where `--out`'s checkpoints go, each stamped with the run's settings (`val_every`
    /// resolved).
    fn checkpoint_dir(&self, val_every: u64) -> CliResult<Option<CheckpointDir>> {
        // The run's settings go into every checkpoint saved into --out (the resume restores
        // them), with the resolved log cadence of a batch job kept as given.
        let settings_json = serde_json::to_string(&RunSettings {
            val_every: Some(val_every),
            ..self.settings.clone()
        })?;
        Ok(self.out.as_ref().map(|d| CheckpointDir {
            dir: d.clone(),
            keep: self.settings.keep,
            keep_best: self.settings.keep_best,
            stamp: vec![(RUN_SETTINGS_KEY.to_string(), settings_json.clone())],
        }))
    }

    /// After the loop: the report, the final validation and save, the loss plot and the
    /// generation check; a failed log write or an interrupt ends the run after its save.
    fn end_run<D: Device>(
        &self,
        dev: &D,
        trainer: &mut Trainer<D>,
        end: RunEnd,
    ) -> CliResult<TrainOutcome> {
        let main = self.is_main;
        let s = &end.summary;
        let (ran, interrupted) = (s.ran, s.interrupted);
        if let (Some(path), None) = (&end.trace_path, &s.log_failure) {
            eprintln!("trace written to {}", path.display());
        }
        let mem = dev.memory_stats();
        // Rank 0 reports; every rank still takes part in the collectives below.
        if main {
            report::print_trained(trainer, s, &self.cfg.train, mem.peak);
        }
        if self.fp8_report && main {
            report::print_fp8_report(trainer);
        }
        // A failed log write stops the run as an interrupt does: the checkpoint is saved first.
        let stopped = interrupted
            || s.log_failure.is_some()
            || s.nonfinite_grads.is_some()
            || s.data_changed.is_some();
        let ck_path = match &self.out {
            Some(dir) => Some(dir.join(files::CHECKPOINT)),
            None if stopped => Some(interrupted_path()),
            None => None,
        };
        if let Some(f) = &s.log_failure {
            return Err(self
                .stopped_by_log_failure(trainer, f, ck_path, &end)
                .into());
        }
        if let Some(g) = s.nonfinite_grads {
            return Err(self.stopped_by_divergence(trainer, g, ck_path, &end).into());
        }
        if let Some(d) = &s.data_changed {
            return Err(self
                .stopped_by_data_change(trainer, d, ck_path, &end)
                .into());
        }
        // The final validation loss (the loop's own when it validated at this step), before
        // the save so that --keep-best sees it.
        let final_val = if ran > 0 && end.has_val && !interrupted {
            Some(match s.last_val {
                Some((st, v)) if st == trainer.step() => v,
                _ => match trainer.validation_loss() {
                    Ok(v) => v,
                    // Its windows could not be read: saved as a run stopped by it.
                    Err(duet_engine::EngineError::DataChanged { path, message })
                        if trainer.dist().is_none() =>
                    {
                        let d = DataChanged { path, message };
                        let p = ck_path.unwrap_or_else(interrupted_path);
                        return Err(self
                            .stopped_by_data_change(trainer, &d, Some(p), &end)
                            .into());
                    }
                    Err(e) => return Err(e.into()),
                },
            })
        } else {
            None
        };
        if let Some(p) = &ck_path {
            let saved = self.save(trainer, end.saves.as_ref(), p, final_val)?;
            let shown = saved.as_ref().map_or(p.clone(), |s| s.path.clone());
            if main {
                report::print_checkpoint_saved(
                    trainer.step(),
                    &shown,
                    saved.as_ref(),
                    end.saves.as_ref(),
                );
            }
        }
        if interrupted {
            self.draw_plot(end.curve.as_deref())?;
            let p = ck_path.expect("interrupted runs always save");
            if main {
                eprintln!(
                    "interrupted at step {}; resume with: {}",
                    trainer.step(),
                    self.resume_cmd(&p)
                );
            }
            return Ok(TrainOutcome::Interrupted);
        }
        if let Some(v) = final_val
            && main
        {
            report::print_validation(v, trainer.unigram_entropy()?);
        }
        self.draw_plot(end.curve.as_deref())?;
        self.evaluate_generation(trainer)?;
        Ok(TrainOutcome::Finished)
    }

    /// The error of a run stopped by a failed write to its metrics log or trace (`f`): the
    /// loss plot drawn and the checkpoint saved to `ck_path` first, then what failed, what
    /// was kept and how to resume.
    fn stopped_by_log_failure<D: Device>(
        &self,
        trainer: &Trainer<D>,
        f: &LogFailure,
        ck_path: Option<PathBuf>,
        end: &RunEnd,
    ) -> String {
        let (what, path) = match f.log {
            LogKind::Metrics => ("the metrics file", self.metrics_path.as_deref()),
            LogKind::Trace => ("the trace", end.trace_path.as_deref()),
        };
        let path = path.map(|p| p.display().to_string()).unwrap_or_default();
        let mut msg = format!(
            "writing {what} {path} failed at step {}: {}; training stopped after step {}",
            f.step,
            f.message,
            trainer.step()
        );
        let p = ck_path.expect("a stopped run always saves");
        if let Err(e) = self.draw_plot(end.curve.as_deref()) {
            eprintln!("warning: drawing the loss plot failed: {e}");
        }
        match self.save(trainer, end.saves.as_ref(), &p, None) {
            Ok(_) => msg.push_str(&format!(
                "; checkpoint at step {} saved to {}; {what} keeps its complete lines from \
                 before step {} (a resumed run appends from step {}); make room and resume \
                 with: {} (and the same log options)",
                trainer.step(),
                p.display(),
                f.step,
                trainer.step() + 1,
                self.resume_cmd(&p)
            )),
            Err(e) => {
                let kept = match end.summary.saved_step {
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
        msg
    }

    /// The error of a run stopped because its gradient norm was not finite for
    /// [`NONFINITE_GRAD_STEPS`] consecutive steps (`g`): the plot drawn and the checkpoint saved
    /// to `ck_path` first (clipping made those steps' updates zero, so the weights are finite),
    /// then why the run stopped.
    fn stopped_by_divergence<D: Device>(
        &self,
        trainer: &Trainer<D>,
        g: NonFiniteGrads,
        ck_path: Option<PathBuf>,
        end: &RunEnd,
    ) -> String {
        let mut msg = format!(
            "training diverged: the gradient norm was not finite for {NONFINITE_GRAD_STEPS} \
             consecutive steps ({}–{}; gradient clipping turned each into an empty update, so \
             the loss could not improve); lower the learning rate or check the initial weights",
            g.first, g.last
        );
        let p = ck_path.expect("a stopped run always saves");
        if let Err(e) = self.draw_plot(end.curve.as_deref()) {
            eprintln!("warning: drawing the loss plot failed: {e}");
        }
        match self.save(trainer, end.saves.as_ref(), &p, None) {
            Ok(_) => msg.push_str(&format!(
                "; checkpoint at step {} saved to {}",
                trainer.step(),
                p.display()
            )),
            Err(e) => msg.push_str(&format!(
                "; saving the checkpoint to {} failed: {e}",
                p.display()
            )),
        }
        msg
    }

    /// The error of a run stopped because a data file changed while it read it (`d`: a shard
    /// truncated): the plot drawn and the checkpoint saved to `ck_path` first (the trainer is
    /// at the step before the batch it could not read), then the file, the checkpoint and how
    /// to resume once the file is restored.
    fn stopped_by_data_change<D: Device>(
        &self,
        trainer: &Trainer<D>,
        d: &DataChanged,
        ck_path: Option<PathBuf>,
        end: &RunEnd,
    ) -> String {
        let mut msg = format!(
            "data file {} {}; training stopped after step {}",
            d.path,
            d.message,
            trainer.step()
        );
        let p = ck_path.expect("a stopped run always saves");
        if let Err(e) = self.draw_plot(end.curve.as_deref()) {
            eprintln!("warning: drawing the loss plot failed: {e}");
        }
        match self.save(trainer, end.saves.as_ref(), &p, None) {
            Ok(_) => msg.push_str(&format!(
                "; checkpoint at step {} saved to {}; restore the file (its content must be the \
                 run's) and resume with: {}",
                trainer.step(),
                p.display(),
                self.resume_cmd(&p)
            )),
            Err(e) => msg.push_str(&format!(
                "; saving the checkpoint to {} failed: {e}",
                p.display()
            )),
        }
        msg
    }

    /// Saves the checkpoint: into `--out` (`saves`: step-numbered, latest and best names),
    /// elsewhere to the one file `p`.
    fn save<D: Device>(
        &self,
        trainer: &Trainer<D>,
        saves: Option<&CheckpointDir>,
        p: &Path,
        val: Option<f32>,
    ) -> duet_engine::Result<Option<Saved>> {
        match saves {
            Some(sv) => save_to(trainer, sv, val, self.is_main),
            None => save_checkpoint(trainer, p, self.is_main).map(|()| None),
        }
    }

    /// The loss plot into `--out` (rank 0), drawn at the end, on interrupt and after a failed
    /// log write too.
    fn draw_plot(&self, curve: Option<&[CurvePoint]>) -> CliResult<()> {
        if let (Some(dir), Some(curve)) = (&self.out, curve)
            && self.is_main
        {
            let svg = dir.join(files::LOSS_PLOT);
            crate::plot::write_loss_plot(curve, &svg)?;
            println!("loss curve written to {}", svg.display());
        }
        Ok(())
    }

    /// The command that resumes from the checkpoint `p` (its `--out` folder when there is
    /// one).
    fn resume_cmd(&self, p: &Path) -> String {
        match &self.out {
            Some(dir) => format!("duet train --resume {0} --out {0}", dir.display()),
            None => format!("duet train --resume {}", p.display()),
        }
    }

    /// The generation check of the synthetic task, at the run's last step: generation uses no
    /// collectives, so rank 0 alone runs it.
    fn evaluate_generation<D: Device>(&self, trainer: &mut Trainer<D>) -> CliResult<()> {
        let t = &self.cfg.train;
        if self.is_main
            && t.data.eval_sequences > 0
            && t.data.data.is_empty()
            && trainer.step() == t.steps
        {
            let eval_start = Instant::now();
            let e = trainer.evaluate_generation(t.data.eval_sequences)?;
            report::print_generation(&e, eval_start.elapsed().as_secs_f64());
        }
        Ok(())
    }
}
