//! duet's `DUET_*` environment variables, parsed once into one typed [`Knobs`] with one rule set.
//!
//! - **Switches** (`bool`): `1`, `true`, `yes`, `on` are true and `0`, `false`, `no`, `off` and
//!   the empty string are false (case-insensitive, surrounding whitespace ignored); unset keeps
//!   the default. Anything else is a [`KnobError`] naming the variable and its value.
//! - **Numbers**: decimal (surrounding whitespace ignored); garbage is an error. Empty is unset.
//! - **Paths and strings**: taken as they are; empty (or only whitespace) is unset.
//! - A value that is not valid UTF-8 is an error.
//!
//! [`knobs`] reads the process environment the first time it is called and keeps the result
//! (or the error) for the life of the process, so a variable set later has no effect; readers
//! that must see another environment (tests) build one with [`Knobs::from_vars`].
//! `DUET_BACKEND` is not here: the CLI reads it as the default of `--backend`. Build- and
//! test-time variables (`DUET_HIP_BINDGEN`, `DUET_GIT_REV`, `DUET_TEST_SEED`,
//! `DUET_WRITE_FIXTURES`) are not either.

use std::path::PathBuf;
use std::sync::OnceLock;

/// Thread count of the CPU backend when `CpuDevice::new` gets `None` (crates/cpu).
pub const CPU_THREADS: &str = "DUET_CPU_THREADS";
/// Extra folders (`:`-separated) searched first for the CUDA libraries (crates/cuda loader.rs).
pub const CUDA_LIB_DIR: &str = "DUET_CUDA_LIB_DIR";
/// The CUDA kernel cache folder; `off` disables the cache (crates/cuda kernels.rs).
pub const CUDA_CACHE_DIR: &str = "DUET_CUDA_CACHE_DIR";
/// Extra NVRTC options, whitespace-separated (crates/cuda kernels.rs).
pub const NVRTC_EXTRA: &str = "DUET_NVRTC_EXTRA";
/// Allows TF32 tensor cores for f32 GEMMs from the start (crates/cuda blas.rs).
pub const CUDA_ALLOW_TF32: &str = "DUET_CUDA_ALLOW_TF32";
/// Starts the CUDA device with the fused paths off (crates/cuda device.rs).
pub const CUDA_UNFUSED: &str = "DUET_CUDA_UNFUSED";
/// Starts the CUDA device with GEMM autotuning on (crates/cuda device.rs).
pub const GEMM_AUTOTUNE: &str = "DUET_GEMM_AUTOTUNE";
/// Prints each autotuned GEMM's candidate timings and choice (crates/cuda blaslt.rs).
pub const GEMM_AUTOTUNE_LOG: &str = "DUET_GEMM_AUTOTUNE_LOG";
/// Copies the FP8 scales before every GEMM even when aligned (crates/cuda blaslt.rs).
pub const CUDA_FP8_SCALE_COPY: &str = "DUET_CUDA_FP8_SCALE_COPY";
/// Selects the version-1 flash-attention kernels (crates/cuda, the flash-attention ops).
pub const FLASH_V1: &str = "DUET_FLASH_V1";
/// The NVML library to load first (crates/cuda nvml.rs).
pub const NVML_LIB: &str = "DUET_NVML_LIB";
/// The NVTX library to load first (crates/cuda nvtx.rs).
pub const NVTX_LIB: &str = "DUET_NVTX_LIB";
/// The NCCL library to load first (crates/cuda nccl.rs).
pub const NCCL_LIB: &str = "DUET_NCCL_LIB";
/// The HIP kernel cache folder (crates/hip kernels.rs).
pub const HIP_CACHE: &str = "DUET_HIP_CACHE";
/// The roctx library to load first (crates/hip roctx.rs).
pub const ROCTX_LIB: &str = "DUET_ROCTX_LIB";
/// Withholds the HIP device's flash attention (crates/hip ops/attention.rs).
pub const HIP_NO_FLASH: &str = "DUET_HIP_NO_FLASH";
/// The HIP flash attention's MFMA products (crates/hip ops/attention.rs).
pub const HIP_FLASH_MFMA: &str = "DUET_HIP_FLASH_MFMA";
/// Starts the HIP device with the fused paths (the hipBLASLt GEMM epilogues) off (crates/hip
/// device.rs).
pub const HIP_UNFUSED: &str = "DUET_HIP_UNFUSED";
/// The port of duet's multi-process handshake instead of `MASTER_PORT` (crates/engine
/// dist/rendezvous.rs).
pub const RENDEZVOUS_PORT: &str = "DUET_RENDEZVOUS_PORT";
/// Seconds ranks wait for each other in the handshake (crates/engine dist/rendezvous.rs).
pub const RENDEZVOUS_TIMEOUT: &str = "DUET_RENDEZVOUS_TIMEOUT";
/// Whether the optimizer writes the next step's FP8 weight codes (crates/engine train.rs).
pub const FP8_CODES_FROM_OPTIMIZER: &str = "DUET_FP8_CODES_FROM_OPTIMIZER";

/// Every variable [`Knobs`] reads, one per field.
pub const ALL: &[&str] = &[
    CPU_THREADS,
    CUDA_LIB_DIR,
    CUDA_CACHE_DIR,
    NVRTC_EXTRA,
    CUDA_ALLOW_TF32,
    CUDA_UNFUSED,
    GEMM_AUTOTUNE,
    GEMM_AUTOTUNE_LOG,
    CUDA_FP8_SCALE_COPY,
    FLASH_V1,
    NVML_LIB,
    NVTX_LIB,
    NCCL_LIB,
    HIP_CACHE,
    ROCTX_LIB,
    HIP_NO_FLASH,
    HIP_FLASH_MFMA,
    HIP_UNFUSED,
    RENDEZVOUS_PORT,
    RENDEZVOUS_TIMEOUT,
    FP8_CODES_FROM_OPTIMIZER,
];

/// A `DUET_*` variable whose value does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    #[error("{name}={value:?} is not a boolean (use 1/true/yes/on or 0/false/no/off)")]
    Bool { name: &'static str, value: String },
    /// `what` says which kind of number (e.g. "thread count", "port").
    #[error("{name}={value:?} is not a {what}")]
    Number {
        name: &'static str,
        value: String,
        what: &'static str,
    },
    #[error("{name}={value:?} is not valid UTF-8")]
    NotUnicode { name: &'static str, value: String },
}

impl From<&KnobError> for crate::DeviceError {
    fn from(e: &KnobError) -> Self {
        crate::DeviceError::InvalidArgument(e.to_string())
    }
}

impl From<KnobError> for crate::DeviceError {
    fn from(e: KnobError) -> Self {
        (&e).into()
    }
}

/// The `DUET_*` environment variables, typed. [`Default`] is the value with none of them set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// `DUET_CPU_THREADS`: worker threads of `CpuDevice::new(None)` (crates/cpu); unset: every
    /// core. Zero is refused there.
    pub cpu_threads: Option<usize>,
    /// `DUET_CUDA_LIB_DIR`: folders (`:`-separated, as `std::env::split_paths` splits them)
    /// searched first for the CUDA driver, NVRTC and cuBLAS(Lt) (crates/cuda loader.rs).
    pub cuda_lib_dir: Option<String>,
    /// `DUET_CUDA_CACHE_DIR`: the CUDA kernel cache folder (crates/cuda kernels.rs); the value
    /// `off` disables the cache. Unset: `$XDG_CACHE_HOME/duet/cuda` or `~/.cache/duet/cuda`.
    pub cuda_cache_dir: Option<PathBuf>,
    /// `DUET_NVRTC_EXTRA`: extra NVRTC options, whitespace-separated, for kernel experiments
    /// (e.g. `-D` overrides of the tuning macros); part of the cache key (crates/cuda
    /// kernels.rs).
    pub nvrtc_extra: Option<String>,
    /// `DUET_CUDA_ALLOW_TF32`: f32 GEMMs may use TF32 tensor cores from the start (crates/cuda
    /// blas.rs; `CudaDevice::set_allow_tf32` changes it later). Default off.
    pub cuda_allow_tf32: bool,
    /// `DUET_CUDA_UNFUSED`: the CUDA device starts with the fused paths (flash attention, GEMM
    /// epilogues) withheld (crates/cuda device.rs; `CudaDevice::set_fused_ops`). Default off.
    pub cuda_unfused: bool,
    /// `DUET_GEMM_AUTOTUNE`: the CUDA device starts with GEMM autotuning on (crates/cuda
    /// device.rs; `GemmOps::set_gemm_autotune`). Default off.
    pub gemm_autotune: bool,
    /// `DUET_GEMM_AUTOTUNE_LOG`: print each autotuned GEMM's candidate timings and choice on
    /// stderr (crates/cuda blaslt.rs). Default off.
    pub gemm_autotune_log: bool,
    /// `DUET_CUDA_FP8_SCALE_COPY`: copy the FP8 scales before every cuBLASLt GEMM even when
    /// they are aligned, for A/B comparisons (crates/cuda blaslt.rs). Default off.
    pub cuda_fp8_scale_copy: bool,
    /// `DUET_FLASH_V1`: the version-1 flash-attention kernels instead of version 2 (crates/cuda
    /// flash-attention ops; a thread's own override wins). Default off.
    pub flash_v1: bool,
    /// `DUET_NVML_LIB`: the NVML library tried before `libnvidia-ml.so.1` (crates/cuda
    /// nvml.rs, telemetry).
    pub nvml_lib: Option<PathBuf>,
    /// `DUET_NVTX_LIB`: the NVTX library tried before `libnvToolsExt.so.1` (crates/cuda
    /// nvtx.rs, profiler ranges).
    pub nvtx_lib: Option<PathBuf>,
    /// `DUET_NCCL_LIB`: the NCCL library tried before `libnccl.so.2` (crates/cuda nccl.rs).
    pub nccl_lib: Option<PathBuf>,
    /// `DUET_HIP_CACHE`: the HIP kernel cache folder (crates/hip kernels.rs). Unset:
    /// `$XDG_CACHE_HOME/duet/hip` or `~/.cache/duet/hip`.
    pub hip_cache: Option<PathBuf>,
    /// `DUET_ROCTX_LIB`: the roctx library tried before libroctx64 (crates/hip roctx.rs).
    pub roctx_lib: Option<PathBuf>,
    /// `DUET_HIP_NO_FLASH`: the HIP device starts without flash attention (its capabilities
    /// list none, so the engine composes attention of the unfused ops; crates/hip
    /// ops/attention.rs), for A/B runs. Default off.
    pub hip_no_flash: bool,
    /// `DUET_HIP_FLASH_MFMA`: the HIP flash attention computes its products with MFMA
    /// instructions (gfx90a/gfx942/gfx950, wave64; crates/hip ops/attention.rs). Opt-in until
    /// it has run on AMD hardware; elsewhere opening the device is refused. Default off.
    pub hip_flash_mfma: bool,
    /// `DUET_HIP_UNFUSED`: the HIP device withholds its fused paths (the hipBLASLt GEMM
    /// epilogues; the engine runs the separate ops), for A/B comparisons as
    /// `DUET_CUDA_UNFUSED` on CUDA (crates/hip device.rs). Default off.
    pub hip_unfused: bool,
    /// `DUET_RENDEZVOUS_PORT`: the port of duet's handshake instead of `MASTER_PORT`, the same
    /// on every rank (crates/engine dist/rendezvous.rs; torchrun's agent holds `MASTER_PORT`).
    pub rendezvous_port: Option<u16>,
    /// `DUET_RENDEZVOUS_TIMEOUT`: seconds the ranks wait for each other in the handshake
    /// (crates/engine dist/rendezvous.rs). Unset: 300.
    pub rendezvous_timeout: Option<u64>,
    /// `DUET_FP8_CODES_FROM_OPTIMIZER`: the optimizer writes the next step's FP8 weight codes
    /// (crates/engine train.rs; `Trainer::set_fp8_codes_from_optimizer`). Default **on**; a
    /// false value (`0`) has the forward pass quantise instead, for comparisons.
    pub fp8_codes_from_optimizer: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            cpu_threads: None,
            cuda_lib_dir: None,
            cuda_cache_dir: None,
            nvrtc_extra: None,
            cuda_allow_tf32: false,
            cuda_unfused: false,
            gemm_autotune: false,
            gemm_autotune_log: false,
            cuda_fp8_scale_copy: false,
            flash_v1: false,
            nvml_lib: None,
            nvtx_lib: None,
            nccl_lib: None,
            hip_cache: None,
            roctx_lib: None,
            hip_no_flash: false,
            hip_flash_mfma: false,
            hip_unfused: false,
            rendezvous_port: None,
            rendezvous_timeout: None,
            fp8_codes_from_optimizer: true,
        }
    }
}

/// Parses a switch: `None` when unset.
fn switch(name: &'static str, v: Option<String>) -> Result<Option<bool>, KnobError> {
    let Some(v) = v else { return Ok(None) };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" | "" => Ok(Some(false)),
        _ => Err(KnobError::Bool { name, value: v }),
    }
}

/// Parses a decimal number of type `T` (`what` names it in the error); empty is unset.
fn number<T: std::str::FromStr>(
    name: &'static str,
    what: &'static str,
    v: Option<String>,
) -> Result<Option<T>, KnobError> {
    let Some(v) = v else { return Ok(None) };
    let s = v.trim();
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| KnobError::Number {
        name,
        value: v.clone(),
        what,
    })
}

/// A string as it is; empty (or only whitespace) is unset.
fn string(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

impl Knobs {
    /// Parses the process environment (see the module documentation for the rules).
    pub fn from_env() -> Result<Self, KnobError> {
        for &name in ALL {
            if let Some(v) = std::env::var_os(name)
                && v.to_str().is_none()
            {
                return Err(KnobError::NotUnicode {
                    name,
                    value: v.to_string_lossy().into_owned(),
                });
            }
        }
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Parses the variables `get` returns (`None`: unset); asks for exactly the names in
    /// [`ALL`], each once. For tests and readers that need another view than the process's.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, KnobError> {
        let d = Self::default();
        let flag = |name: &'static str, default: bool| -> Result<bool, KnobError> {
            Ok(switch(name, get(name))?.unwrap_or(default))
        };
        let path = |name: &'static str| string(get(name)).map(PathBuf::from);
        Ok(Self {
            cpu_threads: number(CPU_THREADS, "thread count", get(CPU_THREADS))?,
            cuda_lib_dir: string(get(CUDA_LIB_DIR)),
            cuda_cache_dir: path(CUDA_CACHE_DIR),
            nvrtc_extra: string(get(NVRTC_EXTRA)),
            cuda_allow_tf32: flag(CUDA_ALLOW_TF32, d.cuda_allow_tf32)?,
            cuda_unfused: flag(CUDA_UNFUSED, d.cuda_unfused)?,
            gemm_autotune: flag(GEMM_AUTOTUNE, d.gemm_autotune)?,
            gemm_autotune_log: flag(GEMM_AUTOTUNE_LOG, d.gemm_autotune_log)?,
            cuda_fp8_scale_copy: flag(CUDA_FP8_SCALE_COPY, d.cuda_fp8_scale_copy)?,
            flash_v1: flag(FLASH_V1, d.flash_v1)?,
            nvml_lib: path(NVML_LIB),
            nvtx_lib: path(NVTX_LIB),
            nccl_lib: path(NCCL_LIB),
            hip_cache: path(HIP_CACHE),
            roctx_lib: path(ROCTX_LIB),
            hip_no_flash: flag(HIP_NO_FLASH, d.hip_no_flash)?,
            hip_flash_mfma: flag(HIP_FLASH_MFMA, d.hip_flash_mfma)?,
            hip_unfused: flag(HIP_UNFUSED, d.hip_unfused)?,
            rendezvous_port: number(RENDEZVOUS_PORT, "port", get(RENDEZVOUS_PORT))?,
            rendezvous_timeout: number(
                RENDEZVOUS_TIMEOUT,
                "number of seconds",
                get(RENDEZVOUS_TIMEOUT),
            )?,
            fp8_codes_from_optimizer: flag(FP8_CODES_FROM_OPTIMIZER, d.fp8_codes_from_optimizer)?,
        })
    }
}

/// The process's knobs, parsed from the environment on the first call and kept; a malformed
/// variable is the same error on every call.
pub fn knobs() -> Result<&'static Knobs, &'static KnobError> {
    static KNOBS: OnceLock<Result<Knobs, KnobError>> = OnceLock::new();
    KNOBS.get_or_init(Knobs::from_env).as_ref()
}

/// [`knobs`] for callers that return [`crate::Result`]: a malformed variable is
/// [`crate::DeviceError::InvalidArgument`].
pub fn device_knobs() -> crate::Result<&'static Knobs> {
    knobs().map_err(crate::DeviceError::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn parse(pairs: &[(&str, &str)]) -> Result<Knobs, KnobError> {
        Knobs::from_vars(vars(pairs))
    }

    /// The fields that differ from the defaults. The destructuring names every field, so a new
    /// field does not compile until it is listed here too.
    fn changed(k: &Knobs) -> Vec<&'static str> {
        macro_rules! diff {
            ($($f:ident),* $(,)?) => {{
                let d = Knobs::default();
                let Knobs { $($f: _),* } = k;
                let mut out = Vec::new();
                $(if k.$f != d.$f { out.push(stringify!($f)); })*
                (out, [$(stringify!($f)),*].len())
            }};
        }
        let (out, fields) = diff!(
            cpu_threads,
            cuda_lib_dir,
            cuda_cache_dir,
            nvrtc_extra,
            cuda_allow_tf32,
            cuda_unfused,
            gemm_autotune,
            gemm_autotune_log,
            cuda_fp8_scale_copy,
            flash_v1,
            nvml_lib,
            nvtx_lib,
            nccl_lib,
            hip_cache,
            roctx_lib,
            hip_no_flash,
            hip_flash_mfma,
            hip_unfused,
            rendezvous_port,
            rendezvous_timeout,
            fp8_codes_from_optimizer,
        );
        assert_eq!(fields, ALL.len(), "one variable per field");
        out
    }

    #[test]
    fn nothing_set_is_the_default() {
        assert_eq!(parse(&[]).unwrap(), Knobs::default());
        assert!(changed(&Knobs::default()).is_empty());
        assert!(Knobs::default().fp8_codes_from_optimizer);
    }

    #[test]
    fn every_boolean_spelling() {
        let truthy = [
            "1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 ", "\ttrue\n",
        ];
        let falsy = [
            "0", "false", "FALSE", "no", "No", "off", "OFF", "", "  ", " 0 ",
        ];
        for (name, get) in [
            (
                CUDA_ALLOW_TF32,
                (|k: &Knobs| k.cuda_allow_tf32) as fn(&Knobs) -> bool,
            ),
            (CUDA_UNFUSED, |k| k.cuda_unfused),
            (HIP_UNFUSED, |k| k.hip_unfused),
            (GEMM_AUTOTUNE, |k| k.gemm_autotune),
            (GEMM_AUTOTUNE_LOG, |k| k.gemm_autotune_log),
            (CUDA_FP8_SCALE_COPY, |k| k.cuda_fp8_scale_copy),
            (FLASH_V1, |k| k.flash_v1),
            (HIP_NO_FLASH, |k| k.hip_no_flash),
            (HIP_FLASH_MFMA, |k| k.hip_flash_mfma),
            (FP8_CODES_FROM_OPTIMIZER, |k| k.fp8_codes_from_optimizer),
        ] {
            for v in truthy {
                assert!(get(&parse(&[(name, v)]).unwrap()), "{name}={v:?}");
            }
            for v in falsy {
                assert!(!get(&parse(&[(name, v)]).unwrap()), "{name}={v:?}");
            }
        }
    }

    #[test]
    fn a_bad_boolean_is_an_error_naming_the_variable() {
        for v in ["2", "y", "enable", "1.0", "tru"] {
            let e = parse(&[(CUDA_UNFUSED, v)]).unwrap_err();
            assert_eq!(
                e,
                KnobError::Bool {
                    name: CUDA_UNFUSED,
                    value: v.into()
                }
            );
            let msg = e.to_string();
            assert!(msg.contains(&format!("DUET_CUDA_UNFUSED={v:?}")), "{msg}");
            assert!(msg.contains("not a boolean"), "{msg}");
            let dev = crate::DeviceError::from(&e).to_string();
            assert!(
                dev.starts_with("invalid argument: DUET_CUDA_UNFUSED="),
                "{dev}"
            );
        }
    }

    #[test]
    fn scale_copy_zero_is_off() {
        assert!(
            !parse(&[(CUDA_FP8_SCALE_COPY, "0")])
                .unwrap()
                .cuda_fp8_scale_copy
        );
        assert!(!parse(&[]).unwrap().cuda_fp8_scale_copy);
        assert!(
            parse(&[(CUDA_FP8_SCALE_COPY, "1")])
                .unwrap()
                .cuda_fp8_scale_copy
        );
    }

    #[test]
    fn fp8_codes_from_optimizer_defaults_on() {
        assert!(parse(&[]).unwrap().fp8_codes_from_optimizer);
        assert!(
            !parse(&[(FP8_CODES_FROM_OPTIMIZER, "0")])
                .unwrap()
                .fp8_codes_from_optimizer
        );
    }

    #[test]
    fn numbers() {
        let k = parse(&[
            (CPU_THREADS, " 5 "),
            (RENDEZVOUS_PORT, "29501"),
            (RENDEZVOUS_TIMEOUT, "600"),
        ])
        .unwrap();
        assert_eq!(k.cpu_threads, Some(5));
        assert_eq!(k.rendezvous_port, Some(29501));
        assert_eq!(k.rendezvous_timeout, Some(600));
        // Zero parses (the CPU backend refuses zero threads itself).
        assert_eq!(parse(&[(CPU_THREADS, "0")]).unwrap().cpu_threads, Some(0));
        for (name, v, what) in [
            (CPU_THREADS, "many", "thread count"),
            (CPU_THREADS, "-1", "thread count"),
            (CPU_THREADS, "2.5", "thread count"),
            (RENDEZVOUS_PORT, "x", "port"),
            (RENDEZVOUS_PORT, "70000", "port"),
            (RENDEZVOUS_TIMEOUT, "5s", "number of seconds"),
        ] {
            let e = parse(&[(name, v)]).unwrap_err();
            assert_eq!(
                e,
                KnobError::Number {
                    name,
                    value: v.into(),
                    what
                }
            );
            assert_eq!(e.to_string(), format!("{name}={v:?} is not a {what}"));
        }
    }

    #[test]
    fn empty_is_unset() {
        let mut pairs: Vec<(&str, &str)> = ALL.iter().map(|&n| (n, "")).collect();
        // An empty switch is false, the default of every switch but this one.
        pairs.retain(|(n, _)| *n != FP8_CODES_FROM_OPTIMIZER);
        assert_eq!(parse(&pairs).unwrap(), Knobs::default());
        let k = parse(&[(CPU_THREADS, "  "), (NVTX_LIB, " "), (NVRTC_EXTRA, "\t")]).unwrap();
        assert_eq!(k, Knobs::default());
    }

    #[test]
    fn paths_and_strings_are_kept_as_they_are() {
        let k = parse(&[
            (CUDA_LIB_DIR, "/a:/b"),
            (CUDA_CACHE_DIR, "off"),
            (NVRTC_EXTRA, "-DX=1 -DY=2"),
            (HIP_CACHE, "/tmp/hip cache"),
            (NCCL_LIB, "/opt/nccl/libnccl.so.2"),
        ])
        .unwrap();
        assert_eq!(k.cuda_lib_dir.as_deref(), Some("/a:/b"));
        assert_eq!(k.cuda_cache_dir, Some(PathBuf::from("off")));
        assert_eq!(k.nvrtc_extra.as_deref(), Some("-DX=1 -DY=2"));
        assert_eq!(k.hip_cache, Some(PathBuf::from("/tmp/hip cache")));
        assert_eq!(k.nccl_lib, Some(PathBuf::from("/opt/nccl/libnccl.so.2")));
    }

    #[test]
    fn all_has_no_duplicates_and_every_name_is_duet() {
        let set: HashSet<&str> = ALL.iter().copied().collect();
        assert_eq!(set.len(), ALL.len(), "duplicate in ALL");
        assert!(ALL.iter().all(|n| n.starts_with("DUET_")));
    }

    #[test]
    fn from_vars_asks_for_exactly_the_names_in_all() {
        let asked = RefCell::new(Vec::new());
        Knobs::from_vars(|k| {
            asked.borrow_mut().push(k.to_string());
            None
        })
        .unwrap();
        let mut asked = asked.into_inner();
        asked.sort();
        let mut all: Vec<String> = ALL.iter().map(|s| s.to_string()).collect();
        all.sort();
        assert_eq!(asked, all, "each name in ALL asked once, nothing else");
    }

    /// Each name in ALL sets its own field, and the fields are as many as the names.
    #[test]
    fn every_name_sets_exactly_one_field_of_its_own() {
        let mut seen = HashSet::new();
        for &name in ALL {
            // "1" is valid for every type and not the default, except for a default-on switch.
            let fields = ["1", "0"]
                .iter()
                .map(|v| changed(&parse(&[(name, v)]).unwrap()))
                .find(|f| !f.is_empty())
                .unwrap_or_default();
            assert_eq!(fields.len(), 1, "{name} changes {fields:?}");
            assert!(
                seen.insert(fields[0]),
                "{name}: {} also set by another",
                fields[0]
            );
        }
        assert_eq!(seen.len(), ALL.len());
    }

    #[test]
    fn the_process_knobs_are_parsed_once() {
        let a = knobs().map(|k| k as *const Knobs);
        let b = knobs().map(|k| k as *const Knobs);
        assert_eq!(a.is_ok(), b.is_ok());
        if let (Ok(a), Ok(b)) = (a, b) {
            assert_eq!(a, b);
        }
    }
}
