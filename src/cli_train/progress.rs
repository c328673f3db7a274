//! The progress a run shows while its loop runs: a bar on a terminal, else a line every N
//! steps (validation losses and saves too); the loss plot is redrawn at every save.

use super::DEFAULT_LOG_EVERY;
use super::report::print_fp8_report;
use duet_device::Device;
use duet_engine::Trainer;
use duet_engine::run::{CurvePoint, StepLog};
use duet_engine::saves::Saved;
use duet_engine::train::StepReport;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
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

/// The log cadence of `--log-every` (`given`): a terminal gets the progress bar (None); a
/// batch job (stderr a file or pipe: tee, nohup, Slurm, CI) gets a line every
/// [`DEFAULT_LOG_EVERY`] steps unless `--log-every` says.
pub(super) fn log_cadence(given: Option<u64>) -> Option<u64> {
    match given {
        None if !std::io::stderr().is_terminal() => Some(DEFAULT_LOG_EVERY),
        l => l,
    }
}

/// The progress bar of a run of `steps` steps, at `first_step`.
pub(super) fn progress_bar(steps: u64, first_step: u64) -> ProgressBar {
    // Styled before it is first drawn (at `set_position`): else indicatif's default bar is
    // drawn once and left behind.
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template(
            "{bar:30} step {pos}/{len} | {msg} | {elapsed_precise} ETA {eta_precise}",
        )
        .expect("valid template"),
    );
    bar.set_position(first_step);
    // A resumed run's ETA from its own steps: without this the steps before the resume count
    // as done at once and the first ETA comes out several times too short.
    bar.reset_eta();
    bar
}

/// The loop's progress display ([`Progress::on_step`] after each step) and what its lines
/// need.
pub(super) struct Progress {
    /// The bar (rank 0 on a terminal); else lines every `log_every` steps.
    pub(super) bar: Option<ProgressBar>,
    pub(super) log_every: Option<u64>,
    /// Rank 0: the one that prints.
    pub(super) main: bool,
    /// The run's `--steps`.
    pub(super) steps: u64,
    /// The step this invocation starts from, and the one it stops after.
    pub(super) first_step: u64,
    pub(super) last_step: u64,
    /// The nominal peak TFLOP/s of the device in the run's precision (MFU), and the FLOPs of
    /// one step.
    pub(super) mfu_peak: Option<f64>,
    pub(super) flops_per_step: f64,
    /// `--fp8-report`: the FP8 scaling state after every log line.
    pub(super) fp8_report: bool,
    /// The loss plot redrawn at every save (`--out`).
    pub(super) plot_path: Option<PathBuf>,
    /// The loss curve so far (a resumed run's from its metrics).
    pub(super) curve: Vec<CurvePoint>,
    pub(super) loop_start: Instant,
    /// The last validation loss and its step: it stays in the bar until the next one.
    pub(super) last_val: Option<(u64, f32)>,
}

impl Progress {
    /// After each step (and its save, if it had one): the bar or the log line, the validation
    /// loss and the save's line, the loss plot redrawn at a save.
    pub(super) fn on_step<D: Device>(
        &mut self,
        trainer: &Trainer<D>,
        s: &StepLog,
        saved: Option<&Saved>,
    ) -> duet_engine::Result<()> {
        let r = &s.report;
        let (main, steps) = (self.main, self.steps);
        self.curve.push((r.step, r.loss, s.val_loss));
        if let Some(v) = s.val_loss {
            self.last_val = Some((r.step, v));
        }
        // The last validation loss stays in the bar until the next one.
        let val = self
            .last_val
            .map(|(st, v)| format!(" | val {v:.4} (step {st})"))
            .unwrap_or_default();
        let msg = format!("loss {:.4}{val} | {:.0} tok/s", r.loss, s.tokens_per_s);
        let line_due = self
            .log_every
            .is_some_and(|n| n > 0 && r.step.is_multiple_of(n));
        match &self.bar {
            Some(bar) => {
                bar.set_message(msg);
                bar.inc(1);
            }
            None if main && line_due => {
                eprintln!("{}", self.step_line(r, s.tokens_per_s));
                if self.fp8_report {
                    print_fp8_report(trainer);
                }
            }
            _ => {}
        }
        if main
            && self.bar.is_none()
            && self.log_every.is_some()
            && let Some(v) = s.val_loss
        {
            eprintln!("step {}/{steps} | validation loss {v:.4}", r.step);
        }
        if let (Some(sv), true) = (saved, main) {
            self.on_save(r.step, sv);
        }
        Ok(())
    }

    /// The log line of step `r`: loss, learning rate, gradient norm, speed, MFU (where the
    /// device's peak is known), loss scale (loss scaling only) and the time left.
    fn step_line(&self, r: &StepReport, tokens_per_s: f64) -> String {
        let scale = match r.loss_scale {
            Some(ls) => format!(
                " | loss scale {ls}{}",
                if r.skipped { " (step skipped)" } else { "" }
            ),
            None => String::new(),
        };
        let mfu = match self.mfu_peak {
            Some(peak) => format!(
                " | MFU {:.1}%",
                100.0 * self.flops_per_step / r.seconds.max(1e-9) / 1e12 / peak
            ),
            None => String::new(),
        };
        let done = r.step - self.first_step;
        let eta = self.loop_start.elapsed().as_secs_f64() / done.max(1) as f64
            * (self.last_step - r.step) as f64;
        let steps = self.steps;
        format!(
            "step {}/{steps} | loss {:.4} | lr {:.2e} | grad norm {:.3} | {:.1} \
             ms/step | {:.0} tok/s{mfu}{scale} | ETA {}",
            r.step,
            r.loss,
            r.lr,
            r.grad_norm,
            r.seconds * 1e3,
            tokens_per_s,
            hms(eta)
        )
    }

    /// Rank 0 after a save at `step`: its line (log lines only) and the loss plot redrawn.
    fn on_save(&self, step: u64, sv: &Saved) {
        let steps = self.steps;
        if self.bar.is_none() && self.log_every.is_some() {
            eprintln!(
                "step {step}/{steps} | checkpoint saved to {}{}",
                sv.path.display(),
                sv.best
                    .map(|b| format!(" (best validation loss so far: {b:.4})"))
                    .unwrap_or_default()
            );
        }
        if let Some(svg) = &self.plot_path
            && let Err(e) = crate::plot::write_loss_plot(&self.curve, svg)
        {
            let warn = || eprintln!("warning: redrawing the loss plot failed: {e}");
            match &self.bar {
                Some(bar) => bar.suspend(warn),
                None => warn(),
            }
        }
    }

    /// Ends the bar (when there is one) after the loop: at its full length when the run
    /// `completed`, else where it stopped (an interrupt must not show `400/400 ETA 0`).
    pub(super) fn finish(&self, completed: bool) {
        if let Some(bar) = &self.bar {
            if completed {
                bar.finish();
            } else {
                bar.abandon();
            }
        }
    }
}
