//! Implements [`LossOps`] for the CPU: fused softmax + cross-entropy.

use super::math::exp_f32;
use super::{max_f32, read, rows_per_task, sum_f32};
use crate::CpuDevice;
use crate::buffer::{FMut, FRef};
use duet_device::{Checked, CrossEntropyPadded, DeviceError, LossOps, Result};
use rayon::prelude::*;

/// Loss of one row (0 for an ignored target). When `grad` is given, writes
/// `(softmax − onehot) · grad_scale` there (all zeros for an ignored target). `scratch` holds
/// the exponentials when there is no gradient row to hold them.
fn row(
    logits: &[f32],
    target: i32,
    grad: Option<&mut [f32]>,
    grad_scale: f32,
    scratch: &mut Vec<f32>,
) -> f32 {
    if target < 0 {
        if let Some(g) = grad {
            g.fill(0.0);
        }
        return 0.0;
    }
    let target = target as usize;
    let mx = max_f32(logits);
    let e: &mut [f32] = match grad {
        Some(g) => g,
        None => {
            scratch.resize(logits.len(), 0.0);
            scratch
        }
    };
    for (e, &x) in e.iter_mut().zip(logits) {
        *e = exp_f32(x - mx);
    }
    let sum = sum_f32(e);
    let loss = mx + sum.ln() - logits[target];
    let k = grad_scale / sum;
    for e in e.iter_mut() {
        *e *= k;
    }
    e[target] -= grad_scale;
    loss
}

impl LossOps for CpuDevice {
    fn cross_entropy_padded(
        &self,
        args: Checked<CrossEntropyPadded<'_, Self::Buffer>>,
    ) -> Result<()> {
        let CrossEntropyPadded {
            logits,
            targets,
            losses,
            dlogits,
            n,
            v,
            ld,
            grad_scale,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "cross_entropy";
            let lv = logits.act(OP)?;
            let tg = targets.i32s(OP)?;
            let dl = match dlogits {
                Some(d) => Some(d.act_mut(OP)?),
                None => None,
            };
            if let Some((i, &tgt)) = tg
                .iter()
                .enumerate()
                .find(|&(_, &x)| x >= 0 && x as usize >= v)
            {
                return Err(DeviceError::InvalidArgument(format!(
                    "{OP}: target {tgt} of row {i} is outside the vocabulary of {v}"
                )));
            }
            let ls = losses.f32s_mut(OP)?;
            if n == 0 {
                return Ok(());
            }
            let rpt = rows_per_task(v);
            let task = |i: usize, ls: &mut [f32], dl: Option<FMut<'_>>, lv: FRef<'_>| {
                let (mut s, mut scratch) = (Vec::new(), Vec::new());
                match dl {
                    Some(mut d) => d.with_f32_local(false, |d| {
                        for (k, (l, g)) in ls.iter_mut().zip(d.chunks_mut(ld)).enumerate() {
                            let r = i * rpt + k;
                            // The padded columns (v..ld) take no part; their gradient is 0.
                            let (g, pad) = g.split_at_mut(v);
                            pad.fill(0.0);
                            *l = row(
                                read(lv, r * ld, v, &mut s),
                                tg[r],
                                Some(g),
                                grad_scale,
                                &mut scratch,
                            );
                        }
                    }),
                    None => {
                        for (k, l) in ls.iter_mut().enumerate() {
                            let r = i * rpt + k;
                            *l = row(
                                read(lv, r * ld, v, &mut s),
                                tg[r],
                                None,
                                grad_scale,
                                &mut scratch,
                            );
                        }
                    }
                }
            };
            match dl {
                Some(d) => d
                    .into_chunks(rpt * ld)
                    .into_par_iter()
                    .zip(ls.par_chunks_mut(rpt))
                    .enumerate()
                    .for_each(|(i, (d, l))| task(i, l, Some(d), lv)),
                None => ls
                    .par_chunks_mut(rpt)
                    .enumerate()
                    .for_each(|(i, l)| task(i, l, None, lv)),
            }
            Ok(())
        })
    }
}
