//! A read-only memory map of a whole file: the one `unsafe` call duet's data path makes, kept
//! out of `duet-engine` (which is `#![forbid(unsafe_code)]`) in this crate of one type.
//!
//! Token shards (hundreds of MB each, tens of GB a corpus) are mapped rather than read, so a
//! run's resident memory is the pages its batches touch, not the corpus.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::fs::File;
use std::ops::Deref;

/// The bytes of a file, mapped read-only. Derefs to `&[u8]`.
pub struct Mapped {
    /// `None` for an empty file (mapping zero bytes fails on Linux).
    map: Option<memmap2::Mmap>,
}

impl Mapped {
    /// Maps the whole of `file` (opened for reading) read-only.
    ///
    /// The map is sound only while no one truncates or rewrites the file: the bytes would
    /// change under the reader (a truncation makes reads past the new end fault with SIGBUS).
    /// duet maps only the data files of a run, opened read-only, and records each one's size,
    /// time and hash (`DataFingerprint`) when it opens it; a resume checks the fingerprint
    /// again. Rewriting a data file while a run reads it is outside that contract — as for
    /// llm.c's and nanoGPT's `np.memmap` readers.
    pub fn map(file: &File) -> std::io::Result<Self> {
        if file.metadata()?.len() == 0 {
            return Ok(Self { map: None });
        }
        // SAFETY: the file is opened read-only by the caller and mapped read-only (`Mmap`, not
        // `MmapMut`), so this process never writes through the map; the remaining hazard is
        // another process changing the file while it is mapped, which the contract above
        // excludes (the run's data files are fingerprinted and must not change during a run).
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| explain(e, max_map_count()))?;
        Ok(Self { map: Some(map) })
    }
}

/// Linux's limit on a process's memory maps (`/proc/sys/vm/max_map_count`), where readable.
fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A failed map, explained: `ENOMEM` from `mmap` on a file means the process ran out of map
/// slots (one per shard; tens of thousands of shards reach Linux's default 65,530) or of
/// address space, never that the file is too big for memory; say which limit and what to do.
fn explain(e: std::io::Error, max_map_count: Option<u64>) -> std::io::Error {
    if e.raw_os_error() != Some(12) {
        return e;
    }
    let limit = match max_map_count {
        Some(n) => format!("vm.max_map_count = {n}"),
        None => "vm.max_map_count".to_string(),
    };
    std::io::Error::new(
        e.kind(),
        format!(
            "cannot map the file: the process reached its limit of memory maps ({limit}; duet \
             maps every shard of a run) or of address space (ulimit -v) ({e}): merge the data \
             into fewer, larger shards, or raise the limit (sysctl -w vm.max_map_count=…)"
        ),
    )
}

impl Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapped({} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 51 item 17: 70,000 shards gave a bare `Cannot allocate memory (os error 12)`.
    #[test]
    fn an_out_of_maps_error_names_the_limit() {
        let e = explain(std::io::Error::from_raw_os_error(12), Some(65530)).to_string();
        assert!(
            e.contains("vm.max_map_count = 65530") && e.contains("fewer, larger shards"),
            "{e}"
        );
        let other = explain(std::io::Error::from_raw_os_error(13), Some(65530)).to_string();
        assert!(!other.contains("max_map_count"), "{other}");
    }

    #[test]
    fn maps_a_file_and_an_empty_one() {
        let dir = std::env::temp_dir().join(format!("duet-mmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("a");
        std::fs::write(&p, b"hello").unwrap();
        let m = Mapped::map(&File::open(&p).unwrap()).unwrap();
        assert_eq!(&m[..], b"hello");
        let e = dir.join("empty");
        std::fs::write(&e, b"").unwrap();
        assert!(Mapped::map(&File::open(&e).unwrap()).unwrap().is_empty());
    }
}
