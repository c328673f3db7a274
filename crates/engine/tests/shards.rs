//! Shard sets: resolution of files, folders and globs; the formats; the sampler over several
//! shards (windows inside one shard, order by seed, exact resume); validation shards; and a
//! single file read exactly as before shard sets existed.

use duet_cpu::CpuDevice;
use duet_engine::dataset::{
    DataFormat, DataSet, Prefetcher, Source, VAL_FRACTION, resolve_data, write_llmc_shard,
    write_llmc_shard_u32,
};
use duet_engine::rng::Rng;
use duet_engine::{Config, Preset, Trainer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A fresh folder for `name`.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("duet-shards-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap()
}

/// Shard `k` of `n` tokens: token `i` is `1000·k + i % 1000`, so a token tells its shard and
/// its place (windows here are far shorter than 1000).
fn tagged(k: u16, n: usize) -> Vec<u16> {
    (0..n).map(|i| 1000 * k + (i % 1000) as u16).collect()
}

#[test]
fn folders_globs_and_lists_resolve_in_order() {
    let d = dir("resolve");
    for name in [
        "fw_train_000002.bin",
        "fw_train_000001.bin",
        "fw_val_000000.bin",
    ] {
        write_llmc_shard(&d.join(name), &tagged(1, 100)).unwrap();
    }
    std::fs::write(d.join("README.txt"), "not a shard").unwrap();
    let train =
        |names: &[&str]| -> Vec<PathBuf> { names.iter().map(|n| canon(&d.join(n))).collect() };

    // A folder: its *train* shards sorted by name, its *val* shards for validation.
    let f = resolve_data(&[s(&d)], &[], DataFormat::Auto).unwrap();
    assert_eq!(
        f.train,
        train(&["fw_train_000001.bin", "fw_train_000002.bin"])
    );
    assert_eq!(f.val, train(&["fw_val_000000.bin"]));
    // A glob: its matches sorted by name, all training.
    let g = resolve_data(&[s(&d.join("fw_train_*.bin"))], &[], DataFormat::Auto).unwrap();
    assert_eq!(g.train, f.train);
    assert!(g.val.is_empty(), "a glob gives no validation shards");
    // A list keeps its order; --val-data replaces the folder's val shards.
    let l = resolve_data(
        &[
            s(&d.join("fw_train_000002.bin")),
            s(&d.join("fw_train_000001.bin")),
        ],
        &[s(&d.join("*val*.bin"))],
        DataFormat::Auto,
    )
    .unwrap();
    assert_eq!(
        l.train,
        train(&["fw_train_000002.bin", "fw_train_000001.bin"])
    );
    assert_eq!(l.val, f.val);
    let v = resolve_data(
        &[s(&d)],
        &[s(&d.join("fw_train_000001.bin"))],
        DataFormat::Auto,
    );
    let e = v.unwrap_err().to_string();
    assert!(e.contains("listed twice"), "{e}");
    // A --val-data folder gives its val shards.
    let vf = resolve_data(
        &[s(&d.join("fw_train_000001.bin"))],
        &[s(&d)],
        DataFormat::Auto,
    )
    .unwrap();
    assert_eq!(vf.val, f.val);

    // Errors: one line each, naming what is wrong.
    let errs = [
        (
            resolve_data(&[s(&d.join("nope.bin"))], &[], DataFormat::Auto),
            "nope.bin",
        ),
        (
            resolve_data(&[s(&d.join("*_test_*.bin"))], &[], DataFormat::Auto),
            "matches no file",
        ),
        (
            resolve_data(&[s(&dir("empty-folder"))], &[], DataFormat::Auto),
            "holds no training",
        ),
        (
            resolve_data(
                &[s(&d.join("README.txt")), s(&d.join("fw_val_000000.bin"))],
                &[],
                DataFormat::Auto,
            ),
            "all text or all token shards",
        ),
    ];
    for (r, needle) in errs {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains(needle) && !e.contains('\n'),
            "'{needle}' not in {e}"
        );
    }
}

#[test]
fn uint32_and_nanogpt_shards_read_their_tokens() {
    let d = dir("formats");
    // uint32: two shards with ids past 65535.
    let a: Vec<u32> = (0..200).map(|i| 100_000 + i).collect();
    let b: Vec<u32> = (0..150).map(|i| 200_000 + i).collect();
    write_llmc_shard_u32(&d.join("a_train.bin"), &a).unwrap();
    write_llmc_shard_u32(&d.join("b_train.bin"), &b).unwrap();
    let files = resolve_data(&[s(&d)], &[], DataFormat::Auto).unwrap();
    let set = DataSet::open(&files, 8).unwrap();
    assert_eq!(set.vocab_needed, 200_149 + 1);
    let got: Vec<u32> = (0..150).map(|i| set.shards[1].token(i).unwrap()).collect();
    assert_eq!(got, b);
    // The sampler widens them unchanged: every window is consecutive ids of one shard.
    let (x, y) = set.random_windows(&mut Rng::new(4), 16, 8).unwrap();
    for (xr, yr) in x.chunks(8).zip(y.chunks(8)) {
        assert!(xr[0] >= 100_000);
        for j in 0..8 {
            assert_eq!(yr[j], xr[j] + 1);
        }
    }

    // nanoGPT: headerless train.bin / val.bin in a folder.
    let n = dir("nanogpt");
    let body = |t: &[u16]| t.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(n.join("train.bin"), body(&tagged(3, 800))).unwrap();
    std::fs::write(n.join("val.bin"), body(&tagged(4, 120))).unwrap();
    let e = DataSet::open(&resolve_data(&[s(&n)], &[], DataFormat::Auto).unwrap(), 8)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--data-format nanogpt") && e.contains("bad magic"),
        "{e}"
    );
    let files = resolve_data(&[s(&n)], &[], DataFormat::Nanogpt).unwrap();
    assert_eq!(files.val, vec![canon(&n.join("val.bin"))]);
    let set = DataSet::open(&files, 8).unwrap();
    assert_eq!((set.train_tokens(), set.val_tokens()), (800, 120));
    assert_eq!(set.vocab_needed, 4000 + 119 + 1);
    for (x, _) in set.validation_batches(4, 8, 8).unwrap() {
        assert!(
            x.iter().all(|&t| (4000..4120).contains(&t)),
            "validation reads val.bin"
        );
    }
}

/// Three training shards of different lengths (tokens tagged by shard).
fn three_shards(name: &str) -> (PathBuf, Vec<String>) {
    let d = dir(name);
    let lens = [300, 37, 1200];
    let mut list = Vec::new();
    for (k, n) in lens.iter().enumerate() {
        let p = d.join(format!("s_train_{k}.bin"));
        write_llmc_shard(&p, &tagged(k as u16 + 1, *n)).unwrap();
        list.push(s(&p));
    }
    write_llmc_shard(&d.join("s_val_0.bin"), &tagged(9, 200)).unwrap();
    (d, list)
}

#[test]
fn a_window_never_crosses_a_shard_and_every_window_can_be_drawn() {
    let (d, _) = three_shards("windows");
    let files = resolve_data(&[s(&d)], &[], DataFormat::Auto).unwrap();
    let set = DataSet::open(&files, 16).unwrap();
    let t = 16;
    let mut rng = Rng::new(11);
    let mut hit_shard = [0usize; 3];
    let mut hit_last = [false; 3];
    let lens = [300, 37, 1200];
    for _ in 0..400 {
        let (x, y) = set.random_windows(&mut rng, 8, t).unwrap();
        for (xr, yr) in x.chunks(t).zip(y.chunks(t)) {
            let k = (xr[0] / 1000) as usize - 1;
            let start = xr[0] % 1000;
            // One shard, consecutive positions (the tags wrap at 1000: shard 3 is longer).
            for j in 0..t {
                let want = 1000 * (k as i32 + 1) + (start + j as i32 + 1) % 1000;
                assert_eq!(yr[j], want, "window crosses at {:?}", xr);
                if j + 1 < t {
                    assert_eq!(xr[j + 1], yr[j]);
                }
            }
            hit_shard[k] += 1;
            // The last window of a shard starts at len − t − 1 (position mod 1000).
            if start as usize == (lens[k] - t - 1) % 1000 {
                hit_last[k] = true;
            }
        }
    }
    // Windows are drawn in proportion to a shard's window starts: 284 : 21 : 1184.
    assert!(hit_shard.iter().all(|&h| h > 0), "{hit_shard:?}");
    assert!(
        hit_shard[2] > hit_shard[0] && hit_shard[0] > hit_shard[1],
        "{hit_shard:?}"
    );
    assert!(hit_last[1], "the short shard's last window is reachable");
    // A shard shorter than one window is refused.
    let short = d.join("short.bin");
    write_llmc_shard(&short, &tagged(5, 16)).unwrap();
    let files = resolve_data(&[s(&short)], &[s(&d.join("s_val_0.bin"))], DataFormat::Auto).unwrap();
    let e = DataSet::open(&files, 16).unwrap_err().to_string();
    assert!(e.contains("short.bin") && e.contains("too few"), "{e}");
}

#[test]
fn the_order_depends_on_the_seed_and_the_shard_list_and_resumes_exactly() {
    let (_, list) = three_shards("order");
    let open = |list: &[String]| {
        Arc::new(DataSet::open(&resolve_data(list, &[], DataFormat::Auto).unwrap(), 16).unwrap())
    };
    let set = open(&list);
    let draw = |set: &Arc<DataSet>, seed: u64, n: usize| -> Vec<Vec<i32>> {
        let mut src = Source::File {
            data: set.clone(),
            rng: Rng::new(seed),
        };
        (0..n)
            .map(|_| src.next_batch(4, 16).unwrap().inputs)
            .collect()
    };
    assert_eq!(
        draw(&set, 5, 6),
        draw(&open(&list), 5, 6),
        "same seed, same batches"
    );
    assert_ne!(
        draw(&set, 5, 6),
        draw(&set, 6, 6),
        "another seed, other batches"
    );
    // Documented: the list's order is part of the data; reordering it draws other batches
    // (from the same windows).
    let reversed: Vec<String> = list.iter().rev().cloned().collect();
    assert_ne!(draw(&set, 5, 6), draw(&open(&reversed), 5, 6));

    // Resume: the state after batch 3 gives batches 4.. again, directly and prefetched.
    let mut src = Source::File {
        data: set.clone(),
        rng: Rng::new(5),
    };
    let mut state = 0;
    for _ in 0..3 {
        state = src.next_batch(4, 16).unwrap().state_after;
    }
    let next: Vec<Vec<i32>> = (0..4)
        .map(|_| src.next_batch(4, 16).unwrap().inputs)
        .collect();
    let mut resumed = Source::File {
        data: open(&list),
        rng: Rng::new(0),
    };
    resumed.set_state(state);
    let mut pre = Prefetcher::start(resumed, 4, 16, 2);
    let again: Vec<Vec<i32>> = (0..4).map(|_| pre.next_batch().unwrap().inputs).collect();
    assert_eq!(next, again);
}

#[test]
fn validation_shards_and_the_batch_bound() {
    let d = dir("val");
    write_llmc_shard(&d.join("x_train.bin"), &tagged(1, 400)).unwrap();
    write_llmc_shard(&d.join("x_val_0.bin"), &tagged(7, 300)).unwrap();
    write_llmc_shard(&d.join("x_val_1.bin"), &tagged(8, 500)).unwrap();
    let files = resolve_data(&[s(&d)], &[], DataFormat::Auto).unwrap();
    let set = DataSet::open(&files, 8).unwrap();
    // The training shard is wholly training (validation has shards of its own).
    assert_eq!((set.train_tokens(), set.val_tokens()), (400, 800));
    let t = 8;
    for max in [1, 3, 100] {
        let v = set.validation_batches(2, t, max).unwrap();
        // ⌈Σ ⌊(len − 1)/t⌋ / b⌉ = ⌈(37 + 62) / 2⌉ = 50 batches at most.
        assert_eq!(v.len(), max.min(50), "bound {max}");
        for (x, y) in &v {
            for (xr, yr) in x.chunks(t).zip(y.chunks(t)) {
                assert!(
                    xr.iter().chain(yr).all(|&v| v / 1000 == xr[0] / 1000),
                    "one shard"
                );
                assert!(xr[0] / 1000 >= 7, "validation reads val shards only");
                assert_eq!(&xr[1..], &yr[..t - 1]);
            }
        }
    }
    // Spread over both shards.
    let tags: std::collections::BTreeSet<i32> = set
        .validation_batches(2, t, 100)
        .unwrap()
        .iter()
        .map(|(x, _)| x[0] / 1000)
        .collect();
    assert_eq!(tags.into_iter().collect::<Vec<_>>(), [7, 8]);
}

// --- The single-file path, against the algorithm before shard sets (copied from it). ---

/// The tokens of the old `TokenFile::open`, split: the tail max(⌊n·VAL_FRACTION⌋, seq + 1).
fn old_split(tokens: &[u32], seq: usize) -> (Vec<u32>, Vec<u32>) {
    let n_val = ((tokens.len() as f64 * VAL_FRACTION) as usize).max(seq + 1);
    let split = tokens.len() - n_val;
    (tokens[..split].to_vec(), tokens[split..].to_vec())
}

/// The old sampler, verbatim.
fn old_random_windows(tokens: &[u32], rng: &mut Rng, b: usize, t: usize) -> (Vec<i32>, Vec<i32>) {
    let mut inputs = Vec::with_capacity(b * t);
    let mut targets = Vec::with_capacity(b * t);
    let starts = (tokens.len() - t) as u64;
    for _ in 0..b {
        let s = rng.below(starts) as usize;
        inputs.extend(tokens[s..s + t].iter().map(|&x| x as i32));
        targets.extend(tokens[s + 1..s + t + 1].iter().map(|&x| x as i32));
    }
    (inputs, targets)
}

/// The old validation batches, verbatim.
fn old_validation_batches(
    val: &[u32],
    b: usize,
    t: usize,
    max_batches: usize,
) -> Vec<(Vec<i32>, Vec<i32>)> {
    let windows = (val.len() - 1) / t;
    let n_batches = windows.div_ceil(b).clamp(1, max_batches);
    let total = n_batches * b;
    let stride = ((val.len() - t - 1) as f64 / total.max(1) as f64).max(0.0);
    (0..n_batches)
        .map(|i| {
            let mut x = Vec::with_capacity(b * t);
            let mut y = Vec::with_capacity(b * t);
            for r in 0..b {
                let s = ((i * b + r) as f64 * stride) as usize;
                x.extend(val[s..s + t].iter().map(|&v| v as i32));
                y.extend(val[s + 1..s + t + 1].iter().map(|&v| v as i32));
            }
            (x, y)
        })
        .collect()
}

#[test]
fn a_single_file_gives_the_batches_it_gave_before() {
    let d = dir("single");
    let text = d.join("corpus.txt");
    let body: String = (0..300)
        .map(|i| format!("line {i}: the quick brown fox. "))
        .collect();
    std::fs::write(&text, &body).unwrap();
    let shard = d.join("one.bin");
    let toks: Vec<u16> = (0..5000u32).map(|i| (i * 7919 % 50257) as u16).collect();
    write_llmc_shard(&shard, &toks).unwrap();
    let cases: [(PathBuf, Vec<u32>); 2] = [
        (text, body.bytes().map(u32::from).collect()),
        (shard, toks.iter().map(|&t| t as u32).collect()),
    ];
    for (path, tokens) in cases {
        for (b, t) in [(4, 16), (3, 33)] {
            let set = Arc::new(
                DataSet::open(
                    &resolve_data(&[s(&path)], &[], DataFormat::Auto).unwrap(),
                    t,
                )
                .unwrap(),
            );
            let (train, val) = old_split(&tokens, t);
            assert_eq!(
                (set.train_tokens(), set.val_tokens()),
                (train.len(), val.len())
            );
            let mut old = Rng::derive(1337, 3);
            let mut src = Source::File {
                data: set.clone(),
                rng: Rng::derive(1337, 3),
            };
            for _ in 0..20 {
                let batch = src.next_batch(b, t).unwrap();
                let (x, y) = old_random_windows(&train, &mut old, b, t);
                assert_eq!((batch.inputs, batch.targets), (x, y), "{}", path.display());
                assert_eq!(batch.state_after, old.state());
            }
            for max in [1, 8] {
                assert_eq!(
                    set.validation_batches(b, t, max).unwrap(),
                    old_validation_batches(&val, b, t, max)
                );
            }
        }
    }
}

/// A tiny model on a file: the trainer's data order is the old sampler's from
/// `Rng::derive(seed, 3)` (so the losses are those of before), and a resume from a checkpoint
/// continues with the losses of the run that did not stop; the checkpoint holds one
/// fingerprint per shard.
#[test]
fn the_trainer_on_shards_keeps_its_losses_and_resumes() {
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let d = dir("trainer");
    let text = d.join("corpus.txt");
    let body = "the quick brown fox jumps over the lazy dog. ".repeat(60);
    std::fs::write(&text, &body).unwrap();
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.model.vocab = 256;
    cfg.train.data.eval_sequences = 0;
    let mut file_cfg = cfg.clone();
    file_cfg.train.data.data = vec![s(&text)];
    let (b, t) = (cfg.train.data.batch, cfg.train.data.seq);
    let mut on_file = Trainer::new(dev.clone(), file_cfg).unwrap();
    let mut by_hand = Trainer::new(dev.clone(), cfg.clone()).unwrap();
    let (train, _) = old_split(&body.bytes().map(u32::from).collect::<Vec<_>>(), t);
    let mut rng = Rng::derive(cfg.train.data.seed, 3);
    for _ in 0..3 {
        let (x, y) = old_random_windows(&train, &mut rng, b, t);
        let want = by_hand.train_step_on(&x, &y).unwrap().loss;
        assert_eq!(on_file.train_step().unwrap().loss.to_bits(), want.to_bits());
    }

    // Shards: two training, one validation; 4 straight steps against 2 + resume + 2.
    let (sd, _) = three_shards("trainer-shards");
    let mut shard_cfg = cfg.clone();
    shard_cfg.model.vocab = 9200;
    shard_cfg.train.data.data = vec![s(&sd)];
    shard_cfg.train.data.val_batches = 2;
    let mut straight = Trainer::new(dev.clone(), shard_cfg.clone()).unwrap();
    let all: Vec<u32> = (0..4)
        .map(|_| straight.train_step().unwrap().loss.to_bits())
        .collect();
    let mut first = Trainer::new(dev.clone(), shard_cfg).unwrap();
    for _ in 0..2 {
        first.train_step().unwrap();
    }
    let ck = first.checkpoint().unwrap();
    let files: Vec<serde_json::Value> =
        serde_json::from_str(&ck.extra[duet_engine::train::DATA_FILES_KEY]).unwrap();
    assert_eq!(
        files.len(),
        4,
        "three training shards and one validation shard"
    );
    let ck = duet_engine::checkpoint::Checkpoint::from_bytes(&ck.to_bytes().unwrap()).unwrap();
    let mut resumed = Trainer::from_checkpoint(dev.clone(), &ck).unwrap();
    let rest: Vec<u32> = (0..2)
        .map(|_| resumed.train_step().unwrap().loss.to_bits())
        .collect();
    assert_eq!(rest, all[2..]);
    assert!(resumed.has_validation_data());
    assert!(resumed.validation_loss().unwrap().is_finite());
}
