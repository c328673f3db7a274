//! CUDA graphs: the ops queued between `capture_begin` and `capture_end` are recorded on the
//! device's stream (cuStreamBeginCapture, thread-local mode) and instantiated once; `replay`
//! launches the whole recording with one call. While recording, the device refuses to
//! allocate, upload, download or synchronise (each would be recorded wrongly or break the
//! capture), with a clear error.

use crate::device::CudaDevice;
use crate::error::drv;
use cudarc::driver::CudaGraph;
use cudarc::driver::sys as cu;
use duet_device::{DeviceError, Result};
use std::sync::atomic::Ordering;

/// A recorded, instantiated CUDA graph of one device.
pub struct CudaStepGraph {
    graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it do not overlap; the
// graph is only launched through `&self` of its device's `replay`, which the caller serialises
// (a `&` to the graph is only handed out together with the single device stream's order), and
// dropped by its single owner.
unsafe impl Send for CudaStepGraph {}

impl CudaDevice {
    /// An error when a graph is being recorded (`what` may not happen then).
    pub(super) fn not_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} while recording a CUDA graph: the recording may only queue device work"
            )));
        }
        Ok(())
    }

    pub(super) fn capture_begin_impl(&self) -> Result<()> {
        self.not_while_capturing("starting a second recording")?;
        self.bind()?;
        self.stream
            .begin_capture(cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("cuStreamBeginCapture"))?;
        self.capturing.store(true, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn capture_end_impl(&self) -> Result<CudaStepGraph> {
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

    pub(super) fn replay_impl(&self, g: &CudaStepGraph) -> Result<()> {
        self.not_while_capturing("replaying a graph")?;
        g.graph.launch().map_err(drv("cuGraphLaunch"))
    }
}
