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
        let map = unsafe { memmap2::Mmap::map(file)? };
        Ok(Self { map: Some(map) })
    }
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
