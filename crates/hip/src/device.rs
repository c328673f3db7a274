//! [`HipDevice`]: the device, its construction and the helpers its ops share (kernel launches,
//! the scratch area, column sums, the checks of token ids); the contract's traits are implemented
//! in runtime.rs ([`duet_device::Runtime`]) and ops/ (one family trait per file). Every op
//! validates shapes and dtypes first (the same rules as the CPU reference where the kernels have
//! the variant, else a typed `Unsupported`), then enqueues its kernels on the device's stream.

use crate::blas::{LazyLt, Lt};
use crate::conv;
use crate::error::{HipError, unavailable};
use crate::flash::FlashInner;
use crate::hip::result::{HipApi, version_string};
use crate::hip::safe::Stream;
use crate::hip::sys;
use crate::hipblaslt::result::LtApi;
use crate::hiprtc::result::RtcApi;
use crate::kernels::{BLOCK, Kernels, Launch, dim, grid_dim};
use crate::memory::{HipBuffer, MemShared};
use crate::rocblas::{result::RocblasApi, safe::RocblasHandle};
use crate::toolchain::{Comgr, Toolchain};
use duet_device::{Buffer, Capabilities, DType, DeviceError, DeviceInfo, Result, check_dtype};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The wavefront sizes the kernels have been executed and checked at (the conformance suite on
/// the HIP-on-CPU platform, scripts/hip-cpu.sh): a device reporting another is refused at open.
const CHECKED_WAVES: [i32; 2] = [64, 32];

/// Rows per chunk of the two-pass column sums: 64, or more where that would need more than
/// 65535 chunks (the CUDA backend's `rows_per_chunk`, so the partition, and with it every bit of
/// the sums, is CUDA's). A function of the shape only.
pub(crate) fn rows_per_chunk(rows: usize) -> usize {
    64usize.max(rows.div_ceil(65_535))
}

/// The grid of a row kernel that gives each of `rows` rows one block ([`BLOCK`] threads), or
/// [`crate::kernels::too_large`].
pub(crate) fn rows_grid(op: &'static str, rows: usize) -> Result<(u32, u32, u32)> {
    Ok((grid_dim(op, rows.max(1))?, 1, 1))
}

/// The grid of a row kernel that gives each of `rows` rows one 32-lane group, 8 rows per block
/// of [`BLOCK`] threads (softmax, LayerNorm; CUDA's one warp per row), or
/// [`crate::kernels::too_large`].
pub(crate) fn group_rows_grid(op: &'static str, rows: usize) -> Result<(u32, u32, u32)> {
    Ok((
        grid_dim(op, rows.div_ceil(BLOCK as usize / 32).max(1))?,
        1,
        1,
    ))
}

pub(crate) fn unsupported(op: &str, dtype: DType) -> DeviceError {
    DeviceError::Unsupported {
        op: op.to_string(),
        dtype,
    }
}

/// Checks that every buffer in `bufs` has dtype `want`.
pub(crate) fn same_dtype(op: &'static str, want: DType, bufs: &[&HipBuffer]) -> Result<()> {
    for b in bufs {
        check_dtype(op, *b, want)?;
    }
    Ok(())
}

/// What one slot of the device's id report checks (see [`HipDevice::queue_id_check`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdSlot {
    op: &'static str,
    /// The vocabulary size: ids must be below it.
    limit: usize,
    /// Whether negative ids are allowed (ignored cross-entropy targets).
    negative_ok: bool,
}

/// Slots of the id report: one per (op, vocabulary, kind) checked between two synchronisations
/// (a training step uses two: the embedding's tokens and the loss's targets).
const ID_SLOTS: usize = 16;
/// A report slot with nothing found (every u64 bit set).
const ID_CLEAN: u64 = u64::MAX;

/// A HIP (ROCm 6/7) GPU.
pub struct HipDevice {
    pub(crate) ordinal: i32,
    pub(crate) info: DeviceInfo,
    pub(crate) arch_base: String,
    pub(crate) kernels: Kernels,
    pub(crate) blas: Mutex<RocblasHandle>,
    /// hipBLASLt, created on the first FP8 GEMM or GEMM epilogue ([`LazyLt`]).
    pub(crate) lt: LazyLt,
    /// Pinned host buffers for uploads ([`crate::memory::Staging`]), made on the first upload.
    pub(crate) staging: Mutex<Option<crate::memory::Staging>>,
    pub(crate) scratch: Mutex<Option<HipBuffer>>,
    pub(crate) mem: Arc<MemShared>,
    pub(crate) stream: Arc<Stream>,
    pub(crate) api: Arc<HipApi>,
    /// roctx ranges for profiler timelines, when the library is present.
    pub(crate) roctx: Option<crate::roctx::Roctx>,
    /// What each slot of `id_report` checks ([`HipDevice::queue_id_check`]).
    pub(crate) id_slots: Mutex<Vec<IdSlot>>,
    /// [`ID_SLOTS`] u64 on the device (as bytes): per slot, the smallest `(position << 32) | id` of an id
    /// outside its vocabulary since the last synchronize, or [`ID_CLEAN`].
    pub(crate) id_report: HipBuffer,
    /// What this device runs natively ([`duet_device::Runtime::capabilities`]).
    pub(crate) caps: Capabilities,
    /// Flash attention's inner product, or none (crates/hip ops/attention.rs).
    pub(crate) flash: FlashInner,
    /// A graph is being recorded on the stream ([`duet_device::Runtime::capture_begin`]).
    pub(crate) capturing: AtomicBool,
    /// The multi-tensor ops' uploaded chunk tables ([`HipDevice::table`]).
    pub(crate) tables: Mutex<Tables>,
    /// The FP8 compositions' kept intermediates (ops/fp8.rs `with_workspace`).
    pub(crate) workspaces: Mutex<Workspaces>,
}

impl HipDevice {
    /// The stream every op runs on (RCCL orders its own stream against it).
    pub(crate) fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// Opens GPU `ordinal`: loads the ROCm libraries, creates a stream and the BLAS handles,
    /// and compiles (or loads from the cache) every kernel module for the GPU's architecture.
    pub fn new(ordinal: usize) -> Result<Self> {
        let api = Arc::new(HipApi::load()?);
        let lost =
            |what: &str, e: HipError| unavailable(format!("{what}: {e}"), vec![api.name.clone()]);
        api.init()
            .map_err(|e| lost("hipInit failed (no AMD GPU or driver?)", e))?;
        let count = api
            .device_count()
            .map_err(|e| lost("hipGetDeviceCount failed", e))?;
        let ord = i32::try_from(ordinal)
            .ok()
            .filter(|&o| o < count)
            .ok_or_else(|| {
                unavailable(
                    format!("GPU {ordinal} requested but {count} HIP device(s) present"),
                    vec![api.name.clone()],
                )
            })?;
        api.set_device(ord)?;
        type A = sys::hipDeviceAttribute_t;
        let warp = api.attribute(A::hipDeviceAttributeWarpSize, ord)?;
        if !CHECKED_WAVES.contains(&warp) {
            return Err(unavailable(
                format!(
                    "the HIP device reports a wavefront of {warp} lanes; duet's HIP kernels are \
                     checked at {CHECKED_WAVES:?} only (crates/hip/testing/hip-on-cpu)"
                ),
                vec![api.name.clone()],
            ));
        }
        let pools = api
            .attribute(A::hipDeviceAttributeMemoryPoolsSupported, ord)
            .unwrap_or(0)
            != 0;
        let cus = api.attribute(A::hipDeviceAttributeMultiprocessorCount, ord)?;
        let lds = api.attribute(A::hipDeviceAttributeMaxSharedMemoryPerBlock, ord)?;
        let arch = api.arch_name(ord)?;
        let arch_base = arch.split(':').next().unwrap_or(&arch).to_string();
        let knobs = duet_device::knobs::device_knobs()?;
        let flash = FlashInner::choose(knobs.hip_no_flash, knobs.hip_flash_mfma, &arch_base, warp)?;
        let name = api.device_name(ord)?;
        let (_, total) = api.mem_info()?;
        let rtc = RtcApi::load()?;
        let rocblas = Arc::new(RocblasApi::load()?);
        let lt_api = LtApi::load().map(Arc::new).map_err(|e| e.to_string());
        let runtime = api.runtime_version()?;
        let toolchain = Toolchain {
            runtime,
            hiprtc: rtc
                .file
                .as_deref()
                .and_then(crate::toolchain::file_identity)
                .unwrap_or_else(|| rtc.name.clone()),
            comgr: Comgr::load(),
        };

        let stream = Arc::new(Stream::new(api.clone())?);
        let mem = Arc::new(MemShared::new(stream.clone(), pools));
        let kernels = Kernels::load(&api, &rtc, &toolchain, &arch, warp)?;
        let blas = RocblasHandle::new(rocblas.clone(), stream.clone())?;
        let lt = LazyLt::new(lt_api);
        let fp8 = lt.api.is_some() && matches!(arch_base.as_str(), "gfx942" | "gfx950");
        let rtc_v = rtc
            .version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_default();
        let file_or = |file: &Option<std::path::PathBuf>, name: &str| {
            file.as_ref()
                .map_or(name.to_string(), |f| f.display().to_string())
        };
        let details = vec![
            (
                "runtime".to_string(),
                format!(
                    "{} ({})",
                    version_string(runtime),
                    file_or(&api.file, &api.name)
                ),
            ),
            (
                "driver".into(),
                version_string(api.driver_version().unwrap_or(0)),
            ),
            ("target".into(), arch.clone()),
            ("wavefront".into(), warp.to_string()),
            ("compute_units".into(), cus.to_string()),
            ("lds_per_block".into(), lds.to_string()),
            ("flash_attention".into(), flash.describe().to_string()),
            (
                "hiprtc".into(),
                format!(
                    "{rtc_v} (hard-coded by ROCm; {})",
                    file_or(&rtc.file, &rtc.name)
                ),
            ),
            ("comgr".into(), toolchain.comgr_summary()),
            (
                "rocblas".into(),
                format!(
                    "{} ({}; atomics not allowed)",
                    rocblas
                        .version()
                        .unwrap_or_else(|e| format!("version unknown: {e}")),
                    file_or(&rocblas.file, &rocblas.name)
                ),
            ),
            ("stream_ordered_alloc".into(), pools.to_string()),
        ];
        let info = DeviceInfo {
            backend: "hip".into(),
            name,
            arch: arch_base.clone(),
            total_memory: total,
            supports_bf16: true,
            supports_fp8: fp8,
            details,
        };
        let id_report = HipBuffer::new(&mem, DType::U8, 8 * ID_SLOTS)?;
        // SAFETY: the report holds ID_SLOTS u64 (8 · ID_SLOTS bytes); 0xff bytes = ID_CLEAN.
        unsafe {
            api.memset_async(id_report.ptr(), 0xff, 1, 8 * ID_SLOTS, stream.raw())?;
        }
        let caps = Capabilities {
            graphs: api.graphs_supported(),
            flash_attention: flash.pairs(),
            gemm_epilogue: Self::epilogue_dtypes(lt.api.is_some(), knobs.hip_unfused),
            ..Capabilities::composed()
        };
        Ok(Self {
            ordinal: ord,
            info,
            arch_base,
            kernels,
            blas: Mutex::new(blas),
            lt,
            staging: Mutex::new(None),
            scratch: Mutex::new(None),
            mem,
            stream,
            api,
            roctx: crate::roctx::Roctx::load(),
            id_slots: Mutex::new(Vec::new()),
            id_report,
            caps,
            flash,
            capturing: AtomicBool::new(false),
            tables: Mutex::new(Default::default()),
            workspaces: Mutex::new(Default::default()),
        })
    }

    /// A launch of the kernel `name` on the device's stream (see [`Launch`]); the module comes
    /// from the name's prefix ([`crate::kernels::KernelModule::of`]).
    pub(crate) fn kernel(&self, name: &str) -> Result<Launch<'_>> {
        Ok(Launch::new(&self.stream, self.kernels.get(name)?))
    }

    /// The grid of a grid-stride loop over `items` work items in blocks of [`BLOCK`] threads
    /// (at most 65535 blocks).
    pub(crate) fn grid_1d(&self, items: usize) -> (u32, u32, u32) {
        (items.div_ceil(BLOCK as usize).clamp(1, 65_535) as u32, 1, 1)
    }

    /// The device's scratch area, at least `n` f32, reused across ops: held (locked) until the
    /// returned guard drops, so an op keeps it for every kernel it enqueues that uses it.
    ///
    /// The stream orders one op's passes, but not two ops enqueued from two threads: with the
    /// lock released after the pointer was handed out (as before), thread B's partial pass could
    /// land between thread A's partial and finish passes and overwrite A's partials, or B's
    /// growth free the buffer A was still enqueuing on (found by the HIP-on-CUDA platform: the
    /// conformance suite's cases share one device across test threads, and sum_squares,
    /// column sums and LayerNorm's parameter gradients came back wrong or nondeterministic).
    pub(crate) fn scratch(&self, n: usize) -> Result<ScratchGuard<'_>> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("scratch lock poisoned".into()))?;
        if s.as_ref().is_none_or(|b| b.len() < n) {
            *s = Some(HipBuffer::new(&self.mem, DType::F32, n.max(1024))?);
        }
        let ptr = s.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr());
        Ok(ScratchGuard { _held: s, ptr })
    }

    /// `out[j] += Σ_rows x[r, j]` in two deterministic passes (colsum_partial, colsum_finish).
    pub(crate) fn column_sum(
        &self,
        op: &'static str,
        x: &HipBuffer,
        rows: usize,
        cols: usize,
        out: &HipBuffer,
    ) -> Result<()> {
        let rpc = rows_per_chunk(rows);
        let chunks = rows.div_ceil(rpc).max(1);
        let scratch = self.scratch(chunks * cols)?;
        let part = scratch.ptr();
        let gx = grid_dim(op, cols.div_ceil(64))?;
        let sx = conv::float_suffix(op, x.dtype())?;
        // SAFETY: colsum_partial_T(const T* x, float* partial, u64 rows, u64 cols,
        // u64 rows_per_chunk): the caller checked x to hold rows × cols elements; `part` holds
        // chunks × cols f32 (just sized); 64 columns per block, one grid row per chunk.
        unsafe {
            self.kernel(&format!("colsum_partial_{sx}"))?
                .grid((gx.max(1), grid_dim(op, chunks)?, 1))
                .arg_buf(x)
                .arg_ptr(part)
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_u64(rpc as u64)
                .launch()?;
        }
        let so = conv::float_suffix(op, out.dtype())?;
        // SAFETY: colsum_finish_T(const float* partial, T* out, u64 chunks, u64 cols): the
        // chunks × cols partials written above; the caller checked `out` to hold cols elements;
        // 32 columns per block.
        unsafe {
            self.kernel(&format!("colsum_finish_{so}"))?
                .grid((grid_dim(op, cols.div_ceil(32))?, 1, 1))
                .arg_ptr(part)
                .arg_buf(out)
                .arg_u64(chunks as u64)
                .arg_u64(cols as u64)
                .launch()
        }
    }

    /// `out[slot] += Σ partial[0..count)` in f64, in a fixed order (sum_squares_finish in
    /// reduce.hip).
    ///
    /// # Safety
    /// `partial` must hold `count` f64 partial sums written by earlier queued work, and `slot`
    /// must lie inside `out` (f32).
    pub(crate) unsafe fn sum_squares_finish(
        &self,
        op: &'static str,
        partial: *const c_void,
        count: usize,
        out: &HipBuffer,
        slot: usize,
    ) -> Result<()> {
        let count = dim(op, "partials", count)?;
        // SAFETY: sum_squares_finish(const double* partial, int count, float* out, u64 slot),
        // one block; sizes from the caller.
        unsafe {
            self.kernel("sum_squares_finish")?
                .arg_ptr(partial)
                .arg_i32(count)
                .arg_buf(out)
                .arg_u64(slot as u64)
                .launch()
        }
    }

    /// Runs `f` on hipBLASLt, creating its handle on first use ([`LazyLt::with`]); when it is
    /// unavailable, `Unsupported` for `op` on `dtype` naming the cause.
    pub(crate) fn with_lt<R>(
        &self,
        op: &str,
        dtype: DType,
        f: impl FnOnce(&mut Lt) -> Result<R>,
    ) -> Result<R> {
        self.lt.with(
            op,
            dtype,
            |api| Lt::create(api, &self.api, &self.mem, self.ordinal),
            f,
        )
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    /// An error when a graph is being recorded (`what` may not happen then).
    pub(crate) fn not_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::Relaxed) {
            return Err(DeviceError::InvalidArgument(format!(
                "{what} while recording a HIP graph: the recording may only queue device work"
            )));
        }
        Ok(())
    }
}

/// The checks of token ids and targets, reported at the next synchronisation.
impl HipDevice {
    /// Queues a check of the i32 ids in `ids` (token ids, or targets with `negative_ok`)
    /// against `limit`: a kernel on the stream (kernels-hip/embedding.hip's `check_ids`) keeps
    /// the first bad id in the device's id report, which the next
    /// [`duet_device::Runtime::synchronize`] (or download) reads and reports, the first bad id of
    /// each op as [`DeviceError::InvalidArgument`] in the CPU backend's words: the deferred report
    /// of the CUDA backend's error word. No host work per call and nothing allocated, so it is
    /// recorded with a graph and runs at every replay. The op's own kernel still runs (NaN rows
    /// for bad token ids, a NaN loss and gradient row for a bad target).
    pub(crate) fn queue_id_check(
        &self,
        op: &'static str,
        ids: &HipBuffer,
        limit: usize,
        negative_ok: bool,
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let key = IdSlot {
            op,
            limit,
            negative_ok,
        };
        let lock = || {
            self.id_slots
                .lock()
                .map_err(|_| DeviceError::InvalidArgument("id check lock poisoned".into()))
        };
        let mut slots = lock()?;
        let slot = match slots.iter().position(|s| *s == key) {
            Some(i) => i,
            None => {
                if slots.len() >= ID_SLOTS {
                    // Every slot is taken: report what they hold, then start the table over
                    // (check_deferred reads the slots itself, so the lock is let go first).
                    drop(slots);
                    self.not_while_capturing(&format!("{op}: a new vocabulary check"))?;
                    self.stream.synchronize()?;
                    let pending = self.check_deferred();
                    slots = lock()?;
                    slots.clear();
                    pending?;
                }
                slots.push(key);
                slots.len() - 1
            }
        };
        drop(slots);
        let n = ids.len();
        if n as u64 >= 1 << 32 {
            return Err(duet_gpu::launch::kernel_too_large("HIP", op, "ids", n));
        }
        let limit = dim(op, "vocabulary", limit)?;
        // SAFETY: check_ids(const int* ids, u64 n, int limit, int negative_ok, u64* report):
        // `ids` holds n i32 (the caller checked it against the op's shape), `report` points at
        // slot < ID_SLOTS of the ID_SLOTS-u64 report.
        unsafe {
            self.kernel("check_ids")?
                .grid(self.grid_1d(n))
                .arg_buf(ids)
                .arg_u64(n as u64)
                .arg_i32(limit)
                .arg_i32(negative_ok as i32)
                .arg_ptr(self.id_report.ptr_at(8 * slot))
                .launch()
        }
    }

    /// Reads the id report (the stream is synchronized) and clears it: the first bad id of
    /// each op, in the CPU backend's words, or `Ok`.
    pub(crate) fn check_deferred(&self) -> Result<()> {
        let slots: Vec<IdSlot> = self
            .id_slots
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("id check lock poisoned".into()))?
            .clone();
        if slots.is_empty() {
            return Ok(());
        }
        let mut found = [0u64; ID_SLOTS];
        // SAFETY: `found` has room for the report's ID_SLOTS u64 and lives past the synchronize
        // below; the copy is ordered after every queued check.
        unsafe {
            self.api.memcpy_async(
                found.as_mut_ptr().cast(),
                self.id_report.ptr(),
                8 * ID_SLOTS,
                sys::hipMemcpyKind::hipMemcpyDeviceToHost,
                self.stream.raw(),
            )?;
        }
        self.stream.synchronize()?;
        let mut bad = Vec::new();
        for (c, &word) in slots.iter().zip(&found) {
            if word == ID_CLEAN {
                continue;
            }
            let (i, x) = ((word >> 32) as usize, word as u32 as i32);
            let (op, v) = (c.op, c.limit);
            bad.push(if c.negative_ok {
                format!("{op}: target {x} of row {i} is outside the vocabulary of {v}")
            } else {
                format!("{op}: token {x} at position {i} is outside the vocabulary of {v}")
            });
        }
        if bad.is_empty() {
            return Ok(());
        }
        // SAFETY: the report holds ID_SLOTS u64; 0xff bytes = ID_CLEAN; stream-ordered.
        unsafe {
            self.api.memset_async(
                self.id_report.ptr(),
                0xff,
                1,
                8 * ID_SLOTS,
                self.stream.raw(),
            )?;
        }
        Err(DeviceError::InvalidArgument(bad.join("; ")))
    }
}

/// Uploaded chunk tables, keyed by their bytes ([`HipDevice::table`], ops/mod.rs).
#[derive(Default)]
pub(crate) struct Tables {
    pub(crate) entries: Vec<(Vec<u8>, HipBuffer)>,
}

/// Intermediate buffers of the FP8 compositions (ops/fp8.rs), kept between calls.
#[derive(Default)]
pub(crate) struct Workspaces {
    pub(crate) idle: Vec<HipBuffer>,
}

/// The device's scratch area, locked for one op ([`HipDevice::scratch`]).
pub(crate) struct ScratchGuard<'a> {
    _held: std::sync::MutexGuard<'a, Option<HipBuffer>>,
    ptr: *mut c_void,
}

impl ScratchGuard<'_> {
    /// The area's device address (valid while the guard lives).
    pub(crate) fn ptr(&self) -> *mut c_void {
        self.ptr
    }
}
