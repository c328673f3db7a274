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
    /// The comgr the HIP libraries of this process use, never another one: the `libamd_comgr`
    /// already mapped into the process (hiprtc or the runtime loaded it; looked up with
    /// `RTLD_NOLOAD`), else the one beside the loaded libhiprtc (which hiprtc's `$ORIGIN`
    /// run path loads when it first compiles). `None` when neither exists, or the library lacks
    /// `amd_comgr_get_version`.
    ///
    /// It used to open the bare soname through the dynamic loader's search path when hiprtc had
    /// not loaded comgr yet, which maps whatever comgr the system has (another ROCm's, with its
    /// own LLVM) next to the runtime's: two LLVMs in one process abort at load ("Option
    /// 'disassemble' registered more than once", seen on the HIP-on-CUDA platform next to
    /// Ubuntu's ROCm 5.7), and the cache key named a compiler hiprtc does not use.
    pub fn load() -> Option<Self> {
        let loaded = COMGR.versions.iter().find_map(|v| {
            let name = format!("{}.so.{v}", COMGR.stem);
            // SAFETY: RTLD_NOLOAD only looks up an object already mapped (no initialisers
            // run); the handle raises its reference count, and it is pinned below.
            let lib = unsafe {
                libloading::os::unix::Library::open(
                    Some(&name),
                    libloading::os::unix::RTLD_NOW | libc_rtld_noload(),
                )
            }
            .ok()?;
            Some((name, libloading::Library::from(lib)))
        });
        let (name, lib) = match loaded {
            Some((name, lib)) => {
                // Pin it as every ROCm library is (the handle above is dropped at the end).
                loader::open_pinned(&name).ok()?;
                (name, lib)
            }
            None => {
                let beside = loader::pinned_libraries()
                    .into_iter()
                    .filter(|n| n.contains("libhiprtc"))
                    .find_map(|n| {
                        let dir = std::fs::canonicalize(&n).ok()?.parent()?.to_path_buf();
                        COMGR.versions.iter().find_map(|v| {
                            let p = dir.join(format!("{}.so.{v}", COMGR.stem));
                            p.exists().then(|| p.display().to_string())
                        })
                    })?;
                let lib = loader::open_pinned(&beside).ok()?;
                (beside, lib)
            }
        };
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
    }
}

/// glibc's `RTLD_NOLOAD` (dlfcn.h: 0x00004 on Linux).
fn libc_rtld_noload() -> std::os::raw::c_int {
    0x0004
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

    #[test]
    fn library_file_finds_the_mapped_object() {
        // libc is mapped in every test process and exports `malloc`.
        let lib = loader::open_pinned("libc.so.6").unwrap();
        let p = library_file(&lib, c"malloc").expect("dladdr");
        assert!(p.to_string_lossy().contains("libc"), "{}", p.display());
        assert!(file_identity(&p).is_some());
    }
}
