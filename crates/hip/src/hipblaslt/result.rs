//! hipBLASLt calls with their status turned into `Result<_, HipError>`.

use super::sys::{self, HipblasLtLib};
use crate::error::HipError;
use crate::loader;

pub struct LtApi {
    pub lib: HipblasLtLib,
    pub name: String,
    /// The file the library was mapped from, when known (its name carries the full version).
    pub file: Option<std::path::PathBuf>,
    /// `hipblasLtGetVersion`, when exported (optional: only `duet info` needs it).
    pub get_version: Option<sys::GetVersionFn>,
}

/// Turns a `hipblasStatus_t` into a `Result`.
pub fn check(call: &'static str, status: sys::hipblasStatus_t) -> Result<(), HipError> {
    if status == sys::HIPBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(HipError::Lt { call, status })
    }
}

impl LtApi {
    /// Opens hipBLASLt; `Err` lists what was tried (the backend then has no FP8 GEMMs).
    pub fn load() -> Result<Self, duet_device::DeviceError> {
        let opened = loader::open(&loader::HIPBLASLT).map_err(|tried| {
            crate::error::unavailable("hipBLASLt (libhipblaslt) not found", tried)
        })?;
        // SAFETY: the declarations in `sys` match hipBLASLt 0.x/1.x (see its module docs).
        Ok(unsafe { Self::from_library(opened.lib, &opened.name) }?)
    }

    /// The API over an opened library (`name` for messages), failing with the names of any
    /// missing symbols.
    ///
    /// # Safety
    /// `lib` must export each symbol of [`HipblasLtLib`] with the signature declared there.
    pub unsafe fn from_library(lib: libloading::Library, name: &str) -> Result<Self, HipError> {
        let file = crate::toolchain::library_file(&lib, c"hipblasLtCreate");
        // SAFETY: the declared type is hipblasLtGetVersion's signature (hipblaslt.h); the
        // library is pinned for the process, so the pointer stays valid.
        let get_version = unsafe { lib.get::<sys::GetVersionFn>(b"hipblasLtGetVersion\0") }
            .ok()
            .map(|f| *f);
        // SAFETY: guaranteed by the caller.
        let lib = unsafe { HipblasLtLib::load(lib, name) }?;
        Ok(Self {
            lib,
            name: name.to_string(),
            file,
            get_version,
        })
    }
}
