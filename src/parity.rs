//! `duet parity a.jsonl b.jsonl`: compares two training traces.

use duet_engine::trace::{ParityOutcome, Trace, compare, execution_differences, format_value};
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
        Ok(ParityOutcome::Match {
            steps,
            worst,
            nonfinite,
        }) => {
            let list: Vec<String> = worst.iter().map(|(r, k)| format!("{k} {:.3}", r)).collect();
            // Say so when values were inf or NaN in both: a match of two runs that both blew up
            // is not a healthy run.
            let nonfinite = match nonfinite {
                0 => String::new(),
                1 => "; 1 value inf or NaN in both".into(),
                k => format!("; {k} values inf or NaN in both"),
            };
            println!(
                "match over {steps} steps; worst error/tolerance: {}{nonfinite}",
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
            let (x, y) = (format_value(a), format_value(b));
            if a.is_finite() && b.is_finite() {
                println!(
                    "diverged at step {step}: {quantity}: {x} vs {y} (relative error {rel_err:.3e} > tolerance {tol:.3e})"
                );
            } else {
                let why = if a.is_finite() || b.is_finite() {
                    "non-finite in one trace only"
                } else {
                    "different non-finite values"
                };
                println!("diverged at step {step}: {quantity}: {x} vs {y} ({why})");
            }
            ExitCode::from(1)
        }
        // A run that stopped early (crashed, killed, its trace cut short) must not pass as a
        // match of the steps it did record.
        Ok(ParityOutcome::LengthDiffers {
            steps,
            a_steps,
            b_steps,
            a_last,
            b_last,
        }) => {
            let (short, short_last, long, long_steps) = if a_steps < b_steps {
                (a, a_last, b, b_steps)
            } else {
                (b, b_last, a, a_steps)
            };
            println!(
                "{} ends after step {short_last}; {} has {long_steps} steps (the {steps} steps in both match)",
                short.display(),
                long.display(),
            );
            ExitCode::from(1)
        }
    }
}
