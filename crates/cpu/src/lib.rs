//! duet's CPU backend: the reference implementation of [`duet_device::Device`] that the GPU
//! backends are checked against, and the default backend when no GPU is present.
//!
//! # Design
//!
//! - **Memory.** A [`CpuBuffer`] is a `Vec` of its element type: `f32`, `half::f16`,
//!   `half::bf16`, `i32`, or raw `u8` codes for the four FP8 formats (and `U8`). Every buffer
//!   holds an `Arc` to its device's byte counter, incremented on allocation and decremented on
//!   drop, which feeds [`duet_device::Runtime::memory_stats`] (`driver` is `None`: there is no driver view).
//! - **Arithmetic.** Always f32. f16/bf16 (and FP8 for `cast`, `fill`, `copy`, uploads and
//!   downloads, and AdamW's `param_copy`) are storage formats: an op loads the rows it works on
//!   into f32, computes, and rounds the results once when storing them. f32 buffers are used in
//!   place without copies. FP8 encoding saturates to the format's largest finite value
//!   ([`duet_device::Fp8Format::encode`]).
//! - **Dtypes accepted.** Activation-type buffers (inputs, outputs and gradients of the model
//!   kernels) may each independently be f32, f16 or bf16, except where the trait demands one
//!   dtype (`add`, the head permutations, `copy`). LayerNorm `mean`/`rstd`, cross-entropy
//!   `losses` and the `sum_squares` output are f32; AdamW's `param`, `m`, `v` are f32 while
//!   `grad` may be f32/f16/bf16 and `param_copy` any float dtype including FP8. GEMM takes A
//!   and B of one dtype (f32/f16/bf16) and C of that dtype or f32. Anything else is
//!   [`DeviceError::Unsupported`] or [`DeviceError::DTypeMismatch`]; sizes that do not match
//!   are [`DeviceError::Shape`]; out-of-vocabulary token ids or targets are
//!   [`DeviceError::InvalidArgument`]. Validation happens before any output is touched.
//! - **Threads.** Each device owns a rayon `ThreadPool` (size from [`CpuDevice::new`], else the
//!   `DUET_CPU_THREADS` environment variable, else all cores) and runs every op inside it, so
//!   several devices or an embedding application do not fight over rayon's global pool. Ops
//!   run synchronously; [`duet_device::Runtime::synchronize`] has nothing to wait for.
//! - **GEMM.** Through the `gemm` crate (f32 kernels; f16/bf16 operands widened to f32 first),
//!   built with its `x86-v4` feature so AVX-512 kernels are used where the CPU has them (chosen
//!   at run time; AVX2/FMA and SSE kernels otherwise). Large single matrices use the crate's own
//!   rayon parallelism; batched GEMMs (attention) run one matrix per task. The `gemm` crate's
//!   entry point takes raw pointers, so `ops/gemm.rs` is the one module allowed `unsafe` (the
//!   crate is `#![deny(unsafe_code)]` rather than `forbid` for that reason); the call is fed
//!   slices cut to the validated extents and asserts the index bounds it relies on.
//!   Note: the `gemm` crate's `debug_assert!`s make it several times slower in builds with
//!   debug assertions (dev/test profiles); use `--release` for timing.
//! - **Element-wise math.** `exp` (softmax, cross-entropy, GELU through
//!   `0.5·(1 + tanh u) = σ(2u)`) is a branch-free f32 polynomial (~1 ulp) that vectorises, so
//!   no libm transcendental sits in a hot loop. Only `sqrt` (exact) and one `ln` per
//!   cross-entropy row come from the platform.
//! - **Determinism.** Work is split at boundaries that depend only on the shapes, and partial
//!   results are combined in a fixed order: every op, GEMM included, gives bit-identical results
//!   for any thread count. Cross-row reductions (bias, LayerNorm parameter and position-embedding
//!   gradients) sum fixed blocks of rows and combine the blocks in order; token-embedding
//!   gradients are accumulated per vocabulary row in position order; `sum_squares` sums fixed
//!   chunks in f64 and combines them in order. The GEMM is thread-count independent because the
//!   `gemm` crate splits work over output tiles only and derives its depth blocking from the
//!   shape and cache sizes, never the thread count (checked by the test suite for the model's
//!   shapes). Across *machines* GEMM bits can differ: the kernel (AVX-512, AVX2/FMA, ...) and
//!   the cache-derived blocking are chosen per CPU. No floating-point contraction is enabled, so
//!   every other op gives the same bits on any x86-64 CPU.
//!
//! [`duet_device::Runtime::memory_stats`]: duet_device::Runtime::memory_stats
//! [`duet_device::Runtime::synchronize`]: duet_device::Runtime::synchronize
#![deny(unsafe_code)]

mod buffer;
mod collective;
mod info;
mod ops;
mod runtime;

/// The CPU reference's e^x, public so that other backends' shared math can be checked against it
/// bit for bit (duet-hip's `tests/shared_math.rs`).
pub use ops::math::exp_f32;

pub use buffer::CpuBuffer;
pub use collective::{CpuComm, CpuGroup};

use buffer::MemCounter;
use duet_device::knobs::{KnobError, Knobs};
use duet_device::{DeviceError, Result};
use std::sync::Arc;

/// Environment variable that sets the thread count when [`CpuDevice::new`] gets `None`
/// ([`duet_device::knobs::Knobs::cpu_threads`]).
pub use duet_device::knobs::CPU_THREADS as THREADS_ENV;

/// The CPU device: a private rayon thread pool plus allocation accounting.
pub struct CpuDevice {
    pool: rayon::ThreadPool,
    threads: usize,
    mem: Arc<MemCounter>,
}

impl std::fmt::Debug for CpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDevice")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// The thread count: `requested`, else [`THREADS_ENV`] from `knobs` (whose error counts only
/// then), else every core.
fn resolve_threads(
    requested: Option<usize>,
    knobs: std::result::Result<&Knobs, &KnobError>,
) -> Result<usize> {
    let threads = match requested {
        Some(n) => n,
        None => knobs
            .map_err(DeviceError::from)?
            .cpu_threads
            .unwrap_or_else(default_threads),
    };
    if threads == 0 {
        return Err(DeviceError::InvalidArgument(
            "the CPU backend needs at least one thread".into(),
        ));
    }
    Ok(threads)
}

impl CpuDevice {
    /// Creates a device with `threads` worker threads. `None` reads `DUET_CPU_THREADS`, falling
    /// back to every available core. Zero threads is an error, and with `None` so is an
    /// unparsable variable (any of [`duet_device::knobs`]: they are parsed together).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let threads = resolve_threads(threads, duet_device::knobs::knobs())?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("duet-cpu-{i}"))
            .build()
            .map_err(|e| DeviceError::Unavailable {
                backend: "cpu",
                reason: format!("could not start {threads} worker threads: {e}"),
                tried: Vec::new(),
            })?;
        Ok(Self {
            pool,
            threads,
            mem: Arc::new(MemCounter::default()),
        })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on this device's thread pool.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

impl Default for CpuDevice {
    /// Like `CpuDevice::new(None)`, but an invalid `DUET_CPU_THREADS` (or other `DUET_*`
    /// variable) falls back to all cores.
    ///
    /// # Panics
    /// If the operating system refuses to start any worker thread at all.
    fn default() -> Self {
        CpuDevice::new(None)
            .or_else(|_| CpuDevice::new(Some(default_threads())))
            .or_else(|_| CpuDevice::new(Some(1)))
            .expect("the CPU backend could not start a worker thread")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`resolve_threads`] with `DUET_CPU_THREADS` set to `env` (or unset).
    fn resolve(requested: Option<usize>, env: Option<&str>) -> Result<usize> {
        let knobs = Knobs::from_vars(|k| env.filter(|_| k == THREADS_ENV).map(str::to_string));
        resolve_threads(requested, knobs.as_ref())
    }

    #[test]
    fn thread_count_resolution() {
        assert_eq!(resolve(Some(3), Some("7")).unwrap(), 3);
        assert_eq!(resolve(None, Some(" 5 ")).unwrap(), 5);
        assert_eq!(resolve(None, None).unwrap(), default_threads());
        assert_eq!(resolve(None, Some("")).unwrap(), default_threads());
        let err = resolve(None, Some("many")).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid argument: DUET_CPU_THREADS=\"many\" is not a thread count"
        );
        assert!(resolve(None, Some("0")).is_err());
        assert!(resolve(Some(0), None).is_err());
        // A count given outright does not look at the variable.
        assert_eq!(resolve(Some(2), Some("many")).unwrap(), 2);
    }
}
