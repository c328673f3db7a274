//! The kernel modules: their sources (embedded from `kernels-cuda/`), NVRTC compilation to
//! CUBIN for the device's architecture, the on-disk cache, and launching.
//!
//! Each `kernels-cuda/*.cu` file is one module; every entry point is an `extern "C"` function
//! named `<op>_<dtype>[_<dtype>]`. Before compiling, the line `#include "common.cuh"` is
//! replaced by the embedded text of `kernels-cuda/common.cuh`, so no file or CUDA header is
//! needed at run time.
//!
//! Cache: `$DUET_CUDA_CACHE_DIR`, else `$XDG_CACHE_HOME/duet/cuda`, else `~/.cache/duet/cuda`
//! (set `DUET_CUDA_CACHE_DIR=off` to disable). File names carry a 128-bit FNV-1a hash of the
//! prepared source, the NVRTC options, the architecture and the NVRTC version. A missing,
//! unreadable or unwritable cache only costs a recompile; a cached CUBIN the driver refuses is
//! recompiled and replaced.

use crate::error::{self, BACKEND};
use crate::loader::{self, CudaLib};
use crate::memory::CudaBuffer;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{Ptx, result as nvrtc_result, sys as nvrtc_sys};
use duet_device::{DeviceError, Result};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// Shared helpers included by every kernel file, as written (it includes the shared math).
const COMMON_RAW: &str = include_str!("../../../kernels-cuda/common.cuh");
const INCLUDE_LINE: &str = "#include \"common.cuh\"";
/// `common.cuh` with the shared math pasted in for its include line
/// ([`duet_gpu::shared_math`]): what every kernel file gets for its `#include "common.cuh"`, so
/// NVRTC needs no file and the cache key covers both.
pub fn common_header() -> &'static str {
    static HEADER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HEADER.get_or_init(|| duet_gpu::shared_math::with_shared_math(COMMON_RAW))
}

/// NVRTC options besides `--gpu-architecture` (keep in sync with scripts/check_cuda_kernels.py).
pub const NVRTC_OPTIONS: &[&str] = &["--std=c++17"];

/// Environment variable naming the kernel cache folder (`off` disables the cache;
/// [`duet_device::knobs::Knobs::cuda_cache_dir`]).
pub use duet_device::knobs::CUDA_CACHE_DIR as CACHE_DIR_ENV;

/// One kernel source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelModule {
    Elementwise,
    Reduce,
    Embedding,
    LayerNorm,
    Softmax,
    CrossEntropy,
    Attention,
    AdamW,
    Fp8,
    Fp8Scaling,
    FlashAttention,
}

impl KernelModule {
    pub const ALL: [KernelModule; 11] = [
        Self::Elementwise,
        Self::Reduce,
        Self::Embedding,
        Self::LayerNorm,
        Self::Softmax,
        Self::CrossEntropy,
        Self::Attention,
        Self::AdamW,
        Self::Fp8,
        Self::Fp8Scaling,
        Self::FlashAttention,
    ];

    pub fn file_name(self) -> &'static str {
        match self {
            Self::Elementwise => "elementwise.cu",
            Self::Reduce => "reduce.cu",
            Self::Embedding => "embedding.cu",
            Self::LayerNorm => "layernorm.cu",
            Self::Softmax => "softmax.cu",
            Self::CrossEntropy => "cross_entropy.cu",
            Self::Attention => "attention.cu",
            Self::AdamW => "adamw.cu",
            Self::Fp8 => "fp8.cu",
            Self::Fp8Scaling => "fp8_scaling.cu",
            Self::FlashAttention => "flash_attention.cu",
        }
    }

    fn raw_source(self) -> &'static str {
        match self {
            Self::Elementwise => include_str!("../../../kernels-cuda/elementwise.cu"),
            Self::Reduce => include_str!("../../../kernels-cuda/reduce.cu"),
            Self::Embedding => include_str!("../../../kernels-cuda/embedding.cu"),
            Self::LayerNorm => include_str!("../../../kernels-cuda/layernorm.cu"),
            Self::Softmax => include_str!("../../../kernels-cuda/softmax.cu"),
            Self::CrossEntropy => include_str!("../../../kernels-cuda/cross_entropy.cu"),
            Self::Attention => include_str!("../../../kernels-cuda/attention.cu"),
            Self::AdamW => include_str!("../../../kernels-cuda/adamw.cu"),
            Self::Fp8 => include_str!("../../../kernels-cuda/fp8.cu"),
            Self::Fp8Scaling => include_str!("../../../kernels-cuda/fp8_scaling.cu"),
            Self::FlashAttention => include_str!("../../../kernels-cuda/flash_attention.cu"),
        }
    }

    /// The source NVRTC compiles: the file with `common.cuh` (and the shared math in it) pasted
    /// in.
    pub fn source(self) -> String {
        self.raw_source().replacen(INCLUDE_LINE, common_header(), 1)
    }
}

/// NVRTC's version as (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    loader::require(&[CudaLib::Nvrtc])?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| error::nvrtc("nvrtcVersion", e))?;
    Ok((major, minor))
}

fn options(arch: &str) -> Result<Vec<String>> {
    let mut o: Vec<String> = NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect();
    o.push(format!("--gpu-architecture={arch}"));
    // Kernel experiments: extra options (e.g. `-DQT_GRAD_MIN_BLOCKS=12`), part of the cache key.
    if let Some(extra) = &duet_device::knobs::device_knobs()?.nvrtc_extra {
        o.extend(extra.split_whitespace().map(str::to_string));
    }
    Ok(o)
}

/// Extra NVRTC options (whitespace-separated) for kernel experiments, such as `-D` overrides of
/// the tuning macros; they enter the cache key like the built-in options
/// ([`duet_device::knobs::Knobs::nvrtc_extra`]).
pub use duet_device::knobs::NVRTC_EXTRA as NVRTC_EXTRA_ENV;

/// Destroys an NVRTC program when dropped.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by nvrtcCreateProgram and is destroyed only here.
        let _ = unsafe { nvrtc_result::destroy_program(self.0) };
    }
}

/// Compiles `module` with NVRTC to a CUBIN for `arch` (e.g. "sm_90"). Needs NVRTC only, no GPU.
pub fn compile(module: KernelModule, arch: &str) -> Result<Vec<u8>> {
    compile_source(module.file_name(), &module.source(), arch)
}

/// Compiles CUDA source `src` (named `name` in messages) with the backend's NVRTC options to a
/// CUBIN for `arch`. Errors carry the options and NVRTC's log.
pub fn compile_source(name: &str, src: &str, arch: &str) -> Result<Vec<u8>> {
    loader::require(&[CudaLib::Nvrtc])?;
    let compile_err = |log: String| DeviceError::Compile {
        backend: BACKEND,
        module: name.to_string(),
        log,
    };
    let src = CString::new(src).map_err(|_| compile_err("source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| compile_err("name contains a NUL byte".into()))?;
    let prog = Program(
        nvrtc_result::create_program(&src, Some(&cname))
            .map_err(|e| error::nvrtc("nvrtcCreateProgram", e))?,
    );
    let opts = options(arch)?;
    // SAFETY: `prog` is a live program; `src` and `cname` outlive it (dropped after `prog`).
    let compiled = unsafe { nvrtc_result::compile_program(prog.0, &opts) };
    // SAFETY: as above.
    let log = unsafe { nvrtc_result::get_program_log(prog.0) }
        .map(|raw| {
            let bytes: Vec<u8> = raw
                .iter()
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        })
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(compile_err(format!(
            "{:?} with options [{}]\n{log}",
            e.0,
            opts.join(" ")
        )));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is an out-parameter.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| error::nvrtc("nvrtcGetCUBINSize", e))?;
    if size == 0 {
        return Err(compile_err(format!(
            "NVRTC produced no CUBIN for {arch} (options [{}])",
            opts.join(" ")
        )));
    }
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has exactly the size NVRTC reported.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| error::nvrtc("nvrtcGetCUBIN", e))?;
    Ok(cubin)
}

/// 128-bit FNV-1a.
fn fnv1a128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    let mut h = OFFSET;
    for part in parts {
        for &b in *part {
            h ^= b as u128;
            h = h.wrapping_mul(PRIME);
        }
        // Separator, so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The kernel cache folder, or why there is none.
pub fn cache_dir() -> std::result::Result<PathBuf, String> {
    let knobs = duet_device::knobs::knobs().map_err(|e| e.to_string())?;
    let dir = match &knobs.cuda_cache_dir {
        Some(v) if v.as_os_str() == "off" => {
            return Err(format!("disabled by {CACHE_DIR_ENV}"));
        }
        Some(v) => v.clone(),
        None => match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
            (Some(x), _) if !x.is_empty() => PathBuf::from(x).join("duet/cuda"),
            (_, Some(h)) if !h.is_empty() => PathBuf::from(h).join(".cache/duet/cuda"),
            _ => return Err("neither XDG_CACHE_HOME nor HOME is set".into()),
        },
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn cache_file(
    dir: &std::path::Path,
    module: KernelModule,
    arch: &str,
    nvrtc: (i32, i32),
) -> Result<PathBuf> {
    let src = module.source();
    let opts = options(arch)?.join(" ");
    let ver = format!("{}.{}", nvrtc.0, nvrtc.1);
    let key = fnv1a128(&[
        src.as_bytes(),
        opts.as_bytes(),
        arch.as_bytes(),
        ver.as_bytes(),
    ]);
    let stem = module.file_name().trim_end_matches(".cu");
    Ok(dir.join(format!("{stem}-{arch}-{key:032x}.cubin")))
}

/// Writes `bytes` to `path` atomically (temp file + rename); failures are ignored.
fn write_cache(path: &std::path::Path, bytes: &[u8]) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{seq}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Where a module's CUBIN came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Cache,
    Compiled,
}

/// The loaded modules of one device and a cache of looked-up functions.
pub(crate) struct Kernels {
    modules: HashMap<KernelModule, Arc<CudaModule>>,
    funcs: RwLock<HashMap<String, CudaFunction>>,
    /// Human-readable summary for `info()`.
    pub(crate) summary: String,
}

impl Kernels {
    /// Loads every module for `arch`, from the disk cache or compiled with NVRTC (in parallel).
    pub(crate) fn load_all(ctx: &Arc<CudaContext>, arch: &str) -> Result<Self> {
        let nvrtc = nvrtc_version()?;
        let dir = cache_dir();
        let start = std::time::Instant::now();
        let images: Vec<Result<(Vec<u8>, Origin)>> = std::thread::scope(|s| {
            let handles: Vec<_> = KernelModule::ALL
                .iter()
                .map(|&m| {
                    let dir = dir.as_ref().ok().cloned();
                    s.spawn(move || -> Result<(Vec<u8>, Origin)> {
                        if let Some(d) = &dir
                            && let Ok(bytes) = std::fs::read(cache_file(d, m, arch, nvrtc)?)
                            && !bytes.is_empty()
                        {
                            return Ok((bytes, Origin::Cache));
                        }
                        let cubin = compile(m, arch)?;
                        if let Some(d) = &dir {
                            write_cache(&cache_file(d, m, arch, nvrtc)?, &cubin);
                        }
                        Ok((cubin, Origin::Compiled))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|p| {
                        Err(DeviceError::Compile {
                            backend: BACKEND,
                            module: "?".into(),
                            log: format!("compiler thread panicked: {}", error::panic_message(&*p)),
                        })
                    })
                })
                .collect()
        });
        let mut modules = HashMap::new();
        let (mut cached, mut compiled) = (0, 0);
        for (&m, image) in KernelModule::ALL.iter().zip(images) {
            let (bytes, origin) = image?;
            let module = match ctx.load_module(Ptx::from_binary(bytes)) {
                Ok(module) => {
                    if origin == Origin::Cache {
                        cached += 1;
                    } else {
                        compiled += 1;
                    }
                    module
                }
                Err(e) if origin == Origin::Cache => {
                    // A stale or damaged cache entry: rebuild it.
                    let cubin = compile(m, arch)?;
                    if let Ok(d) = &dir {
                        write_cache(&cache_file(d, m, arch, nvrtc)?, &cubin);
                    }
                    compiled += 1;
                    ctx.load_module(Ptx::from_binary(cubin)).map_err(|e2| {
                        error::driver(
                            format!("cuModuleLoadData({}) after {e:?}", m.file_name()),
                            e2,
                        )
                    })?
                }
                Err(e) => {
                    return Err(error::driver(
                        format!("cuModuleLoadData({})", m.file_name()),
                        e,
                    ));
                }
            };
            modules.insert(m, module);
        }
        let summary = format!(
            "{} modules for {arch} ({compiled} compiled by NVRTC {}.{}, {cached} from cache) in {:.0} ms; cache: {}",
            KernelModule::ALL.len(),
            nvrtc.0,
            nvrtc.1,
            start.elapsed().as_secs_f64() * 1e3,
            match &dir {
                Ok(d) => d.display().to_string(),
                Err(why) => format!("none ({why})"),
            }
        );
        Ok(Self {
            modules,
            funcs: RwLock::new(HashMap::new()),
            summary,
        })
    }

    /// The entry point `name` of `module`.
    pub(crate) fn get(&self, module: KernelModule, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.funcs.read().ok().and_then(|m| m.get(name).cloned()) {
            return Ok(f);
        }
        let m = self
            .modules
            .get(&module)
            .ok_or_else(|| DeviceError::Driver {
                backend: BACKEND,
                call: "load_function".into(),
                message: format!("module {} is not loaded", module.file_name()),
            })?;
        let f = m
            .load_function(name)
            .map_err(|e| error::driver(format!("cuModuleGetFunction({name})"), e))?;
        if let Ok(mut map) = self.funcs.write() {
            map.insert(name.to_string(), f.clone());
        }
        Ok(f)
    }
}

/// A kernel argument. Device pointers are passed as `U64`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg {
    U64(u64),
    I32(i32),
    F32(f32),
}

/// One kernel launch being put together: the function, the launch shape and the arguments in
/// the order of the kernel's C parameter list. Made by [`CudaDevice::kernel`] (look up and
/// launch) or [`CudaDevice::launcher`] (a function looked up before, e.g. to set its
/// shared-memory attribute or to launch it more than once); grid and block start at (1, 1, 1),
/// dynamic shared memory at 0. Every argument is pushed with the method of its C type, so the
/// value handed to the driver is exactly the one given.
///
/// Building is safe; [`Launch::launch`] is `unsafe`, and each call site states in a
/// `// SAFETY:` comment the kernel's signature and why every pointer covers what the kernel
/// touches for the sizes and the launch shape given.
///
/// [`CudaDevice::kernel`]: crate::CudaDevice
/// [`CudaDevice::launcher`]: crate::CudaDevice
#[must_use = "a kernel launch does nothing until `launch` is called"]
pub(crate) struct Launch<'a> {
    stream: &'a CudaStream,
    func: CudaFunction,
    cfg: LaunchConfig,
    args: Vec<Arg>,
}

impl<'a> Launch<'a> {
    /// A launch of `func` on `stream`, grid and block (1, 1, 1), no dynamic shared memory.
    pub(crate) fn new(stream: &'a CudaStream, func: CudaFunction) -> Self {
        Self {
            stream,
            func,
            cfg: LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1, 1, 1),
                shared_mem_bytes: 0,
            },
            args: Vec::new(),
        }
    }

    /// Blocks per grid (x, y, z). A zero in any dimension makes [`Launch::launch`] a no-op.
    pub(crate) fn grid(mut self, grid: (u32, u32, u32)) -> Self {
        self.cfg.grid_dim = grid;
        self
    }

    /// Threads per block (x, y, z).
    pub(crate) fn block(mut self, block: (u32, u32, u32)) -> Self {
        self.cfg.block_dim = block;
        self
    }

    /// Bytes of dynamic shared memory per block.
    pub(crate) fn shared_mem(mut self, bytes: u32) -> Self {
        self.cfg.shared_mem_bytes = bytes;
        self
    }

    /// A pointer parameter: the device address of `buf`'s first element.
    pub(crate) fn arg_buf(self, buf: &CudaBuffer) -> Self {
        self.arg_ptr(buf.ptr())
    }

    /// A pointer parameter given as a device address (0 for a null pointer).
    pub(crate) fn arg_ptr(self, ptr: u64) -> Self {
        self.arg(Arg::U64(ptr))
    }

    /// An `unsigned long long` / `long long` parameter.
    pub(crate) fn arg_u64(self, v: u64) -> Self {
        self.arg(Arg::U64(v))
    }

    /// An `int` (or `unsigned`) parameter.
    pub(crate) fn arg_i32(self, v: i32) -> Self {
        self.arg(Arg::I32(v))
    }

    /// A `float` parameter.
    pub(crate) fn arg_f32(self, v: f32) -> Self {
        self.arg(Arg::F32(v))
    }

    /// Appends `args` as they are (argument lists built up front, e.g. shared by two kernels).
    pub(crate) fn args(mut self, args: &[Arg]) -> Self {
        self.args.extend_from_slice(args);
        self
    }

    fn arg(mut self, a: Arg) -> Self {
        self.args.push(a);
        self
    }

    /// Queues the kernel on the stream (nothing when a grid dimension is 0).
    ///
    /// # Safety
    /// The arguments must match the kernel's C parameter list in number, order and type
    /// (`arg_buf`/`arg_ptr`/`arg_u64` for pointers, `unsigned long long` and `long long`;
    /// `arg_i32` for `int`; `arg_f32` for `float`), every pointer must refer to live device
    /// memory covering every element the kernel touches for the given sizes and launch shape,
    /// and the block size and shared memory must be ones the kernel is written for.
    pub(crate) unsafe fn launch(self) -> Result<()> {
        let c = self.cfg;
        if c.grid_dim.0 == 0 || c.grid_dim.1 == 0 || c.grid_dim.2 == 0 {
            return Ok(());
        }
        let mut builder = self.stream.launch_builder(&self.func);
        for a in &self.args {
            match a {
                Arg::U64(v) => builder.arg(v),
                Arg::I32(v) => builder.arg(v),
                Arg::F32(v) => builder.arg(v),
            };
        }
        // SAFETY: the one place duet's CUDA backend launches a kernel. The caller guarantees
        // the argument list, the memory ranges and the launch shape (see `# Safety`);
        // `self.args` outlives `builder`, so every reference pushed is valid during the call.
        unsafe { builder.launch(c) }
            .map(|_| ())
            .map_err(|e| error::driver("cuLaunchKernel", e))
    }
}

/// An argument a kernel cannot take (e.g. a dimension beyond 32 bits).
pub(crate) fn too_large(op: &'static str, what: &str, v: usize) -> DeviceError {
    duet_gpu::launch::kernel_too_large("CUDA", op, what, v)
}

/// Converts a dimension to the `int` a kernel takes, or [`too_large`].
pub(crate) fn dim(op: &'static str, what: &str, v: usize) -> Result<i32> {
    duet_gpu::launch::kernel_int("CUDA", op, what, v)
}

/// A grid dimension of `blocks` blocks (at most `i32::MAX`), or [`too_large`].
pub(crate) fn grid_dim(op: &'static str, blocks: usize) -> Result<u32> {
    duet_gpu::launch::kernel_grid_dim("CUDA", op, blocks)
}

/// The product of `dims` (an element count), or [`DeviceError::Shape`] when it overflows.
pub(crate) fn checked_product(op: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| DeviceError::Shape {
            op,
            detail: format!("{dims:?} overflows"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_includes_the_common_header() {
        for m in KernelModule::ALL {
            let src = m.source();
            assert!(
                !src.lines().any(|l| l.trim() == INCLUDE_LINE),
                "{} keeps its include",
                m.file_name()
            );
            assert!(
                src.contains("warp_sum"),
                "{} lacks common.cuh",
                m.file_name()
            );
            assert!(
                !src.lines()
                    .any(|l| l.trim() == duet_gpu::shared_math::MATH_INCLUDE_LINE)
                    && src.contains("DUET_SFN float duet_exp_f32("),
                "{} lacks the shared math",
                m.file_name()
            );
        }
    }

    #[test]
    fn cache_keys_depend_on_arch_and_version() {
        let d = std::path::Path::new("/tmp");
        let a = cache_file(d, KernelModule::Reduce, "sm_90", (13, 0)).unwrap();
        let b = cache_file(d, KernelModule::Reduce, "sm_80", (13, 0)).unwrap();
        let c = cache_file(d, KernelModule::Reduce, "sm_90", (13, 1)).unwrap();
        let e = cache_file(d, KernelModule::Softmax, "sm_90", (13, 0)).unwrap();
        assert!(a != b && a != c && a != e);
        assert_eq!(
            a,
            cache_file(d, KernelModule::Reduce, "sm_90", (13, 0)).unwrap()
        );
    }
}
