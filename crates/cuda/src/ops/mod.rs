//! The op families, one file each, with the same names as the HIP backend's `ops/`: each
//! implements its family trait of [`duet_device::ops`] for [`CudaDevice`](crate::CudaDevice)
//! (`impl <Family>Ops for CudaDevice`), with the family's private helpers. Casts, fills, copies
//! and the multi-buffer zeroing are the runtime's (runtime.rs).

mod attention;
mod elementwise;
mod embedding;
mod fp8;
mod gemm;
pub(crate) mod loss;
mod norm;
pub(crate) mod optim;

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
        AdamWClipped, AdamWClippedFp8, AdamWUpdate, Add, AddAssign, AttentionOps, BiasAdd,
        BiasBackward, Buffer, Check, Checked, CrossEntropyInPlace, CrossEntropyPadded, DType,
        DeviceError, ElementwiseOps, EmbeddingBackward, EmbeddingForward, EmbeddingOps,
        FlashAttentionBackward, FlashAttentionForward, Fp8Ops, Fp8ScalingUpdate, GeluBackward,
        GeluForward, Gemm, GemmEpilogue, GemmFp8, GemmFp8Epilogue, GemmOps, HeadsDesc,
        LayerNormBackward, LayerNormBackwardColsum, LayerNormForward, LayerNormForwardFp8, LossOps,
        MergeHeads, NormOps, OptimOps, QuantizeFp8, QuantizeFp8Gelu, QuantizeFp8Grad,
        QuantizeFp8Many, Result, RowsDesc, Runtime, Scale, SoftmaxCausalBackward,
        SoftmaxCausalForward, SoftmaxDesc, SplitHeads, SplitHeadsBackward, SumSquares,
        SumSquaresMany, check_dtype,
    };
}
