//! The stable-Rust fuzz loop: `fuzz-loop [--iterations N] [--seconds S] [--seed K]
//! [--corpus DIR] [--target NAME]...` mutates each target's seeds (and the files under
//! DIR/<target>/, e.g. the committed `fuzz/corpus`) N times or for S seconds per target, prints
//! the iteration count, time and slowest input of each, saves crashing inputs under
//! `target/fuzz-crashes/` and exits 1 if there was any. `--write-corpus DIR` writes the seeds
//! to DIR/<target>/ instead (the committed corpus).

use duet_fuzz::{Target, run_loop, seeds};
use std::path::PathBuf;

fn main() {
    let mut iterations = 10_000u64;
    let mut seconds = 10.0f64;
    let mut seed = 1u64;
    let mut corpus: Option<PathBuf> = None;
    let mut write: Option<PathBuf> = None;
    let mut targets = Vec::new();
    let mut args = std::env::args().skip(1);
    let usage = "usage: fuzz-loop [--iterations N] [--seconds S] [--seed K] [--corpus DIR] \
                 [--target checkpoint|shard|trace|config|tokenizer]... | --write-corpus DIR";
    while let Some(a) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("{a} needs a value\n{usage}");
                std::process::exit(2)
            })
        };
        let bad = |v: &str| -> ! {
            eprintln!("bad value '{v}'\n{usage}");
            std::process::exit(2)
        };
        match a.as_str() {
            "--iterations" => {
                let v = value();
                iterations = v.parse().unwrap_or_else(|_| bad(&v))
            }
            "--seconds" => {
                let v = value();
                seconds = v.parse().unwrap_or_else(|_| bad(&v))
            }
            "--seed" => {
                let v = value();
                seed = v.parse().unwrap_or_else(|_| bad(&v))
            }
            "--corpus" => corpus = Some(value().into()),
            "--write-corpus" => write = Some(value().into()),
            "--target" => {
                let v = value();
                targets.push(Target::parse(&v).unwrap_or_else(|| bad(&v)))
            }
            _ => {
                eprintln!("{usage}");
                std::process::exit(2)
            }
        }
    }
    let all = seeds::all();
    if let Some(dir) = write {
        for (t, name, bytes) in &all {
            let d = dir.join(t.name());
            std::fs::create_dir_all(&d).expect("create the corpus folder");
            std::fs::write(d.join(name), bytes).expect("write a seed");
            println!("{} ({} bytes)", d.join(name).display(), bytes.len());
        }
        return;
    }
    if targets.is_empty() {
        targets = Target::ALL.to_vec();
    }
    // Caught panics are counted, not printed one by one.
    std::panic::set_hook(Box::new(|_| {}));
    let crash_dir = PathBuf::from("target/fuzz-crashes");
    let mut crashes = 0;
    let mut total = 0u64;
    for t in targets {
        let mut inputs: Vec<Vec<u8>> = all
            .iter()
            .filter(|(x, _, _)| *x == t)
            .map(|(_, _, b)| b.clone())
            .collect();
        if let Some(dir) = &corpus
            && let Ok(entries) = std::fs::read_dir(dir.join(t.name()))
        {
            let mut files: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
            files.sort();
            inputs.extend(files.iter().filter_map(|p| std::fs::read(p).ok()));
        }
        let mut seen = std::collections::HashSet::new();
        inputs.retain(|i| seen.insert(i.clone()));
        let r = run_loop(t, &inputs, iterations, seconds, seed);
        total += r.iterations;
        println!(
            "fuzz {:<10} {:>9} iterations ({} accepted) in {:>6.2} s ({:>7.0}/s), {} seeds, slowest input {:.1} ms, {} crash(es)",
            t.name(),
            r.iterations,
            r.accepted,
            r.seconds,
            r.iterations as f64 / r.seconds.max(1e-9),
            inputs.len(),
            r.slowest_ms,
            r.crashes.len()
        );
        for (i, (input, msg)) in r.crashes.iter().enumerate().take(20) {
            std::fs::create_dir_all(&crash_dir).expect("create target/fuzz-crashes");
            let p = crash_dir.join(format!("{}-{i}.bin", t.name()));
            std::fs::write(&p, input).expect("write a crash");
            let msg: String = msg.chars().take(300).collect();
            println!("  crash: {msg} (input saved to {})", p.display());
        }
        crashes += r.crashes.len();
    }
    println!("fuzz total: {total} iterations, {crashes} crash(es)");
    if crashes > 0 {
        std::process::exit(1);
    }
}
