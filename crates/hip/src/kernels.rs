//! The HIP kernels (`kernels-hip/*.hip`, embedded at build time), compiled by hiprtc for the
//! device's `gcnArchName` when the device opens, cached on disk, and launched by name.
//!
//! Cache: `$DUET_HIP_CACHE`, else `$XDG_CACHE_HOME/duet/hip`, else `~/.cache/duet/hip`; one
//! code object per module, keyed by a hash of the module source, the shared header, the compile
//! options (which hold the target ID and wavefront size) and the compiler's identity
//! ([`crate::toolchain::Toolchain`]: HIP runtime version, hiprtc and comgr library files, comgr
//! version; not `hiprtcVersion`, which ROCm hard-codes). A failed cache write only costs a
//! recompile next time; a cached code object that `hipModuleLoadData` refuses is deleted and
//! rebuilt once ([`load_module`]).

use crate::error::HipError;
use crate::hip::result::HipApi;
use crate::hip::safe::{Function, Module, Stream};
use crate::hiprtc::result::RtcApi;
use crate::hiprtc::safe::{CompileFailure, compile};
use crate::memory::HipBuffer;
use crate::toolchain::Toolchain;
use duet_device::{DeviceError, Result};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The shared device header every module includes as `"duet_hip.h"`, as written (it includes
/// the shared math).
const HEADER_RAW: &str = include_str!("../../../kernels-hip/duet_hip.h");
/// `duet_hip.h` with the shared math pasted in for its include line
/// ([`duet_gpu::shared_math`]): the one header hiprtc gets (as `"duet_hip.h"`), so the compile
/// needs no file and the cache key covers both.
pub fn header() -> &'static str {
    static HEADER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HEADER.get_or_init(|| duet_gpu::shared_math::with_shared_math(HEADER_RAW))
}

/// One kernel source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelModule {
    Adamw,
    Attention,
    CrossEntropy,
    Elementwise,
    Embedding,
    Layernorm,
    Reduce,
    Fp8,
    Fp8Scaling,
    FlashAttention,
}

impl KernelModule {
    pub const ALL: [KernelModule; 10] = [
        Self::Adamw,
        Self::Attention,
        Self::CrossEntropy,
        Self::Elementwise,
        Self::Embedding,
        Self::Layernorm,
        Self::Reduce,
        Self::Fp8,
        Self::Fp8Scaling,
        Self::FlashAttention,
    ];

    pub fn file(self) -> &'static str {
        match self {
            Self::Adamw => "adamw.hip",
            Self::Attention => "attention.hip",
            Self::CrossEntropy => "cross_entropy.hip",
            Self::Elementwise => "elementwise.hip",
            Self::Embedding => "embedding.hip",
            Self::Layernorm => "layernorm.hip",
            Self::Reduce => "reduce.hip",
            Self::Fp8 => "fp8.hip",
            Self::Fp8Scaling => "fp8_scaling.hip",
            Self::FlashAttention => "flash_attention.hip",
        }
    }

    pub fn source(self) -> &'static str {
        match self {
            Self::Adamw => include_str!("../../../kernels-hip/adamw.hip"),
            Self::Attention => include_str!("../../../kernels-hip/attention.hip"),
            Self::CrossEntropy => include_str!("../../../kernels-hip/cross_entropy.hip"),
            Self::Elementwise => include_str!("../../../kernels-hip/elementwise.hip"),
            Self::Embedding => include_str!("../../../kernels-hip/embedding.hip"),
            Self::Layernorm => include_str!("../../../kernels-hip/layernorm.hip"),
            Self::Reduce => include_str!("../../../kernels-hip/reduce.hip"),
            Self::Fp8 => include_str!("../../../kernels-hip/fp8.hip"),
            Self::Fp8Scaling => include_str!("../../../kernels-hip/fp8_scaling.hip"),
            Self::FlashAttention => include_str!("../../../kernels-hip/flash_attention.hip"),
        }
    }

    /// The module holding the kernel `name` (by its op prefix).
    pub fn of(name: &str) -> Option<Self> {
        const PREFIXES: [(&str, KernelModule); 20] = [
            ("adamw_", KernelModule::Adamw),
            ("split_heads", KernelModule::Attention),
            ("merge_heads", KernelModule::Attention),
            ("softmax_causal", KernelModule::Attention),
            ("cross_entropy_", KernelModule::CrossEntropy),
            ("cast_", KernelModule::Elementwise),
            ("scale_", KernelModule::Elementwise),
            ("add_", KernelModule::Elementwise),
            ("gelu_", KernelModule::Elementwise),
            ("bias_add_", KernelModule::Elementwise),
            ("embedding_", KernelModule::Embedding),
            ("layernorm_", KernelModule::Layernorm),
            ("sum_squares_", KernelModule::Reduce),
            ("colsum_", KernelModule::Reduce),
            ("add_assign_", KernelModule::Elementwise),
            ("quantize_", KernelModule::Fp8),
            ("zero_many", KernelModule::Reduce),
            ("check_ids", KernelModule::Embedding),
            ("fp8_scaling_", KernelModule::Fp8Scaling),
            ("flash_attention_", KernelModule::FlashAttention),
        ];
        PREFIXES
            .iter()
            .find(|(p, _)| name.starts_with(p))
            .map(|&(_, m)| m)
    }
}

/// hiprtc options for a target: `--offload-arch=<gcnArchName>`, the wavefront size, and
/// `-ffp-contract=off`: clang's HIP default (`fast`) fuses any a·b + c into an FMA, so results
/// would depend on the optimiser; with contraction off every FMA is an explicit `duet_fma`
/// (kernels-hip/duet_hip.h), placed where the CUDA kernels round the same way.
pub fn options(arch: &str, warp: i32) -> Vec<String> {
    vec![
        format!("--offload-arch={arch}"),
        "-O3".into(),
        "-std=c++17".into(),
        "-ffp-contract=off".into(),
        // What CUDA's __fdiv_rn/__fsqrt_rn/IEEE f32 give (clang's HIP defaults today; pinned
        // so the compiler's defaults cannot change the bits, and part of the cache key).
        "-fhip-fp32-correctly-rounded-divide-sqrt".into(),
        "-fno-gpu-flush-denormals-to-zero".into(),
        format!("-DDUET_WARP={warp}"),
    ]
}

/// FNV-1a 64 over the parts, each followed by a separator.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The cache file name of a module's code object. `toolchain` is
/// [`crate::toolchain::Toolchain::fingerprint`].
pub fn cache_name(module: KernelModule, arch: &str, toolchain: &str, opts: &[String]) -> String {
    let o = opts.join(" ");
    let key = fnv1a(&[
        module.source().as_bytes(),
        header().as_bytes(),
        o.as_bytes(),
        arch.as_bytes(),
        toolchain.as_bytes(),
    ]);
    let safe_arch: String = arch
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!(
        "{}-{safe_arch}-{key:016x}.co",
        module.file().trim_end_matches(".hip")
    )
}

/// The kernel cache folder: `DUET_HIP_CACHE` ([`duet_device::knobs::Knobs::hip_cache`]), else
/// `$XDG_CACHE_HOME/duet/hip`, else `~/.cache/duet/hip`; `None` when none is known. A malformed
/// `DUET_*` variable is an error.
pub fn cache_dir() -> Result<Option<PathBuf>> {
    if let Some(d) = &duet_device::knobs::device_knobs()?.hip_cache {
        return Ok(Some(d.clone()));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(Some(PathBuf::from(d).join("duet/hip")));
    }
    Ok(std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/duet/hip")))
}

/// Compiles one module with hiprtc (never from the cache).
pub fn compile_module(rtc: &RtcApi, module: KernelModule, opts: &[String]) -> Result<Vec<u8>> {
    compile(
        rtc,
        module.file(),
        module.source(),
        &[("duet_hip.h", header())],
        opts,
    )
    .map_err(|e| match e {
        CompileFailure::Source(log) => DeviceError::Compile {
            backend: "hip",
            module: module.file().into(),
            log: format!("options: {}\n{log}", opts.join(" ")),
        },
        CompileFailure::Api(e) => e.into(),
    })
}

/// Writes `code` to `path` through a temporary file and a rename (a reader never sees half a
/// file); a failure only costs a recompile next time.
fn write_cache(path: &Path, code: &[u8]) {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::create_dir_all(path.parent().unwrap_or(path))
        .and_then(|_| std::fs::write(&tmp, code))
        .and_then(|_| std::fs::rename(&tmp, path));
    if ok.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Loads one module: from the cache file `cache` when it exists, else compiled (`compile`)
/// and written there. When the runtime refuses a cached code object (`load` fails: a stale
/// or corrupt file, or one from a compiler the key could not tell apart), the file is
/// deleted, the module recompiled and loaded once more; a freshly compiled object that fails
/// to load is an error naming the module and the target.
pub fn load_module<T>(
    module: KernelModule,
    arch: &str,
    cache: Option<&Path>,
    compile: &mut dyn FnMut() -> Result<Vec<u8>>,
    load: &mut dyn FnMut(&[u8]) -> std::result::Result<T, HipError>,
) -> Result<T> {
    let mut stale = None;
    if let Some(path) = cache
        && let Some(bytes) = std::fs::read(path).ok().filter(|b| !b.is_empty())
    {
        match load(&bytes) {
            Ok(m) => return Ok(m),
            Err(e) => {
                // Never offer the refused file again, whatever happens next.
                let _ = std::fs::remove_file(path);
                stale = Some(e);
            }
        }
    }
    let code = compile()?;
    if let Some(path) = cache {
        write_cache(path, &code);
    }
    load(&code).map_err(|e| {
        let before = stale.map_or(String::new(), |s| {
            format!(" (the cached code object, now deleted, had failed too: {s})")
        });
        DeviceError::Driver {
            backend: "hip",
            call: "hipModuleLoadData".into(),
            message: format!(
                "kernel module {} freshly compiled for {arch} does not load: {e}{before}",
                module.file()
            ),
        }
    })
}

/// Loaded modules and a cache of looked-up kernels.
pub struct Kernels {
    funcs: Mutex<HashMap<String, Function>>,
    modules: HashMap<KernelModule, Module>,
}

impl Kernels {
    /// Compiles (or loads from the cache) and loads every module ([`load_module`]).
    pub fn load(
        api: &Arc<HipApi>,
        rtc: &RtcApi,
        toolchain: &Toolchain,
        arch: &str,
        warp: i32,
    ) -> Result<Self> {
        let opts = options(arch, warp);
        let dir = cache_dir()?;
        let fingerprint = toolchain.fingerprint();
        let mut modules = HashMap::new();
        for m in KernelModule::ALL {
            let path = dir
                .as_ref()
                .map(|d| d.join(cache_name(m, arch, &fingerprint, &opts)));
            let module = load_module(
                m,
                arch,
                path.as_deref(),
                &mut || compile_module(rtc, m, &opts),
                &mut |code| Module::load(api.clone(), code),
            )?;
            modules.insert(m, module);
        }
        Ok(Self {
            funcs: Mutex::new(HashMap::new()),
            modules,
        })
    }

    pub fn get(&self, name: &str) -> Result<Function> {
        if let Some(f) = self.funcs.lock().ok().and_then(|m| m.get(name).copied()) {
            return Ok(f);
        }
        let module = KernelModule::of(name)
            .and_then(|m| self.modules.get(&m))
            .ok_or_else(|| DeviceError::InvalidArgument(format!("no HIP kernel named {name}")))?;
        let cname = CString::new(name).map_err(|_| DeviceError::InvalidArgument(name.into()))?;
        let f = module.function(&cname).map_err(DeviceError::from)?;
        if let Ok(mut m) = self.funcs.lock() {
            m.insert(name.to_string(), f);
        }
        Ok(f)
    }
}

/// Kernel arguments, each stored in an 8-byte slot (HIP reads the parameter's size from it).
#[derive(Default)]
pub struct Args(Vec<u64>);

impl Args {
    pub fn ptr(mut self, p: *const c_void) -> Self {
        self.0.push(p as usize as u64);
        self
    }
    pub fn u64(mut self, v: u64) -> Self {
        self.0.push(v);
        self
    }
    pub fn i32(mut self, v: i32) -> Self {
        self.0.push(v as u32 as u64);
        self
    }
    pub fn f32(mut self, v: f32) -> Self {
        self.0.push(v.to_bits() as u64);
        self
    }
    /// Pointers to each slot, for `hipModuleLaunchKernel`'s `kernelParams`.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        self.0.iter_mut().map(|s| (s as *mut u64).cast()).collect()
    }
}

/// One kernel launch being put together: the function, the launch shape and the arguments in
/// the order of the kernel's parameter list. Made by [`HipDevice::kernel`] (looked up by name;
/// the module comes from the name's prefix, [`KernelModule::of`]); the grid starts at
/// (1, 1, 1) and the block at ([`BLOCK`], 1, 1), the size every kernels-hip kernel is built for
/// (`DUET_BLOCK`). Every argument is pushed with the method of its C type, so the value handed
/// to the runtime is exactly the one given. The same builder as the CUDA backend's
/// (`crates/cuda/src/kernels.rs`).
///
/// Building is safe; [`Launch::launch`] is `unsafe`, and each call site states in a
/// `// SAFETY:` comment the kernel's signature and why every pointer covers what the kernel
/// touches for the sizes and the launch shape given.
///
/// [`HipDevice::kernel`]: crate::HipDevice
#[must_use = "a kernel launch does nothing until `launch` is called"]
pub(crate) struct Launch<'a> {
    stream: &'a Stream,
    func: Function,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    args: Args,
}

/// Threads per block of every kernel (`DUET_BLOCK` in kernels-hip/duet_hip.h).
pub(crate) const BLOCK: u32 = 256;

impl<'a> Launch<'a> {
    /// A launch of `func` on `stream`: grid (1, 1, 1), block ([`BLOCK`], 1, 1).
    pub(crate) fn new(stream: &'a Stream, func: Function) -> Self {
        Self {
            stream,
            func,
            grid: (1, 1, 1),
            block: (BLOCK, 1, 1),
            args: Args::default(),
        }
    }

    /// Blocks per grid (x, y, z). A zero in any dimension makes [`Launch::launch`] a no-op.
    pub(crate) fn grid(mut self, grid: (u32, u32, u32)) -> Self {
        self.grid = grid;
        self
    }

    /// Threads per block (x, y, z): only cross_entropy (DUET_KERNEL_1024) runs another size than
    /// the default [`BLOCK`].
    pub(crate) fn block(mut self, block: (u32, u32, u32)) -> Self {
        self.block = block;
        self
    }

    /// A pointer parameter: the device address of `buf`'s first element.
    pub(crate) fn arg_buf(self, buf: &HipBuffer) -> Self {
        self.arg_ptr(buf.ptr())
    }

    /// A pointer parameter given as a device address (null for a null pointer).
    pub(crate) fn arg_ptr(mut self, ptr: *const c_void) -> Self {
        self.args = self.args.ptr(ptr);
        self
    }

    /// An `unsigned long long` (`duet_u64`) parameter.
    pub(crate) fn arg_u64(mut self, v: u64) -> Self {
        self.args = self.args.u64(v);
        self
    }

    /// An `int` parameter.
    pub(crate) fn arg_i32(mut self, v: i32) -> Self {
        self.args = self.args.i32(v);
        self
    }

    /// A `float` parameter.
    pub(crate) fn arg_f32(mut self, v: f32) -> Self {
        self.args = self.args.f32(v);
        self
    }

    /// Queues the kernel on the stream (nothing when a grid dimension is 0).
    ///
    /// # Safety
    /// The arguments must match the kernel's parameter list in number, order and type
    /// (`arg_buf`/`arg_ptr` for pointers, `arg_u64` for `duet_u64`, `arg_i32` for `int`,
    /// `arg_f32` for `float`), every pointer must refer to live device memory covering every
    /// element the kernel touches for the given sizes and launch shape, and the block must be
    /// one the kernel is written for.
    pub(crate) unsafe fn launch(self) -> Result<()> {
        let g = self.grid;
        if g.0 == 0 || g.1 == 0 || g.2 == 0 {
            return Ok(());
        }
        let mut args = self.args;
        let mut ptrs = args.pointers();
        // SAFETY: the one place duet's HIP backend launches a kernel. The caller guarantees
        // the argument list, the memory ranges and the launch shape (see `# Safety`); `args`
        // (which `ptrs` points into) outlives the call, and hipModuleLaunchKernel reads each
        // parameter's size from the kernel's signature, taking it from the front of its 8-byte
        // slot.
        unsafe {
            self.stream.api().launch(
                self.func.0,
                g,
                self.block,
                self.stream.raw(),
                ptrs.as_mut_ptr(),
            )
        }?;
        Ok(())
    }
}

/// Converts a dimension to the `int` a kernel takes, or
/// [`duet_gpu::launch::kernel_too_large`].
pub(crate) fn dim(op: &'static str, what: &str, v: usize) -> Result<i32> {
    duet_gpu::launch::kernel_int("HIP", op, what, v)
}

/// A grid dimension of `blocks` blocks (at most `i32::MAX`), or
/// [`duet_gpu::launch::kernel_too_large`].
pub(crate) fn grid_dim(op: &'static str, blocks: usize) -> Result<u32> {
    duet_gpu::launch::kernel_grid_dim("HIP", op, blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_file_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels-hip");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| f.ends_with(".hip"))
            .collect();
        files.sort();
        let mut ours: Vec<String> = KernelModule::ALL
            .iter()
            .map(|m| m.file().to_string())
            .collect();
        ours.sort();
        assert_eq!(files, ours);
    }

    #[test]
    fn kernel_names_map_to_the_module_defining_them() {
        for (name, m) in [
            ("cast_f32_bf16", KernelModule::Elementwise),
            ("add_assign_f16_bf16", KernelModule::Elementwise),
            ("layernorm_dparams_partial_bf16", KernelModule::Layernorm),
            ("colsum_finish_f32", KernelModule::Reduce),
            ("sum_squares_finish", KernelModule::Reduce),
            ("merge_heads_backward_f32", KernelModule::Attention),
            ("embedding_backward_wte_bf16_f32", KernelModule::Embedding),
            ("adamw_bf16_f8e4m3fnuz", KernelModule::Adamw),
        ] {
            assert_eq!(KernelModule::of(name), Some(m), "{name}");
        }
        assert_eq!(KernelModule::of("nope"), None);
    }

    #[test]
    fn cache_key_depends_on_arch_options_and_toolchain() {
        let o = options("gfx942:sramecc+:xnack-", 64);
        assert!(o.contains(&"--offload-arch=gfx942:sramecc+:xnack-".to_string()));
        assert!(o.contains(&"-DDUET_WARP=64".to_string()));
        let tc = |runtime: i32, comgr: (usize, usize)| {
            Toolchain {
                runtime,
                hiprtc: "/opt/rocm-6.4.3/lib/libhiprtc.so.6.4.43483:1000:1".into(),
                comgr: Some(crate::toolchain::Comgr {
                    version: comgr,
                    file: "/opt/rocm-6.4.3/lib/libamd_comgr.so.2.9:2000:1".into(),
                    path: "/opt/rocm-6.4.3/lib/libamd_comgr.so.2.9".into(),
                }),
            }
            .fingerprint()
        };
        assert!(o.contains(&"-ffp-contract=off".to_string()));
        let arch = "gfx942:sramecc+:xnack-";
        let a = cache_name(KernelModule::Reduce, arch, &tc(60_443_483, (2, 9)), &o);
        assert!(a.starts_with("reduce-gfx942-sramecc--xnack--"), "{a}");
        let gfx90a = options("gfx90a", 64);
        assert_ne!(
            a,
            cache_name(
                KernelModule::Reduce,
                "gfx90a",
                &tc(60_443_483, (2, 9)),
                &gfx90a
            )
        );
        // ROCm 6.4.3 and 7.2.4 both answer hiprtcVersion 9.0; their runtime versions differ.
        assert_ne!(
            a,
            cache_name(KernelModule::Reduce, arch, &tc(70_224_004, (2, 9)), &o)
        );
        // The same runtime with another comgr.
        assert_ne!(
            a,
            cache_name(KernelModule::Reduce, arch, &tc(60_443_483, (3, 0)), &o)
        );
        assert_ne!(
            a,
            cache_name(
                KernelModule::Reduce,
                arch,
                &tc(60_443_483, (2, 9)),
                &options(arch, 32)
            )
        );
        assert_eq!(
            a,
            cache_name(KernelModule::Reduce, arch, &tc(60_443_483, (2, 9)), &o)
        );
    }

    fn temp_cache(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("duet-hip-cache-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("reduce-gfx942-0123456789abcdef.co")
    }

    fn refused(call: &'static str) -> HipError {
        HipError::Runtime {
            call,
            code: 200,
            message: "hipErrorInvalidImage: invalid kernel image".into(),
        }
    }

    #[test]
    fn a_refused_cached_code_object_is_deleted_and_rebuilt_once() {
        let path = temp_cache("stale");
        std::fs::write(&path, b"stale code object").unwrap();
        let (mut compiles, mut loads) = (0, Vec::new());
        let got = load_module(
            KernelModule::Reduce,
            "gfx942",
            Some(&path),
            &mut || {
                compiles += 1;
                Ok(b"fresh".to_vec())
            },
            &mut |code: &[u8]| {
                loads.push(code.to_vec());
                if code == b"fresh" {
                    Ok(7)
                } else {
                    Err(refused("hipModuleLoadData"))
                }
            },
        )
        .unwrap();
        assert_eq!(got, 7);
        assert_eq!(compiles, 1);
        assert_eq!(
            loads,
            vec![b"stale code object".to_vec(), b"fresh".to_vec()]
        );
        // The fresh object replaced the stale one in the cache.
        assert_eq!(std::fs::read(&path).unwrap(), b"fresh");
        // Next time it comes from the cache, with no compile.
        let mut compiles = 0;
        let got = load_module(
            KernelModule::Reduce,
            "gfx942",
            Some(&path),
            &mut || {
                compiles += 1;
                Ok(b"fresh".to_vec())
            },
            &mut |code: &[u8]| Ok(code.len()),
        )
        .unwrap();
        assert_eq!((got, compiles), (5, 0));
    }

    #[test]
    fn a_fresh_code_object_that_does_not_load_is_an_error_naming_the_module() {
        let path = temp_cache("broken");
        std::fs::write(&path, b"stale").unwrap();
        let mut loads = 0;
        let e = load_module::<()>(
            KernelModule::Reduce,
            "gfx942:sramecc+:xnack-",
            Some(&path),
            &mut || Ok(b"fresh".to_vec()),
            &mut |_: &[u8]| {
                loads += 1;
                Err(refused("hipModuleLoadData"))
            },
        )
        .unwrap_err();
        assert_eq!(loads, 2, "one retry, no more");
        let msg = e.to_string();
        assert!(
            msg.contains("reduce.hip") && msg.contains("gfx942:sramecc+:xnack-"),
            "{msg}"
        );
        assert!(msg.contains("cached code object"), "{msg}");
        // Without a cache: one compile, one load, the same kind of error.
        let mut loads = 0;
        let e = load_module::<()>(
            KernelModule::Fp8,
            "gfx950",
            None,
            &mut || Ok(b"fresh".to_vec()),
            &mut |_: &[u8]| {
                loads += 1;
                Err(refused("hipModuleLoadData"))
            },
        )
        .unwrap_err();
        assert_eq!(loads, 1);
        assert!(e.to_string().contains("fp8.hip"), "{e}");
        // A compile error is passed through untouched.
        let e = load_module::<()>(
            KernelModule::Fp8,
            "gfx950",
            None,
            &mut || {
                Err(DeviceError::Compile {
                    backend: "hip",
                    module: "fp8.hip".into(),
                    log: "boom".into(),
                })
            },
            &mut |_: &[u8]| Ok(()),
        )
        .unwrap_err();
        assert!(matches!(e, DeviceError::Compile { .. }), "{e}");
    }

    #[test]
    fn args_store_values_little_endian() {
        let mut a = Args::default().i32(-2).f32(1.5).u64(7);
        let p = a.pointers();
        assert_eq!(p.len(), 3);
        // SAFETY: each pointer refers to a live u64 slot of `a`.
        let (x, y) = unsafe { (*(p[0] as *const i32), *(p[1] as *const f32)) };
        assert_eq!((x, y), (-2, 1.5));
    }
}
