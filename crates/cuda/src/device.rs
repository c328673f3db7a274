//! [`CudaDevice`]: the `Device` implementation on one NVIDIA GPU.
//!
//! Everything runs on one non-blocking stream in call order. cudarc's per-buffer event tracking
//! is switched off (it only matters with several streams), and buffers are handled as raw
//! device addresses inside [`CudaBuffer`]; every op validates shapes and dtypes on the host
//! before anything is queued.
//!
//! Deferred errors: kernels that meet an out-of-range token id or target set a bit in a device
//! word; [`Device::synchronize`] and the downloads read it back and report
//! [`DeviceError::InvalidArgument`] (the CPU backend checks these on the host before running).

use crate::blas::Blas;
use crate::blaslt::{self, BlasLt};
use crate::conv;
use crate::error::{self, BACKEND, dim, drv};
use crate::kernels::{self, Arg, KernelModule, Kernels};
use crate::loader::{self, CudaLib};
use crate::memory::{CudaBuffer, DeviceMemory, MemTracker, Scratch, Staging, align_up};
use cudarc::driver::sys::{self as cu, CUdevice_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig};
use duet_device::{
    AdamWStep, Buffer, DType, Device, DeviceError, DeviceInfo, Fp8Format, GemmDesc, MemoryStats,
    Result, check_dtype, check_len, check_min_len, check_range,
};
use half::{bf16, f16};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

mod embedding;
mod epilogue;
mod flash;
mod fp8;
mod graph;
pub use graph::CudaStepGraph;
mod layernorm;
mod multi;

/// Rows per chunk of the two-pass column reductions (bias, LayerNorm parameters, position
/// embedding). Fixed, so the summation order depends only on the shape.
const REDUCE_ROWS: usize = 64;
/// Most chunks one launch can have (gridDim.y).
const MAX_CHUNKS: usize = 65535;

/// Rows per chunk for `rows` rows: [`REDUCE_ROWS`], or more when that would need more than
/// [`MAX_CHUNKS`] chunks. A function of the shape only, so the result stays deterministic.
fn rows_per_chunk(rows: usize) -> usize {
    REDUCE_ROWS.max(rows.div_ceil(MAX_CHUNKS))
}
/// Threads per block of the row kernels that use one warp per row.
const ROW_BLOCK: u32 = 256;
const ROWS_PER_BLOCK: usize = (ROW_BLOCK / 32) as usize;
/// Threads per block of the element-wise kernels.
const EW_BLOCK: u32 = 256;

/// Bits of the device error word (see the kernels).
const ERR_TOKEN: u32 = 1;
const ERR_TARGET: u32 = 2;

/// An NVIDIA GPU driven through the CUDA driver API, NVRTC kernels and cuBLAS.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Blas,
    kernels: Kernels,
    mem: Arc<MemTracker>,
    staging: Mutex<Option<Staging>>,
    scratch: Mutex<Scratch>,
    /// One u32 of deferred error bits written by kernels.
    err_word: DeviceMemory,
    info: DeviceInfo,
    sm_count: u32,
    /// Compute capability as major·10 + minor.
    cc: i32,
    /// cuBLASLt for FP8 GEMMs, created on first use.
    blas_lt: Mutex<Option<BlasLt>>,
    /// Chunk tables of the multi-tensor kernels (see device/multi.rs).
    tables: Mutex<multi::Tables>,
    /// Epilogues cuBLASLt refused once (`epilogue::REFUSED_*` bits): from then on the plain
    /// GEMM and the separate ops run (see `CudaDevice::lt_unless_refused`).
    lt_refused: std::sync::atomic::AtomicU8,
    /// Column-tile counters of the FP8 gradient kernels (device/fp8.rs), zero between launches.
    fp8_counters: DeviceMemory,
    /// NVTX ranges for profiler timelines, when the library is present.
    nvtx: Option<crate::nvtx::Nvtx>,
    /// NVML for [`Device::telemetry`], loaded on first use (None when it does not load).
    nvml: std::sync::OnceLock<Option<crate::nvml::Nvml>>,
    /// A graph is being recorded (see device/graph.rs).
    capturing: std::sync::atomic::AtomicBool,
    /// Whether the fused paths (flash attention, GEMM epilogues) are offered.
    fused: std::sync::atomic::AtomicBool,
    /// GEMM autotuning ([`Device::set_gemm_autotune`]; `DUET_GEMM_AUTOTUNE=1` starts on).
    autotune: std::sync::atomic::AtomicBool,
    /// Weight matrices [`Device::adamw_clipped_fp8`] has updated and quantised in its fused
    /// kernel so far ([`CudaDevice::adamw_fp8_fused_count`]).
    adamw_fp8_fused: std::sync::atomic::AtomicU64,
}

/// Set to 1 to start with the fused paths off ([`CudaDevice::set_fused_ops`]).
pub const UNFUSED_ENV: &str = "DUET_CUDA_UNFUSED";
/// Set to 1 to start with GEMM autotuning on ([`Device::set_gemm_autotune`]).
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

fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| DeviceError::Driver {
        backend: BACKEND,
        call: what.into(),
        message: "lock poisoned by an earlier panic".into(),
    })
}

fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: block,
        shared_mem_bytes: 0,
    }
}

fn grid_dim(op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| error::too_large(op, "grid", blocks))
}

/// The launch of a row kernel that gives each of `rows` rows one warp ([`ROW_BLOCK`] threads
/// per block).
fn warp_row_cfg(op: &'static str, rows: usize) -> Result<LaunchConfig> {
    Ok(cfg(
        (grid_dim(op, rows.div_ceil(ROWS_PER_BLOCK))?, 1, 1),
        (ROW_BLOCK, 1, 1),
    ))
}

/// The f32/f16/bf16 suffix of an activation-type buffer, or `Unsupported`.
fn float_sfx(op: &'static str, d: DType) -> Result<&'static str> {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => Ok(conv::kernel_suffix(d).expect("float")),
        dtype => Err(DeviceError::Unsupported {
            op: op.into(),
            dtype,
        }),
    }
}

/// Suffix of a parameter or gradient buffer that must be either the activation dtype or f32.
fn wide_sfx(op: &'static str, act: DType, what: &str, d: DType) -> Result<&'static str> {
    if d == act || d == DType::F32 {
        float_sfx(op, d)
    } else {
        Err(DeviceError::Unsupported {
            op: format!("{op} ({what} must be {act} or f32 with {act} activations)"),
            dtype: d,
        })
    }
}

fn same_dtype(op: &'static str, want: DType, bufs: &[&CudaBuffer]) -> Result<()> {
    for b in bufs {
        check_dtype(op, *b, want)?;
    }
    Ok(())
}

fn mul(op: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DeviceError::Shape {
            op,
            detail: format!("{dims:?} overflows"),
        })
}

fn integral(value: f32, min: f64, max: f64, what: &str) -> Result<f64> {
    let v = value as f64;
    if v.fract() == 0.0 && v >= min && v <= max {
        Ok(v)
    } else {
        Err(DeviceError::InvalidArgument(format!(
            "fill: {value} is not representable as {what}"
        )))
    }
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
        let fp8_counters = DeviceMemory::zeroed(&ctx, &stream, 4 * fp8::FP8_COUNTERS, &mem)?;
        let sm_count = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("cuDeviceGetAttribute"))?
            .max(1) as u32;
        let name = ctx.name().map_err(drv("cuDeviceGetName"))?;
        let total = ctx.total_mem().map_err(drv("cuDeviceTotalMem"))? as u64;
        let mut driver_version = 0i32;
        // SAFETY: plain out-parameter.
        unsafe { cu::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(drv("cuDriverGetVersion"))?;
        let (nv_major, nv_minor) = kernels::nvrtc_version()?;
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
        Ok(Self {
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
            cc,
            blas_lt: Mutex::new(None),
            tables: Mutex::new(multi::Tables::default()),
            lt_refused: std::sync::atomic::AtomicU8::new(0),
            fp8_counters,
            capturing: std::sync::atomic::AtomicBool::new(false),
            nvtx: crate::nvtx::Nvtx::load(),
            nvml: std::sync::OnceLock::new(),
            fused: std::sync::atomic::AtomicBool::new(
                std::env::var(UNFUSED_ENV).map_or(true, |v| v.trim() != "1"),
            ),
            autotune: std::sync::atomic::AtomicBool::new(
                std::env::var(AUTOTUNE_ENV).is_ok_and(|v| v.trim() == "1"),
            ),
            adamw_fp8_fused: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Allows TF32 tensor cores for f32 GEMMs (off by default: f32 GEMMs are true FP32 so the
    /// CPU and GPU agree to FP32 rounding). `DUET_CUDA_ALLOW_TF32=1` sets it at start.
    pub fn set_allow_tf32(&self, allow: bool) {
        self.blas.set_allow_tf32(allow);
    }

    /// Offers (default) or withholds the fused paths: flash attention and GEMM epilogues
    /// (`supports_flash_attention` / `supports_gemm_epilogue` answer false while off, so the
    /// engine runs the separate ops). For A/B comparisons; `DUET_CUDA_UNFUSED=1` starts off.
    pub fn set_fused_ops(&self, on: bool) {
        self.fused.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn gemm_autotune(&self) -> bool {
        self.autotune.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn fused_ops(&self) -> bool {
        self.fused.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    fn func(&self, module: KernelModule, name: &str) -> Result<CudaFunction> {
        self.kernels.get(module, name)
    }

    /// Blocks for a grid-stride loop over `items` work items: enough to fill the GPU, capped.
    fn grid_1d(&self, items: usize, block: u32) -> u32 {
        let blocks = items.div_ceil(block as usize).max(1);
        blocks.min(self.sm_count as usize * 32) as u32
    }

    /// A 1-D grid-stride launch of `name` over `items` work items.
    ///
    /// # Safety
    /// As [`kernels::launch`].
    unsafe fn launch_1d(
        &self,
        module: KernelModule,
        name: &str,
        items: usize,
        args: &[Arg],
    ) -> Result<()> {
        let f = self.func(module, name)?;
        let c = cfg((self.grid_1d(items, EW_BLOCK), 1, 1), (EW_BLOCK, 1, 1));
        // SAFETY: forwarded from the caller.
        unsafe { kernels::launch(&self.stream, &f, c, args) }
    }

    /// Reads and clears the device error word.
    fn check_deferred(&self) -> Result<()> {
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
    unsafe fn column_sum(
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
        let fp = self.func(
            KernelModule::Reduce,
            &format!("{name}_{}", float_sfx(op, x_dtype)?),
        )?;
        let grid = (
            grid_dim(op, cols.div_ceil(cols_per_block))?,
            grid_dim(op, chunks)?,
            1,
        );
        // SAFETY: `x` covers rows × cols elements (caller), `partial` chunks × cols f32 (just
        // sized); the signature is colsum_partial(const T*, float*, u64, u64, u64).
        unsafe {
            kernels::launch(
                &self.stream,
                &fp,
                cfg(grid, (32, 8, 1)),
                &[
                    x.into(),
                    partial.into(),
                    (rows as u64).into(),
                    (cols as u64).into(),
                    (rpc as u64).into(),
                ],
            )?;
        }
        // SAFETY: `out` covers cols elements of out_dtype (caller), `partial` chunks × cols.
        unsafe { self.colsum_finish(op, partial, out, out_dtype, chunks, cols) }
    }

    /// `out[col] += Σ_k partial[k·cols + col]` (colsum_finish in reduce.cu, fixed order).
    ///
    /// # Safety
    /// `partial` must hold `chunks × cols` f32 and `out` at least `cols` elements of
    /// `out_dtype`.
    unsafe fn colsum_finish(
        &self,
        op: &'static str,
        partial: u64,
        out: u64,
        out_dtype: DType,
        chunks: usize,
        cols: usize,
    ) -> Result<()> {
        let f = self.func(
            KernelModule::Reduce,
            &format!("colsum_finish_{}", float_sfx(op, out_dtype)?),
        )?;
        // SAFETY: colsum_finish(const float*, G*, u64 chunks, u64 cols), block (32, 8), one
        // block per 32 columns; sizes from the caller.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid_dim(op, cols.div_ceil(32))?, 1, 1), (32, 8, 1)),
                &[
                    partial.into(),
                    out.into(),
                    (chunks as u64).into(),
                    (cols as u64).into(),
                ],
            )
        }
    }
}

impl CudaDevice {
    /// `out[slot] += Σ partial[0..count)` in a fixed order (sum_squares_finish in reduce.cu).
    ///
    /// # Safety
    /// `partial` must hold `count` f64 partial sums written by earlier queued work, and `slot`
    /// must lie inside `out` (f32).
    pub(super) unsafe fn sum_squares_finish(
        &self,
        op: &'static str,
        partial: u64,
        count: usize,
        out: &CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        let count = i32::try_from(count).map_err(|_| error::too_large(op, "partials", count))?;
        let ff = self.func(KernelModule::Reduce, "sum_squares_finish")?;
        // SAFETY: sum_squares_finish(const double*, int count, float*, u64 slot), one block of
        // 256 threads; sizes from the caller.
        unsafe {
            kernels::launch(
                &self.stream,
                &ff,
                cfg((1, 1, 1), (256, 1, 1)),
                &[
                    partial.into(),
                    count.into(),
                    out.ptr().into(),
                    (slot as u64).into(),
                ],
            )
        }
    }

    /// The cuBLASLt handle (created on first use), for one call.
    pub(super) fn with_lt<R>(
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

impl Device for CudaDevice {
    type Buffer = CudaBuffer;
    type Graph = graph::CudaStepGraph;

    fn range_push(&self, name: &str) {
        if let Some(n) = &self.nvtx {
            n.push(name);
        }
    }

    fn range_pop(&self) {
        if let Some(n) = &self.nvtx {
            n.pop();
        }
    }

    fn info(&self) -> DeviceInfo {
        let mut info = self.info.clone();
        info.details.push((
            "f32 gemm".into(),
            if self.blas.allow_tf32() {
                "TF32 tensor cores (allowed)".into()
            } else {
                "FP32 (no TF32)".into()
            },
        ));
        info
    }

    // ------------------------------------------------------------------ memory and copies

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuffer> {
        let bytes = len.checked_mul(dtype.size_bytes()).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("alloc: {len} × {dtype} overflows"))
        })?;
        if bytes == 0 {
            return Ok(CudaBuffer::new(None, dtype, 0));
        }
        let mem = DeviceMemory::zeroed(&self.ctx, &self.stream, bytes, &self.mem)?;
        Ok(CudaBuffer::new(Some(mem), dtype, len))
    }

    fn upload_bytes(&self, src: &[u8], dst: &mut CudaBuffer, offset: usize) -> Result<()> {
        self.not_while_capturing("uploading")?;
        const OP: &str = "upload_bytes";
        let size = dst.dtype().size_bytes();
        if !src.len().is_multiple_of(size) {
            return Err(DeviceError::Shape {
                op: OP,
                detail: format!(
                    "{} bytes is not a whole number of {} elements",
                    src.len(),
                    dst.dtype()
                ),
            });
        }
        check_range(OP, offset, src.len() / size, dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut staging = lock(&self.staging, OP)?;
        if staging.is_none() {
            *staging = Some(Staging::new(&self.ctx)?);
        }
        staging
            .as_mut()
            .expect("initialised above")
            .upload(&self.stream, src, dst.ptr_at(offset))
    }

    fn download_bytes(&self, src: &CudaBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.not_while_capturing("downloading")?;
        check_range("download_bytes", offset, len, src.len())?;
        let mut out = vec![0u8; len * src.dtype().size_bytes()];
        if !out.is_empty() {
            self.bind()?;
            // SAFETY: the source range lies inside `src` (checked); `out` has exactly its size.
            // The copy is ordered after all queued work on the stream and, with a pageable
            // destination, has completed when the call returns; the synchronize below makes
            // sure and reports earlier asynchronous failures.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(
                    &mut out,
                    src.ptr_at(offset),
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("cuMemcpyDtoHAsync"))?;
        }
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        self.check_deferred()?;
        Ok(out)
    }

    fn copy(
        &self,
        src: &CudaBuffer,
        src_offset: usize,
        dst: &mut CudaBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        const OP: &str = "copy";
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: OP,
                expected: dst.dtype(),
                got: src.dtype(),
            });
        }
        check_range(OP, src_offset, len, src.len())?;
        check_range(OP, dst_offset, len, dst.len())?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges were checked against their (distinct, live) allocations.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr_at(dst_offset),
                src.ptr_at(src_offset),
                len * src.dtype().size_bytes(),
                self.stream.cu_stream(),
            )
        }
        .map_err(drv("cuMemcpyDtoDAsync"))
    }

    fn fill(&self, dst: &mut CudaBuffer, value: f32) -> Result<()> {
        enum Pattern {
            B8(u8),
            B16(u16),
            B32(u32),
        }
        let dtype = dst.dtype();
        let pattern = match dtype {
            DType::F32 => Pattern::B32(value.to_bits()),
            DType::F16 => Pattern::B16(f16::from_f32(value).to_bits()),
            DType::BF16 => Pattern::B16(bf16::from_f32(value).to_bits()),
            DType::I32 => Pattern::B32(
                integral(value, i32::MIN as f64, i32::MAX as f64, "i32")? as i32 as u32
            ),
            DType::U8 => Pattern::B8(integral(value, 0.0, 255.0, "u8")? as u8),
            fp8 => Pattern::B8(Fp8Format::of(fp8).expect("fp8 dtype").encode(value)),
        };
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let (ptr, s) = (dst.ptr(), self.stream.cu_stream());
        // SAFETY: `n` elements of the element size used below are exactly `dst`'s allocation.
        let r = unsafe {
            match pattern {
                Pattern::B8(v) => cu::cuMemsetD8Async(ptr, v, n, s),
                Pattern::B16(v) => cu::cuMemsetD16Async(ptr, v, n, s),
                Pattern::B32(v) => cu::cuMemsetD32Async(ptr, v, n, s),
            }
        };
        r.result().map_err(drv("cuMemsetAsync"))
    }

    fn supports_capture(&self) -> bool {
        true
    }

    fn time_ms<E: From<DeviceError>>(
        &self,
        work: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        self.not_while_capturing("timing")?;
        let timed = Some(cu::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
        let end = self.ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
        start.record(&self.stream).map_err(drv("cuEventRecord"))?;
        work()?;
        end.record(&self.stream).map_err(drv("cuEventRecord"))?;
        end.synchronize().map_err(drv("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
        Ok(ms as f64)
    }

    fn timer_kind(&self) -> &'static str {
        "device events"
    }

    fn capture_begin(&self) -> Result<()> {
        self.capture_begin_impl()
    }

    fn capture_end(&self) -> Result<graph::CudaStepGraph> {
        self.capture_end_impl()
    }

    fn replay(&self, graph: &graph::CudaStepGraph) -> Result<()> {
        self.replay_impl(graph)
    }

    fn synchronize(&self) -> Result<()> {
        self.not_while_capturing("synchronising")?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        self.ctx.check_err().map_err(drv("deferred"))?;
        self.check_deferred()
    }

    fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            current: self.mem.current(),
            peak: self.mem.peak(),
            driver: self
                .ctx
                .mem_get_info()
                .ok()
                .map(|(free, total)| (free as u64, total as u64)),
        }
    }

    fn reset_peak_memory(&self) {
        self.mem.reset_peak();
    }

    fn telemetry(&self) -> Option<duet_device::Telemetry> {
        self.nvml
            .get_or_init(|| {
                let attr = |a| self.ctx.attribute(a).ok().map(|v| v as u32);
                crate::nvml::Nvml::load(
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
                )
            })
            .as_ref()?
            .sample()
    }

    // ------------------------------------------------------------------ GEMM

    fn gemm(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        // Autotuned 16-bit GEMMs go through cuBLASLt, where the algorithm can be chosen.
        let lt_ok = matches!(a.dtype(), DType::BF16 | DType::F16)
            && b.dtype() == a.dtype()
            && c.dtype() == a.dtype()
            && desc.batch == 1;
        if lt_ok && self.gemm_autotune() && self.fused_ops() {
            desc.validate(a.len(), b.len(), c.len())?;
            return self.lt_matmul(desc, a, b, c, blaslt::LtEpilogue::None);
        }
        self.blas.gemm(desc, a, b, c)
    }

    fn set_gemm_autotune(&self, on: bool) -> bool {
        self.autotune
            .store(on, std::sync::atomic::Ordering::Relaxed);
        true
    }

    // ------------------------------------------------------------------ elementwise and casts

    fn supports_gemm_epilogue(&self, dtype: DType) -> bool {
        self.fused_ops() && self.epilogue_supported(dtype)
    }

    fn gemm_epilogue(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        epilogue: duet_device::Epilogue<'_, CudaBuffer>,
    ) -> Result<()> {
        self.gemm_epilogue_impl(desc, a, b, c, epilogue)
    }

    fn cast(&self, src: &CudaBuffer, dst: &mut CudaBuffer, scale: f32) -> Result<()> {
        const OP: &str = "cast";
        let unsupported = |dtype| DeviceError::Unsupported {
            op: OP.into(),
            dtype,
        };
        let s = conv::kernel_suffix(src.dtype()).ok_or_else(|| unsupported(src.dtype()))?;
        let d = conv::kernel_suffix(dst.dtype()).ok_or_else(|| unsupported(dst.dtype()))?;
        check_len(OP, "dst", dst, src.len())?;
        let n = src.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: cast_S_D(const S*, D*, u64 n, float); both buffers hold n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Reduce,
                &format!("cast_{s}_{d}"),
                n,
                &[
                    src.ptr().into(),
                    dst.ptr().into(),
                    (n as u64).into(),
                    scale.into(),
                ],
            )
        }
    }

    fn scale(&self, x: &mut CudaBuffer, alpha: f32) -> Result<()> {
        const OP: &str = "scale";
        let s = float_sfx(OP, x.dtype())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: scale_T(T*, float, u64); x holds n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("scale_{s}"),
                n.div_ceil(16 / x.dtype().size_bytes()),
                &[x.ptr().into(), alpha.into(), (n as u64).into()],
            )
        }
    }

    fn add(&self, a: &CudaBuffer, b: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "add";
        let s = float_sfx(OP, a.dtype())?;
        same_dtype(OP, a.dtype(), &[b, out])?;
        check_len(OP, "b", b, a.len())?;
        check_len(OP, "out", out, a.len())?;
        let n = a.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: add_T(const T*, const T*, T*, u64); all three hold n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("add_{s}"),
                n.div_ceil(16 / a.dtype().size_bytes()),
                &[
                    a.ptr().into(),
                    b.ptr().into(),
                    out.ptr().into(),
                    (n as u64).into(),
                ],
            )
        }
    }

    fn add_assign(&self, dst: &mut CudaBuffer, src: &CudaBuffer) -> Result<()> {
        const OP: &str = "add_assign";
        let d = float_sfx(OP, dst.dtype())?;
        let s = float_sfx(OP, src.dtype())?;
        check_len(OP, "src", src, dst.len())?;
        let n = dst.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: add_assign_D_S(D*, const S*, u64); both hold n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("add_assign_{d}_{s}"),
                n.div_ceil(16 / dst.dtype().size_bytes()),
                &[dst.ptr().into(), src.ptr().into(), (n as u64).into()],
            )
        }
    }

    // ------------------------------------------------------------------ model kernels

    fn embedding_forward(
        &self,
        tokens: &CudaBuffer,
        wte: &CudaBuffer,
        wpe: &CudaBuffer,
        out: &mut CudaBuffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_forward";
        let act = out.dtype();
        let sa = float_sfx(OP, act)?;
        let sp = wide_sfx(OP, act, "wte", wte.dtype())?;
        check_dtype(OP, wpe, wte.dtype())?;
        check_dtype(OP, tokens, DType::I32)?;
        let bt = mul(OP, &[b, t])?;
        let total = mul(OP, &[bt, c])?;
        check_len(OP, "tokens", tokens, bt)?;
        if c == 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "c must be positive".into(),
            });
        }
        if wte.is_empty() || !wte.len().is_multiple_of(c) {
            return Err(DeviceError::Shape {
                op: OP,
                detail: format!(
                    "token table has {} elements, not a positive multiple of c = {c}",
                    wte.len()
                ),
            });
        }
        check_min_len(OP, "position table", wpe, mul(OP, &[t, c])?)?;
        check_len(OP, "out", out, total)?;
        if bt == 0 {
            return Ok(());
        }
        let vocab = dim(OP, "vocab", wte.len() / c)?;
        let f = self.func(
            KernelModule::Embedding,
            &format!("embedding_forward_{sa}_{sp}"),
        )?;
        let block = (c.div_ceil(32) * 32).clamp(32, 256) as u32;
        // SAFETY: embedding_forward(const int*, const P*, const P*, A*, int t, int c, int vocab,
        // unsigned*): tokens hold b·t ids, each row reads wte[tok·c..] (tok checked < vocab in
        // the kernel) and wpe[(r % t)·c..] (wpe ≥ t·c), writes out[r·c..] (out = b·t·c).
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid_dim(OP, bt)?, 1, 1), (block, 1, 1)),
                &[
                    tokens.ptr().into(),
                    wte.ptr().into(),
                    wpe.ptr().into(),
                    out.ptr().into(),
                    dim(OP, "t", t)?.into(),
                    dim(OP, "c", c)?.into(),
                    vocab.into(),
                    self.err_word.ptr().into(),
                ],
            )
        }
    }

    fn embedding_backward(
        &self,
        tokens: &CudaBuffer,
        dout: &CudaBuffer,
        dwte: &mut CudaBuffer,
        dwpe: &mut CudaBuffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()> {
        self.embedding_backward_impl(tokens, dout, dwte, dwpe, b, t, c)
    }

    fn layernorm_forward(
        &self,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        beta: &CudaBuffer,
        out: &mut CudaBuffer,
        mean: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()> {
        self.layernorm_forward_impl(x, gamma, beta, out, mean, rstd, n, c, eps)
    }

    fn layernorm_backward(
        &self,
        dout: &CudaBuffer,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        mean: &CudaBuffer,
        rstd: &CudaBuffer,
        dx: &mut CudaBuffer,
        dgamma: &mut CudaBuffer,
        dbeta: &mut CudaBuffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        self.layernorm_backward_impl(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, None, n, c)
    }

    fn layernorm_backward_colsum(
        &self,
        dout: &CudaBuffer,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        mean: &CudaBuffer,
        rstd: &CudaBuffer,
        dx: &mut CudaBuffer,
        dgamma: &mut CudaBuffer,
        dbeta: &mut CudaBuffer,
        dsum: &mut CudaBuffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        self.layernorm_backward_impl(
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            Some(dsum),
            n,
            c,
        )
    }

    fn bias_add(&self, x: &mut CudaBuffer, bias: &CudaBuffer, rows: usize, c: usize) -> Result<()> {
        const OP: &str = "bias_add";
        let act = x.dtype();
        let sa = float_sfx(OP, act)?;
        let sp = wide_sfx(OP, act, "bias", bias.dtype())?;
        let total = mul(OP, &[rows, c])?;
        check_len(OP, "x", x, total)?;
        check_len(OP, "bias", bias, c)?;
        if total == 0 {
            return Ok(());
        }
        // SAFETY: bias_add(A*, const P*, u64 rows, u64 c): x holds rows·c, bias c elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("bias_add_{sa}_{sp}"),
                total.div_ceil(16 / act.size_bytes()),
                &[
                    x.ptr().into(),
                    bias.ptr().into(),
                    (rows as u64).into(),
                    (c as u64).into(),
                ],
            )
        }
    }

    fn bias_backward(
        &self,
        dout: &CudaBuffer,
        dbias: &mut CudaBuffer,
        rows: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "bias_backward";
        float_sfx(OP, dout.dtype())?;
        float_sfx(OP, dbias.dtype())?;
        let total = mul(OP, &[rows, c])?;
        check_len(OP, "dout", dout, total)?;
        check_len(OP, "dbias", dbias, c)?;
        let mut scratch = lock(&self.scratch, OP)?;
        // SAFETY: dout holds rows × c elements, dbias c.
        unsafe {
            self.column_sum(
                OP,
                &mut scratch,
                dout.ptr(),
                dout.dtype(),
                dbias.ptr(),
                dbias.dtype(),
                rows,
                c,
            )
        }
    }

    fn gelu_forward(&self, x: &CudaBuffer, out: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "gelu_forward";
        let s = float_sfx(OP, x.dtype())?;
        check_dtype(OP, out, x.dtype())?;
        check_len(OP, "out", out, x.len())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: gelu_forward_T(const T*, T*, u64); both hold n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("gelu_forward_{s}"),
                n.div_ceil(16 / x.dtype().size_bytes()),
                &[x.ptr().into(), out.ptr().into(), (n as u64).into()],
            )
        }
    }

    fn gelu_backward(&self, x: &CudaBuffer, dout: &CudaBuffer, dx: &mut CudaBuffer) -> Result<()> {
        const OP: &str = "gelu_backward";
        let s = float_sfx(OP, x.dtype())?;
        same_dtype(OP, x.dtype(), &[dout, dx])?;
        check_len(OP, "dout", dout, x.len())?;
        check_len(OP, "dx", dx, x.len())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: gelu_backward_T(const T*, const T*, T*, u64); all hold n elements.
        unsafe {
            self.launch_1d(
                KernelModule::Elementwise,
                &format!("gelu_backward_{s}"),
                n.div_ceil(16 / x.dtype().size_bytes()),
                &[
                    x.ptr().into(),
                    dout.ptr().into(),
                    dx.ptr().into(),
                    (n as u64).into(),
                ],
            )
        }
    }

    fn split_heads(
        &self,
        qkv: &CudaBuffer,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        v: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads";
        let s = float_sfx(OP, qkv.dtype())?;
        let n = mul(OP, &[b, t, nh, hs, 3])? / 3;
        check_len(OP, "qkv", qkv, 3 * n)?;
        for (name, buf) in [("q", &*q), ("k", &*k), ("v", &*v)] {
            check_dtype(OP, buf, qkv.dtype())?;
            check_len(OP, name, buf, n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (f, grid) = self.permute_launch(OP, &format!("split_heads_{s}"), qkv.dtype(), n, hs)?;
        // SAFETY: split_heads(const T*, T*, T*, T*, int b, int t, int nh, int hs): qkv holds
        // 3·b·t·nh·hs elements, q/k/v b·t·nh·hs each; gridDim.y = 3 selects the output.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid, 3, 1), (EW_BLOCK, 1, 1)),
                &[
                    qkv.ptr().into(),
                    q.ptr().into(),
                    k.ptr().into(),
                    v.ptr().into(),
                    dim(OP, "b", b)?.into(),
                    dim(OP, "t", t)?.into(),
                    dim(OP, "nh", nh)?.into(),
                    dim(OP, "hs", hs)?.into(),
                ],
            )
        }
    }

    fn split_heads_backward(
        &self,
        dq: &CudaBuffer,
        dk: &CudaBuffer,
        dv: &CudaBuffer,
        dqkv: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads_backward";
        let s = float_sfx(OP, dqkv.dtype())?;
        let n = mul(OP, &[b, t, nh, hs, 3])? / 3;
        check_len(OP, "dqkv", dqkv, 3 * n)?;
        for (name, buf) in [("dq", dq), ("dk", dk), ("dv", dv)] {
            check_dtype(OP, buf, dqkv.dtype())?;
            check_len(OP, name, buf, n)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (f, grid) = self.permute_launch(
            OP,
            &format!("split_heads_backward_{s}"),
            dqkv.dtype(),
            n,
            hs,
        )?;
        // SAFETY: split_heads_backward(const T*, const T*, const T*, T*, int b, int t, int nh,
        // int hs): sizes as in split_heads.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid, 3, 1), (EW_BLOCK, 1, 1)),
                &[
                    dq.ptr().into(),
                    dk.ptr().into(),
                    dv.ptr().into(),
                    dqkv.ptr().into(),
                    dim(OP, "b", b)?.into(),
                    dim(OP, "t", t)?.into(),
                    dim(OP, "nh", nh)?.into(),
                    dim(OP, "hs", hs)?.into(),
                ],
            )
        }
    }

    fn merge_heads(
        &self,
        y: &CudaBuffer,
        out: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        backward: bool,
    ) -> Result<()> {
        const OP: &str = "merge_heads";
        let s = float_sfx(OP, y.dtype())?;
        let n = mul(OP, &[b, t, nh, hs])?;
        check_dtype(OP, out, y.dtype())?;
        check_len(OP, "y", y, n)?;
        check_len(OP, "out", out, n)?;
        if n == 0 {
            return Ok(());
        }
        let name = if backward {
            format!("merge_heads_backward_{s}")
        } else {
            format!("merge_heads_{s}")
        };
        let (f, grid) = self.permute_launch(OP, &name, y.dtype(), n, hs)?;
        // SAFETY: merge_heads[_backward](const T*, T*, int b, int t, int nh, int hs): both hold
        // b·t·nh·hs elements.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid, 1, 1), (EW_BLOCK, 1, 1)),
                &[
                    y.ptr().into(),
                    out.ptr().into(),
                    dim(OP, "b", b)?.into(),
                    dim(OP, "t", t)?.into(),
                    dim(OP, "nh", nh)?.into(),
                    dim(OP, "hs", hs)?.into(),
                ],
            )
        }
    }

    fn softmax_causal_forward(
        &self,
        scores: &CudaBuffer,
        probs: &mut CudaBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_forward";
        let s = float_sfx(OP, scores.dtype())?;
        check_dtype(OP, probs, scores.dtype())?;
        let total = mul(OP, &[rows, t, t])?;
        check_len(OP, "scores", scores, total)?;
        check_len(OP, "probs", probs, total)?;
        if total == 0 {
            return Ok(());
        }
        let lines = rows * t;
        let f = self.func(
            KernelModule::Softmax,
            &format!("softmax_causal_forward_{s}"),
        )?;
        // SAFETY: softmax_causal_forward(const T*, T*, u64 rows·t, int t, float): one warp per
        // line < rows·t, each touching t elements of buffers holding rows·t·t.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                warp_row_cfg(OP, lines)?,
                &[
                    scores.ptr().into(),
                    probs.ptr().into(),
                    (lines as u64).into(),
                    dim(OP, "t", t)?.into(),
                    scale.into(),
                ],
            )
        }
    }

    fn softmax_causal_backward(
        &self,
        probs: &CudaBuffer,
        dprobs: &CudaBuffer,
        dscores: &mut CudaBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_backward";
        let s = float_sfx(OP, probs.dtype())?;
        same_dtype(OP, probs.dtype(), &[dprobs, dscores])?;
        let total = mul(OP, &[rows, t, t])?;
        check_len(OP, "probs", probs, total)?;
        check_len(OP, "dprobs", dprobs, total)?;
        check_len(OP, "dscores", dscores, total)?;
        if total == 0 {
            return Ok(());
        }
        let lines = rows * t;
        let f = self.func(
            KernelModule::Softmax,
            &format!("softmax_causal_backward_{s}"),
        )?;
        // SAFETY: softmax_causal_backward(const T*, const T*, T*, u64, int, float): as forward.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                warp_row_cfg(OP, lines)?,
                &[
                    probs.ptr().into(),
                    dprobs.ptr().into(),
                    dscores.ptr().into(),
                    (lines as u64).into(),
                    dim(OP, "t", t)?.into(),
                    scale.into(),
                ],
            )
        }
    }

    fn supports_flash_attention(&self, dtype: DType, hs: usize) -> bool {
        self.fused_ops() && self.flash_supported(dtype, hs)
    }

    fn flash_attention_forward(
        &self,
        qkv: &CudaBuffer,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        self.flash_forward_impl(qkv, out, lse, b, t, nh, hs, scale)
    }

    fn flash_attention_backward(
        &self,
        qkv: &CudaBuffer,
        out: &CudaBuffer,
        dout: &CudaBuffer,
        lse: &CudaBuffer,
        dqkv: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        self.flash_backward_impl(qkv, out, dout, lse, dqkv, b, t, nh, hs, scale)
    }

    fn cross_entropy(
        &self,
        logits: &CudaBuffer,
        targets: &CudaBuffer,
        losses: &mut CudaBuffer,
        dlogits: Option<&mut CudaBuffer>,
        n: usize,
        v: usize,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "cross_entropy";
        let s = float_sfx(OP, logits.dtype())?;
        let total = mul(OP, &[n, v])?;
        if v == 0 && n > 0 {
            return Err(DeviceError::Shape {
                op: OP,
                detail: "v must be positive".into(),
            });
        }
        check_len(OP, "logits", logits, total)?;
        check_dtype(OP, targets, DType::I32)?;
        check_len(OP, "targets", targets, n)?;
        check_dtype(OP, losses, DType::F32)?;
        check_len(OP, "losses", losses, n)?;
        if let Some(d) = &dlogits {
            check_dtype(OP, *d, logits.dtype())?;
            check_len(OP, "dlogits", *d, total)?;
        }
        if n == 0 {
            return Ok(());
        }
        let dptr = dlogits.map(|d| d.ptr()).unwrap_or(0);
        let block = (v.div_ceil(4).div_ceil(32) * 32).clamp(32, 1024) as u32;
        let f = self.func(KernelModule::CrossEntropy, &format!("cross_entropy_{s}"))?;
        // SAFETY: cross_entropy(const T*, const int*, float*, T* (nullable), int v, float,
        // unsigned*): one block per row < n over logits/dlogits (n·v), targets and losses (n).
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((grid_dim(OP, n)?, 1, 1), (block, 1, 1)),
                &[
                    logits.ptr().into(),
                    targets.ptr().into(),
                    losses.ptr().into(),
                    dptr.into(),
                    dim(OP, "v", v)?.into(),
                    grad_scale.into(),
                    self.err_word.ptr().into(),
                ],
            )
        }
    }

    fn adamw(
        &self,
        param: &mut CudaBuffer,
        grad: &CudaBuffer,
        m: &mut CudaBuffer,
        v: &mut CudaBuffer,
        step: &AdamWStep,
        param_copy: Option<&mut CudaBuffer>,
    ) -> Result<()> {
        const OP: &str = "adamw";
        let n = param.len();
        check_dtype(OP, param, DType::F32)?;
        check_dtype(OP, m, DType::F32)?;
        check_dtype(OP, v, DType::F32)?;
        let sg = float_sfx(OP, grad.dtype())?;
        check_len(OP, "grad", grad, n)?;
        check_len(OP, "m", m, n)?;
        check_len(OP, "v", v, n)?;
        // The fused kernel writes f32/f16/bf16 copies; an fp8 copy is a cast afterwards.
        let (fused_copy, cast_copy) = match param_copy {
            None => (None, None),
            Some(pc) => {
                check_len(OP, "param_copy", pc, n)?;
                match pc.dtype() {
                    DType::F32 | DType::F16 | DType::BF16 => (Some(pc), None),
                    d if d.is_fp8() => (None, Some(pc)),
                    dtype => {
                        return Err(DeviceError::Unsupported {
                            op: "adamw param_copy".into(),
                            dtype,
                        });
                    }
                }
            }
        };
        if n == 0 {
            return Ok(());
        }
        let sc = fused_copy
            .as_ref()
            .map(|pc| float_sfx(OP, pc.dtype()))
            .transpose()?
            .unwrap_or("f32");
        let copy_ptr = fused_copy.as_ref().map(|pc| pc.ptr()).unwrap_or(0);
        let st = *step;
        // SAFETY: adamw_G_C(float*, const G*, float*, float*, C* (nullable), u64 n, 8 floats):
        // param/m/v are f32 × n, grad and the copy n elements of their dtypes.
        unsafe {
            self.launch_1d(
                KernelModule::AdamW,
                &format!("adamw_{sg}_{sc}"),
                n,
                &[
                    param.ptr().into(),
                    grad.ptr().into(),
                    m.ptr().into(),
                    v.ptr().into(),
                    copy_ptr.into(),
                    (n as u64).into(),
                    st.lr.into(),
                    st.beta1.into(),
                    st.beta2.into(),
                    st.eps.into(),
                    st.weight_decay.into(),
                    st.bias_correction1.into(),
                    st.bias_correction2.into(),
                    st.grad_scale.into(),
                ],
            )?;
        }
        if let Some(pc) = cast_copy {
            self.cast(param, pc, 1.0)?;
        }
        Ok(())
    }

    fn zero_many(&self, dsts: &mut [&mut CudaBuffer]) -> Result<()> {
        self.zero_many_impl(dsts)
    }

    fn sum_squares_many(
        &self,
        xs: &[&CudaBuffer],
        out: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        self.sum_squares_many_impl(xs, out, slot)
    }

    fn adamw_clipped(
        &self,
        tensors: &mut [duet_device::AdamWTensor<'_, CudaBuffer>],
        step: &duet_device::AdamWClipStep,
        scalars: &CudaBuffer,
    ) -> Result<()> {
        self.adamw_clipped_impl(tensors, step, scalars)
    }

    fn adamw_clipped_fp8(
        &self,
        tensors: &mut [duet_device::AdamWTensor<'_, CudaBuffer>],
        step: &duet_device::AdamWClipStep,
        scalars: &CudaBuffer,
        outs: &mut [duet_device::AdamWFp8Out<'_, CudaBuffer>],
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
    ) -> Result<()> {
        self.adamw_clipped_fp8_impl(tensors, step, scalars, outs, scale, amax)
    }

    fn quantize_fp8(
        &self,
        src: &CudaBuffer,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        self.quantize_fp8_impl(src, dst, dst_t, rows, cols, scale, amax, slot)
    }

    fn quantize_fp8_many(
        &self,
        jobs: &mut [duet_device::Fp8QuantJob<'_, CudaBuffer>],
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
    ) -> Result<()> {
        self.quantize_fp8_many_impl(jobs, scale, amax)
    }

    fn quantize_fp8_grad(
        &self,
        dout: &CudaBuffer,
        gelu_pre: Option<&CudaBuffer>,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        dbias: &mut CudaBuffer,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        self.quantize_fp8_grad_impl(
            dout, gelu_pre, dst, dst_t, dbias, rows, cols, scale, amax, slot,
        )
    }

    fn quantize_fp8_gelu(
        &self,
        pre: &CudaBuffer,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        rows: usize,
        cols: usize,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        self.quantize_fp8_gelu_impl(pre, dst, dst_t, rows, cols, scale, amax, slot)
    }

    fn layernorm_forward_fp8(
        &self,
        x: &CudaBuffer,
        gamma: &CudaBuffer,
        beta: &CudaBuffer,
        mean: &mut CudaBuffer,
        rstd: &mut CudaBuffer,
        dst: &mut CudaBuffer,
        dst_t: Option<&mut CudaBuffer>,
        n: usize,
        c: usize,
        eps: f32,
        scale: &CudaBuffer,
        amax: &mut CudaBuffer,
        slot: usize,
    ) -> Result<()> {
        self.layernorm_forward_fp8_impl(
            x, gamma, beta, mean, rstd, dst, dst_t, n, c, eps, scale, amax, slot,
        )
    }

    fn gemm_fp8(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        scale_inv: &CudaBuffer,
        a_slot: usize,
        b_slot: usize,
    ) -> Result<()> {
        self.gemm_fp8_impl(desc, a, b, c, scale_inv, a_slot, b_slot)
    }

    fn supports_fp8_epilogue(&self, dtype: DType) -> bool {
        self.fused_ops() && self.info.supports_fp8 && matches!(dtype, DType::BF16 | DType::F16)
    }

    fn gemm_fp8_epilogue(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        scale_inv: &CudaBuffer,
        a_slot: usize,
        b_slot: usize,
        epilogue: duet_device::Epilogue<'_, CudaBuffer>,
    ) -> Result<()> {
        self.gemm_fp8_epilogue_impl(desc, a, b, c, scale_inv, a_slot, b_slot, epilogue)
    }

    fn fp8_scale_inv_stride(&self) -> usize {
        (crate::blaslt::SCALE_ALIGN / 4) as usize
    }

    fn fp8_scaling_update(
        &self,
        amax: &mut CudaBuffer,
        history: &mut CudaBuffer,
        scale: &mut CudaBuffer,
        scale_inv: &mut CudaBuffer,
        inv_stride: usize,
        fp8_max: &CudaBuffer,
        len: usize,
        most_recent: bool,
        margin: i32,
    ) -> Result<()> {
        let ops = duet_device::check_fp8_scaling_args(
            amax, history, scale, scale_inv, inv_stride, fp8_max, len,
        )?;
        if ops == 0 {
            return Ok(());
        }
        let f = self.func(KernelModule::Fp8Scaling, "fp8_scaling_update")?;
        // SAFETY: fp8_scaling_update(float* amax, float* history, float* scale,
        // float* scale_inv, u64 inv_stride, const float* fp8_max, u64 ops, u64 len,
        // int most_recent, int margin); every buffer is f32 and holds ops (history ops × len,
        // scale_inv ops × inv_stride) elements (checked above); one thread per operand.
        unsafe {
            kernels::launch(
                &self.stream,
                &f,
                cfg((ops.div_ceil(128) as u32, 1, 1), (128, 1, 1)),
                &[
                    amax.ptr().into(),
                    history.ptr().into(),
                    scale.ptr().into(),
                    scale_inv.ptr().into(),
                    (inv_stride as u64).into(),
                    fp8_max.ptr().into(),
                    (ops as u64).into(),
                    (len as u64).into(),
                    (most_recent as i32).into(),
                    margin.into(),
                ],
            )
        }
    }

    fn sum_squares(&self, x: &CudaBuffer, out: &mut CudaBuffer, slot: usize) -> Result<()> {
        const OP: &str = "sum_squares";
        let s = float_sfx(OP, x.dtype())?;
        check_dtype(OP, out, DType::F32)?;
        check_range(OP, slot, 1, out.len())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        // The partition depends on n only (never on the GPU), so results are reproducible.
        let blocks = n.div_ceil(256 * 16).clamp(1, 1024);
        let mut scratch = lock(&self.scratch, OP)?;
        let partial = scratch.get(&self.ctx, &self.stream, blocks * 8, &self.mem)?;
        let fp = self.func(KernelModule::Reduce, &format!("sum_squares_partial_{s}"))?;
        // SAFETY: sum_squares_partial(const T*, u64 n, double*): x holds n elements, the
        // scratch `blocks` doubles (one per block).
        unsafe {
            kernels::launch(
                &self.stream,
                &fp,
                cfg((blocks as u32, 1, 1), (256, 1, 1)),
                &[x.ptr().into(), (n as u64).into(), partial.into()],
            )?;
        }
        // SAFETY: `blocks` partials just written; slot < out.len() (checked).
        unsafe { self.sum_squares_finish(OP, partial, blocks, out, slot) }
    }
}

impl CudaDevice {
    /// FP8 GEMM through cuBLASLt (see [`Device::gemm_fp8`] and [`crate::blaslt`]).
    #[allow(clippy::too_many_arguments)]
    fn gemm_fp8_impl(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        scale_inv: &CudaBuffer,
        a_slot: usize,
        b_slot: usize,
    ) -> Result<()> {
        blaslt::validate(desc, a, b, c, scale_inv, a_slot, b_slot, self.cc)?;
        self.with_lt("gemm_fp8", |lt| {
            lt.gemm_fp8(
                &self.stream,
                desc,
                a,
                b,
                c,
                scale_inv,
                (a_slot, b_slot),
                blaslt::LtEpilogue::None,
            )
        })
    }

    /// The function and grid size of a head permutation over `n` elements.
    fn permute_launch(
        &self,
        op: &'static str,
        name: &str,
        dtype: DType,
        n: usize,
        hs: usize,
    ) -> Result<(CudaFunction, u32)> {
        let pack = 16 / dtype.size_bytes();
        let units = if hs.is_multiple_of(pack) { n / pack } else { n };
        let f = self.func(KernelModule::Attention, name)?;
        let _ = op;
        Ok((f, self.grid_1d(units, EW_BLOCK)))
    }
}
