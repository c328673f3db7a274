//! Implements [`ElementwiseOps`] for the CPU: scaling, residual adds, GELU and bias.

use super::math::sigmoid_f32;
use super::{ELEM_CHUNK, REDUCE_BLOCK_ROWS, par_chunks_f32, read, rows_per_task};
use crate::CpuDevice;
use duet_device::{
    Add, AddAssign, BiasAdd, BiasBackward, Checked, ElementwiseOps, GeluBackward, GeluForward,
    Result, RowsDesc, Scale,
};
use rayon::prelude::*;

const GELU_K: f32 = 0.797_884_6; // sqrt(2/pi)
const GELU_C: f32 = 0.044_715;

// GELU with the tanh approximation, written with the identity 0.5·(1 + tanh(u)) = σ(2u):
// gelu(x) = x·σ(2u) with u = √(2/π)·(x + 0.044715·x³), which avoids libm's tanh (and its
// cancellation near tanh = −1) and vectorises.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    let u = GELU_K * (x + GELU_C * x * x * x);
    x * sigmoid_f32(2.0 * u)
}

// d/dx [x·σ(2u)] = σ(2u) + x·σ'(2u)·2u' with σ' = σ(1 − σ) and u' = √(2/π)·(1 + 3·0.044715·x²).
#[inline(always)]
fn gelu_grad(x: f32) -> f32 {
    let u = GELU_K * (x + GELU_C * x * x * x);
    let s = sigmoid_f32(2.0 * u);
    s + 2.0 * x * s * (1.0 - s) * GELU_K * (1.0 + 3.0 * GELU_C * x * x)
}

// The loops live in functions taking slices so that the compiler knows the output does not
// alias the inputs and vectorises them.
fn gelu_kernel(x: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(x) {
        *o = gelu(x);
    }
}

fn gelu_backward_kernel(x: &[f32], dout: &[f32], dx: &mut [f32]) {
    for ((o, &x), &d) in dx.iter_mut().zip(x).zip(dout) {
        *o = gelu_grad(x) * d;
    }
}

/// Column sums of `rows × c` data in fixed blocks of [`REDUCE_BLOCK_ROWS`] rows: returns one
/// partial per block, in block order. `per_row(row, acc)` adds row `row`'s contribution.
pub(crate) fn block_partials<F>(rows: usize, width: usize, per_row: F) -> Vec<Vec<f32>>
where
    F: Fn(usize, &mut [f32]) + Send + Sync,
{
    let blocks = rows.div_ceil(REDUCE_BLOCK_ROWS);
    (0..blocks)
        .into_par_iter()
        .map(|blk| {
            let mut acc = vec![0.0f32; width];
            let end = ((blk + 1) * REDUCE_BLOCK_ROWS).min(rows);
            for r in blk * REDUCE_BLOCK_ROWS..end {
                per_row(r, &mut acc);
            }
            acc
        })
        .collect()
}

/// Adds the block partials (in block order) to `dst[offset..offset + width]`.
pub(crate) fn combine_partials(
    partials: &[Vec<f32>],
    offset: usize,
    width: usize,
    dst: &mut [f32],
) {
    let mut total = vec![0.0f32; width];
    for p in partials {
        for (t, &x) in total.iter_mut().zip(&p[offset..offset + width]) {
            *t += x;
        }
    }
    for (d, t) in dst.iter_mut().zip(total) {
        *d += t;
    }
}

impl ElementwiseOps for CpuDevice {
    fn scale(&self, args: Checked<Scale<'_, Self::Buffer>>) -> Result<()> {
        let Scale { x, alpha } = args.into_inner();
        self.run(|| {
            let xv = x.act_mut("scale")?;
            par_chunks_f32(xv, true, ELEM_CHUNK, |_, s| {
                for v in s.iter_mut() {
                    *v *= alpha;
                }
            });
            Ok(())
        })
    }

    fn add(&self, args: Checked<Add<'_, Self::Buffer>>) -> Result<()> {
        let Add { a, b, out } = args.into_inner();
        self.run(|| {
            const OP: &str = "add";
            let (av, bv) = (a.act(OP)?, b.act(OP)?);
            par_chunks_f32(out.act_mut(OP)?, false, ELEM_CHUNK, |start, o| {
                let (mut s1, mut s2) = (Vec::new(), Vec::new());
                let x = read(av, start, o.len(), &mut s1);
                let y = read(bv, start, o.len(), &mut s2);
                for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                    *o = x + y;
                }
            });
            Ok(())
        })
    }

    fn add_assign(&self, args: Checked<AddAssign<'_, Self::Buffer>>) -> Result<()> {
        let AddAssign { dst, src } = args.into_inner();
        self.run(|| {
            const OP: &str = "add_assign";
            let sv = src.act(OP)?;
            par_chunks_f32(dst.act_mut(OP)?, true, ELEM_CHUNK, |start, d| {
                let mut s1 = Vec::new();
                let x = read(sv, start, d.len(), &mut s1);
                for (d, &x) in d.iter_mut().zip(x) {
                    *d += x;
                }
            });
            Ok(())
        })
    }

    fn gelu_forward(&self, args: Checked<GeluForward<'_, Self::Buffer>>) -> Result<()> {
        let GeluForward { x, out } = args.into_inner();
        self.run(|| {
            const OP: &str = "gelu_forward";
            let xv = x.act(OP)?;
            par_chunks_f32(out.act_mut(OP)?, false, ELEM_CHUNK, |start, o| {
                let mut s1 = Vec::new();
                let xs = read(xv, start, o.len(), &mut s1);
                gelu_kernel(xs, o);
            });
            Ok(())
        })
    }

    fn gelu_backward(&self, args: Checked<GeluBackward<'_, Self::Buffer>>) -> Result<()> {
        let GeluBackward { x, dout, dx } = args.into_inner();
        self.run(|| {
            const OP: &str = "gelu_backward";
            let xv = x.act(OP)?;
            let dv = dout.act(OP)?;
            par_chunks_f32(dx.act_mut(OP)?, false, ELEM_CHUNK, |start, o| {
                let (mut s1, mut s2) = (Vec::new(), Vec::new());
                let xs = read(xv, start, o.len(), &mut s1);
                let ds = read(dv, start, o.len(), &mut s2);
                gelu_backward_kernel(xs, ds, o);
            });
            Ok(())
        })
    }

    fn bias_add(&self, args: Checked<BiasAdd<'_, Self::Buffer>>) -> Result<()> {
        let BiasAdd { x, bias, rows, c } = args.into_inner();
        self.run(|| {
            const OP: &str = "bias_add";
            let desc = RowsDesc::new(OP, rows, c)?;
            let total = desc.total;
            let bv = bias.act(OP)?.to_f32();
            let xv = x.act_mut(OP)?;
            if total == 0 {
                return Ok(());
            }
            par_chunks_f32(xv, true, rows_per_task(c) * c, |_, xs| {
                for row in xs.chunks_mut(c) {
                    for (v, &b) in row.iter_mut().zip(bv.iter()) {
                        *v += b;
                    }
                }
            });
            Ok(())
        })
    }

    fn bias_backward(&self, args: Checked<BiasBackward<'_, Self::Buffer>>) -> Result<()> {
        let BiasBackward {
            dout,
            dbias,
            rows,
            c,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "bias_backward";
            let dv = dout.act(OP)?;
            let mut db = dbias.act_mut(OP)?;
            let partials = block_partials(rows, c, |r, acc| {
                let mut s = Vec::new();
                let row = read(dv, r * c, c, &mut s);
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += x;
                }
            });
            db.with_f32_local(true, |d| combine_partials(&partials, 0, c, d));
            Ok(())
        })
    }
}
