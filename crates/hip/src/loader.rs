//! Finding and opening the ROCm libraries at run time, and checking their symbol tables.
//!
//! Search order for a library `libX` with accepted sonames `libX.so.<v>` (newest first):
//! `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`, then the bare sonames through the dynamic
//! loader (`LD_LIBRARY_PATH`, ldconfig), and last the unversioned `libX.so`. Every attempt is
//! recorded so an [`duet_device::DeviceError::Unavailable`] can list what was tried. Version-5
//! files (Debian 12's `libamdhip64.so.5`, ROCm 5.2) are never opened by name; an unversioned
//! `libX.so` that resolves to ROCm 5 is rejected after loading by the runtime version check.

use libloading::Library;
use std::path::PathBuf;
use std::sync::Mutex;

/// One ROCm library: its file stem and the soname versions this backend accepts.
#[derive(Clone, Copy, Debug)]
pub struct LibSpec {
    /// e.g. `"libamdhip64"`.
    pub stem: &'static str,
    /// Accepted major versions, newest first, e.g. `["7", "6"]`.
    pub versions: &'static [&'static str],
}

pub const AMDHIP64: LibSpec = LibSpec {
    stem: "libamdhip64",
    versions: &["7", "6"],
};
pub const HIPRTC: LibSpec = LibSpec {
    stem: "libhiprtc",
    versions: &["7", "6"],
};
pub const ROCBLAS: LibSpec = LibSpec {
    stem: "librocblas",
    versions: &["5", "4"],
};
pub const HIPBLASLT: LibSpec = LibSpec {
    stem: "libhipblaslt",
    versions: &["1", "0"],
};

/// Folders searched before the dynamic loader's own path.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(v).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/lib"));
    dirs.dedup();
    dirs
}

/// Every name or path tried for `spec`, in order.
pub fn candidates(spec: &LibSpec) -> Vec<String> {
    let mut out = Vec::new();
    for dir in search_dirs() {
        for v in spec.versions {
            out.push(
                dir.join(format!("{}.so.{v}", spec.stem))
                    .display()
                    .to_string(),
            );
        }
    }
    for v in spec.versions {
        out.push(format!("{}.so.{v}", spec.stem));
    }
    out.push(format!("{}.so", spec.stem));
    out
}

/// Libraries this process has opened, each held by one extra handle that is never dropped, so
/// no ROCm library is ever unloaded (`dlclose`d to a reference count of zero) once opened.
///
/// Why: after a failed `hipInit` (no GPU, no driver) the ROCm 6.4 runtime, once unloaded, leaves
/// thread-local destructors registered that point into the unmapped library; a later
/// dlopen/dlclose elsewhere in the process then crashes at exit in `__call_tls_dtors` (SIGSEGV).
/// ROCm 7.2 does not, but the backend must not depend on the version. Keeping the libraries
/// mapped costs only their address space. A `static` is never dropped, so the handles in it are
/// never closed; the handles given to callers may be dropped freely (`dlclose` then only lowers
/// the count back to this one).
static PINNED: Mutex<Vec<(String, Library)>> = Mutex::new(Vec::new());

/// Opens `name` (a path or a soname for the dynamic loader) and pins it for the rest of the
/// process ([`PINNED`]): the returned handle may be dropped, the library stays loaded. Every
/// ROCm library the backend loads goes through here.
pub fn open_pinned(name: &str) -> Result<Library, libloading::Error> {
    // SAFETY: loading a ROCm library runs its initialisers, which have no preconditions on our
    // side; symbols taken from the handle are used only while it (or the pinned one) lives,
    // and the pinned one lives for the whole process.
    let lib = unsafe { Library::new(name) }?;
    let mut pinned = PINNED.lock().unwrap_or_else(|p| p.into_inner());
    if !pinned.iter().any(|(n, _)| n == name) {
        // SAFETY: as above; a second dlopen of an already loaded object only raises its
        // reference count (the same object, no initialisers run again).
        if let Ok(extra) = unsafe { Library::new(name) } {
            pinned.push((name.to_string(), extra));
        }
    }
    Ok(lib)
}

/// The names of every library pinned so far (in the order they were first opened).
pub fn pinned_libraries() -> Vec<String> {
    PINNED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(n, _)| n.clone())
        .collect()
}

/// A library that was opened, with the name it was opened by.
pub struct Opened {
    pub lib: Library,
    pub name: String,
}

/// Opens the first candidate that loads; on failure returns every attempt with its reason.
pub fn open(spec: &LibSpec) -> Result<Opened, Vec<String>> {
    let mut tried = Vec::new();
    for name in candidates(spec) {
        let is_path = name.starts_with('/');
        if is_path && !std::path::Path::new(&name).exists() {
            tried.push(format!("{name} (not found)"));
            continue;
        }
        match open_pinned(&name) {
            Ok(lib) => return Ok(Opened { lib, name }),
            Err(e) => tried.push(format!("{name} ({e})")),
        }
    }
    Err(tried)
}

/// Symbols of `names` that `lib` does not export.
pub fn missing_symbols(lib: &Library, names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| {
            let mut sym = n.as_bytes().to_vec();
            sym.push(0);
            // SAFETY: the symbol is only looked up, never called or dereferenced; `u8` is a
            // placeholder type for the address.
            unsafe { lib.get::<*const u8>(sym.as_slice()) }.is_err()
        })
        .map(|n| n.to_string())
        .collect()
}

/// Checks that `lib` (opened as `lib_name`) exports every symbol in `names`; the error names the
/// library and each missing symbol.
pub fn check_symbols(
    lib: &Library,
    lib_name: &str,
    names: &[&str],
) -> Result<(), crate::error::HipError> {
    let missing = missing_symbols(lib, names);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(crate::error::HipError::MissingSymbols {
            library: lib_name.to_string(),
            missing,
        })
    }
}

/// The names listed one per line in a bindgen function list (`#` starts a comment).
pub fn function_list(text: &'static str) -> Vec<&'static str> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_honour_rocm_path_and_never_name_rocm5() {
        let c = candidates(&AMDHIP64);
        assert!(c.iter().any(|n| n == "/opt/rocm/lib/libamdhip64.so.7"));
        assert!(c.iter().any(|n| n == "libamdhip64.so.6"));
        assert_eq!(c.last().map(String::as_str), Some("libamdhip64.so"));
        assert!(!c.iter().any(|n| n.ends_with(".so.5")), "{c:?}");
        let c = candidates(&HIPBLASLT);
        assert!(c.iter().any(|n| n.ends_with("libhipblaslt.so.0")));
    }

    #[test]
    fn function_list_skips_comments() {
        let l = function_list("# header\nhipInit\n  hipFree # trailing\n\n");
        assert_eq!(l, vec!["hipInit", "hipFree"]);
    }
}
