//! Memory: allocation, uploads and downloads, copies, fills and the multi-buffer zeroing.

use super::optim;
use super::prelude::*;
use crate::memory::{DeviceMemory, Staging};
use cudarc::driver::sys as cu;

impl CudaDevice {
    pub(crate) fn alloc_impl(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("alloc: {len} × {dtype} overflows"))
        })?;
        if bytes == 0 {
            return Ok(CudaBuffer::new(None, dtype, 0));
        }
        let mem = DeviceMemory::zeroed(&self.ctx, &self.stream, bytes, &self.mem)?;
        Ok(CudaBuffer::new(Some(mem), dtype, len))
    }

    pub(crate) fn upload_bytes_impl(
        &self,
        src: &[u8],
        dst: &mut CudaBuffer,
        offset: usize,
    ) -> Result<()> {
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

    pub(crate) fn download_bytes_impl(
        &self,
        src: &CudaBuffer,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u8>> {
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

    pub(crate) fn copy_impl(
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

    pub(crate) fn fill_impl(&self, dst: &mut CudaBuffer, value: f32) -> Result<()> {
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

    pub(crate) fn zero_many_impl(&self, dsts: &mut [&mut CudaBuffer]) -> Result<()> {
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
}
