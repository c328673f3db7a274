//! ZeRO stage 1: the optimizer state sharded over the ranks.
//!
//! Each gradient bucket (see [`super::plan_buckets`]) is reduce-scattered, so rank `r` receives
//! the summed gradients of elements `r·s .. (r+1)·s` of the bucket (`s = len / world`). The
//! rank keeps, for exactly those elements, the FP32 master weights and AdamW's two moments
//! (12 bytes per parameter over the world size instead of 12 on every rank). A shard can cut
//! across parameters, which differ in weight decay and working dtype, so it is held as
//! *segments*: the intersection of one parameter with the shard, each with its own buffers.
//! After the update, each rank writes its segments' new working weights into the bucket's
//! shard and the shards are all-gathered into every rank's model.
//!
//! The arithmetic per element is the same fused AdamW kernel as the unsharded optimizer, so a
//! ZeRO run follows a replicated one up to the rounding of the reductions.

use super::{Bucket, GradSync};
use crate::optim::{AdamWConfig, StepStats};
use crate::precision::LossScaler;
use crate::{EngineError, Result};
use duet_device::{
    AdamWStep, AdamWUpdate, Collective, DType, Device, DeviceExt, ReduceOp, SumSquares,
};
use std::sync::Arc;

/// One parameter's part of this rank's shard of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub bucket: usize,
    pub param: usize,
    /// First element of the parameter covered.
    pub param_offset: usize,
    /// Position in the bucket's shard.
    pub shard_offset: usize,
    pub len: usize,
}

/// This rank's segments: the intersections of each bucket's shard `rank` with its parameters.
pub fn segments(buckets: &[Bucket], rank: usize, world: usize) -> Vec<Segment> {
    let mut out = Vec::new();
    for (bi, b) in buckets.iter().enumerate() {
        let s = b.shard_len(world);
        let (lo, hi) = (rank * s, (rank + 1) * s);
        for e in &b.entries {
            let (a, z) = (e.offset.max(lo), (e.offset + e.len).min(hi));
            if a < z {
                out.push(Segment {
                    bucket: bi,
                    param: e.param,
                    param_offset: a - e.offset,
                    shard_offset: a - lo,
                    len: z - a,
                });
            }
        }
    }
    out
}

/// AdamW on this rank's shard of the parameters.
pub struct ShardedAdamW<D: Device> {
    cfg: AdamWConfig,
    comm: Arc<dyn Collective<D>>,
    buckets: Vec<Bucket>,
    segs: Vec<Segment>,
    decay: Vec<bool>,
    master: Vec<D::Buffer>,
    m: Vec<D::Buffer>,
    v: Vec<D::Buffer>,
    grad: Vec<D::Buffer>,
    /// The updated working copy of a segment whose parameter is not f32.
    wcopy: Vec<Option<D::Buffer>>,
    /// Per bucket: this rank's updated working weights (bucket dtype, shard length).
    wshard: Vec<D::Buffer>,
    /// Per bucket whose dtype is not f32: the gathered working weights (f32 buckets gather
    /// into the gradient flat buffer, free at that point).
    wfull: Vec<Option<D::Buffer>>,
    norm: D::Buffer,
    step: u64,
}

impl<D: Device> ShardedAdamW<D> {
    /// Shards for `comm`'s rank, the masters initialised from `weights` (host f32, all
    /// parameters); `decay[i]` says whether parameter `i` takes weight decay.
    pub fn new(
        dev: &D,
        cfg: AdamWConfig,
        comm: Arc<dyn Collective<D>>,
        buckets: Vec<Bucket>,
        decay: Vec<bool>,
        weights: &[Vec<f32>],
    ) -> Result<Self> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let segs = segments(&buckets, rank, world);
        let mut master = Vec::with_capacity(segs.len());
        let (mut m, mut v, mut grad, mut wcopy) = (vec![], vec![], vec![], vec![]);
        for s in &segs {
            let w = weights.get(s.param).ok_or_else(|| {
                EngineError::Config(format!("ZeRO: no weights for parameter {}", s.param))
            })?;
            master.push(dev.upload_new(&w[s.param_offset..s.param_offset + s.len])?);
            m.push(dev.alloc(DType::F32, s.len)?);
            v.push(dev.alloc(DType::F32, s.len)?);
            grad.push(dev.alloc(DType::F32, s.len)?);
            let dt = buckets[s.bucket].dtype;
            wcopy.push(if dt == DType::F32 {
                None
            } else {
                Some(dev.alloc(dt, s.len)?)
            });
        }
        let mut wshard = Vec::with_capacity(buckets.len());
        let mut wfull = Vec::with_capacity(buckets.len());
        for b in &buckets {
            wshard.push(dev.alloc(b.dtype, b.shard_len(world))?);
            wfull.push(if b.dtype == DType::F32 {
                None
            } else {
                Some(dev.alloc(b.dtype, b.len)?)
            });
        }
        Ok(Self {
            cfg,
            comm,
            buckets,
            segs,
            decay,
            master,
            m,
            v,
            grad,
            wcopy,
            wshard,
            wfull,
            norm: dev.alloc(DType::F32, 1)?,
            step: 0,
        })
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    pub fn set_steps_taken(&mut self, step: u64) {
        self.step = step;
    }

    /// Bytes of optimizer state this rank holds (masters and moments).
    pub fn state_bytes(&self) -> u64 {
        12 * self.segs.iter().map(|s| s.len as u64).sum::<u64>()
    }

    /// One update from the reduce-scattered gradients in `sync` (after
    /// [`GradSync::finish`]); writes the gathered new weights into `params`.
    pub fn step(
        &mut self,
        dev: &D,
        params: &mut [D::Buffer],
        sync: &mut GradSync<D>,
        lr: f32,
        scaler: Option<&mut LossScaler>,
    ) -> Result<StepStats> {
        let shards = sync
            .shards()
            .ok_or_else(|| EngineError::Config("ZeRO needs reduce-scattered gradients".into()))?;
        dev.fill(&mut self.norm, 0.0)?;
        for (s, g) in self.segs.iter().zip(&mut self.grad) {
            dev.copy(&shards[s.bucket], s.shard_offset, g, 0, s.len)?;
            dev.exec(SumSquares {
                x: g,
                out: &mut self.norm,
                slot: 0,
            })?;
        }
        // The shards partition the gradients: their squares sum to the global norm², the same
        // value (inf/NaN included) on every rank.
        self.comm.all_reduce(&mut self.norm, ReduceOp::Sum)?;
        self.comm.wait()?;
        let sq: Vec<f32> = dev.download(&self.norm)?;
        let plan = self.cfg.plan(sq[0].sqrt(), scaler);
        if plan.stats.skipped {
            return Ok(plan.stats);
        }
        self.step += 1;
        let c = &self.cfg;
        let (bc1, bc2) = AdamWStep::bias_corrections(c.beta1, c.beta2, self.step);
        for (i, s) in self.segs.iter().enumerate() {
            let step = AdamWStep {
                lr,
                beta1: c.beta1,
                beta2: c.beta2,
                eps: c.eps,
                weight_decay: if self.decay[s.param] {
                    c.weight_decay
                } else {
                    0.0
                },
                bias_correction1: bc1,
                bias_correction2: bc2,
                grad_scale: plan.grad_scale,
            };
            dev.exec(AdamWUpdate {
                param: &mut self.master[i],
                grad: &self.grad[i],
                m: &mut self.m[i],
                v: &mut self.v[i],
                step: &step,
                param_copy: self.wcopy[i].as_mut(),
            })?;
            let src = self.wcopy[i].as_ref().unwrap_or(&self.master[i]);
            dev.copy(src, 0, &mut self.wshard[s.bucket], s.shard_offset, s.len)?;
        }
        for bi in 0..self.buckets.len() {
            let full = match &mut self.wfull[bi] {
                Some(f) => f,
                None => sync.flat_mut(bi),
            };
            self.comm.all_gather(&self.wshard[bi], full)?;
        }
        self.comm.wait()?;
        for (bi, b) in self.buckets.iter().enumerate() {
            let full = match &self.wfull[bi] {
                Some(f) => f,
                None => sync.flat_mut(bi),
            };
            for e in &b.entries {
                dev.copy(full, e.offset, &mut params[e.param], 0, e.len)?;
            }
        }
        // The f32 flats hold weights now; the next step's gradient copies overwrite every
        // entry, and the padding was gathered from zero-initialised shard tails.
        Ok(plan.stats)
    }

    /// Gathers a full per-parameter copy (host f32) of the masters and both moments, for a
    /// checkpoint. Collective: every rank must call it.
    #[allow(clippy::type_complexity)]
    pub fn gather_state(
        &self,
        dev: &D,
        numels: &[usize],
    ) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<Vec<f32>>)> {
        let world = self.comm.world_size();
        let mut out = [
            numels.iter().map(|&n| vec![0f32; n]).collect::<Vec<_>>(),
            numels.iter().map(|&n| vec![0f32; n]).collect::<Vec<_>>(),
            numels.iter().map(|&n| vec![0f32; n]).collect::<Vec<_>>(),
        ];
        for (bi, b) in self.buckets.iter().enumerate() {
            let mut shard = dev.alloc(DType::F32, b.shard_len(world))?;
            let mut full = dev.alloc(DType::F32, b.len)?;
            for (k, bufs) in [&self.master, &self.m, &self.v].into_iter().enumerate() {
                for (s, buf) in self.segs.iter().zip(bufs) {
                    if s.bucket == bi {
                        dev.copy(buf, 0, &mut shard, s.shard_offset, s.len)?;
                    }
                }
                self.comm.all_gather(&shard, &mut full)?;
                self.comm.wait()?;
                let host: Vec<f32> = dev.download(&full)?;
                for e in &b.entries {
                    out[k][e.param].copy_from_slice(&host[e.offset..e.offset + e.len]);
                }
            }
        }
        let [w, m, v] = out;
        Ok((w, m, v))
    }

    /// Loads this rank's segments of full per-parameter masters and moments (a checkpoint).
    pub fn load_state(
        &mut self,
        dev: &D,
        weights: &[Vec<f32>],
        m: &[Vec<f32>],
        v: &[Vec<f32>],
    ) -> Result<()> {
        for (i, s) in self.segs.iter().enumerate() {
            let r = s.param_offset..s.param_offset + s.len;
            for (host, buf) in [
                (weights, &mut self.master[i]),
                (m, &mut self.m[i]),
                (v, &mut self.v[i]),
            ] {
                let src = host
                    .get(s.param)
                    .and_then(|h| h.get(r.clone()))
                    .ok_or_else(|| {
                        EngineError::Config(format!(
                            "ZeRO: the state of parameter {} is too short",
                            s.param
                        ))
                    })?;
                dev.upload(src, buf, 0)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::Entry;

    #[test]
    fn segments_partition_every_parameter() {
        let buckets = vec![
            Bucket {
                dtype: DType::F32,
                entries: vec![
                    Entry {
                        param: 0,
                        offset: 0,
                        len: 5,
                    },
                    Entry {
                        param: 1,
                        offset: 5,
                        len: 4,
                    },
                ],
                len: 12,
                ready_after: 0,
            },
            Bucket {
                dtype: DType::BF16,
                entries: vec![Entry {
                    param: 2,
                    offset: 0,
                    len: 2,
                }],
                len: 3,
                ready_after: 1,
            },
        ];
        let world = 3;
        let mut covered = [vec![0u8; 5], vec![0u8; 4], vec![0u8; 2]];
        for r in 0..world {
            for s in segments(&buckets, r, world) {
                assert!(s.shard_offset + s.len <= buckets[s.bucket].shard_len(world));
                for c in &mut covered[s.param][s.param_offset..s.param_offset + s.len] {
                    *c += 1;
                }
            }
        }
        for c in &covered {
            assert!(c.iter().all(|&n| n == 1), "{covered:?}");
        }
        // Rank 1 owns elements 4..8 of bucket 0: the last of parameter 0, three of parameter 1.
        let s1 = segments(&buckets, 1, world);
        assert_eq!(
            (
                s1[0].param,
                s1[0].param_offset,
                s1[0].len,
                s1[0].shard_offset
            ),
            (0, 4, 1, 0)
        );
        assert_eq!(
            (
                s1[1].param,
                s1[1].param_offset,
                s1[1].len,
                s1[1].shard_offset
            ),
            (1, 0, 3, 1)
        );
    }
}
