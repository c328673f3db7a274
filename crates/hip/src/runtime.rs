//! [`duet_device::Runtime`] on HIP: buffers (stream-ordered allocations, staged uploads),
//! copies, fills and casts of whole buffers, synchronisation with the deferred reports, profiler
//! ranges (roctx), recorded graphs (hipGraph: the ops queued between `capture_begin` and
//! `capture_end` are recorded on the device's stream in thread-local mode and instantiated
//! once; `replay` launches the whole recording with one call), timing between device events,
//! memory statistics, the device's info and capabilities.

use crate::conv::{self, kernel_suffix};
use crate::device::{HipDevice, unsupported};
use crate::error::HipError;
use crate::graph::{Events, HipStepGraph};
use crate::hip::sys;
use crate::kernels::grid_dim;
use crate::memory::HipBuffer;
use crate::ops::{CHUNK, THREADS, push_u64};
use duet_device::{
    Buffer, Capabilities, DType, DeviceError, DeviceInfo, MemoryStats, Result, Runtime, args,
};
use std::sync::atomic::Ordering;

impl Runtime for HipDevice {
    type Buffer = HipBuffer;
    type Graph = HipStepGraph;

    fn info(&self) -> DeviceInfo {
        let mut info = self.info.clone();
        // hipBLASLt is created lazily, so its line says what it is now.
        info.details.insert(
            info.details.len() - 1,
            ("hipblaslt".into(), self.lt.describe()),
        );
        let epilogues = &self.caps.gemm_epilogue;
        info.details.insert(
            info.details.len() - 1,
            (
                "gemm_epilogue".into(),
                if !epilogues.is_empty() {
                    format!("hipBLASLt for {epilogues:?}, composed where it has no algorithm")
                } else if self.lt.api.is_none() {
                    "composed (no hipBLASLt)".into()
                } else {
                    "composed (DUET_HIP_UNFUSED)".into()
                },
            ),
        );
        info
    }

    fn capabilities(&self) -> &Capabilities {
        // Graphs where the runtime has them; flash attention unless DUET_HIP_NO_FLASH; the
        // 16-bit GEMM epilogues when hipBLASLt was found (and DUET_HIP_UNFUSED is not set).
        &self.caps
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<HipBuffer> {
        self.not_while_capturing("allocating")?;
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| DeviceError::InvalidArgument(format!("{len} x {dtype} overflows")))?;
        let buf = HipBuffer::new(&self.mem, dtype, len).map_err(|e| match e {
            HipError::Runtime { code: 2, .. } => DeviceError::OutOfMemory {
                requested: bytes as u64,
                free: self.api.mem_info().map_or(0, |m| m.0),
            },
            e => e.into(),
        })?;
        if bytes > 0 {
            // SAFETY: the buffer holds `bytes` bytes of device memory.
            unsafe {
                self.api
                    .memset_zero_async(buf.ptr(), bytes, self.stream.raw())
            }?;
        }
        Ok(buf)
    }

    fn upload_bytes(&self, src: &[u8], dst: &mut HipBuffer, offset: usize) -> Result<()> {
        self.not_while_capturing("uploading")?;
        args::validate_upload(dst, src.len(), offset)?;
        if src.is_empty() {
            return Ok(());
        }
        let mut staging = self
            .staging
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("staging lock poisoned".into()))?;
        if staging.is_none() {
            *staging = Some(crate::memory::Staging::new(&self.api)?);
        }
        let staging = staging.as_mut().expect("initialised above");
        // SAFETY: the destination range was checked (validate_upload) and the buffer's free is
        // stream-ordered after the copy; the stream is the device's own.
        unsafe { staging.upload(self.stream.raw(), src, dst.ptr_at(offset)) }?;
        Ok(())
    }

    fn download_bytes(&self, src: &HipBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.not_while_capturing("downloading")?;
        args::validate_download(src, offset, len)?;
        let mut out = vec![0u8; len * src.dtype().size_bytes()];
        if !out.is_empty() {
            // SAFETY: the source range was checked; `out` has room and lives past the synchronize.
            unsafe {
                self.api.memcpy_async(
                    out.as_mut_ptr().cast(),
                    src.ptr_at(offset),
                    out.len(),
                    sys::hipMemcpyKind::hipMemcpyDeviceToHost,
                    self.stream.raw(),
                )?;
            }
        }
        self.synchronize()?;
        Ok(out)
    }

    fn copy(
        &self,
        src: &HipBuffer,
        src_offset: usize,
        dst: &mut HipBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        args::validate_copy(src, src_offset, dst, dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked and are distinct buffers (borrow rules).
        unsafe {
            self.api.memcpy_async(
                dst.ptr_at(dst_offset),
                src.ptr_at(src_offset),
                len * src.dtype().size_bytes(),
                sys::hipMemcpyKind::hipMemcpyDeviceToDevice,
                self.stream.raw(),
            )?;
        }
        Ok(())
    }

    fn fill(&self, dst: &mut HipBuffer, value: f32) -> Result<()> {
        let (bits, width) = conv::fill_pattern(dst.dtype(), value);
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `len` elements of `width` bytes are the whole buffer.
        unsafe {
            self.api
                .memset_async(dst.ptr(), bits, width, dst.len(), self.stream.raw())
        }?;
        Ok(())
    }

    fn cast(&self, src: &HipBuffer, dst: &mut HipBuffer, scale: f32) -> Result<()> {
        const OP: &str = "cast";
        let n = args::validate_cast(src, dst)?;
        let s = kernel_suffix(src.dtype()).ok_or_else(|| unsupported(OP, src.dtype()))?;
        let d = kernel_suffix(dst.dtype()).ok_or_else(|| unsupported(OP, dst.dtype()))?;
        // SAFETY: cast_S_D(const S* src, D* dst, u64 n, float scale): both hold n elements.
        unsafe {
            self.kernel(&format!("cast_{s}_{d}"))?
                .grid(self.grid_1d(n))
                .arg_buf(src)
                .arg_buf(dst)
                .arg_u64(n as u64)
                .arg_f32(scale)
                .launch()
        }
    }

    fn zero_many(&self, dsts: &mut [&mut HipBuffer]) -> Result<()> {
        const OP: &str = "zero_many";
        // Chunks of CHUNK · 4 bytes; every chunk start stays 16-byte aligned (allocations are
        // 256-byte aligned and the chunk size is a multiple of 16).
        let bytes_per = CHUNK * 4;
        let mut table = Vec::new();
        let mut count = 0usize;
        for d in dsts.iter() {
            let bytes = d.size_bytes();
            for k in 0..bytes.div_ceil(bytes_per) {
                let len = bytes_per.min(bytes - k * bytes_per);
                push_u64(&mut table, d.ptr() as u64 + (k * bytes_per) as u64);
                push_u64(&mut table, len as u64);
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        // SAFETY: zero_many(const DuetZeroChunk*): `count` 16-byte records, each a byte range
        // inside one of the live buffers in `dsts`, starting 16-byte aligned.
        unsafe {
            self.kernel("zero_many")?
                .grid((blocks, 1, 1))
                .block((THREADS, 1, 1))
                .arg_ptr(table)
                .launch()
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.not_while_capturing("synchronising")?;
        self.stream.synchronize()?;
        let deferred = self.stream.deferred.take();
        if !deferred.is_empty() {
            return Err(DeviceError::Driver {
                backend: "hip",
                call: "deferred (buffer drop)".into(),
                message: deferred.join("; "),
            });
        }
        self.check_deferred()
    }

    fn range_push(&self, name: &str) {
        if let Some(r) = &self.roctx {
            r.push(name);
        }
    }

    fn range_pop(&self) {
        if let Some(r) = &self.roctx {
            r.pop();
        }
    }

    fn capture_begin(&self) -> Result<()> {
        self.not_while_capturing("starting a second recording")?;
        if !self.api.graphs_supported() {
            return Err(DeviceError::Unsupported {
                op: "graph capture (the HIP runtime lacks the hipGraph entry points)".into(),
                dtype: duet_device::DType::F32,
            });
        }
        // SAFETY: the device's stream is live and not capturing (checked above: only this
        // device records on it).
        unsafe { self.api.stream_begin_capture(self.stream.raw()) }?;
        self.capturing.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn capture_end(&self) -> Result<HipStepGraph> {
        if !self.capturing.swap(false, Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(
                "capture_end without capture_begin".into(),
            ));
        }
        // SAFETY: the stream is capturing (the flag was set by capture_begin).
        let graph = unsafe { self.api.stream_end_capture(self.stream.raw()) }?;
        if graph.is_null() {
            return Err(DeviceError::InvalidArgument(
                "the recording is empty".into(),
            ));
        }
        // SAFETY: `graph` is the live graph just recorded; it is destroyed right after the
        // instantiation, which keeps what it needs.
        let exec = unsafe { self.api.graph_instantiate(graph) };
        // SAFETY: as above; not used afterwards.
        let destroyed = unsafe { self.api.graph_destroy(graph) };
        let exec = exec?;
        let step = HipStepGraph {
            exec,
            api: self.api.clone(),
        };
        destroyed?;
        Ok(step)
    }

    fn replay(&self, g: &HipStepGraph) -> Result<()> {
        self.not_while_capturing("replaying a graph")?;
        // SAFETY: the exec is live (owned by `g`) and was recorded on this device's stream from
        // buffers the caller keeps alive while it replays (Runtime::replay's contract).
        unsafe { self.api.graph_launch(g.exec, self.stream.raw()) }?;
        Ok(())
    }

    /// [`duet_device::Runtime::time_ms`] between two timed events on the device's stream.
    fn time_ms<E: From<DeviceError>>(
        &self,
        work: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        self.not_while_capturing("timing")?;
        if !self.api.graphs_supported() {
            // No hipEventElapsedTime: the host clock between synchronisations.
            return duet_device::time_ms_host_clock(self, work);
        }
        let events = Events::new(&self.api)?;
        // SAFETY: both events are live (owned by `events`) and the stream is the device's own.
        unsafe { self.api.event_record(events.start, self.stream.raw()) }
            .map_err(DeviceError::from)?;
        work()?;
        // SAFETY: as above.
        unsafe {
            self.api
                .event_record(events.end, self.stream.raw())
                .map_err(DeviceError::from)?;
            self.api
                .event_synchronize(events.end)
                .map_err(DeviceError::from)?;
        }
        // SAFETY: both events were recorded and the later one has completed.
        let ms = unsafe { self.api.event_elapsed_ms(events.start, events.end) }
            .map_err(DeviceError::from)?;
        // Errors of the timed work that surface only at a synchronisation (the id checks).
        self.synchronize()?;
        Ok(ms as f64)
    }

    /// What `time_ms` measures with.
    fn timer_kind(&self) -> &'static str {
        if self.api.graphs_supported() {
            "device events"
        } else {
            "host clock"
        }
    }

    fn memory_stats(&self) -> MemoryStats {
        self.mem.stats(self.api.mem_info().ok())
    }

    fn reset_peak_memory(&self) {
        self.mem.reset_peak();
    }
}
