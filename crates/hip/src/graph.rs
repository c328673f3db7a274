//! HIP graphs (hipGraph), as crates/cuda/src/graph.rs: the ops queued between `capture_begin`
//! and `capture_end` are recorded on the device's stream (hipStreamBeginCapture, thread-local
//! mode) and instantiated once; `replay` launches the whole recording with one call. While
//! recording, the device refuses to allocate, upload, download or synchronise (each would be
//! recorded wrongly or break the capture), with a clear error. Device-event timing
//! ([`HipDevice::time_ms_impl`]) lives here too: it needs the same optional runtime entry points.

use crate::device::HipDevice;
use crate::hip::result::{HipApi, HipGraphExec};
use duet_device::{DeviceError, Result};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// A recorded, instantiated HIP graph of one device.
pub struct HipStepGraph {
    exec: HipGraphExec,
    api: Arc<HipApi>,
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

impl HipDevice {
    /// An error when a graph is being recorded (`what` may not happen then).
    pub(crate) fn not_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} while recording a HIP graph: the recording may only queue device work"
            )));
        }
        Ok(())
    }

    pub(crate) fn capture_begin_impl(&self) -> Result<()> {
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

    pub(crate) fn capture_end_impl(&self) -> Result<HipStepGraph> {
        if !self.capturing.swap(false, Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(
                "capture_end without capture_begin".into(),
            ));
        }
        // SAFETY: the stream is capturing (the flag was set by capture_begin_impl).
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

    pub(crate) fn replay_impl(&self, g: &HipStepGraph) -> Result<()> {
        self.not_while_capturing("replaying a graph")?;
        // SAFETY: the exec is live (owned by `g`) and was recorded on this device's stream from
        // buffers the caller keeps alive while it replays (Device::replay's contract).
        unsafe { self.api.graph_launch(g.exec, self.stream.raw()) }?;
        Ok(())
    }

    /// [`duet_device::Device::time_ms`] between two timed events on the device's stream.
    pub(crate) fn time_ms_impl<E: From<DeviceError>>(
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
        self.synchronize_impl()?;
        Ok(ms as f64)
    }

    /// What `time_ms` measures with.
    pub(crate) fn timer_kind_impl(&self) -> &'static str {
        if self.api.graphs_supported() {
            "device events"
        } else {
            "host clock"
        }
    }
}

/// Two timed events, destroyed on drop.
struct Events<'a> {
    api: &'a HipApi,
    start: crate::hip::result::HipEvent,
    end: crate::hip::result::HipEvent,
}

impl<'a> Events<'a> {
    fn new(api: &'a HipApi) -> Result<Self> {
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
