//! [`HipDevice`]: the `Device` implementation. Every op validates shapes and dtypes first (the
//! same rules as the CPU reference where the kernels have the variant, else a typed
//! `Unsupported`), then enqueues its kernels on the device's stream.

use crate::blas::{self, Lt};
use crate::conv::{self, act_wide, is_act};
use crate::error::{HipError, unavailable};
use crate::hip::result::{HipApi, version_string};
use crate::hip::safe::Stream;
use crate::hip::sys;
use crate::hipblaslt::{result::LtApi, safe::LtHandle};
use crate::hiprtc::result::RtcApi;
use crate::kernels::{Args, Kernels};
use crate::memory::{HipBuffer, MemShared};
use crate::rocblas::{result::RocblasApi, safe::RocblasHandle};
use duet_device::{
    AdamWStep, Buffer, DType, Device, DeviceError, DeviceInfo, GemmDesc, MemoryStats, Result,
    check_dtype, check_len, check_range,
};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Threads per block of every kernel (`DUET_BLOCK` in kernels-hip/duet_hip.h).
const BLOCK: u32 = 256;
/// Rows per chunk of the two-pass column sums (the CPU reference's block size).
const CHUNK_ROWS: usize = 32;
/// Most blocks of a `sum_squares` partial pass (fixed by n alone, so results are deterministic).
const SUMSQ_BLOCKS: u64 = 1024;

fn grid1(n: u64) -> (u32, u32) {
    (n.div_ceil(BLOCK as u64).clamp(1, 65_535) as u32, 1)
}

fn rows_grid(rows: usize) -> Result<(u32, u32)> {
    u32::try_from(rows.max(1))
        .map(|r| (r, 1))
        .map_err(|_| DeviceError::InvalidArgument(format!("{rows} rows exceed the grid limit")))
}

fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| DeviceError::InvalidArgument(format!("{what} = {v} exceeds i32")))
}

fn unsupported(op: &str, dtype: DType) -> DeviceError {
    DeviceError::Unsupported {
        op: op.to_string(),
        dtype,
    }
}

fn same(op: &'static str, a: &HipBuffer, b: &HipBuffer) -> Result<()> {
    check_dtype(op, b, a.dtype())
}

fn act(op: &'static str, b: &HipBuffer) -> Result<&'static str> {
    if is_act(b.dtype()) {
        Ok(b.dtype().name())
    } else {
        Err(unsupported(op, b.dtype()))
    }
}

/// A HIP (ROCm 6/7) GPU.
pub struct HipDevice {
    ordinal: i32,
    info: DeviceInfo,
    arch_base: String,
    kernels: Kernels,
    blas: Mutex<RocblasHandle>,
    lt: Option<Mutex<Lt>>,
    scratch: Mutex<Option<HipBuffer>>,
    mem: Arc<MemShared>,
    stream: Arc<Stream>,
    api: Arc<HipApi>,
    /// roctx ranges for profiler timelines, when the library is present.
    roctx: Option<crate::roctx::Roctx>,
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
        let pools = api
            .attribute(A::hipDeviceAttributeMemoryPoolsSupported, ord)
            .unwrap_or(0)
            != 0;
        let cus = api.attribute(A::hipDeviceAttributeMultiprocessorCount, ord)?;
        let lds = api.attribute(A::hipDeviceAttributeMaxSharedMemoryPerBlock, ord)?;
        let arch = api.arch_name(ord)?;
        let arch_base = arch.split(':').next().unwrap_or(&arch).to_string();
        let name = api.device_name(ord)?;
        let (_, total) = api.mem_info()?;
        let rtc = RtcApi::load()?;
        let rocblas = Arc::new(RocblasApi::load()?);
        let lt_api = LtApi::load().ok().map(Arc::new);

        let stream = Arc::new(Stream::new(api.clone())?);
        let mem = Arc::new(MemShared::new(stream.clone(), pools));
        let kernels = Kernels::load(&api, &rtc, &arch, warp)?;
        let blas = RocblasHandle::new(rocblas.clone(), stream.clone())?;
        let lt = match &lt_api {
            Some(l) => Some(Mutex::new(Lt::new(LtHandle::new(l.clone())?, &mem)?)),
            None => None,
        };
        let fp8 = lt.is_some() && matches!(arch_base.as_str(), "gfx942" | "gfx950");
        let rtc_v = rtc
            .version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_default();
        let details = vec![
            (
                "runtime".to_string(),
                format!("{} ({})", version_string(api.runtime_version()?), api.name),
            ),
            (
                "driver".into(),
                version_string(api.driver_version().unwrap_or(0)),
            ),
            ("target".into(), arch.clone()),
            ("wavefront".into(), warp.to_string()),
            ("compute_units".into(), cus.to_string()),
            ("lds_per_block".into(), lds.to_string()),
            ("hiprtc".into(), format!("{rtc_v} ({})", rtc.name)),
            ("rocblas".into(), rocblas.name.clone()),
            (
                "hipblaslt".into(),
                lt_api
                    .as_ref()
                    .map_or("not found".into(), |l| l.name.clone()),
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
        Ok(Self {
            ordinal: ord,
            info,
            arch_base,
            kernels,
            blas: Mutex::new(blas),
            lt,
            scratch: Mutex::new(None),
            mem,
            stream,
            api,
            roctx: crate::roctx::Roctx::load(),
        })
    }

    fn launch(&self, name: &str, grid: (u32, u32), args: Args) -> Result<()> {
        let f = self.kernels.get(name)?;
        let mut args = args;
        let mut ptrs = args.pointers();
        // SAFETY: every call site builds `args` in the order and with the types of the kernel's
        // parameters (kernels-hip), from buffers validated to hold what the kernel addresses.
        unsafe {
            self.api
                .launch(f.0, grid, BLOCK, self.stream.raw(), ptrs.as_mut_ptr())
        }?;
        Ok(())
    }

    /// A device scratch area of at least `n` f32, reused across ops (the stream orders uses).
    fn scratch(&self, n: usize) -> Result<*mut c_void> {
        let mut s = self
            .scratch
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("scratch lock poisoned".into()))?;
        if s.as_ref().is_none_or(|b| b.len() < n) {
            *s = Some(HipBuffer::new(&self.mem, DType::F32, n.max(1024))?);
        }
        Ok(s.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr()))
    }

    /// `out[j] (+)= Σ_rows x[r, j]` in two deterministic passes (colsum_partial, colsum_finish).
    fn colsum(&self, x: &HipBuffer, rows: usize, cols: usize, out: &HipBuffer) -> Result<()> {
        let chunks = rows.div_ceil(CHUNK_ROWS).max(1);
        let part = self.scratch(chunks * cols)?;
        let gx = (cols as u64).div_ceil(BLOCK as u64) as u32;
        let args = Args::default()
            .ptr(x.ptr())
            .ptr(part)
            .u64(rows as u64)
            .u64(cols as u64)
            .u64(CHUNK_ROWS as u64);
        self.launch(
            &format!("colsum_partial_{}", act("colsum", x)?),
            (gx.max(1), chunks as u32),
            args,
        )?;
        let args = Args::default()
            .ptr(part)
            .ptr(out.ptr())
            .u64(chunks as u64)
            .u64(cols as u64);
        self.launch(
            &format!("colsum_finish_{}", act("colsum", out)?),
            grid1(cols as u64),
            args,
        )
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
}

impl Device for HipDevice {
    type Buffer = HipBuffer;
    type Graph = ();

    fn range_push(&self, name: &str) {
        if let Some(r) = &self.roctx {
            r.push(name);
        }
    }

    fn range_pop(&self) {
        if let Some(r) = &self.roctx {
            r.pop();
        }
    }

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<HipBuffer> {
        let bytes = len
            .checked_mul(dtype.size_bytes())
            .ok_or_else(|| DeviceError::InvalidArgument(format!("{len} x {dtype} overflows")))?;
        let buf = HipBuffer::new(&self.mem, dtype, len).map_err(|e| match e {
            HipError::Runtime { code: 2, .. } => DeviceError::OutOfMemory {
                requested: bytes as u64,
                free: self.api.mem_info().map_or(0, |m| m.0),
            },
            e => e.into(),
        })?;
        if bytes > 0 {
            // SAFETY: the buffer holds `bytes` bytes of device memory.
            unsafe {
                self.api
                    .memset_zero_async(buf.ptr(), bytes, self.stream.raw())
            }?;
        }
        Ok(buf)
    }

    fn upload_bytes(&self, src: &[u8], dst: &mut HipBuffer, offset: usize) -> Result<()> {
        let es = dst.dtype().size_bytes();
        if !src.len().is_multiple_of(es) {
            return Err(DeviceError::InvalidArgument(format!(
                "upload: {} bytes is not a whole number of {} elements",
                src.len(),
                dst.dtype()
            )));
        }
        check_range("upload", offset, src.len() / es, dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: the destination range was checked; the host slice stays borrowed until the
        // stream synchronize below, so the pageable source is not freed mid-copy.
        unsafe {
            self.api.memcpy_async(
                dst.ptr_at(offset),
                src.as_ptr().cast(),
                src.len(),
                sys::hipMemcpyKind::hipMemcpyHostToDevice,
                self.stream.raw(),
            )?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    fn download_bytes(&self, src: &HipBuffer, offset: usize, len: usize) -> Result<Vec<u8>> {
        check_range("download", offset, len, src.len())?;
        let mut out = vec![0u8; len * src.dtype().size_bytes()];
        if !out.is_empty() {
            // SAFETY: the source range was checked; `out` has room and lives past the synchronize.
            unsafe {
                self.api.memcpy_async(
                    out.as_mut_ptr().cast(),
                    src.ptr_at(offset),
                    out.len(),
                    sys::hipMemcpyKind::hipMemcpyDeviceToHost,
                    self.stream.raw(),
                )?;
            }
        }
        self.synchronize()?;
        Ok(out)
    }

    fn copy(
        &self,
        src: &HipBuffer,
        src_offset: usize,
        dst: &mut HipBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        check_dtype("copy", dst, src.dtype())?;
        check_range("copy", src_offset, len, src.len())?;
        check_range("copy", dst_offset, len, dst.len())?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges were checked and are distinct buffers (borrow rules).
        unsafe {
            self.api.memcpy_async(
                dst.ptr_at(dst_offset),
                src.ptr_at(src_offset),
                len * src.dtype().size_bytes(),
                sys::hipMemcpyKind::hipMemcpyDeviceToDevice,
                self.stream.raw(),
            )?;
        }
        Ok(())
    }

    fn fill(&self, dst: &mut HipBuffer, value: f32) -> Result<()> {
        let (bits, width) = conv::fill_pattern(dst.dtype(), value);
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `len` elements of `width` bytes are the whole buffer.
        unsafe {
            self.api
                .memset_async(dst.ptr(), bits, width, dst.len(), self.stream.raw())
        }?;
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize()?;
        let deferred = self.stream.deferred.take();
        if deferred.is_empty() {
            Ok(())
        } else {
            Err(DeviceError::Driver {
                backend: "hip",
                call: "deferred (buffer drop)".into(),
                message: deferred.join("; "),
            })
        }
    }

    fn memory_stats(&self) -> MemoryStats {
        self.mem.stats(self.api.mem_info().ok())
    }

    fn reset_peak_memory(&self) {
        self.mem.reset_peak();
    }

    fn gemm(&self, desc: &GemmDesc, a: &HipBuffer, b: &HipBuffer, c: &mut HipBuffer) -> Result<()> {
        check_dtype("gemm", b, a.dtype())?;
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        if a.dtype().is_fp8() {
            let lt = self.lt.as_ref().ok_or_else(|| {
                unsupported("gemm (fp8 needs hipBLASLt, which was not found)", a.dtype())
            })?;
            let lt = lt
                .lock()
                .map_err(|_| DeviceError::InvalidArgument("hipBLASLt lock poisoned".into()))?;
            return blas::gemm_fp8(&lt, &self.arch_base, self.stream.raw(), desc, a, b, c, None);
        }
        let h = self
            .blas
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("rocBLAS lock poisoned".into()))?;
        blas::gemm(&h, desc, a, b, c)
    }

    fn cast(&self, src: &HipBuffer, dst: &mut HipBuffer, scale: f32) -> Result<()> {
        check_len("cast", "dst", dst, src.len())?;
        for b in [src.dtype(), dst.dtype()] {
            if !b.is_float() {
                return Err(unsupported("cast", b));
            }
        }
        let args = Args::default()
            .ptr(src.ptr())
            .ptr(dst.ptr())
            .u64(src.len() as u64)
            .f32(scale);
        self.launch(
            &format!("cast_{}_{}", src.dtype().name(), dst.dtype().name()),
            grid1(src.len() as u64),
            args,
        )
    }

    fn scale(&self, x: &mut HipBuffer, alpha: f32) -> Result<()> {
        let n = act("scale", x)?;
        self.launch(
            &format!("scale_{n}"),
            grid1(x.len() as u64),
            Args::default().ptr(x.ptr()).f32(alpha).u64(x.len() as u64),
        )
    }

    fn add(&self, a: &HipBuffer, b: &HipBuffer, out: &mut HipBuffer) -> Result<()> {
        let n = act("add", a)?;
        same("add", a, b)?;
        same("add", a, out)?;
        check_len("add", "b", b, a.len())?;
        check_len("add", "out", out, a.len())?;
        let args = Args::default()
            .ptr(a.ptr())
            .ptr(b.ptr())
            .ptr(out.ptr())
            .u64(a.len() as u64);
        self.launch(&format!("add_{n}"), grid1(a.len() as u64), args)
    }

    fn add_assign(&self, dst: &mut HipBuffer, src: &HipBuffer) -> Result<()> {
        let n = act("add_assign", dst)?;
        same("add_assign", dst, src)?;
        check_len("add_assign", "src", src, dst.len())?;
        let args = Args::default()
            .ptr(dst.ptr())
            .ptr(src.ptr())
            .u64(dst.len() as u64);
        self.launch(&format!("add_assign_{n}"), grid1(dst.len() as u64), args)
    }

    fn embedding_forward(
        &self,
        tokens: &HipBuffer,
        wte: &HipBuffer,
        wpe: &HipBuffer,
        out: &mut HipBuffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_forward";
        check_dtype(OP, tokens, DType::I32)?;
        check_dtype(OP, wpe, wte.dtype())?;
        let v = act_wide(OP, out.dtype(), wte.dtype())?;
        let bt = b * t;
        check_len(OP, "tokens", tokens, bt)?;
        check_len(OP, "out", out, bt * c)?;
        if c == 0 || wte.is_empty() || !wte.len().is_multiple_of(c) {
            return Err(DeviceError::Shape {
                op: OP,
                detail: format!(
                    "token table of {} elements is not a positive multiple of c = {c}",
                    wte.len()
                ),
            });
        }
        duet_device::check_min_len(OP, "position table", wpe, t * c)?;
        if bt == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(tokens.ptr())
            .ptr(wte.ptr())
            .ptr(wpe.ptr())
            .ptr(out.ptr())
            .i32(int("t", t)?)
            .i32(int("c", c)?)
            .i32(int("vocab", wte.len() / c)?);
        self.launch(&format!("{OP}_{v}"), rows_grid(bt)?, args)
    }

    fn embedding_backward(
        &self,
        tokens: &HipBuffer,
        dout: &HipBuffer,
        dwte: &mut HipBuffer,
        dwpe: &mut HipBuffer,
        b: usize,
        t: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "embedding_backward";
        check_dtype(OP, tokens, DType::I32)?;
        let v = act_wide(OP, dout.dtype(), dwte.dtype())?;
        act(OP, dwpe)?;
        let bt = b * t;
        check_len(OP, "tokens", tokens, bt)?;
        check_len(OP, "dout", dout, bt * c)?;
        if c == 0 || dwte.is_empty() || !dwte.len().is_multiple_of(c) {
            return Err(DeviceError::Shape {
                op: OP,
                detail: format!(
                    "token table of {} elements is not a positive multiple of c = {c}",
                    dwte.len()
                ),
            });
        }
        duet_device::check_min_len(OP, "position table", dwpe, t * c)?;
        if bt == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(tokens.ptr())
            .ptr(dout.ptr())
            .ptr(dwte.ptr())
            .i32(int("b*t", bt)?)
            .i32(int("c", c)?)
            .i32(int("vocab", dwte.len() / c)?);
        self.launch(&format!("embedding_backward_wte_{v}"), rows_grid(bt)?, args)?;
        // dwpe[t, :] += Σ_b dout[b, t, :]: a column sum over b rows of t·c columns.
        self.colsum(dout, b, t * c, dwpe)
    }

    fn layernorm_forward(
        &self,
        x: &HipBuffer,
        gamma: &HipBuffer,
        beta: &HipBuffer,
        out: &mut HipBuffer,
        mean: &mut HipBuffer,
        rstd: &mut HipBuffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_forward";
        let v = act_wide(OP, x.dtype(), gamma.dtype())?;
        same(OP, gamma, beta)?;
        same(OP, x, out)?;
        check_dtype(OP, mean, DType::F32)?;
        check_dtype(OP, rstd, DType::F32)?;
        check_len(OP, "x", x, n * c)?;
        check_len(OP, "out", out, n * c)?;
        check_len(OP, "gamma", gamma, c)?;
        check_len(OP, "beta", beta, c)?;
        check_len(OP, "mean", mean, n)?;
        check_len(OP, "rstd", rstd, n)?;
        if n == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(x.ptr())
            .ptr(gamma.ptr())
            .ptr(beta.ptr())
            .ptr(out.ptr())
            .ptr(mean.ptr())
            .ptr(rstd.ptr())
            .i32(int("n", n)?)
            .i32(int("c", c)?)
            .f32(eps);
        self.launch(&format!("{OP}_{v}"), rows_grid(n)?, args)
    }

    fn layernorm_backward(
        &self,
        dout: &HipBuffer,
        x: &HipBuffer,
        gamma: &HipBuffer,
        mean: &HipBuffer,
        rstd: &HipBuffer,
        dx: &mut HipBuffer,
        dgamma: &mut HipBuffer,
        dbeta: &mut HipBuffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "layernorm_backward";
        let v = act_wide(OP, x.dtype(), gamma.dtype())?;
        same(OP, x, dout)?;
        same(OP, x, dx)?;
        act(OP, dgamma)?;
        act(OP, dbeta)?;
        check_dtype(OP, mean, DType::F32)?;
        check_dtype(OP, rstd, DType::F32)?;
        for (what, buf, len) in [
            ("dout", dout, n * c),
            ("x", x, n * c),
            ("dx", &*dx, n * c),
            ("gamma", gamma, c),
            ("dgamma", &*dgamma, c),
            ("dbeta", &*dbeta, c),
            ("mean", mean, n),
            ("rstd", rstd, n),
        ] {
            check_len(OP, what, buf, len)?;
        }
        if n == 0 {
            return Ok(());
        }
        let (ni, ci) = (int("n", n)?, int("c", c)?);
        let args = Args::default()
            .ptr(dout.ptr())
            .ptr(x.ptr())
            .ptr(gamma.ptr())
            .ptr(mean.ptr())
            .ptr(rstd.ptr())
            .ptr(dx.ptr())
            .i32(ni)
            .i32(ci);
        self.launch(&format!("layernorm_backward_dx_{v}"), rows_grid(n)?, args)?;
        let chunks = n.div_ceil(CHUNK_ROWS);
        let pg = self.scratch(2 * chunks * c)?;
        // SAFETY: the scratch holds 2·chunks·c f32; pb is its second half.
        let pb = unsafe { pg.cast::<f32>().add(chunks * c) }.cast::<c_void>();
        let gx = (c as u64).div_ceil(BLOCK as u64) as u32;
        let args = Args::default()
            .ptr(dout.ptr())
            .ptr(x.ptr())
            .ptr(mean.ptr())
            .ptr(rstd.ptr())
            .ptr(pg)
            .ptr(pb)
            .i32(ni)
            .i32(ci)
            .i32(CHUNK_ROWS as i32);
        self.launch(
            &format!("layernorm_dparams_partial_{}", x.dtype().name()),
            (gx.max(1), chunks as u32),
            args,
        )?;
        for (part, out) in [(pg, &*dgamma), (pb, &*dbeta)] {
            let args = Args::default()
                .ptr(part)
                .ptr(out.ptr())
                .u64(chunks as u64)
                .u64(c as u64);
            self.launch(
                &format!("colsum_finish_{}", out.dtype().name()),
                grid1(c as u64),
                args,
            )?;
        }
        Ok(())
    }

    fn bias_add(&self, x: &mut HipBuffer, bias: &HipBuffer, rows: usize, c: usize) -> Result<()> {
        const OP: &str = "bias_add";
        let v = act_wide(OP, x.dtype(), bias.dtype())?;
        check_len(OP, "x", x, rows * c)?;
        check_len(OP, "bias", bias, c)?;
        let args = Args::default()
            .ptr(x.ptr())
            .ptr(bias.ptr())
            .u64(rows as u64)
            .u64(c as u64);
        self.launch(&format!("{OP}_{v}"), grid1((rows * c) as u64), args)
    }

    fn bias_backward(
        &self,
        dout: &HipBuffer,
        dbias: &mut HipBuffer,
        rows: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "bias_backward";
        act(OP, dout)?;
        act(OP, dbias)?;
        check_len(OP, "dout", dout, rows * c)?;
        check_len(OP, "dbias", dbias, c)?;
        if c == 0 {
            return Ok(());
        }
        self.colsum(dout, rows, c, dbias)
    }

    fn gelu_forward(&self, x: &HipBuffer, out: &mut HipBuffer) -> Result<()> {
        let n = act("gelu_forward", x)?;
        same("gelu_forward", x, out)?;
        check_len("gelu_forward", "out", out, x.len())?;
        self.launch(
            &format!("gelu_forward_{n}"),
            grid1(x.len() as u64),
            Args::default()
                .ptr(x.ptr())
                .ptr(out.ptr())
                .u64(x.len() as u64),
        )
    }

    fn gelu_backward(&self, x: &HipBuffer, dout: &HipBuffer, dx: &mut HipBuffer) -> Result<()> {
        let n = act("gelu_backward", x)?;
        same("gelu_backward", x, dout)?;
        same("gelu_backward", x, dx)?;
        check_len("gelu_backward", "dout", dout, x.len())?;
        check_len("gelu_backward", "dx", dx, x.len())?;
        let args = Args::default()
            .ptr(x.ptr())
            .ptr(dout.ptr())
            .ptr(dx.ptr())
            .u64(x.len() as u64);
        self.launch(&format!("gelu_backward_{n}"), grid1(x.len() as u64), args)
    }

    fn split_heads(
        &self,
        qkv: &HipBuffer,
        q: &mut HipBuffer,
        k: &mut HipBuffer,
        v: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads";
        let n = act(OP, qkv)?;
        let len = b * t * nh * hs;
        check_len(OP, "qkv", qkv, 3 * len)?;
        for (what, x) in [("q", &*q), ("k", &*k), ("v", &*v)] {
            same(OP, qkv, x)?;
            check_len(OP, what, x, len)?;
        }
        let args = Args::default()
            .ptr(qkv.ptr())
            .ptr(q.ptr())
            .ptr(k.ptr())
            .ptr(v.ptr())
            .i32(int("b", b)?)
            .i32(int("t", t)?)
            .i32(int("nh", nh)?)
            .i32(int("hs", hs)?);
        self.launch(&format!("{OP}_{n}"), grid1(len as u64), args)
    }

    fn split_heads_backward(
        &self,
        dq: &HipBuffer,
        dk: &HipBuffer,
        dv: &HipBuffer,
        dqkv: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
    ) -> Result<()> {
        const OP: &str = "split_heads_backward";
        let n = act(OP, dqkv)?;
        let len = b * t * nh * hs;
        check_len(OP, "dqkv", dqkv, 3 * len)?;
        for (what, x) in [("dq", dq), ("dk", dk), ("dv", dv)] {
            same(OP, dqkv, x)?;
            check_len(OP, what, x, len)?;
        }
        let args = Args::default()
            .ptr(dq.ptr())
            .ptr(dk.ptr())
            .ptr(dv.ptr())
            .ptr(dqkv.ptr())
            .i32(int("b", b)?)
            .i32(int("t", t)?)
            .i32(int("nh", nh)?)
            .i32(int("hs", hs)?);
        self.launch(&format!("{OP}_{n}"), grid1(3 * len as u64), args)
    }

    fn merge_heads(
        &self,
        y: &HipBuffer,
        out: &mut HipBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        backward: bool,
    ) -> Result<()> {
        const OP: &str = "merge_heads";
        let n = act(OP, y)?;
        same(OP, y, out)?;
        let len = b * t * nh * hs;
        check_len(OP, "y", y, len)?;
        check_len(OP, "out", out, len)?;
        let args = Args::default()
            .ptr(y.ptr())
            .ptr(out.ptr())
            .i32(int("b", b)?)
            .i32(int("t", t)?)
            .i32(int("nh", nh)?)
            .i32(int("hs", hs)?);
        let name = if backward {
            format!("merge_heads_backward_{n}")
        } else {
            format!("merge_heads_{n}")
        };
        self.launch(&name, grid1(len as u64), args)
    }

    fn softmax_causal_forward(
        &self,
        scores: &HipBuffer,
        probs: &mut HipBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_forward";
        let n = act(OP, scores)?;
        same(OP, scores, probs)?;
        check_len(OP, "scores", scores, rows * t * t)?;
        check_len(OP, "probs", probs, rows * t * t)?;
        if rows * t == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(scores.ptr())
            .ptr(probs.ptr())
            .u64((rows * t) as u64)
            .i32(int("t", t)?)
            .f32(scale);
        self.launch(&format!("{OP}_{n}"), rows_grid(rows * t)?, args)
    }

    fn softmax_causal_backward(
        &self,
        probs: &HipBuffer,
        dprobs: &HipBuffer,
        dscores: &mut HipBuffer,
        rows: usize,
        t: usize,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_causal_backward";
        let n = act(OP, probs)?;
        same(OP, probs, dprobs)?;
        same(OP, probs, dscores)?;
        for (what, x) in [("probs", probs), ("dprobs", dprobs), ("dscores", &*dscores)] {
            check_len(OP, what, x, rows * t * t)?;
        }
        if rows * t == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(probs.ptr())
            .ptr(dprobs.ptr())
            .ptr(dscores.ptr())
            .u64((rows * t) as u64)
            .i32(int("t", t)?)
            .f32(scale);
        self.launch(&format!("{OP}_{n}"), rows_grid(rows * t)?, args)
    }

    fn cross_entropy(
        &self,
        logits: &HipBuffer,
        targets: &HipBuffer,
        losses: &mut HipBuffer,
        dlogits: Option<&mut HipBuffer>,
        n: usize,
        v: usize,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "cross_entropy";
        let name = act(OP, logits)?;
        check_dtype(OP, targets, DType::I32)?;
        check_dtype(OP, losses, DType::F32)?;
        check_len(OP, "logits", logits, n * v)?;
        check_len(OP, "targets", targets, n)?;
        check_len(OP, "losses", losses, n)?;
        let dl = match dlogits {
            Some(d) => {
                same(OP, logits, d)?;
                check_len(OP, "dlogits", d, n * v)?;
                d.ptr()
            }
            None => std::ptr::null_mut(),
        };
        if n == 0 {
            return Ok(());
        }
        let args = Args::default()
            .ptr(logits.ptr())
            .ptr(targets.ptr())
            .ptr(losses.ptr())
            .ptr(dl)
            .i32(int("v", v)?)
            .f32(grad_scale);
        self.launch(&format!("{OP}_{name}"), rows_grid(n)?, args)
    }

    fn adamw(
        &self,
        param: &mut HipBuffer,
        grad: &HipBuffer,
        m: &mut HipBuffer,
        v: &mut HipBuffer,
        step: &AdamWStep,
        param_copy: Option<&mut HipBuffer>,
    ) -> Result<()> {
        const OP: &str = "adamw";
        let n = param.len();
        check_dtype(OP, param, DType::F32)?;
        check_dtype(OP, m, DType::F32)?;
        check_dtype(OP, v, DType::F32)?;
        let g = act(OP, grad)?;
        check_len(OP, "grad", grad, n)?;
        check_len(OP, "m", m, n)?;
        check_len(OP, "v", v, n)?;
        let (copy, cdt) = match param_copy {
            Some(c) => {
                check_len(OP, "param_copy", c, n)?;
                if !c.dtype().is_float() {
                    return Err(unsupported("adamw param_copy", c.dtype()));
                }
                (c.ptr(), c.dtype())
            }
            None => (std::ptr::null_mut(), DType::F32),
        };
        let s = step;
        let args = Args::default()
            .ptr(param.ptr())
            .ptr(grad.ptr())
            .ptr(m.ptr())
            .ptr(v.ptr())
            .ptr(copy)
            .u64(n as u64)
            .f32(s.lr)
            .f32(s.beta1)
            .f32(s.beta2)
            .f32(s.eps)
            .f32(s.weight_decay)
            .f32(s.bias_correction1)
            .f32(s.bias_correction2)
            .f32(s.grad_scale);
        self.launch(&format!("adamw_{g}_{}", cdt.name()), grid1(n as u64), args)
    }

    fn sum_squares(&self, x: &HipBuffer, out: &mut HipBuffer, slot: usize) -> Result<()> {
        const OP: &str = "sum_squares";
        if !x.dtype().is_float() {
            return Err(unsupported(OP, x.dtype()));
        }
        check_dtype(OP, out, DType::F32)?;
        check_range(OP, slot, 1, out.len())?;
        let blocks = grid1(x.len() as u64).0.min(SUMSQ_BLOCKS as u32);
        let part = self.scratch(blocks as usize)?;
        let args = Args::default().ptr(x.ptr()).u64(x.len() as u64).ptr(part);
        self.launch(
            &format!("sum_squares_partial_{}", x.dtype().name()),
            (blocks, 1),
            args,
        )?;
        let args = Args::default()
            .ptr(part)
            .i32(blocks as i32)
            .ptr(out.ptr())
            .u64(slot as u64);
        self.launch("sum_squares_finish", (1, 1), args)
    }

    fn quantize_fp8(
        &self,
        src: &HipBuffer,
        dst: &mut HipBuffer,
        dst_t: Option<&mut HipBuffer>,
        rows: usize,
        cols: usize,
        scale: &HipBuffer,
        amax: &mut HipBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "quantize_fp8";
        let s = act(OP, src)?;
        if !dst.dtype().is_fp8() {
            return Err(unsupported(OP, dst.dtype()));
        }
        let n = rows.checked_mul(cols).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{OP}: {rows} × {cols} overflows"))
        })?;
        check_len(OP, "src", src, n)?;
        check_len(OP, "dst", dst, n)?;
        if let Some(t) = &dst_t {
            check_dtype(OP, *t, dst.dtype())?;
            check_len(OP, "dst_t", *t, n)?;
        }
        check_dtype(OP, scale, DType::F32)?;
        check_dtype(OP, amax, DType::F32)?;
        check_range(OP, slot, 1, scale.len())?;
        check_range(OP, slot, 1, amax.len())?;
        if n == 0 {
            return Ok(());
        }
        // quantize_S_D(const S*, D*, D* dst_t (or null), u64 rows, u64 cols, const float*,
        // float*): src, dst (and dst_t) hold rows × cols elements; scale/amax at slot (checked).
        let args = Args::default()
            .ptr(src.ptr())
            .ptr(dst.ptr())
            .ptr(dst_t.map_or(std::ptr::null_mut(), |t| t.ptr()))
            .u64(rows as u64)
            .u64(cols as u64)
            .ptr(scale.ptr_at(slot))
            .ptr(amax.ptr_at(slot));
        self.launch(
            &format!("quantize_{s}_{}", dst.dtype().name()),
            grid1(n as u64),
            args,
        )
    }

    fn gemm_fp8(
        &self,
        desc: &GemmDesc,
        a: &HipBuffer,
        b: &HipBuffer,
        c: &mut HipBuffer,
        scale_inv: &HipBuffer,
        a_slot: usize,
        b_slot: usize,
    ) -> Result<()> {
        const OP: &str = "gemm_fp8";
        for x in [a, b] {
            if !x.dtype().is_fp8() {
                return Err(unsupported(OP, x.dtype()));
            }
        }
        check_dtype(OP, scale_inv, DType::F32)?;
        check_range(OP, a_slot, 1, scale_inv.len())?;
        check_range(OP, b_slot, 1, scale_inv.len())?;
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        let lt = self.lt.as_ref().ok_or_else(|| {
            unsupported("gemm_fp8 (needs hipBLASLt, which was not found)", a.dtype())
        })?;
        let lt = lt
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("hipBLASLt lock poisoned".into()))?;
        let scales = (scale_inv.ptr_at(a_slot), scale_inv.ptr_at(b_slot));
        blas::gemm_fp8(
            &lt,
            &self.arch_base,
            self.stream.raw(),
            desc,
            a,
            b,
            c,
            Some(scales),
        )
    }
}
