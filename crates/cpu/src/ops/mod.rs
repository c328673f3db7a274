//! The CPU implementations of the op family traits, one module per family (`<family>.rs` holds
//! `impl <Family>Ops for CpuDevice`), plus the shared math and chunking helpers.
//!
//! Every op validates its arguments first, then runs on the device's rayon pool (its body is
//! wrapped in `ThreadPool::install`). Work is split into tasks whose boundaries depend only on
//! the problem shape, never on the thread count, and every reduction across tasks is combined in
//! task order, so results are bit-identical for any number of threads.
//!
//! Every fused path is composed of the core ops (the family traits' defaults): the CPU is the
//! reference the backends' native paths are checked against.

pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod embedding;
pub(crate) mod fp8;
pub(crate) mod gemm;
pub(crate) mod loss;
pub(crate) mod math;
pub(crate) mod norm;
pub(crate) mod optim;

use crate::buffer::{FMut, FRef};
use rayon::prelude::*;

/// Target number of elements per parallel task for element-wise work.
pub(crate) const ELEM_CHUNK: usize = 1 << 14;

/// Fixed number of rows per block in cross-row reductions (bias, LayerNorm and embedding
/// gradients). Partial sums of blocks are combined in block order, which makes the result
/// independent of the thread count.
pub(crate) const REDUCE_BLOCK_ROWS: usize = 32;

/// Rows per task for row-wise ops: about [`ELEM_CHUNK`] elements, at least one row.
pub(crate) fn rows_per_task(row_len: usize) -> usize {
    (ELEM_CHUNK / row_len.max(1)).max(1)
}

/// `len` elements of `src` from `start` as f32: borrowed for f32 storage, else loaded into
/// `scratch`.
pub(crate) fn read<'s>(
    src: FRef<'s>,
    start: usize,
    len: usize,
    scratch: &'s mut Vec<f32>,
) -> &'s [f32] {
    match src {
        FRef::F32(s) => &s[start..start + len],
        other => {
            scratch.resize(len, 0.0);
            other.load(start, scratch);
            scratch
        }
    }
}

/// Splits `out` into chunks of `chunk` elements and runs `f(first_element, chunk_as_f32)` on
/// each in parallel. Non-f32 chunks are converted to f32 (loaded first when `read` is set) and
/// stored back afterwards.
pub(crate) fn par_chunks_f32<F>(out: FMut<'_>, read: bool, chunk: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Send + Sync,
{
    let chunk = chunk.max(1);
    out.into_chunks(chunk)
        .into_par_iter()
        .enumerate()
        .for_each(|(i, mut ch)| ch.with_f32_local(read, |s| f(i * chunk, s)));
}

/// Sum with eight fixed interleaved lanes combined in a fixed order: vectorises and is
/// deterministic.
pub(crate) fn sum_f32(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += x;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// Dot product with the same fixed lane structure as [`sum_f32`].
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    for (l, (&x, &y)) in lanes
        .iter_mut()
        .zip(ca.remainder().iter().zip(cb.remainder()))
    {
        *l += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// Maximum of a slice with eight fixed lanes (`f32::max` semantics: NaN elements are skipped).
pub(crate) fn max_f32(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.max(x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l = l.max(x);
    }
    lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}
