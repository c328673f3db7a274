//! duet's tokenizers and the llm.c token-shard writer.
//!
//! A [`Tokenizer`] is one of:
//! - **byte tokens** ([`Tokenizer::bytes`]): vocabulary 256, a token is a UTF-8 byte (the engine's
//!   convention for a text file without a tokenizer);
//! - a Hugging Face **`tokenizer.json`** ([`Tokenizer::from_path`] on the file);
//! - a folder with GPT-2's **`encoder.json` + `vocab.bpe`** (or `vocab.json` + `merges.txt`):
//!   a byte-level BPE built from them, as GPT-2 (and tiktoken's `gpt2` encoding) tokenizes;
//! - a byte-level BPE **trained** on a corpus ([`train_bpe`]).
//!
//! Every tokenizer has a canonical `tokenizer.json` serialisation ([`Tokenizer::to_json`], the
//! byte tokenizer's is a byte-level BPE without merges whose ids are the bytes) and a content
//! hash of it ([`Tokenizer::hash`], blake3, hex), which a run records in its checkpoint.
//!
//! Special tokens: the end-of-text token `<|endoftext|>` is the document separator
//! ([`Tokenizer::eot`]; GPT-2: 50256, a trained tokenizer: 0, byte tokens: none). Text is encoded
//! as ordinary text: in GPT-2's files `<|endoftext|>` is only a vocabulary entry, so the string
//! in a document is encoded as its pieces, as tiktoken's `encode_ordinary` (and llm.c's
//! `fineweb.py`) do; a trained tokenizer and a `tokenizer.json` that declares it an added token
//! do match the string in text.
//!
//! A tokenizer file is input like any other: [`Tokenizer::from_path`] reads only a regular file
//! (a FIFO would block it), refuses a vocabulary in which two tokens share an id, and turns a
//! panic inside the tokenizers crate (a bad `Precompiled` normalizer indexes out of bounds) into
//! an error naming the file. [`Tokenizer::check_for_data`] refuses the settings that change what
//! encoding returns (truncation, padding, BPE dropout) for data preparation, and
//! [`Tokenizer::round_trip`] tells whether a text comes back from its tokens.

#![forbid(unsafe_code)]

pub mod chat;
mod check;
mod guard;
pub mod shard;
mod train;

pub use check::RoundTrip;
pub use train::{
    MAX_TRAIN_VOCAB, MAX_TRAINING_WORD, TrainProgress, check_train_vocab, train_bpe,
    train_bpe_with, train_memory, training_words,
};

// `std::fs::read` for regular files only: a FIFO is refused before it is opened.
use duet_engine::dataset::{io_message, read_regular};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

/// The end-of-text token's text.
pub const EOT_TEXT: &str = "<|endoftext|>";
/// The file name a tokenizer is saved under in a run or a shard folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(String),
    #[error("tokenizer {path}: {msg}")]
    Load { path: String, msg: String },
    #[error("{0}")]
    Tokenizer(String),
}

pub type Result<T> = std::result::Result<T, Error>;

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

enum Kind {
    /// UTF-8 bytes, encoded and decoded without the tokenizers crate.
    Bytes,
    Hf(Box<tokenizers::Tokenizer>),
}

/// A tokenizer: text to token ids and back.
pub struct Tokenizer {
    kind: Kind,
    /// Largest id + 1 (the vocabulary a model needs to cover every token).
    vocab: usize,
    eot: Option<u32>,
    /// Canonical (compact) `tokenizer.json`.
    json: String,
    hash: String,
    /// What errors name: `tokenizer PATH`, or what made it.
    origin: String,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind_name())
            .field("vocab", &self.vocab)
            .field("eot", &self.eot)
            .field("hash", &self.hash)
            .field("origin", &self.origin)
            .finish()
    }
}

/// GPT-2's byte-level pre-tokenizer (its regex, no prefix space) and decoder.
fn byte_level_hf(model: BPE) -> tokenizers::Tokenizer {
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tk.with_decoder(Some(ByteLevelDecoder::default()));
    tk
}

/// The byte tokenizer as a Hugging Face tokenizer: a byte-level BPE whose vocabulary maps the
/// byte-level character of byte b to id b, without merges (so a token is a byte).
fn bytes_hf() -> tokenizers::Tokenizer {
    // The pre-tokenizer maps every byte of the text to its char in GPT-2's table
    // (bytes_to_unicode); with no merges each char is one token, whose id is the byte.
    let vocab: Vocab = bytes_to_unicode()
        .into_iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), b as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .build()
        .expect("a vocabulary without merges");
    byte_level_hf(bpe)
}

/// GPT-2's `bytes_to_unicode`: byte b → a printable char (indexed by b).
pub fn bytes_to_unicode() -> Vec<char> {
    let printable = |b: u32| {
        (b'!' as u32..=b'~' as u32).contains(&b)
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b)
    };
    let mut n = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("latin-1")
            } else {
                n += 1;
                char::from_u32(255 + n).expect("a char")
            }
        })
        .collect()
}

impl Tokenizer {
    /// Byte tokens: vocabulary 256, no end-of-text token.
    pub fn bytes() -> Self {
        let json = bytes_hf().to_string(false).expect("serialisable");
        Self::finish(Kind::Bytes, 256, None, json)
    }

    fn finish(kind: Kind, vocab: usize, eot: Option<u32>, json: String) -> Self {
        let hash = blake3::hash(json.as_bytes()).to_hex().to_string();
        Self {
            kind,
            vocab,
            eot,
            json,
            hash,
            origin: "the tokenizer".into(),
        }
    }

    fn from_hf(tk: tokenizers::Tokenizer) -> Result<Self> {
        // Before serialising: the crate prints a warning to stdout for a vocabulary with holes.
        check::unique_ids(&tk)?;
        let json = tk.to_string(false).map_err(tk_err)?;
        // A saved byte tokenizer is the byte tokenizer (same ids, the fast path).
        if json == bytes_hf().to_string(false).map_err(tk_err)? {
            return Ok(Self::bytes());
        }
        let vocab = tk
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        if vocab == 0 {
            return Err(Error::Tokenizer(
                "the tokenizer has an empty vocabulary".into(),
            ));
        }
        let eot = tk.token_to_id(EOT_TEXT);
        Ok(Self::finish(Kind::Hf(Box::new(tk)), vocab, eot, json))
    }

    /// Parses a `tokenizer.json`. A panic inside the tokenizers crate — while parsing, or while
    /// encoding and decoding a probe text (a bad `Precompiled` character map fails there) — is
    /// an error; so are two tokens that share an id.
    pub fn from_json(json: &str) -> Result<Self> {
        check::unique_added_ids(json)?;
        guard::catch(|| -> Result<Self> {
            let tk: tokenizers::Tokenizer = json.parse().map_err(tk_err)?;
            check::probe(&tk);
            Self::from_hf(tk)
        })
        .map_err(|p| Error::Tokenizer(format!("the tokenizers crate panicked on it: {p}")))?
    }

    /// Loads `path`: `bytes` (the byte tokenizer), a `tokenizer.json` file, or a folder holding
    /// `tokenizer.json`, or GPT-2's `encoder.json` + `vocab.bpe`, or `vocab.json` + `merges.txt`.
    /// Only regular files are read: a FIFO, a device or a socket is refused before it is opened.
    pub fn from_path(path: &Path) -> Result<Self> {
        if path.as_os_str() == "bytes" && !path.exists() {
            return Ok(Self::bytes());
        }
        let load = |msg: String| Error::Load {
            path: path.display().to_string(),
            msg,
        };
        let meta = std::fs::metadata(path).map_err(|e| load(io_message(&e)))?;
        if meta.is_dir() {
            let present = |p: &Path| std::fs::symlink_metadata(p).is_ok();
            let tj = path.join(TOKENIZER_FILE);
            if present(&tj) {
                return Self::from_path(&tj);
            }
            for (v, m) in [("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")] {
                let (v, m) = (path.join(v), path.join(m));
                if present(&v) && present(&m) {
                    let mut tok =
                        Self::from_vocab_merges(&v, &m).map_err(|e| load(e.to_string()))?;
                    tok.origin = format!("tokenizer {}", path.display());
                    return Ok(tok);
                }
            }
            return Err(load(
                "the folder has no tokenizer.json, encoder.json + vocab.bpe or vocab.json + \
                 merges.txt"
                    .into(),
            ));
        }
        let bytes = read_regular(path).map_err(|e| load(io_message(&e)))?;
        let json = String::from_utf8(bytes)
            .map_err(|_| load("not UTF-8 text (a tokenizer.json is JSON)".into()))?;
        let mut tok = Self::from_json(&json).map_err(|e| load(e.to_string()))?;
        tok.origin = format!("tokenizer {}", path.display());
        Ok(tok)
    }

    /// The files [`Tokenizer::from_path`] reads for `path` (none for `bytes`): the file, or the
    /// folder's tokenizer.json or vocabulary and merges.
    pub fn files_of(path: &Path) -> Vec<PathBuf> {
        if !path.is_dir() {
            return if path.exists() {
                vec![path.to_path_buf()]
            } else {
                Vec::new()
            };
        }
        [
            TOKENIZER_FILE,
            "encoder.json",
            "vocab.bpe",
            "vocab.json",
            "merges.txt",
        ]
        .iter()
        .map(|f| path.join(f))
        .filter(|p| p.exists())
        .collect()
    }

    /// A byte-level BPE (GPT-2's pre-tokenizer and decoder) from a vocabulary (`encoder.json` /
    /// `vocab.json`: token → id) and its merges (`vocab.bpe` / `merges.txt`, one pair a line in
    /// rank order, an optional `#version` first line).
    pub fn from_vocab_merges(vocab: &Path, merges: &Path) -> Result<Self> {
        let read = |p: &Path| {
            let io = |msg: String| Error::Io(format!("{}: {msg}", p.display()));
            let bytes = read_regular(p).map_err(|e| io(io_message(&e)))?;
            String::from_utf8(bytes).map_err(|_| io("not UTF-8 text".into()))
        };
        Self::from_vocab_merges_str(&read(vocab)?, &read(merges)?)
    }

    /// [`Tokenizer::from_vocab_merges`] from the files' contents.
    pub fn from_vocab_merges_str(vocab_json: &str, merges_txt: &str) -> Result<Self> {
        let vocab: HashMap<String, u32> = serde_json::from_str(vocab_json).map_err(|e| {
            Error::Tokenizer(format!("the vocabulary is not a token → id map: {e}"))
        })?;
        let mut merges = Vec::new();
        for (i, line) in merges_txt.lines().enumerate() {
            if (i == 0 && line.starts_with("#version")) || line.trim().is_empty() {
                continue;
            }
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => merges.push((a.to_string(), b.to_string())),
                _ => {
                    return Err(Error::Tokenizer(format!(
                        "merges line {}: expected two tokens, got '{line}'",
                        i + 1
                    )));
                }
            }
        }
        guard::catch(|| -> Result<Self> {
            let bpe = BPE::builder()
                .vocab_and_merges(vocab.into_iter().collect::<Vocab>(), merges)
                .build()
                .map_err(tk_err)?;
            let tk = byte_level_hf(bpe);
            check::probe(&tk);
            Self::from_hf(tk)
        })
        .map_err(|p| Error::Tokenizer(format!("the tokenizers crate panicked on it: {p}")))?
    }

    /// What errors and warnings call this tokenizer: `tokenizer PATH` for a loaded one.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Host memory the tokenizers crate holds while it encodes one document of `bytes` bytes
    /// into about `tokens` tokens, in bytes (its normalised string keeps two offsets a byte, its
    /// `Encoding` a string, offsets and masks a token: measured about 71 bytes a byte and 143 a
    /// token with GPT-2's tokenizer and a 300-token BPE on 10–30 MB documents). The byte
    /// tokenizer holds nothing beyond the ids.
    pub fn encode_memory(&self, bytes: u64, tokens: u64) -> u64 {
        match self.kind {
            Kind::Bytes => 0,
            Kind::Hf(_) => bytes
                .saturating_mul(80)
                .saturating_add(tokens.saturating_mul(160)),
        }
    }

    /// `bytes`, `tokenizer.json`, `byte-level BPE`.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Bytes => "bytes",
            Kind::Hf(_) => "tokenizer.json",
        }
    }

    pub fn is_bytes(&self) -> bool {
        matches!(self.kind, Kind::Bytes)
    }

    /// Token ids of `text` (no special tokens added). A panic inside the tokenizers crate is an
    /// error naming the tokenizer.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.kind {
            Kind::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Kind::Hf(tk) => {
                let enc = guard::catch(|| tk.encode_fast(text, false))
                    .map_err(|p| self.panicked("encoding", &p))?
                    .map_err(tk_err)?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// [`Tokenizer::encode`] with each token's first byte in `text` (a token of several
    /// characters starts at its first; byte tokens start at their byte).
    pub fn encode_with_offsets(&self, text: &str) -> Result<Vec<(u32, usize)>> {
        match &self.kind {
            Kind::Bytes => Ok(text
                .bytes()
                .enumerate()
                .map(|(i, b)| (b as u32, i))
                .collect()),
            Kind::Hf(tk) => {
                let enc = guard::catch(|| tk.encode(text, false))
                    .map_err(|p| self.panicked("encoding", &p))?
                    .map_err(tk_err)?;
                Ok(enc
                    .get_ids()
                    .iter()
                    .zip(enc.get_offsets())
                    .map(|(&id, &(start, _))| (id, start))
                    .collect())
            }
        }
    }

    fn panicked(&self, doing: &str, msg: &str) -> Error {
        Error::Tokenizer(format!(
            "{}: the tokenizers crate panicked while {doing}: {msg}",
            self.origin
        ))
    }

    /// The text of `ids` (special tokens included; invalid UTF-8 replaced by U+FFFD). An id
    /// outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(Error::Tokenizer(format!(
                "token {bad} is outside the tokenizer's vocabulary 0..{}",
                self.vocab
            )));
        }
        match &self.kind {
            Kind::Bytes => {
                let bytes: Vec<u8> = ids.iter().map(|&t| t as u8).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Kind::Hf(tk) => guard::catch(|| tk.decode(ids, false))
                .map_err(|p| self.panicked("decoding", &p))?
                .map_err(tk_err),
        }
    }

    /// Largest id + 1: the vocabulary a model needs to cover every token.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The end-of-text token (`<|endoftext|>`), the document separator; `None` for byte tokens.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// The canonical (compact) `tokenizer.json`.
    pub fn to_json(&self) -> &str {
        &self.json
    }

    /// blake3 of [`Tokenizer::to_json`], 64 hex digits: the same for the same tokenizer however
    /// it was loaded (a pretty-printed file, GPT-2's files, a saved copy).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Writes the canonical `tokenizer.json` to `path` (through a temporary file and a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = PathBuf::from(format!("{}.tmp", path.display()));
        std::fs::write(&tmp, &self.json)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| Error::Io(duet_engine::dataset::at_path(path, &e)))
    }
}
