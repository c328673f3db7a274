//! `duet train` on shard sets: a folder and a validation glob, formats, and the one-line errors
//! of bad data.

mod common;

use common::{assert_success, duet, tmp};
use duet_engine::dataset::{write_llmc_shard, write_llmc_shard_u32};
use std::path::Path;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn fails_with(args: &[&str], needle: &str) {
    let out = duet(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: '{needle}' not in {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
}

fn shard(k: u16, n: usize) -> Vec<u16> {
    (0..n).map(|i| (k * 97 + i as u16 * 13) % 500).collect()
}

#[test]
fn trains_on_a_folder_with_a_validation_glob() {
    let d = tmp("shards-cli");
    let v = tmp("shards-cli-val");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::create_dir_all(&v).unwrap();
    for k in 0..3 {
        write_llmc_shard(&d.join(format!("tiny_train_{k:06}.bin")), &shard(k, 600)).unwrap();
    }
    write_llmc_shard(&v.join("tiny_val_000000.bin"), &shard(9, 300)).unwrap();
    write_llmc_shard(&v.join("tiny_val_000001.bin"), &shard(8, 300)).unwrap();
    let out_dir = tmp("shards-cli-run");
    let glob = format!("{}/tiny_val_*.bin", s(&v));
    let out = duet(&[
        "train",
        "--preset",
        "tiny",
        "--data",
        s(&d),
        "--val-data",
        &glob,
        "--steps",
        "3",
        "--val-every",
        "3",
        "--val-batches",
        "2",
        "--log-every",
        "0",
        "--out",
        s(&out_dir),
    ]);
    assert_success(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("vocab set to"), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("validation loss"), "{stdout}");
    // The config records the shards themselves, absolute, in order.
    let ck =
        duet_engine::checkpoint::Checkpoint::load(&out_dir.join("checkpoint.safetensors")).unwrap();
    let data = &ck.config.train.data;
    let names = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|p| {
                Path::new(p)
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    };
    assert_eq!(
        names(&data.data),
        [
            "tiny_train_000000.bin",
            "tiny_train_000001.bin",
            "tiny_train_000002.bin"
        ]
    );
    assert_eq!(
        names(&data.val_data),
        ["tiny_val_000000.bin", "tiny_val_000001.bin"]
    );
    assert!(data.data.iter().all(|p| Path::new(p).is_absolute()));
    assert_eq!(data.val_batches, 2);
    // The resume reads the same shards.
    let out = duet(&[
        "train",
        "--resume",
        s(&out_dir),
        "--out",
        s(&out_dir),
        "--steps",
        "4",
        "--log-every",
        "0",
    ]);
    assert_success(&out);

    // A comma list and a repeated --data are the same list.
    let a = s(&d.join("tiny_train_000000.bin")).to_string();
    let b = s(&d.join("tiny_train_000001.bin")).to_string();
    for args in [
        vec!["--data".to_string(), format!("{a},{b}")],
        vec!["--data".into(), a.clone(), "--data".into(), b.clone()],
        vec!["--data".into(), a.clone(), b.clone()],
    ] {
        let mut full: Vec<&str> = vec![
            "train",
            "--preset",
            "tiny",
            "--steps",
            "1",
            "--log-every",
            "0",
        ];
        full.extend(args.iter().map(String::as_str));
        assert_success(&duet(&full));
    }
}

#[test]
fn bad_data_stops_with_one_line() {
    let d = tmp("bad-data");
    std::fs::create_dir_all(&d).unwrap();
    let base = ["train", "--preset", "tiny", "--steps", "1"];
    fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        [base, extra].concat()
    }
    fails_with(
        &with(&base, &["--data", s(&d.join("missing.bin"))]),
        "missing.bin",
    );
    let g = format!("{}/*_train_*.bin", s(&d));
    fails_with(&with(&base, &["--data", &g]), "matches no file");
    // A headerless nanoGPT file: auto mode names --data-format nanogpt, which reads it.
    let n = d.join("train.bin");
    let toks: Vec<u8> = shard(1, 800).iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(&n, &toks).unwrap();
    fails_with(&with(&base, &["--data", s(&n)]), "--data-format nanogpt");
    assert_success(&duet(&with(
        &base,
        &[
            "--data",
            s(&n),
            "--data-format",
            "nanogpt",
            "--log-every",
            "0",
        ],
    )));
    fails_with(
        &with(&base, &["--data", s(&n), "--data-format", "csv"]),
        "unknown data format",
    );
    // Too short for one window (tiny's seq is 16).
    let short = d.join("short.bin");
    write_llmc_shard(&short, &shard(2, 10)).unwrap();
    fails_with(&with(&base, &["--data", s(&short)]), "too few");
    // A uint32 shard trains.
    let wide = d.join("wide.bin");
    write_llmc_shard_u32(
        &wide,
        &(0..600).map(|i| 70_000 + i % 50).collect::<Vec<u32>>(),
    )
    .unwrap();
    let out = duet(&with(&base, &["--data", s(&wide), "--log-every", "0"]));
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("vocab set to 70050"));
}
