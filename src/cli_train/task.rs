//! One training run on a device (or one rank of a data-parallel group): builds the trainer,
//! prints what it runs, hands the loop to [`duet_engine::run`] and reports.

use super::outputs::{interrupted_path, open_log};
use super::{INTERRUPTED, TrainOutcome};
use crate::CliResult;
use crate::backends::OnDevice;
use crate::cli_dist::RankTask;
use crate::settings::resolve_precision;
use duet_device::{Fused, human_bytes};
use duet_engine::checkpoint::{Checkpoint, files};
use duet_engine::run::{
    FP8_REPORT_ENTRIES, LogKind, MetricsLog, RunPlan, RunSummary, StepLog, save_checkpoint,
};
use duet_engine::trace::{TraceHeader, TraceWriter};
use duet_engine::{Config, Precision, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// Opened (truncated, or appended to when resuming) once the model is built.
    pub(super) metrics: Option<MetricsLog>,
    pub(super) metrics_path: Option<PathBuf>,
    pub(super) trace: Option<PathBuf>,
    pub(super) out: Option<PathBuf>,
    pub(super) save_every: u64,
    pub(super) stop_after: Option<u64>,
    pub(super) val_every: u64,
    pub(super) log_every: Option<u64>,
    pub(super) strict: bool,
    pub(super) fp8_report: bool,
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
        let mut trainer = match (self.resume.take(), dp) {
            (Some(mut ck), dp) => {
                // What a resume may change (settings::fixed_on_resume): the step count and the
                // whole execution group; the precision is the checkpoint's, resolved against
                // this device.
                ck.config.train.recipe.precision = cfg.train.recipe.precision;
                ck.config.train.steps = cfg.train.steps;
                ck.config.train.execution = cfg.train.execution.clone();
                say!("resuming from step {}", ck.step);
                match dp {
                    Some((c, o)) => Trainer::from_checkpoint_data_parallel(dev.clone(), &ck, c, o)?,
                    None => Trainer::from_checkpoint(dev.clone(), &ck)?,
                }
            }
            (None, Some((c, o))) => Trainer::new_data_parallel(dev.clone(), cfg.clone(), c, o)?,
            (None, None) => Trainer::new(dev.clone(), cfg.clone())?,
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
            let (log, dropped) = MetricsLog::open(p, resuming.then(|| trainer.step()))?;
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
        let first_step = trainer.step();
        let last_step = match self.stop_after {
            Some(n) => (first_step + n).min(t.steps),
            None => t.steps,
        };
        let bar = match self.log_every {
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
        if !has_val && self.val_every > 0 {
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
        let plan = RunPlan {
            last_step,
            val_every: self.val_every,
            save_every: self.save_every,
            checkpoint: self.out.as_ref().map(|d| d.join(files::CHECKPOINT)),
            log_every: self.log_every.unwrap_or(0),
            is_main: main,
        };
        let (fp8_report, log_every, steps) = (self.fp8_report, self.log_every, t.steps);
        let mut on_step = |trainer: &Trainer<D>, s: &StepLog| -> duet_engine::Result<()> {
            let r = &s.report;
            let val = s
                .val_loss
                .map(|v| format!(" | val {v:.4}"))
                .unwrap_or_default();
            let msg = format!("loss {:.4}{val} | {:.0} tok/s", r.loss, s.tokens_per_s);
            match (&bar, log_every) {
                (Some(bar), _) => {
                    bar.set_message(msg);
                    bar.inc(1);
                }
                (None, Some(n))
                    if main && ((n > 0 && r.step.is_multiple_of(n)) || s.val_loss.is_some()) =>
                {
                    let scale = match r.loss_scale {
                        Some(ls) => format!(
                            " | loss scale {ls}{}",
                            if r.skipped { " (step skipped)" } else { "" }
                        ),
                        None => String::new(),
                    };
                    eprintln!(
                        "step {}/{steps} | {msg} | lr {:.2e} | grad norm {:.3}{scale}",
                        r.step, r.lr, r.grad_norm
                    );
                    if fp8_report {
                        print_fp8_report(trainer);
                    }
                }
                _ => {}
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
            match save_checkpoint(&trainer, &p, main) {
                Ok(()) => msg.push_str(&format!(
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
        if let Some(p) = &ck_path {
            save_checkpoint(&trainer, p, main)?;
            report!(
                "checkpoint at step {} saved to {}",
                trainer.step(),
                p.display()
            );
        }
        if interrupted {
            let p = ck_path.expect("interrupted runs always save");
            say!(
                "interrupted at step {}; resume with: {}",
                trainer.step(),
                resume_cmd(&p)
            );
            return Ok(TrainOutcome::Interrupted);
        }
        if ran > 0 && has_val {
            let v = trainer.validation_loss()?;
            match trainer.unigram_entropy() {
                Some(h) => report!(
                    "validation loss {v:.4} nats/token (the file's unigram entropy is {h:.4})"
                ),
                None => report!("validation loss {v:.4}"),
            }
        }
        if let (Some(dir), Some(curve)) = (&self.out, &curve) {
            let svg = dir.join(files::LOSS_PLOT);
            crate::plot::write_loss_plot(curve, &svg)?;
            println!("loss curve written to {}", svg.display());
        }
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
