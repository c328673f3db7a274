//! Implements [`OptimOps`] for the CPU: the fused AdamW step and the sum of squares for
//! gradient-norm clipping.

use super::{ELEM_CHUNK, read};
use crate::CpuDevice;
use duet_device::{AdamWStep, AdamWUpdate, Buffer, Checked, OptimOps, Result, SumSquares};
use rayon::prelude::*;

/// Elements per partial sum in [`OptimOps::sum_squares`]; fixed so the result ignores the thread
/// count.
const SUMSQ_CHUNK: usize = 1 << 12;

impl OptimOps for CpuDevice {
    fn adamw(&self, args: Checked<AdamWUpdate<'_, Self::Buffer>>) -> Result<()> {
        let AdamWUpdate {
            param,
            grad,
            m,
            v,
            step,
            param_copy,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "adamw";
            let gv = grad.act(OP)?;
            let pc = match param_copy {
                Some(pc) => Some(pc.any_float_mut(OP)?),
                None => None,
            };
            let ps = param.f32s_mut(OP)?;
            let ms = m.f32s_mut(OP)?;
            let vs = v.f32s_mut(OP)?;
            let AdamWStep {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                bias_correction1,
                bias_correction2,
                grad_scale,
            } = *step;
            ps.par_chunks_mut(ELEM_CHUNK)
                .zip(ms.par_chunks_mut(ELEM_CHUNK))
                .zip(vs.par_chunks_mut(ELEM_CHUNK))
                .enumerate()
                .for_each(|(i, ((p, m), v))| {
                    let mut s = Vec::new();
                    let g = read(gv, i * ELEM_CHUNK, p.len(), &mut s);
                    for (((p, m), v), &g) in p.iter_mut().zip(m).zip(v).zip(g) {
                        let g = g * grad_scale;
                        *m = beta1 * *m + (1.0 - beta1) * g;
                        *v = beta2 * *v + (1.0 - beta2) * g * g;
                        let m_hat = *m / bias_correction1;
                        let v_hat = *v / bias_correction2;
                        *p -= lr * (m_hat / (v_hat.sqrt() + eps) + weight_decay * *p);
                    }
                });
            if let Some(pc) = pc {
                pc.store_par(ps);
            }
            Ok(())
        })
    }

    /// `out[slot] += Σ x²`: squares summed in f64 per fixed chunk of `SUMSQ_CHUNK` elements,
    /// chunk sums combined in order (f64), then added to `out[slot]` with one f32 rounding.
    fn sum_squares(&self, args: Checked<SumSquares<'_, Self::Buffer>>) -> Result<()> {
        let SumSquares { x, out, slot } = args.into_inner();
        self.run(|| {
            const OP: &str = "sum_squares";
            let len = x.len();
            let xv = x.any_float(OP)?;
            let partials: Vec<f64> = (0..len.div_ceil(SUMSQ_CHUNK))
                .into_par_iter()
                .with_min_len(4)
                .map(|ci| {
                    let start = ci * SUMSQ_CHUNK;
                    let mut s = Vec::new();
                    let xs = read(xv, start, SUMSQ_CHUNK.min(len - start), &mut s);
                    let mut lanes = [0.0f64; 4];
                    let mut chunks = xs.chunks_exact(4);
                    for c in &mut chunks {
                        for (l, &x) in lanes.iter_mut().zip(c) {
                            *l += x as f64 * x as f64;
                        }
                    }
                    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
                        *l += x as f64 * x as f64;
                    }
                    (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])
                })
                .collect();
            let total: f64 = partials.iter().sum();
            let o = &mut out.f32s_mut(OP)?[slot];
            *o = (*o as f64 + total) as f32;
            Ok(())
        })
    }
}
