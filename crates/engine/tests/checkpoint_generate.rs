//! Resume gives the same losses as an uninterrupted run; the KV-cache generator matches the full
//! forward pass.

use duet_cpu::CpuDevice;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::generate::{Generator, Sampling, WeightFormat};
use duet_engine::model::{Gpt, init_weights};
use duet_engine::{Config, Preset, Trainer};
use std::sync::Arc;

#[test]
fn resume_continues_with_identical_losses() {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.steps = 20;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut full = Trainer::new(dev.clone(), cfg.clone()).unwrap();
    let all: Vec<f32> = (0..20).map(|_| full.train_step().unwrap().loss).collect();

    let mut first = Trainer::new(dev.clone(), cfg).unwrap();
    for _ in 0..10 {
        first.train_step().unwrap();
    }
    let dir = std::env::temp_dir().join(format!("duet-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ck.safetensors");
    first.checkpoint().unwrap().save(&path).unwrap();
    drop(first);
    let ck = Checkpoint::load(&path).unwrap();
    assert_eq!(ck.step, 10);
    let mut resumed = Trainer::from_checkpoint(dev, &ck).unwrap();
    let rest: Vec<f32> = (0..10)
        .map(|_| resumed.train_step().unwrap().loss)
        .collect();
    assert_eq!(
        &all[10..],
        &rest[..],
        "losses after resume must be identical"
    );
}

#[test]
fn kv_cache_generation_matches_the_full_forward() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 11);
    let t = cfg.max_seq;
    let mut full = Gpt::new(dev.clone(), &cfg, 1, t, &weights).unwrap();
    let tokens: Vec<i32> = (0..t as i32).map(|i| (i * 37 + 5) % 96).collect();
    full.forward(&tokens).unwrap();
    let expected = full.logits().unwrap();
    let model = Gpt::new(dev, &cfg, 1, 1, &weights).unwrap();
    let mut g = Generator::new(&model).unwrap();
    for (pos, &tok) in tokens.iter().enumerate() {
        let got = g.step(tok).unwrap();
        let want = &expected[pos * cfg.vocab..(pos + 1) * cfg.vocab];
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "position {pos}: max |Δlogit| {err}");
    }
    assert!(
        g.step(1)
            .unwrap_err()
            .to_string()
            .contains("context is full")
    );
    // Greedy generation is deterministic; sampling with a seed is reproducible.
    let mut g1 = Generator::new(&model).unwrap();
    let mut g2 = Generator::new(&model).unwrap();
    let s = Sampling {
        temperature: 0.8,
        top_k: 5,
        seed: 3,
        ..Sampling::default()
    };
    assert_eq!(
        g1.generate(&[1, 2, 3], 8, &s).unwrap(),
        g2.generate(&[1, 2, 3], 8, &s).unwrap()
    );
}

#[test]
fn fp8_weights_generate_like_f32_in_a_quarter_of_the_memory() {
    let mut cfg = Config::preset(Preset::Tiny);
    cfg.train.steps = 60;
    cfg.train.optimizer.lr = 1e-2;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let mut tr = Trainer::new(dev.clone(), cfg.clone()).unwrap();
    for _ in 0..cfg.train.steps {
        tr.train_step().unwrap();
    }
    let weights = tr.checkpoint().unwrap().weights;
    let m = &cfg.model;
    let mut f32g = Generator::from_weights(dev.clone(), m, &weights, WeightFormat::F32).unwrap();
    let mut fp8g = Generator::from_weights(dev, m, &weights, WeightFormat::Fp8).unwrap();
    let linear: u64 = (m.layers * (4 * m.d_model * m.d_model + 2 * m.d_model * m.ffn)) as u64;
    assert_eq!(
        f32g.weight_bytes() - fp8g.weight_bytes(),
        3 * linear,
        "matrices shrink 4×"
    );
    let prompt = [3, 7, 11, 15, 19, 23];
    let mut worst = 0f32;
    for &t in &prompt {
        let a = f32g.step(t).unwrap();
        let b = fp8g.step(t).unwrap();
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
            / scale;
        worst = worst.max(err);
        assert!(err > 0.0, "FP8 weights must actually be quantised");
    }
    assert!(
        worst < 0.1,
        "logits with FP8 weights differ by {worst} of their scale"
    );
}

/// Past the context, the sliding window keeps generating: up to the context its tokens are
/// `generate`'s; after a re-fill each token is the one a fresh generator gives for the last
/// `keep` tokens (the window it was predicted from; here `max_seq − 1`, the most context).
#[test]
fn sliding_generation_continues_past_the_context() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 11);
    let model = Gpt::new(dev, &cfg, 1, 1, &weights).unwrap();
    let t = cfg.max_seq;
    let prompt = [1, 2, 3];
    for s in [
        Sampling::default(),
        Sampling {
            temperature: 0.8,
            top_k: 20,
            seed: 5,
            ..Sampling::default()
        },
    ] {
        let mut g = Generator::new(&model).unwrap();
        let within = g.generate(&prompt, 1000, &s).unwrap();
        assert_eq!(within.len(), t - prompt.len());
        let n = 2 * t + 5;
        let mut g = Generator::new(&model).unwrap();
        g.set_keep(t - 1).unwrap();
        let slid = g.generate_sliding(&prompt, n, &s).unwrap();
        assert_eq!(slid.len(), n);
        assert_eq!(&slid[..within.len()], &within[..]);
        if s.temperature == 0.0 {
            // Greedy: token i is argmax after the last t − 1 tokens before it (or all of them).
            let seq: Vec<i32> = prompt.iter().chain(&slid).copied().collect();
            for i in [t, t + 1, t + 7, 2 * t + 4] {
                // seq[end] is new token i; the cache held the tokens before it: all of them
                // within the first context, then t − 1 right after a re-fill, t the step after.
                let end = prompt.len() + i;
                let ctx_len = if end < t {
                    end
                } else {
                    t - 1 + (end - (t - 1)) % 2
                };
                let mut g = Generator::new(&model).unwrap();
                let ctx = &seq[end - ctx_len..end];
                let mut logits = Vec::new();
                for &x in ctx {
                    logits = g.step(x).unwrap();
                }
                assert_eq!(
                    duet_engine::generate::sample(&logits, &s, &mut duet_engine::rng::Rng::new(0)),
                    seq[end] as usize,
                    "token {i}"
                );
            }
        }
    }
    // A prompt longer than the context is cropped to its last `max_seq − 1` tokens.
    let long: Vec<i32> = (0..t as i32 + 10).map(|i| i % 50).collect();
    let mut g = Generator::new(&model).unwrap();
    let a = g.generate_sliding(&long, 4, &Sampling::default()).unwrap();
    let b = Generator::new(&model)
        .unwrap()
        .generate(&long[long.len() - (t - 1)..], 4, &Sampling::default())
        .unwrap();
    // (`generate` has room for one token after t − 1.)
    assert_eq!((a.len(), &a[..1]), (4, &b[..]));
    assert!(g.set_keep(t).is_err() && g.set_keep(0).is_err());
}

/// Past the context a new token costs one pass through the model and under two positions of
/// compute: the window keeps `max_seq / 2` tokens and is re-filled in one batched prefill every
/// `max_seq / 2 + 1` tokens. (It kept `max_seq − 1`, re-filled one position at a time: a
/// re-fill every other token, `max_seq / 2` positions and passes a token.)
#[test]
fn past_the_context_a_token_costs_one_pass_and_under_two_positions() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 11);
    let t = cfg.max_seq;
    let prompt = [1, 2, 3];
    let n = 40 * t;
    let mut g = Generator::from_weights(dev.clone(), &cfg, &weights, WeightFormat::F32).unwrap();
    assert_eq!(
        g.generate_sliding(&prompt, n, &Sampling::default())
            .unwrap()
            .len(),
        n
    );
    let st = g.stats();
    // The prompt's prefill, then one pass for each new token but the last (only sampled).
    assert_eq!(st.passes, n as u64, "{st:?}");
    assert_eq!(st.prefills, st.refills + 1, "{st:?}");
    let keep = t / 2;
    let cycle = (t - keep + 1) as u64;
    assert!(st.refills >= (n - t) as u64 / cycle, "{st:?}");
    let per_token = (st.positions - prompt.len() as u64) as f64 / n as f64;
    assert!(per_token < 2.0, "{per_token} positions a new token: {st:?}");

    // The old window, for scale: max_seq / 2 positions a token.
    let mut old = Generator::from_weights(dev, &cfg, &weights, WeightFormat::F32).unwrap();
    old.set_keep(t - 1).unwrap();
    old.generate_sliding(&prompt, n, &Sampling::default())
        .unwrap();
    let per_token_old = old.stats().positions as f64 / n as f64;
    assert!(
        per_token_old > (t / 2 - 1) as f64,
        "{per_token_old} with keep max_seq − 1"
    );
}

/// A prefill computes what the training forward pass (and a step at a time) computes, and fills
/// the cache the next step reads.
#[test]
fn a_prefill_computes_the_full_forward() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 5);
    let t = cfg.max_seq;
    let mut full = Gpt::new(dev.clone(), &cfg, 1, t, &weights).unwrap();
    let tokens: Vec<i32> = (0..t as i32).map(|i| (i * 29 + 3) % 96).collect();
    full.forward(&tokens).unwrap();
    let expected = full.logits().unwrap();
    let v = cfg.vocab;
    let close = |got: &[f32], pos: usize| {
        let want = &expected[pos * v..(pos + 1) * v];
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "position {pos}: max |Δlogit| {err}");
    };
    let mut g = Generator::from_weights(dev, &cfg, &weights, WeightFormat::F32).unwrap();
    for n in [2, 5, t - 1, t] {
        g.reset();
        close(&g.feed(&tokens[..n]).unwrap(), n - 1);
        assert_eq!(g.len(), n);
        if n < t {
            close(&g.step(tokens[n]).unwrap(), n);
        }
    }
    assert_eq!(g.stats().prefills, 4);
}

/// Nucleus sampling keeps the fewest most likely tokens whose probabilities reach top-p.
#[test]
fn top_p_samples_the_nucleus() {
    use duet_engine::generate::sample;
    use duet_engine::rng::Rng;
    // Probabilities 0.2, 0.5, 0.3.
    let logits = [0.2f32.ln(), 0.5f32.ln(), 0.3f32.ln()];
    let seen = |top_p: f32| {
        let s = Sampling {
            temperature: 1.0,
            top_p,
            ..Sampling::default()
        };
        let mut rng = Rng::new(9);
        let mut counts = [0; 3];
        for _ in 0..3000 {
            counts[sample(&logits, &s, &mut rng)] += 1;
        }
        counts.map(|c| c > 0)
    };
    assert_eq!(seen(0.45), [false, true, false]);
    assert_eq!(seen(0.7), [false, true, true]);
    assert_eq!(seen(0.85), [true, true, true]);
    assert_eq!(seen(1.0), [true, true, true]);
}

/// Generation stops after the end-of-text token, which is the last one returned.
#[test]
fn generation_stops_at_the_end_of_text_token() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 11);
    let mut g = Generator::from_weights(dev, &cfg, &weights, WeightFormat::F32).unwrap();
    let free = g.generate(&[1, 2, 3], 8, &Sampling::default()).unwrap();
    let eos = Sampling {
        eos: Some(free[2]),
        ..Sampling::default()
    };
    let first = free.iter().position(|&x| x == free[2]).unwrap();
    for stopped in [
        {
            g.reset();
            g.generate(&[1, 2, 3], 8, &eos).unwrap()
        },
        g.generate_sliding(&[1, 2, 3], 8, &eos).unwrap(),
    ] {
        assert_eq!(stopped, free[..=first]);
    }
}

/// With the default window (`max_seq / 2` kept), each greedy token is the argmax after exactly
/// the tokens the cache held: replayed here a step at a time on a fresh generator.
#[test]
fn the_default_window_predicts_each_token_from_what_it_kept() {
    let cfg = Config::preset(Preset::Tiny).model;
    let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
    let weights = init_weights(&cfg, 11);
    let model = Gpt::new(dev, &cfg, 1, 1, &weights).unwrap();
    let (t, keep) = (
        cfg.max_seq,
        duet_engine::generate::sliding_keep(cfg.max_seq),
    );
    assert_eq!(keep, t / 2);
    let prompt = [1, 2, 3];
    let n = 3 * t;
    let s = Sampling::default();
    let slid = Generator::new(&model)
        .unwrap()
        .generate_sliding(&prompt, n, &s)
        .unwrap();
    let seq: Vec<i32> = prompt.iter().chain(&slid).copied().collect();
    let (mut lo, mut refills) = (0, 0);
    for end in prompt.len()..seq.len() {
        let mut g = Generator::new(&model).unwrap();
        let mut logits = Vec::new();
        for &x in &seq[lo..end] {
            logits = g.step(x).unwrap();
        }
        let mut rng = duet_engine::rng::Rng::new(0);
        let want = duet_engine::generate::sample(&logits, &s, &mut rng);
        assert_eq!(want, seq[end] as usize, "token {end} after {lo}..{end}");
        // The cache held seq[lo..end]: full, it keeps the last `keep` tokens with this one.
        if end - lo == t {
            lo = end + 1 - keep;
            refills += 1;
        }
    }
    assert!(refills >= 4, "{refills}");
}
