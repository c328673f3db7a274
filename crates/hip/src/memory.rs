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
