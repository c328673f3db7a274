//! Memory: allocation, uploads and downloads, copies and fills.

use super::prelude::*;
use crate::error::HipError;
use crate::hip::sys;

impl HipDevice {
    pub(crate) fn alloc_impl(&self, dtype: DType, len: usize) -> Result<HipBuffer> {
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

    pub(crate) fn upload_bytes_impl(
        &self,
        src: &[u8],
        dst: &mut HipBuffer,
        offset: usize,
    ) -> Result<()> {
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

    pub(crate) fn download_bytes_impl(
        &self,
        src: &HipBuffer,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u8>> {
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

    pub(crate) fn copy_impl(
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

    pub(crate) fn fill_impl(&self, dst: &mut HipBuffer, value: f32) -> Result<()> {
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
}
