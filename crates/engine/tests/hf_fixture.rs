//! Hugging Face GPT-2 interchange, checked against transformers without PyTorch.
//!
//! `tests/fixtures/hf/` was written by `tests/reference/make_hf_fixture.py`: a tiny model trained
//! and exported by duet (`config.json`, `model.safetensors`), which transformers loaded with
//! `GPT2LMHeadModel.from_pretrained` (no missing, unexpected or mismatched weight; its own
//! `save_pretrained` wrote the same tensors), and its logits and greedy continuations
//! (`reference.safetensors`). Here duet's `--init-from` loader reads that folder, the CPU backend
//! reproduces the logits and the greedy tokens, and the exporter writes the same bytes again.
//! The other formats (a duet checkpoint, nanoGPT state dicts with `_orig_mod.` prefixes, bf16,
//! `attn.bias` buffers, HF's prefix-less `GPT2Model` names in f16) give the same weights, and bad
//! files give errors naming the problem.

use duet_cpu::CpuDevice;
use duet_engine::checkpoint::Checkpoint;
use duet_engine::config::{Config, ModelConfig, Preset};
use duet_engine::export::{self, ExportFormat};
use duet_engine::generate::{Generator, Sampling, WeightFormat};
use duet_engine::init::{InitWeights, ShapeRequest, SourceFormat, from_bytes, load_init_weights};
use duet_engine::model::Gpt;
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("duet-hf-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn load_fixture() -> InitWeights {
    load_init_weights(&fixture(""), &ShapeRequest::default(), None).unwrap()
}

fn f32s(t: &TensorView<'_>) -> Vec<f32> {
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(t: &TensorView<'_>) -> Vec<i32> {
    t.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Largest |a − b| over the logits, and the largest |b|.
fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let s = b.iter().fold(0f32, |m, y| m.max(y.abs()));
    (d, s)
}

#[test]
fn the_fixture_loads_as_a_hugging_face_model() {
    let init = load_fixture();
    assert_eq!(init.format, SourceFormat::HuggingFace);
    assert_eq!(
        init.model,
        ModelConfig {
            vocab: 96,
            d_model: 32,
            heads: 4,
            ffn: 64,
            layers: 2,
            max_seq: 16
        }
    );
    assert!(
        init.heads_from.contains("config.json"),
        "{}",
        init.heads_from
    );
    assert!(init.path.ends_with("model.safetensors"));
    assert!(init.notes.is_empty(), "{:?}", init.notes);
}

/// duet's forward pass on the CPU gives transformers' logits. Tolerance: both sides compute in
/// f32 with different summation orders (GEMM blocking, LayerNorm and softmax reductions over 32
/// to 96 terms); each op's rounding is ~1e-7 relative and the two blocks compound it to a few
/// 1e-6 of the logits' scale. 1e-4 of that scale is far below any real difference (a
/// transposed weight or a wrong GELU moves logits by 1e-2 and more).
#[test]
fn logits_match_transformers() {
    let init = load_fixture();
    let bytes = std::fs::read(fixture("reference.safetensors")).unwrap();
    let r = SafeTensors::deserialize(&bytes).unwrap();
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    let n: usize = 3;
    let mut worst = (0f32, 0f32);
    for i in 0..n {
        let tokens = i32s(&r.tensor(&format!("tokens.{i}")).unwrap());
        let want = f32s(&r.tensor(&format!("logits.{i}")).unwrap());
        let mut m = Gpt::new(dev.clone(), &init.model, 1, tokens.len(), &init.weights).unwrap();
        m.forward(&tokens).unwrap();
        let got = m.logits().unwrap();
        let (d, s) = max_diff(&got, &want);
        eprintln!("sequence {i}: max |duet − transformers| = {d:.3e} (logits up to {s:.3})");
        worst = (worst.0.max(d), worst.1.max(s));
    }
    assert!(
        worst.0 <= 1e-4 * worst.1.max(1.0),
        "max logit difference {} (scale {})",
        worst.0,
        worst.1
    );
}

#[test]
fn greedy_generation_matches_transformers() {
    let init = load_fixture();
    let bytes = std::fs::read(fixture("reference.safetensors")).unwrap();
    let r = SafeTensors::deserialize(&bytes).unwrap();
    let dev = Arc::new(CpuDevice::new(None).unwrap());
    for i in 0..2 {
        let prompt = i32s(&r.tensor(&format!("prompt.{i}")).unwrap());
        let want = i32s(&r.tensor(&format!("greedy.{i}")).unwrap());
        let mut g =
            Generator::from_weights(dev.clone(), &init.model, &init.weights, WeightFormat::F32)
                .unwrap();
        let got = g
            .generate(&prompt, want.len(), &Sampling::default())
            .unwrap();
        assert_eq!(got, want, "prompt {prompt:?}");
    }
}

/// Loading the exported folder and exporting it again gives the same bytes (so the committed
/// files are what the exporter writes today, and the loader's transposes undo the exporter's).
#[test]
fn the_exporter_writes_the_fixture_again() {
    let init = load_fixture();
    let bytes = export::weights_bytes(&init.model, &init.weights, ExportFormat::HuggingFace)
        .expect("exports");
    assert!(
        bytes == std::fs::read(fixture("model.safetensors")).unwrap(),
        "model.safetensors differs from the exporter's output"
    );
    assert_eq!(
        export::hf_config_json(&init.model),
        std::fs::read_to_string(fixture("config.json")).unwrap()
    );
    // Into a folder, then back.
    let dir = tmp_dir("reexport");
    export::export(&dir, &init.model, &init.weights, ExportFormat::HuggingFace).unwrap();
    let back = load_init_weights(&dir, &ShapeRequest::default(), None).unwrap();
    assert_eq!(back.weights, init.weights);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A safetensors file of `(name, shape, dtype, bytes)` with optional metadata.
fn safetensors_of(
    tensors: &[(String, Vec<usize>, Dtype, Vec<u8>)],
    meta: Option<HashMap<String, String>>,
) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, meta).unwrap()
}

/// The exporter's tensors of `format`, renamed, converted to `dtype`, with extra tensors.
fn variant(
    init: &InitWeights,
    format: ExportFormat,
    rename: impl Fn(&str) -> String,
    dtype: Dtype,
    extra: &[(&str, Vec<usize>)],
) -> Vec<u8> {
    let mut out: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> =
        export::tensors(&init.model, &init.weights, format)
            .unwrap()
            .into_iter()
            .map(|(n, s, v)| {
                let b: Vec<u8> = match dtype {
                    Dtype::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    Dtype::BF16 => v
                        .iter()
                        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                        .collect(),
                    Dtype::F16 => v
                        .iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect(),
                    _ => unreachable!(),
                };
                (rename(&n), s, dtype, b)
            })
            .collect();
    for (name, shape) in extra {
        let n: usize = shape.iter().product();
        out.push((
            name.to_string(),
            shape.clone(),
            Dtype::F32,
            vec![0u8; 4 * n],
        ));
    }
    safetensors_of(&out, None)
}

fn rounded(w: &[Vec<f32>], dtype: Dtype) -> Vec<Vec<f32>> {
    w.iter()
        .map(|t| {
            t.iter()
                .map(|&x| match dtype {
                    Dtype::BF16 => half::bf16::from_f32(x).to_f32(),
                    Dtype::F16 => half::f16::from_f32(x).to_f32(),
                    _ => x,
                })
                .collect()
        })
        .collect()
}

fn heads(n: usize) -> ShapeRequest {
    ShapeRequest {
        heads: Some(n),
        ..ShapeRequest::default()
    }
}

#[test]
fn every_format_gives_the_same_weights() {
    let init = load_fixture();
    // A duet checkpoint of those weights (optimizer state that --init-from must not use).
    let mut config = Config::preset(Preset::Tiny);
    config.model = init.model.clone();
    let ck = Checkpoint {
        config,
        step: 123,
        weights: init.weights.clone(),
        adam_m: init.weights.iter().map(|w| vec![0.5; w.len()]).collect(),
        adam_v: init.weights.iter().map(|w| vec![0.25; w.len()]).collect(),
        data_state: 9,
        loss_scaler: None,
        extra: HashMap::new(),
    };
    let dir = tmp_dir("formats");
    ck.save(&dir.join("checkpoint.safetensors")).unwrap();
    let d = load_init_weights(&dir, &ShapeRequest::default(), None).unwrap();
    assert_eq!(d.format, SourceFormat::Duet);
    assert_eq!(
        (d.model.clone(), &d.weights),
        (init.model.clone(), &init.weights)
    );
    std::fs::remove_dir_all(&dir).unwrap();

    // nanoGPT, as the exporter writes it (with lm_head.weight), heads from the flag.
    let nano = export::weights_bytes(&init.model, &init.weights, ExportFormat::NanoGpt).unwrap();
    let n = from_bytes(&nano, None, &heads(4), None).unwrap();
    assert_eq!(n.format, SourceFormat::NanoGpt);
    assert_eq!(
        (n.model, n.weights),
        (init.model.clone(), init.weights.clone())
    );

    // nanoGPT after torch.compile, in bf16, with the causal-mask buffers; heads from the
    // configured model (same width).
    let mask = vec![1, 1, 16, 16];
    let compiled = variant(
        &init,
        ExportFormat::NanoGpt,
        |n| format!("_orig_mod.{n}"),
        Dtype::BF16,
        &[
            ("_orig_mod.transformer.h.0.attn.bias", mask.clone()),
            ("_orig_mod.transformer.h.1.attn.bias", mask.clone()),
        ],
    );
    let c = from_bytes(&compiled, None, &ShapeRequest::default(), Some(&init.model)).unwrap();
    assert_eq!(c.format, SourceFormat::NanoGpt);
    assert_eq!(c.weights, rounded(&init.weights, Dtype::BF16));

    // HF's GPT2Model names (no `transformer.`, as the hub's gpt2 file), f16, with both buffers
    // and no LM head; heads from a config.json.
    let hub = variant(
        &init,
        ExportFormat::HuggingFace,
        |n| n.strip_prefix("transformer.").unwrap().to_string(),
        Dtype::F16,
        &[
            ("h.0.attn.bias", mask.clone()),
            ("h.0.attn.masked_bias", vec![]),
            ("h.1.attn.bias", mask.clone()),
            ("h.1.attn.masked_bias", vec![]),
        ],
    );
    let cfg = (
        PathBuf::from("config.json"),
        serde_json::json!({"n_head": 4, "n_layer": 2, "n_embd": 32, "vocab_size": 96}),
    );
    let h = from_bytes(&hub, Some(&cfg), &ShapeRequest::default(), None).unwrap();
    assert_eq!(h.format, SourceFormat::HuggingFace);
    assert_eq!(h.weights, rounded(&init.weights, Dtype::F16));
}

fn error_of(bytes: &[u8], given: &ShapeRequest) -> String {
    let e = from_bytes(bytes, None, given, None).unwrap_err();
    eprintln!("{e}");
    e
}

/// The fixture's HF tensors as f32 with `edit` applied.
fn edited(edit: impl Fn(&mut Vec<(String, Vec<usize>, Dtype, Vec<u8>)>)) -> Vec<u8> {
    let init = load_fixture();
    let mut t: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> =
        export::tensors(&init.model, &init.weights, ExportFormat::HuggingFace)
            .unwrap()
            .into_iter()
            .map(|(n, s, v)| {
                (
                    n,
                    s,
                    Dtype::F32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                )
            })
            .collect();
    edit(&mut t);
    safetensors_of(&t, None)
}

#[test]
fn bad_files_give_clear_errors() {
    let h4 = heads(4);
    assert!(error_of(b"hello, world", &h4).contains("not a safetensors file"));
    assert!(error_of(b"PK\x03\x04rest of a zip", &h4).contains("torch.save"));

    let missing = edited(|t| t.retain(|x| x.0 != "transformer.h.1.mlp.c_fc.bias"));
    assert!(error_of(&missing, &h4).contains("tensor 'transformer.h.1.mlp.c_fc.bias' is missing"));

    let wrong = edited(|t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "transformer.h.1.mlp.c_proj.weight")
            .unwrap();
        x.1 = vec![32, 64];
    });
    let e = error_of(&wrong, &h4);
    assert!(
        e.contains("'transformer.h.1.mlp.c_proj.weight' has shape [32, 64], expected [64, 32]"),
        "{e}"
    );

    let untied = edited(|t| {
        let mut head = t[0].clone();
        head.0 = "lm_head.weight".into();
        head.3[0] ^= 1;
        t.push(head);
    });
    assert!(error_of(&untied, &h4).contains("untied head"));

    let unexpected = edited(|t| {
        t.push((
            "transformer.h.0.attn.rotary.inv_freq".into(),
            vec![4],
            Dtype::F32,
            vec![0; 16],
        ))
    });
    assert!(
        error_of(&unexpected, &h4)
            .contains("unexpected tensor 'transformer.h.0.attn.rotary.inv_freq'")
    );

    let ints = edited(|t| t[3].2 = Dtype::I32);
    assert!(error_of(&ints, &h4).contains("only F32, F16, BF16 and F64"));

    let fine = edited(|_| {});
    assert!(
        error_of(&fine, &ShapeRequest::default())
            .contains("cannot tell the number of attention heads")
    );
    let e = error_of(
        &fine,
        &ShapeRequest {
            heads: Some(4),
            layers: Some(3),
            max_seq: Some(16),
            ..ShapeRequest::default()
        },
    );
    assert!(
        e.contains("--layers 3 (the file's is 2)") && !e.contains("--max-seq"),
        "{e}"
    );
    assert!(error_of(&fine, &heads(5)).contains("heads (5) must divide d_model (32)"));

    let cfg = (
        PathBuf::from("config.json"),
        serde_json::json!({"n_head": 4, "n_layer": 3}),
    );
    let e = from_bytes(&fine, Some(&cfg), &ShapeRequest::default(), None).unwrap_err();
    assert!(e.contains("n_layer 3, but the weights have 2"), "{e}");
    let e = from_bytes(&fine, Some(&cfg), &heads(8), None).unwrap_err();
    assert!(e.contains("n_layer 3") || e.contains("--heads 8"), "{e}");

    // A file path that is no file, and a folder without a model.
    let dir = tmp_dir("bad");
    let e = load_init_weights(&dir, &h4, None).unwrap_err().to_string();
    assert!(e.contains("holds neither checkpoint.safetensors"), "{e}");
    std::fs::write(dir.join("model.safetensors"), b"not really").unwrap();
    let e = load_init_weights(&dir, &h4, None).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("not a safetensors file"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
