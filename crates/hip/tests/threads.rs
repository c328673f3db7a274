//! One HIP device driven from several threads at once (issue 49): the bodies are
//! `duet_conformance::threads`, shared with crates/cuda/tests/threads.rs; on an NVIDIA GPU
//! `scripts/hip-nvidia.sh standins run A` runs them through the HIP-on-CUDA platform. Without a
//! usable HIP device every test prints `SKIP <test>: <reason>`.

fn open() -> Result<duet_hip::HipDevice, String> {
    duet_hip::HipDevice::new(0).map_err(|e| e.to_string())
}

#[test]
fn cross_entropy_from_many_threads() {
    duet_conformance::threads::cross_entropy_from_many_threads(open);
}

#[test]
fn recording_while_other_threads_open_load_and_launch() {
    duet_conformance::threads::recording_while_other_threads_open_load_and_launch(open);
}
