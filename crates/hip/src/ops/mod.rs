//! The op families, one file each, with the same names as the CPU and CUDA backends' `ops/`:
//! each implements its family trait of duet_device for [`HipDevice`] (`impl NormOps for
//! HipDevice` in norm.rs, `impl Fp8Ops for HipDevice` in fp8.rs, ...). As on CUDA, every op that
//! reads or writes FP8 codes lives in `fp8.rs`. Here: the chunk tables that the multi-tensor
//! launches (optim.rs, fp8.rs, and `zero_many` in runtime.rs) read.

mod attention;
mod elementwise;
mod embedding;
mod fp8;
mod gemm;
mod loss;
mod norm;
mod optim;

use prelude::*;

/// Elements per chunk of the multi-tensor passes: CUDA's `CHUNK`. The sum-of-squares partition
/// (and so its rounding) depends on it; equal to CUDA's, the partials are CUDA's bits.
pub(crate) const CHUNK: usize = 1 << 14;
/// Threads per block of sum_squares_many_partial, adamw_multi and zero_many (DUET_BLOCK; CUDA's
/// THREADS, which the per-thread order of the sums depends on).
pub(crate) const THREADS: u32 = 256;
/// Most tables kept on the device.
const MAX_TABLES: usize = 8;

/// `(offset, len)` of each chunk of a tensor of `n` elements.
pub(crate) fn chunks(n: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(CHUNK)).map(move |k| (k * CHUNK, CHUNK.min(n - k * CHUNK)))
}

/// Appends `v` to a kernel table, little-endian (the layout every table here uses).
pub(crate) fn push_u64(table: &mut Vec<u8>, v: u64) {
    table.extend_from_slice(&v.to_le_bytes());
}

impl HipDevice {
    /// The device address of `table` (uploading it unless an identical one is cached; never
    /// while a graph is being recorded: the first, unrecorded step uploads every table).
    pub(crate) fn table(&self, op: &'static str, table: Vec<u8>) -> Result<*mut std::ffi::c_void> {
        let mut tables = self
            .tables
            .lock()
            .map_err(|_| DeviceError::InvalidArgument(format!("{op}: table lock poisoned")))?;
        if let Some((_, mem)) = tables.entries.iter().find(|(k, _)| *k == table) {
            return Ok(mem.ptr());
        }
        self.not_while_capturing(&format!("{op}: uploading a new chunk table"))?;
        if tables.entries.len() >= MAX_TABLES {
            tables.entries.remove(0);
        }
        let mut mem = self.alloc(DType::U8, table.len())?;
        self.upload_bytes(&table, &mut mem, 0)?;
        let ptr = mem.ptr();
        tables.entries.push((table, mem));
        Ok(ptr)
    }
}

/// What the op files share.
mod prelude {
    pub(super) use crate::conv::{float_suffix, kernel_suffix, wide_suffix};
    pub(super) use crate::device::{HipDevice, rows_grid, same_dtype, unsupported};
    pub(super) use crate::kernels::{dim, grid_dim};
    pub(super) use crate::memory::HipBuffer;
    pub(super) use duet_device::{
        AdamWClipped, AdamWClippedFp8, AdamWUpdate, Add, AddAssign, AttentionOps, BiasAdd,
        BiasBackward, Buffer, Check, Checked, CrossEntropyInPlace, CrossEntropyPadded, DType,
        DeviceError, ElementwiseOps, EmbeddingBackward, EmbeddingForward, EmbeddingOps,
        FlashAttentionBackward, FlashAttentionForward, Fp8Ops, Fp8ScalingUpdate, GeluBackward,
        GeluForward, Gemm, GemmEpilogue, GemmFp8, GemmOps, HeadsDesc, LayerNormBackward,
        LayerNormBackwardColsum, LayerNormForward, LayerNormForwardFp8, LossOps, MergeHeads,
        NormOps, OptimOps, QuantizeFp8, QuantizeFp8Gelu, QuantizeFp8Grad, QuantizeFp8Many, Result,
        RowsDesc, Runtime, Scale, SoftmaxCausalBackward, SoftmaxCausalForward, SplitHeads,
        SplitHeadsBackward, SumSquares, SumSquaresMany, check_dtype,
    };
    pub(super) use duet_gpu::launch::float_code;
}
