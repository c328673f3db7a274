//! The runtime every backend provides: buffers, copies, fills and casts of whole buffers,
//! synchronisation, recorded graphs, timing, memory statistics, telemetry, its info and
//! capabilities.

use crate::*;

/// What a device is and what it can do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceInfo {
    /// "cpu", "cuda" or "hip".
    pub backend: String,
    /// Marketing name, e.g. "NVIDIA H200" or "AMD Instinct MI300X".
    pub name: String,
    /// "sm_90", "gfx942", or the CPU's feature summary.
    pub arch: String,
    /// Total device memory in bytes (host RAM for the CPU).
    pub total_memory: u64,
    pub supports_bf16: bool,
    pub supports_fp8: bool,
    /// Free-form details (driver and library versions, thread count, ...).
    pub details: Vec<(String, String)>,
}

impl DeviceInfo {
    /// Whether the device's FP8 hardware uses the FNUZ encodings (AMD gfx940/gfx942, MI300)
    /// rather than OCP's (NVIDIA sm_89+, AMD gfx950; the CPU emulates both and defaults to OCP).
    pub fn fp8_is_fnuz(&self) -> bool {
        self.arch.starts_with("gfx942") || self.arch.starts_with("gfx940")
    }
}

/// Memory use as the backend sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in live buffers allocated through this device.
    pub current: u64,
    /// High-water mark of `current` since creation or the last [`Runtime::reset_peak_memory`].
    pub peak: u64,
    /// The driver's view: (free, total) bytes, where the backend has one.
    pub driver: Option<(u64, u64)>,
}

/// One reading of the device's clocks and power ([`Runtime::telemetry`]), for benchmarks: a
/// step's time depends on them, and they differ between machines of the same model (power
/// caps, cooling).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Telemetry {
    /// Streaming-multiprocessor clock, MHz.
    pub sm_clock_mhz: u32,
    /// Board power draw, W: instantaneous where the GPU reports it ([`Telemetry::power_instant`]),
    /// else the driver's trailing average (about one second on recent NVIDIA GPUs).
    pub power_w: f64,
    /// Whether `power_w` is the instantaneous draw.
    pub power_instant: bool,
    /// The power limit in force, W.
    pub power_limit_w: f64,
    /// GPU temperature, °C.
    pub temperature_c: u32,
    /// The clocks are held down by the power limit (software power cap or power brake).
    pub power_capped: bool,
    /// The clocks are held down by temperature (software or hardware thermal slowdown).
    pub thermal_slowdown: bool,
}

/// A typed buffer owned by a device.
pub trait Buffer: Send + Sync {
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }
}

pub trait Runtime: Send + Sync + Sized + 'static {
    type Buffer: Buffer;
    /// A recorded sequence of queued ops ([`Runtime::capture_begin`]); `()` where the backend
    /// cannot record.
    type Graph: Send;

    /// Runs one op: checks its named arguments ([`crate::Check`]) and calls the family method
    /// that takes them, e.g. `dev.exec(Gemm { desc: &desc, a: &a, b: &b, c: &mut c })`.
    fn exec<A: crate::Op<Self>>(&self, args: A) -> Result<()> {
        A::call(self, args.check()?)
    }

    fn info(&self) -> DeviceInfo;

    /// The paths this device has of its own, read once when it opened.
    fn capabilities(&self) -> &Capabilities;

    /// Allocates `len` zero-initialised elements of `dtype`.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Self::Buffer>;

    /// Copies host bytes into `dst` starting at element `offset`. The bytes must hold whole
    /// elements of `dst`'s dtype. May return before the copy completes (the host data is staged).
    fn upload_bytes(&self, src: &[u8], dst: &mut Self::Buffer, offset: usize) -> Result<()>;

    /// Copies `len` elements starting at `offset` back to the host as raw little-endian bytes.
    /// Waits for all queued work that writes `src`.
    fn download_bytes(&self, src: &Self::Buffer, offset: usize, len: usize) -> Result<Vec<u8>>;

    /// Device-to-device copy of `len` elements (same dtype).
    fn copy(
        &self,
        src: &Self::Buffer,
        src_offset: usize,
        dst: &mut Self::Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Sets every element to `value` (converted to the buffer's dtype).
    fn fill(&self, dst: &mut Self::Buffer, value: f32) -> Result<()>;

    /// `dst = cast(src · scale)`, converting between any two float dtypes (fp8 saturates).
    fn cast(&self, src: &Self::Buffer, dst: &mut Self::Buffer, scale: f32) -> Result<()>;

    /// Sets every element of every buffer in `dsts` to zero (one launch on a GPU backend;
    /// the default calls [`Runtime::fill`] per buffer).
    fn zero_many(&self, dsts: &mut [&mut Self::Buffer]) -> Result<()> {
        zero_many(self, dsts)
    }

    /// Waits until all queued work has finished, reporting any deferred error.
    fn synchronize(&self) -> Result<()>;

    /// Opens a named range on the profiler timeline (NVTX on CUDA, roctx on HIP, where their
    /// libraries load; nothing elsewhere), closed by [`Runtime::range_pop`]. Ranges nest. Host
    /// side only: inside a recorded graph they mark the recording, not each replay.
    fn range_push(&self, name: &str) {
        let _ = name;
    }

    /// Closes the innermost range of [`Runtime::range_push`].
    fn range_pop(&self) {}

    /// Starts recording: until [`Runtime::capture_end`], ops are recorded instead of run.
    /// Recorded ops keep the buffers and scalar arguments they were given, so what changes
    /// between replays must live in device buffers written before each replay. While recording,
    /// nothing may allocate, upload, download or synchronise (those return an error).
    fn capture_begin(&self) -> Result<()> {
        Err(no_graphs(self))
    }

    /// Ends recording and returns the graph (also after a failed op: recording always stops).
    fn capture_end(&self) -> Result<Self::Graph> {
        Err(no_graphs(self))
    }

    /// Queues a recorded graph: its ops run again, in order, on the current buffer contents.
    fn replay(&self, graph: &Self::Graph) -> Result<()> {
        let _ = graph;
        Err(no_graphs(self))
    }

    /// Runs `work` (which queues device work, and may wait for it) and returns the
    /// milliseconds the device took for it: between device events recorded before and after it
    /// where the backend has them (CUDA), else on the host clock between synchronisations.
    fn time_ms<E: From<DeviceError>>(
        &self,
        work: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<f64, E> {
        time_ms_host_clock(self, work)
    }

    /// What [`Runtime::time_ms`] measures with: "device events" or "host clock".
    fn timer_kind(&self) -> &'static str {
        "host clock"
    }

    fn memory_stats(&self) -> MemoryStats;

    fn reset_peak_memory(&self);

    /// The device's clocks, power and temperature now, where the backend can read them (CUDA:
    /// NVML when libnvidia-ml loads); None elsewhere. Cheap enough to sample every few
    /// milliseconds from another thread while steps run.
    fn telemetry(&self) -> Option<Telemetry> {
        None
    }
}

/// [`crate::Runtime::zero_many`] composed of the core ops (its default).
pub fn zero_many<D: Runtime>(d: &D, dsts: &mut [&mut D::Buffer]) -> Result<()> {
    for buf in dsts.iter_mut() {
        d.fill(buf, 0.0)?;
    }
    Ok(())
}

/// The error of the graph methods on a backend that cannot record.
fn no_graphs<D: Runtime>(dev: &D) -> DeviceError {
    DeviceError::InvalidArgument(format!(
        "the {} backend cannot record graphs",
        dev.info().backend
    ))
}

/// [`Runtime::time_ms`] on the host clock between synchronisations (its default; a backend whose
/// device events are missing at run time falls back to it).
pub fn time_ms_host_clock<D: Runtime, E: From<DeviceError>>(
    dev: &D,
    work: impl FnOnce() -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    dev.synchronize()?;
    let start = std::time::Instant::now();
    work()?;
    dev.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// Typed helpers on top of the byte-level copies.
pub trait DeviceExt: Runtime {
    /// Allocates a buffer holding `data`.
    fn upload_new<T: HostType>(&self, data: &[T]) -> Result<Self::Buffer> {
        let mut buf = self.alloc(T::DTYPE, data.len())?;
        self.upload(data, &mut buf, 0)?;
        Ok(buf)
    }

    fn upload<T: HostType>(&self, src: &[T], dst: &mut Self::Buffer, offset: usize) -> Result<()> {
        check_host_dtype::<T>(dst.dtype(), "upload")?;
        check_range("upload", offset, src.len(), dst.len())?;
        self.upload_bytes(T::as_bytes(src), dst, offset)
    }

    /// Reads the whole buffer back as `T` (which must match its dtype).
    fn download<T: HostType>(&self, src: &Self::Buffer) -> Result<Vec<T>> {
        self.download_range(src, 0, src.len())
    }

    fn download_range<T: HostType>(
        &self,
        src: &Self::Buffer,
        offset: usize,
        len: usize,
    ) -> Result<Vec<T>> {
        check_host_dtype::<T>(src.dtype(), "download")?;
        check_range("download", offset, len, src.len())?;
        let bytes = self.download_bytes(src, offset, len)?;
        Ok(T::from_bytes(&bytes))
    }

    /// Runs `f` inside a profiler range named `name` ([`Runtime::range_push`]); the range is
    /// closed whatever `f` returns.
    fn in_range<R>(&self, name: &str, f: impl FnOnce() -> R) -> R {
        self.range_push(name);
        let r = f();
        self.range_pop();
        r
    }

    /// Reads any float buffer back as f32 (converting on the host).
    fn download_f32(&self, src: &Self::Buffer) -> Result<Vec<f32>> {
        let bytes = self.download_bytes(src, 0, src.len())?;
        src.dtype().bytes_to_f32(&bytes)
    }
}

impl<D: Runtime> DeviceExt for D {}

fn check_host_dtype<T: HostType>(buf: DType, op: &'static str) -> Result<()> {
    if T::DTYPE == buf || (T::DTYPE == DType::U8 && buf.is_fp8()) {
        Ok(())
    } else {
        Err(DeviceError::DTypeMismatch {
            op,
            expected: buf,
            got: T::DTYPE,
        })
    }
}
