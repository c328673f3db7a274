//! The op families, one file each, with the same names as the CPU and CUDA backends' `ops/`
//! (a family the HIP backend has no op of has no file): each holds `impl HipDevice` methods
//! named `<trait method>_impl` that `impl Device for HipDevice` (device.rs) calls, one per trait
//! method. As on CUDA, every op that reads or writes FP8 codes lives in `fp8.rs`.

mod attention;
mod elementwise;
mod embedding;
mod fp8;
mod gemm;
mod layernorm;
mod loss;
mod memory;
mod optim;

pub(crate) use attention::FlashInner;
pub(crate) use fp8::Workspaces;
pub(crate) use optim::Tables;

/// What the op files share.
mod prelude {
    pub(super) use crate::conv::{self, float_suffix, kernel_suffix, wide_suffix};
    pub(super) use crate::device::{HipDevice, rows_grid, same_dtype, unsupported};
    pub(super) use crate::kernels::{dim, grid_dim};
    pub(super) use crate::memory::HipBuffer;
    pub(super) use duet_device::args::float_code;
    pub(super) use duet_device::{
        Buffer, DType, Device, DeviceError, HeadsDesc, Result, RowsDesc, SoftmaxDesc, TokensDesc,
        args, check_dtype,
    };
}
