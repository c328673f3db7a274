//! Collectives over NCCL: [`NcclComm`] implements [`Collective`] for [`CudaDevice`].
//!
//! - **Library.** NCCL's types come from cudarc (`cudarc::nccl::sys`); the library itself is
//!   opened here with `libloading`, because cudarc's loader only tries the names `libnccl.so`
//!   and `libnccl.so.<CUDA major>`, while NCCL's soname is `libnccl.so.2` (the unversioned name
//!   exists only with the development package). Tried in order: `$DUET_NCCL_LIB` (a path),
//!   `libnccl.so.2` and `libnccl.so` through the dynamic loader, then the usual install
//!   folders and pip's `nvidia-nccl-*` wheels. A machine without NCCL gets
//!   [`DeviceError::Unavailable`] listing what was tried.
//! - **Streams.** Collectives run on a communication stream of their own. Each one first makes
//!   that stream wait (an event) for everything already queued on the device's stream, so it
//!   sees finished gradients; the device keeps computing meanwhile (the backward pass of
//!   earlier layers overlaps the reduction of later ones). [`Collective::wait`] makes the
//!   device's stream wait for the communication stream.
//! - **Launch.** One process per GPU: rank 0 makes the unique id ([`NcclComm::unique_id`]), the
//!   launcher hands it to every rank, and each calls [`NcclComm::new`] with its rank. Keep
//!   `NCCL_NVLS_ENABLE=0` (NVLink multicast off) where GPUs are shared.

use crate::device::CudaDevice;
use crate::error::{BACKEND, driver};
use crate::memory::CudaBuffer;
use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUevent_flags;
use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use duet_device::{
    Buffer, Collective, DType, DeviceError, ReduceOp, Result, check_collective_lens,
};
use libloading::Library;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Environment variable naming the NCCL library file to load
/// ([`duet_device::knobs::Knobs::nccl_lib`]).
pub use duet_device::knobs::NCCL_LIB as NCCL_LIB_ENV;

/// The NCCL entry points duet calls, resolved from the loaded library.
struct NcclLib {
    _lib: Library,
    location: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    comm_init_rank:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    get_error_string: unsafe extern "C" fn(ncclResult_t) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclRedOp_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
}

fn candidates(knobs: &duet_device::knobs::Knobs) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = &knobs.nccl_lib {
        out.push(p.display().to_string());
    }
    out.push("libnccl.so.2".into());
    out.push("libnccl.so".into());
    let mut dirs: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            let root = PathBuf::from(v);
            dirs.push(root.join("lib64"));
            dirs.push(root.join("lib"));
        }
    }
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/local/cuda/lib64",
        "/usr/lib64",
    ] {
        dirs.push(d.into());
    }
    for root in ["/usr/local/lib", "/usr/lib"] {
        if let Ok(entries) = std::fs::read_dir(root) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("python3") {
                    for leaf in ["dist-packages", "site-packages"] {
                        let site = e.path().join(leaf).join("nvidia");
                        dirs.push(site.join("nccl/lib"));
                        dirs.push(site.join("cu13/lib"));
                    }
                }
            }
        }
    }
    for d in dirs {
        let p = d.join("libnccl.so.2");
        if p.is_file() {
            out.push(p.display().to_string());
        }
    }
    out
}

impl NcclLib {
    fn load(knobs: &duet_device::knobs::Knobs) -> std::result::Result<Self, (String, Vec<String>)> {
        let mut tried = Vec::new();
        for name in candidates(knobs) {
            // SAFETY: loading NCCL runs its initialisers, which have no preconditions on our
            // side; the handle is stored with the function pointers taken from it.
            let lib = match unsafe { Library::new(&name) } {
                Ok(l) => l,
                Err(e) => {
                    tried.push(format!("{name} ({e})"));
                    continue;
                }
            };
            macro_rules! sym {
                ($name:literal) => {
                    // SAFETY: the symbol is NCCL's public C function of that name, whose
                    // signature (NCCL 2.x `nccl.h`) the field's type spells out.
                    match unsafe { lib.get(concat!($name, "\0").as_bytes()) } {
                        Ok(f) => *f,
                        Err(e) => {
                            tried.push(format!("{name}: missing {} ({e})", $name));
                            continue;
                        }
                    }
                };
            }
            let get_version = sym!("ncclGetVersion");
            let get_unique_id = sym!("ncclGetUniqueId");
            let comm_init_rank = sym!("ncclCommInitRank");
            let comm_destroy = sym!("ncclCommDestroy");
            let get_error_string = sym!("ncclGetErrorString");
            let all_reduce = sym!("ncclAllReduce");
            let reduce_scatter = sym!("ncclReduceScatter");
            let all_gather = sym!("ncclAllGather");
            return Ok(Self {
                _lib: lib,
                location: name,
                get_version,
                get_unique_id,
                comm_init_rank,
                comm_destroy,
                get_error_string,
                all_reduce,
                reduce_scatter,
                all_gather,
            });
        }
        Err((
            "NCCL (libnccl.so.2) could not be loaded: install NCCL (libnccl2 or the nvidia-nccl pip wheel) or point DUET_NCCL_LIB at it".into(),
            tried,
        ))
    }

    fn check(&self, call: &str, r: ncclResult_t) -> Result<()> {
        if r == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe {
            let p = (self.get_error_string)(r);
            if p.is_null() {
                format!("{r:?}")
            } else {
                format!("{r:?}: {}", CStr::from_ptr(p).to_string_lossy())
            }
        };
        Err(DeviceError::Driver {
            backend: BACKEND,
            call: call.into(),
            message: msg,
        })
    }
}

fn library() -> Result<&'static NcclLib> {
    static LIB: OnceLock<std::result::Result<NcclLib, (String, Vec<String>)>> = OnceLock::new();
    let knobs = duet_device::knobs::device_knobs()?;
    LIB.get_or_init(|| NcclLib::load(knobs))
        .as_ref()
        .map_err(|(reason, tried)| DeviceError::Unavailable {
            backend: "nccl",
            reason: reason.clone(),
            tried: tried.clone(),
        })
}

/// NCCL's version as `major.minor.patch`, when the library loads.
pub fn nccl_version() -> Result<String> {
    let lib = library()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    lib.check("ncclGetVersion", unsafe { (lib.get_version)(&mut v) })?;
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

fn nccl_dtype(op: &'static str, d: DType, reduce: bool) -> Result<ncclDataType_t> {
    Ok(match d {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::I32 => ncclDataType_t::ncclInt32,
        // Byte copies (all-gather) of any other dtype.
        _ if !reduce => ncclDataType_t::ncclUint8,
        dtype => {
            return Err(DeviceError::Unsupported {
                op: op.into(),
                dtype,
            });
        }
    })
}

fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
    }
}

/// One rank of an NCCL communicator, bound to one [`CudaDevice`].
pub struct NcclComm {
    lib: &'static NcclLib,
    dev: Arc<CudaDevice>,
    comm: Mutex<ncclComm_t>,
    /// The communication stream (see the module docs).
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    version: String,
}

// SAFETY: the raw communicator is only used behind the mutex, one call at a time; NCCL allows a
// communicator to be used from any thread as long as calls on it are not concurrent.
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("nccl", &self.version)
            .finish()
    }
}

impl NcclComm {
    /// A new NCCL unique id (made by rank 0 and handed to every rank), as bytes.
    pub fn unique_id() -> Result<Vec<u8>> {
        let lib = library()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes one ncclUniqueId.
        lib.check("ncclGetUniqueId", unsafe { (lib.get_unique_id)(&mut id) })?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    /// Joins the communicator of `world` ranks named by `id` (from [`NcclComm::unique_id`]) as
    /// `rank`, on `dev`'s GPU. Blocks until every rank has joined.
    pub fn new(dev: Arc<CudaDevice>, rank: usize, world: usize, id: &[u8]) -> Result<Self> {
        let lib = library()?;
        if id.len() != 128 {
            return Err(DeviceError::InvalidArgument(format!(
                "an NCCL unique id has 128 bytes, got {}",
                id.len()
            )));
        }
        if rank >= world {
            return Err(DeviceError::InvalidArgument(format!(
                "rank {rank} is not below the world size {world}"
            )));
        }
        let mut uid = ncclUniqueId { internal: [0; 128] };
        for (d, &s) in uid.internal.iter_mut().zip(id) {
            *d = s as c_char;
        }
        let ctx = dev.context().clone();
        ctx.bind_to_thread()
            .map_err(|e| driver("cuCtxSetCurrent", e))?;
        let stream = ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        let mut comm: ncclComm_t = std::ptr::null_mut();
        let as_int = |v: usize| {
            c_int::try_from(v)
                .map_err(|_| DeviceError::InvalidArgument(format!("{v} ranks are too many")))
        };
        // SAFETY: `comm` receives the new communicator; the id is passed by value; the GPU is
        // the current context's (bound above), which NCCL picks up.
        lib.check("ncclCommInitRank", unsafe {
            (lib.comm_init_rank)(&mut comm, as_int(world)?, uid, as_int(rank)?)
        })?;
        Ok(Self {
            lib,
            dev,
            comm: Mutex::new(comm),
            stream,
            rank,
            world,
            version: nccl_version()?,
        })
    }

    /// Where the library was loaded from.
    pub fn library_location() -> Result<String> {
        Ok(library()?.location.clone())
    }

    /// Orders the communication stream after the device's stream, then runs `f` with the raw
    /// communicator and stream.
    fn enqueue(
        &self,
        call: &'static str,
        f: impl FnOnce(ncclComm_t, cudaStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let flags = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ev = self
            .dev
            .stream()
            .record_event(flags)
            .map_err(|e| driver("cuEventRecord", e))?;
        self.stream
            .wait(&ev)
            .map_err(|e| driver("cuStreamWaitEvent", e))?;
        let comm = self.comm.lock().map_err(|_| DeviceError::Driver {
            backend: BACKEND,
            call: call.into(),
            message: "communicator lock poisoned".into(),
        })?;
        let raw_stream = self.stream.cu_stream() as cudaStream_t;
        self.lib.check(call, f(*comm, raw_stream))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        if let Ok(c) = self.comm.lock() {
            // SAFETY: the communicator is live, owned, and idle (its stream was drained).
            let _ = unsafe { (self.lib.comm_destroy)(*c) };
        }
    }
}

fn ptr(b: &CudaBuffer) -> *mut c_void {
    b.ptr() as usize as *mut c_void
}

impl Collective<CudaDevice> for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn describe(&self) -> String {
        format!("nccl {}", self.version)
    }

    fn all_reduce(&self, buf: &mut CudaBuffer, op: ReduceOp) -> Result<()> {
        let dt = nccl_dtype("all_reduce", buf.dtype(), true)?;
        let (p, n) = (ptr(buf), buf.len());
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclAllReduce", |comm, s| {
            // SAFETY: `p` addresses `n` live elements of dtype `dt` on this communicator's GPU;
            // in place is allowed; the buffer stays alive until `wait` (trait contract).
            unsafe { (self.lib.all_reduce)(p, p, n, dt, nccl_op(op), comm, s) }
        })
    }

    fn reduce_scatter(&self, src: &CudaBuffer, dst: &mut CudaBuffer, op: ReduceOp) -> Result<()> {
        check_collective_lens("reduce_scatter", src.len(), dst.len(), self.world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "reduce_scatter",
                expected: src.dtype(),
                got: dst.dtype(),
            });
        }
        let dt = nccl_dtype("reduce_scatter", src.dtype(), true)?;
        let (s_ptr, d_ptr, n) = (ptr(src), ptr(dst), dst.len());
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclReduceScatter", |comm, s| {
            // SAFETY: `src` holds world·n and `dst` n live elements of dtype `dt` (checked
            // above) on this GPU, distinct buffers; both live until `wait`.
            unsafe { (self.lib.reduce_scatter)(s_ptr, d_ptr, n, dt, nccl_op(op), comm, s) }
        })
    }

    fn all_gather(&self, src: &CudaBuffer, dst: &mut CudaBuffer) -> Result<()> {
        check_collective_lens("all_gather", dst.len(), src.len(), self.world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "all_gather",
                expected: dst.dtype(),
                got: src.dtype(),
            });
        }
        let dt = nccl_dtype("all_gather", src.dtype(), false)?;
        let n = match dt {
            ncclDataType_t::ncclUint8 => src.size_bytes(),
            _ => src.len(),
        };
        let (s_ptr, d_ptr) = (ptr(src), ptr(dst));
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclAllGather", |comm, s| {
            // SAFETY: `src` holds n and `dst` world·n live elements (checked above) on this
            // GPU; both live until `wait`.
            unsafe { (self.lib.all_gather)(s_ptr, d_ptr, n, dt, comm, s) }
        })
    }

    fn wait(&self) -> Result<()> {
        let ev = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver("cuEventRecord", e))?;
        self.dev
            .stream()
            .wait(&ev)
            .map_err(|e| driver("cuStreamWaitEvent", e))
    }
}
