//! Collectives over RCCL (ROCm's NCCL, same C API): [`RcclComm`] implements [`Collective`] for
//! [`HipDevice`].
//!
//! - **Library.** `librccl.so.1`, opened with `libloading` like the backend's other ROCm
//!   libraries (`$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`, then the loader's path);
//!   HAND-WRITTEN bindings of the few calls used, from RCCL's `rccl.h` (= `nccl.h` 2.x): the
//!   128-byte unique id, `ncclDataType_t` (`ncclInt32` 2, `ncclUint8` 1, `ncclFloat16` 6,
//!   `ncclFloat32` 7, `ncclBfloat16` 9) and `ncclRedOp_t` (`ncclSum` 0, `ncclMax` 2, `ncclAvg`
//!   4) passed as C ints.
//! - **Streams.** As on CUDA: the collectives run on a stream of their own, ordered after the
//!   device's stream by an event at each call, and [`Collective::wait`] orders the device's
//!   stream after them, so gradient buckets travel while the backward pass continues. The HIP
//!   event and stream calls come from `libamdhip64` through a table of their own here.
//! - **Launch.** One process per GPU; rank 0 makes the unique id ([`RcclComm::unique_id`]) and
//!   hands it to the others.

use crate::device::HipDevice;
use crate::dynlib::dyn_api;
use crate::hip::sys::hipStream_t;
use crate::loader::{self, LibSpec};
use crate::memory::HipBuffer;
use duet_device::{
    Buffer, Collective, DType, DeviceError, ReduceOp, Result, check_collective_lens,
};
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

pub const RCCL: LibSpec = LibSpec {
    stem: "librccl",
    versions: &["1"],
};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [c_char; 128],
}

pub type NcclComm = *mut c_void;
pub type NcclResult = c_int;
pub type HipEvent = *mut c_void;
pub type HipError = c_int;

const NCCL_SUCCESS: NcclResult = 0;
const NCCL_UINT8: c_int = 1;
const NCCL_INT32: c_int = 2;
const NCCL_FLOAT16: c_int = 6;
const NCCL_FLOAT32: c_int = 7;
const NCCL_BFLOAT16: c_int = 9;
const NCCL_SUM: c_int = 0;
const NCCL_MAX: c_int = 2;
const NCCL_AVG: c_int = 4;
/// `hipEventDisableTiming`.
const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `hipStreamNonBlocking`.
const HIP_STREAM_NON_BLOCKING: c_uint = 0x1;

dyn_api! {
    /// The RCCL functions duet calls.
    pub struct RcclLib {
        pub fn ncclGetVersion(version: *mut c_int) -> NcclResult;
        pub fn ncclGetUniqueId(id: *mut NcclUniqueId) -> NcclResult;
        pub fn ncclCommInitRank(comm: *mut NcclComm, nranks: c_int, id: NcclUniqueId, rank: c_int) -> NcclResult;
        pub fn ncclCommDestroy(comm: NcclComm) -> NcclResult;
        pub fn ncclGetErrorString(result: NcclResult) -> *const c_char;
        pub fn ncclAllReduce(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: c_int,
            op: c_int,
            comm: NcclComm,
            stream: hipStream_t,
        ) -> NcclResult;
        pub fn ncclReduceScatter(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: c_int,
            op: c_int,
            comm: NcclComm,
            stream: hipStream_t,
        ) -> NcclResult;
        pub fn ncclAllGather(
            send: *const c_void,
            recv: *mut c_void,
            count: usize,
            dtype: c_int,
            comm: NcclComm,
            stream: hipStream_t,
        ) -> NcclResult;
    }
}

dyn_api! {
    /// The HIP runtime calls the communication stream needs.
    pub struct HipSyncLib {
        pub fn hipSetDevice(ordinal: c_int) -> HipError;
        pub fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> HipError;
        pub fn hipStreamDestroy(stream: hipStream_t) -> HipError;
        pub fn hipStreamSynchronize(stream: hipStream_t) -> HipError;
        pub fn hipEventCreateWithFlags(event: *mut HipEvent, flags: c_uint) -> HipError;
        pub fn hipEventRecord(event: HipEvent, stream: hipStream_t) -> HipError;
        pub fn hipEventDestroy(event: HipEvent) -> HipError;
        pub fn hipStreamWaitEvent(stream: hipStream_t, event: HipEvent, flags: c_uint) -> HipError;
    }
}

struct Libs {
    rccl: RcclLib,
    hip: HipSyncLib,
    location: String,
}

fn libs() -> Result<&'static Libs> {
    static LIBS: OnceLock<std::result::Result<Libs, DeviceError>> = OnceLock::new();
    let r = LIBS.get_or_init(|| {
        let opened = loader::open(&RCCL).map_err(|tried| {
            crate::error::unavailable("RCCL (librccl.so.1, ROCm 6/7) not found", tried)
        })?;
        let location = opened.name.clone();
        // SAFETY: the declarations above match RCCL's `rccl.h` (the NCCL 2.x C API).
        let rccl = unsafe { RcclLib::load(opened.lib, &opened.name) }?;
        let amd = loader::open(&loader::AMDHIP64).map_err(|tried| {
            crate::error::unavailable("the HIP runtime (libamdhip64) not found", tried)
        })?;
        // SAFETY: the declarations above match `hip_runtime_api.h` of ROCm 6/7.
        let hip = unsafe { HipSyncLib::load(amd.lib, &amd.name) }?;
        Ok(Libs {
            rccl,
            hip,
            location,
        })
    });
    match r {
        Ok(l) => Ok(l),
        Err(e) => Err(match e {
            DeviceError::Unavailable {
                backend,
                reason,
                tried,
            } => DeviceError::Unavailable {
                backend,
                reason: reason.clone(),
                tried: tried.clone(),
            },
            other => DeviceError::Driver {
                backend: "hip",
                call: "RCCL load".into(),
                message: other.to_string(),
            },
        }),
    }
}

fn rccl_err(libs: &Libs, call: &str, r: NcclResult) -> Result<()> {
    if r == NCCL_SUCCESS {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
    let text = unsafe {
        let p = (libs.rccl.ncclGetErrorString)(r);
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(DeviceError::Driver {
        backend: "hip",
        call: call.into(),
        message: format!("ncclResult_t {r}: {text}"),
    })
}

fn hip_err(call: &str, r: HipError) -> Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            backend: "hip",
            call: call.into(),
            message: format!("hipError_t {r}"),
        })
    }
}

/// RCCL's version as `major.minor.patch`.
pub fn rccl_version() -> Result<String> {
    let l = libs()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    rccl_err(l, "ncclGetVersion", unsafe {
        (l.rccl.ncclGetVersion)(&mut v)
    })?;
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

fn rccl_dtype(op: &'static str, d: DType, reduce: bool) -> Result<c_int> {
    Ok(match d {
        DType::F32 => NCCL_FLOAT32,
        DType::F16 => NCCL_FLOAT16,
        DType::BF16 => NCCL_BFLOAT16,
        DType::I32 => NCCL_INT32,
        _ if !reduce => NCCL_UINT8,
        dtype => {
            return Err(DeviceError::Unsupported {
                op: op.into(),
                dtype,
            });
        }
    })
}

fn rccl_op(op: ReduceOp) -> c_int {
    match op {
        ReduceOp::Sum => NCCL_SUM,
        ReduceOp::Avg => NCCL_AVG,
        ReduceOp::Max => NCCL_MAX,
    }
}

/// One rank of an RCCL communicator, bound to one [`HipDevice`].
pub struct RcclComm {
    libs: &'static Libs,
    dev: std::sync::Arc<HipDevice>,
    comm: Mutex<NcclComm>,
    /// The communication stream.
    stream: hipStream_t,
    rank: usize,
    world: usize,
    version: String,
}

// SAFETY: the communicator is only used behind the mutex, one call at a time; HIP streams may be
// used from any thread.
unsafe impl Send for RcclComm {}
// SAFETY: as above.
unsafe impl Sync for RcclComm {}

impl RcclComm {
    /// A new unique id (made by rank 0 and handed to every rank), as bytes.
    pub fn unique_id() -> Result<Vec<u8>> {
        let l = libs()?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: writes one ncclUniqueId.
        rccl_err(l, "ncclGetUniqueId", unsafe {
            (l.rccl.ncclGetUniqueId)(&mut id)
        })?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }

    /// Joins the communicator of `world` ranks named by `id` as `rank`, on `dev`'s GPU.
    pub fn new(
        dev: std::sync::Arc<HipDevice>,
        rank: usize,
        world: usize,
        id: &[u8],
    ) -> Result<Self> {
        let l = libs()?;
        if id.len() != 128 || rank >= world {
            return Err(DeviceError::InvalidArgument(format!(
                "RCCL: a 128-byte id and a rank below the world size are needed (got {} bytes, rank {rank} of {world})",
                id.len()
            )));
        }
        let mut uid = NcclUniqueId { internal: [0; 128] };
        for (d, &s) in uid.internal.iter_mut().zip(id) {
            *d = s as c_char;
        }
        let int = |v: usize| {
            c_int::try_from(v).map_err(|_| DeviceError::InvalidArgument(format!("{v} ranks")))
        };
        // SAFETY: no pointers; selects this rank's GPU for the calls below on this thread.
        hip_err("hipSetDevice", unsafe {
            (l.hip.hipSetDevice)(dev.ordinal() as c_int)
        })?;
        let mut stream: hipStream_t = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        hip_err("hipStreamCreateWithFlags", unsafe {
            (l.hip.hipStreamCreateWithFlags)(&mut stream, HIP_STREAM_NON_BLOCKING)
        })?;
        let mut comm: NcclComm = std::ptr::null_mut();
        // SAFETY: writes one communicator; the id is passed by value.
        let r = unsafe { (l.rccl.ncclCommInitRank)(&mut comm, int(world)?, uid, int(rank)?) };
        if let Err(e) = rccl_err(l, "ncclCommInitRank", r) {
            // SAFETY: the stream was created above and is unused.
            unsafe { (l.hip.hipStreamDestroy)(stream) };
            return Err(e);
        }
        Ok(Self {
            libs: l,
            dev,
            comm: Mutex::new(comm),
            stream,
            rank,
            world,
            version: rccl_version()?,
        })
    }

    /// Where RCCL was loaded from.
    pub fn library_location() -> Result<String> {
        Ok(libs()?.location.clone())
    }

    /// Makes `waiter` wait for the work queued so far on `signaller`.
    fn order(&self, signaller: hipStream_t, waiter: hipStream_t) -> Result<()> {
        let h = &self.libs.hip;
        let mut ev: HipEvent = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        hip_err("hipEventCreateWithFlags", unsafe {
            (h.hipEventCreateWithFlags)(&mut ev, HIP_EVENT_DISABLE_TIMING)
        })?;
        // SAFETY: `ev` and both streams are live; destroying a recorded event is allowed (its
        // resources are released once it completes).
        unsafe {
            let rec = (h.hipEventRecord)(ev, signaller);
            let wait = if rec == 0 {
                (h.hipStreamWaitEvent)(waiter, ev, 0)
            } else {
                rec
            };
            (h.hipEventDestroy)(ev);
            hip_err("hipEventRecord/hipStreamWaitEvent", wait)
        }
    }

    fn enqueue(&self, call: &'static str, f: impl FnOnce(NcclComm) -> NcclResult) -> Result<()> {
        // SAFETY: no pointers; RCCL launches on the current device.
        hip_err("hipSetDevice", unsafe {
            (self.libs.hip.hipSetDevice)(self.dev.ordinal() as c_int)
        })?;
        self.order(self.dev.stream().raw(), self.stream)?;
        let comm = self.comm.lock().map_err(|_| DeviceError::Driver {
            backend: "hip",
            call: call.into(),
            message: "communicator lock poisoned".into(),
        })?;
        rccl_err(self.libs, call, f(*comm))
    }
}

impl Drop for RcclComm {
    fn drop(&mut self) {
        let (h, r) = (&self.libs.hip, &self.libs.rccl);
        // SAFETY: the stream and communicator are live and owned; the stream is drained first.
        unsafe {
            (h.hipStreamSynchronize)(self.stream);
            if let Ok(c) = self.comm.lock() {
                (r.ncclCommDestroy)(*c);
            }
            (h.hipStreamDestroy)(self.stream);
        }
    }
}

impl Collective<HipDevice> for RcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn describe(&self) -> String {
        format!("rccl {}", self.version)
    }

    fn all_reduce(&self, buf: &mut HipBuffer, op: ReduceOp) -> Result<()> {
        let dt = rccl_dtype("all_reduce", buf.dtype(), true)?;
        let (p, n, s) = (buf.ptr(), buf.len(), self.stream);
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclAllReduce", |comm| {
            // SAFETY: `p` addresses `n` live elements of dtype `dt` on this GPU (in place is
            // allowed); the buffer lives until `wait` (trait contract).
            unsafe { (self.libs.rccl.ncclAllReduce)(p, p, n, dt, rccl_op(op), comm, s) }
        })
    }

    fn reduce_scatter(&self, src: &HipBuffer, dst: &mut HipBuffer, op: ReduceOp) -> Result<()> {
        check_collective_lens("reduce_scatter", src.len(), dst.len(), self.world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "reduce_scatter",
                expected: src.dtype(),
                got: dst.dtype(),
            });
        }
        let dt = rccl_dtype("reduce_scatter", src.dtype(), true)?;
        let (sp, dp, n, s) = (src.ptr(), dst.ptr(), dst.len(), self.stream);
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclReduceScatter", |comm| {
            // SAFETY: `src` holds world·n and `dst` n live elements (checked above), distinct
            // buffers on this GPU that live until `wait`.
            unsafe { (self.libs.rccl.ncclReduceScatter)(sp, dp, n, dt, rccl_op(op), comm, s) }
        })
    }

    fn all_gather(&self, src: &HipBuffer, dst: &mut HipBuffer) -> Result<()> {
        check_collective_lens("all_gather", dst.len(), src.len(), self.world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "all_gather",
                expected: dst.dtype(),
                got: src.dtype(),
            });
        }
        let dt = rccl_dtype("all_gather", src.dtype(), false)?;
        let n = if dt == NCCL_UINT8 {
            src.size_bytes()
        } else {
            src.len()
        };
        let (sp, dp, s) = (src.ptr(), dst.ptr(), self.stream);
        if n == 0 {
            return Ok(());
        }
        self.enqueue("ncclAllGather", |comm| {
            // SAFETY: `src` holds n and `dst` world·n live elements (checked above) on this
            // GPU; both live until `wait`.
            unsafe { (self.libs.rccl.ncclAllGather)(sp, dp, n, dt, comm, s) }
        })
    }

    fn wait(&self) -> Result<()> {
        self.order(self.stream, self.dev.stream().raw())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rccl_candidates_and_symbols() {
        let c = loader::candidates(&RCCL);
        assert!(c.iter().any(|n| n == "/opt/rocm/lib/librccl.so.1"), "{c:?}");
        assert!(RcclLib::SYMBOLS.contains(&"ncclReduceScatter"));
        assert_eq!(std::mem::size_of::<NcclUniqueId>(), 128);
        // Without ROCm the library is reported unavailable, never a panic.
        if let Err(e) = rccl_version() {
            assert!(matches!(
                e,
                DeviceError::Unavailable { .. } | DeviceError::Driver { .. }
            ));
        }
    }
}
