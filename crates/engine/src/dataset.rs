//! Training data: the synthetic progression task, UTF-8 text files as byte tokens, and llm.c's
//! `.bin` token shards. Batches are produced from a seeded RNG (random windows, as nanoGPT's
//! `get_batch`), so a run's data order depends only on the seed and can be resumed from one
//! saved RNG state. A background thread prefetches the next batches.

use crate::data::Progressions;
use crate::rng::Rng;
use crate::{EngineError, Result};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

/// llm.c shard header: 256 little-endian i32, magic 20240520, version 1, token count.
pub const LLMC_MAGIC: i32 = 20240520;
pub const LLMC_VERSION: i32 = 1;
const LLMC_HEADER_BYTES: usize = 256 * 4;

/// Fraction of a token file held out for validation (its tail).
pub const VAL_FRACTION: f64 = 0.1;

/// Tokens read from a file, split into training and validation parts.
#[derive(Clone, Debug)]
pub struct TokenFile {
    pub path: PathBuf,
    pub train: Vec<u32>,
    pub val: Vec<u32>,
    /// Smallest vocabulary that covers every token.
    pub vocab_needed: usize,
    /// What the file was when it was read (a checkpoint stores it; a resume checks it).
    pub fingerprint: DataFingerprint,
}

/// A data file as a run read it: its size and modification time, and a hash of its content
/// computed once, when the run started. A resume compares the size and time first and hashes
/// the file again only when one of them changed (a multi-GB shard is not hashed on every
/// resume); a file whose content changed is refused.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataFingerprint {
    pub path: String,
    pub bytes: u64,
    /// Nanoseconds since the Unix epoch (absent where the filesystem keeps no time).
    pub modified_ns: Option<u64>,
    /// `blake3:<hex>` of the whole file.
    pub hash: String,
}

impl DataFingerprint {
    fn of(path: &Path, bytes: &[u8], meta: &std::fs::Metadata, known: Option<&Self>) -> Self {
        let modified_ns = modified_ns(meta);
        let path_s = path.display().to_string();
        let hash = match known {
            Some(k)
                if k.path == path_s
                    && k.bytes == bytes.len() as u64
                    && k.modified_ns == modified_ns =>
            {
                k.hash.clone()
            }
            _ => format!("blake3:{}", blake3::hash(bytes).to_hex()),
        };
        Self {
            path: path_s,
            bytes: bytes.len() as u64,
            modified_ns,
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

    /// The file at `self.path` now, from its metadata alone while its size and time are
    /// `self`'s; otherwise hashed again, streaming (a touched file keeps its hash and gets its
    /// new time; an edited one gets its new hash, which [`DataFingerprint::changed_from`]
    /// reports).
    pub fn current(&self) -> Result<Self> {
        use std::io::Read;
        let path = Path::new(&self.path);
        let err = |e: std::io::Error| data_err(path, e.to_string());
        let meta = std::fs::metadata(path).map_err(err)?;
        if !meta.is_file() {
            return Err(data_err(path, "is no longer a regular file"));
        }
        let modified_ns = modified_ns(&meta);
        if meta.len() == self.bytes && modified_ns == self.modified_ns {
            return Ok(self.clone());
        }
        let mut f = std::fs::File::open(path).map_err(err)?;
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
            path: self.path.clone(),
            bytes,
            modified_ns,
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

fn short_hash(h: &str) -> &str {
    &h[..h.len().min("blake3:".len() + 16)]
}

fn data_err(path: &Path, message: impl Into<String>) -> EngineError {
    EngineError::Data {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// Reads a whole regular file. A FIFO, a character device or a directory is refused before it
/// is opened: reading one would block forever (a FIFO nobody writes) or never end (`/dev/zero`).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    read_regular_with_metadata(path).map(|(bytes, _)| bytes)
}

/// [`read_regular`], with the metadata of the file as opened (size and time match the bytes).
pub fn read_regular_with_metadata(path: &Path) -> std::io::Result<(Vec<u8>, std::fs::Metadata)> {
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
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut bytes)?;
    Ok((bytes, meta))
}

impl TokenFile {
    /// Reads a `.bin` llm.c shard or, for any other extension, a UTF-8 text file as bytes.
    pub fn open(path: &Path, seq: usize) -> Result<TokenFile> {
        Self::open_known(path, seq, None)
    }

    /// [`TokenFile::open`] for a resumed run that read the file as `known`: the hash is taken
    /// from `known` while the size and time match, else computed again, and a file whose
    /// content changed is refused.
    pub fn open_known(
        path: &Path,
        seq: usize,
        known: Option<&DataFingerprint>,
    ) -> Result<TokenFile> {
        let (bytes, meta) =
            read_regular_with_metadata(path).map_err(|e| data_err(path, e.to_string()))?;
        let fingerprint = DataFingerprint::of(path, &bytes, &meta, known);
        if let Some(k) = known {
            fingerprint.ensure_unchanged_from(k)?;
        }
        let (tokens, vocab_needed) = tokens_from_bytes(path, &bytes)?;
        // Validation takes the tail; both parts need at least one window of seq + 1 tokens.
        let n_val = ((tokens.len() as f64 * VAL_FRACTION) as usize).max(seq + 1);
        if tokens.len() < n_val + seq + 1 {
            return Err(data_err(
                path,
                format!(
                    "{} tokens is too few: need at least {} for sequences of {seq} (training and validation)",
                    tokens.len(),
                    n_val + seq + 1
                ),
            ));
        }
        let split = tokens.len() - n_val;
        Ok(TokenFile {
            path: path.to_path_buf(),
            val: tokens[split..].to_vec(),
            train: tokens[..split].to_vec(),
            vocab_needed,
            fingerprint,
        })
    }

    /// Unigram entropy (nats per token) of the training part: the loss of a model that knows
    /// only token frequencies.
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = std::collections::HashMap::<u32, u64>::new();
        for &t in &self.train {
            *counts.entry(t).or_default() += 1;
        }
        let n = self.train.len() as f64;
        counts
            .values()
            .map(|&c| c as f64 / n)
            .map(|p| -p * p.ln())
            .sum()
    }
}

/// The tokens of a data file's bytes, and the smallest vocabulary covering them: an llm.c shard
/// when `path` ends in `.bin`, else UTF-8 text as byte tokens (vocabulary 256).
pub fn tokens_from_bytes(path: &Path, bytes: &[u8]) -> Result<(Vec<u32>, usize)> {
    if path.extension().is_some_and(|e| e == "bin") {
        let t = parse_llmc_shard(path, bytes)?;
        let v = t.iter().copied().max().map_or(1, |m| m as usize + 1);
        Ok((t, v))
    } else {
        if std::str::from_utf8(bytes).is_err() {
            return Err(data_err(
                path,
                "not valid UTF-8 text (and not a .bin token shard)",
            ));
        }
        Ok((bytes.iter().map(|&b| b as u32).collect(), 256))
    }
}

/// Parses an llm.c token shard (uint16 tokens after a 1024-byte header).
pub fn parse_llmc_shard(path: &Path, bytes: &[u8]) -> Result<Vec<u32>> {
    if bytes.len() < LLMC_HEADER_BYTES {
        return Err(data_err(
            path,
            format!(
                "{} bytes is shorter than the 1024-byte llm.c shard header",
                bytes.len()
            ),
        ));
    }
    let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if word(0) != LLMC_MAGIC {
        return Err(data_err(
            path,
            format!(
                "bad magic {} (an llm.c shard starts with {LLMC_MAGIC})",
                word(0)
            ),
        ));
    }
    if word(1) != LLMC_VERSION {
        return Err(data_err(
            path,
            format!(
                "unsupported shard version {} (expected {LLMC_VERSION}: uint16 tokens)",
                word(1)
            ),
        ));
    }
    let n = word(2);
    let expected = LLMC_HEADER_BYTES as u64 + 2 * n.max(0) as u64;
    if n < 0 || bytes.len() as u64 != expected {
        return Err(data_err(
            path,
            format!(
                "header says {n} tokens, so the file should be {expected} bytes, but it is {} (truncated or corrupt)",
                bytes.len()
            ),
        ));
    }
    Ok(bytes[LLMC_HEADER_BYTES..]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
        .collect())
}

/// Writes an llm.c shard (for tests and tools).
pub fn write_llmc_shard(path: &Path, tokens: &[u16]) -> std::io::Result<()> {
    let mut header = [0i32; 256];
    header[0] = LLMC_MAGIC;
    header[1] = LLMC_VERSION;
    header[2] = tokens.len() as i32;
    let mut out: Vec<u8> = header.iter().flat_map(|x| x.to_le_bytes()).collect();
    out.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    std::fs::write(path, out)
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
        data: std::sync::Arc<TokenFile>,
        rng: Rng,
    },
}

impl Source {
    /// Draws the next training batch of `b` sequences of `t` tokens.
    pub fn next_batch(&mut self, b: usize, t: usize) -> Batch {
        match self {
            Source::Progressions(p) => {
                let (inputs, targets) = p.batch(b, t);
                Batch {
                    inputs,
                    targets,
                    state_after: p.rng_state(),
                }
            }
            Source::File { data, rng } => {
                let (inputs, targets) = random_windows(&data.train, rng, b, t);
                Batch {
                    inputs,
                    targets,
                    state_after: rng.state(),
                }
            }
        }
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

fn random_windows(tokens: &[u32], rng: &mut Rng, b: usize, t: usize) -> (Vec<i32>, Vec<i32>) {
    let mut inputs = Vec::with_capacity(b * t);
    let mut targets = Vec::with_capacity(b * t);
    let starts = (tokens.len() - t) as u64;
    for _ in 0..b {
        let s = rng.below(starts) as usize;
        inputs.extend(tokens[s..s + t].iter().map(|&x| x as i32));
        targets.extend(tokens[s + 1..s + t + 1].iter().map(|&x| x as i32));
    }
    (inputs, targets)
}

/// Fixed validation batches: evenly spaced windows over the validation tokens (at most
/// `max_batches` batches), the same for every run.
pub fn validation_batches(
    val: &[u32],
    b: usize,
    t: usize,
    max_batches: usize,
) -> Vec<(Vec<i32>, Vec<i32>)> {
    let windows = (val.len() - 1) / t;
    let n_batches = windows.div_ceil(b).clamp(1, max_batches);
    let total = n_batches * b;
    let stride = ((val.len() - t - 1) as f64 / total.max(1) as f64).max(0.0);
    (0..n_batches)
        .map(|i| {
            let mut x = Vec::with_capacity(b * t);
            let mut y = Vec::with_capacity(b * t);
            for r in 0..b {
                let s = ((i * b + r) as f64 * stride) as usize;
                x.extend(val[s..s + t].iter().map(|&v| v as i32));
                y.extend(val[s + 1..s + t + 1].iter().map(|&v| v as i32));
            }
            (x, y)
        })
        .collect()
}

/// Prefetches batches on a background thread (a bounded queue of `depth` batches).
pub struct Prefetcher {
    rx: Option<Receiver<Batch>>,
    handle: Option<JoinHandle<()>>,
}

impl Prefetcher {
    pub fn start(mut source: Source, b: usize, t: usize, depth: usize) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let handle = std::thread::Builder::new()
            .name("duet-data".into())
            .spawn(move || while tx.send(source.next_batch(b, t)).is_ok() {})
            .expect("spawn data thread");
        Self {
            rx: Some(rx),
            handle: Some(handle),
        }
    }

    pub fn next_batch(&mut self) -> Result<Batch> {
        self.rx
            .as_ref()
            .and_then(|rx| rx.recv().ok())
            .ok_or_else(|| EngineError::Config("the data thread stopped".into()))
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

    #[test]
    fn shard_roundtrip_and_errors() {
        let p = tmp("ok.bin");
        let toks: Vec<u16> = (0..500).map(|i| (i * 7 % 1000) as u16).collect();
        write_llmc_shard(&p, &toks).unwrap();
        let f = TokenFile::open(&p, 16).unwrap();
        assert_eq!(f.train.len() + f.val.len(), 500);
        assert_eq!(f.vocab_needed, *toks.iter().max().unwrap() as usize + 1);

        let mut bytes = std::fs::read(&p).unwrap();
        bytes[0] ^= 1;
        let bad = tmp("badmagic.bin");
        std::fs::write(&bad, &bytes).unwrap();
        let e = TokenFile::open(&bad, 16).unwrap_err().to_string();
        assert!(e.contains("badmagic.bin") && e.contains("bad magic"), "{e}");

        let bytes = std::fs::read(&p).unwrap();
        let trunc = tmp("trunc.bin");
        std::fs::write(&trunc, &bytes[..bytes.len() - 3]).unwrap();
        let e = TokenFile::open(&trunc, 16).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");

        let empty = tmp("empty.txt");
        std::fs::write(&empty, "").unwrap();
        let e = TokenFile::open(&empty, 16).unwrap_err().to_string();
        assert!(e.contains("empty.txt") && e.contains("too few"), "{e}");
        // A FIFO is refused without blocking (nobody writes into it).
        let fifo = tmp("fifo.txt");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = TokenFile::open(&fifo, 16).unwrap_err().to_string();
            assert!(e.contains("FIFO"), "{e}");
        }
        let e = TokenFile::open(Path::new("/dev/zero"), 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a device"), "{e}");
        let e = TokenFile::open(&tmp("missing.txt"), 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.txt"), "{e}");
    }

    #[test]
    fn text_windows_and_validation() {
        let p = tmp("t.txt");
        std::fs::write(&p, "hello world, ".repeat(40)).unwrap();
        let f = std::sync::Arc::new(TokenFile::open(&p, 8).unwrap());
        assert_eq!(f.vocab_needed, 256);
        let mut s = Source::File {
            data: f.clone(),
            rng: Rng::new(1),
        };
        let b = s.next_batch(4, 8);
        assert_eq!(b.inputs.len(), 32);
        assert_eq!(&b.inputs[1..8], &b.targets[..7]);
        // Restoring the state reproduces the next batch.
        let state = s.state();
        let next = s.next_batch(4, 8);
        s.set_state(state);
        assert_eq!(s.next_batch(4, 8).inputs, next.inputs);
        let v = validation_batches(&f.val, 4, 8, 3);
        assert!(!v.is_empty() && v.len() <= 3);
        assert!(f.unigram_entropy() > 1.0);
    }

    #[test]
    fn prefetcher_yields_the_same_batches_in_order() {
        let src = Source::Progressions(Progressions::new(96, 8, 5));
        let mut direct = src.clone();
        let mut pre = Prefetcher::start(src, 2, 6, 2);
        for _ in 0..5 {
            assert_eq!(
                pre.next_batch().unwrap().inputs,
                direct.next_batch(2, 6).inputs
            );
        }
    }

    #[test]
    fn a_fingerprint_is_hashed_again_only_when_size_or_time_changed() {
        let p = tmp("fingerprint.txt");
        std::fs::write(&p, "abcdefgh".repeat(64)).unwrap();
        let f = TokenFile::open(&p, 8).unwrap().fingerprint;
        assert_eq!(f.bytes, 512);
        assert!(f.hash.starts_with("blake3:"), "{}", f.hash);
        assert_eq!(f.current().unwrap(), f);
        // Size and time unchanged: the stored hash is trusted, not computed (a wrong one shows
        // it was not recomputed).
        let mut trusted = f.clone();
        trusted.hash = "blake3:not-computed".into();
        assert_eq!(trusted.current().unwrap().hash, "blake3:not-computed");
        assert!(
            TokenFile::open_known(&p, 8, Some(&trusted)).is_ok(),
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
        let e = TokenFile::open_known(&p, 8, Some(&f))
            .unwrap_err()
            .to_string();
        assert!(e.contains("changed since the run read it"), "{e}");
    }
}
