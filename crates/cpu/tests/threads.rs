//! The CPU device driven from several threads at once (issue 49's bodies,
//! `duet_conformance::threads`, shared with the CUDA and HIP backends). The CPU records no
//! graphs, so the recording test prints its SKIP line here.

fn open() -> Result<duet_cpu::CpuDevice, String> {
    duet_cpu::CpuDevice::new(None).map_err(|e| e.to_string())
}

#[test]
fn cross_entropy_from_many_threads() {
    duet_conformance::threads::cross_entropy_from_many_threads(open);
}

#[test]
fn recording_while_other_threads_open_load_and_launch() {
    duet_conformance::threads::recording_while_other_threads_open_load_and_launch(open);
}
