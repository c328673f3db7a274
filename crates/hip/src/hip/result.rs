//! Thin wrappers over the HIP runtime calls: each turns its `hipError_t` into
//! `Result<_, HipError>`. Calls that take raw device pointers are `unsafe fn`s.

use super::sys;
use crate::error::HipError;
use crate::loader;
use std::ffi::{CStr, c_char, c_int, c_void};

/// Every HIP runtime function the backend calls (also bindgen's allowlist).
pub fn required_symbols() -> Vec<&'static str> {
    loader::function_list(include_str!("../../bindgen/hip_functions.txt"))
}

/// `hipGetDeviceProperties*` take a struct whose layout changed between ROCm 5 and 6; the backend
/// passes an over-sized zeroed byte buffer instead and reads `gcnArchName` at its known offset.
type PropsFn = unsafe extern "C" fn(*mut c_void, c_int) -> sys::hipError_t;
/// `hipDeviceProp_tR0600` is 1472 bytes; the buffer leaves room for growth.
const PROPS_BUF: usize = 4096;
/// Offset of `char gcnArchName[256]` in `hipDeviceProp_tR0600` (ROCm 6/7) and in the
/// pre-6.0 layout that the unsuffixed `hipGetDeviceProperties` still fills.
const ARCH_OFFSET_R0600: usize = 1160;
const ARCH_OFFSET_R0000: usize = 396;

/// Runtime functions declared by hand (not in the bindgen allowlist, which the CI owns): the
/// pinned host memory and the events of the upload staging ring ([`crate::memory::Staging`]).
/// Signatures from HIP `hip_runtime_api.h`, unchanged 5.2 → 6.x → 7.x; `hipEvent_t` is an
/// opaque pointer, `hipHostMallocDefault` = 0, `hipEventDisableTiming` = 2.
#[derive(Clone, Copy)]
pub struct HostFns {
    host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> sys::hipError_t,
    host_free: unsafe extern "C" fn(*mut c_void) -> sys::hipError_t,
    event_create: unsafe extern "C" fn(*mut HipEvent, u32) -> sys::hipError_t,
    event_record: unsafe extern "C" fn(HipEvent, sys::hipStream_t) -> sys::hipError_t,
    event_synchronize: unsafe extern "C" fn(HipEvent) -> sys::hipError_t,
    event_destroy: unsafe extern "C" fn(HipEvent) -> sys::hipError_t,
}

/// `hipEvent_t`.
pub type HipEvent = *mut c_void;

/// The hand-declared runtime symbols ([`HostFns`]), for the loader's check and the CI's list.
pub const HOST_SYMBOLS: [&str; 6] = [
    "hipHostMalloc",
    "hipHostFree",
    "hipEventCreateWithFlags",
    "hipEventRecord",
    "hipEventSynchronize",
    "hipEventDestroy",
];

impl HostFns {
    /// Resolves every [`HOST_SYMBOLS`] function from `lib`, or `None` when one is missing.
    fn resolve(lib: &libloading::Library) -> Option<Self> {
        macro_rules! get {
            ($name:literal) => {
                // SAFETY: the declared type is the function's signature in hip_runtime_api.h;
                // the pointer is only called while the library is loaded (it is pinned for
                // the process, `loader::open_pinned`, and also held by `HipLib`).
                unsafe { *lib.get(concat!($name, "\0").as_bytes()).ok()? }
            };
        }
        Some(Self {
            host_malloc: get!("hipHostMalloc"),
            host_free: get!("hipHostFree"),
            event_create: get!("hipEventCreateWithFlags"),
            event_record: get!("hipEventRecord"),
            event_synchronize: get!("hipEventSynchronize"),
            event_destroy: get!("hipEventDestroy"),
        })
    }
}

/// Stream capture and graph launch, and timed events: declared by hand like [`HostFns`]
/// (signatures from HIP `hip_runtime_api.h`, unchanged 5.3 → 6.x → 7.x; `hipGraph_t` and
/// `hipGraphExec_t` are opaque pointers, the capture mode an `int`-sized enum). Optional: a
/// runtime without one of them records no graphs ([`HipApi::graphs_supported`]).
#[derive(Clone, Copy)]
pub struct GraphFns {
    begin_capture: unsafe extern "C" fn(sys::hipStream_t, u32) -> sys::hipError_t,
    end_capture: unsafe extern "C" fn(sys::hipStream_t, *mut HipGraph) -> sys::hipError_t,
    instantiate: unsafe extern "C" fn(*mut HipGraphExec, HipGraph, u64) -> sys::hipError_t,
    launch: unsafe extern "C" fn(HipGraphExec, sys::hipStream_t) -> sys::hipError_t,
    exec_destroy: unsafe extern "C" fn(HipGraphExec) -> sys::hipError_t,
    destroy: unsafe extern "C" fn(HipGraph) -> sys::hipError_t,
    elapsed: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> sys::hipError_t,
}

/// `hipGraph_t`.
pub type HipGraph = *mut c_void;
/// `hipGraphExec_t`.
pub type HipGraphExec = *mut c_void;

/// `hipStreamCaptureModeThreadLocal`: only this thread's calls may not interfere with the
/// capture (another thread's work on other streams is unaffected).
const HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL: u32 = 1;
/// `hipEventDefault`: an event that records time.
const HIP_EVENT_DEFAULT: u32 = 0;

/// The hand-declared graph and timing symbols ([`GraphFns`]), for the CI's lists.
pub const GRAPH_SYMBOLS: [&str; 7] = [
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipGraphInstantiateWithFlags",
    "hipGraphLaunch",
    "hipGraphExecDestroy",
    "hipGraphDestroy",
    "hipEventElapsedTime",
];

impl GraphFns {
    /// Resolves every [`GRAPH_SYMBOLS`] function from `lib`, or `None` when one is missing.
    fn resolve(lib: &libloading::Library) -> Option<Self> {
        macro_rules! get {
            ($name:literal) => {
                // SAFETY: the declared type is the function's signature in hip_runtime_api.h;
                // the pointer is only called while the library is loaded (pinned for the
                // process, `loader::open_pinned`, and also held by `HipLib`).
                unsafe { *lib.get(concat!($name, "\0").as_bytes()).ok()? }
            };
        }
        Some(Self {
            begin_capture: get!("hipStreamBeginCapture"),
            end_capture: get!("hipStreamEndCapture"),
            instantiate: get!("hipGraphInstantiateWithFlags"),
            launch: get!("hipGraphLaunch"),
            exec_destroy: get!("hipGraphExecDestroy"),
            destroy: get!("hipGraphDestroy"),
            elapsed: get!("hipEventElapsedTime"),
        })
    }
}

/// The loaded runtime.
pub struct HipApi {
    lib: sys::HipLib,
    props_r0600: Option<PropsFn>,
    props_r0000: Option<PropsFn>,
    /// `None` when the library lacks one of [`HOST_SYMBOLS`] (only a library opened through
    /// [`HipApi::from_library`] can; [`HipApi::load`] refuses it).
    host: Option<HostFns>,
    /// `None` when the library lacks one of [`GRAPH_SYMBOLS`].
    graph: Option<GraphFns>,
    /// The name the library was opened by.
    pub name: String,
    /// The file the library was mapped from (through `dladdr`), when known.
    pub file: Option<std::path::PathBuf>,
}

impl HipApi {
    /// Opens `libamdhip64` (ROCm 6/7), checks every required symbol, and resolves the device
    /// property entry points. Rejects a ROCm 5 runtime.
    pub fn load() -> Result<Self, duet_device::DeviceError> {
        let opened = loader::open(&loader::AMDHIP64).map_err(|tried| {
            crate::error::unavailable(
                "no ROCm 6/7 HIP runtime (libamdhip64) found; install ROCm or set ROCM_PATH / LD_LIBRARY_PATH",
                tried,
            )
        })?;
        let api = Self::from_library(opened.lib, &opened.name)?;
        if api.host.is_none() {
            // Resolve again only to name what is missing.
            let lib = loader::open_pinned(&opened.name).map_err(|e| {
                crate::error::unavailable(format!("{}: {e}", opened.name), Vec::new())
            })?;
            loader::check_symbols(&lib, &opened.name, &HOST_SYMBOLS)?;
        }
        let v = api.runtime_version()?;
        if v < 60_000_000 {
            return Err(crate::error::unavailable(
                format!(
                    "{} is HIP runtime {} (ROCm 5); the hip backend needs ROCm 6 or 7",
                    api.name,
                    version_string(v)
                ),
                loader::candidates(&loader::AMDHIP64),
            ));
        }
        Ok(api)
    }

    /// Builds the API from an opened library, failing with the names of any missing symbols.
    pub fn from_library(lib: libloading::Library, name: &str) -> Result<Self, HipError> {
        loader::check_symbols(&lib, name, &required_symbols())?;
        let get = |sym: &[u8]| {
            // SAFETY: both property entry points have the signature
            // `hipError_t (void* prop, int device)`; the pointer is only called while `lib`
            // (moved into `HipLib` below, same mapping) is alive.
            unsafe { lib.get::<PropsFn>(sym) }.ok().map(|s| *s)
        };
        let file = crate::toolchain::library_file(&lib, c"hipInit");
        let host = HostFns::resolve(&lib);
        let graph = GraphFns::resolve(&lib);
        let props_r0600 = get(b"hipGetDevicePropertiesR0600\0");
        let props_r0000 = get(b"hipGetDeviceProperties\0");
        // SAFETY: every symbol of the generated table was checked above, so no field is an error
        // and none of the generated methods can hit their `expect`.
        let lib =
            unsafe { sys::HipLib::from_library(lib) }.map_err(|e| HipError::MissingSymbols {
                library: name.to_string(),
                missing: vec![e.to_string()],
            })?;
        Ok(Self {
            lib,
            props_r0600,
            props_r0000,
            host,
            graph,
            name: name.to_string(),
            file,
        })
    }

    fn check(&self, call: &'static str, code: sys::hipError_t) -> Result<(), HipError> {
        if code == sys::hipError_t::hipSuccess {
            return Ok(());
        }
        Err(HipError::Runtime {
            call,
            code: code.0,
            message: self.error_text(code),
        })
    }

    /// `hipGetErrorName: hipGetErrorString` of a code.
    pub fn error_text(&self, code: sys::hipError_t) -> String {
        let text = |p: *const c_char| {
            if p.is_null() {
                String::from("?")
            } else {
                // SAFETY: HIP returns pointers to static NUL-terminated strings.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: pure lookups of static strings; any code value is accepted.
        let (name, desc) = unsafe {
            (
                self.lib.hipGetErrorName(code),
                self.lib.hipGetErrorString(code),
            )
        };
        format!("{}: {}", text(name), text(desc))
    }

    pub fn runtime_version(&self) -> Result<i32, HipError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipRuntimeGetVersion", unsafe {
            self.lib.hipRuntimeGetVersion(&mut v)
        })?;
        Ok(v)
    }

    pub fn driver_version(&self) -> Result<i32, HipError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDriverGetVersion", unsafe {
            self.lib.hipDriverGetVersion(&mut v)
        })?;
        Ok(v)
    }

    pub fn init(&self) -> Result<(), HipError> {
        // SAFETY: no pointers; flags must be 0.
        self.check("hipInit", unsafe { self.lib.hipInit(0) })
    }

    pub fn device_count(&self) -> Result<i32, HipError> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("hipGetDeviceCount", unsafe {
            self.lib.hipGetDeviceCount(&mut n)
        })?;
        Ok(n)
    }

    pub fn set_device(&self, ordinal: i32) -> Result<(), HipError> {
        // SAFETY: no pointers; an invalid ordinal is reported as an error code.
        self.check("hipSetDevice", unsafe { self.lib.hipSetDevice(ordinal) })
    }

    pub fn attribute(
        &self,
        attr: sys::hipDeviceAttribute_t,
        ordinal: i32,
    ) -> Result<i32, HipError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceGetAttribute", unsafe {
            self.lib.hipDeviceGetAttribute(&mut v, attr, ordinal)
        })?;
        Ok(v)
    }

    pub fn device_name(&self, ordinal: i32) -> Result<String, HipError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: HIP writes at most `len` bytes including the NUL.
        self.check("hipDeviceGetName", unsafe {
            self.lib
                .hipDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, ordinal)
        })?;
        Ok(c_buf_to_string(&buf.map(|c| c as u8)))
    }

    /// The full target ID (`gfx942:sramecc+:xnack-`), from `hipGetDevicePropertiesR0600`
    /// (ROCm 6/7) or else the compatibility export `hipGetDeviceProperties` (old layout).
    pub fn arch_name(&self, ordinal: i32) -> Result<String, HipError> {
        let (f, offset, call) = match (self.props_r0600, self.props_r0000) {
            (Some(f), _) => (f, ARCH_OFFSET_R0600, "hipGetDevicePropertiesR0600"),
            (None, Some(f)) => (f, ARCH_OFFSET_R0000, "hipGetDeviceProperties"),
            (None, None) => {
                return Err(HipError::MissingSymbols {
                    library: self.name.clone(),
                    missing: vec![
                        "hipGetDevicePropertiesR0600".into(),
                        "hipGetDeviceProperties".into(),
                    ],
                });
            }
        };
        let mut buf = vec![0u8; PROPS_BUF];
        // SAFETY: the buffer is larger than either property struct (1472 / 792 bytes), so the
        // runtime's writes stay inside it; it is plain bytes, valid for any content.
        self.check(call, unsafe { f(buf.as_mut_ptr().cast(), ordinal) })?;
        Ok(c_buf_to_string(&buf[offset..offset + 256]))
    }

    /// (free, total) bytes of the current device.
    pub fn mem_info(&self) -> Result<(u64, u64), HipError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        self.check("hipMemGetInfo", unsafe {
            self.lib.hipMemGetInfo(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    /// # Safety
    /// `stream` must be a live stream of the current device (or null for the null stream).
    pub unsafe fn malloc(
        &self,
        bytes: usize,
        stream: Option<sys::hipStream_t>,
    ) -> Result<*mut c_void, HipError> {
        let mut p = std::ptr::null_mut();
        match stream {
            // SAFETY: writes one pointer; the caller guarantees the stream.
            Some(s) => self.check("hipMallocAsync", unsafe {
                self.lib.hipMallocAsync(&mut p, bytes, s)
            })?,
            // SAFETY: writes one pointer.
            None => self.check("hipMalloc", unsafe { self.lib.hipMalloc(&mut p, bytes) })?,
        }
        Ok(p)
    }

    /// # Safety
    /// `ptr` must come from [`Self::malloc`] with the same `stream` choice and not be used after.
    pub unsafe fn free(
        &self,
        ptr: *mut c_void,
        stream: Option<sys::hipStream_t>,
    ) -> Result<(), HipError> {
        match stream {
            // SAFETY: guaranteed by the caller.
            Some(s) => self.check("hipFreeAsync", unsafe { self.lib.hipFreeAsync(ptr, s) }),
            // SAFETY: guaranteed by the caller.
            None => self.check("hipFree", unsafe { self.lib.hipFree(ptr) }),
        }
    }

    /// # Safety
    /// `dst`/`src` must be valid for `bytes` on the sides `kind` names, and stay valid until the
    /// copy completes on `stream`.
    pub unsafe fn memcpy_async(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: sys::hipMemcpyKind,
        stream: sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipMemcpyAsync", unsafe {
            self.lib.hipMemcpyAsync(dst, src, bytes, kind, stream)
        })
    }

    /// Sets `count` elements of `width` bytes (1, 2 or 4) to the low bits of `pattern`.
    ///
    /// # Safety
    /// `dst` must be device memory valid for `count * width` bytes.
    pub unsafe fn memset_async(
        &self,
        dst: *mut c_void,
        pattern: u32,
        width: usize,
        count: usize,
        stream: sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller (the D-variants take the element count).
        unsafe {
            match width {
                1 => self.check(
                    "hipMemsetD8Async",
                    self.lib.hipMemsetD8Async(dst, pattern as u8, count, stream),
                ),
                2 => self.check(
                    "hipMemsetD16Async",
                    self.lib
                        .hipMemsetD16Async(dst, pattern as u16, count, stream),
                ),
                _ => self.check(
                    "hipMemsetD32Async",
                    self.lib
                        .hipMemsetD32Async(dst, pattern as c_int, count, stream),
                ),
            }
        }
    }

    /// # Safety
    /// `dst` must be device memory valid for `bytes`.
    pub unsafe fn memset_zero_async(
        &self,
        dst: *mut c_void,
        bytes: usize,
        stream: sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipMemsetAsync", unsafe {
            self.lib.hipMemsetAsync(dst, 0, bytes, stream)
        })
    }

    pub fn stream_create(&self) -> Result<sys::hipStream_t, HipError> {
        let mut s = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check("hipStreamCreateWithFlags", unsafe {
            self.lib
                .hipStreamCreateWithFlags(&mut s, sys::hipStreamNonBlocking)
        })?;
        Ok(s)
    }

    /// # Safety
    /// `s` must be a live stream.
    pub unsafe fn stream_synchronize(&self, s: sys::hipStream_t) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipStreamSynchronize", unsafe {
            self.lib.hipStreamSynchronize(s)
        })
    }

    /// # Safety
    /// `s` must be a live stream that is not used afterwards.
    pub unsafe fn stream_destroy(&self, s: sys::hipStream_t) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipStreamDestroy", unsafe { self.lib.hipStreamDestroy(s) })
    }

    pub fn module_load(&self, image: &[u8]) -> Result<sys::hipModule_t, HipError> {
        let mut m = std::ptr::null_mut();
        // SAFETY: HIP parses the code object and copies what it needs; `image` outlives the call.
        self.check("hipModuleLoadData", unsafe {
            self.lib.hipModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(m)
    }

    /// # Safety
    /// `m` must be a live module.
    pub unsafe fn module_function(
        &self,
        m: sys::hipModule_t,
        name: &CStr,
    ) -> Result<sys::hipFunction_t, HipError> {
        let mut f = std::ptr::null_mut();
        // SAFETY: guaranteed by the caller; `name` is NUL-terminated.
        self.check("hipModuleGetFunction", unsafe {
            self.lib.hipModuleGetFunction(&mut f, m, name.as_ptr())
        })?;
        Ok(f)
    }

    /// # Safety
    /// `m` must be a live module whose functions are no longer used.
    pub unsafe fn module_unload(&self, m: sys::hipModule_t) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipModuleUnload", unsafe { self.lib.hipModuleUnload(m) })
    }

    fn host_fns(&self, call: &'static str) -> Result<HostFns, HipError> {
        self.host.ok_or_else(|| HipError::MissingSymbols {
            library: self.name.clone(),
            missing: vec![call.to_string()],
        })
    }

    /// `bytes` of page-locked host memory (`hipHostMalloc`, default flags).
    pub fn host_malloc(&self, bytes: usize) -> Result<*mut u8, HipError> {
        let f = self.host_fns("hipHostMalloc")?;
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer; flags 0 = hipHostMallocDefault.
        self.check("hipHostMalloc", unsafe {
            (f.host_malloc)(&mut p, bytes, 0)
        })?;
        Ok(p.cast())
    }

    /// # Safety
    /// `p` must come from [`Self::host_malloc`], not be freed twice, and no queued copy may
    /// still read it.
    pub unsafe fn host_free(&self, p: *mut u8) -> Result<(), HipError> {
        let f = self.host_fns("hipHostFree")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipHostFree", unsafe { (f.host_free)(p.cast()) })
    }

    /// An event without timing (`hipEventCreateWithFlags(hipEventDisableTiming)`).
    pub fn event_create(&self) -> Result<HipEvent, HipError> {
        let f = self.host_fns("hipEventCreateWithFlags")?;
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one handle; 2 = hipEventDisableTiming.
        self.check("hipEventCreateWithFlags", unsafe {
            (f.event_create)(&mut e, sys::hipEventDisableTiming)
        })?;
        Ok(e)
    }

    /// # Safety
    /// `e` and `s` must be live.
    pub unsafe fn event_record(&self, e: HipEvent, s: sys::hipStream_t) -> Result<(), HipError> {
        let f = self.host_fns("hipEventRecord")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipEventRecord", unsafe { (f.event_record)(e, s) })
    }

    /// # Safety
    /// `e` must be live.
    pub unsafe fn event_synchronize(&self, e: HipEvent) -> Result<(), HipError> {
        let f = self.host_fns("hipEventSynchronize")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipEventSynchronize", unsafe { (f.event_synchronize)(e) })
    }

    /// # Safety
    /// `e` must be live and not used afterwards.
    pub unsafe fn event_destroy(&self, e: HipEvent) -> Result<(), HipError> {
        let f = self.host_fns("hipEventDestroy")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipEventDestroy", unsafe { (f.event_destroy)(e) })
    }

    /// Whether the runtime exports every [`GRAPH_SYMBOLS`] function.
    pub fn graphs_supported(&self) -> bool {
        self.graph.is_some()
    }

    fn graph_fns(&self, call: &'static str) -> Result<GraphFns, HipError> {
        self.graph.ok_or_else(|| HipError::MissingSymbols {
            library: self.name.clone(),
            missing: vec![call.to_string()],
        })
    }

    /// An event that records time (`hipEventCreateWithFlags(hipEventDefault)`).
    pub fn timed_event_create(&self) -> Result<HipEvent, HipError> {
        let f = self.host_fns("hipEventCreateWithFlags")?;
        let mut e = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check("hipEventCreateWithFlags", unsafe {
            (f.event_create)(&mut e, HIP_EVENT_DEFAULT)
        })?;
        Ok(e)
    }

    /// Milliseconds between two completed timed events (`hipEventElapsedTime`).
    ///
    /// # Safety
    /// Both events must be live and made by [`Self::timed_event_create`].
    pub unsafe fn event_elapsed_ms(&self, start: HipEvent, end: HipEvent) -> Result<f32, HipError> {
        let f = self.graph_fns("hipEventElapsedTime")?;
        let mut ms = 0f32;
        // SAFETY: guaranteed by the caller; writes one float.
        self.check("hipEventElapsedTime", unsafe {
            (f.elapsed)(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    /// Starts recording the work queued on `s` by this thread (thread-local capture mode).
    ///
    /// # Safety
    /// `s` must be a live stream that is not already capturing.
    pub unsafe fn stream_begin_capture(&self, s: sys::hipStream_t) -> Result<(), HipError> {
        let f = self.graph_fns("hipStreamBeginCapture")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipStreamBeginCapture", unsafe {
            (f.begin_capture)(s, HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        })
    }

    /// Ends the capture on `s` and returns the recorded graph.
    ///
    /// # Safety
    /// `s` must be a live stream that is capturing.
    pub unsafe fn stream_end_capture(&self, s: sys::hipStream_t) -> Result<HipGraph, HipError> {
        let f = self.graph_fns("hipStreamEndCapture")?;
        let mut g = std::ptr::null_mut();
        // SAFETY: guaranteed by the caller; writes one handle.
        self.check("hipStreamEndCapture", unsafe { (f.end_capture)(s, &mut g) })?;
        Ok(g)
    }

    /// Instantiates a recorded graph (flags 0).
    ///
    /// # Safety
    /// `g` must be a live graph.
    pub unsafe fn graph_instantiate(&self, g: HipGraph) -> Result<HipGraphExec, HipError> {
        let f = self.graph_fns("hipGraphInstantiateWithFlags")?;
        let mut e = std::ptr::null_mut();
        // SAFETY: guaranteed by the caller; writes one handle.
        self.check("hipGraphInstantiateWithFlags", unsafe {
            (f.instantiate)(&mut e, g, 0)
        })?;
        Ok(e)
    }

    /// Queues an instantiated graph on `s`.
    ///
    /// # Safety
    /// `e` and `s` must be live, and every buffer the graph's work touches must still be
    /// allocated.
    pub unsafe fn graph_launch(
        &self,
        e: HipGraphExec,
        s: sys::hipStream_t,
    ) -> Result<(), HipError> {
        let f = self.graph_fns("hipGraphLaunch")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipGraphLaunch", unsafe { (f.launch)(e, s) })
    }

    /// # Safety
    /// `e` must be live and not used afterwards (no queued launch of it may still be pending
    /// on a stream that is then destroyed; HIP keeps a launched graph alive until it ran).
    pub unsafe fn graph_exec_destroy(&self, e: HipGraphExec) -> Result<(), HipError> {
        let f = self.graph_fns("hipGraphExecDestroy")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipGraphExecDestroy", unsafe { (f.exec_destroy)(e) })
    }

    /// # Safety
    /// `g` must be live and not used afterwards.
    pub unsafe fn graph_destroy(&self, g: HipGraph) -> Result<(), HipError> {
        let f = self.graph_fns("hipGraphDestroy")?;
        // SAFETY: guaranteed by the caller.
        self.check("hipGraphDestroy", unsafe { (f.destroy)(g) })
    }

    /// # Safety
    /// `params` must point to one pointer per kernel parameter, each to a value of exactly the
    /// parameter's type, and every device pointer among them must be valid for the kernel.
    pub unsafe fn launch(
        &self,
        f: sys::hipFunction_t,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        stream: sys::hipStream_t,
        params: *mut *mut c_void,
    ) -> Result<(), HipError> {
        // SAFETY: guaranteed by the caller.
        self.check("hipModuleLaunchKernel", unsafe {
            self.lib.hipModuleLaunchKernel(
                f,
                grid.0,
                grid.1,
                grid.2,
                block.0,
                block.1,
                block.2,
                0,
                stream,
                params,
                std::ptr::null_mut(),
            )
        })
    }
}

/// `major.minor.patch` of a `hipRuntimeGetVersion` value (major·10⁷ + minor·10⁵ + patch).
pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_enum_values_match_rocm6_and_7() {
        // The bindings come from the HIP 5.2 headers; these values are the same in 6.x and 7.x
        // (shared/docs/hip-notes.md §2), which is what makes the 5.2 bindings usable there.
        type A = sys::hipDeviceAttribute_t;
        assert_eq!(A::hipDeviceAttributeWarpSize.0, 87);
        assert_eq!(A::hipDeviceAttributeMaxThreadsPerBlock.0, 56);
        assert_eq!(A::hipDeviceAttributeMaxSharedMemoryPerBlock.0, 74);
        assert_eq!(A::hipDeviceAttributeMultiprocessorCount.0, 63);
        assert_eq!(A::hipDeviceAttributeMemoryPoolsSupported.0, 88);
        assert_eq!(A::hipDeviceAttributeL2CacheSize.0, 19);
        assert_eq!(sys::hipMemcpyKind::hipMemcpyHostToDevice.0, 1);
        assert_eq!(sys::hipMemcpyKind::hipMemcpyDeviceToHost.0, 2);
        assert_eq!(sys::hipMemcpyKind::hipMemcpyDeviceToDevice.0, 3);
        assert_eq!(sys::hipError_t::hipErrorOutOfMemory.0, 2);
        assert_eq!(sys::hipStreamNonBlocking, 1);
    }

    #[test]
    fn version_strings() {
        assert_eq!(version_string(60_241_134), "6.2.41134");
        assert_eq!(version_string(70_051_831), "7.0.51831");
    }

    #[test]
    fn required_list_is_exactly_the_generated_functions() {
        let generated = include_str!("sys/bindings.rs");
        let mut fns: Vec<&str> = generated
            .split("pub unsafe fn ")
            .skip(1)
            .filter_map(|s| s.split('(').next())
            .map(str::trim)
            .filter(|n| n.starts_with("hip"))
            .collect();
        fns.sort_unstable();
        let mut req = required_symbols();
        req.sort_unstable();
        assert_eq!(fns, req);
    }
}
