//! Thin wrappers over hiprtc: each call's `hiprtcResult` becomes `Result<_, HipError>`.

use super::sys;
use crate::error::HipError;
use crate::loader;
use std::ffi::{CStr, c_char, c_int};

/// Every hiprtc function the backend calls (also bindgen's allowlist).
pub fn required_symbols() -> Vec<&'static str> {
    loader::function_list(include_str!("../../bindgen/hiprtc_functions.txt"))
}

pub struct RtcApi {
    lib: sys::HiprtcLib,
    pub name: String,
    /// The file the library was mapped from (through `dladdr`), when known: part of the
    /// kernel cache key ([`crate::toolchain`]).
    pub file: Option<std::path::PathBuf>,
}

impl RtcApi {
    /// Opens `libhiprtc` (ROCm 6/7) and checks every required symbol.
    pub fn load() -> Result<Self, duet_device::DeviceError> {
        let opened = loader::open(&loader::HIPRTC).map_err(|tried| {
            crate::error::unavailable("hiprtc (libhiprtc, ROCm 6/7) not found", tried)
        })?;
        Ok(Self::from_library(opened.lib, &opened.name)?)
    }

    pub fn from_library(lib: libloading::Library, name: &str) -> Result<Self, HipError> {
        loader::check_symbols(&lib, name, &required_symbols())?;
        let file = crate::toolchain::library_file(&lib, c"hiprtcCompileProgram");
        // SAFETY: every symbol was checked above, so no generated method can hit its `expect`.
        let lib =
            unsafe { sys::HiprtcLib::from_library(lib) }.map_err(|e| HipError::MissingSymbols {
                library: name.to_string(),
                missing: vec![e.to_string()],
            })?;
        Ok(Self {
            lib,
            name: name.to_string(),
            file,
        })
    }

    pub fn check(&self, call: &'static str, r: sys::hiprtcResult) -> Result<(), HipError> {
        if r == sys::hiprtcResult::HIPRTC_SUCCESS {
            return Ok(());
        }
        // SAFETY: returns a static NUL-terminated string for any code.
        let p = unsafe { self.lib.hiprtcGetErrorString(r) };
        let message = if p.is_null() {
            "?".into()
        } else {
            // SAFETY: non-null static string from hiprtc.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(HipError::Rtc {
            call,
            code: r.0,
            message,
        })
    }

    pub fn version(&self) -> Result<(i32, i32), HipError> {
        let (mut a, mut b) = (0, 0);
        // SAFETY: writes two ints.
        self.check("hiprtcVersion", unsafe {
            self.lib.hiprtcVersion(&mut a, &mut b)
        })?;
        Ok((a, b))
    }

    /// # Safety
    /// All pointers must be NUL-terminated strings (arrays of `n_headers` of them) live for the call.
    pub unsafe fn create(
        &self,
        src: *const c_char,
        name: *const c_char,
        n_headers: c_int,
        headers: *mut *const c_char,
        include_names: *mut *const c_char,
    ) -> Result<sys::hiprtcProgram, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: guaranteed by the caller.
        self.check("hiprtcCreateProgram", unsafe {
            self.lib
                .hiprtcCreateProgram(&mut p, src, name, n_headers, headers, include_names)
        })?;
        Ok(p)
    }

    /// Compiles; `Ok(false)` when the source failed to compile (the log says why).
    ///
    /// # Safety
    /// `p` must be a live program; `opts` `n` NUL-terminated strings live for the call.
    pub unsafe fn compile(
        &self,
        p: sys::hiprtcProgram,
        n: c_int,
        opts: *mut *const c_char,
    ) -> Result<bool, HipError> {
        // SAFETY: guaranteed by the caller.
        let r = unsafe { self.lib.hiprtcCompileProgram(p, n, opts) };
        if r == sys::hiprtcResult::HIPRTC_ERROR_COMPILATION {
            return Ok(false);
        }
        self.check("hiprtcCompileProgram", r).map(|_| true)
    }

    /// # Safety
    /// `p` must be a live program.
    pub unsafe fn log(&self, p: sys::hiprtcProgram) -> Result<String, HipError> {
        let mut n = 0usize;
        // SAFETY: guaranteed by the caller; writes one size_t.
        self.check("hiprtcGetProgramLogSize", unsafe {
            self.lib.hiprtcGetProgramLogSize(p, &mut n)
        })?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: the buffer holds the size hiprtc reported.
        self.check("hiprtcGetProgramLog", unsafe {
            self.lib.hiprtcGetProgramLog(p, buf.as_mut_ptr().cast())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// # Safety
    /// `p` must be a live, successfully compiled program.
    pub unsafe fn code(&self, p: sys::hiprtcProgram) -> Result<Vec<u8>, HipError> {
        let mut n = 0usize;
        // SAFETY: guaranteed by the caller; writes one size_t.
        self.check("hiprtcGetCodeSize", unsafe {
            self.lib.hiprtcGetCodeSize(p, &mut n)
        })?;
        let mut buf = vec![0u8; n];
        // SAFETY: the buffer holds the size hiprtc reported.
        self.check("hiprtcGetCode", unsafe {
            self.lib.hiprtcGetCode(p, buf.as_mut_ptr().cast())
        })?;
        Ok(buf)
    }

    /// # Safety
    /// `p` must be a live program, not used afterwards.
    pub unsafe fn destroy(&self, mut p: sys::hiprtcProgram) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hiprtcDestroyProgram", unsafe {
            self.lib.hiprtcDestroyProgram(&mut p)
        })
    }
}
