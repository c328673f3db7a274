//! SFT shards in the engine: rows of one example whose targets are its learned tokens only
//! (padding and unlearned positions ignored), truncation and left-out examples counted, token
//! and SFT shards not mixed, and the loss of a batch the mean over its learned targets alone.

use duet_cpu::CpuDevice;
use duet_engine::dataset::{
    DataFormat, DataSet, SFT_LEARNED, SFT_MAGIC, SFT_VERSION, llmc_header, resolve_data,
    write_llmc_shard,
};
use duet_engine::rng::Rng;
use duet_engine::{Config, Preset, Trainer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("duet-sft-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Writes an SFT shard of `examples` (token ids with their learned marks).
fn write_sft(path: &Path, examples: &[Vec<(u32, bool)>]) {
    let n: usize = examples.iter().map(Vec::len).sum();
    let mut out = llmc_header(SFT_MAGIC, SFT_VERSION, examples.len());
    out[12..16].copy_from_slice(&(n as i32).to_le_bytes());
    let mut at = 0u64;
    out.extend(at.to_le_bytes());
    for e in examples {
        at += e.len() as u64;
        out.extend(at.to_le_bytes());
    }
    for &(id, learned) in examples.iter().flatten() {
        out.extend((id | if learned { SFT_LEARNED } else { 0 }).to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

/// Example `k`: a prompt of `p` tokens (first token 100 + k, so a row names its example), then
/// `c` learned tokens.
fn example(k: u32, p: usize, c: usize) -> Vec<(u32, bool)> {
    (0..p + c)
        .map(|i| {
            let id = if i == 0 {
                100 + k
            } else {
                (k * 7 + i as u32 * 3) % 90
            };
            (id, i >= p)
        })
        .collect()
}

fn files(train: &Path, val: &Path) -> duet_engine::dataset::DataFiles {
    resolve_data(
        &[train.display().to_string()],
        &[val.display().to_string()],
        DataFormat::Auto,
    )
    .unwrap()
}

/// Shards of 12 training examples (one longer than seq + 1, one whose learned tokens all lie
/// past seq + 1) and 3 validation examples.
fn shards(name: &str, t: usize) -> (PathBuf, PathBuf, Vec<Vec<(u32, bool)>>) {
    let mut ex: Vec<_> = (0..10)
        .map(|k| example(k, 3 + k as usize % 4, 2 + k as usize % 3))
        .collect();
    ex.push(example(10, 4, t + 5)); // cut, still learned
    ex.push(example(11, t + 3, 2)); // no learned target in its row: left out
    let (tr, va) = (
        tmp(&format!("{name}_train.bin")),
        tmp(&format!("{name}_val.bin")),
    );
    write_sft(&tr, &ex);
    write_sft(
        &va,
        &[example(20, 2, 3), example(21, 5, 1), example(22, 1, 4)],
    );
    (tr, va, ex)
}

#[test]
fn rows_target_the_learned_tokens_only() {
    let t = 16;
    let (tr, va, ex) = shards("rows", t);
    let set = DataSet::open(&files(&tr, &va), t).unwrap();
    let sft = set.sft.as_ref().expect("SFT shards");
    assert_eq!((sft.train.len(), sft.val.len()), (11, 3));
    assert_eq!((sft.truncated, sft.skipped), (2, 1));
    assert_eq!(sft.longest.as_ref().unwrap().1, t + 9);
    let b = 8;
    let mut rng = Rng::new(5);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let (x, y) = set.random_windows(&mut rng, b, t).unwrap();
        assert_eq!((x.len(), y.len()), (b * t, b * t));
        for r in 0..b {
            let (xr, yr) = (&x[r * t..(r + 1) * t], &y[r * t..(r + 1) * t]);
            let k = (xr[0] - 100) as usize;
            seen.insert(k);
            let e = &ex[k];
            let n = e.len().min(t + 1);
            for i in 0..t {
                if i + 1 < n {
                    assert_eq!(xr[i], e[i].0 as i32, "example {k} input {i}");
                    let want = if e[i + 1].1 { e[i + 1].0 as i32 } else { -1 };
                    assert_eq!(yr[i], want, "example {k} target {i}");
                } else {
                    assert_eq!((xr[i], yr[i]), (0, -1), "example {k} padding {i}");
                }
            }
            assert!(yr.iter().any(|&v| v >= 0), "a row without a learned target");
        }
    }
    assert!(!seen.contains(&11) && seen.len() == 11, "{seen:?}");
    // Validation: one batch of the 3 examples, evenly spaced.
    let v = set.validation_batches(b, t, 8).unwrap();
    assert_eq!(v.len(), 1);
    let firsts: Vec<i32> = (0..b).map(|r| v[0].0[r * t]).collect();
    assert_eq!(firsts, [120, 120, 120, 121, 121, 121, 122, 122]);
    assert!(v[0].1[..t].iter().filter(|&&y| y >= 0).count() == 3);
}

#[test]
fn token_and_sft_shards_do_not_mix() {
    let (tr, _, _) = shards("mix", 16);
    let tok = tmp("mix_tokens_val.bin");
    write_llmc_shard(&tok, &(0..400).map(|i| (i % 50) as u16).collect::<Vec<_>>()).unwrap();
    let e = DataSet::open(&files(&tr, &tok), 16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("all token shards or all SFT shards"), "{e}");
}

/// The loss of an SFT batch is the mean cross-entropy over its learned targets alone: computed
/// by hand from the logits, and not the mean over every next token.
#[test]
fn the_masked_loss_is_the_mean_over_learned_targets() {
    let t = 16;
    let (tr, va, _) = shards("loss", t);
    let mut c = Config::preset(Preset::Tiny);
    c.train.data.batch = 4;
    c.train.data.seq = t;
    c.model.vocab = 128;
    c.train.data.data = vec![tr.display().to_string()];
    c.train.data.val_data = vec![va.display().to_string()];
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut trainer = Trainer::new(dev, c.clone()).unwrap();
    let set = DataSet::open(&files(&tr, &va), t).unwrap();
    let (x, y) = set.random_windows(&mut Rng::new(9), 4, t).unwrap();
    let m = trainer.model_mut();
    m.forward(&x).unwrap();
    let logits = m.logits().unwrap();
    let v = logits.len() / x.len();
    let ce = |i: usize, target: i32| -> f64 {
        let row = &logits[i * v..(i + 1) * v];
        let max = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&z| (z as f64 - max).exp())
                .sum::<f64>()
                .ln();
        lse - row[target as usize] as f64
    };
    let learned: Vec<usize> = (0..y.len()).filter(|&i| y[i] >= 0).collect();
    assert!(learned.len() < y.len() / 2, "most positions are masked");
    let manual = learned.iter().map(|&i| ce(i, y[i])).sum::<f64>() / learned.len() as f64;
    let loss = m.loss(&y, false).unwrap() as f64;
    assert!((loss - manual).abs() < 1e-4 * manual, "{loss} vs {manual}");
    // Every next token as a target (the mask dropped): another loss.
    let mut all = y.clone();
    for r in 0..4 {
        for i in 0..t - 1 {
            if x[r * t + i + 1] != 0 {
                all[r * t + i] = x[r * t + i + 1];
            }
        }
    }
    let unmasked = m.loss(&all, false).unwrap() as f64;
    assert!((unmasked - manual).abs() > 1e-3, "{unmasked} vs {manual}");
    // Training and validation run on these rows, their losses finite.
    let r = trainer.train_step().unwrap();
    assert!(r.loss.is_finite());
    assert!(trainer.validation_loss().unwrap().is_finite());
}
