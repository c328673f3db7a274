//! Implements [`GemmOps`] for the CPU: batched strided GEMM on top of the `gemm` crate.
//!
//! f16/bf16 operands are widened to f32 scratch first (only the range the descriptor touches),
//! so every product accumulates in f32; a non-f32 C is widened, updated and rounded back once.
//!
//! Parallelism: a single large matrix uses `gemm::Parallelism::Rayon(threads)`; a batch of at
//! least `threads` matrices whose C blocks do not overlap runs one matrix per rayon task, each
//! single-threaded. The `gemm` crate splits work across threads by output tiles and keeps the
//! depth (k) blocking independent of the thread count, so every output element is accumulated
//! in the same order whatever the parallelism; the crate's tests check this bit-for-bit for
//! the model's shapes (`gemm_thread_count_independent`).
#![allow(unsafe_code)]

use crate::CpuDevice;
use crate::buffer::CpuBuffer;
use duet_device::{
    Buffer, Checked, DType, DeviceError, Gemm, GemmDesc, GemmOps, Result, check_float,
};
use gemm::Parallelism;
use rayon::prelude::*;

/// Below this many multiply-adds a single matrix is not worth splitting across threads.
const PAR_MIN_FLOPS: usize = 64 * 64 * 64;

/// Elements spanned by one stored `rows × cols` matrix with leading dimension `ld`.
pub(crate) fn extent(rows: usize, cols: usize, ld: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * ld + cols
    }
}

/// Elements from the first batch's offset to the end of the last batch's matrix.
pub(crate) fn span(batch: usize, stride: usize, ext: usize) -> usize {
    if ext == 0 {
        0
    } else {
        (batch - 1) * stride + ext
    }
}

/// The part of a GEMM after its operands are f32: C is widened (when not f32), updated and
/// rounded back once. `a32`/`b32` start at batch 0's matrices.
pub(crate) fn gemm_widened(
    op: &'static str,
    d: &GemmDesc,
    a32: &[f32],
    b32: &[f32],
    c: &mut CpuBuffer,
    threads: usize,
) -> Result<()> {
    let (ar, ac) = d.a_stored();
    let (br, bc) = d.b_stored();
    let a_ext = extent(ar, ac, d.lda);
    let b_ext = extent(br, bc, d.ldb);
    let c_ext = extent(d.m, d.n, d.ldc);
    let c_span = span(d.batch, d.stride_c, c_ext);
    // Without gaps between rows or batches, a zero beta means C need not be read.
    let dense_c = d.ldc == d.n && (d.batch == 1 || d.stride_c == c_ext);
    let read_c = d.beta != 0.0 || !dense_c;
    let mut cv = c.act_mut(op)?;
    cv.slice_mut(d.c_offset, c_span).with_f32(read_c, |c32| {
        run(d, a32, b32, c32, a_ext, b_ext, c_ext, threads)
    });
    Ok(())
}

/// Runs the batched GEMM on f32 slices that start at batch 0's matrices.
#[allow(clippy::too_many_arguments)]
fn run(
    d: &GemmDesc,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    a_ext: usize,
    b_ext: usize,
    c_ext: usize,
    threads: usize,
) {
    if d.k == 0 {
        // op(A)·op(B) is all zeros: C = beta·C (beta 0 overwrites, ignoring NaNs).
        for i in 0..d.batch {
            for r in 0..d.m {
                let start = i * d.stride_c + r * d.ldc;
                for x in &mut c[start..start + d.n] {
                    *x = if d.beta == 0.0 { 0.0 } else { d.beta * *x };
                }
            }
        }
        return;
    }
    let one = |i: usize, cm: &mut [f32], par: Parallelism| {
        let am = &a[i * d.stride_a..i * d.stride_a + a_ext];
        let bm = &b[i * d.stride_b..i * d.stride_b + b_ext];
        gemm_one(d, am, bm, cm, par);
    };
    let flops = d.m.saturating_mul(d.n).saturating_mul(d.k);
    if d.batch > 1 && threads > 1 && d.batch >= threads && d.stride_c >= c_ext {
        // Disjoint C blocks: one matrix per task.
        c.par_chunks_mut(d.stride_c)
            .take(d.batch)
            .enumerate()
            .for_each(|(i, cm)| one(i, &mut cm[..c_ext], Parallelism::None));
    } else {
        let par = if threads > 1 && flops >= PAR_MIN_FLOPS {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        for i in 0..d.batch {
            let start = i * d.stride_c;
            one(i, &mut c[start..start + c_ext], par);
        }
    }
}

/// One `C = alpha·op(A)·op(B) + beta·C` on exact-extent slices.
fn gemm_one(d: &GemmDesc, a: &[f32], b: &[f32], c: &mut [f32], par: Parallelism) {
    let (m, n, k) = (d.m, d.n, d.k);
    // Row and column strides of op(A) (m × k) and op(B) (k × n) in the row-major storage.
    let (a_rs, a_cs) = if d.trans_a { (1, d.lda) } else { (d.lda, 1) };
    let (b_rs, b_cs) = if d.trans_b { (1, d.ldb) } else { (d.ldb, 1) };
    // The largest index each matrix is accessed at must lie inside its slice. This holds by
    // construction (the slices are cut to the validated extents); checked here because the
    // call below relies on it for memory safety.
    assert!(m > 0 && n > 0 && k > 0);
    assert!((m - 1) * a_rs + (k - 1) * a_cs < a.len());
    assert!((k - 1) * b_rs + (n - 1) * b_cs < b.len());
    assert!((m - 1) * d.ldc + (n - 1) < c.len());
    let read_dst = d.beta != 0.0;
    // SAFETY: the asserts above show that every element `gemm` reads from `a` and `b` and
    // every element it reads or writes in `c` is inside the respective slice; `c` is a unique
    // borrow, so it aliases neither input; strides fit in isize because slice lengths do.
    // The crate computes dst := alpha·dst + beta·lhs·rhs (its alpha is our beta and vice
    // versa) and does not read dst when `read_dst` is false.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            d.ldc as isize,
            read_dst,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            d.beta,
            d.alpha,
            false,
            false,
            false,
            par,
        );
    }
}

impl GemmOps for CpuDevice {
    fn gemm(&self, args: Checked<Gemm<'_, Self::Buffer>>) -> Result<()> {
        let Gemm { desc, a, b, c } = args.into_inner();
        let threads = self.threads;
        self.run(|| {
            const OP: &str = "gemm";
            check_float(OP, a)?;
            if c.dtype() != a.dtype() && c.dtype() != DType::F32 {
                return Err(DeviceError::DTypeMismatch {
                    op: OP,
                    expected: a.dtype(),
                    got: c.dtype(),
                });
            }
            let d = desc;
            if d.batch == 0 || d.m == 0 || d.n == 0 {
                return Ok(());
            }
            let (ar, ac) = d.a_stored();
            let (br, bc) = d.b_stored();
            let a_ext = extent(ar, ac, d.lda);
            let b_ext = extent(br, bc, d.ldb);
            let a32 = a
                .act(OP)?
                .slice(d.a_offset, span(d.batch, d.stride_a, a_ext))
                .to_f32();
            let b32 = b
                .act(OP)?
                .slice(d.b_offset, span(d.batch, d.stride_b, b_ext))
                .to_f32();
            gemm_widened(OP, d, &a32, &b32, c, threads)
        })
    }
}
