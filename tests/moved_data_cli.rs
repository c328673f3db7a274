//! A run's shards as files, not names: a resumed run follows its moved shards when their
//! content is the run's, catches a shard rewritten with its size and time restored, and reads a
//! shard and its hard links once.

mod common;

use common::{assert_success, duet, tmp};
use duet_engine::checkpoint::Checkpoint;
use duet_engine::dataset::write_llmc_shard;
use std::path::Path;
use std::process::Output;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails unless the run failed with exit status 1 and a one-line error, its last line, naming
/// every needle.
fn assert_refused(out: &Output, needles: &[&str]) {
    let all = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    let err = all.trim_end().lines().last().unwrap_or_default();
    assert!(err.starts_with("error: "), "{all}");
    assert_eq!(all.matches("error").count(), 1, "one error: {all}");
    for n in needles {
        assert!(err.contains(n), "'{n}' not in {err}");
    }
    assert!(!err.contains("os error"), "{err}");
}

fn shard(k: u16, n: usize) -> Vec<u16> {
    (0..n).map(|i| (k * 97 + i as u16 * 13) % 500).collect()
}

/// Two training shards and a validation shard in `dir`.
fn shards(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    write_llmc_shard(&dir.join("d_train_000001.bin"), &shard(1, 600)).unwrap();
    write_llmc_shard(&dir.join("d_train_000002.bin"), &shard(2, 600)).unwrap();
    write_llmc_shard(&dir.join("d_val_000000.bin"), &shard(3, 300)).unwrap();
}

/// A run on `data` stopped after 2 of 6 steps, saved in `run`.
fn stopped_run(data: &Path, run: &Path) {
    assert_success(&duet(&[
        "train",
        "--preset",
        "tiny",
        "--data",
        s(data),
        "--steps",
        "6",
        "--stop-after",
        "2",
        "--log-every",
        "0",
        "--out",
        s(run),
    ]));
}

fn resume(run: &Path, extra: &[&str]) -> Output {
    duet(
        &[
            &[
                "train",
                "--resume",
                s(run),
                "--out",
                s(run),
                "--log-every",
                "0",
            ][..],
            extra,
        ]
        .concat(),
    )
}

/// Moved shards: a resume without --data names the missing file; with --data at the new place
/// it goes on (the hashes match) and records the new paths; other shards are refused.
#[test]
fn a_resumed_run_follows_its_moved_shards() {
    let dir = tmp("moved-data");
    let (data, run) = (dir.join("data"), dir.join("run"));
    shards(&data);
    stopped_run(&data, &run);
    let moved = dir.join("moved");
    std::fs::rename(&data, &moved).unwrap();
    // Where they were: nothing there, said in words.
    assert_refused(
        &resume(&run, &[]),
        &[
            s(&data.join("d_train_000001.bin")),
            "no longer exists",
            "--data",
        ],
    );
    // Where they are now: the same content, resumed.
    let out = resume(&run, &["--data", s(&moved), "--stop-after", "2"]);
    assert_success(&out);
    assert!(stderr(&out).contains("hashes checked"), "{}", stderr(&out));
    let ck = Checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    assert_eq!(ck.step, 4);
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(
        ck.config.train.data.data,
        [
            canon(&moved.join("d_train_000001.bin")),
            canon(&moved.join("d_train_000002.bin"))
        ]
    );
    assert_eq!(
        ck.config.train.data.val_data,
        [canon(&moved.join("d_val_000000.bin"))]
    );
    // From there on the run resumes without --data.
    let out = resume(&run, &["--stop-after", "1"]);
    assert_success(&out);
    // Other content in a shard's place: refused, naming it.
    let other = dir.join("other");
    shards(&other);
    write_llmc_shard(&other.join("d_train_000002.bin"), &shard(7, 600)).unwrap();
    assert_refused(
        &resume(&run, &["--data", s(&other)]),
        &[
            s(&other.join("d_train_000002.bin")),
            "is not the shard the run read",
        ],
    );
    // Fewer shards: refused.
    assert_refused(
        &resume(
            &run,
            &[
                "--data",
                s(&moved.join("d_train_000001.bin")),
                "--val-data",
                s(&moved),
            ],
        ),
        &["the run read 2 training shard(s)", "has 1"],
    );
}

/// `cp -p` (and `rsync -t`, `tar x`) rewrite a shard and restore its size and modification
/// time: the status-change time shows it, and the resume is refused.
#[test]
fn a_shard_rewritten_with_its_time_restored_is_caught() {
    let dir = tmp("restored-time");
    let (data, run) = (dir.join("data"), dir.join("run"));
    shards(&data);
    stopped_run(&data, &run);
    let f = data.join("d_train_000002.bin");
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_llmc_shard(&f, &shard(7, 600)).unwrap();
    let file = std::fs::File::options().append(true).open(&f).unwrap();
    file.set_modified(mtime).unwrap();
    drop(file);
    assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), mtime);
    assert_refused(
        &resume(&run, &[]),
        &[s(&f), "changed since the run read it"],
    );
}

/// A shard and its hard link train once; a validation shard that is a training shard's hard
/// link is refused.
#[test]
fn hard_linked_shards_are_read_once() {
    let dir = tmp("hard-linked");
    let data = dir.join("data");
    shards(&data);
    std::fs::hard_link(
        data.join("d_train_000001.bin"),
        data.join("e_train_000001.bin"),
    )
    .unwrap();
    let args = [
        "train",
        "--preset",
        "tiny",
        "--data",
        s(&data),
        "--steps",
        "1",
        "--print-config",
    ];
    let out = duet(&args);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let cfg =
        duet_engine::Config::from_toml_exact(text.split("# run settings").next().unwrap()).unwrap();
    assert_eq!(cfg.train.data.data.len(), 2, "{:?}", cfg.train.data.data);
    assert!(stderr(&out).contains("hard link"), "{}", stderr(&out));
    std::fs::hard_link(
        data.join("d_train_000002.bin"),
        data.join("e_val_000001.bin"),
    )
    .unwrap();
    assert_refused(
        &duet(&args),
        &["e_val_000001.bin", "d_train_000002.bin", "hard link"],
    );
}
