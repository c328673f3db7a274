//! HIP graphs (hipGraph), as crates/cuda/src/graph.rs: what a recording is made of. The ops
//! queued between `capture_begin` and `capture_end` (runtime.rs) are recorded on the device's
//! stream (hipStreamBeginCapture, thread-local mode) and instantiated once into a
//! [`HipStepGraph`]; `replay` launches the whole recording with one call. While recording, the
//! device refuses to allocate, upload, download or synchronise (each would be recorded wrongly
//! or break the capture), with a clear error. The timed events of device-event timing
//! (`time_ms` in runtime.rs) live here too: they need the same optional runtime entry points.

use crate::hip::result::{HipApi, HipGraphExec};
use duet_device::Result;
use std::sync::Arc;

/// A recorded, instantiated HIP graph of one device.
pub struct HipStepGraph {
    pub(crate) exec: HipGraphExec,
    pub(crate) api: Arc<HipApi>,
}

// SAFETY: a HIP graph exec may be used from any thread as long as calls on it do not overlap;
// it is only launched through `&self` of its device's `replay`, which the caller serialises
// (the device has one stream), and destroyed once by its single owner.
unsafe impl Send for HipStepGraph {}

impl Drop for HipStepGraph {
    fn drop(&mut self) {
        // SAFETY: the exec is live and owned here; HIP keeps a launched graph's resources until
        // its queued launches have run.
        if let Err(e) = unsafe { self.api.graph_exec_destroy(self.exec) } {
            eprintln!("warning: hipGraphExecDestroy failed: {e}");
        }
    }
}

/// Two timed events, destroyed on drop.
pub(crate) struct Events<'a> {
    api: &'a HipApi,
    pub(crate) start: crate::hip::result::HipEvent,
    pub(crate) end: crate::hip::result::HipEvent,
}

impl<'a> Events<'a> {
    pub(crate) fn new(api: &'a HipApi) -> Result<Self> {
        let start = api.timed_event_create()?;
        let end = match api.timed_event_create() {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: `start` is live and not used again.
                let _ = unsafe { api.event_destroy(start) };
                return Err(e.into());
            }
        };
        Ok(Self { api, start, end })
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        // SAFETY: both events are live, owned here, and not used again; a pending record
        // completes before HIP releases an event.
        unsafe {
            let _ = self.api.event_destroy(self.start);
            let _ = self.api.event_destroy(self.end);
        }
    }
}
