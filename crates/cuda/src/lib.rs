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
//! Module layout follows the HIP backend: `device`, `memory`, `blas`, `kernels`, `error`,
//! `conv`, plus `loader`.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod blas;
mod blaslt;
mod conv;
mod device;
mod error;
pub mod kernels;
pub mod loader;
mod memory;
mod nvml;
mod nvtx;
pub use nvml::NVML_LIB_ENV;
pub use nvtx::NVTX_LIB_ENV;
pub mod nccl;

pub use device::{CudaDevice, CudaStepGraph, UNFUSED_ENV};
pub use kernels::{KernelModule, compile};
pub use memory::CudaBuffer;
pub use nccl::NcclComm;
