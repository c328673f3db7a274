//! A read-only memory map of a whole file: the `unsafe` code duet's data path needs (the map,
//! and the SIGBUS handler that keeps a truncated file from killing the process), kept out of
//! `duet-engine` (which is `#![forbid(unsafe_code)]`) in this crate of one type.
//!
//! Token shards (hundreds of MB each, tens of GB a corpus) are mapped rather than read, so a
//! run's resident memory is the pages its batches touch, not the corpus.
//!
//! A file truncated while it is mapped makes every read of a page past its new end fault with
//! SIGBUS, which would kill the process. The bytes are therefore only lent out through
//! [`Mapped::read`], and every map is guarded for its whole life (the `guard` module): a SIGBUS
//! in a map replaces the rest of it with zero pages and marks it [`Changed`], so the read that
//! faulted completes (on zeros) and reports the change instead of killing the run. (The page
//! holding the new end does not fault: past the end it reads zeros, which only a later page's
//! fault reveals.)
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod guard;

use std::fs::File;

/// The bytes of a file, mapped read-only: read through [`Mapped::read`].
pub struct Mapped {
    /// `None` for an empty file (mapping zero bytes fails on Linux).
    map: Option<memmap2::Mmap>,
    /// The map's entry in the SIGBUS handler's list (`None` for an empty file).
    guard: Option<&'static guard::Range>,
}

/// A read of a [`Mapped`] file faulted: the file was truncated (or otherwise changed) after it
/// was mapped, and the bytes the read saw are not the file's. Every later read of the map
/// fails too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Changed;

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the file changed while it was mapped (a read past its new end faulted)")
    }
}

impl std::error::Error for Changed {}

impl Mapped {
    /// Maps the whole of `file` (opened for reading) read-only.
    ///
    /// The map is sound only while no one rewrites the file in place: the bytes would change
    /// under the reader. duet maps only the data files of a run, opened read-only, and records
    /// each one's size, time and hash (`DataFingerprint`) when it opens it; a resume checks the
    /// fingerprint again. A truncation, which would make reads past the new end fault with
    /// SIGBUS, is caught: the read reports [`Changed`] (see [`Mapped::read`]).
    pub fn map(file: &File) -> std::io::Result<Self> {
        if file.metadata()?.len() == 0 {
            return Ok(Self {
                map: None,
                guard: None,
            });
        }
        // SAFETY: the file is opened read-only by the caller and mapped read-only (`Mmap`, not
        // `MmapMut`), so this process never writes through the map; another process changing
        // the file while it is mapped is outside the contract above (the run's data files are
        // fingerprinted and must not change during a run), except a truncation, whose faults
        // the guard registered below turns into zero pages and a `Changed` error.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| explain(e, max_map_count()))?;
        let guard = guard::register(map.as_ptr() as usize, map.len());
        Ok(Self {
            map: Some(map),
            guard: Some(guard),
        })
    }

    /// Bytes mapped (the file's size when it was mapped).
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs `f` on the mapped bytes. `Err(Changed)` when a read of the map faulted — the file
    /// was truncated since it was mapped — during `f` (on any thread: `f` may hand the bytes
    /// to others, as a parallel hash does) or before: `f`'s result is then discarded, since it
    /// was computed on zeros standing in for the missing bytes. A map that faulted once fails
    /// every later read without calling `f`.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R, Changed> {
        if self.changed() {
            return Err(Changed);
        }
        let r = f(self.map.as_deref().unwrap_or(&[]));
        if self.changed() { Err(Changed) } else { Ok(r) }
    }

    /// Whether a read of the map has faulted (the file is shorter than when it was mapped).
    pub fn changed(&self) -> bool {
        self.guard.is_some_and(|g| g.faulted())
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // Out of the handler's list before the map is unmapped (when the field drops).
        if let Some(g) = self.guard.take() {
            guard::unregister(g);
        }
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
        assert_eq!(m.read(|b| b.to_vec()), Ok(b"hello".to_vec()));
        let e = dir.join("empty");
        std::fs::write(&e, b"").unwrap();
        let empty = Mapped::map(&File::open(&e).unwrap()).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.read(|b| b.len()), Ok(0));
    }

    /// A file of `pages` pages of `byte`, mapped, under a name private to this test; and
    /// the page size.
    fn mapped(name: &str, pages: usize, byte: u8) -> (std::path::PathBuf, Mapped, usize) {
        let dir = std::env::temp_dir().join(format!("duet-mmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        let page = guard::page();
        std::fs::write(&p, vec![byte; pages * page]).unwrap();
        let m = Mapped::map(&File::open(&p).unwrap()).unwrap();
        (p, m, page)
    }

    fn truncate(p: &std::path::Path, len: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.set_len(len).unwrap();
    }

    fn sum(b: &[u8]) -> u64 {
        b.iter().map(|&x| x as u64).sum()
    }

    /// Issue 51 item 8: a shard truncated while a run mapped it killed the run with SIGBUS.
    /// A read past the new end now reports `Changed`; the process lives on.
    #[test]
    fn a_read_of_a_truncated_file_is_changed_not_a_crash() {
        let (p, m, page) = mapped("truncated", 8, 1);
        assert_eq!(m.read(sum), Ok(8 * page as u64));
        // Two pages left: a read within them still works, one past them faults.
        truncate(&p, 2 * page as u64);
        assert_eq!(m.read(|b| sum(&b[..2 * page])), Ok(2 * page as u64));
        assert!(!m.changed());
        assert_eq!(m.read(sum), Err(Changed));
        assert!(m.changed());
        // Every later read fails too, even of the pages still there.
        assert_eq!(m.read(|b| b[0]), Err(Changed));
        // Another map is untouched; a map made after the first is dropped (reusing its guard)
        // starts unchanged.
        let (_, other, _) = mapped("other", 3, 2);
        assert_eq!(other.read(sum), Ok(3 * 2 * page as u64));
        drop(m);
        let (_, again, _) = mapped("again", 2, 3);
        assert_eq!(again.read(sum), Ok(2 * 3 * page as u64));
        assert_eq!(other.read(sum), Ok(3 * 2 * page as u64));
    }

    /// A fault on another thread than the reader's (a parallel hash hands the bytes to a
    /// pool) is the reader's too.
    #[test]
    fn a_fault_on_a_thread_the_read_hands_the_bytes_to_counts() {
        let (p, m, _) = mapped("threads", 16, 1);
        truncate(&p, 0);
        let got = m.read(|b| {
            std::thread::scope(|s| {
                let halves: Vec<_> = b
                    .chunks(b.len() / 2)
                    .map(|c| s.spawn(move || sum(c)))
                    .collect();
                halves.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
            })
        });
        assert_eq!(got, Err(Changed));
    }
}
