//! Fuzzing entry points for the parsers duet runs on files it is given — checkpoints, token
//! shards and text, traces, TOML configs, `tokenizer.json` files — each with the invariants a parsed value must keep
//! (a panic is a finding), the seeds they start from, and a mutator for a stable-Rust loop
//! ([`run_loop`], the `fuzz-loop` binary, which CI runs for a bounded number of iterations).
//! The cargo-fuzz targets in `fuzz/` call the same [`Target::run`].

#![forbid(unsafe_code)]

pub mod mutate;
pub mod seeds;

use duet_engine::checkpoint::Checkpoint;
use duet_engine::trace::{ParityOutcome, Trace, compare};
use duet_engine::{Config, Preset};
use std::path::Path;

/// One parser under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Checkpoint,
    Shard,
    Trace,
    Config,
    Tokenizer,
}

impl Target {
    pub const ALL: [Target; 5] = [
        Target::Checkpoint,
        Target::Shard,
        Target::Trace,
        Target::Config,
        Target::Tokenizer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Checkpoint => "checkpoint",
            Target::Shard => "shard",
            Target::Trace => "trace",
            Target::Config => "config",
            Target::Tokenizer => "tokenizer",
        }
    }

    pub fn parse(name: &str) -> Option<Target> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Feeds `data` to the parser; panics (the finding) when an invariant breaks. Returns
    /// whether the parser accepted the input (the loop reports how many got that deep).
    pub fn run(self, data: &[u8]) -> bool {
        match self {
            Target::Checkpoint => checkpoint(data),
            Target::Shard => shard(data),
            Target::Trace => trace(data),
            Target::Config => config(data),
            Target::Tokenizer => tokenizer(data),
        }
    }
}

/// `Checkpoint::from_bytes` (what `--resume` and `duet generate` load), the state checks a
/// resume makes, and for an accepted file: it serialises, reloads equal, and serialises to the
/// same bytes again (checkpoints are canonical).
pub fn checkpoint(data: &[u8]) -> bool {
    let Ok(ck) = Checkpoint::from_bytes(data) else {
        return false;
    };
    let _ = duet_engine::train::check_checkpoint_state(&ck);
    let _ = ck.config.validate();
    let bytes = ck.to_bytes().expect("a loaded checkpoint serialises");
    let back = Checkpoint::from_bytes(&bytes).expect("a saved checkpoint loads");
    assert_eq!(back, ck, "reloaded checkpoint differs");
    assert_eq!(back.to_bytes().expect("serialises"), bytes, "not canonical");
    true
}

/// The data-file reader (`--data`): the first byte picks an llm.c `.bin` shard (even) or text
/// (odd); the rest is the file. Accepted tokens are below the vocabulary it reports and are
/// exactly the file's (a shard's tokens re-encode to its bytes after the header).
pub fn shard(data: &[u8]) -> bool {
    let Some((sel, bytes)) = data.split_first() else {
        return false;
    };
    let bin = sel & 1 == 0;
    let path = Path::new(if bin { "fuzz.bin" } else { "fuzz.txt" });
    let Ok((tokens, vocab)) = duet_engine::dataset::tokens_from_bytes(path, bytes) else {
        return false;
    };
    assert!(
        tokens.iter().all(|&t| (t as usize) < vocab),
        "token ≥ vocab"
    );
    if bin {
        // The header's magic gives the width: uint32 tokens (llm.c's version 7) or uint16.
        let wide = bytes[..4] == duet_engine::dataset::LLMC_MAGIC_U32.to_le_bytes();
        let body: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| match wide {
                true => t.to_le_bytes().to_vec(),
                false => (t as u16).to_le_bytes().to_vec(),
            })
            .collect();
        assert_eq!(&bytes[1024..], &body[..], "tokens are not the file's");
    } else {
        assert_eq!(tokens.len(), bytes.len());
    }
    true
}

/// `Trace::parse` (what `duet parity` reads): a parsed trace compared with itself never
/// diverges.
pub fn trace(data: &[u8]) -> bool {
    let Ok(t) = Trace::parse(data) else {
        return false;
    };
    if let Ok(ParityOutcome::Diverged { .. }) = compare(&t, &t) {
        panic!("a trace diverges from itself");
    }
    true
}

/// The TOML config readers: `Config::from_toml_exact` (a checkpoint's config; an accepted one
/// round-trips through `to_toml`) and `Config::from_toml_str` over a preset (`--config`; one
/// that validates has a finite learning-rate schedule).
pub fn config(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let mut accepted = false;
    if let Ok(c) = Config::from_toml_exact(text) {
        accepted = true;
        let _ = c.validate();
        let _ = c.model.checked_num_params();
        // Compared as TOML text: a NaN field (accepted here, refused by validate) is not equal
        // to itself.
        let text = c.to_toml();
        let back = Config::from_toml_exact(&text).expect("a config's TOML reads back");
        assert_eq!(back.to_toml(), text, "config changed through to_toml");
    }
    if let Ok(c) = Config::from_toml_str(text, Config::preset(Preset::Tiny))
        && c.validate().is_ok()
    {
        accepted = true;
        for step in [
            0,
            1,
            c.train.optimizer.warmup,
            c.train.steps / 2,
            c.train.steps,
        ] {
            let lr = c.lr_at(step);
            assert!(lr.is_finite(), "lr_at({step}) = {lr}");
        }
    }
    accepted
}

/// Texts every accepted tokenizer encodes.
const TOKENIZER_TEXTS: [&str; 3] = [
    "The quick brown fox jumps over the lazy dog.\n\n  Tabs\tand spaces  ",
    "héllo wörld — naïve café, cafe\u{301} 日本語 한국어 🙂 <|endoftext|> [UNK] <unk>",
    "\u{0}\u{1f}\u{7f}\u{feff}\u{2581}\u{fffd}Ġ##",
];

/// `Tokenizer::from_json` (what `--tokenizer FILE` loads, for `duet tokenize`, `train` and
/// `generate`): a panic inside the tokenizers crate must come back as an error. For an accepted
/// file: its canonical JSON loads again as the same tokenizer (the hash a run records), every id
/// it encodes is below its vocabulary, its ids decode, and the data checks and the round trip
/// return (an error is an answer; a panic is the finding).
///
/// A vocabulary with ids that name no token is skipped: the tokenizers crate prints every
/// missing id to stdout when it serialises one (tens of thousands of numbers a line, hundreds of
/// lines a run); duet's bound on them is `crates/tokenize/tests/hardening.rs`'s to test.
pub fn tokenizer(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    if vocabulary_has_holes(text) {
        return false;
    }
    let Ok(tok) = duet_tokenize::Tokenizer::from_json(text) else {
        return false;
    };
    let back = duet_tokenize::Tokenizer::from_json(tok.to_json())
        .expect("a tokenizer's canonical JSON loads");
    assert_eq!(
        back.hash(),
        tok.hash(),
        "the canonical JSON changes on reload"
    );
    for t in TOKENIZER_TEXTS {
        if let Ok(ids) = tok.encode(t) {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= tok.vocab_size()) {
                panic!("id {bad} ≥ vocabulary {}", tok.vocab_size());
            }
            tok.decode(&ids).expect("ids it encoded decode");
        }
        let _ = tok.round_trip(t);
    }
    let _ = tok.check_for_data();
    true
}

/// Whether a `tokenizer.json`'s `model.vocab` (a token → id map) leaves an id below its largest
/// without a token.
fn vocabulary_has_holes(text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return false;
    };
    let Some(vocab) = v.pointer("/model/vocab").and_then(|v| v.as_object()) else {
        return false;
    };
    let ids: std::collections::BTreeSet<u64> = vocab.values().filter_map(|i| i.as_u64()).collect();
    ids.last().is_some_and(|&max| max + 1 > ids.len() as u64)
}

/// What a [`run_loop`] did for one target.
#[derive(Clone, Debug, Default)]
pub struct LoopReport {
    pub iterations: u64,
    /// Inputs the parser accepted (and whose invariants were checked).
    pub accepted: u64,
    pub seconds: f64,
    /// The longest single input's time (a parser that slows down on some input shows here).
    pub slowest_ms: f64,
    /// Inputs that panicked, with the panic message.
    pub crashes: Vec<(Vec<u8>, String)>,
}

/// Mutates `seeds` and runs `target` on the results: `iterations` inputs, or fewer when
/// `max_seconds` run out. Deterministic for a given `rng_seed` (the mutations, not the time
/// limit). Panics are caught and reported, not propagated.
pub fn run_loop(
    target: Target,
    seeds: &[Vec<u8>],
    iterations: u64,
    max_seconds: f64,
    rng_seed: u64,
) -> LoopReport {
    let start = std::time::Instant::now();
    let mut rng = mutate::Rng::new(rng_seed ^ (target as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut report = LoopReport::default();
    let empty = [Vec::new()];
    let seeds = if seeds.is_empty() { &empty[..] } else { seeds };
    for i in 0..iterations {
        // The seeds themselves first, then mutations of them.
        let input = match seeds.get(i as usize) {
            Some(s) => s.clone(),
            None if target == Target::Checkpoint => {
                mutate::mutate_safetensors(&mut rng, seeds, target.dictionary())
            }
            None => mutate::mutate(&mut rng, seeds, target.dictionary()),
        };
        let t0 = std::time::Instant::now();
        let r = std::panic::catch_unwind(|| target.run(&input));
        report.slowest_ms = report.slowest_ms.max(t0.elapsed().as_secs_f64() * 1e3);
        report.iterations += 1;
        if let Ok(true) = r {
            report.accepted += 1;
        }
        if let Err(p) = r {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            report.crashes.push((input, msg));
        }
        if start.elapsed().as_secs_f64() > max_seconds {
            break;
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report
}

impl Target {
    /// Tokens the mutator splices in: the formats' own syntax and edge values.
    fn dictionary(self) -> &'static [&'static [u8]] {
        match self {
            Target::Checkpoint => &[
                b"F32",
                b"F16",
                b"BF16",
                b"I64",
                b"\"shape\":[",
                b"\"data_offsets\":[",
                b"__metadata__",
                b"duet-checkpoint",
                b"\"step\":\"",
                b"loss_scale",
                b"inf",
                b"NaN",
                b"-1",
                b"18446744073709551615",
                b"[train]\n",
                b"[model]\n",
                b"vocab = ",
                b"layers = 0",
                b"fp8_state",
                b"adam_steps",
                b"data_files",
            ],
            Target::Shard => &[
                b"\x30\xf0\x34\x01",
                b"\x01\x00\x00\x00",
                b"\x07\x00\x00\x00",
                b"\xff\xff\xff\x7f",
                b"\x00\x00\x00\x80",
                b"\xff\xff",
                b"\xc3\x28",
                b"\xe2\x82\xac",
                b"\xf0\x9f\x98\x80",
            ],
            Target::Trace => &[
                b"{\"kind\":\"header\"",
                b"{\"kind\":\"step\"",
                b"\"params\":{",
                b"\"samples\":[",
                b"\"norm\":",
                b"\"inf\"",
                b"\"nan\"",
                b"\"-inf\"",
                b"1e308",
                b"-0.0",
                b"null",
                b"\"loss_scale\":",
                b"\"fp8\":{",
                b"\"precision\":\"fp8\"",
                b"\"fp8_family\":\"fnuz\"",
                b"\n",
                b"18446744073709551615",
            ],
            Target::Config => &[
                b"[model]\n",
                b"[train]\n",
                b"[train.optimizer]\n",
                b"[train.execution]\n",
                b"vocab = ",
                b"d_model = ",
                b"heads = ",
                b"layers = ",
                b"max_seq = ",
                b"steps = ",
                b"warmup = ",
                b"lr = ",
                b"precision = \"fp8\"",
                b"= 0\n",
                b"= -1\n",
                b"= nan\n",
                b"= inf\n",
                b"= 1e308\n",
                b"= 18446744073709551615\n",
                b"= 9223372036854775807\n",
                b"\"",
                b"'''",
                b"{ }",
                b"[[",
                b"]]",
            ],
            Target::Tokenizer => &[
                b"\"type\":\"BPE\"",
                b"\"type\":\"WordPiece\"",
                b"\"type\":\"WordLevel\"",
                b"\"type\":\"Unigram\"",
                b"\"normalizer\":{\"type\":\"NFC\"}",
                b"{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"AAAAAA==\"}",
                b"{\"type\":\"Sequence\",\"normalizers\":[]}",
                b"{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}",
                b"{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":true}",
                b"{\"type\":\"ByteFallback\"}",
                b"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a|b)*\"},\"behavior\":\"Isolated\",\"invert\":false}",
                b"\"truncation\":{\"direction\":\"Right\",\"max_length\":0,\"strategy\":\"LongestFirst\",\"stride\":0}",
                b"\"dropout\":0.5",
                b"\"byte_fallback\":true",
                b"\"unk_token\":\"<unk>\"",
                b"\"added_tokens\":[{\"id\":0,\"content\":\"\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":true,\"special\":true}]",
                b"\"<0x00>\":",
                b"\"continuing_subword_prefix\":\"##\"",
                b"\"max_input_chars_per_word\":0",
                b"4294967295",
                b"-1",
                b"null",
                b"1e308",
                b"\"\\ud800\"",
                b"[]",
                b"{}",
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_reaches_its_targets_invariants() {
        let seeds = seeds::all();
        for t in Target::ALL {
            let mine: Vec<_> = seeds.iter().filter(|(x, _, _)| *x == t).collect();
            assert!(!mine.is_empty(), "{} has no seeds", t.name());
            for (_, name, bytes) in mine {
                assert!(t.run(bytes), "{}/{name} is not accepted", t.name());
            }
        }
    }

    #[test]
    fn a_config_with_a_nan_field_round_trips_as_text() {
        // Found by the loop: NaN fields (refused later by validate) are not equal to
        // themselves, so the round trip is checked on the TOML text.
        let text = Config::preset(Preset::Tiny)
            .to_toml()
            .replace("grad_clip = 1.0", "grad_clip = nan");
        assert!(text.contains("grad_clip = nan"), "{text}");
        assert!(config(text.as_bytes()));
    }

    #[test]
    fn the_loop_counts_and_is_deterministic() {
        let seeds: Vec<Vec<u8>> = seeds::all()
            .into_iter()
            .filter(|(t, _, _)| *t == Target::Shard)
            .map(|(_, _, b)| b)
            .collect();
        let a = run_loop(Target::Shard, &seeds, 3000, 60.0, 5);
        let b = run_loop(Target::Shard, &seeds, 3000, 60.0, 5);
        assert_eq!(a.iterations, 3000);
        assert_eq!(a.accepted, b.accepted);
        assert!(a.accepted > 0 && a.accepted < 3000, "{}", a.accepted);
        assert!(a.crashes.is_empty());
    }
}
