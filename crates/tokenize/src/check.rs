//! What a tokenizer must be to prepare data with: ids that name one token each, none of the
//! `tokenizer.json` settings that change what encoding returns (truncation, padding, BPE
//! dropout), and — checked on samples, a warning — text that comes back from its tokens.

use crate::{Error, Kind, Result, Tokenizer, tk_err};
use std::collections::HashMap;
use tokenizers::models::ModelWrapper;
use tokenizers::{Model, NormalizedString, Normalizer};

/// Encoded and decoded when a tokenizer is loaded: a tokenizer that panics on ordinary text (a
/// bad `Precompiled` character map) fails at load, naming its file, not on the first document.
pub(crate) const PROBE: &str = "The quick brown fox, 1234 — it's \"here\".\n\téàü ß 中文 日本語 \
                                한국어 Ελληνικά русский 😀 e\u{301} end";

/// Encodes and decodes [`PROBE`] with `tk`. Panics are the caller's to catch; an error is not
/// a finding (a vocabulary without an unknown token refuses text it cannot encode).
pub(crate) fn probe(tk: &tokenizers::Tokenizer) {
    if let Ok(enc) = tk.encode_fast(PROBE, false) {
        let _ = tk.decode(enc.get_ids(), false);
    }
}

/// Two different tokens of one id in the model's vocabulary (decoding could not tell them
/// apart), or ids spread far beyond the number of tokens: the model would need a row for each
/// id up to the largest, and the tokenizers crate lists every missing id when it serialises the
/// vocabulary (an id of 4 × 10^9 took minutes and gigabytes).
pub(crate) fn unique_ids(tk: &tokenizers::Tokenizer) -> Result<()> {
    let mut vocab: Vec<(u32, String)> = tk
        .get_model()
        .get_vocab()
        .into_iter()
        .map(|(t, id)| (id, t))
        .collect();
    vocab.sort_unstable();
    for w in vocab.windows(2) {
        if w[0].0 == w[1].0 {
            return Err(Error::Tokenizer(format!(
                "the tokens {:?} and {:?} share the id {}: every id must name one token",
                w[0].1, w[1].1, w[0].0
            )));
        }
    }
    if let Some((largest, token)) = vocab.last() {
        let missing = *largest as usize + 1 - vocab.len();
        if missing > vocab.len().max(MAX_MISSING_IDS) {
            return Err(Error::Tokenizer(format!(
                "the token {token:?} has the id {largest} but the vocabulary has {} tokens: {missing} \
                 ids in between name no token",
                vocab.len()
            )));
        }
    }
    Ok(())
}

/// Ids that may name no token in a vocabulary smaller than this (a few are common: tokens
/// removed by hand, reserved ranges).
const MAX_MISSING_IDS: usize = 1 << 16;

/// Two added tokens (`added_tokens`) of one id but different text; the tokenizers crate keeps
/// one of them silently.
pub(crate) fn unique_added_ids(json: &str) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        added_tokens: Vec<Added>,
    }
    #[derive(serde::Deserialize)]
    struct Added {
        id: u32,
        content: String,
    }
    // A file this does not read is the tokenizers crate's to refuse.
    let Ok(file) = serde_json::from_str::<File>(json) else {
        return Ok(());
    };
    let mut seen: HashMap<u32, &str> = HashMap::new();
    for a in &file.added_tokens {
        match seen.insert(a.id, &a.content) {
            Some(other) if other != a.content => {
                return Err(Error::Tokenizer(format!(
                    "the added tokens {other:?} and {:?} share the id {}: every id must name one \
                     token",
                    a.content, a.id
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Encoding and decoding a sample of text ([`Tokenizer::round_trip`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    /// Tokens of the text.
    pub tokens: usize,
    /// Where the decoded tokens differ from the text, both taken through the tokenizer's
    /// normaliser and compared without whitespace: `None` when they agree.
    pub difference: Option<String>,
}

impl Tokenizer {
    /// Refuses, for data preparation, the settings of a `tokenizer.json` that change what
    /// encoding returns: `truncation` (every document cut to its `max_length`), `padding`
    /// (padding tokens in the data) and a BPE `dropout` (the same text encodes differently each
    /// time); and an added token that has the id of another vocabulary token.
    pub fn check_for_data(&self) -> Result<()> {
        let Kind::Hf(tk) = &self.kind else {
            return Ok(());
        };
        let refuse = |what: String, effect: &str, key: &str| {
            Err(Error::Tokenizer(format!(
                "{} sets {what}: {effect}; set \"{key}\" to null in the file to prepare data \
                 with it",
                self.origin
            )))
        };
        if let Some(t) = tk.get_truncation() {
            return refuse(
                format!("\"truncation\" (max_length {})", t.max_length),
                "every document would be cut to that many tokens",
                "truncation",
            );
        }
        if let Some(p) = tk.get_padding() {
            return refuse(
                format!("\"padding\" ({:?}, {:?})", p.strategy, p.pad_token),
                "documents would be padded with that token",
                "padding",
            );
        }
        if let ModelWrapper::BPE(bpe) = tk.get_model()
            && let Some(d) = bpe.dropout
            && d > 0.0
        {
            return refuse(
                format!("the BPE model's \"dropout\" ({d})"),
                "the same text would encode to different tokens on each run",
                "model.dropout",
            );
        }
        let mut added: Vec<_> = tk.get_added_tokens_decoder().into_iter().collect();
        added.sort_unstable_by_key(|(id, _)| *id);
        for (id, a) in added {
            if let Some(t) = tk.get_model().id_to_token(id)
                && t != a.content
            {
                return Err(Error::Tokenizer(format!(
                    "{}: the added token {:?} has the id {id} of the vocabulary's {t:?}: every id \
                     must name one token",
                    self.origin, a.content
                )));
            }
        }
        Ok(())
    }

    /// Encodes `text` and decodes its tokens: whether the text comes back. Both texts go
    /// through the tokenizer's own normaliser (a tokenizer that normalises, to NFC say, still
    /// round-trips) and are compared without whitespace (decoders re-space words); a character
    /// outside the vocabulary that is dropped, or replaced by an unknown token, shows.
    pub fn round_trip(&self, text: &str) -> Result<RoundTrip> {
        let ids = self.encode(text)?;
        let Kind::Hf(tk) = &self.kind else {
            return Ok(RoundTrip {
                tokens: ids.len(),
                difference: None,
            });
        };
        let back = self.decode(&ids)?;
        let normalise = |s: &str| -> Result<Vec<char>> {
            let mut n = NormalizedString::from(s);
            if let Some(norm) = tk.get_normalizer() {
                crate::guard::catch(|| norm.normalize(&mut n))
                    .map_err(|p| self.panicked("normalising", &p))?
                    .map_err(tk_err)?;
            }
            // U+2581 is SentencePiece's space.
            Ok(n.get()
                .chars()
                .filter(|c| !c.is_whitespace() && *c != '\u{2581}')
                .collect())
        };
        let (want, got) = (normalise(text)?, normalise(&back)?);
        let difference = (want != got).then(|| {
            let i = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
            let around = |s: &[char]| -> String {
                s[i.saturating_sub(12).min(s.len())..(i + 24).min(s.len())]
                    .iter()
                    .collect()
            };
            format!(
                "{:?} comes back as {:?} (whitespace left out)",
                around(&want),
                around(&got)
            )
        });
        Ok(RoundTrip {
            tokens: ids.len(),
            difference,
        })
    }
}
