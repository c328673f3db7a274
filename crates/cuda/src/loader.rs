//! Finds the CUDA libraries before cudarc touches them.
//!
//! cudarc (dynamic loading) `dlopen`s each library by name the first time one of its functions
//! is called and panics when none of its candidate names loads. This module probes the same
//! names first, so a machine without a driver gets a [`DeviceError::Unavailable`] listing what
//! was tried instead of a panic. When the dynamic loader's search path does not find a library,
//! it also looks in the usual install folders (the toolkit, the container driver mount, pip's
//! `nvidia-*` wheels) and loads it from there by full path: the loader then matches cudarc's
//! later by-name `dlopen` against the already loaded library's soname. Loaded libraries stay
//! loaded for the life of the process.

use duet_device::DeviceError;
use duet_device::knobs::Knobs;
use libloading::Library;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Environment variable with extra folders (`:`-separated) to search first
/// ([`duet_device::knobs::Knobs::cuda_lib_dir`]).
pub use duet_device::knobs::CUDA_LIB_DIR as LIB_DIR_ENV;

/// A library duet needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CudaLib {
    Driver,
    Nvrtc,
    CublasLt,
    Cublas,
}

impl CudaLib {
    /// Everything the backend needs, in load order (cuBLAS links against cuBLASLt).
    pub const ALL: [CudaLib; 4] = [Self::Driver, Self::Nvrtc, Self::CublasLt, Self::Cublas];

    /// cudarc's base name for the library.
    fn base(self) -> &'static str {
        match self {
            Self::Driver => "cuda",
            Self::Nvrtc => "nvrtc",
            Self::CublasLt => "cublasLt",
            Self::Cublas => "cublas",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Driver => "the CUDA driver (libcuda.so.1)",
            Self::Nvrtc => "NVRTC (libnvrtc.so)",
            Self::CublasLt => "cuBLASLt (libcublasLt.so)",
            Self::Cublas => "cuBLAS (libcublas.so)",
        }
    }
}

/// Where a library was found.
#[derive(Clone, Debug)]
pub struct Found {
    pub lib: CudaLib,
    pub location: String,
}

type Outcome = Result<Found, (String, Vec<String>)>;

static LOADED: Mutex<Vec<Library>> = Mutex::new(Vec::new());
static EXTRA_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Adds a folder to search (after `DUET_CUDA_LIB_DIR`). Only affects libraries not probed yet.
pub fn add_search_dir(dir: impl Into<PathBuf>) {
    if let Ok(mut v) = EXTRA_DIRS.lock() {
        v.push(dir.into());
    }
}
static PROBES: [OnceLock<Outcome>; 4] = [
    OnceLock::new(),
    OnceLock::new(),
    OnceLock::new(),
    OnceLock::new(),
];

fn keep(lib: Library) {
    if let Ok(mut v) = LOADED.lock() {
        v.push(lib);
    } else {
        // A poisoned lock only means another probe panicked; never unload a library.
        std::mem::forget(lib);
    }
}

/// Makes sure every library in `libs` can be loaded; returns where each one was found. A
/// malformed `DUET_*` variable ([`duet_device::knobs`]) is an error here, before anything loads.
pub fn require(libs: &[CudaLib]) -> Result<Vec<Found>, DeviceError> {
    let knobs = duet_device::knobs::device_knobs()?;
    let mut found = Vec::new();
    for &lib in libs {
        let idx = CudaLib::ALL.iter().position(|&l| l == lib).unwrap_or(0);
        match PROBES[idx].get_or_init(|| probe(lib, knobs)) {
            Ok(f) => found.push(f.clone()),
            Err((reason, tried)) => {
                return Err(DeviceError::Unavailable {
                    backend: "cuda",
                    reason: reason.clone(),
                    tried: tried.clone(),
                });
            }
        }
    }
    Ok(found)
}

fn candidates(lib: CudaLib) -> Vec<String> {
    cudarc::get_lib_name_candidates(lib.base())
}

fn probe(lib: CudaLib, knobs: &Knobs) -> Outcome {
    let names = candidates(lib);
    let mut tried = Vec::new();
    // 1. The dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache, RUNPATH) — exactly what
    //    cudarc will do.
    for name in &names {
        // SAFETY: loading a vendor library runs its initialisers; these are NVIDIA's CUDA
        // libraries, which are designed to be dlopen'ed.
        if let Ok(l) = unsafe { Library::new(name) } {
            keep(l);
            return Ok(Found {
                lib,
                location: name.clone(),
            });
        }
    }
    tried.push(format!(
        "{} via the loader's search path ({})",
        names.first().map(String::as_str).unwrap_or(""),
        if std::env::var_os("LD_LIBRARY_PATH").is_some() {
            "LD_LIBRARY_PATH and ld.so.cache"
        } else {
            "ld.so.cache; LD_LIBRARY_PATH unset"
        }
    ));
    // 2. Known install folders, by full path.
    let mut errors = Vec::new();
    for dir in search_dirs(lib, knobs) {
        let mut hit = false;
        for name in &names {
            let path = dir.join(name);
            if !path.is_file() {
                continue;
            }
            hit = true;
            if lib == CudaLib::Nvrtc {
                preload_nvrtc_builtins(&dir);
            }
            // SAFETY: as above, a CUDA library loaded by its full path.
            match unsafe { Library::new(&path) } {
                Ok(l) => {
                    keep(l);
                    return Ok(Found {
                        lib,
                        location: path.display().to_string(),
                    });
                }
                Err(e) => errors.push(format!("{}: {e}", path.display())),
            }
        }
        if !hit {
            tried.push(dir.display().to_string());
        }
    }
    tried.extend(errors);
    let hint = match lib {
        CudaLib::Driver => {
            "is an NVIDIA driver installed and is this a machine with an NVIDIA GPU?"
        }
        _ => {
            "install the CUDA 13 toolkit or the matching nvidia-* pip wheel, or point DUET_CUDA_LIB_DIR / LD_LIBRARY_PATH at it"
        }
    };
    Err((
        format!("{} could not be loaded: {hint}", lib.label()),
        tried,
    ))
}

/// NVRTC `dlopen`s libnvrtc-builtins by soname while compiling; loading it by full path first
/// lets that lookup succeed when NVRTC itself was found outside the search path.
fn preload_nvrtc_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().starts_with("libnvrtc-builtins.so") {
            // SAFETY: NVIDIA's NVRTC builtins library, loaded by full path.
            if let Ok(l) = unsafe { Library::new(e.path()) } {
                keep(l);
            }
        }
    }
}

/// Folders to look in, most specific first; only existing folders are returned.
fn search_dirs(lib: CudaLib, knobs: &Knobs) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(v) = &knobs.cuda_lib_dir {
        dirs.extend(std::env::split_paths(v));
    }
    if let Ok(v) = EXTRA_DIRS.lock() {
        dirs.extend(v.iter().cloned());
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            let root = PathBuf::from(v);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
            dirs.push(root.join("targets/x86_64-linux/lib"));
        }
    }
    if lib == CudaLib::Driver {
        for d in [
            "/usr/local/nvidia/lib64",
            "/usr/local/nvidia/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib/wsl/lib",
            "/usr/local/cuda/compat",
        ] {
            dirs.push(d.into());
        }
    } else {
        for d in [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
        ] {
            dirs.push(d.into());
        }
        // pip wheels: nvidia/cu13/lib (CUDA 13) and the per-library folders of CUDA 12 wheels.
        let sub = match lib {
            CudaLib::Nvrtc => "cuda_nvrtc",
            _ => "cublas",
        };
        for site in site_packages() {
            dirs.push(site.join("nvidia/cu13/lib"));
            dirs.push(site.join("nvidia").join(sub).join("lib"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
    dirs
}

/// Python site-packages folders in the usual places (virtual environments, conda, system).
fn site_packages() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(v.into());
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".local"));
    }
    roots.push("/usr/local".into());
    roots.push("/usr".into());
    if let Ok(entries) = std::fs::read_dir("/opt") {
        for e in entries.flatten() {
            let p = e.path();
            roots.push(p.join(".venv"));
            roots.push(p.join("venv"));
            roots.push(p);
        }
    }
    let mut out = Vec::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("lib")) else {
            continue;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python3") {
                for leaf in ["site-packages", "dist-packages"] {
                    let p = e.path().join(leaf);
                    if p.is_dir() {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}
