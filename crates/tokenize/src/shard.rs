//! llm.c's token shards, written exactly as llm.c's `dev/data/data_common.py` `write_datafile`
//! does: a header of 256 little-endian i32 — magic, version, token count, zeros — then the
//! tokens, little-endian:
//! - GPT-2's format: magic 20240520, version 1, `u16` tokens (vocabularies up to 65,536);
//! - llm.c's LLaMA-3 format: magic 20240801, version 7, `u32` tokens (larger vocabularies).
//!
//! And duet's SFT shards of whole examples with their learned tokens marked (supervised
//! fine-tuning, [`write_sft_shard`]): the same 1024-byte header with magic [`SFT_MAGIC`],
//! version [`SFT_VERSION`], the example count `E` and the token count `N`; then `E + 1` u64
//! example boundaries (token indices 0, …, `N`); then `N` u32 tokens, bit 31 ([`SFT_LEARNED`])
//! set on the learned ones (duet_engine's `dataset::sft` reads them).

use crate::chat::Example;
pub use duet_engine::dataset::{SFT_LEARNED, SFT_MAGIC, SFT_VERSION};
use std::io::Write;
use std::path::Path;

/// Header words (i32) before the tokens.
pub const HEADER_WORDS: usize = 256;
pub const MAGIC_U16: i32 = 20240520;
pub const VERSION_U16: i32 = 1;
pub const MAGIC_U32: i32 = 20240801;
pub const VERSION_U32: i32 = 7;

/// How wide a shard's tokens are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWidth {
    U16,
    U32,
}

impl TokenWidth {
    /// u16 when every id of a vocabulary of `vocab` fits (vocab ≤ 65,536), else u32.
    pub fn for_vocab(vocab: usize) -> Self {
        if vocab <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    fn magic_version(self) -> (i32, i32) {
        match self {
            Self::U16 => (MAGIC_U16, VERSION_U16),
            Self::U32 => (MAGIC_U32, VERSION_U32),
        }
    }
}

/// The shard file's bytes. Fails when a token does not fit the width, or the shard has more
/// tokens than the header's i32 count holds.
pub fn shard_bytes(tokens: &[u32], width: TokenWidth) -> Result<Vec<u8>, String> {
    let count = i32::try_from(tokens.len()).map_err(|_| {
        format!(
            "{} tokens do not fit one shard (at most 2^31 − 1)",
            tokens.len()
        )
    })?;
    let (magic, version) = width.magic_version();
    let mut out = Vec::with_capacity(HEADER_WORDS * 4 + tokens.len() * width.bytes());
    let mut header = [0i32; HEADER_WORDS];
    header[0] = magic;
    header[1] = version;
    header[2] = count;
    for w in header {
        out.extend_from_slice(&w.to_le_bytes());
    }
    match width {
        TokenWidth::U16 => {
            for &t in tokens {
                let t = u16::try_from(t)
                    .map_err(|_| format!("token {t} does not fit a uint16 shard"))?;
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
        TokenWidth::U32 => {
            for &t in tokens {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }
    Ok(out)
}

/// Writes a shard to `path` (through a temporary file and a rename, so that a reader never sees
/// half a shard).
pub fn write_shard(path: &Path, tokens: &[u32], width: TokenWidth) -> std::io::Result<()> {
    write_shard_parts(path, &[tokens], width)
}

/// [`write_shard`] of the concatenation of `parts` (the tokens of consecutive documents), written
/// as they are converted: no copy of the shard is made in memory. A token that does not fit the
/// width fails the write and leaves no file.
pub fn write_shard_parts(path: &Path, parts: &[&[u32]], width: TokenWidth) -> std::io::Result<()> {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let count = i32::try_from(n).map_err(|_| {
        std::io::Error::other(format!(
            "{n} tokens do not fit one shard (at most 2^31 − 1)"
        ))
    })?;
    let tmp = path.with_extension("bin.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        let (magic, version) = width.magic_version();
        let mut header = [0i32; HEADER_WORDS];
        header[0] = magic;
        header[1] = version;
        header[2] = count;
        for w in header {
            f.write_all(&w.to_le_bytes())?;
        }
        for &t in parts.iter().flat_map(|p| p.iter()) {
            match width {
                TokenWidth::U16 => {
                    let t = u16::try_from(t).map_err(|_| {
                        std::io::Error::other(format!("token {t} does not fit a uint16 shard"))
                    })?;
                    f.write_all(&t.to_le_bytes())?
                }
                TokenWidth::U32 => f.write_all(&t.to_le_bytes())?,
            }
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

/// Whether `header` (a file's first bytes) starts as an llm.c shard of either format does.
pub fn is_shard_header(header: &[u8]) -> bool {
    let word = |i: usize| {
        header
            .get(i * 4..i * 4 + 4)
            .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    matches!(
        (word(0), word(1)),
        (Some(MAGIC_U16), Some(VERSION_U16))
            | (Some(MAGIC_U32), Some(VERSION_U32))
            | (Some(SFT_MAGIC), Some(SFT_VERSION))
    )
}

/// Parses a shard of either format (for tests and tools; the engine has its own reader).
pub fn parse_shard(bytes: &[u8]) -> Result<(TokenWidth, Vec<u32>), String> {
    if bytes.len() < HEADER_WORDS * 4 {
        return Err(format!(
            "{} bytes: shorter than the 1024-byte header",
            bytes.len()
        ));
    }
    let word = |i: usize| i32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    let width = match (word(0), word(1)) {
        (MAGIC_U16, VERSION_U16) => TokenWidth::U16,
        (MAGIC_U32, VERSION_U32) => TokenWidth::U32,
        (m, v) => return Err(format!("magic {m} version {v}: not an llm.c shard")),
    };
    let n = usize::try_from(word(2)).map_err(|_| "negative token count".to_string())?;
    let body = &bytes[HEADER_WORDS * 4..];
    if body.len() != n * width.bytes() {
        return Err(format!(
            "the header counts {n} tokens but {} bytes follow it",
            body.len()
        ));
    }
    let tokens = match width {
        TokenWidth::U16 => body
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
            .collect(),
        TokenWidth::U32 => body
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    Ok((width, tokens))
}

/// The bytes of an SFT shard of `examples`. Fails when a token id needs bit 31, or the shard
/// has more examples or tokens than the header's i32 counts hold.
pub fn sft_shard_bytes(examples: &[&Example]) -> Result<Vec<u8>, String> {
    let n: usize = examples.iter().map(|e| e.ids.len()).sum();
    let (count, tokens) = match (i32::try_from(examples.len()), i32::try_from(n)) {
        (Ok(c), Ok(t)) => (c, t),
        _ => {
            return Err(format!(
                "{} examples of {n} tokens do not fit one shard (at most 2^31 − 1 of each)",
                examples.len()
            ));
        }
    };
    let mut out = Vec::with_capacity(HEADER_WORDS * 4 + 8 * (examples.len() + 1) + 4 * n);
    let mut header = [0i32; HEADER_WORDS];
    header[..4].copy_from_slice(&[SFT_MAGIC, SFT_VERSION, count, tokens]);
    for w in header {
        out.extend_from_slice(&w.to_le_bytes());
    }
    let mut at = 0u64;
    out.extend_from_slice(&at.to_le_bytes());
    for e in examples {
        at += e.ids.len() as u64;
        out.extend_from_slice(&at.to_le_bytes());
    }
    for e in examples {
        assert_eq!(e.ids.len(), e.target.len(), "an example marks each token");
        for (&id, &learned) in e.ids.iter().zip(&e.target) {
            if id & SFT_LEARNED != 0 {
                return Err(format!("token {id} does not fit an SFT shard (31 bits)"));
            }
            let word = if learned { id | SFT_LEARNED } else { id };
            out.extend_from_slice(&word.to_le_bytes());
        }
    }
    Ok(out)
}

/// Writes an SFT shard of `examples` to `path` (through a temporary file and a rename).
pub fn write_sft_shard(path: &Path, examples: &[&Example]) -> std::io::Result<()> {
    let bytes = sft_shard_bytes(examples).map_err(std::io::Error::other)?;
    let tmp = path.with_extension("bin.tmp");
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)
}

/// Parses an SFT shard into its examples (for tests and tools; the engine has its own reader).
pub fn parse_sft_shard(bytes: &[u8]) -> Result<Vec<Example>, String> {
    if bytes.len() < HEADER_WORDS * 4 {
        return Err(format!(
            "{} bytes: shorter than the 1024-byte header",
            bytes.len()
        ));
    }
    let word = |i: usize| i32::from_le_bytes(bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    if (word(0), word(1)) != (SFT_MAGIC, SFT_VERSION) {
        return Err(format!(
            "magic {} version {}: not an SFT shard",
            word(0),
            word(1)
        ));
    }
    let (count, n) = match (usize::try_from(word(2)), usize::try_from(word(3))) {
        (Ok(c), Ok(n)) => (c, n),
        _ => return Err("negative example or token count".into()),
    };
    let table = HEADER_WORDS * 4 + 8 * (count + 1);
    if bytes.len() != table + 4 * n {
        return Err(format!(
            "the header counts {count} examples of {n} tokens: {} bytes expected, {} found",
            table + 4 * n,
            bytes.len()
        ));
    }
    let bounds: Vec<usize> = bytes[HEADER_WORDS * 4..table]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize)
        .collect();
    if bounds[0] != 0 || bounds[count] != n || bounds.windows(2).any(|w| w[0] > w[1]) {
        return Err("the example boundaries are not 0, …, the token count in order".into());
    }
    let words: Vec<u32> = bytes[table..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(bounds
        .windows(2)
        .map(|w| Example {
            ids: words[w[0]..w[1]].iter().map(|x| x & !SFT_LEARNED).collect(),
            target: words[w[0]..w[1]]
                .iter()
                .map(|x| x & SFT_LEARNED != 0)
                .collect(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sft_shards_round_trip_with_their_marks() {
        let ex = [
            Example {
                ids: vec![5, 6, 7],
                target: vec![false, true, true],
            },
            Example {
                ids: vec![],
                target: vec![],
            },
            Example {
                ids: vec![70000, 1],
                target: vec![true, false],
            },
        ];
        let refs: Vec<&Example> = ex.iter().collect();
        let bytes = sft_shard_bytes(&refs).unwrap();
        assert!(is_shard_header(&bytes));
        assert_eq!(bytes.len(), 1024 + 8 * 4 + 4 * 5);
        // Token 1 of example 0 is learned: bit 31 set.
        let w =
            |i: usize| u32::from_le_bytes(bytes[1056 + 4 * i..1060 + 4 * i].try_into().unwrap());
        assert_eq!(
            (w(0), w(1), w(3)),
            (5, 6 | SFT_LEARNED, 70000 | SFT_LEARNED)
        );
        assert_eq!(parse_sft_shard(&bytes).unwrap(), ex);
        assert!(parse_sft_shard(&bytes[..bytes.len() - 4]).is_err());
        let big = Example {
            ids: vec![SFT_LEARNED],
            target: vec![false],
        };
        assert!(sft_shard_bytes(&[&big]).unwrap_err().contains("31 bits"));
    }
}
