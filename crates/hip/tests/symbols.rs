//! Symbol-table checks: every symbol the backend needs must resolve when a library loads, and a
//! missing one is reported by name. Runs without an AMD GPU.

use duet_device::DeviceError;
use duet_hip::error::HipError;
use duet_hip::hip::result::{HipApi, required_symbols};
use std::path::{Path, PathBuf};
use std::process::Command;

const DEBIAN_HIP5: &str = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";

/// Whether [`DEBIAN_HIP5`] is Debian 12's ROCm 5.2 runtime (`libamdhip64-5`), which these checks
/// are about; another distribution's ROCm 5 (Ubuntu's 5.7 on the GPU machine) is not.
fn debian_rocm52() -> Result<(), String> {
    let real = std::fs::canonicalize(DEBIAN_HIP5)
        .map_err(|_| format!("{DEBIAN_HIP5} not installed (apt-get install libamdhip64-5)"))?;
    let name = real
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    if name.starts_with("libamdhip64.so.5.2") {
        Ok(())
    } else {
        Err(format!("{DEBIAN_HIP5} is {name}, not Debian 12's ROCm 5.2"))
    }
}

fn open(path: &str) -> libloading::Library {
    // SAFETY: test libraries with no initialisers of concern; only symbol lookups follow.
    unsafe { libloading::Library::new(path) }.unwrap_or_else(|e| panic!("open {path}: {e}"))
}

/// Builds a shared library exporting `names` (as no-op functions) with the C compiler.
fn fake_library(names: &[&str], tag: &str) -> Option<PathBuf> {
    let dir = std::env::temp_dir().join(format!("duet-hip-fake-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("fake.c");
    let body: String = names
        .iter()
        .map(|n| format!("int {n}(void) {{ return 0; }}\n"))
        .collect();
    std::fs::write(&src, body).ok()?;
    let lib = dir.join("libfake.so");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .ok()?
        .success();
    ok.then_some(lib)
}

#[test]
fn a_library_missing_symbols_is_rejected_naming_each_one() {
    let all = required_symbols();
    let dropped = ["hipModuleLaunchKernel", "hipMemsetD16Async"];
    let present: Vec<&str> = all
        .iter()
        .copied()
        .filter(|n| !dropped.contains(n))
        .collect();
    let Some(path) = fake_library(&present, "partial") else {
        panic!("needs a C compiler (cc) to build the fake library");
    };
    let path = path.to_string_lossy().into_owned();
    match HipApi::from_library(open(&path), &path) {
        Err(HipError::MissingSymbols {
            library,
            mut missing,
        }) => {
            missing.sort();
            assert_eq!(library, path);
            assert_eq!(missing, vec!["hipMemsetD16Async", "hipModuleLaunchKernel"]);
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a library without hipModuleLaunchKernel was accepted"),
    }
    // The same library with every symbol passes the check.
    let full = fake_library(&all, "full").expect("cc");
    let full = full.to_string_lossy().into_owned();
    assert!(HipApi::from_library(open(&full), &full).is_ok());
    // And the message a user sees names the library and the symbols.
    let e: DeviceError = HipError::MissingSymbols {
        library: path.clone(),
        missing: dropped.iter().map(|s| s.to_string()).collect(),
    }
    .into();
    let msg = e.to_string();
    assert!(
        msg.contains("hipModuleLaunchKernel") && msg.contains(&path),
        "{msg}"
    );
}

#[test]
fn rocblas_and_hipblaslt_tables_name_every_missing_symbol() {
    let libc = "libc.so.6";
    // SAFETY: nothing is called; libc lacks every rocBLAS/hipBLASLt symbol.
    let r = unsafe { duet_hip::rocblas::sys::RocblasLib::load(open(libc), libc) };
    match r {
        Err(HipError::MissingSymbols { missing, .. }) => {
            assert_eq!(
                missing.len(),
                duet_hip::rocblas::sys::RocblasLib::SYMBOLS.len()
            );
            assert!(
                missing
                    .iter()
                    .any(|m| m == "rocblas_gemm_strided_batched_ex")
            );
        }
        _ => panic!("libc accepted as rocBLAS"),
    }
    // SAFETY: as above.
    let r = unsafe { duet_hip::hipblaslt::sys::HipblasLtLib::load(open(libc), libc) };
    match r {
        Err(HipError::MissingSymbols { missing, .. }) => {
            assert!(missing.iter().any(|m| m == "hipblasLtMatmul"));
            assert!(
                missing
                    .iter()
                    .any(|m| m == "hipblasLtMatmulAlgoGetHeuristic")
            );
        }
        _ => panic!("libc accepted as hipBLASLt"),
    }
}

/// Debian 12's ROCm 5.2 runtime (rejected for real use) still exports every runtime symbol the
/// backend calls, and bundles hiprtc, so the generated tables resolve against it.
#[test]
fn debian_rocm5_runtime_exports_every_runtime_and_hiprtc_symbol() {
    if let Err(why) = debian_rocm52() {
        eprintln!("SKIP debian_rocm5_runtime_exports_every_runtime_and_hiprtc_symbol: {why}");
        return;
    }
    let lib = open(DEBIAN_HIP5);
    let missing = duet_hip::loader::missing_symbols(&lib, &required_symbols());
    assert!(
        missing.is_empty(),
        "missing from {DEBIAN_HIP5}: {missing:?}"
    );
    let rtc = duet_hip::hiprtc::result::required_symbols();
    let missing = duet_hip::loader::missing_symbols(&lib, &rtc);
    assert!(
        missing.is_empty(),
        "hiprtc symbols missing from {DEBIAN_HIP5}: {missing:?}"
    );
    assert!(HipApi::from_library(lib, DEBIAN_HIP5).is_ok());
    let lib = open(DEBIAN_HIP5);
    assert!(duet_hip::hiprtc::result::RtcApi::from_library(lib, DEBIAN_HIP5).is_ok());
}

/// Without a ROCm 6/7 GPU the device reports `Unavailable` with what it tried, never panics; a
/// ROCm 5 runtime reached through the unversioned `libamdhip64.so` is named as the reason.
#[test]
fn opening_a_device_without_rocm6_is_unavailable() {
    match duet_hip::HipDevice::new(0) {
        Ok(dev) => {
            use duet_device::Runtime;
            assert_eq!(dev.info().backend, "hip");
        }
        Err(DeviceError::Unavailable {
            backend,
            reason,
            tried,
        }) => {
            assert_eq!(backend, "hip");
            assert!(!tried.is_empty(), "{reason}");
            assert!(tried.iter().any(|t| t.contains("libamdhip64")), "{tried:?}");
            let rocm_here =
                Path::new("/opt/rocm/lib").exists() || std::env::var_os("ROCM_PATH").is_some();
            if !rocm_here && Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so").exists() {
                assert!(reason.contains("ROCm 5"), "{reason}");
            }
        }
        Err(e) => panic!("expected Unavailable, got {e}"),
    }
    assert_eq!(
        duet_hip::is_available(),
        duet_hip::probe().is_ok() || duet_hip::is_available()
    );
}
