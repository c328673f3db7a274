//! CUDA graphs: the ops queued between `capture_begin` and `capture_end` are recorded on the
//! device's stream (cuStreamBeginCapture, thread-local mode) and instantiated once; `replay`
//! launches the whole recording with one call. While recording, the device refuses to
//! allocate, upload, download or synchronise (each would be recorded wrongly or break the
//! capture), with a clear error. The capture and replay themselves are
//! [`duet_device::Runtime`] methods (runtime.rs).

use cudarc::driver::CudaGraph;

/// A recorded, instantiated CUDA graph of one device.
pub struct CudaStepGraph {
    pub(crate) graph: CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it do not overlap; the
// graph is only launched through `&self` of its device's `replay`, which the caller serialises
// (a `&` to the graph is only handed out together with the single device stream's order), and
// dropped by its single owner.
unsafe impl Send for CudaStepGraph {}
