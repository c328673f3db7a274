//! Training data: the synthetic progression task, UTF-8 text files as byte tokens, llm.c's
//! `.bin` token shards (uint16 and uint32) and nanoGPT's headerless uint16 `.bin` files.
//!
//! A run's data is a list of shards ([`resolve_data`] expands files, globs and folders into
//! it) opened as one [`DataSet`]: shards are memory-mapped ([`duet_mmap::Mapped`]) and their
//! tokens read on demand, a batch at a time. Batches are random windows drawn from a seeded
//! RNG (nanoGPT's `get_batch`) over the concatenation of the training shards — a window never
//! crosses a shard's end — so a run's data order depends only on the seed and the shard list,
//! and resumes from one saved RNG state. A background thread prefetches the next batches.

use crate::data::Progressions;
use crate::rng::Rng;
use crate::{EngineError, Result};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

mod sft;
pub use sft::{SFT_LEARNED, SFT_MAGIC, SFT_VERSION, SftExample, SftSet};

/// llm.c shard header: 256 little-endian i32, magic 20240520, version 1, token count; then
/// uint16 tokens (GPT-2's vocabulary).
pub const LLMC_MAGIC: i32 = 20240520;
pub const LLMC_VERSION: i32 = 1;
/// llm.c's uint32 shards (vocabularies past 65536, e.g. Llama 3's): magic 20240801, version 7,
/// the same 1024-byte header, then uint32 tokens.
pub const LLMC_MAGIC_U32: i32 = 20240801;
pub const LLMC_VERSION_U32: i32 = 7;
/// Bytes of an llm.c shard's header (256 i32).
pub const LLMC_HEADER_BYTES: usize = 256 * 4;

/// Fraction of each training shard held out for validation (its tail) when the run has no
/// validation shards.
pub const VAL_FRACTION: f64 = 0.1;

/// Validation batches evaluated at most (`--val-batches`' default).
pub const DEFAULT_VAL_BATCHES: usize = 8;

/// How the data files are read (`--data-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// By the name: a `.bin` file is an llm.c shard (its header says uint16 or uint32), any
    /// other file UTF-8 text.
    #[default]
    Auto,
    /// Every file is UTF-8 text, its bytes the tokens (vocabulary 256).
    Text,
    /// Every file is an llm.c shard, whatever its name.
    Llmc,
    /// Every file is nanoGPT's headerless uint16 tokens (`prepare.py`'s `train.bin`/`val.bin`).
    Nanogpt,
}

impl DataFormat {
    pub const NAMES: [&'static str; 4] = ["auto", "text", "llmc", "nanogpt"];
}

impl std::fmt::Display for DataFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataFormat::Auto => "auto",
            DataFormat::Text => "text",
            DataFormat::Llmc => "llmc",
            DataFormat::Nanogpt => "nanogpt",
        })
    }
}

impl std::str::FromStr for DataFormat {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DataFormat::Auto),
            "text" => Ok(DataFormat::Text),
            "llmc" => Ok(DataFormat::Llmc),
            "nanogpt" => Ok(DataFormat::Nanogpt),
            other => Err(EngineError::Config(format!(
                "unknown data format '{other}' (expected one of {})",
                DataFormat::NAMES.join(", ")
            ))),
        }
    }
}

/// A data file as a run read it: its size, modification time and file identity (device,
/// inode, status-change time), and a hash of its content computed once, when the run started. A
/// resume compares the size, times and identity first and hashes the file again only when one
/// of them changed (a multi-GB shard is not hashed on every resume); a file whose content
/// changed is refused. The status-change time (ctime) cannot be set back: a file rewritten with
/// its size and modification time restored (`cp -p`, `rsync -t`, `tar x`) is hashed again.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataFingerprint {
    pub path: String,
    pub bytes: u64,
    /// Nanoseconds since the Unix epoch (absent where the filesystem keeps no time).
    pub modified_ns: Option<u64>,
    /// The file's identity and status-change time (absent in checkpoints written before duet
    /// stored them: the first resume hashes the file again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<FileIdentity>,
    /// `blake3:<hex>` of the whole file.
    pub hash: String,
}

/// What identifies a file beyond its path, size and modification time: the device and inode
/// (another file — a copy, a restored backup — has others) and the status-change time, which
/// every write, `touch` and metadata restore moves forward (no program can set it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    /// Status-change time (ctime), nanoseconds since the Unix epoch.
    pub changed_ns: i64,
}

impl FileIdentity {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            changed_ns: meta
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.ctime_nsec()),
        }
    }
}

impl DataFingerprint {
    /// Whether the file `meta` describes is, by its metadata, the one `self` hashed: the same
    /// size, modification time, device, inode and status-change time.
    fn metadata_matches(&self, meta: &std::fs::Metadata) -> bool {
        self.bytes == meta.len()
            && self.modified_ns == modified_ns(meta)
            && self.identity == Some(FileIdentity::of(meta))
    }

    /// The fingerprint of `bytes`, the content of `path` as opened (`meta`): the hash is
    /// `known`'s while the path and metadata match it, else computed (left empty without
    /// `hash`: [`DataSet::scan`]).
    fn of(
        path: &Path,
        bytes: &[u8],
        meta: &std::fs::Metadata,
        known: Option<&Self>,
        hash: bool,
    ) -> Self {
        let path_s = path.display().to_string();
        let hash = match known {
            Some(k) if k.path == path_s && k.metadata_matches(meta) => k.hash.clone(),
            _ if !hash => String::new(),
            _ => {
                let mut h = blake3::Hasher::new();
                h.update_rayon(bytes);
                format!("blake3:{}", h.finalize().to_hex())
            }
        };
        Self {
            path: path_s,
            bytes: bytes.len() as u64,
            modified_ns: modified_ns(meta),
            identity: Some(FileIdentity::of(meta)),
            hash,
        }
    }

    /// Why `self` (the file now) is not the file `then` described, if it is not.
    pub fn changed_from(&self, then: &Self) -> Option<String> {
        if self.hash == then.hash {
            return None;
        }
        let time = |t: Option<u64>| match t {
            Some(ns) => format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000),
            None => "unknown".into(),
        };
        Some(format!(
            "changed since the run read it: {} → {} bytes, modified {} → {} (s since 1970), \
             content {} → {}",
            then.bytes,
            self.bytes,
            time(then.modified_ns),
            time(self.modified_ns),
            short_hash(&then.hash),
            short_hash(&self.hash)
        ))
    }

    /// An error naming the file and what changed unless `self` (the file now) is the file a
    /// checkpoint's run read (`then`).
    pub fn ensure_unchanged_from(&self, then: &Self) -> Result<()> {
        match self.changed_from(then) {
            None => Ok(()),
            Some(why) => Err(data_err(
                Path::new(&then.path),
                format!(
                    "{why}: resuming would train on other data than the checkpoint's run did \
                     (restore the file, or give --accept-changed-data to continue on its new \
                     content)"
                ),
            )),
        }
    }

    /// The file at `self.path` now, from its metadata alone while its size, times and identity
    /// are `self`'s; otherwise hashed again, streaming (a touched file keeps its hash and gets
    /// its new metadata; an edited one gets its new hash, which
    /// [`DataFingerprint::changed_from`] reports).
    pub fn current(&self) -> Result<Self> {
        self.at(Path::new(&self.path))
    }

    /// The fingerprint of the file at `path` (the shard `self` describes, moved there), from
    /// `self`'s hash while the metadata match (the same file), else hashed. A missing file is
    /// an error that names it and says how to resume on moved data.
    pub fn at(&self, path: &Path) -> Result<Self> {
        use std::io::Read;
        let err = |e: std::io::Error| data_err(path, io_message(&e));
        let meta = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(data_err(
                    path,
                    "no longer exists (moved or deleted): resume with --data giving the \
                     shards' new place (their content is checked against the run's hashes)",
                ));
            }
            other => other.map_err(err)?,
        };
        if !meta.is_file() {
            return Err(data_err(path, "is no longer a regular file"));
        }
        let path_s = path.display().to_string();
        if path_s == self.path && self.metadata_matches(&meta) {
            return Ok(self.clone());
        }
        let mut f = open_regular(path).map_err(err)?;
        // The metadata of the file as opened, from which the hash is read.
        let meta = f.metadata().map_err(err)?;
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut bytes = 0u64;
        loop {
            let n = f.read(&mut buf).map_err(err)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            bytes += n as u64;
        }
        Ok(Self {
            path: path_s,
            bytes,
            modified_ns: modified_ns(&meta),
            identity: Some(FileIdentity::of(&meta)),
            hash: format!("blake3:{}", h.finalize().to_hex()),
        })
    }
}

/// A file's modification time in nanoseconds since the Unix epoch (None where the filesystem
/// keeps none).
fn modified_ns(meta: &std::fs::Metadata) -> Option<u64> {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64)
}

/// An I/O error as a message in words, without the raw `(os error N)`.
pub fn io_message(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => "no such file or folder".into(),
        K::PermissionDenied => "permission denied".into(),
        K::NotADirectory => "a part of the path is not a folder".into(),
        K::IsADirectory => "is a folder, not a file".into(),
        K::AlreadyExists => "already exists".into(),
        K::StorageFull => "no space left on device".into(),
        K::ReadOnlyFilesystem => "the file system is read-only".into(),
        K::FileTooLarge => {
            "file too large (over the process's file size limit, ulimit -f, or the file system's)"
                .into()
        }
        K::QuotaExceeded => "disk quota exceeded".into(),
        _ => {
            let m = e.to_string();
            match m.rfind(" (os error ") {
                Some(i) => m[..i].to_string(),
                None => m,
            }
        }
    }
}

/// `path: message` for an error about `path`: an I/O error's message in words
/// ([`io_message`]), any other error's as it is.
pub fn at_path(path: &Path, e: &(dyn std::error::Error + 'static)) -> String {
    match e.downcast_ref::<std::io::Error>() {
        Some(io) => format!("{}: {}", path.display(), io_message(io)),
        None => format!("{}: {e}", path.display()),
    }
}

fn short_hash(h: &str) -> &str {
    &h[..h.len().min("blake3:".len() + 16)]
}

fn data_err(path: &Path, message: impl Into<String>) -> EngineError {
    EngineError::Data {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// The error of a read of `path`'s map (`mapped` bytes) that faulted: the file was truncated
/// while the run read it ([`duet_mmap::Changed`]); says how big it is now.
fn data_changed(path: &Path, mapped: usize) -> EngineError {
    let now = match std::fs::metadata(path) {
        Ok(m) if m.len() < mapped as u64 => format!(
            "it is shorter than when the run opened it: {} bytes, {mapped} then",
            m.len()
        ),
        Ok(_) => format!("it was truncated after the run opened it ({mapped} bytes then)"),
        Err(e) => format!("it can no longer be read: {}", io_message(&e)),
    };
    EngineError::DataChanged {
        path: path.display().to_string(),
        message: format!("changed while the run read it ({now})"),
    }
}

/// Reads a whole regular file. A FIFO, a character device or a directory is refused before it
/// is opened: reading one would block forever (a FIFO nobody writes) or never end (`/dev/zero`).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    read_regular_with_metadata(path).map(|(bytes, _)| bytes)
}

/// [`read_regular`], with the metadata of the file as opened (size and time match the bytes).
pub fn read_regular_with_metadata(path: &Path) -> std::io::Result<(Vec<u8>, std::fs::Metadata)> {
    use std::io::Read;
    let mut f = open_regular(path)?;
    let meta = f.metadata()?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes)?;
    Ok((bytes, meta))
}

/// Opens a regular file for reading; a FIFO, a device, a socket or a directory is refused
/// before it is opened (see [`read_regular`]).
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let kind = {
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            if t.is_dir() {
                "a directory"
            } else if t.is_fifo() {
                "a FIFO (named pipe)"
            } else if t.is_char_device() || t.is_block_device() {
                "a device"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            }
        };
        return Err(std::io::Error::other(format!(
            "is {kind}, not a regular file: duet reads its data and configurations from files"
        )));
    }
    std::fs::File::open(path)
}

/// What a `--data`/`--val-data` hint says about a `.bin` file without an llm.c header.
const NANOGPT_HINT: &str =
    "for nanoGPT's headerless uint16 train.bin/val.bin give --data-format nanogpt";

/// How a shard stores its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// UTF-8 text: each byte one token (vocabulary 256).
    Bytes,
    /// Little-endian uint16 tokens (llm.c's version 1, nanoGPT's `.bin`).
    U16,
    /// Little-endian uint32 tokens (llm.c's version 7).
    U32,
    /// An SFT shard's little-endian uint32 words: the id in the low 31 bits, bit 31
    /// ([`SFT_LEARNED`]) set on a learned token ([`sft`]).
    Sft,
}

impl Encoding {
    fn width(self) -> usize {
        match self {
            Encoding::Bytes => 1,
            Encoding::U16 => 2,
            Encoding::U32 | Encoding::Sft => 4,
        }
    }
}

/// Whether `path` is read as UTF-8 text under `format` (else as token shards).
pub fn is_text(path: &Path, format: DataFormat) -> bool {
    match format {
        DataFormat::Text => true,
        DataFormat::Auto => path.extension().is_none_or(|e| e != "bin"),
        DataFormat::Llmc | DataFormat::Nanogpt => false,
    }
}

/// Where the tokens of a file's bytes are: their encoding, the byte offset of the first and
/// their count. Checks the header (llm.c), the length (nanoGPT: whole uint16s) or the UTF-8
/// (text).
pub fn layout(path: &Path, bytes: &[u8], format: DataFormat) -> Result<(Encoding, usize, usize)> {
    if is_text(path, format) {
        if std::str::from_utf8(bytes).is_err() {
            let why = if format == DataFormat::Text {
                "not valid UTF-8 text (--data-format text)"
            } else {
                "not valid UTF-8 text (and not a .bin token shard)"
            };
            return Err(data_err(path, why));
        }
        return Ok((Encoding::Bytes, 0, bytes.len()));
    }
    if format == DataFormat::Nanogpt {
        // An llm.c shard read as headerless uint16 would train on its 1024-byte header (the
        // magic's halves as token ids, 54472 and 308, then the version and the count).
        if let Some((magic, version)) = llmc_magic_and_version(bytes) {
            return Err(data_err(
                path,
                format!(
                    "starts with an llm.c shard header (magic {magic}, version {version}), not \
                     nanoGPT's headerless uint16 tokens: drop --data-format nanogpt (auto and \
                     llmc read it as a shard)"
                ),
            ));
        }
        if !bytes.len().is_multiple_of(2) {
            return Err(data_err(
                path,
                format!(
                    "{} bytes is not a whole number of uint16 tokens (--data-format nanogpt: \
                     headerless uint16)",
                    bytes.len()
                ),
            ));
        }
        return Ok((Encoding::U16, 0, bytes.len() / 2));
    }
    llmc_layout(path, bytes, format == DataFormat::Auto)
}

/// The token encoding and header version an llm.c shard's magic stands for.
fn llmc_kind(magic: i32) -> Option<(Encoding, i32)> {
    match magic {
        LLMC_MAGIC => Some((Encoding::U16, LLMC_VERSION)),
        LLMC_MAGIC_U32 => Some((Encoding::U32, LLMC_VERSION_U32)),
        _ => None,
    }
}

/// Word `i` (little-endian i32) of an llm.c header at the start of `bytes`, if `bytes` holds it.
fn header_word(bytes: &[u8], i: usize) -> Option<i32> {
    bytes
        .get(4 * i..4 * i + 4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The magic and version of an llm.c shard header (uint16 or uint32 tokens) at the start of
/// `bytes`, when both are there.
fn llmc_magic_and_version(bytes: &[u8]) -> Option<(i32, i32)> {
    let (magic, version) = (header_word(bytes, 0)?, header_word(bytes, 1)?);
    if (magic, version) == (SFT_MAGIC, SFT_VERSION) {
        return Some((magic, version));
    }
    let (_, expected) = llmc_kind(magic)?;
    (version == expected).then_some((magic, version))
}

/// An llm.c shard's encoding, token offset (1024) and token count; `hint`: a bad header's error
/// names `--data-format nanogpt`.
fn llmc_layout(path: &Path, bytes: &[u8], hint: bool) -> Result<(Encoding, usize, usize)> {
    let hint = if hint {
        format!("; {NANOGPT_HINT}")
    } else {
        String::new()
    };
    if bytes.len() < LLMC_HEADER_BYTES {
        return Err(data_err(
            path,
            format!(
                "{} bytes is shorter than the 1024-byte llm.c shard header{hint}",
                bytes.len()
            ),
        ));
    }
    let word = |i: usize| header_word(bytes, i).expect("within the header");
    let (magic, version) = (word(0), word(1));
    if magic == SFT_MAGIC {
        return sft::sft_layout(path, bytes);
    }
    let (encoding, expected_version) = match llmc_kind(magic) {
        Some(kind) => kind,
        None => {
            return Err(data_err(
                path,
                format!(
                    "bad magic {magic} (an llm.c shard starts with {LLMC_MAGIC}, or \
                     {LLMC_MAGIC_U32} for uint32 tokens){hint}"
                ),
            ));
        }
    };
    if version != expected_version {
        return Err(data_err(
            path,
            format!(
                "unsupported shard version {version} for magic {magic} (expected \
                 {expected_version}: {} tokens)",
                if encoding == Encoding::U16 {
                    "uint16"
                } else {
                    "uint32"
                }
            ),
        ));
    }
    let n = word(2);
    let expected = LLMC_HEADER_BYTES as u64 + encoding.width() as u64 * n.max(0) as u64;
    if n < 0 || bytes.len() as u64 != expected {
        return Err(data_err(
            path,
            format!(
                "header says {n} tokens, so the file should be {expected} bytes, but it is {} \
                 (truncated or corrupt)",
                bytes.len()
            ),
        ));
    }
    Ok((encoding, LLMC_HEADER_BYTES, n as usize))
}

/// Token `i` of `bytes` (tokens of `encoding`).
#[inline]
fn token_at(bytes: &[u8], encoding: Encoding, i: usize) -> u32 {
    match encoding {
        Encoding::Bytes => bytes[i] as u32,
        Encoding::U16 => u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32,
        Encoding::U32 => u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")),
        Encoding::Sft => {
            u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes")) & !SFT_LEARNED
        }
    }
}

/// Appends tokens `start..start + n` of `bytes` (tokens of `encoding`) to `out`, widened.
fn extend_tokens(bytes: &[u8], encoding: Encoding, start: usize, n: usize, out: &mut Vec<i32>) {
    let w = encoding.width();
    let b = &bytes[w * start..w * (start + n)];
    match encoding {
        Encoding::Bytes => out.extend(b.iter().map(|&x| x as i32)),
        Encoding::U16 => out.extend(
            b.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i32),
        ),
        Encoding::U32 => out.extend(
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i32),
        ),
        Encoding::Sft => out.extend(
            b.chunks_exact(4)
                .map(|c| (u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & !SFT_LEARNED) as i32),
        ),
    }
}

/// The largest token of `bytes` (tokens of `encoding`; 0 when there are none).
fn max_token(bytes: &[u8], encoding: Encoding) -> u32 {
    match encoding {
        Encoding::Bytes => bytes.iter().copied().max().unwrap_or(0) as u32,
        Encoding::U16 => bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .max()
            .unwrap_or(0) as u32,
        Encoding::U32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .max()
            .unwrap_or(0),
        Encoding::Sft => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & !SFT_LEARNED)
            .max()
            .unwrap_or(0),
    }
}

/// The tokens of a data file's bytes, and the smallest vocabulary covering them: an llm.c shard
/// (uint16 or uint32) when `path` ends in `.bin`, else UTF-8 text as byte tokens (vocabulary
/// 256). The reader [`DataSet`] uses, on bytes in memory (fuzzing, tools).
pub fn tokens_from_bytes(path: &Path, bytes: &[u8]) -> Result<(Vec<u32>, usize)> {
    let (enc, off, n) = layout(path, bytes, DataFormat::Auto)?;
    let body = &bytes[off..];
    let tokens: Vec<u32> = (0..n).map(|i| token_at(body, enc, i)).collect();
    let vocab = match enc {
        Encoding::Bytes => 256,
        _ => tokens.iter().copied().max().map_or(1, |m| m as usize + 1),
    };
    Ok((tokens, vocab))
}

/// Parses an llm.c token shard (uint16 or uint32 tokens after a 1024-byte header).
pub fn parse_llmc_shard(path: &Path, bytes: &[u8]) -> Result<Vec<u32>> {
    let (enc, off, n) = llmc_layout(path, bytes, true)?;
    Ok((0..n).map(|i| token_at(&bytes[off..], enc, i)).collect())
}

/// Writes an llm.c uint16 shard (magic 20240520, version 1; for tests and tools).
pub fn write_llmc_shard(path: &Path, tokens: &[u16]) -> std::io::Result<()> {
    let mut out = llmc_header(LLMC_MAGIC, LLMC_VERSION, tokens.len());
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(path, out)
}

/// Writes an llm.c uint32 shard (magic 20240801, version 7; for tests and tools).
pub fn write_llmc_shard_u32(path: &Path, tokens: &[u32]) -> std::io::Result<()> {
    let mut out = llmc_header(LLMC_MAGIC_U32, LLMC_VERSION_U32, tokens.len());
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(path, out)
}

/// The 1024 bytes of an llm.c header: 256 little-endian i32, `[magic, version, tokens, 0…]`.
pub fn llmc_header(magic: i32, version: i32, tokens: usize) -> Vec<u8> {
    let mut header = [0i32; 256];
    header[0] = magic;
    header[1] = version;
    header[2] = i32::try_from(tokens).expect("an llm.c shard holds fewer than 2^31 tokens");
    header.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The shards of a run, resolved ([`resolve_data`]): concrete files, training then validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFiles {
    pub train: Vec<PathBuf>,
    /// Validation shards; empty: the tail [`VAL_FRACTION`] of every training shard is held out.
    pub val: Vec<PathBuf>,
    pub format: DataFormat,
    /// Shards left out as hard links of another shard of the same role (the one left out, the
    /// one kept): one file trains (or validates) once, whatever its names.
    pub hard_links: Vec<(PathBuf, PathBuf)>,
}

/// Expands `--data` and `--val-data` entries into shard lists. An entry is a file, a folder or
/// a glob (`*`, `?`, `[…]`; matches sorted by name). A folder's `.bin` files, sorted by name,
/// are its shards: those whose name holds `train` train, those holding `val` validate
/// (llm.c's `*_train_*.bin`/`*_val_*.bin`, nanoGPT's `train.bin`/`val.bin`); without a
/// `train` name the others train. The validation shards are `val_data`'s when given, else the
/// `data` folders' `val` shards, else none (each training shard's tail is held out). Files are
/// made absolute (canonical), so a resumed run finds them from any folder. A missing file, a
/// glob matching nothing, a folder without shards, a file listed twice, a validation shard that
/// is a training shard under another name (a hard link) and a mix of text files and token
/// shards are refused; a hard link of a shard of the same role is left out
/// ([`DataFiles::hard_links`]).
pub fn resolve_data(data: &[String], val_data: &[String], format: DataFormat) -> Result<DataFiles> {
    let mut train = Vec::new();
    let mut folder_val = Vec::new();
    for entry in data {
        expand(entry, false, &mut train, &mut folder_val)?;
    }
    let mut val = if val_data.is_empty() {
        folder_val
    } else {
        let mut val = Vec::new();
        for entry in val_data {
            expand(entry, true, &mut val, &mut Vec::new())?;
        }
        val
    };
    let mut seen = std::collections::HashSet::new();
    for (p, role) in train
        .iter()
        .map(|p| (p, "training"))
        .chain(val.iter().map(|p| (p, "validation")))
    {
        if !seen.insert(p.clone()) {
            return Err(data_err(
                p,
                format!(
                    "is listed twice (again as a {role} shard): give each shard once, in \
                     --data or --val-data"
                ),
            ));
        }
    }
    let hard_links = drop_hard_links(&mut train, &mut val)?;
    let all: Vec<&PathBuf> = train.iter().chain(&val).collect();
    if let (Some(t), Some(s)) = (
        all.iter().find(|p| is_text(p, format)),
        all.iter().find(|p| !is_text(p, format)),
    ) {
        return Err(data_err(
            t,
            format!(
                "is read as text (byte tokens) but {} is a token shard: a run's data is all text \
                 or all token shards",
                s.display()
            ),
        ));
    }
    Ok(DataFiles {
        train,
        val,
        format,
        hard_links,
    })
}

/// Leaves out of `train` and of `val` every shard that is the same file (device and inode) as
/// an earlier one of the same list — a hard link, which no path comparison shows — and returns
/// them with the shard kept; a validation shard that is a training shard is refused (the run
/// would validate on what it trains on).
fn drop_hard_links(
    train: &mut Vec<PathBuf>,
    val: &mut Vec<PathBuf>,
) -> Result<Vec<(PathBuf, PathBuf)>> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino())).ok();
    let mut dropped = Vec::new();
    let mut dedup = |list: &mut Vec<PathBuf>| {
        let mut seen: HashMap<(u64, u64), PathBuf> = HashMap::new();
        list.retain(|p| match id(p) {
            Some(k) => match seen.get(&k) {
                Some(kept) => {
                    dropped.push((p.clone(), kept.clone()));
                    false
                }
                None => {
                    seen.insert(k, p.clone());
                    true
                }
            },
            None => true,
        });
        seen
    };
    let trained = dedup(train);
    dedup(val);
    for v in val.iter() {
        if let Some(t) = id(v).and_then(|k| trained.get(&k)) {
            return Err(data_err(
                v,
                format!(
                    "is the training shard {} under another name (a hard link): a run cannot \
                     validate on a shard it trains on (give other --val-data)",
                    t.display()
                ),
            ));
        }
    }
    Ok(dropped)
}

/// One `--data` (`val`: `--val-data`) entry's files, appended to `out` (a folder's validation
/// shards to `folder_val`).
fn expand(
    entry: &str,
    val: bool,
    out: &mut Vec<PathBuf>,
    folder_val: &mut Vec<PathBuf>,
) -> Result<()> {
    let path = Path::new(entry);
    let flag = if val { "--val-data" } else { "--data" };
    if entry.is_empty() {
        return Err(EngineError::Config(format!("{flag}: an empty path")));
    }
    if std::fs::metadata(path).is_ok() {
        return expand_existing(path, val, out, folder_val);
    }
    if entry.contains(['*', '?', '[']) {
        let paths = glob::glob(entry)
            .map_err(|e| EngineError::Config(format!("{flag} {entry}: bad glob pattern: {e}")))?;
        let mut matched = 0;
        for p in paths {
            let p = p.map_err(|e| data_err(e.path(), e.error().to_string()))?;
            expand_existing(&p, val, out, folder_val)?;
            matched += 1;
        }
        if matched == 0 {
            return Err(EngineError::Config(format!(
                "{flag} {entry}: the glob matches no file"
            )));
        }
        return Ok(());
    }
    Err(data_err(path, "no such file or folder"))
}

fn expand_existing(
    path: &Path,
    val: bool,
    out: &mut Vec<PathBuf>,
    folder_val: &mut Vec<PathBuf>,
) -> Result<()> {
    let abs = |p: &Path| std::fs::canonicalize(p).map_err(|e| data_err(p, io_message(&e)));
    if !path.is_dir() {
        out.push(abs(path)?);
        return Ok(());
    }
    let mut bins = Vec::new();
    for e in std::fs::read_dir(path).map_err(|e| data_err(path, io_message(&e)))? {
        let p = e.map_err(|e| data_err(path, io_message(&e)))?.path();
        if p.extension().is_some_and(|x| x == "bin") && p.is_file() {
            bins.push(p);
        }
    }
    bins.sort();
    let name = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let (named_train, rest): (Vec<_>, Vec<_>) = bins
        .into_iter()
        .partition(|p| name(p).is_some_and(|n| n.contains("train")));
    let (named_val, others): (Vec<_>, Vec<_>) = rest
        .into_iter()
        .partition(|p| name(p).is_some_and(|n| n.contains("val")));
    let (mine, extra_val) = match (val, named_train.is_empty()) {
        // --val-data DIR: its `val` shards, else its other shards.
        (true, _) if !named_val.is_empty() => (named_val, Vec::new()),
        (true, _) => (others, Vec::new()),
        (false, false) => (named_train, named_val),
        (false, true) => (others, named_val),
    };
    if mine.is_empty() {
        return Err(data_err(
            path,
            format!(
                "the folder holds no {} .bin shards (in a folder, *train*.bin files are the \
                 training shards and *val*.bin the validation shards)",
                if val { "validation" } else { "training" }
            ),
        ));
    }
    for p in mine {
        out.push(abs(&p)?);
    }
    for p in extra_val {
        folder_val.push(abs(&p)?);
    }
    Ok(())
}

/// One data file, mapped: its tokens are read on demand.
#[derive(Debug)]
pub struct Shard {
    pub path: PathBuf,
    pub encoding: Encoding,
    map: duet_mmap::Mapped,
    /// Byte offset of the first token.
    offset: usize,
    /// Tokens in the shard.
    pub tokens: usize,
    /// The largest token (255 for text: its vocabulary is the 256 bytes).
    pub max_token: u32,
    /// What the file was when it was opened (a checkpoint stores it; a resume checks it).
    pub fingerprint: DataFingerprint,
    /// An SFT shard's example boundaries (token indices, from 0 to `tokens`); empty for a
    /// token shard.
    pub examples: Vec<usize>,
}

impl Shard {
    /// Maps `path` and checks its format; `known`: the fingerprint a resumed run's checkpoint
    /// holds (content changed since: refused); `hash`: compute the fingerprint's hash.
    pub fn open(
        path: &Path,
        format: DataFormat,
        known: Option<&DataFingerprint>,
        hash: bool,
    ) -> Result<Shard> {
        let err = |e: std::io::Error| data_err(path, io_message(&e));
        let file = open_regular(path).map_err(err)?;
        let meta = file.metadata().map_err(err)?;
        let map = duet_mmap::Mapped::map(&file).map_err(err)?;
        // One guarded read: a fault (the file truncated meanwhile) discards what it computed.
        let read = map.read(|bytes| -> Result<_> {
            let fingerprint = DataFingerprint::of(path, bytes, &meta, known, hash);
            if let Some(k) = known {
                fingerprint.ensure_unchanged_from(k)?;
            }
            let (encoding, offset, tokens) = layout(path, bytes, format)?;
            let max_token = match encoding {
                Encoding::Bytes => 255,
                e => max_token(&bytes[offset..], e),
            };
            let examples = match encoding {
                Encoding::Sft => sft::sft_boundaries(path, bytes, tokens)?,
                _ => Vec::new(),
            };
            Ok((fingerprint, encoding, offset, tokens, max_token, examples))
        });
        let (fingerprint, encoding, offset, tokens, max_token, examples) =
            read.map_err(|_| data_changed(path, map.len()))??;
        Ok(Shard {
            path: path.to_path_buf(),
            encoding,
            map,
            offset,
            tokens,
            max_token,
            fingerprint,
            examples,
        })
    }

    /// Runs `f` on the bytes of the tokens (the map from the first token on); an error naming
    /// the file when a read of the map faulted (the file was truncated while the run read it:
    /// see [`duet_mmap::Mapped::read`]), `f`'s result discarded.
    fn read_tokens<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        self.map
            .read(|bytes| f(&bytes[self.offset..]))
            .map_err(|_| data_changed(&self.path, self.map.len()))
    }

    /// Token `i`.
    pub fn token(&self, i: usize) -> Result<u32> {
        self.read_tokens(|b| token_at(b, self.encoding, i))
    }

    /// Appends tokens `start..start + n`, widened to i32.
    pub fn extend(&self, start: usize, n: usize, out: &mut Vec<i32>) -> Result<()> {
        self.read_tokens(|b| extend_tokens(b, self.encoding, start, n, out))
    }
}

/// A contiguous range of one shard's tokens (the training or validation part of a shard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Index into [`DataSet::shards`].
    pub shard: usize,
    pub start: usize,
    pub len: usize,
}

/// A run's data: its shards, mapped, and which parts of them train and validate.
#[derive(Debug)]
pub struct DataSet {
    /// Training shards, then validation shards.
    pub shards: Vec<Shard>,
    /// The training parts, in shard order.
    pub train: Vec<Span>,
    /// The validation parts, in shard order.
    pub val: Vec<Span>,
    /// Smallest vocabulary that covers every token of every shard.
    pub vocab_needed: usize,
    /// The examples of SFT shards (rows of one example each; [`sft`]); None for token shards.
    pub sft: Option<SftSet>,
    entropy: std::sync::OnceLock<f64>,
}

/// Most training tokens [`DataSet::unigram_entropy`] counts (more are sampled, evenly spaced).
pub const ENTROPY_SAMPLE: usize = 1 << 24;

impl DataSet {
    /// Opens the shards of `files` for sequences of `seq` tokens: every training and
    /// validation part must hold one window of `seq + 1` tokens.
    pub fn open(files: &DataFiles, seq: usize) -> Result<DataSet> {
        Self::open_with(files, seq, None, true)
    }

    /// [`DataSet::open`] for a resumed run whose checkpoint read the files as `known`: each
    /// shard's hash is taken from its fingerprint while its size and time match, else computed
    /// again, and a shard whose content changed is refused.
    pub fn open_known(
        files: &DataFiles,
        seq: usize,
        known: Option<&[DataFingerprint]>,
    ) -> Result<DataSet> {
        Self::open_with(files, seq, known, true)
    }

    /// [`DataSet::open`] without hashing (the fingerprints' hashes are empty): the checks and
    /// the vocabulary alone, e.g. for choosing the model's vocabulary before the run opens the
    /// data itself.
    pub fn scan(files: &DataFiles, seq: usize) -> Result<DataSet> {
        Self::open_with(files, seq, None, false)
    }

    fn open_with(
        files: &DataFiles,
        seq: usize,
        known: Option<&[DataFingerprint]>,
        hash: bool,
    ) -> Result<DataSet> {
        if files.train.is_empty() {
            return Err(EngineError::Config("no training data files".into()));
        }
        // Shards open (map, check, scan for the largest token, hash) in parallel; the error
        // reported is the first in file order (collecting straight into a Result would return
        // whichever failing shard a worker reached first).
        use rayon::prelude::*;
        let paths: Vec<&PathBuf> = files.train.iter().chain(&files.val).collect();
        let opened: Vec<Result<Shard>> = paths
            .par_iter()
            .map(|p| {
                let path_s = p.display().to_string();
                let k = known.and_then(|k| k.iter().find(|f| f.path == path_s));
                Shard::open(p, files.format, k, hash)
            })
            .collect();
        let shards = opened.into_iter().collect::<Result<Vec<Shard>>>()?;
        let n_sft = shards
            .iter()
            .filter(|s| s.encoding == Encoding::Sft)
            .count();
        if n_sft > 0 {
            return Self::open_sft(shards, files.train.len(), seq);
        }
        let mut train = Vec::new();
        let mut val = Vec::new();
        let window = seq + 1;
        for (i, s) in shards.iter().enumerate() {
            let n = s.tokens;
            if i >= files.train.len() || !files.val.is_empty() {
                if n < window {
                    return Err(data_err(
                        &s.path,
                        format!(
                            "{n} tokens is too few: need at least {window} for one window of \
                             sequences of {seq}"
                        ),
                    ));
                }
                let span = Span {
                    shard: i,
                    start: 0,
                    len: n,
                };
                if i < files.train.len() {
                    train.push(span);
                } else {
                    val.push(span);
                }
            } else {
                // No validation shards: the tail holds out; both parts need one window.
                let n_val = ((n as f64 * VAL_FRACTION) as usize).max(window);
                if n < n_val + window {
                    return Err(data_err(
                        &s.path,
                        format!(
                            "{n} tokens is too few: need at least {} for sequences of {seq} \
                             (training and validation)",
                            n_val + window
                        ),
                    ));
                }
                let split = n - n_val;
                train.push(Span {
                    shard: i,
                    start: 0,
                    len: split,
                });
                val.push(Span {
                    shard: i,
                    start: split,
                    len: n_val,
                });
            }
        }
        let vocab_needed = shards
            .iter()
            .map(|s| s.max_token as usize + 1)
            .max()
            .unwrap_or(1);
        Ok(DataSet {
            shards,
            train,
            val,
            vocab_needed,
            sft: None,
            entropy: std::sync::OnceLock::new(),
        })
    }

    /// A data set of SFT shards (the first `n_train` training shards): its examples; a token
    /// shard among them is refused (a run trains on one kind of data).
    fn open_sft(shards: Vec<Shard>, n_train: usize, seq: usize) -> Result<DataSet> {
        if let Some(s) = shards.iter().find(|s| s.encoding != Encoding::Sft) {
            let sft = shards.iter().find(|s| s.encoding == Encoding::Sft);
            return Err(data_err(
                &s.path,
                format!(
                    "is a token shard but {} is an SFT shard: a run's data is all token shards or all SFT shards",
                    sft.expect("one is").path.display()
                ),
            ));
        }
        let set = SftSet::of(&shards, n_train, seq)?;
        let span = |e: &[SftExample]| -> Vec<Span> {
            let mut spans: Vec<Span> = Vec::new();
            for e in e {
                match spans.last_mut() {
                    Some(s) if s.shard == e.shard && s.start + s.len == e.start => s.len += e.len,
                    _ => spans.push(Span {
                        shard: e.shard,
                        start: e.start,
                        len: e.len,
                    }),
                }
            }
            spans
        };
        let vocab_needed = shards
            .iter()
            .map(|s| s.max_token as usize + 1)
            .max()
            .unwrap_or(1);
        Ok(DataSet {
            train: span(&set.train),
            val: span(&set.val),
            shards,
            vocab_needed,
            sft: Some(set),
            entropy: std::sync::OnceLock::new(),
        })
    }

    /// Every shard's fingerprint (training shards, then validation shards).
    pub fn fingerprints(&self) -> Vec<DataFingerprint> {
        self.shards.iter().map(|s| s.fingerprint.clone()).collect()
    }

    /// The shard holding the largest token (the one to name when the vocabulary is too small).
    pub fn largest_token_shard(&self) -> &Shard {
        self.shards
            .iter()
            .max_by_key(|s| s.max_token)
            .expect("a data set has a shard")
    }

    pub fn train_tokens(&self) -> usize {
        self.train.iter().map(|s| s.len).sum()
    }

    pub fn val_tokens(&self) -> usize {
        self.val.iter().map(|s| s.len).sum()
    }

    /// Appends `n` tokens of `span` from its offset `at`.
    fn extend(&self, span: &Span, at: usize, n: usize, out: &mut Vec<i32>) -> Result<()> {
        self.shards[span.shard].extend(span.start + at, n, out)
    }

    /// `b` random windows of `t + 1` tokens (inputs, and targets one token later) over the
    /// training parts: the window starts of every part, concatenated, are numbered
    /// `0..Σ (len − t)` and each row's is `rng.below` that count, so every window lies in one
    /// part and all are equally likely. With one part this is nanoGPT's `get_batch` over it.
    /// An error names a shard truncated while the run read it.
    pub fn random_windows(
        &self,
        rng: &mut Rng,
        b: usize,
        t: usize,
    ) -> Result<(Vec<i32>, Vec<i32>)> {
        if let Some(sft) = &self.sft {
            return self.sft_rows(sft, rng, b, t);
        }
        let (ends, total) = start_index(&self.train, t);
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for _ in 0..b {
            let (span, at) = locate(&self.train, &ends, rng.below(total));
            self.extend(span, at, t, &mut inputs)?;
            self.extend(span, at + 1, t, &mut targets)?;
        }
        Ok((inputs, targets))
    }

    /// Fixed validation batches (at most `max_batches`): [`validation_batches`]' evenly spaced
    /// windows, over the validation parts' window starts concatenated (as
    /// [`DataSet::random_windows`] numbers them), so no window crosses a part's end. With one
    /// part these are [`validation_batches`]' windows of its tokens.
    pub fn validation_batches(
        &self,
        b: usize,
        t: usize,
        max_batches: usize,
    ) -> Result<Vec<(Vec<i32>, Vec<i32>)>> {
        if let Some(sft) = &self.sft {
            return self.sft_validation_batches(sft, b, t, max_batches);
        }
        let lens: Vec<usize> = self.val.iter().map(|s| s.len).collect();
        let (ends, _) = start_index(&self.val, t);
        spaced_windows(&lens, b, t, max_batches)
            .into_iter()
            .map(|rows| {
                let mut x = Vec::with_capacity(b * t);
                let mut y = Vec::with_capacity(b * t);
                for s in rows {
                    let (span, at) = locate(&self.val, &ends, s);
                    self.extend(span, at, t, &mut x)?;
                    self.extend(span, at + 1, t, &mut y)?;
                }
                Ok((x, y))
            })
            .collect()
    }

    /// Unigram entropy (nats per token) of the training parts: the loss of a model that knows
    /// only token frequencies. Exact up to [`ENTROPY_SAMPLE`] tokens; past that, estimated from
    /// that many evenly spaced tokens of each part in proportion to its length. Computed once.
    /// An error names a shard truncated while the run read it.
    pub fn unigram_entropy(&self) -> Result<f64> {
        if let Some(&h) = self.entropy.get() {
            return Ok(h);
        }
        let total = self.train_tokens().max(1);
        let mut counts = vec![0u64; self.vocab_needed];
        let mut n = 0u64;
        for span in &self.train {
            let shard = &self.shards[span.shard];
            let take = if total <= ENTROPY_SAMPLE {
                span.len
            } else {
                ((span.len as u128 * ENTROPY_SAMPLE as u128).div_ceil(total as u128) as usize)
                    .clamp(1, span.len)
            };
            // Of SFT shards, the learned tokens only (the targets the loss counts).
            let sft = shard.encoding == Encoding::Sft;
            n += shard.read_tokens(|bytes| {
                let mut n = 0;
                for j in 0..take {
                    let i = span.start + (j as u128 * span.len as u128 / take as u128) as usize;
                    if sft && token_at(bytes, Encoding::U32, i) & SFT_LEARNED == 0 {
                        continue;
                    }
                    counts[token_at(bytes, shard.encoding, i) as usize] += 1;
                    n += 1;
                }
                n
            })?;
        }
        let n = n as f64;
        let h = counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| c as f64 / n)
            .map(|p| -p * p.ln())
            .sum();
        Ok(*self.entropy.get_or_init(|| h))
    }
}

/// The window starts of `spans` for windows of `t + 1` tokens, concatenated: each span's end
/// in that numbering (cumulative `len − t`), and their total.
fn start_index(spans: &[Span], t: usize) -> (Vec<u64>, u64) {
    let mut total = 0u64;
    let ends = spans
        .iter()
        .map(|s| {
            total += (s.len - t) as u64;
            total
        })
        .collect();
    (ends, total)
}

/// The span and offset in it of window start `s` (numbered as [`start_index`] does).
fn locate<'a>(spans: &'a [Span], ends: &[u64], s: u64) -> (&'a Span, usize) {
    let i = ends.partition_point(|&e| e <= s);
    let before = if i == 0 { 0 } else { ends[i - 1] };
    (&spans[i], (s - before) as usize)
}

/// One batch and the sampler state right after drawing it.
#[derive(Clone, Debug)]
pub struct Batch {
    pub inputs: Vec<i32>,
    pub targets: Vec<i32>,
    pub state_after: u64,
}

/// Where training batches come from.
#[derive(Clone, Debug)]
pub enum Source {
    Progressions(Progressions),
    File {
        data: std::sync::Arc<DataSet>,
        rng: Rng,
    },
}

impl Source {
    /// Draws the next training batch of `b` sequences of `t` tokens. An error names a shard
    /// truncated while the run read it.
    pub fn next_batch(&mut self, b: usize, t: usize) -> Result<Batch> {
        Ok(match self {
            Source::Progressions(p) => {
                let (inputs, targets) = p.batch(b, t);
                Batch {
                    inputs,
                    targets,
                    state_after: p.rng_state(),
                }
            }
            Source::File { data, rng } => {
                let (inputs, targets) = data.random_windows(rng, b, t)?;
                Batch {
                    inputs,
                    targets,
                    state_after: rng.state(),
                }
            }
        })
    }

    pub fn set_state(&mut self, state: u64) {
        match self {
            Source::Progressions(p) => p.set_rng_state(state),
            Source::File { rng, .. } => *rng = Rng::new(state),
        }
    }

    pub fn state(&self) -> u64 {
        match self {
            Source::Progressions(p) => p.rng_state(),
            Source::File { rng, .. } => rng.state(),
        }
    }
}

/// Fixed validation batches: evenly spaced windows over the validation tokens (at most
/// `max_batches` batches), the same for every run.
pub fn validation_batches(
    val: &[u32],
    b: usize,
    t: usize,
    max_batches: usize,
) -> Vec<(Vec<i32>, Vec<i32>)> {
    spaced_windows(&[val.len()], b, t, max_batches)
        .into_iter()
        .map(|rows| {
            let mut x = Vec::with_capacity(b * t);
            let mut y = Vec::with_capacity(b * t);
            for s in rows {
                let s = s as usize;
                x.extend(val[s..s + t].iter().map(|&v| v as i32));
                y.extend(val[s + 1..s + t + 1].iter().map(|&v| v as i32));
            }
            (x, y)
        })
        .collect()
}

/// The window starts (numbered over the parts of lengths `lens` concatenated, as
/// [`start_index`] does) of the validation batches, `b` rows each: the parts hold
/// `Σ (len − 1) / t` disjoint windows, so `⌈that / b⌉` batches (1 to `max_batches`) of evenly
/// spaced windows, row `k` starting at `⌊k · (S − 1) / (batches · b)⌋` of the `S` starts.
fn spaced_windows(lens: &[usize], b: usize, t: usize, max_batches: usize) -> Vec<Vec<u64>> {
    let windows: usize = lens.iter().map(|l| (l - 1) / t).sum();
    let starts: usize = lens.iter().map(|l| l - t).sum();
    let n_batches = windows.div_ceil(b).clamp(1, max_batches.max(1));
    let total = n_batches * b;
    let stride = ((starts - 1) as f64 / total.max(1) as f64).max(0.0);
    (0..n_batches)
        .map(|i| {
            (0..b)
                .map(|r| ((i * b + r) as f64 * stride) as u64)
                .collect()
        })
        .collect()
}

/// Prefetches batches on a background thread (a bounded queue of `depth` batches). A batch
/// that cannot be read (a shard truncated while the run read it) ends the thread: its error
/// comes after the batches drawn before it, and again from every later call.
pub struct Prefetcher {
    rx: Option<Receiver<Result<Batch>>>,
    handle: Option<JoinHandle<()>>,
    /// The (path, message) of the [`EngineError::DataChanged`] that ended the thread.
    failed: Option<(String, String)>,
}

impl Prefetcher {
    pub fn start(mut source: Source, b: usize, t: usize, depth: usize) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("duet-data".into())
            .spawn(move || {
                loop {
                    let batch = source.next_batch(b, t);
                    let failed = batch.is_err();
                    if tx.send(batch).is_err() || failed {
                        break;
                    }
                }
            })
            .expect("spawn data thread");
        Self {
            rx: Some(rx),
            handle: Some(handle),
            failed: None,
        }
    }

    pub fn next_batch(&mut self) -> Result<Batch> {
        if let Some((path, message)) = &self.failed {
            return Err(EngineError::DataChanged {
                path: path.clone(),
                message: message.clone(),
            });
        }
        match self.rx.as_ref().and_then(|rx| rx.recv().ok()) {
            Some(Err(EngineError::DataChanged { path, message })) => {
                self.failed = Some((path.clone(), message.clone()));
                Err(EngineError::DataChanged { path, message })
            }
            Some(batch) => batch,
            None => Err(EngineError::Config("the data thread stopped".into())),
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Closing the receiver makes the producer's next send fail, so it exits.
        self.rx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("duet-data-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    /// One file, as `--data FILE` opens it.
    fn open1(p: &Path, seq: usize) -> Result<DataSet> {
        let files = resolve_data(&[p.display().to_string()], &[], DataFormat::Auto)?;
        DataSet::open(&files, seq)
    }

    fn open1_known(p: &Path, seq: usize, known: &DataFingerprint) -> Result<DataSet> {
        let files = resolve_data(&[p.display().to_string()], &[], DataFormat::Auto)?;
        DataSet::open_known(&files, seq, Some(std::slice::from_ref(known)))
    }

    #[test]
    fn shard_roundtrip_and_errors() {
        let p = tmp("ok.bin");
        let toks: Vec<u16> = (0..500).map(|i| (i * 7 % 1000) as u16).collect();
        write_llmc_shard(&p, &toks).unwrap();
        let f = open1(&p, 16).unwrap();
        assert_eq!(f.train_tokens() + f.val_tokens(), 500);
        assert_eq!(f.vocab_needed, *toks.iter().max().unwrap() as usize + 1);
        let back: Vec<u32> = (0..500).map(|i| f.shards[0].token(i).unwrap()).collect();
        assert_eq!(back, toks.iter().map(|&t| t as u32).collect::<Vec<_>>());

        let mut bytes = std::fs::read(&p).unwrap();
        bytes[0] ^= 1;
        let bad = tmp("badmagic.bin");
        std::fs::write(&bad, &bytes).unwrap();
        let e = open1(&bad, 16).unwrap_err().to_string();
        assert!(e.contains("badmagic.bin") && e.contains("bad magic"), "{e}");
        assert!(e.contains("--data-format nanogpt"), "{e}");

        let bytes = std::fs::read(&p).unwrap();
        let trunc = tmp("trunc.bin");
        std::fs::write(&trunc, &bytes[..bytes.len() - 3]).unwrap();
        let e = open1(&trunc, 16).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");

        let empty = tmp("empty.txt");
        std::fs::write(&empty, "").unwrap();
        let e = open1(&empty, 16).unwrap_err().to_string();
        assert!(e.contains("empty.txt") && e.contains("too few"), "{e}");
        // A FIFO is refused without blocking (nobody writes into it).
        let fifo = tmp("fifo.txt");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = open1(&fifo, 16).unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
        }
        let e = open1(Path::new("/dev/zero"), 16).unwrap_err().to_string();
        assert!(e.contains("a device"), "{e}");
        let e = open1(&tmp("missing.txt"), 16).unwrap_err().to_string();
        assert!(e.contains("missing.txt"), "{e}");
    }

    #[test]
    fn text_windows_and_validation() {
        let p = tmp("t.txt");
        std::fs::write(&p, "hello world, ".repeat(40)).unwrap();
        let f = std::sync::Arc::new(open1(&p, 8).unwrap());
        assert_eq!(f.vocab_needed, 256);
        let mut s = Source::File {
            data: f.clone(),
            rng: Rng::new(1),
        };
        let b = s.next_batch(4, 8).unwrap();
        assert_eq!(b.inputs.len(), 32);
        assert_eq!(&b.inputs[1..8], &b.targets[..7]);
        // Restoring the state reproduces the next batch.
        let state = s.state();
        let next = s.next_batch(4, 8).unwrap();
        s.set_state(state);
        assert_eq!(s.next_batch(4, 8).unwrap().inputs, next.inputs);
        let v = f.validation_batches(4, 8, 3).unwrap();
        assert!(!v.is_empty() && v.len() <= 3);
        assert!(f.unigram_entropy().unwrap() > 1.0);
    }

    #[test]
    fn prefetcher_yields_the_same_batches_in_order() {
        let src = Source::Progressions(Progressions::new(96, 8, 5));
        let mut direct = src.clone();
        let mut pre = Prefetcher::start(src, 2, 6, 2);
        for _ in 0..5 {
            assert_eq!(
                pre.next_batch().unwrap().inputs,
                direct.next_batch(2, 6).unwrap().inputs
            );
        }
    }

    #[test]
    fn a_fingerprint_is_hashed_again_only_when_size_or_time_changed() {
        let p = tmp("fingerprint.txt");
        std::fs::write(&p, "abcdefgh".repeat(64)).unwrap();
        let f = open1(&p, 8).unwrap().shards[0].fingerprint.clone();
        assert_eq!(f.bytes, 512);
        assert!(f.hash.starts_with("blake3:"), "{}", f.hash);
        assert_eq!(
            f.hash,
            format!(
                "blake3:{}",
                blake3::hash(&std::fs::read(&p).unwrap()).to_hex()
            )
        );
        assert_eq!(f.current().unwrap(), f);
        // Size and time unchanged: the stored hash is trusted, not computed (a wrong one shows
        // it was not recomputed).
        let mut trusted = f.clone();
        trusted.hash = "blake3:not-computed".into();
        assert_eq!(trusted.current().unwrap().hash, "blake3:not-computed");
        assert!(
            open1_known(&p, 8, &trusted).is_ok(),
            "the open trusts it too"
        );
        // Touched: hashed again, the same content, the new time kept.
        let file = std::fs::File::options().append(true).open(&p).unwrap();
        file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(9))
            .unwrap();
        drop(file);
        let touched = f.current().unwrap();
        assert_eq!(touched.hash, f.hash);
        assert_ne!(touched.modified_ns, f.modified_ns);
        assert_eq!(touched.changed_from(&f), None);
        // Same size, other content: the change is reported, and the open refuses it.
        std::fs::write(&p, "abcdefgX".repeat(64)).unwrap();
        let edited = f.current().unwrap();
        let why = edited.changed_from(&f).unwrap();
        assert!(why.contains("512 → 512 bytes"), "{why}");
        let e = open1_known(&p, 8, &f).unwrap_err().to_string();
        assert!(e.contains("changed since the run read it"), "{e}");
        // A scan does not hash.
        let files = resolve_data(&[p.display().to_string()], &[], DataFormat::Auto).unwrap();
        assert_eq!(
            DataSet::scan(&files, 8).unwrap().shards[0].fingerprint.hash,
            ""
        );
    }

    /// `cp -p`, `rsync -t` and `tar x` rewrite a shard and set its modification time back: the
    /// status-change time (and, for a new file, the inode) shows it, and the file is hashed
    /// again.
    #[test]
    fn a_shard_rewritten_with_its_size_and_time_restored_is_hashed_again() {
        let p = tmp("restored-time.txt");
        std::fs::write(&p, "abcdefgh".repeat(64)).unwrap();
        let f = open1(&p, 8).unwrap().shards[0].fingerprint.clone();
        assert!(f.identity.is_some());
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        // In place (the same inode, as `cp -p` onto an existing file writes it), a clock tick
        // later (the kernel stamps times at its tick).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, "abcdefgX".repeat(64)).unwrap();
        let file = std::fs::File::options().append(true).open(&p).unwrap();
        file.set_modified(mtime).unwrap();
        drop(file);
        let now = std::fs::metadata(&p).unwrap();
        assert_eq!((now.len(), now.modified().unwrap()), (512, mtime));
        let edited = f.current().unwrap();
        assert_ne!(edited.hash, f.hash);
        assert!(edited.changed_from(&f).is_some());
        let e = open1_known(&p, 8, &f).unwrap_err().to_string();
        assert!(e.contains("changed since the run read it"), "{e}");
        // A new file (another inode) with the old content, size and time: hashed again, and
        // the same content is accepted.
        let q = tmp("restored-time.new");
        std::fs::write(&q, "abcdefgh".repeat(64)).unwrap();
        let file = std::fs::File::options().append(true).open(&q).unwrap();
        file.set_modified(mtime).unwrap();
        drop(file);
        std::fs::rename(&q, &p).unwrap();
        let mut trusted = f.clone();
        trusted.hash = "blake3:not-computed".into();
        assert_eq!(trusted.current().unwrap().hash, f.hash);
        // A checkpoint from before identities were stored: hashed again once.
        let mut old = f.clone();
        old.identity = None;
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("identity"), "{json}");
        let back: DataFingerprint = serde_json::from_str(&json).unwrap();
        assert_eq!(back.identity, None);
        old.hash = "blake3:not-computed".into();
        assert_eq!(old.current().unwrap().hash, f.hash);
        // A missing file is named, in words.
        let e = DataFingerprint {
            path: tmp("gone.bin").display().to_string(),
            ..f.clone()
        }
        .current()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("gone.bin") && e.contains("no longer exists"),
            "{e}"
        );
        assert!(!e.contains("os error"), "{e}");
    }

    /// A shard and its hard link are one file: it trains once, and it cannot validate on
    /// itself.
    #[test]
    fn hard_links_are_one_shard() {
        let d = tmp("hard-links");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let toks: Vec<u16> = (0..300).map(|i| (i * 7 % 500) as u16).collect();
        write_llmc_shard(&d.join("a_train_1.bin"), &toks).unwrap();
        std::fs::hard_link(d.join("a_train_1.bin"), d.join("b_train_1.bin")).unwrap();
        write_llmc_shard(&d.join("c_train_2.bin"), &toks[..200]).unwrap();
        let files = resolve_data(&[d.display().to_string()], &[], DataFormat::Auto).unwrap();
        let canon = |n: &str| std::fs::canonicalize(d.join(n)).unwrap();
        assert_eq!(
            files.train,
            [canon("a_train_1.bin"), canon("c_train_2.bin")]
        );
        assert_eq!(
            files.hard_links,
            [(canon("b_train_1.bin"), canon("a_train_1.bin"))]
        );
        // A validation shard that is a training shard's hard link is refused.
        std::fs::hard_link(d.join("c_train_2.bin"), d.join("c_val_0.bin")).unwrap();
        let e = resolve_data(&[d.display().to_string()], &[], DataFormat::Auto)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("c_val_0.bin") && e.contains("c_train_2.bin"),
            "{e}"
        );
        assert!(e.contains("hard link"), "{e}");
    }

    #[test]
    fn formats_and_their_errors() {
        // uint32 llm.c shard: tokens past 65535 survive.
        let p = tmp("u32.bin");
        let toks: Vec<u32> = (0..300).map(|i| 70_000 + i * 3).collect();
        write_llmc_shard_u32(&p, &toks).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(bytes.len(), 1024 + 4 * 300);
        assert_eq!(
            &bytes[..12],
            &[20240801i32, 7, 300].map(i32::to_le_bytes).concat()[..]
        );
        let f = open1(&p, 8).unwrap();
        assert_eq!(f.shards[0].encoding, Encoding::U32);
        assert_eq!(f.vocab_needed, 70_000 + 299 * 3 + 1);
        assert_eq!(parse_llmc_shard(&p, &bytes).unwrap(), toks);
        // A wrong version for the magic is named.
        let mut v = bytes.clone();
        v[4..8].copy_from_slice(&1i32.to_le_bytes());
        let e = layout(&p, &v, DataFormat::Auto).unwrap_err().to_string();
        assert!(e.contains("unsupported shard version 1"), "{e}");
        // nanoGPT: headerless uint16; auto mode names --data-format nanogpt.
        let n = tmp("train.bin");
        let nt: Vec<u16> = (0..400).map(|i| (i * 11 % 5000) as u16).collect();
        std::fs::write(
            &n,
            nt.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>(),
        )
        .unwrap();
        let e = open1(&n, 8).unwrap_err().to_string();
        assert!(
            e.contains("train.bin") && e.contains("--data-format nanogpt"),
            "{e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        let files = resolve_data(&[n.display().to_string()], &[], DataFormat::Nanogpt).unwrap();
        let f = DataSet::open(&files, 8).unwrap();
        assert_eq!(f.shards[0].tokens, 400);
        let back: Vec<u32> = (0..400).map(|i| f.shards[0].token(i).unwrap()).collect();
        assert_eq!(back, nt.iter().map(|&t| t as u32).collect::<Vec<_>>());
        std::fs::write(&n, [1u8, 2, 3]).unwrap();
        let e = DataSet::open(&files, 1).unwrap_err().to_string();
        assert!(e.contains("whole number of uint16"), "{e}");
        // An llm.c shard (either token width) given as nanoGPT data is refused, not trained on
        // with its header as tokens.
        for (name, u32_tokens) in [("llmc16.bin", false), ("llmc32.bin", true)] {
            let l = tmp(name);
            if u32_tokens {
                write_llmc_shard_u32(&l, &(0..300).collect::<Vec<u32>>()).unwrap();
            } else {
                write_llmc_shard(&l, &(0..300).collect::<Vec<u16>>()).unwrap();
            }
            let files = resolve_data(&[l.display().to_string()], &[], DataFormat::Nanogpt).unwrap();
            let e = DataSet::open(&files, 8).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains("llm.c shard header") && !e.contains('\n'),
                "{e}"
            );
            // The same file reads as a shard by default.
            let files = resolve_data(&[l.display().to_string()], &[], DataFormat::Auto).unwrap();
            assert_eq!(DataSet::open(&files, 8).unwrap().shards[0].tokens, 300);
        }
        // --data-format text reads a .bin as bytes; llmc reads any name as a shard.
        let t = tmp("text.bin");
        std::fs::write(&t, "some text ".repeat(20)).unwrap();
        let files = resolve_data(&[t.display().to_string()], &[], DataFormat::Text).unwrap();
        assert_eq!(DataSet::open(&files, 8).unwrap().vocab_needed, 256);
        let s = tmp("shard.tokens");
        write_llmc_shard(&s, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]).unwrap();
        let files = resolve_data(&[s.display().to_string()], &[], DataFormat::Llmc).unwrap();
        assert_eq!(DataSet::open(&files, 2).unwrap().vocab_needed, 17);
        assert!(open1(&s, 2).is_err(), "auto: not .bin, so text, not UTF-8");
        for name in DataFormat::NAMES {
            assert_eq!(name.parse::<DataFormat>().unwrap().to_string(), name);
        }
        assert!("csv".parse::<DataFormat>().is_err());
    }

    #[test]
    fn the_spaced_windows_of_one_part_are_the_slice_ones() {
        let val: Vec<u32> = (0..997).map(|i| i * 31 % 101).collect();
        for (b, t, m) in [(4, 8, 3), (3, 16, 8), (2, 100, 50), (5, 7, 1)] {
            let rows = spaced_windows(&[val.len()], b, t, m);
            let slice = validation_batches(&val, b, t, m);
            assert_eq!(rows.len(), slice.len());
            for (r, (x, _)) in rows.iter().zip(&slice) {
                let from_rows: Vec<i32> = r
                    .iter()
                    .flat_map(|&s| val[s as usize..s as usize + t].iter().map(|&v| v as i32))
                    .collect();
                assert_eq!(&from_rows, x);
            }
        }
    }
}
