//! The vocabulary padded on the device (model::VOCAB_PAD): the padded rows of the token
//! embedding / LM head, their gradients and AdamW moments stay exactly zero through training
//! in every precision, and nothing outside the device sees them (weights, checkpoints, logits).
//! That the padded model computes what an unpadded one does is tests/reference_pytorch.rs
//! (PyTorch's unpadded GPT-2 against duet's tiny model, vocab 96 held as 128).

use duet_cpu::CpuDevice;
use duet_device::DeviceExt;
use duet_engine::model::{VOCAB_PAD, padded_vocab};
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

#[test]
fn padded_rows_stay_zero_and_stay_inside_the_device() {
    for precision in [
        Precision::Fp32,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
    ] {
        let mut cfg = Config::preset(Preset::Tiny);
        cfg.train.recipe.precision = precision;
        // An odd vocabulary, as GPT-2's.
        cfg.model.vocab = 201;
        let (v, c) = (cfg.model.vocab, cfg.model.d_model);
        assert_eq!(padded_vocab(&cfg.model), 256);
        assert_eq!(256 % VOCAB_PAD, 0);
        let dev = Arc::new(CpuDevice::new(Some(2)).unwrap());
        let mut tr = Trainer::new(dev.clone(), cfg.clone()).unwrap();
        for _ in 0..4 {
            tr.train_step().unwrap();
        }
        let tail = |b: &duet_cpu::CpuBuffer| -> Vec<f32> {
            dev.download_f32(b).unwrap()[v * c..].to_vec()
        };
        let zero = |name: &str, t: Vec<f32>| {
            assert_eq!(t.len(), (256 - v) * c, "{precision} {name}: not padded");
            assert!(
                t.iter().all(|&x| x == 0.0),
                "{precision} {name}: a padded value is not 0"
            );
        };
        zero("wte", tail(&tr.model().params()[0]));
        zero("wte grad", tail(&tr.model().grads()[0]));
        let (m, vv) = tr.optimizer().moments();
        zero("adam m", tail(&m[0]));
        zero("adam v", tail(&vv[0]));
        if let Some(master) = tr.optimizer().master(0) {
            zero("wte master", tail(master));
        }
        // Outside the device: real sizes.
        assert_eq!(tr.model().weights().unwrap()[0].len(), v * c);
        let ck = tr.checkpoint().unwrap();
        assert_eq!(ck.weights[0].len(), v * c);
        assert_eq!(ck.adam_m[0].len(), v * c);
        let back =
            duet_engine::checkpoint::Checkpoint::from_bytes(&ck.to_bytes().unwrap()).unwrap();
        assert_eq!(back.weights[0].len(), v * c);
        // Resumed, it continues with the same losses as the run it came from.
        let mut again = Trainer::from_checkpoint(dev.clone(), &ck).unwrap();
        let (a, b) = (tr.train_step().unwrap(), again.train_step().unwrap());
        assert_eq!(
            a.loss.to_bits(),
            b.loss.to_bits(),
            "{precision}: resumed loss"
        );
        let b_t = cfg.train.data.batch * cfg.train.data.seq;
        assert_eq!(tr.model().logits().unwrap().len(), b_t * v);
    }
}

#[test]
fn gpt2_presets_have_gpt2s_sizes_and_plan_their_memory() {
    use duet_engine::model::estimate_memory;
    use duet_engine::precision::PrecisionPlan;
    let dev = CpuDevice::new(Some(1)).unwrap();
    // (preset, parameters as OpenAI counts them: tied embedding, no lm_head copy)
    for (name, params) in [
        ("gpt2", 124_439_808u64),
        ("gpt2-medium", 354_823_168),
        ("gpt2-large", 774_030_080),
        ("gpt2-xl", 1_557_611_200),
    ] {
        let cfg = Config::preset(name.parse().unwrap());
        assert_eq!(cfg.model.vocab, 50257);
        assert_eq!(cfg.model.max_seq, 1024);
        assert_eq!(cfg.model.num_params() as u64, params, "{name}");
        cfg.validate().unwrap();
        assert_eq!(padded_vocab(&cfg.model), 50304);
        // Planned, not allocated (gpt2-xl's optimizer state alone exceeds a 24 GiB machine).
        let plan = estimate_memory(
            &dev,
            &cfg.model,
            cfg.train.data.batch,
            cfg.train.data.seq,
            &PrecisionPlan::new(Precision::Bf16),
        )
        .unwrap();
        assert!(plan.params >= 2 * params, "{name}: {plan:?}");
    }
    // The CPU trains gpt2 itself at a small batch and sequence (a few layers fewer: the same
    // vocabulary, padding and loss).
    let mut cfg = Config::preset(Preset::Gpt2);
    cfg.model.layers = 1;
    cfg.train.data.batch = 1;
    cfg.train.data.seq = 16;
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    let mut tr = Trainer::new(dev, cfg).unwrap();
    let r = tr.train_step().unwrap();
    // Near the uniform loss at the start (ln 50257 ≈ 10.825; whether the padding takes part
    // is the conformance suite's cross_entropy_padded case and the PyTorch reference test).
    assert!((r.loss - 50257f32.ln()).abs() < 0.1, "{}", r.loss);
}
