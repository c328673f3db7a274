//! Implements [`NormOps`] for the CPU: LayerNorm over the last dimension, forward and backward.

use super::elementwise::combine_partials;
use super::{REDUCE_BLOCK_ROWS, dot_f32, read, rows_per_task, sum_f32};
use crate::CpuDevice;
use duet_device::{Checked, LayerNormBackward, LayerNormForward, NormOps, Result};
use rayon::prelude::*;

impl NormOps for CpuDevice {
    fn layernorm_forward(&self, args: Checked<LayerNormForward<'_, Self::Buffer>>) -> Result<()> {
        let LayerNormForward {
            x,
            gamma,
            beta,
            out,
            mean,
            rstd,
            n,
            c,
            eps,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "layernorm_forward";
            let xv = x.act(OP)?;
            let g = gamma.act(OP)?.to_f32();
            let bt = beta.act(OP)?.to_f32();
            let outv = out.act_mut(OP)?;
            let mean_s = mean.f32s_mut(OP)?;
            let rstd_s = rstd.f32s_mut(OP)?;
            if n == 0 {
                return Ok(());
            }
            let rpt = rows_per_task(c);
            outv.into_chunks(rpt * c)
                .into_par_iter()
                .zip(mean_s.par_chunks_mut(rpt))
                .zip(rstd_s.par_chunks_mut(rpt))
                .enumerate()
                .for_each(|(i, ((mut o, ms), rs))| {
                    let mut s = Vec::new();
                    let mut centered = vec![0.0f32; c];
                    o.with_f32_local(false, |o| {
                        for (k, orow) in o.chunks_mut(c).enumerate() {
                            let row = i * rpt + k;
                            let xs = read(xv, row * c, c, &mut s);
                            let mu = sum_f32(xs) / c as f32;
                            for (d, &x) in centered.iter_mut().zip(xs) {
                                *d = x - mu;
                            }
                            let var = dot_f32(&centered, &centered) / c as f32;
                            let r = 1.0 / (var + eps).sqrt();
                            for (((o, &d), &g), &b) in
                                orow.iter_mut().zip(&centered).zip(g.iter()).zip(bt.iter())
                            {
                                *o = d * r * g + b;
                            }
                            ms[k] = mu;
                            rs[k] = r;
                        }
                    });
                });
            Ok(())
        })
    }

    /// Accumulates into `dx`, `dgamma` and `dbeta`. `dx` rows are independent; the parameter
    /// gradients are summed per fixed block of rows and the blocks combined in order.
    fn layernorm_backward(&self, args: Checked<LayerNormBackward<'_, Self::Buffer>>) -> Result<()> {
        let LayerNormBackward {
            dout,
            x,
            gamma,
            mean,
            rstd,
            dx,
            dgamma,
            dbeta,
            n,
            c,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "layernorm_backward";
            let dv = dout.act(OP)?;
            let xv = x.act(OP)?;
            let mean_s = mean.f32s(OP)?;
            let rstd_s = rstd.f32s(OP)?;
            let g = gamma.act(OP)?.to_f32();
            let dxv = dx.act_mut(OP)?;
            let mut dgv = dgamma.act_mut(OP)?;
            let mut dbv = dbeta.act_mut(OP)?;
            if n == 0 {
                return Ok(());
            }

            // dx, plus per-block partials [dgamma | dbeta] of width 2c.
            let blocks = dxv.into_chunks(REDUCE_BLOCK_ROWS * c);
            let partials: Vec<Vec<f32>> = blocks
                .into_par_iter()
                .enumerate()
                .map(|(blk, mut dxb)| {
                    let mut acc = vec![0.0f32; 2 * c];
                    let (mut s1, mut s2) = (Vec::new(), Vec::new());
                    let mut xhat = vec![0.0f32; c];
                    let mut dnorm = vec![0.0f32; c];
                    dxb.with_f32_local(true, |dxb| {
                        for (k, dxrow) in dxb.chunks_mut(c).enumerate() {
                            let row = blk * REDUCE_BLOCK_ROWS + k;
                            let xs = read(xv, row * c, c, &mut s1);
                            let ds = read(dv, row * c, c, &mut s2);
                            let (mu, r) = (mean_s[row], rstd_s[row]);
                            for j in 0..c {
                                xhat[j] = (xs[j] - mu) * r;
                                dnorm[j] = ds[j] * g[j];
                            }
                            let dnorm_mean = sum_f32(&dnorm) / c as f32;
                            let dnorm_xhat_mean = dot_f32(&dnorm, &xhat) / c as f32;
                            let (dg, db) = acc.split_at_mut(c);
                            for j in 0..c {
                                dg[j] += ds[j] * xhat[j];
                                db[j] += ds[j];
                                dxrow[j] += (dnorm[j] - dnorm_mean - xhat[j] * dnorm_xhat_mean) * r;
                            }
                        }
                    });
                    acc
                })
                .collect();
            dgv.with_f32_local(true, |d| combine_partials(&partials, 0, c, d));
            dbv.with_f32_local(true, |d| combine_partials(&partials, c, c, d));
            Ok(())
        })
    }
}
