//! Owning HIP runtime objects that release themselves in `Drop`.

use super::result::HipApi;
use super::sys;
use crate::error::HipError;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

/// Errors from `Drop` impls (which cannot return them), reported at the next synchronize.
#[derive(Default)]
pub struct Deferred(Mutex<Vec<String>>);

impl Deferred {
    pub fn record(&self, e: HipError) {
        if let Ok(mut v) = self.0.lock() {
            v.push(e.to_string());
        }
    }
    pub fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// A non-blocking stream; destroyed (after draining) when dropped.
pub struct Stream {
    api: Arc<HipApi>,
    raw: sys::hipStream_t,
    pub deferred: Deferred,
}

// SAFETY: a HIP stream handle may be used from any host thread; the runtime serialises access.
unsafe impl Send for Stream {}
// SAFETY: as above; `&Stream` only exposes the handle for enqueueing work.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(api: Arc<HipApi>) -> Result<Self, HipError> {
        let raw = api.stream_create()?;
        Ok(Self {
            api,
            raw,
            deferred: Deferred::default(),
        })
    }
    pub fn raw(&self) -> sys::hipStream_t {
        self.raw
    }
    pub fn api(&self) -> &Arc<HipApi> {
        &self.api
    }
    pub fn synchronize(&self) -> Result<(), HipError> {
        // SAFETY: `raw` is live for as long as `self`.
        unsafe { self.api.stream_synchronize(self.raw) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream is live and, with `&mut self`, no longer used by anyone else;
        // buffers hold an `Arc<Stream>`, so none outlives it.
        unsafe {
            let _ = self.api.stream_synchronize(self.raw);
            let _ = self.api.stream_destroy(self.raw);
        }
    }
}

/// A loaded code object.
pub struct Module {
    api: Arc<HipApi>,
    raw: sys::hipModule_t,
}

// SAFETY: module and function handles are process-wide and usable from any thread.
unsafe impl Send for Module {}
// SAFETY: as above; the module is immutable once loaded.
unsafe impl Sync for Module {}

impl Module {
    pub fn load(api: Arc<HipApi>, image: &[u8]) -> Result<Self, HipError> {
        let raw = api.module_load(image)?;
        Ok(Self { api, raw })
    }
    /// The kernel `name`; the handle stays valid while `self` lives.
    pub fn function(&self, name: &CStr) -> Result<Function, HipError> {
        // SAFETY: `raw` is live for as long as `self`.
        let f = unsafe { self.api.module_function(self.raw, name) }?;
        Ok(Function(f))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module is live; its functions are only reachable through the kernel cache,
        // which is dropped together with (before) the module.
        let _ = unsafe { self.api.module_unload(self.raw) };
    }
}

/// A kernel handle from a [`Module`].
#[derive(Clone, Copy)]
pub struct Function(pub sys::hipFunction_t);
// SAFETY: function handles are process-wide and immutable.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}
