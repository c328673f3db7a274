//! Issue 51 item 8: a shard truncated while a run maps it killed the process with SIGBUS. A
//! read of it is now an error naming the file ([`EngineError::DataChanged`]), and a trainer
//! that meets it stops at a step boundary: the steps before the batch it could not read are
//! reported and can be saved.

use duet_cpu::CpuDevice;
use duet_engine::dataset::{DataFormat, DataSet, Prefetcher, Source, resolve_data};
use duet_engine::dataset::{LLMC_HEADER_BYTES, write_llmc_shard};
use duet_engine::rng::Rng;
use duet_engine::train::StepReport;
use duet_engine::{Config, EngineError, Precision, Preset, Trainer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("duet-truncated-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Cuts `p` to `len` bytes (a page multiple, so that every read past it faults).
fn truncate(p: &Path, len: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.set_len(len).unwrap();
}

/// Fails unless `e` is the error of `path` truncated to `now` bytes.
fn assert_changed(e: EngineError, path: &Path, now: u64) {
    let text = e.to_string();
    match e {
        EngineError::DataChanged { path: p, message } => {
            assert_eq!(p, s(path));
            assert!(
                message.contains("changed while the run read it"),
                "{message}"
            );
            assert!(message.contains(&format!("{now} bytes")), "{message}");
        }
        other => panic!("not DataChanged: {other}"),
    }
    assert!(
        text.starts_with(&format!("data file {}", s(path))),
        "{text}"
    );
    assert!(text.contains("restore it and resume"), "{text}");
}

#[test]
fn a_shard_truncated_after_it_was_opened_is_an_error_naming_it() {
    let dir = tmp("set");
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a_train.bin"), dir.join("b_train.bin"));
    let tokens: Vec<u16> = (0..20_000u32).map(|i| (i * 7 % 96) as u16).collect();
    write_llmc_shard(&a, &tokens).unwrap();
    write_llmc_shard(&b, &tokens).unwrap();
    let files = resolve_data(&[s(&dir)], &[], DataFormat::Auto).unwrap();
    let set = Arc::new(DataSet::open(&files, 16).unwrap());
    let mut src = Source::File {
        data: set.clone(),
        rng: Rng::new(7),
    };
    let mut pre = Prefetcher::start(src.clone(), 4, 16, 2);
    src.next_batch(4, 16).unwrap();
    truncate(&b, 0);
    // Each read of b fails; a is read as before.
    assert_changed(set.shards[1].token(0).unwrap_err(), &b, 0);
    assert_eq!(set.shards[0].token(5).unwrap(), 35);
    assert_changed(set.validation_batches(4, 16, 8).unwrap_err(), &b, 0);
    assert_changed(set.unigram_entropy().unwrap_err(), &b, 0);
    let mut rng = Rng::new(7);
    let e = (0..100)
        .find_map(|_| set.random_windows(&mut rng, 4, 16).err())
        .expect("a window of b");
    assert_changed(e, &b, 0);
    // The prefetcher gives its batches read before the truncation, then the error, again
    // at every later call.
    let e = (0..100)
        .find_map(|_| pre.next_batch().err())
        .expect("a window of b");
    assert_changed(e, &b, 0);
    assert_changed(pre.next_batch().unwrap_err(), &b, 0);
}

/// Everything a report says except its wall time, as bits.
fn report_bits(r: &StepReport) -> (u64, u32, u32, u32) {
    (
        r.step,
        r.loss.to_bits(),
        r.lr.to_bits(),
        r.grad_norm.to_bits(),
    )
}

#[test]
fn a_truncated_shard_stops_the_trainer_at_a_step_boundary() {
    // fp32 queues the steps of a call and reads them back together; fp16's loss scaler runs
    // them one by one.
    for precision in [Precision::Fp32, Precision::Fp16] {
        let name = format!("train-{precision}.bin");
        let (shard, copy) = (tmp(&name), tmp(&format!("copy-{name}")));
        let tokens: Vec<u16> = (0..40_000u32).map(|i| (i * 13 % 96) as u16).collect();
        write_llmc_shard(&shard, &tokens).unwrap();
        write_llmc_shard(&copy, &tokens).unwrap();
        let trainer = |p: &Path| {
            let mut cfg = Config::preset(Preset::Tiny);
            cfg.train.recipe.precision = precision;
            cfg.train.data.data = vec![s(p)];
            let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
            Trainer::new(dev, cfg).unwrap()
        };
        let mut cut = trainer(&shard);
        // The first 80% of the file stays: the batches whose windows all lie there are read;
        // the first with a window past it ends the steps (the same one whenever it is read).
        let keep = ((LLMC_HEADER_BYTES + tokens.len() * 2) * 4 / 5) as u64 / 4096 * 4096;
        truncate(&shard, keep);
        let n = 40;
        let reports = cut.train_steps(n).unwrap();
        let k = reports.len();
        assert!(k > 0 && k < n, "{precision}: {k} steps of {n}");
        assert_eq!(cut.step(), k as u64, "{precision}");
        // Those are the steps of an untouched run, and the trainer is where that run is
        // after them.
        let mut whole = trainer(&copy);
        let expected = whole.train_steps(k).unwrap();
        let bits = |r: &[StepReport]| r.iter().map(report_bits).collect::<Vec<_>>();
        assert_eq!(bits(&reports), bits(&expected), "{precision}");
        let (a, b) = (cut.checkpoint().unwrap(), whole.checkpoint().unwrap());
        assert_eq!(a.step, b.step, "{precision}");
        assert_eq!(a.data_state, b.data_state, "{precision}");
        assert!(
            a.weights == b.weights && a.adam_m == b.adam_m,
            "{precision}"
        );
        // The next call returns the error, and the trainer stays where it was.
        assert_changed(cut.train_steps(n).unwrap_err(), &shard, keep);
        assert_changed(cut.train_step().unwrap_err(), &shard, keep);
        assert_eq!(cut.step(), k as u64, "{precision}");
    }
}
