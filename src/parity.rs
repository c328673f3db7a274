//! `duet parity a.jsonl b.jsonl`: compares two training traces.

use duet_engine::trace::{ParityOutcome, Trace, compare, execution_differences};
use std::path::Path;
use std::process::ExitCode;

pub fn run(a: &Path, b: &Path) -> ExitCode {
    let read = |p: &Path| Trace::read(p).map_err(|e| eprintln!("error: {e}"));
    let (Ok(ta), Ok(tb)) = (read(a), read(b)) else {
        return ExitCode::from(2);
    };
    println!(
        "a: {} on {} ({}), {} steps\nb: {} on {} ({}), {} steps",
        ta.header.backend,
        ta.header.device,
        ta.header.precision,
        ta.steps.len(),
        tb.header.backend,
        tb.header.device,
        tb.header.precision,
        tb.steps.len()
    );
    let differences = execution_differences(&ta, &tb);
    if !differences.is_empty() {
        println!(
            "execution settings that differ (not the arithmetic): {}",
            differences.join(", ")
        );
    }
    match compare(&ta, &tb) {
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Ok(ParityOutcome::Match { steps, worst }) => {
            let list: Vec<String> = worst.iter().map(|(r, k)| format!("{k} {:.3}", r)).collect();
            println!(
                "match over {steps} steps; worst error/tolerance: {}",
                list.join(", ")
            );
            ExitCode::SUCCESS
        }
        Ok(ParityOutcome::Diverged {
            step,
            quantity,
            a,
            b,
            rel_err,
            tol,
        }) => {
            println!(
                "diverged at step {step}: {quantity}: {a:.9e} vs {b:.9e} (relative error {rel_err:.3e} > tolerance {tol:.3e})"
            );
            ExitCode::from(1)
        }
    }
}
