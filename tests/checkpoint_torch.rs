//! A checkpoint written by duet loads in PyTorch under nanoGPT's names.
//!
//! `tests/reference/duet_checkpoint.safetensors` was written by this test (with
//! `DUET_WRITE_FIXTURES=1`) after a few training steps, together with duet's logits on a fixed
//! batch (`duet_logits.safetensors`). `python3 tests/reference/make_reference.py --check-duet`
//! loads the checkpoint into the PyTorch model with `load_state_dict(strict=True)` and compares
//! its logits with duet's. Here, without PyTorch, the test checks that duet still reads that
//! checkpoint and reproduces the same logits, so the format cannot drift from what was checked.

use duet_cpu::CpuDevice;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::model::Gpt;
use duet_engine::{Config, Preset, Trainer};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(name)
}

fn batch(cfg: &Config) -> Vec<i32> {
    let n = cfg.train.data.batch * cfg.train.data.seq;
    (0..n as i32)
        .map(|i| (i * 31 + 7) % cfg.model.vocab as i32)
        .collect()
}

fn logits_of(ck: &Checkpoint, tokens: &[i32]) -> Vec<f32> {
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    let cfg = &ck.config;
    let mut m = Gpt::new(
        dev,
        &cfg.model,
        cfg.train.data.batch,
        cfg.train.data.seq,
        &ck.weights,
    )
    .unwrap();
    m.forward(tokens).unwrap();
    m.logits().unwrap()
}

#[test]
fn committed_checkpoint_reproduces_its_logits() {
    if std::env::var("DUET_WRITE_FIXTURES").as_deref() == Ok("1") {
        let cfg = Config::preset(Preset::Tiny);
        let dev = Arc::new(CpuDevice::new(None).unwrap());
        let mut tr = Trainer::new(dev, cfg.clone()).unwrap();
        for _ in 0..5 {
            tr.train_step().unwrap();
        }
        let ck = tr.checkpoint().unwrap();
        ck.save(&fixture("duet_checkpoint.safetensors")).unwrap();
        let tokens = batch(&cfg);
        let logits = logits_of(&ck, &tokens);
        let tb: Vec<u8> = tokens.iter().flat_map(|x| x.to_le_bytes()).collect();
        let lb: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        let n = cfg.train.data.batch * cfg.train.data.seq;
        let views = vec![
            (
                "input_ids",
                TensorView::new(
                    Dtype::I32,
                    vec![cfg.train.data.batch, cfg.train.data.seq],
                    &tb,
                )
                .unwrap(),
            ),
            (
                "logits",
                TensorView::new(Dtype::F32, vec![n, cfg.model.vocab], &lb).unwrap(),
            ),
        ];
        std::fs::write(
            fixture("duet_logits.safetensors"),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
    }
    let ck = Checkpoint::load(&fixture("duet_checkpoint.safetensors")).unwrap();
    let bytes = std::fs::read(fixture("duet_logits.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let ids: Vec<i32> = st
        .tensor("input_ids")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = st
        .tensor("logits")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let got = logits_of(&ck, &ids);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
        / scale;
    assert!(err <= 1e-5, "relative error {err:e}");
    // The names PyTorch needs are all there, lm_head.weight included.
    let raw = std::fs::read(fixture("duet_checkpoint.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&raw).unwrap();
    for name in [
        "transformer.wte.weight",
        "transformer.h.1.mlp.c_proj.bias",
        "transformer.ln_f.weight",
        "lm_head.weight",
    ] {
        assert!(st.tensor(name).is_ok(), "{name}");
    }
}
