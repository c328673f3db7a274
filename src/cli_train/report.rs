//! What a training run prints on rank 0: the banner at its start (the device, the model, the
//! run's shape and how it runs) and the report at its end (what was trained, the checkpoint,
//! the validation loss, the generation check). The run ([`super::task`]) decides when.

use duet_device::{Device, DeviceInfo, human_bytes};
use duet_engine::run::{FP8_REPORT_ENTRIES, RunSummary};
use duet_engine::saves::{CheckpointDir, Saved};
use duet_engine::train::GenerationEval;
use duet_engine::{Config, Precision, TrainConfig, Trainer};
use std::path::Path;

/// The banner's first line: the device, the precision, the model's shape, the batch, the
/// steps and the learning rate (and the data, when the run reads files).
pub(super) fn print_banner(info: &DeviceInfo, cfg: &Config) {
    let (m, t) = (&cfg.model, &cfg.train);
    eprintln!(
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
}

/// The banner's lines about the built trainer: data parallelism (when it has ranks), the
/// memory plan and activation checkpointing (when on).
pub(super) fn print_setup<D: Device>(trainer: &Trainer<D>, t: &TrainConfig) {
    if let Some(d) = trainer.dist() {
        let w = d.world_size();
        eprintln!(
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
    eprintln!(
        "memory plan: params {}, grads {}, optimizer {}, activations {}, scratch {}",
        human_bytes(plan.params),
        human_bytes(plan.grads),
        human_bytes(plan.optimizer),
        human_bytes(plan.activations),
        human_bytes(plan.scratch)
    );
    if t.execution.checkpoint_every > 0 {
        eprintln!(
            "activation checkpointing: every {} blocks (segments recomputed in the backward pass)",
            t.execution.checkpoint_every
        );
    }
}

/// One line per FP8 operand: scale and the first amax-history entries.
pub(super) fn print_fp8_report<D: Device>(trainer: &Trainer<D>) {
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

/// The report's first lines: the steps trained, the time and speed, the final loss and the
/// peak memory (`peak`, bytes); with loss scaling, the last scale and the skipped steps.
pub(super) fn print_trained<D: Device>(
    trainer: &Trainer<D>,
    summary: &RunSummary,
    t: &TrainConfig,
    peak: u64,
) {
    println!("{}", trained_line(summary, trainer.step(), t, peak));
    if let Some(ls) = summary.last_scale {
        let skipped = summary.skipped;
        println!("loss scale {ls} at the end; {skipped} step(s) skipped for inf/NaN gradients");
    }
}

/// The summary line of a run: its steps, time, throughput, final loss and peak memory; a run
/// that trained no step (resumed at its last step, `--steps 0`) says so instead of reporting
/// a NaN loss and 0 tokens/s.
fn trained_line(summary: &RunSummary, step: u64, t: &TrainConfig, peak: u64) -> String {
    let (ran, secs) = (summary.ran, summary.seconds);
    if ran == 0 {
        return format!(
            "trained no steps (the run is at step {step}), peak memory {}",
            human_bytes(peak)
        );
    }
    format!(
        "trained {} steps (to step {}) in {:.1}s ({:.0} tokens/s), final loss {:.4}, peak memory {}",
        ran,
        step,
        secs,
        (ran as usize * t.data.batch * t.data.seq) as f64 / secs.max(1e-9),
        summary.last_loss,
        human_bytes(peak)
    )
}

/// The final checkpoint's line: `step`, the file written (`shown`), and for a save into
/// `--out` (`saves`) the latest and best names it also went to.
pub(super) fn print_checkpoint_saved(
    step: u64,
    shown: &Path,
    saved: Option<&Saved>,
    saves: Option<&CheckpointDir>,
) {
    println!(
        "checkpoint at step {} saved to {}{}",
        step,
        shown.display(),
        match (saved, saves) {
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

/// The final validation loss `v`, beside the validation file's unigram entropy when there is
/// one.
pub(super) fn print_validation(v: f32, unigram_entropy: Option<f64>) {
    match unigram_entropy {
        Some(h) => {
            println!("validation loss {v:.4} nats/token (the file's unigram entropy is {h:.4})")
        }
        None => println!("validation loss {v:.4}"),
    }
}

/// The generation check's line: `e` from `secs` seconds of greedy generation.
pub(super) fn print_generation(e: &GenerationEval, secs: f64) {
    println!(
        "greedy generation on {} held-out progressions (prompt {}, generate {}): {:.1}% exact, {:.2}% of tokens keep the stride ({:.1}s)",
        e.sequences,
        duet_engine::train::PROMPT_LEN,
        duet_engine::train::GEN_LEN,
        100.0 * e.accuracy(),
        100.0 * e.token_accuracy,
        secs
    );
}

#[cfg(test)]
mod tests {
    use super::trained_line;
    use duet_engine::run::RunSummary;

    /// Issue 50 item 11: a run that trained no step reports no NaN loss.
    #[test]
    fn a_run_of_no_steps_reports_no_nan_loss() {
        let t = duet_engine::Config::preset(duet_engine::Preset::Tiny).train;
        let none = RunSummary {
            last_loss: f32::NAN,
            ..RunSummary::default()
        };
        let line = trained_line(&none, 40, &t, 1 << 20);
        assert!(
            !line.contains("NaN") && line.contains("trained no steps"),
            "{line}"
        );
        let some = RunSummary {
            ran: 3,
            last_loss: 2.5,
            seconds: 1.0,
            ..RunSummary::default()
        };
        let line = trained_line(&some, 43, &t, 1 << 20);
        assert!(
            line.starts_with("trained 3 steps (to step 43)") && line.contains("2.5000"),
            "{line}"
        );
    }
}
