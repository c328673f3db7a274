//! roctx ranges for ROCm profiler timelines (rocprof / rocprofv3): `roctxRangePushA` and
//! `roctxRangePop`, loaded at run time from libroctx64 (ROCm 6) or the rocprofiler-sdk roctx
//! library (ROCm 7) when present (`DUET_ROCTX_LIB` names another file). Without it the ranges
//! cost nothing and do nothing.

use std::ffi::{CString, c_char, c_int};

/// Environment variable naming the roctx library to load
/// ([`duet_device::knobs::Knobs::roctx_lib`]).
pub use duet_device::knobs::ROCTX_LIB as ROCTX_LIB_ENV;

type PushFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopFn = unsafe extern "C" fn() -> c_int;

pub(crate) struct Roctx {
    push: PushFn,
    pop: PopFn,
    /// Keeps the functions above loaded.
    _lib: libloading::Library,
}

impl Roctx {
    /// The roctx library, if one loads and has both functions. (Called once the device's
    /// opening has checked the knobs, when loading the kernels, so their error is not looked at
    /// again here.)
    pub(crate) fn load() -> Option<Self> {
        let mut names: Vec<String> = duet_device::knobs::knobs()
            .ok()
            .and_then(|k| k.roctx_lib.as_ref())
            .map(|p| p.display().to_string())
            .into_iter()
            .collect();
        names.extend(
            [
                "libroctx64.so.4",
                "libroctx64.so",
                "librocprofiler-sdk-roctx.so.1",
                "librocprofiler-sdk-roctx.so",
            ]
            .map(String::from),
        );
        names.into_iter().find_map(|n| {
            // Pinned like every ROCm library (never unloaded, see `loader::open_pinned`).
            let lib = crate::loader::open_pinned(&n).ok()?;
            // SAFETY: roctx.h: int roctxRangePushA(const char*), int roctxRangePop(void).
            let (push, pop) = unsafe {
                (
                    *lib.get::<PushFn>(b"roctxRangePushA\0").ok()?,
                    *lib.get::<PopFn>(b"roctxRangePop\0").ok()?,
                )
            };
            Some(Self {
                push,
                pop,
                _lib: lib,
            })
        })
    }

    pub(crate) fn push(&self, name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: a valid NUL-terminated string that outlives the call.
            unsafe { (self.push)(c.as_ptr()) };
        }
    }

    pub(crate) fn pop(&self) {
        // SAFETY: no arguments.
        unsafe { (self.pop)() };
    }
}
