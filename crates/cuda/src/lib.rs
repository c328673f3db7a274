//! duet's CUDA backend: [`CudaDevice`] implements [`duet_device::Device`] on an NVIDIA GPU.
//!
//! - **Loading.** cudarc with dynamic loading: nothing CUDA is needed to build. At run time
//!   [`loader`] finds the driver, NVRTC, cuBLASLt and cuBLAS (also in the toolkit folder, the
//!   container driver mount and pip's `nvidia-*` wheels) before cudarc touches them, so a
//!   machine without them gets [`duet_device::DeviceError::Unavailable`] instead of a panic.
//! - **Kernels.** `kernels-cuda/*.cu`, embedded in the binary, compiled by NVRTC for the GPU's
//!   compute capability when the device opens and cached on disk ([`kernels`]).
//! - **GEMMs.** cuBLAS `cublasGemmStridedBatchedEx` with FP32 compute ([`blas`]); f32 GEMMs
//!   are true FP32 unless TF32 is allowed explicitly. FP8 GEMMs (delayed scaling, sm_89+) go
//!   through cuBLASLt with device scale pointers ([`blaslt`]).
//! - **Memory.** Stream-ordered allocations counted per device; uploads are staged through a
//!   ring of pinned buffers and copied asynchronously ([`memory`]).
//! - **Determinism.** No float atomics: embedding, bias, LayerNorm-parameter gradients and
//!   `sum_squares` use fixed partitions and ordered two-pass reductions, so they are identical
//!   run to run. cuBLAS is deterministic for a given GPU model, library version and stream.
//!
//! Module layout mirrors the HIP backend: `device` (the device, its construction and the shared
//! launch helpers), `runtime` (`impl Runtime`: memory, copies, casts, synchronisation, graphs,
//! timing), `ops/` (one file per op family, each implementing its family trait: elementwise,
//! gemm, embedding, norm, attention, loss, optim, fp8), `memory`, `blas`, `kernels` (modules,
//! the [`kernels`] launch builder and the launch-argument checks), `error`, `conv` (every
//! dtype/enum mapping), plus `graph`, `loader`, `blaslt`, `nccl`, `nvml`, `nvtx`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod blas;
mod blaslt;
mod conv;
mod device;
mod error;
mod graph;
pub mod kernels;
pub mod loader;
mod memory;
mod nvml;
mod nvtx;
mod ops;
mod runtime;
pub use nvml::NVML_LIB_ENV;
pub use nvtx::NVTX_LIB_ENV;
pub mod nccl;

pub use device::{CudaDevice, UNFUSED_ENV};
pub use graph::CudaStepGraph;

pub use kernels::{KernelModule, compile};
pub use memory::CudaBuffer;
pub use nccl::NcclComm;
pub use ops::loss::CrossEntropyCache;

// device.rs spells these two names itself; they must be the knobs' (duet_device::knobs).
const _: () = assert!(
    same_str(device::UNFUSED_ENV, duet_device::knobs::CUDA_UNFUSED)
        && same_str(device::AUTOTUNE_ENV, duet_device::knobs::GEMM_AUTOTUNE)
);

const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
