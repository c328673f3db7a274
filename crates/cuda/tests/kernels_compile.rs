//! Every kernel module compiles with NVRTC: for the GPU's own architecture when a CUDA device is
//! present, and for sm_80, sm_89 and sm_90 wherever NVRTC can be loaded (no GPU needed). Prints
//! why it skips when NVRTC is missing.

use duet_cuda::{CudaDevice, KernelModule};

/// Prints a skip notice straight to stderr, past the test harness's output capture.
macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
use duet_device::Runtime;

/// Also looks for NVRTC in the repository's `.venv-nvrtc` (made by
/// scripts/check-cuda-kernels.sh), so the compile test runs on machines without the toolkit.
fn setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let Ok(entries) = std::fs::read_dir(root.join(".venv-nvrtc/lib")) else {
            return;
        };
        for e in entries.flatten() {
            let lib = e.path().join("site-packages/nvidia/cu13/lib");
            if lib.is_dir() {
                duet_cuda::loader::add_search_dir(lib);
            }
        }
    });
}

#[test]
fn every_module_compiles_for_ampere_ada_hopper() {
    setup();
    if let Err(e) = duet_cuda::kernels::nvrtc_version() {
        skip!("SKIP every_module_compiles_for_ampere_ada_hopper: NVRTC not available: {e}");
        return;
    }
    let (major, minor) = duet_cuda::kernels::nvrtc_version().unwrap();
    eprintln!("NVRTC {major}.{minor}");
    for arch in ["sm_80", "sm_89", "sm_90"] {
        for m in KernelModule::ALL {
            let t = std::time::Instant::now();
            let cubin = duet_cuda::compile(m, arch)
                .unwrap_or_else(|e| panic!("{} for {arch}: {e}", m.file_name()));
            // An ELF image, not PTX text.
            assert_eq!(&cubin[..4], b"\x7fELF", "{} for {arch}", m.file_name());
            eprintln!(
                "  {:<18} {arch}: {:>7} bytes in {:.0} ms",
                m.file_name(),
                cubin.len(),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}

#[test]
fn every_module_loads_on_the_device() {
    setup();
    // Opening the device compiles (or loads from the cache) and loads every module for its
    // own architecture; a module that fails makes `new` fail with a Compile or Driver error.
    match CudaDevice::new(0) {
        Ok(dev) => {
            let info = dev.info();
            let kernels = info
                .details
                .iter()
                .find(|(k, _)| k == "kernels")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            eprintln!("{} {}: {kernels}", info.name, info.arch);
            assert!(kernels.starts_with(&format!("{} modules", KernelModule::ALL.len())));
        }
        Err(e @ duet_device::DeviceError::Unavailable { .. }) => {
            skip!("SKIP every_module_loads_on_the_device: no usable CUDA device: {e}");
        }
        Err(e) => panic!("the CUDA device exists but failed to open: {e}"),
    }
}

#[test]
fn a_broken_kernel_is_a_compile_error_with_the_log() {
    setup();
    // The error path itself: NVRTC must report options and log through DeviceError::Compile.
    if duet_cuda::kernels::nvrtc_version().is_err() {
        skip!("SKIP a_broken_kernel_is_a_compile_error_with_the_log: NVRTC not available");
        return;
    }
    match duet_cuda::kernels::compile_source(
        "broken.cu",
        "extern \"C\" __global__ void k() { undefined_name(); }",
        "sm_90",
    ) {
        Err(duet_device::DeviceError::Compile { module, log, .. }) => {
            assert_eq!(module, "broken.cu");
            assert!(log.contains("--gpu-architecture=sm_90"), "{log}");
            assert!(log.contains("undefined_name"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
