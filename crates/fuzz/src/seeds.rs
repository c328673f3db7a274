//! The seed inputs of each target: real files duet writes (a micro model's checkpoints of each
//! kind and its trace, written by two CPU training steps), a shard and text, configs, and
//! `tokenizer.json` files of each model kind the tokenizers crate reads. The
//! committed corpus (`fuzz/corpus/<target>/`, for cargo-fuzz) is these, written by
//! `fuzz-loop --write-corpus fuzz/corpus`; the loop uses the same seeds, and any files it is
//! pointed at besides.

use crate::Target;
use duet_cpu::CpuDevice;
use duet_engine::trace::{TraceHeader, TraceWriter};
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

/// A model small enough that its checkpoint is a few KB.
fn micro(precision: Precision) -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.model.vocab = 16;
    c.model.d_model = 16;
    c.model.heads = 2;
    c.model.ffn = 16;
    c.model.layers = 1;
    c.model.max_seq = 16;
    c.train.data.batch = 1;
    c.train.data.seq = 16;
    c.train.steps = 4;
    c.train.data.eval_sequences = 0;
    c.train.recipe.precision = precision;
    c
}

/// (checkpoints, traces) from two steps of the micro model in fp32, fp16 (a loss scaler) and
/// fp8 (FP8 state).
fn trained() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let dev = Arc::new(CpuDevice::new(Some(1)).expect("the CPU backend"));
    let mut cks = Vec::new();
    let mut traces = Vec::new();
    for p in [Precision::Fp32, Precision::Fp16, Precision::Fp8] {
        let cfg = micro(p);
        let mut tr = match Trainer::new(dev.clone(), cfg.clone()) {
            Ok(t) => t,
            Err(_) => continue, // a precision this model cannot run (fp8 needs multiples of 16)
        };
        let header = TraceHeader {
            kind: "header".into(),
            duet_version: "fuzz".into(),
            git_rev: "fuzz".into(),
            backend: "cpu".into(),
            device: "cpu".into(),
            precision: p.as_str().into(),
            seed: cfg.train.data.seed,
            config: cfg,
            fp8_family: (p == Precision::Fp8).then(|| "ocp".into()),
        };
        let mut buf = Vec::new();
        {
            let mut w = TraceWriter::new(&mut buf, &header).expect("trace header");
            for _ in 0..2 {
                let r = tr.train_step().expect("a micro step");
                w.record(tr.model(), r.step, r.loss, r.grad_norm, r.lr, r.loss_scale)
                    .expect("trace record");
            }
            w.flush().expect("flush");
        }
        cks.push(
            tr.checkpoint()
                .and_then(|c| c.to_bytes())
                .expect("checkpoint"),
        );
        traces.push(buf);
    }
    (cks, traces)
}

fn llmc_shard(tokens: &[u16]) -> Vec<u8> {
    let mut header = [0i32; 256];
    header[0] = duet_engine::dataset::LLMC_MAGIC;
    header[1] = duet_engine::dataset::LLMC_VERSION;
    header[2] = tokens.len() as i32;
    let mut out: Vec<u8> = header.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    out
}

/// Every target's seeds, named (`<target>/<name>`).
pub fn all() -> Vec<(Target, String, Vec<u8>)> {
    let (cks, traces) = trained();
    let mut out = Vec::new();
    for (i, ck) in cks.into_iter().enumerate() {
        out.push((Target::Checkpoint, format!("micro-{i}.safetensors"), ck));
    }
    for (i, t) in traces.into_iter().enumerate() {
        out.push((Target::Trace, format!("micro-{i}.jsonl"), t));
    }
    let mut bin = vec![0u8];
    bin.extend(llmc_shard(
        &(0..64).map(|i| (i * 7 % 50) as u16).collect::<Vec<_>>(),
    ));
    out.push((Target::Shard, "tokens.bin".into(), bin));
    let mut empty = vec![0u8];
    empty.extend(llmc_shard(&[]));
    out.push((Target::Shard, "empty.bin".into(), empty));
    let mut text = vec![1u8];
    text.extend("héllo wörld, the quick brown fox. ".repeat(4).bytes());
    out.push((Target::Shard, "text.txt".into(), text));
    for (name, p) in [
        ("tiny.toml", Preset::Tiny),
        ("default.toml", Preset::Default),
    ] {
        out.push((
            Target::Config,
            name.into(),
            Config::preset(p).to_toml().into_bytes(),
        ));
    }
    out.extend(tokenizers());
    out.push((
        Target::Config,
        "partial.toml".into(),
        b"[model]\nlayers = 2\n\n[train]\nsteps = 50\nlr = 3e-4\nprecision = \"bf16\"\n".to_vec(),
    ));
    out
}

/// `tokenizer.json` seeds: the byte tokenizer's, a small trained byte-level BPE (and it with an
/// NFC normaliser and a SentencePiece-style byte-fallback setup), a WordPiece, a WordLevel and a
/// Unigram written by hand.
fn tokenizers() -> Vec<(Target, String, Vec<u8>)> {
    let docs = ["the quick brown fox jumps over the lazy dog; the dog sleeps. ".repeat(8)];
    let bpe = duet_tokenize::train_bpe(docs.iter(), 320).expect("a small BPE trains");
    let mut out = vec![
        (
            Target::Tokenizer,
            "bytes.json".into(),
            duet_tokenize::Tokenizer::bytes().to_json().into(),
        ),
        (Target::Tokenizer, "bpe.json".into(), bpe.to_json().into()),
    ];
    let mut v: serde_json::Value = serde_json::from_str(bpe.to_json()).expect("JSON");
    v["normalizer"] = serde_json::json!({"type": "NFC"});
    out.push((
        Target::Tokenizer,
        "bpe-nfc.json".into(),
        v.to_string().into_bytes(),
    ));
    let hand = [
        (
            "wordpiece.json",
            serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
                "added_tokens": [{"id": 0, "content": "[UNK]", "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
                "normalizer": {"type": "BertNormalizer", "clean_text": true,
                    "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
                "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": null,
                "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
                "model": {"type": "WordPiece", "unk_token": "[UNK]",
                    "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                    "vocab": {"[UNK]": 0, "the": 1, "quick": 2, "##s": 3, "fox": 4, ".": 5}}}),
        ),
        (
            "wordlevel.json",
            serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
                "added_tokens": [], "normalizer": {"type": "Lowercase"},
                "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
                "model": {"type": "WordLevel", "unk_token": "<unk>",
                    "vocab": {"<unk>": 0, "the": 1, "dog": 2, ".": 3}}}),
        ),
        (
            "unigram-metaspace.json",
            serde_json::json!({"version": "1.0", "truncation": null, "padding": null,
                "added_tokens": [], "normalizer": null,
                "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}",
                    "prepend_scheme": "always", "split": true},
                "post_processor": null,
                "decoder": {"type": "Metaspace", "replacement": "\u{2581}",
                    "prepend_scheme": "always", "split": true},
                "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": true,
                    "vocab": [["<unk>", 0.0], ["<0x41>", -5.0], ["\u{2581}the", -1.0],
                              ["\u{2581}", -2.0], ["t", -3.0], ["h", -3.0], ["e", -3.0]]}}),
        ),
    ];
    for (name, v) in hand {
        out.push((Target::Tokenizer, name.into(), v.to_string().into_bytes()));
    }
    out
}
