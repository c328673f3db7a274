//! Host-side behaviour of the HIP backend that needs no AMD GPU (issue 27): rocBLAS atomics are
//! forbidden on every handle, checked against fake rocBLAS libraries built by the C compiler.

use duet_hip::error::HipError;
use duet_hip::rocblas::result::RocblasApi;
use duet_hip::rocblas::sys::RocblasLib;
use std::path::PathBuf;
use std::process::Command;

/// Builds a shared library from `body` plus a no-op `int f(void)` for every name of `stubs`
/// not defined in `body`.
fn fake_library(tag: &str, body: &str, stubs: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-hip-host-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut src = String::from("#include <stddef.h>\n");
    src.push_str(body);
    for n in stubs {
        if !body.contains(&format!(" {n}(")) {
            src.push_str(&format!("int {n}(void) {{ return 0; }}\n"));
        }
    }
    let path = dir.join("fake.c");
    std::fs::write(&path, src).expect("write source");
    let lib = dir.join(format!("libfake{tag}.so"));
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&path)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "needs a C compiler (cc) to build the fake library");
    lib
}

fn rocblas(tag: &str, body: &str) -> RocblasApi {
    let path = fake_library(tag, body, RocblasLib::SYMBOLS);
    let name = path.to_string_lossy().into_owned();
    let lib = duet_hip::loader::open_pinned(&name).expect("open fake rocBLAS");
    // SAFETY: the fake defines the functions that are called with rocBLAS's signatures; the
    // stubs are never called.
    unsafe { RocblasApi::from_library(lib, &name) }.expect("every symbol present")
}

const MODE_STORE: &str = r#"
static unsigned mode = 1; /* rocBLAS 4.x default: rocblas_atomics_allowed */
unsigned rocblas_set_atomics_mode(void* h, unsigned m) { (void)h; mode = m; return 0; }
unsigned rocblas_get_atomics_mode(void* h, unsigned* m) { (void)h; *m = mode; return 0; }
unsigned fake_mode(void) { return mode; }
unsigned rocblas_get_version_string_size(size_t* n) { *n = 14; return 0; }
unsigned rocblas_get_version_string(char* b, size_t n) {
    const char* v = "4.4.0.f9b6d1a";
    for (size_t i = 0; i < n && i < 14; i++) b[i] = v[i];
    return n < 14 ? 11 : 0;
}
"#;

#[test]
fn rocblas_atomics_are_forbidden_and_read_back() {
    let api = rocblas("atomics-ok", MODE_STORE);
    // SAFETY: the fake ignores the handle.
    unsafe { api.forbid_atomics(std::ptr::null_mut()) }.expect("forbid atomics");
    let name = api.name.clone();
    let lib = duet_hip::loader::open_pinned(&name).expect("reopen");
    // SAFETY: `unsigned fake_mode(void)` from the fake above.
    let mode = unsafe {
        (*lib
            .get::<unsafe extern "C" fn() -> u32>(b"fake_mode\0")
            .expect("sym"))()
    };
    assert_eq!(mode, duet_hip::rocblas::sys::rocblas_atomics_not_allowed);
    assert_eq!(duet_hip::rocblas::sys::rocblas_atomics_not_allowed, 0);
    assert_eq!(api.version().expect("version"), "4.4.0.f9b6d1a");
}

#[test]
fn a_failing_atomics_call_is_a_clear_error() {
    let api = rocblas(
        "atomics-fail",
        r#"
unsigned rocblas_set_atomics_mode(void* h, unsigned m) { (void)h; (void)m; return 2; }
"#,
    );
    // SAFETY: the fake ignores the handle.
    match unsafe { api.forbid_atomics(std::ptr::null_mut()) } {
        Err(e @ HipError::Rocblas { call, status: 2 }) => {
            assert_eq!(call, "rocblas_set_atomics_mode");
            assert!(e.to_string().contains("not_implemented"), "{e}");
        }
        other => panic!("expected a rocblas_set_atomics_mode error, got {other:?}"),
    }
    // A library that accepts the call but keeps atomics on is refused too.
    let api = rocblas(
        "atomics-ignored",
        r#"
unsigned rocblas_set_atomics_mode(void* h, unsigned m) { (void)h; (void)m; return 0; }
unsigned rocblas_get_atomics_mode(void* h, unsigned* m) { (void)h; *m = 1; return 0; }
"#,
    );
    // SAFETY: the fake ignores the handle.
    let e = unsafe { api.forbid_atomics(std::ptr::null_mut()) }.expect_err("mode did not stick");
    assert!(e.to_string().contains("atomics_allowed"), "{e}");
}

/// The hand-declared runtime functions of the upload staging (`HOST_SYMBOLS`) exist in a real
/// HIP runtime: Debian 12's ROCm 5.2 one, when installed (the names are unchanged in 6.x/7.x).
#[test]
fn the_hand_declared_runtime_symbols_exist_in_a_real_runtime() {
    let path = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";
    let Ok(real) = std::fs::canonicalize(path) else {
        eprintln!(
            "SKIP the_hand_declared_runtime_symbols_exist_in_a_real_runtime: {path} not installed (apt-get install libamdhip64-5)"
        );
        return;
    };
    if !real.to_string_lossy().contains("libamdhip64.so.5.2") {
        // Another distribution's ROCm 5 (Ubuntu's 5.7 on the GPU machine): not what this checks.
        eprintln!(
            "SKIP the_hand_declared_runtime_symbols_exist_in_a_real_runtime: {path} is {}, not Debian 12's ROCm 5.2",
            real.display()
        );
        return;
    }
    let lib = duet_hip::loader::open_pinned(path).expect("open the ROCm 5.2 runtime");
    let missing = duet_hip::loader::missing_symbols(&lib, &duet_hip::hip::result::HOST_SYMBOLS);
    assert!(missing.is_empty(), "missing from {path}: {missing:?}");
    let file = duet_hip::toolchain::library_file(&lib, c"hipInit").expect("dladdr");
    let ident = duet_hip::toolchain::file_identity(&file).expect("identity");
    assert!(ident.contains("libamdhip64.so.5.2"), "{ident}");
}
