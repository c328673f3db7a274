//! [`Runtime`] for [`CudaDevice`]: allocation, uploads and downloads, copies, fills, casts of
//! whole buffers and the multi-buffer zeroing, synchronisation, CUDA graphs (capture and replay,
//! see [`crate::graph`]), timing with device events, memory statistics, telemetry (NVML),
//! profiler ranges (NVTX), the device's info and capabilities.

use crate::device::{CudaDevice, EW_BLOCK, lock};
use crate::error::drv;
use crate::graph::CudaStepGraph;
use crate::kernels::{KernelModule, grid_dim};
use crate::memory::{CudaBuffer, DeviceMemory, Staging};
use crate::{conv, ops::optim};
use cudarc::driver::sys::{self as cu, CUdevice_attribute};
use duet_device::{
    Buffer, Capabilities, DType, DeviceError, DeviceInfo, MemoryStats, Result, Runtime, args,
};
use std::sync::atomic::Ordering;

impl CudaDevice {
    /// An error when a graph is being recorded (`what` may not happen then).
    fn not_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} while recording a CUDA graph: the recording may only queue device work"
            )));
        }
        Ok(())
    }
}

impl Runtime for CudaDevice {
    type Buffer = CudaBuffer;
    type Graph = CudaStepGraph;

    fn info(&self) -> DeviceInfo {
        let mut info = self.info.clone();
        info.details.push((
            "f32 gemm".into(),
            if self.blas.allow_tf32() {
                "TF32 tensor cores (allowed)".into()
            } else {
                "FP32 (no TF32)".into()
            },
        ));
        info
    }

    fn capabilities(&self) -> &Capabilities {
        // Both sets are made at start; set_fused_ops switches between them.
        if self.fused_ops() {
            &self.caps[1]
        } else {
            &self.caps[0]
        }
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("alloc: {len} × {dtype} overflows"))
        })?;
        if bytes == 0 {
            return Ok(CudaBuffer::new(None, dtype, 0));
        }
        let mem = DeviceMemory::zeroed(&self.ctx, &self.stream, bytes, &self.mem)?;
        Ok(CudaBuffer::new(Some(mem), dtype, len))
    }

    fn upload_bytes(&self, src: &[u8], dst: &mut CudaBuffer, offset: usize) -> Result<()> {
        self.not_while_capturing("uploading")?;
        const OP: &str = "upload_bytes";
        args::validate_upload(dst, src.len(), offset)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut staging = lock(&self.staging, OP)?;
        if staging.is_none() {
            *staging = Some(Staging::new(&self.ctx)?);
        }
        staging
            .as_mut()
            .expect("initialised above")
            .upload(&self.stream, src, dst.ptr_at(offset))
    }

    fn download_bytes(&self, src: &CudaBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.not_while_capturing("downloading")?;
        args::validate_download(src, offset, len)?;
        let mut out = vec![0u8; len * src.dtype().size_bytes()];
        if !out.is_empty() {
            self.bind()?;
            // SAFETY: the source range lies inside `src` (checked); `out` has exactly its size.
            // The copy is ordered after all queued work on the stream and, with a pageable
            // destination, has completed when the call returns; the synchronize below makes
            // sure and reports earlier asynchronous failures.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut out,
                    src.ptr_at(offset),
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        }
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        self.check_deferred()?;
        Ok(out)
    }

    fn copy(
        &self,
        src: &CudaBuffer,
        src_offset: usize,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        args::validate_copy(src, src_offset, dst, dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges were checked against their (distinct, live) allocations.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr_at(dst_offset),
                src.ptr_at(src_offset),
                len * src.dtype().size_bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn fill(&self, dst: &mut CudaBuffer, value: f32) -> Result<()> {
        let (bits, width) = conv::fill_pattern(dst.dtype(), value)?;
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (ptr, s) = (dst.ptr(), self.stream.cu_stream());
        // SAFETY: `n` elements of the element size used below are exactly `dst`'s allocation.
        let r = unsafe {
            match width {
                1 => cu::cuMemsetD8Async(ptr, bits as u8, n, s),
                2 => cu::cuMemsetD16Async(ptr, bits as u16, n, s),
                _ => cu::cuMemsetD32Async(ptr, bits, n, s),
            }
        };
        r.result().map_err(drv("cuMemsetAsync"))
    }

    fn cast(&self, src: &CudaBuffer, dst: &mut CudaBuffer, scale: f32) -> Result<()> {
        const OP: &str = "cast";
        let n = args::validate_cast(src, dst)?;
        let unsupported = |dtype| DeviceError::Unsupported {
            op: OP.into(),
            dtype,
        };
        let s = conv::kernel_suffix(src.dtype()).ok_or_else(|| unsupported(src.dtype()))?;
        let d = conv::kernel_suffix(dst.dtype()).ok_or_else(|| unsupported(dst.dtype()))?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: reduce.cu's cast_<s>_<d>(const S*, D*, u64 n, float scale): both buffers hold
        // n elements (validated), of the dtypes the suffixes name.
        unsafe {
            self.kernel(KernelModule::Reduce, &format!("cast_{s}_{d}"))?
                .grid(self.grid_1d(n))
                .block((EW_BLOCK, 1, 1))
                .arg_buf(src)
                .arg_buf(dst)
                .arg_u64(n as u64)
                .arg_f32(scale)
                .launch()
        }
    }

    fn zero_many(&self, dsts: &mut [&mut CudaBuffer]) -> Result<()> {
        const OP: &str = "zero_many";
        // Chunks of CHUNK · 4 bytes; every chunk start stays 16-byte aligned (allocations are
        // 256-byte aligned and the chunk size is a multiple of 16).
        let bytes_per = optim::CHUNK * 4;
        let mut table = Vec::new();
        let mut count = 0usize;
        for d in dsts.iter() {
            let bytes = d.size_bytes();
            for k in 0..bytes.div_ceil(bytes_per) {
                let len = bytes_per.min(bytes - k * bytes_per);
                table.extend_from_slice(&(d.ptr() + (k * bytes_per) as u64).to_le_bytes());
                table.extend_from_slice(&(len as u64).to_le_bytes());
                count += 1;
            }
        }
        if count == 0 {
            return Ok(());
        }
        let blocks = grid_dim(OP, count)?;
        let table = self.table(OP, table)?;
        // SAFETY: zero_many(const ZeroChunk*): `count` 16-byte records, each a byte range
        // inside one of the live buffers in `dsts`, starting 16-byte aligned.
        unsafe {
            self.kernel(KernelModule::Reduce, "zero_many")?
                .grid((blocks, 1, 1))
                .block((256, 1, 1))
                .arg_ptr(table)
                .launch()
        }
    }

    fn synchronize(&self) -> Result<()> {
        self.not_while_capturing("synchronising")?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        self.ctx.check_err().map_err(drv("deferred"))?;
        self.check_deferred()
    }

    fn range_push(&self, name: &str) {
        if let Some(n) = &self.nvtx {
            n.push(name);
        }
    }

    fn range_pop(&self) {
        if let Some(n) = &self.nvtx {
            n.pop();
        }
    }

    fn capture_begin(&self) -> Result<()> {
        self.not_while_capturing("starting a second recording")?;
        self.bind()?;
        self.stream
            .begin_capture(cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        self.capturing.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn capture_end(&self) -> Result<CudaStepGraph> {
        if !self.capturing.swap(false, Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(
                "capture_end without capture_begin".into(),
            ));
        }
        self.bind()?;
        let graph = self
            .stream
            .end_capture(cu::CUgraphInstantiate_flags(0))
            .map_err(drv("cuStreamEndCapture / cuGraphInstantiate"))?
            .ok_or_else(|| DeviceError::InvalidArgument("the recording is empty".into()))?;
        graph.upload().map_err(drv("cuGraphUpload"))?;
        Ok(CudaStepGraph { graph })
    }

    fn replay(&self, g: &CudaStepGraph) -> Result<()> {
        self.not_while_capturing("replaying a graph")?;
        g.graph.launch().map_err(drv("cuGraphLaunch"))
    }

    fn time_ms<E: From<DeviceError>>(
        &self,
        work: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        self.not_while_capturing("timing")?;
        let timed = Some(cu::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
        let end = self.ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
        start.record(&self.stream).map_err(drv("cuEventRecord"))?;
        work()?;
        end.record(&self.stream).map_err(drv("cuEventRecord"))?;
        end.synchronize().map_err(drv("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
        Ok(ms as f64)
    }

    fn timer_kind(&self) -> &'static str {
        "device events"
    }

    fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            current: self.mem.current(),
            peak: self.mem.peak(),
            driver: self
                .ctx
                .mem_get_info()
                .ok()
                .map(|(free, total)| (free as u64, total as u64)),
        }
    }

    fn reset_peak_memory(&self) {
        self.mem.reset_peak();
    }

    fn telemetry(&self) -> Option<duet_device::Telemetry> {
        self.nvml
            .get_or_init(|| {
                let attr = |a| self.ctx.attribute(a).ok().map(|v| v as u32);
                crate::nvml::Nvml::load(
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
                )
            })
            .as_ref()?
            .sample()
    }
}
