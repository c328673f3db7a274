//! The conformance suite (crates/conformance) on the HIP backend, checked against the CPU
//! backend: the same cases as every other backend. Without a usable ROCm device every case
//! prints `SKIP <case>: ...`.

duet_conformance::conformance_suite!(duet_hip::HipDevice, || {
    duet_hip::HipDevice::new(0).map_err(|e| e.to_string())
});
