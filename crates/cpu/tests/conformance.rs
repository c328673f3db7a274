//! The conformance suite (crates/conformance) on the CPU backend, checked against the f64
//! reference: every op, every dtype of every recipe, odd shapes, every fused path against its
//! plain composition.

duet_conformance::conformance_suite!(duet_cpu::CpuDevice, || {
    duet_cpu::CpuDevice::new(Some(2)).map_err(|e| e.to_string())
});
