//! [`CudaDevice`]: the device on one NVIDIA GPU, its construction and the helpers its ops share
//! ([`duet_device::Runtime`] is implemented in runtime.rs, each op family in `ops/<family>.rs`).
//!
//! Everything runs on one non-blocking stream in call order. cudarc's per-buffer event tracking
//! is switched off (it only matters with several streams), and buffers are handled as raw
//! device addresses inside [`CudaBuffer`]; every op validates shapes and dtypes on the host
//! before anything is queued.
//!
//! Deferred errors: kernels that meet an out-of-range token id or target set a bit in a device
//! word; [`duet_device::Runtime::synchronize`](duet_device::Runtime::synchronize) and the downloads read it
//! back and report [`DeviceError::InvalidArgument`] (the CPU backend checks these on the host
//! before running).

use crate::blas::Blas;
use crate::blaslt::BlasLt;
use crate::conv;
use crate::error::{self, BACKEND, drv};
use crate::kernels::{KernelModule, Kernels, Launch, grid_dim};
use crate::loader::{self, CudaLib};
use crate::memory::{CudaBuffer, DeviceMemory, MemTracker, Scratch, Staging, Tables};
use cudarc::driver::sys::{self as cu, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use duet_device::{Capabilities, DType, DeviceError, DeviceInfo, Result, check_dtype};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

/// Rows per chunk of the two-pass column reductions (bias, LayerNorm parameters, position
/// embedding). Fixed, so the summation order depends only on the shape.
pub(crate) const REDUCE_ROWS: usize = 64;
/// Most chunks one launch can have (gridDim.y).
const MAX_CHUNKS: usize = 65535;

/// Rows per chunk for `rows` rows: [`REDUCE_ROWS`], or more when that would need more than
/// [`MAX_CHUNKS`] chunks. A function of the shape only, so the result stays deterministic.
pub(crate) fn rows_per_chunk(rows: usize) -> usize {
    REDUCE_ROWS.max(rows.div_ceil(MAX_CHUNKS))
}
/// Threads per block of the row kernels that use one warp per row.
pub(crate) const ROW_BLOCK: u32 = 256;
const ROWS_PER_BLOCK: usize = (ROW_BLOCK / 32) as usize;
/// Threads per block of the element-wise kernels.
pub(crate) const EW_BLOCK: u32 = 256;

/// Bits of the device error word (see the kernels).
pub(crate) const ERR_TOKEN: u32 = 1;
pub(crate) const ERR_TARGET: u32 = 2;

/// Column-tile counters of the FP8 gradient kernels (u32 each): one per grid y index, of which
/// `CudaDevice::tile_grid` (ops/fp8.rs) allows at most 65535.
pub(crate) const FP8_COUNTERS: usize = 65536;

/// An NVIDIA GPU driven through the CUDA driver API, NVRTC kernels and cuBLAS.
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: Blas,
    pub(crate) kernels: Kernels,
    pub(crate) mem: Arc<MemTracker>,
    pub(crate) staging: Mutex<Option<Staging>>,
    pub(crate) scratch: Mutex<Scratch>,
    /// One u32 of deferred error bits written by kernels.
    pub(crate) err_word: DeviceMemory,
    pub(crate) info: DeviceInfo,
    pub(crate) sm_count: u32,
    /// The most shared memory a block may opt in to (bytes; 0 where the driver does not say),
    /// read once at open for the kernels that ask for more than the default 48 KiB.
    pub(crate) smem_optin: usize,
    /// Compute capability as major·10 + minor.
    pub(crate) cc: i32,
    /// cuBLASLt for FP8 GEMMs, created on first use.
    pub(crate) blas_lt: Mutex<Option<BlasLt>>,
    /// Chunk tables of the multi-tensor kernels (see ops/optim.rs `CudaDevice::table`).
    pub(crate) tables: Mutex<Tables>,
    /// Epilogues cuBLASLt refused once (`ops/gemm.rs` `REFUSED_*` bits): from then on the plain
    /// GEMM and the separate ops run (see `CudaDevice::lt_unless_refused`).
    pub(crate) lt_refused: std::sync::atomic::AtomicU8,
    /// Column-tile counters of the FP8 gradient kernels (ops/fp8.rs), zero between launches.
    pub(crate) fp8_counters: DeviceMemory,
    /// NVTX ranges for profiler timelines, when the library is present.
    pub(crate) nvtx: Option<crate::nvtx::Nvtx>,
    /// NVML for [`duet_device::Runtime::telemetry`](duet_device::Runtime::telemetry), loaded on first use
    /// (None when it does not load).
    pub(crate) nvml: std::sync::OnceLock<Option<crate::nvml::Nvml>>,
    /// A graph is being recorded (see graph.rs).
    pub(crate) capturing: std::sync::atomic::AtomicBool,
    /// Whether the fused paths (flash attention, GEMM epilogues) are offered.
    pub(crate) fused: std::sync::atomic::AtomicBool,
    /// What [`duet_device::Runtime::capabilities`](duet_device::Runtime::capabilities) answers with the fused
    /// paths off (`[0]`) and on (`[1]`), made once at start.
    pub(crate) caps: [Capabilities; 2],
    /// GEMM autotuning ([`duet_device::GemmOps::set_gemm_autotune`](duet_device::GemmOps::set_gemm_autotune);
    /// `DUET_GEMM_AUTOTUNE=1` starts on).
    pub(crate) autotune: std::sync::atomic::AtomicBool,
    /// Weight matrices [`duet_device::Fp8Ops::adamw_clipped_fp8`](duet_device::Fp8Ops::adamw_clipped_fp8) has
    /// updated and quantised in its fused kernel so far ([`CudaDevice::adamw_fp8_fused_count`]).
    pub(crate) adamw_fp8_fused: std::sync::atomic::AtomicU64,
}

/// Set to 1 to start with the fused paths off ([`CudaDevice::set_fused_ops`]).
pub const UNFUSED_ENV: &str = "DUET_CUDA_UNFUSED";
/// Set to 1 to start with GEMM autotuning on
/// ([`duet_device::GemmOps::set_gemm_autotune`](duet_device::GemmOps::set_gemm_autotune)).
pub const AUTOTUNE_ENV: &str = "DUET_GEMM_AUTOTUNE";

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.info.name)
            .field("arch", &self.info.arch)
            .finish_non_exhaustive()
    }
}

fn unavailable(reason: String, tried: Vec<String>) -> DeviceError {
    DeviceError::Unavailable {
        backend: BACKEND,
        reason,
        tried,
    }
}

/// Runs `f`, turning a panic inside cudarc (a library or symbol that cannot be loaded) into
/// [`DeviceError::Unavailable`].
fn guarded<T>(what: &str, tried: &[String], f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(unavailable(
            format!("{what} failed: {}", error::panic_message(&*p)),
            tried.to_vec(),
        )),
    }
}

pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| DeviceError::Driver {
        backend: BACKEND,
        call: what.into(),
        message: "lock poisoned by an earlier panic".into(),
    })
}

/// The grid of a row kernel that gives each of `rows` rows one warp ([`ROW_BLOCK`] threads
/// per block), or [`crate::kernels::too_large`].
pub(crate) fn rows_grid(op: &'static str, rows: usize) -> Result<(u32, u32, u32)> {
    Ok((grid_dim(op, rows.div_ceil(ROWS_PER_BLOCK))?, 1, 1))
}

/// Checks that every buffer in `bufs` has dtype `want`.
pub(crate) fn same_dtype(op: &'static str, want: DType, bufs: &[&CudaBuffer]) -> Result<()> {
    for b in bufs {
        check_dtype(op, *b, want)?;
    }
    Ok(())
}

impl CudaDevice {
    /// The device's context (for the NCCL communicator).
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every op runs on (NCCL orders its own stream against it).
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Opens GPU `ordinal`: loads the driver, NVRTC and cuBLAS, creates a context and a stream,
    /// and loads every kernel module (from the disk cache, or compiled by NVRTC for the GPU's
    /// compute capability). A machine without a usable driver, library or device gets
    /// [`DeviceError::Unavailable`] saying what was tried.
    pub fn new(ordinal: usize) -> Result<Self> {
        let found = loader::require(&CudaLib::ALL)?;
        let locations: Vec<String> = found
            .iter()
            .map(|f| format!("{:?}: {}", f.lib, f.location))
            .collect();
        guarded("CUDA initialisation", &locations, || {
            Self::init(ordinal, &locations)
        })
    }

    /// Number of CUDA devices (0 without a driver or GPU).
    pub fn device_count() -> Result<usize> {
        loader::require(&[CudaLib::Driver])?;
        guarded(
            "cuDeviceGetCount",
            &[],
            || match CudaContext::device_count() {
                Ok(n) => Ok(n.max(0) as usize),
                Err(e) if e.0 == cu::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
                Err(e) => Err(unavailable(
                    format!(
                        "the CUDA driver could not be initialised: {}",
                        error::driver("cuInit", e)
                    ),
                    vec![],
                )),
            },
        )
    }

    /// Whether at least one CUDA device can be used.
    pub fn is_available() -> bool {
        Self::device_count().is_ok_and(|n| n > 0)
    }

    fn init(ordinal: usize, locations: &[String]) -> Result<Self> {
        let count = Self::device_count()?;
        if ordinal >= count {
            return Err(unavailable(
                format!("CUDA device {ordinal} requested, but {count} device(s) present"),
                locations.to_vec(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            unavailable(
                format!(
                    "could not create a context: {}",
                    error::driver("cuCtxCreate", e)
                ),
                locations.to_vec(),
            )
        })?;
        // SAFETY: all work of this device goes to the one stream created below, so cudarc's
        // cross-stream event tracking is not needed; buffers are freed stream-ordered.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))?;
        let arch = conv::arch_name(major, minor);
        let kernels = Kernels::load_all(&ctx, &arch)?;
        let blas = Blas::new(ctx.clone(), stream.clone())?;
        let mem = Arc::new(MemTracker::default());
        let err_word = DeviceMemory::zeroed(&ctx, &stream, 4, &mem)?;
        let fp8_counters = DeviceMemory::zeroed(&ctx, &stream, 4 * FP8_COUNTERS, &mem)?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let smem_optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .unwrap_or(0)
            .max(0) as usize;
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let total = ctx.total_mem().map_err(drv("cuDeviceTotalMem"))? as u64;
        let mut driver_version = 0i32;
        // SAFETY: plain out-parameter.
        unsafe { cu::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(drv("cuDriverGetVersion"))?;
        let (nv_major, nv_minor) = crate::kernels::nvrtc_version()?;
        let cc = major * 10 + minor;
        let mut details = vec![
            ("ordinal".to_string(), ordinal.to_string()),
            ("compute capability".into(), format!("{major}.{minor}")),
            ("multiprocessors".into(), sm_count.to_string()),
            (
                "driver".into(),
                format!(
                    "CUDA {}.{}",
                    driver_version / 1000,
                    (driver_version % 1000) / 10
                ),
            ),
            ("nvrtc".into(), format!("{nv_major}.{nv_minor}")),
            ("cublas".into(), blas.version.clone()),
            ("kernels".into(), kernels.summary.clone()),
        ];
        details.extend(locations.iter().map(|l| ("library".to_string(), l.clone())));
        let info = DeviceInfo {
            backend: BACKEND.into(),
            name,
            arch,
            total_memory: total,
            supports_bf16: cc >= 80,
            supports_fp8: cc >= 89,
            details,
        };
        let mut dev = Self {
            ctx,
            stream,
            blas,
            kernels,
            mem,
            staging: Mutex::new(None),
            scratch: Mutex::new(Scratch::default()),
            err_word,
            info,
            sm_count,
            smem_optin,
            cc,
            blas_lt: Mutex::new(None),
            tables: Mutex::new(Tables::default()),
            lt_refused: std::sync::atomic::AtomicU8::new(0),
            fp8_counters,
            capturing: std::sync::atomic::AtomicBool::new(false),
            nvtx: crate::nvtx::Nvtx::load(),
            nvml: std::sync::OnceLock::new(),
            fused: std::sync::atomic::AtomicBool::new(
                !duet_device::knobs::device_knobs()?.cuda_unfused,
            ),
            autotune: std::sync::atomic::AtomicBool::new(
                duet_device::knobs::device_knobs()?.gemm_autotune,
            ),
            adamw_fp8_fused: std::sync::atomic::AtomicU64::new(0),
            caps: [Capabilities::composed(), Capabilities::composed()],
        };
        dev.caps = [dev.native_paths(false), dev.native_paths(true)];
        Ok(dev)
    }

    /// The capabilities with the fused paths off or on: graphs, autotuning and the scale
    /// stride always; GEMM epilogues (sm_80+, 16-bit), FP8 epilogues (sm_89+) and flash
    /// attention (the dtype and head-size pairs a kernel variant covers) when on.
    fn native_paths(&self, fused: bool) -> Capabilities {
        let mut c = Capabilities {
            graphs: true,
            gemm_autotune: true,
            fp8_scale_inv_stride: (crate::blaslt::SCALE_ALIGN / 4) as usize,
            ..Capabilities::composed()
        };
        if fused {
            let halves = [DType::BF16, DType::F16];
            c.gemm_epilogue = halves
                .into_iter()
                .filter(|&d| self.epilogue_supported(d))
                .collect();
            if self.info.supports_fp8 {
                c.fp8_gemm_epilogue = halves.to_vec();
            }
            c.flash_attention = self.flash_pairs();
        }
        c
    }

    /// Allows TF32 tensor cores for f32 GEMMs (off by default: f32 GEMMs are true FP32 so the
    /// CPU and GPU agree to FP32 rounding). `DUET_CUDA_ALLOW_TF32=1` sets it at start.
    pub fn set_allow_tf32(&self, allow: bool) {
        self.blas.set_allow_tf32(allow);
    }

    /// Offers (default) or withholds the fused paths: flash attention and GEMM epilogues
    /// (the capabilities list neither while off, so the
    /// engine runs the separate ops). For A/B comparisons; `DUET_CUDA_UNFUSED=1` starts off.
    pub fn set_fused_ops(&self, on: bool) {
        self.fused.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn gemm_autotune(&self) -> bool {
        self.autotune.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn fused_ops(&self) -> bool {
        self.fused.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// The entry point `name` of `module`.
    pub(crate) fn func(&self, module: KernelModule, name: &str) -> Result<CudaFunction> {
        self.kernels.get(module, name)
    }

    /// A launch of the entry point `name` of `module` on the device's stream (see [`Launch`]).
    pub(crate) fn kernel(&self, module: KernelModule, name: &str) -> Result<Launch<'_>> {
        Ok(self.launcher(&self.func(module, name)?))
    }

    /// A launch of `f` (looked up with [`Self::func`]) on the device's stream.
    pub(crate) fn launcher(&self, f: &CudaFunction) -> Launch<'_> {
        Launch::new(&self.stream, f.clone())
    }

    /// The grid of a grid-stride loop over `items` work items in blocks of [`EW_BLOCK`]
    /// threads: enough blocks to fill the GPU, capped.
    pub(crate) fn grid_1d(&self, items: usize) -> (u32, u32, u32) {
        let blocks = items.div_ceil(EW_BLOCK as usize).max(1);
        (blocks.min(self.sm_count as usize * 32) as u32, 1, 1)
    }

    /// Reads and clears the device error word.
    pub(crate) fn check_deferred(&self) -> Result<()> {
        self.bind()?;
        let mut word = [0u32; 1];
        // SAFETY: the error word is a live 4-byte allocation; the copy is ordered after all
        // queued kernels and completes before returning (pageable destination).
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut word,
                self.err_word.ptr(),
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        if word[0] == 0 {
            return Ok(());
        }
        // SAFETY: clears the same 4-byte allocation, stream-ordered.
        unsafe {
            cudarc::driver::result::memset_d8_async(
                self.err_word.ptr(),
                0,
                4,
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemsetD8Async"))?;
        let mut what = Vec::new();
        if word[0] & ERR_TOKEN != 0 {
            what.push("embedding: a token id was outside the vocabulary");
        }
        if word[0] & ERR_TARGET != 0 {
            what.push("cross_entropy: a target was outside the vocabulary (its loss is NaN)");
        }
        Err(DeviceError::InvalidArgument(what.join("; ")))
    }

    /// Column sums `out[col] += Σ_rows x[row, col]` in two deterministic passes.
    ///
    /// # Safety
    /// `x` must hold `rows × cols` elements of `x_dtype` and `out` at least `cols` elements of
    /// `out_dtype` (both float types).
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn column_sum(
        &self,
        op: &'static str,
        scratch: &mut Scratch,
        x: u64,
        x_dtype: DType,
        out: u64,
        out_dtype: DType,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let rpc = rows_per_chunk(rows);
        let chunks = rows.div_ceil(rpc);
        let partial = scratch.get(&self.ctx, &self.stream, chunks * cols * 4, &self.mem)?;
        // 16-byte loads where every row is whole 16-byte vectors (32 lanes × one vector of
        // columns per block), else two scalar columns per lane.
        let vec = 16 / x_dtype.size_bytes();
        let vectorised = x.is_multiple_of(16) && cols.is_multiple_of(vec);
        let (name, cols_per_block) = if vectorised {
            ("colsum_partial_vec", 32 * vec)
        } else {
            ("colsum_partial", 64)
        };
        let grid = (
            grid_dim(op, cols.div_ceil(cols_per_block))?,
            grid_dim(op, chunks)?,
            1,
        );
        let sx = conv::float_suffix(op, x_dtype)?;
        // SAFETY: `x` covers rows × cols elements (caller), `partial` chunks × cols f32 (just
        // sized); the signature is colsum_partial(const T*, float*, u64, u64, u64).
        unsafe {
            self.kernel(KernelModule::Reduce, &format!("{name}_{sx}"))?
                .grid(grid)
                .block((32, 8, 1))
                .arg_ptr(x)
                .arg_ptr(partial)
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_u64(rpc as u64)
                .launch()?;
        }
        // SAFETY: `out` covers cols elements of out_dtype (caller), `partial` chunks × cols.
        unsafe { self.colsum_finish(op, partial, out, out_dtype, chunks, cols) }
    }

    /// `out[col] += Σ_k partial[k·cols + col]` (colsum_finish in reduce.cu, fixed order).
    ///
    /// # Safety
    /// `partial` must hold `chunks × cols` f32 and `out` at least `cols` elements of
    /// `out_dtype`.
    pub(crate) unsafe fn colsum_finish(
        &self,
        op: &'static str,
        partial: u64,
        out: u64,
        out_dtype: DType,
        chunks: usize,
        cols: usize,
    ) -> Result<()> {
        let so = conv::float_suffix(op, out_dtype)?;
        // SAFETY: colsum_finish(const float*, G*, u64 chunks, u64 cols), block (32, 8), one
        // block per 32 columns; sizes from the caller.
        unsafe {
            self.kernel(KernelModule::Reduce, &format!("colsum_finish_{so}"))?
                .grid((grid_dim(op, cols.div_ceil(32))?, 1, 1))
                .block((32, 8, 1))
                .arg_ptr(partial)
                .arg_ptr(out)
                .arg_u64(chunks as u64)
                .arg_u64(cols as u64)
                .launch()
        }
    }

    /// The cuBLASLt handle (created on first use), for one call.
    pub(crate) fn with_lt<R>(
        &self,
        op: &str,
        f: impl FnOnce(&mut BlasLt) -> Result<R>,
    ) -> Result<R> {
        self.bind()?;
        let mut lt = lock(&self.blas_lt, op)?;
        if lt.is_none() {
            *lt = Some(BlasLt::new(&self.ctx, &self.stream, self.cc, &self.mem)?);
        }
        let lt = lt.as_mut().expect("created above");
        lt.may_tune =
            self.gemm_autotune() && !self.capturing.load(std::sync::atomic::Ordering::Relaxed);
        f(lt)
    }
}
