//! Device buffers, allocation accounting, the pinned staging ring for uploads, the scratch
//! buffer used by two-pass reductions, and the cache of uploaded chunk tables.

use crate::error::{self, drv};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use duet_device::{Buffer, DType, DeviceError, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in live allocations of one device, and their high-water mark.
#[derive(Debug, Default)]
pub(crate) struct MemTracker {
    current: AtomicU64,
    peak: AtomicU64,
}

impl MemTracker {
    pub(crate) fn add(&self, bytes: u64) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn sub(&self, bytes: u64) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Raw device memory counted by a [`MemTracker`] while it lives.
#[derive(Debug)]
pub(crate) struct DeviceMemory {
    slice: CudaSlice<u8>,
    ptr: CUdeviceptr,
    tracker: Arc<MemTracker>,
}

impl DeviceMemory {
    /// Allocates `bytes` (> 0) zeroed bytes on `stream`, stream-ordered.
    pub(crate) fn zeroed(
        ctx: &CudaContext,
        stream: &Arc<CudaStream>,
        bytes: usize,
        tracker: &Arc<MemTracker>,
    ) -> Result<Self> {
        debug_assert!(bytes > 0);
        // An allocation inside a graph recording would become part of the graph (and be freed
        // outside it): refuse. Rare (allocations are), so the driver query costs nothing.
        if stream.capture_status().is_ok_and(|s| {
            s != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        }) {
            return Err(DeviceError::InvalidArgument(format!(
                "allocating {bytes} bytes while recording a CUDA graph (the recording may only \
                 queue device work; run the step once unrecorded first)"
            )));
        }
        let slice = stream.alloc_zeros::<u8>(bytes).map_err(|e| {
            if error::is_out_of_memory(&e) {
                let free = ctx.mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
                DeviceError::OutOfMemory {
                    requested: bytes as u64,
                    free,
                }
            } else {
                error::driver("cuMemAllocAsync", e)
            }
        })?;
        // The pointer stays valid for the slice's lifetime. Event tracking is disabled for the
        // context (one stream), so the returned guard records nothing.
        let ptr = {
            let (ptr, _guard) = slice.device_ptr(stream);
            ptr
        };
        tracker.add(bytes as u64);
        Ok(Self {
            slice,
            ptr,
            tracker: tracker.clone(),
        })
    }

    pub(crate) fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub(crate) fn bytes(&self) -> usize {
        self.slice.len()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // The CudaSlice frees itself (stream-ordered) right after this, without making its
        // context current first: do that here, for buffers dropped on another thread.
        let _ = self.slice.context().bind_to_thread();
        self.tracker.sub(self.slice.len() as u64);
    }
}

/// A CUDA device buffer: a typed view of one allocation. Empty buffers own no memory.
#[derive(Debug)]
pub struct CudaBuffer {
    mem: Option<DeviceMemory>,
    dtype: DType,
    len: usize,
}

impl CudaBuffer {
    pub(crate) fn new(mem: Option<DeviceMemory>, dtype: DType, len: usize) -> Self {
        Self { mem, dtype, len }
    }

    /// Device address of element `offset` (0 for an empty buffer). Callers check ranges.
    pub(crate) fn ptr_at(&self, offset: usize) -> u64 {
        match &self.mem {
            Some(m) => m.ptr() + (offset * self.dtype.size_bytes()) as u64,
            None => 0,
        }
    }

    /// The allocation behind the buffer (None for an empty one).
    pub(crate) fn into_memory(self) -> Option<DeviceMemory> {
        self.mem
    }

    /// Device address of the first element.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr_at(0)
    }
}

impl Buffer for CudaBuffer {
    fn dtype(&self) -> DType {
        self.dtype
    }

    fn len(&self) -> usize {
        self.len
    }
}

// ---------------------------------------------------------------------- pinned staging

/// Bytes per staging chunk, and the number of chunks in the ring. A training step uploads
/// three small buffers (tokens, targets, step scalars): eight chunks let the host queue the
/// next two steps while the device still runs this one (`Trainer::train_steps`).
const STAGE_BYTES: usize = 4 << 20;
const STAGES: usize = 8;

/// Page-locked host memory plus the event that marks the end of the last copy out of it.
struct PinnedChunk {
    ptr: *mut u8,
    event: CudaEvent,
    in_flight: bool,
}

// SAFETY: the chunk exclusively owns its page-locked allocation; the raw pointer is only used
// through `&mut self` (behind the device's mutex), so moving it between threads is sound.
unsafe impl Send for PinnedChunk {}

impl Drop for PinnedChunk {
    fn drop(&mut self) {
        // Never free memory a queued copy may still read.
        if self.in_flight {
            let _ = self.event.synchronize();
        }
        // SAFETY: `ptr` came from cuMemHostAlloc in `Staging::new`, is freed exactly once here,
        // and no copy reads it any more (waited above).
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// A ring of pinned buffers for asynchronous host→device uploads. An upload copies the host
/// bytes into the next chunk (after waiting for the chunk's previous copy to finish, via its
/// event), queues an async copy to the device and records the event, so `upload_bytes` returns
/// while the DMA runs and overlaps with queued kernels.
pub(crate) struct Staging {
    chunks: Vec<PinnedChunk>,
    next: usize,
}

impl Staging {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let mut chunks = Vec::with_capacity(STAGES);
        for _ in 0..STAGES {
            ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
            // SAFETY: a plain page-locked host allocation; the returned pointer is owned by the
            // PinnedChunk, which frees it in Drop.
            let ptr = unsafe {
                cudarc::driver::result::malloc_host(
                    STAGE_BYTES,
                    cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
                )
            }
            .map_err(drv("cuMemHostAlloc"))?;
            let event = match ctx.new_event(None) {
                Ok(e) => e,
                Err(e) => {
                    // SAFETY: freeing the allocation made just above, which nothing else uses.
                    let _ = unsafe { cudarc::driver::result::free_host(ptr) };
                    return Err(error::driver("cuEventCreate", e));
                }
            };
            chunks.push(PinnedChunk {
                ptr: ptr.cast(),
                event,
                in_flight: false,
            });
        }
        Ok(Self { chunks, next: 0 })
    }

    /// Queues the copy of `src` to device address `dst` (which must have room for it).
    pub(crate) fn upload(&mut self, stream: &CudaStream, src: &[u8], dst: u64) -> Result<()> {
        let mut done = 0usize;
        for piece in src.chunks(STAGE_BYTES) {
            let idx = self.next;
            self.next = (idx + 1) % self.chunks.len();
            let chunk = &mut self.chunks[idx];
            if chunk.in_flight {
                chunk
                    .event
                    .synchronize()
                    .map_err(drv("cuEventSynchronize"))?;
                chunk.in_flight = false;
            }
            // SAFETY: the chunk holds STAGE_BYTES ≥ piece.len() bytes, no copy reads it any more
            // (its event completed or it was never used), and `piece` is a separate host slice.
            let staged = unsafe {
                std::ptr::copy_nonoverlapping(piece.as_ptr(), chunk.ptr, piece.len());
                std::slice::from_raw_parts(chunk.ptr as *const u8, piece.len())
            };
            // SAFETY: `dst + done .. dst + done + piece.len()` lies inside the destination
            // allocation (checked by the caller); the pinned source stays untouched until the
            // event recorded next completes.
            unsafe {
                cudarc::driver::result::memcpy_htod_async(
                    dst + done as u64,
                    staged,
                    stream.cu_stream(),
                )
            }
            .map_err(drv("cuMemcpyHtoDAsync"))?;
            chunk.event.record(stream).map_err(drv("cuEventRecord"))?;
            chunk.in_flight = true;
            done += piece.len();
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------- scratch

/// A growable device scratch area for the partial sums of two-pass reductions. Callers hold the
/// device's mutex around it for the whole op, so two ops never share it; kernels that use it
/// are stream-ordered, so growing (free + alloc, both stream-ordered) is safe too.
#[derive(Default)]
pub(crate) struct Scratch {
    mem: Option<DeviceMemory>,
}

/// Offsets inside the scratch area are rounded up to this.
pub(crate) const SCRATCH_ALIGN: usize = 256;

impl Scratch {
    /// Returns the device address of at least `bytes` bytes of scratch.
    pub(crate) fn get(
        &mut self,
        ctx: &CudaContext,
        stream: &Arc<CudaStream>,
        bytes: usize,
        tracker: &Arc<MemTracker>,
    ) -> Result<u64> {
        let bytes = bytes.max(SCRATCH_ALIGN);
        if self.mem.as_ref().is_none_or(|m| m.bytes() < bytes) {
            self.mem = None;
            // Grow geometrically so alternating shapes do not reallocate every time.
            let want = bytes.next_power_of_two().max(1 << 16);
            self.mem = Some(DeviceMemory::zeroed(ctx, stream, want, tracker)?);
        }
        Ok(self.mem.as_ref().map(DeviceMemory::ptr).unwrap_or(0))
    }
}

/// Rounds `x` up to a multiple of [`SCRATCH_ALIGN`].
pub(crate) fn align_up(x: usize) -> usize {
    x.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN
}

// ---------------------------------------------------------------------- chunk tables

/// Uploaded chunk tables of the multi-tensor kernels, keyed by their bytes (filled and read by
/// `CudaDevice::table`, ops/optim.rs).
#[derive(Default)]
pub(crate) struct Tables {
    pub(crate) entries: Vec<(Vec<u8>, DeviceMemory)>,
}
