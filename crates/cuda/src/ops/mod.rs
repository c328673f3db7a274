//! The op families, one file each, with the same names as the CPU backend's `ops/` (and the HIP
//! backend's): each holds `impl CudaDevice` methods named `<trait method>_impl` that
//! `impl Device for CudaDevice` (device.rs) calls, one per trait method, plus the family's
//! private helpers.
//!
//! Where an op belongs: the family of the trait method it implements, except that every op that
//! reads or writes FP8 codes (quantisation, FP8 GEMMs and their epilogues, the FP8 scaling
//! update, and the FP8 fusions `layernorm_forward_fp8`, `quantize_fp8_grad`,
//! `quantize_fp8_gelu`, `adamw_clipped_fp8`) lives in `fp8.rs`.

mod attention;
mod elementwise;
mod embedding;
mod fp8;
mod gemm;
mod layernorm;
pub(crate) mod loss;
mod memory;
mod optim;

/// What the op files share.
mod prelude {
    pub(super) use crate::conv::{self, float_code, float_suffix, wide_suffix};
    pub(super) use crate::device::{
        CudaDevice, EW_BLOCK, ROW_BLOCK, lock, rows_grid, rows_per_chunk, same_dtype,
    };
    pub(super) use crate::error::drv;
    pub(super) use crate::kernels::{Arg, KernelModule, checked_product, dim, grid_dim, too_large};
    pub(super) use crate::memory::{CudaBuffer, align_up};
    pub(super) use duet_device::{
        Buffer, DType, Device, DeviceError, HeadsDesc, Result, RowsDesc, SoftmaxDesc, TokensDesc,
        args, check_dtype,
    };
}

pub(crate) use fp8::{FP8_COUNTERS, QuantOf};
pub(crate) use optim::Tables;
