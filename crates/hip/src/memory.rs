//! Device buffers: stream-ordered allocations (hipMallocAsync where the device has memory pools,
//! else hipMalloc), counted per device, freed in `Drop`.

use crate::hip::safe::Stream;
use duet_device::{Buffer, DType, MemoryStats};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// State shared by a device and all its buffers.
pub struct MemShared {
    pub stream: Arc<Stream>,
    /// Whether allocations are stream-ordered (`hipDeviceAttributeMemoryPoolsSupported`).
    pub pools: bool,
    current: AtomicU64,
    peak: AtomicU64,
}

impl MemShared {
    pub fn new(stream: Arc<Stream>, pools: bool) -> Self {
        Self {
            stream,
            pools,
            current: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }
    fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
    pub fn stats(&self, driver: Option<(u64, u64)>) -> MemoryStats {
        MemoryStats {
            current: self.current.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            driver,
        }
    }
    pub fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// A typed device allocation.
pub struct HipBuffer {
    ptr: *mut c_void,
    len: usize,
    dtype: DType,
    mem: Arc<MemShared>,
}

// SAFETY: the buffer owns its device allocation; device pointers may be used from any thread and
// every access goes through the device's stream.
unsafe impl Send for HipBuffer {}
// SAFETY: `&HipBuffer` only exposes the pointer value; writes need `&mut` through the device.
unsafe impl Sync for HipBuffer {}

impl HipBuffer {
    /// Allocates `len` elements (uninitialised; the caller zeroes or writes them).
    pub(crate) fn new(
        mem: &Arc<MemShared>,
        dtype: DType,
        len: usize,
    ) -> Result<Self, crate::error::HipError> {
        let bytes = len * dtype.size_bytes();
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            let stream = mem.pools.then(|| mem.stream.raw());
            // SAFETY: the stream is live (held by `mem`).
            unsafe { mem.stream.api().malloc(bytes, stream) }?
        };
        mem.add(bytes as u64);
        Ok(Self {
            ptr,
            len,
            dtype,
            mem: mem.clone(),
        })
    }
    /// Device address of element `offset`.
    pub fn ptr_at(&self, offset: usize) -> *mut c_void {
        if self.ptr.is_null() {
            return self.ptr;
        }
        // SAFETY: callers validate `offset <= len`, so the result stays inside (or one past) the
        // allocation; it is only passed to the device, never dereferenced on the host.
        unsafe {
            self.ptr
                .cast::<u8>()
                .add(offset * self.dtype.size_bytes())
                .cast()
        }
    }
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }
}

impl Buffer for HipBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for HipBuffer {
    fn drop(&mut self) {
        let bytes = (self.len * self.dtype.size_bytes()) as u64;
        self.mem.current.fetch_sub(bytes, Ordering::Relaxed);
        if self.ptr.is_null() {
            return;
        }
        let stream = self.mem.pools.then(|| self.mem.stream.raw());
        // SAFETY: the allocation came from `malloc` with the same stream choice and, being
        // dropped, is no longer referenced by the host; with a stream-ordered free, work already
        // queued on the stream that uses it completes first.
        if let Err(e) = unsafe { self.mem.stream.api().free(self.ptr, stream) } {
            self.mem.stream.deferred.record(e);
        }
    }
}

// ---------------------------------------------------------------------- pinned staging

/// Bytes per staging chunk, and the number of chunks in the ring (the CUDA backend's sizes: a
/// training step uploads three small buffers, tokens, targets and step scalars; eight chunks
/// let the host queue the next two steps while the device still runs this one).
pub(crate) const STAGE_BYTES: usize = 4 << 20;
pub(crate) const STAGES: usize = 8;

/// Page-locked host memory plus the event that marks the end of the last copy out of it.
struct PinnedChunk {
    api: Arc<crate::hip::result::HipApi>,
    ptr: *mut u8,
    event: crate::hip::result::HipEvent,
    in_flight: bool,
}

// SAFETY: the chunk exclusively owns its page-locked allocation and its event; both are only
// used through `&mut self` (behind the device's staging mutex), and HIP handles may be used
// from any thread.
unsafe impl Send for PinnedChunk {}

impl PinnedChunk {
    /// Blocks until no queued copy reads the chunk any more.
    fn wait(&mut self) -> Result<(), crate::error::HipError> {
        if self.in_flight {
            // SAFETY: the event is live (owned) and was recorded after the chunk's last copy.
            unsafe { self.api.event_synchronize(self.event) }?;
            self.in_flight = false;
        }
        Ok(())
    }
}

impl Drop for PinnedChunk {
    fn drop(&mut self) {
        // Never free memory a queued copy may still read: when the wait fails the memory is
        // leaked rather than freed under the DMA engine.
        if self.wait().is_err() {
            return;
        }
        // SAFETY: the event is live and owned; `ptr` came from hipHostMalloc, is freed exactly
        // once here, and no copy reads it any more (waited above).
        unsafe {
            let _ = self.api.event_destroy(self.event);
            let _ = self.api.host_free(self.ptr);
        }
    }
}

/// A ring of pinned (`hipHostMalloc`) buffers for asynchronous host→device uploads, as in the
/// CUDA backend. An upload copies the host bytes into the next chunk (after waiting, through
/// the chunk's event, for its previous copy to finish), queues `hipMemcpyAsync` from it and
/// records the event: `upload_bytes` returns while the DMA runs, overlapping the queued
/// kernels, and the caller's slice is free to reuse at once. A pageable source would make the
/// runtime stage (and synchronise) the copy itself.
pub(crate) struct Staging {
    chunks: Vec<PinnedChunk>,
    next: usize,
}

impl Staging {
    pub(crate) fn new(
        api: &Arc<crate::hip::result::HipApi>,
    ) -> Result<Self, crate::error::HipError> {
        let mut chunks = Vec::with_capacity(STAGES);
        for _ in 0..STAGES {
            let ptr = api.host_malloc(STAGE_BYTES)?;
            let event = match api.event_create() {
                Ok(e) => e,
                Err(e) => {
                    // SAFETY: freeing the allocation made just above, which nothing uses.
                    let _ = unsafe { api.host_free(ptr) };
                    return Err(e);
                }
            };
            chunks.push(PinnedChunk {
                api: api.clone(),
                ptr,
                event,
                in_flight: false,
            });
        }
        Ok(Self { chunks, next: 0 })
    }

    /// Queues the copy of `src` to the device address `dst` on `stream`.
    ///
    /// # Safety
    /// `dst` must be device memory with room for `src.len()` bytes, live until the stream has
    /// run the copy (stream-ordered frees guarantee that for device buffers), and `stream` a
    /// live stream.
    pub(crate) unsafe fn upload(
        &mut self,
        stream: crate::hip::sys::hipStream_t,
        src: &[u8],
        dst: *mut c_void,
    ) -> Result<(), crate::error::HipError> {
        let mut done = 0usize;
        for piece in src.chunks(STAGE_BYTES) {
            let idx = self.next;
            self.next = (idx + 1) % self.chunks.len();
            let chunk = &mut self.chunks[idx];
            chunk.wait()?;
            // SAFETY: the chunk holds STAGE_BYTES ≥ piece.len() bytes, no copy reads it any
            // more (waited above), and `piece` is a separate host slice.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), chunk.ptr, piece.len()) };
            // SAFETY: `dst + done .. + piece.len()` lies inside the destination (the caller);
            // the pinned source stays untouched until the event recorded next completes.
            unsafe {
                chunk.api.memcpy_async(
                    dst.cast::<u8>().add(done).cast(),
                    chunk.ptr.cast(),
                    piece.len(),
                    crate::hip::sys::hipMemcpyKind::hipMemcpyHostToDevice,
                    stream,
                )?;
                if let Err(e) = chunk.api.event_record(chunk.event, stream) {
                    // The copy is queued but nothing marks its end: wait for the stream so the
                    // chunk is not reused (or freed) while the copy may still read it.
                    chunk.api.stream_synchronize(stream)?;
                    return Err(e);
                }
            }
            chunk.in_flight = true;
            done += piece.len();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hip::result::{HipApi, required_symbols};

    /// A fake HIP runtime whose copies really are asynchronous: `hipMemcpyAsync` only queues
    /// (dst, src, n) and reads the source when the queue runs, at `hipEventSynchronize` of a
    /// later-recorded event or at `fake_flush`. A staging chunk reused before its copy ran
    /// would therefore corrupt the data.
    const FAKE_HIP: &str = r#"
#include <stdlib.h>
#include <string.h>
typedef struct { void* dst; const void* src; size_t n; } Copy;
static Copy queue[4096]; static size_t queued = 0, ran = 0;
static size_t marks[64]; static int events = 0, syncs = 0, frees = 0;
static void run_to(size_t upto) { for (; ran < upto; ran++) memcpy(queue[ran].dst, queue[ran].src, queue[ran].n); }
unsigned hipMemcpyAsync(void* d, const void* s, size_t n, unsigned k, void* st) {
    (void)k; (void)st; queue[queued].dst = d; queue[queued].src = s; queue[queued].n = n; queued++; return 0;
}
unsigned hipHostMalloc(void** p, size_t n, unsigned f) { (void)f; *p = malloc(n); return *p ? 0 : 2; }
unsigned hipHostFree(void* p) { free(p); frees++; return 0; }
unsigned hipEventCreateWithFlags(void** e, unsigned f) { (void)f; *e = (void*)(size_t)(++events); return 0; }
unsigned hipEventRecord(void* e, void* s) { (void)s; marks[(size_t)e] = queued; return 0; }
unsigned hipEventSynchronize(void* e) { syncs++; run_to(marks[(size_t)e]); return 0; }
unsigned hipEventDestroy(void* e) { (void)e; return 0; }
int fake_pending(void) { return (int)(queued - ran); }
int fake_syncs(void) { return syncs; }
int fake_frees(void) { return frees; }
void fake_flush(void) { run_to(queued); }
"#;

    #[test]
    fn staged_uploads_never_reuse_a_chunk_before_its_copy_ran() {
        let mut names = required_symbols();
        names.extend(crate::hip::result::HOST_SYMBOLS);
        let path = crate::test_support::fake_library("staging", FAKE_HIP, &names).expect("cc");
        let name = path.to_string_lossy().into_owned();
        let lib = crate::loader::open_pinned(&name).unwrap();
        let api = Arc::new(HipApi::from_library(lib, &name).unwrap());
        let call = |sym: &[u8]| {
            let lib = crate::loader::open_pinned(&name).unwrap();
            // SAFETY: `int f(void)` functions of the fake.
            unsafe { (*lib.get::<unsafe extern "C" fn() -> i32>(sym).unwrap())() }
        };
        let mut staging = Staging::new(&api).unwrap();
        // Two and a half trips round the ring.
        let len = STAGES * STAGE_BYTES * 2 + STAGE_BYTES / 2 + 12_345;
        let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; len];
        // SAFETY: `dst` has room for `src` and outlives the flush below; the fake ignores the
        // stream.
        unsafe { staging.upload(std::ptr::null_mut(), &src, dst.as_mut_ptr().cast()) }.unwrap();
        assert!(
            call(b"fake_pending\0") > 0,
            "the upload returned before its copies ran"
        );
        assert!(
            call(b"fake_syncs\0") > 0,
            "the ring wrapped, so it waited on chunks"
        );
        // SAFETY: `void fake_flush(void)`.
        unsafe {
            let lib = crate::loader::open_pinned(&name).unwrap();
            (*lib.get::<unsafe extern "C" fn()>(b"fake_flush\0").unwrap())();
        }
        assert!(
            dst == src,
            "a staging chunk was overwritten before its copy ran"
        );
        // A second upload reuses the ring; dropping it waits for in-flight chunks, then frees.
        let small = vec![7u8; 1000];
        let mut out = vec![0u8; 1000];
        // SAFETY: as above.
        unsafe { staging.upload(std::ptr::null_mut(), &small, out.as_mut_ptr().cast()) }.unwrap();
        drop(staging);
        assert_eq!(out, small, "drop waited for the copy");
        assert_eq!(call(b"fake_frees\0"), STAGES as i32);
    }
}
