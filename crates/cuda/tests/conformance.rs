//! The conformance suite (crates/conformance) on the CUDA backend, checked against the CPU
//! backend: every op, every dtype of every recipe, odd shapes, every fused path against its
//! plain composition. Without a usable CUDA device every case prints `SKIP <case>: ...`.

duet_conformance::conformance_suite!(duet_cuda::CudaDevice, || {
    duet_cuda::CudaDevice::new(0).map_err(|e| e.to_string())
});
