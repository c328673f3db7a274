//! llm.c's token shards, written exactly as llm.c's `dev/data/data_common.py` `write_datafile`
//! does: a header of 256 little-endian i32 — magic, version, token count, zeros — then the
//! tokens, little-endian:
//! - GPT-2's format: magic 20240520, version 1, `u16` tokens (vocabularies up to 65,536);
//! - llm.c's LLaMA-3 format: magic 20240801, version 7, `u32` tokens (larger vocabularies).

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
        (Some(MAGIC_U16), Some(VERSION_U16)) | (Some(MAGIC_U32), Some(VERSION_U32))
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
