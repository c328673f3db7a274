//! hipBLASLt calls with their status turned into `Result<_, HipError>`.

use super::sys::{self, HipblasLtLib};
use crate::error::HipError;
use crate::loader;

pub struct LtApi {
    pub lib: HipblasLtLib,
    pub name: String,
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
        let lib = unsafe { HipblasLtLib::load(opened.lib, &opened.name) }?;
        Ok(Self {
            lib,
            name: opened.name,
        })
    }
}
