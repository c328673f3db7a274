//! A hiprtc program that is destroyed in `Drop`, and the one-call compile built on it.

use super::result::RtcApi;
use super::sys;
use crate::error::HipError;
use std::ffi::{CString, c_char};

/// Why a compile produced no code object.
pub enum CompileFailure {
    /// The source did not compile; the compiler's log.
    Source(String),
    /// hiprtc itself failed.
    Api(HipError),
}

impl From<HipError> for CompileFailure {
    fn from(e: HipError) -> Self {
        CompileFailure::Api(e)
    }
}

struct Program<'a> {
    api: &'a RtcApi,
    raw: sys::hiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: the program is live and owned by this guard.
        let _ = unsafe { self.api.destroy(self.raw) };
    }
}

fn cstring(s: &str) -> Result<CString, HipError> {
    CString::new(s).map_err(|_| HipError::Rtc {
        call: "hiprtcCreateProgram",
        code: 3,
        message: format!("string contains a NUL byte: {s:?}"),
    })
}

/// Compiles `source` (named `name`) with in-memory `headers` (include name, text) and
/// `options`; returns the code object (an AMDGPU ELF for `hipModuleLoadData`).
pub fn compile(
    api: &RtcApi,
    name: &str,
    source: &str,
    headers: &[(&str, &str)],
    options: &[String],
) -> Result<Vec<u8>, CompileFailure> {
    let src = cstring(source)?;
    let cname = cstring(name)?;
    let texts = headers
        .iter()
        .map(|(_, t)| cstring(t))
        .collect::<Result<Vec<_>, _>>()?;
    let names = headers
        .iter()
        .map(|(n, _)| cstring(n))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = options
        .iter()
        .map(|o| cstring(o))
        .collect::<Result<Vec<_>, _>>()?;
    let mut text_ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
    let mut name_ptrs: Vec<*const c_char> = names.iter().map(|c| c.as_ptr()).collect();
    let mut opt_ptrs: Vec<*const c_char> = opts.iter().map(|c| c.as_ptr()).collect();
    // SAFETY: every pointer refers to a CString above, alive until the end of this function.
    let raw = unsafe {
        api.create(
            src.as_ptr(),
            cname.as_ptr(),
            text_ptrs.len() as i32,
            text_ptrs.as_mut_ptr(),
            name_ptrs.as_mut_ptr(),
        )
    }?;
    let prog = Program { api, raw };
    // SAFETY: live program; options as above.
    let ok = unsafe { api.compile(prog.raw, opt_ptrs.len() as i32, opt_ptrs.as_mut_ptr()) }?;
    if !ok {
        // SAFETY: live program.
        let log = unsafe { api.log(prog.raw) }.unwrap_or_else(|e| e.to_string());
        return Err(CompileFailure::Source(log));
    }
    // SAFETY: live, compiled program.
    Ok(unsafe { api.code(prog.raw) }?)
}
