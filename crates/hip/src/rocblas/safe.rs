//! A rocBLAS handle bound to the device's stream, with atomics forbidden (reproducible GEMMs),
//! destroyed in `Drop`.

use super::result::RocblasApi;
use super::sys;
use crate::error::HipError;
use crate::hip::safe::Stream;
use std::sync::Arc;

pub struct RocblasHandle {
    pub api: Arc<RocblasApi>,
    pub raw: sys::rocblas_handle,
    _stream: Arc<Stream>,
}

// SAFETY: the handle is only used behind the device's mutex, one call at a time.
unsafe impl Send for RocblasHandle {}
// SAFETY: as above.
unsafe impl Sync for RocblasHandle {}

impl RocblasHandle {
    pub fn new(api: Arc<RocblasApi>, stream: Arc<Stream>) -> Result<Self, HipError> {
        let raw = api.create_handle()?;
        let h = Self {
            api,
            raw,
            _stream: stream.clone(),
        };
        // SAFETY: both handles are live.
        unsafe { h.api.set_stream(h.raw, stream.raw()) }?;
        // Bit-wise reproducible GEMMs on every ROCm version (see `forbid_atomics`).
        // SAFETY: the handle is live.
        unsafe { h.api.forbid_atomics(h.raw) }?;
        Ok(h)
    }
}

impl Drop for RocblasHandle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and owned; the stream it uses outlives it (`_stream`).
        let _ = unsafe { self.api.destroy_handle(self.raw) };
    }
}
