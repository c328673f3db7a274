//! Training a byte-level BPE (the tokenizers crate's trainer) on documents, with bounds: the
//! vocabulary is at most [`MAX_TRAIN_VOCAB`] (the trainer sizes its tables by it: a billion
//! aborted on a 283 GB allocation, `usize::MAX` overflowed), and no pre-token longer than
//! [`MAX_TRAINING_WORD`] characters reaches the trainer (its merges are quadratic in a word's
//! length: one 400 kB "word" — minified code, base64, a long run of spaces — took 59 s, 1 MB
//! never finished). A longer pre-token is fed as pieces of that length.

use crate::{EOT_TEXT, Error, Result, Tokenizer, byte_level_hf, tk_err};
use std::sync::atomic::{AtomicU64, Ordering};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Trainer,
};

/// The largest vocabulary [`train_bpe`] trains (2^20: four times the largest released
/// tokenizers').
pub const MAX_TRAIN_VOCAB: usize = 1 << 20;

/// The longest pre-token, in byte-level characters (bytes of the text), the trainer sees; a
/// token of the trained vocabulary is at most this long.
pub const MAX_TRAINING_WORD: usize = 256;

/// Host memory of the trainer's tables for a vocabulary of `vocab` tokens (sized by it before
/// the first merge), in bytes.
pub fn train_memory(vocab: usize) -> u64 {
    (vocab as u64).saturating_mul(160)
}

/// Refuses a vocabulary [`train_bpe`] cannot train: under 257 (256 bytes and `<|endoftext|>`)
/// or over [`MAX_TRAIN_VOCAB`].
pub fn check_train_vocab(vocab_size: usize) -> Result<()> {
    if vocab_size < 257 {
        return Err(Error::Tokenizer(format!(
            "a byte-level BPE needs a vocabulary of at least 257 (256 bytes and {EOT_TEXT}), got \
             {vocab_size}"
        )));
    }
    if vocab_size > MAX_TRAIN_VOCAB {
        return Err(Error::Tokenizer(format!(
            "a vocabulary of {vocab_size} tokens is more than duet trains (at most \
             {MAX_TRAIN_VOCAB}; released tokenizers have up to about 256k)"
        )));
    }
    Ok(())
}

/// What [`train_bpe_with`] reports while it trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrainProgress {
    /// A document of this many bytes was split into words (documents are taken in parallel).
    Document { bytes: usize },
    /// Every document was read: the merges are computed now.
    Merging,
}

/// The words the trainer counts for `text`: GPT-2's byte-level pre-tokens (as the trained
/// tokenizer splits text), a longer one than [`MAX_TRAINING_WORD`] cut into pieces of at most
/// that many characters.
pub fn training_words(text: &str) -> Result<Vec<String>> {
    let mut pre = PreTokenizedString::from(text);
    ByteLevel::new(false, true, true)
        .pre_tokenize(&mut pre)
        .map_err(tk_err)?;
    let mut out = Vec::new();
    for (word, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
        // Bytes bound characters: most words are short.
        if word.len() <= MAX_TRAINING_WORD {
            out.push(word.to_owned());
            continue;
        }
        let chars: Vec<char> = word.chars().collect();
        out.extend(
            chars
                .chunks(MAX_TRAINING_WORD)
                .map(|c| c.iter().collect::<String>()),
        );
    }
    Ok(out)
}

/// Trains a byte-level BPE tokenizer (GPT-2's pre-tokenizer and decoder) on `docs` with at most
/// `vocab_size` tokens: `<|endoftext|>` (id 0), the 256 byte-level characters, then merges of
/// pairs seen at least twice, most frequent first (the tokenizers crate's trainer), over the
/// words of [`training_words`].
pub fn train_bpe<S: AsRef<str> + Send>(
    docs: impl Iterator<Item = S> + Send,
    vocab_size: usize,
) -> Result<Tokenizer> {
    train_bpe_with(docs, vocab_size, &|_| {})
}

/// [`train_bpe`], telling `progress` of each document and of the merge phase.
pub fn train_bpe_with<S: AsRef<str> + Send>(
    docs: impl Iterator<Item = S> + Send,
    vocab_size: usize,
    progress: &(dyn Fn(TrainProgress) + Sync),
) -> Result<Tokenizer> {
    check_train_vocab(vocab_size)?;
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOT_TEXT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let bytes = AtomicU64::new(0);
    trainer
        .feed(docs, |text| {
            let words = training_words(text).map_err(|e| e.to_string())?;
            bytes.fetch_add(text.len() as u64, Ordering::Relaxed);
            progress(TrainProgress::Document { bytes: text.len() });
            Ok(words)
        })
        .map_err(tk_err)?;
    progress(TrainProgress::Merging);
    // Each merge removes at least one symbol of the corpus (a byte each to begin with): no more
    // tokens than 257 + the corpus's bytes can come out, and the trainer's tables need no more.
    trainer.vocab_size = vocab_size.min(257usize.saturating_add(bytes.into_inner() as usize));
    let mut model = BPE::default();
    let special = trainer.train(&mut model).map_err(tk_err)?;
    let mut tk = byte_level_hf(model);
    tk.add_special_tokens(&special);
    let mut tok = Tokenizer::from_hf(tk)?;
    tok.origin = "the trained tokenizer".into();
    Ok(tok)
}
