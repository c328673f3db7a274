//! NVTX ranges for profiler timelines (Nsight Systems / Nsight Compute): `nvtxRangePushA` and
//! `nvtxRangePop` from libnvToolsExt, loaded at run time when present (CUDA toolkits up to 12,
//! the `nvidia-nvtx` Python wheels; `DUET_NVTX_LIB` names another file). Without it the
//! ranges cost nothing and do nothing.

use std::ffi::{CString, c_char, c_int};

/// Environment variable naming the NVTX library to load
/// ([`duet_device::knobs::Knobs::nvtx_lib`]).
pub use duet_device::knobs::NVTX_LIB as NVTX_LIB_ENV;

type PushFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopFn = unsafe extern "C" fn() -> c_int;

pub(crate) struct Nvtx {
    push: PushFn,
    pop: PopFn,
    /// Keeps the functions above loaded.
    _lib: libloading::Library,
}

impl Nvtx {
    /// The NVTX library, if one loads and has both functions. (Called once the device's opening
    /// has checked the knobs, so their error is not looked at again here.)
    pub(crate) fn load() -> Option<Self> {
        let mut names: Vec<String> = duet_device::knobs::knobs()
            .ok()
            .and_then(|k| k.nvtx_lib.as_ref())
            .map(|p| p.display().to_string())
            .into_iter()
            .collect();
        names.extend(["libnvToolsExt.so.1".into(), "libnvToolsExt.so".into()]);
        names.into_iter().find_map(|n| {
            // SAFETY: loading a shared library runs its initialisers; libnvToolsExt's only set
            // up NVTX's injection hooks.
            let lib = unsafe { libloading::Library::new(&n) }.ok()?;
            // SAFETY: the symbols have these C signatures in every NVTX version
            // (nvToolsExt.h: int nvtxRangePushA(const char*), int nvtxRangePop(void)).
            let (push, pop) = unsafe {
                (
                    *lib.get::<PushFn>(b"nvtxRangePushA\0").ok()?,
                    *lib.get::<PopFn>(b"nvtxRangePop\0").ok()?,
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
            // SAFETY: a valid NUL-terminated string that outlives the call (NVTX copies it).
            unsafe { (self.push)(c.as_ptr()) };
        }
    }

    pub(crate) fn pop(&self) {
        // SAFETY: no arguments; popping an empty stack is reported by NVTX, not undefined.
        unsafe { (self.pop)() };
    }
}
