//! What, besides the source and the options, decides the code object hiprtc produces: the
//! identity of the compiler that ran. It keys the kernel cache ([`crate::kernels`]).
//!
//! `hiprtcVersion` cannot serve: ROCm hard-codes it (6.4.3 and 7.2.4 both answer 9.0) while
//! their code objects differ. The fingerprint is made of
//! - the HIP runtime version (`hipRuntimeGetVersion`, major·10⁷ + minor·10⁵ + build: it changes
//!   with every ROCm release, patch releases included);
//! - the hiprtc library file that was opened: resolved real path, size and modification time
//!   (a rebuilt or patched hiprtc of the same version is a different file);
//! - comgr, which does the actual compiling (hiprtc is a front end over it): its interface
//!   version (`amd_comgr_get_version`, from `libamd_comgr.so.3` (ROCm 7) or `.so.2` (ROCm 6),
//!   loaded optionally) and the same file identity of the library. The interface version alone
//!   is too coarse (it moves only with API changes, not with the LLVM inside), which is why
//!   the file identity is there too. When comgr cannot be opened the fingerprint says so
//!   and the runtime version plus the hiprtc file still separate ROCm installs.
//!
//! Every part errs towards a spurious recompile (a reinstall of identical files changes the
//! modification times), never towards reusing a stale code object; a cached object that still
//! fails to load is deleted and rebuilt once ([`crate::kernels::load_module`]).

use crate::loader;
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

/// comgr sonames, newest first (ROCm 7: `.so.3`, ROCm 6: `.so.2`).
pub const COMGR: loader::LibSpec = loader::LibSpec {
    stem: "libamd_comgr",
    versions: &["3", "2"],
};

/// `void amd_comgr_get_version(size_t* major, size_t* minor)` (amd_comgr.h, since comgr 1.x).
type ComgrVersionFn = unsafe extern "C" fn(*mut usize, *mut usize);

/// `realpath:size:mtime` of a file, or `None` when it cannot be read. The modification time is
/// in nanoseconds since the epoch where the file system keeps it.
pub fn file_identity(path: &Path) -> Option<String> {
    let real = std::fs::canonicalize(path).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    Some(format!("{}:{}:{mtime}", real.display(), meta.len()))
}

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

unsafe extern "C" {
    /// glibc's `int dladdr(const void* addr, Dl_info* info)` (libc, or libdl before glibc 2.34,
    /// which libloading links).
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
}

/// The file the dynamic loader mapped `lib` from, found through the address of `symbol` (which
/// `lib` must export), or `None`. Works for libraries opened by a bare soname too.
pub fn library_file(lib: &Library, symbol: &CStr) -> Option<PathBuf> {
    // SAFETY: the symbol is only looked up for its address, never called or dereferenced.
    let sym = unsafe { lib.get::<*const c_void>(symbol.to_bytes_with_nul()) }.ok()?;
    let addr: *const c_void = *sym;
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: `addr` is inside a mapped library (just resolved, and the library is pinned);
    // `info` is a writable Dl_info; dladdr only fills it.
    let ok = unsafe { dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success dli_fname points to the loader's NUL-terminated path of the object,
    // valid while it stays loaded (forever: pinned).
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// The comgr library, when one can be opened: its interface version and file identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comgr {
    pub version: (usize, usize),
    /// [`file_identity`] of the library, or its name when the file cannot be found.
    pub file: String,
    /// The library's file (or name), for messages.
    pub path: String,
}

impl Comgr {
    /// Opens comgr (pinned, like every ROCm library): the bare sonames first, so the object
    /// hiprtc already loaded is the one found, then the ROCm folders. `None` when none opens or
    /// it lacks `amd_comgr_get_version`.
    pub fn load() -> Option<Self> {
        let mut names: Vec<String> = COMGR
            .versions
            .iter()
            .map(|v| format!("{}.so.{v}", COMGR.stem))
            .collect();
        names.extend(
            loader::candidates(&COMGR)
                .into_iter()
                .filter(|n| n.starts_with('/')),
        );
        names.into_iter().find_map(|name| {
            if name.starts_with('/') && !Path::new(&name).exists() {
                return None;
            }
            let lib = loader::open_pinned(&name).ok()?;
            // SAFETY: amd_comgr.h declares `void amd_comgr_get_version(size_t*, size_t*)`; the
            // library is pinned, so the pointer stays valid.
            let f = unsafe { *lib.get::<ComgrVersionFn>(b"amd_comgr_get_version\0").ok()? };
            let (mut major, mut minor) = (0usize, 0usize);
            // SAFETY: writes two size_t.
            unsafe { f(&mut major, &mut minor) };
            let found = library_file(&lib, c"amd_comgr_get_version");
            let path = found
                .as_ref()
                .and_then(|p| std::fs::canonicalize(p).ok())
                .map_or(name.clone(), |p| p.display().to_string());
            let file = found.and_then(|p| file_identity(&p)).unwrap_or(name);
            Some(Self {
                version: (major, minor),
                file,
                path,
            })
        })
    }
}

/// The compiler's identity as it enters the kernel cache key (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolchain {
    /// `hipRuntimeGetVersion`.
    pub runtime: i32,
    /// [`file_identity`] of the hiprtc library (or its name when the file is not found).
    pub hiprtc: String,
    pub comgr: Option<Comgr>,
}

impl Toolchain {
    /// The text hashed into the cache key.
    pub fn fingerprint(&self) -> String {
        let comgr = self
            .comgr
            .as_ref()
            .map_or("comgr=unavailable".to_string(), |c| {
                format!("comgr={}.{}@{}", c.version.0, c.version.1, c.file)
            });
        format!(
            "hip-runtime={};hiprtc={};{comgr}",
            self.runtime, self.hiprtc
        )
    }

    /// A short description for `duet info` (comgr's version, or why there is none).
    pub fn comgr_summary(&self) -> String {
        self.comgr.as_ref().map_or_else(
            || "not found (kernel cache keyed on the runtime and hiprtc files)".into(),
            |c| format!("{}.{} ({})", c.version.0, c.version.1, c.path),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolchain(runtime: i32, hiprtc: &str, comgr: Option<(usize, usize, &str)>) -> Toolchain {
        Toolchain {
            runtime,
            hiprtc: hiprtc.into(),
            comgr: comgr.map(|(a, b, f)| Comgr {
                version: (a, b),
                file: f.into(),
                path: f.into(),
            }),
        }
    }

    #[test]
    fn fingerprints_separate_runtime_hiprtc_and_comgr() {
        let base = toolchain(
            60_443_483,
            "/opt/rocm/lib/libhiprtc.so.6.4:1:2",
            Some((2, 9, "c")),
        );
        let fp = base.fingerprint();
        assert!(
            fp.contains("60443483") && fp.contains("comgr=2.9@c"),
            "{fp}"
        );
        for other in [
            toolchain(
                70_224_004,
                "/opt/rocm/lib/libhiprtc.so.6.4:1:2",
                Some((2, 9, "c")),
            ),
            toolchain(
                60_443_483,
                "/opt/rocm/lib/libhiprtc.so.6.4:1:3",
                Some((2, 9, "c")),
            ),
            toolchain(
                60_443_483,
                "/opt/rocm/lib/libhiprtc.so.6.4:1:2",
                Some((3, 0, "c")),
            ),
            toolchain(
                60_443_483,
                "/opt/rocm/lib/libhiprtc.so.6.4:1:2",
                Some((2, 9, "d")),
            ),
            toolchain(60_443_483, "/opt/rocm/lib/libhiprtc.so.6.4:1:2", None),
        ] {
            assert_ne!(fp, other.fingerprint(), "{other:?}");
        }
        assert_eq!(fp, base.clone().fingerprint());
    }

    #[test]
    fn file_identity_follows_content_and_links() {
        let dir = std::env::temp_dir().join(format!("duet-hip-ident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("libx.so.1.2.3");
        std::fs::write(&f, b"one").unwrap();
        let a = file_identity(&f).unwrap();
        assert!(a.contains("libx.so.1.2.3:3:"), "{a}");
        let link = dir.join("libx.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert_eq!(
            file_identity(&link).unwrap(),
            a,
            "a soname link names its target"
        );
        std::fs::write(&f, b"longer").unwrap();
        assert_ne!(file_identity(&f).unwrap(), a);
        assert_eq!(file_identity(&dir.join("missing")), None);
    }

    /// Debian 12's comgr (ROCm 5.2, `libamd-comgr2`) answers its interface version, when it is
    /// installed; a machine without it gets `None`, never a panic.
    #[test]
    fn comgr_reports_its_version_when_installed() {
        match Comgr::load() {
            Some(c) => {
                assert!(c.version.0 >= 2, "{c:?}");
                assert!(c.file.contains("libamd_comgr"), "{c:?}");
                assert!(c.file.starts_with(&c.path), "{c:?}");
                eprintln!("comgr {}.{} at {}", c.version.0, c.version.1, c.file);
            }
            None => eprintln!("skipped: no libamd_comgr.so.2/.3 on this machine"),
        }
    }

    #[test]
    fn library_file_finds_the_mapped_object() {
        // libc is mapped in every test process and exports `malloc`.
        let lib = loader::open_pinned("libc.so.6").unwrap();
        let p = library_file(&lib, c"malloc").expect("dladdr");
        assert!(p.to_string_lossy().contains("libc"), "{}", p.display());
        assert!(file_identity(&p).is_some());
    }
}
