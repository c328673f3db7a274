//! Implements [`AttentionOps`] for the CPU: head split/merge permutations and the causal softmax.
//!
//! The permutations move raw elements (bytes), so they work for every dtype and are exact.

use super::math::exp_f32;
use super::{max_f32, par_chunks_f32, read, rows_per_task, sum_f32};
use crate::CpuDevice;
use duet_device::{
    AttentionOps, Buffer, Checked, HeadsDesc, MergeHeads, Result, SoftmaxCausalBackward,
    SoftmaxCausalForward, SoftmaxDesc, SplitHeads, SplitHeadsBackward,
};
use rayon::prelude::*;

/// Minimum elements per task for the permutations.
const PERMUTE_MIN_ELEMS: usize = 1 << 13;

impl AttentionOps for CpuDevice {
    fn split_heads(&self, args: Checked<SplitHeads<'_, Self::Buffer>>) -> Result<()> {
        let SplitHeads {
            qkv,
            q,
            k,
            v,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "split_heads";
            let desc = HeadsDesc::new(OP, b, t, nh, hs)?;
            let n = desc.n;
            if n == 0 {
                return Ok(());
            }
            let es = qkv.dtype().size_bytes();
            let src = qkv.storage.bytes();
            let c = nh * hs;
            let row = hs * es;
            let min_tasks = (PERMUTE_MIN_ELEMS / (t * hs)).max(1);
            for (which, dst) in [q, k, v].into_iter().enumerate() {
                // dst[bi, h, ti, :] = qkv[bi, ti, which, h, :]
                dst.storage
                    .bytes_mut()
                    .par_chunks_mut(t * row)
                    .with_min_len(min_tasks)
                    .enumerate()
                    .for_each(|(bh, out)| {
                        let (bi, h) = (bh / nh, bh % nh);
                        for (ti, o) in out.chunks_mut(row).enumerate() {
                            let s = ((bi * t + ti) * 3 + which) * c + h * hs;
                            o.copy_from_slice(&src[s * es..s * es + row]);
                        }
                    });
            }
            Ok(())
        })
    }

    fn split_heads_backward(
        &self,
        args: Checked<SplitHeadsBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SplitHeadsBackward {
            dq,
            dk,
            dv,
            dqkv,
            b,
            t,
            nh,
            hs,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "split_heads_backward";
            let desc = HeadsDesc::new(OP, b, t, nh, hs)?;
            let n = desc.n;
            if n == 0 {
                return Ok(());
            }
            let es = dqkv.dtype().size_bytes();
            let srcs = [dq.storage.bytes(), dk.storage.bytes(), dv.storage.bytes()];
            let c = nh * hs;
            let row = hs * es;
            // dqkv[bi, ti, which, h, :] = d{q,k,v}[bi, h, ti, :]
            dqkv.storage
                .bytes_mut()
                .par_chunks_mut(3 * c * es)
                .with_min_len((PERMUTE_MIN_ELEMS / (3 * c)).max(1))
                .enumerate()
                .for_each(|(bt, out)| {
                    let (bi, ti) = (bt / t, bt % t);
                    for (j, o) in out.chunks_mut(row).enumerate() {
                        let (which, h) = (j / nh, j % nh);
                        let s = ((bi * nh + h) * t + ti) * hs;
                        o.copy_from_slice(&srcs[which][s * es..s * es + row]);
                    }
                });
            Ok(())
        })
    }

    fn merge_heads(&self, args: Checked<MergeHeads<'_, Self::Buffer>>) -> Result<()> {
        let MergeHeads {
            y,
            out,
            b,
            t,
            nh,
            hs,
            backward,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "merge_heads";
            let desc = HeadsDesc::new(OP, b, t, nh, hs)?;
            let n = desc.n;
            if n == 0 {
                return Ok(());
            }
            let es = y.dtype().size_bytes();
            let src = y.storage.bytes();
            let c = nh * hs;
            let row = hs * es;
            let dst = out.storage.bytes_mut();
            if !backward {
                // out[bi, ti, h, :] = y[bi, h, ti, :]
                dst.par_chunks_mut(c * es)
                    .with_min_len((PERMUTE_MIN_ELEMS / c).max(1))
                    .enumerate()
                    .for_each(|(bt, o)| {
                        let (bi, ti) = (bt / t, bt % t);
                        for (h, o) in o.chunks_mut(row).enumerate() {
                            let s = ((bi * nh + h) * t + ti) * hs;
                            o.copy_from_slice(&src[s * es..s * es + row]);
                        }
                    });
            } else {
                // out[bi, h, ti, :] = y[bi, ti, h, :]
                dst.par_chunks_mut(t * row)
                    .with_min_len((PERMUTE_MIN_ELEMS / (t * hs)).max(1))
                    .enumerate()
                    .for_each(|(bh, o)| {
                        let (bi, h) = (bh / nh, bh % nh);
                        for (ti, o) in o.chunks_mut(row).enumerate() {
                            let s = (bi * t + ti) * c + h * hs;
                            o.copy_from_slice(&src[s * es..s * es + row]);
                        }
                    });
            }
            Ok(())
        })
    }

    fn softmax_causal_forward(
        &self,
        args: Checked<SoftmaxCausalForward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalForward {
            scores,
            probs,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "softmax_causal_forward";
            let desc = SoftmaxDesc::new(OP, rows, t)?;
            let total = desc.total;
            let sv = scores.act(OP)?;
            let pv = probs.act_mut(OP)?;
            if total == 0 {
                return Ok(());
            }
            par_chunks_f32(pv, false, rows_per_task(t) * t, |start, p| {
                let mut s = Vec::new();
                for (k, prow) in p.chunks_mut(t).enumerate() {
                    let line = start / t + k;
                    let i = line % t;
                    let x = read(sv, line * t, i + 1, &mut s);
                    let (valid, masked) = prow.split_at_mut(i + 1);
                    for (p, &x) in valid.iter_mut().zip(x) {
                        *p = scale * x;
                    }
                    let mx = max_f32(valid);
                    for p in valid.iter_mut() {
                        *p = exp_f32(*p - mx);
                    }
                    let inv = 1.0 / sum_f32(valid);
                    for p in valid.iter_mut() {
                        *p *= inv;
                    }
                    masked.fill(0.0);
                }
            });
            Ok(())
        })
    }

    fn softmax_causal_backward(
        &self,
        args: Checked<SoftmaxCausalBackward<'_, Self::Buffer>>,
    ) -> Result<()> {
        let SoftmaxCausalBackward {
            probs,
            dprobs,
            dscores,
            batch: rows,
            t,
            scale,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "softmax_causal_backward";
            let desc = SoftmaxDesc::new(OP, rows, t)?;
            let total = desc.total;
            let pv = probs.act(OP)?;
            let dv = dprobs.act(OP)?;
            let dsv = dscores.act_mut(OP)?;
            if total == 0 {
                return Ok(());
            }
            par_chunks_f32(dsv, false, rows_per_task(t) * t, |start, ds| {
                let (mut s1, mut s2) = (Vec::new(), Vec::new());
                for (k, drow) in ds.chunks_mut(t).enumerate() {
                    let line = start / t + k;
                    let i = line % t;
                    let p = read(pv, line * t, i + 1, &mut s1);
                    let dp = read(dv, line * t, i + 1, &mut s2);
                    let dot = super::dot_f32(p, dp);
                    let (valid, masked) = drow.split_at_mut(i + 1);
                    for ((d, &p), &dp) in valid.iter_mut().zip(p).zip(dp) {
                        *d = scale * p * (dp - dot);
                    }
                    masked.fill(0.0);
                }
            });
            Ok(())
        })
    }
}
