//! Data-parallel training: each rank (one GPU, or one thread of the CPU's in-process group in
//! tests) trains on its slice of the global batch and the ranks combine their gradients through
//! a [`Collective`] (NCCL, RCCL, or the CPU group).
//!
//! - **Batch.** Every rank draws the same global batch from the same sampler and takes rows
//!   `rank·b .. (rank+1)·b` with `b = batch / world`. The loss gradient of each rank is scaled by
//!   `local targets / global targets`, so the *sum* over ranks is the gradient of the global
//!   batch's mean loss, exactly what one rank with the whole batch computes.
//! - **Buckets.** Gradients are copied into flat f32 buckets of about
//!   [`DEFAULT_BUCKET_BYTES`], filled in the order the backward pass finishes them (final
//!   LayerNorm, blocks from the last to the first, embeddings) and reduced as soon as a bucket
//!   is complete, on the backend's communication stream; [`GradSync::finish`] waits for them.
//!   Buckets hold parameters of one working dtype only, so ZeRO can all-gather weights in it.
//! - **ZeRO-1** ([`zero`]): buckets are reduce-scattered instead of all-reduced; each rank keeps
//!   the FP32 master weights and AdamW moments of its 1/world of every bucket, updates them, and
//!   the updated working weights are all-gathered.
//! - **Agreement.** The gradient norm (clipping, the loss scaler's inf/NaN check), the logged
//!   loss and the FP8 amaxes are reduced across ranks, so every rank takes the same decisions
//!   and keeps the same scales.
//! - **Launch** ([`rendezvous`]): rank, world size and the address of rank 0 come from the
//!   torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); rank
//!   0 hands the collective library's unique id to the others over TCP.

pub mod rendezvous;
pub mod zero;

use crate::model::{BlockParam, param_index};
use crate::{EngineError, Result};
use duet_device::{Collective, DType, Device, DeviceExt, ReduceOp};
use std::sync::Arc;

/// Bucket size in bytes of f32 gradients (PyTorch DDP's default, 25 MiB).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// How a data-parallel run shards its work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpOptions {
    /// ZeRO stage 1: shard the optimizer state (master weights, moments) over the ranks.
    pub zero: bool,
    /// Target bytes per gradient bucket.
    pub bucket_bytes: usize,
    /// Launch each bucket's reduction as soon as the backward pass has finished its gradients
    /// (the default). Off, every reduction starts after the backward pass: the same results,
    /// with nothing hidden behind compute (to measure what the overlap saves).
    pub overlap: bool,
}

impl Default for DpOptions {
    fn default() -> Self {
        Self {
            zero: false,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            overlap: true,
        }
    }
}

/// The per-rank batch: `global / world`, an error when it does not divide evenly.
pub fn local_batch(global: usize, world: usize) -> Result<usize> {
    if world == 0 || global == 0 || !global.is_multiple_of(world) {
        return Err(EngineError::Config(format!(
            "the global batch ({global}) must split evenly over {world} rank(s): use a --batch that is a multiple of {world}"
        )));
    }
    Ok(global / world)
}

/// Parameter indices grouped in the order the backward pass finishes their gradients: the
/// final LayerNorm, each block from the last to the first, then the embeddings (the tied token
/// embedding also takes the LM head's gradient, so it is final only at the very end).
pub fn ready_groups(layers: usize, nparams: usize) -> Vec<Vec<usize>> {
    let mut groups = vec![vec![nparams - 2, nparams - 1]];
    for l in (0..layers).rev() {
        groups.push(BlockParam::ALL.iter().map(|&p| param_index(l, p)).collect());
    }
    groups.push(vec![0, 1]);
    groups
}

/// One parameter's place in a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub param: usize,
    /// Element offset in the bucket's flat buffer.
    pub offset: usize,
    pub len: usize,
}

/// A flat group of gradients reduced together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Working dtype of every parameter in the bucket.
    pub dtype: DType,
    pub entries: Vec<Entry>,
    /// Flat length, padded to a multiple of the world size (the padding stays zero).
    pub len: usize,
    /// Index of the ready group after which the bucket is complete.
    pub ready_after: usize,
}

impl Bucket {
    /// Elements each rank owns under ZeRO.
    pub fn shard_len(&self, world: usize) -> usize {
        self.len / world
    }
}

/// Splits parameters into buckets of about `cap_bytes` of f32 gradients, following the ready
/// groups, one open bucket per working dtype.
pub fn plan_buckets(
    groups: &[Vec<usize>],
    numels: &[usize],
    dtypes: &[DType],
    cap_bytes: usize,
    world: usize,
) -> Vec<Bucket> {
    let cap = (cap_bytes / 4).max(1);
    let mut done: Vec<Bucket> = Vec::new();
    let mut open: Vec<Bucket> = Vec::new();
    let close = |b: Bucket, done: &mut Vec<Bucket>| {
        let mut b = b;
        b.len = b.len.div_ceil(world) * world;
        done.push(b);
    };
    for (g, group) in groups.iter().enumerate() {
        for &p in group {
            let dtype = dtypes[p];
            let idx = match open.iter().position(|b| b.dtype == dtype) {
                Some(i) => i,
                None => {
                    open.push(Bucket {
                        dtype,
                        entries: Vec::new(),
                        len: 0,
                        ready_after: g,
                    });
                    open.len() - 1
                }
            };
            let b = &mut open[idx];
            b.entries.push(Entry {
                param: p,
                offset: b.len,
                len: numels[p],
            });
            b.len += numels[p];
            b.ready_after = g;
        }
        let (full, keep): (Vec<Bucket>, Vec<Bucket>) = open.into_iter().partition(|b| b.len >= cap);
        open = keep;
        for b in full {
            close(b, &mut done);
        }
    }
    for b in open {
        close(b, &mut done);
    }
    done.sort_by_key(|b| b.ready_after);
    done
}

/// Bucketed gradient reduction for one rank.
pub struct GradSync<D: Device> {
    comm: Arc<dyn Collective<D>>,
    buckets: Vec<Bucket>,
    /// Per bucket: the flat f32 gradients (all-reduced in place, or reduce-scattered).
    flats: Vec<D::Buffer>,
    /// ZeRO: per bucket, this rank's reduced shard.
    shards: Option<Vec<D::Buffer>>,
    launched: Vec<bool>,
}

impl<D: Device> GradSync<D> {
    pub fn new(
        dev: &D,
        comm: Arc<dyn Collective<D>>,
        buckets: Vec<Bucket>,
        zero: bool,
    ) -> Result<Self> {
        let world = comm.world_size();
        let flats = buckets
            .iter()
            .map(|b| dev.alloc(DType::F32, b.len))
            .collect::<duet_device::Result<Vec<_>>>()?;
        let shards = if zero {
            Some(
                buckets
                    .iter()
                    .map(|b| dev.alloc(DType::F32, b.shard_len(world)))
                    .collect::<duet_device::Result<Vec<_>>>()?,
            )
        } else {
            None
        };
        Ok(Self {
            launched: vec![false; buckets.len()],
            comm,
            buckets,
            flats,
            shards,
        })
    }

    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    pub fn comm(&self) -> &Arc<dyn Collective<D>> {
        &self.comm
    }

    /// Ready group `g` is final in `grads`: launches the reduction of every bucket it completes
    /// (the copies and the collective are enqueued; nothing waits).
    pub fn group_ready(&mut self, dev: &D, g: usize, grads: &[D::Buffer]) -> Result<()> {
        for i in 0..self.buckets.len() {
            if self.buckets[i].ready_after == g && !self.launched[i] {
                self.launch(dev, i, grads)?;
            }
        }
        Ok(())
    }

    fn launch(&mut self, dev: &D, i: usize, grads: &[D::Buffer]) -> Result<()> {
        let b = &self.buckets[i];
        for e in &b.entries {
            dev.copy(&grads[e.param], 0, &mut self.flats[i], e.offset, e.len)?;
        }
        match &mut self.shards {
            None => self.comm.all_reduce(&mut self.flats[i], ReduceOp::Sum)?,
            Some(sh) => self
                .comm
                .reduce_scatter(&self.flats[i], &mut sh[i], ReduceOp::Sum)?,
        }
        self.launched[i] = true;
        Ok(())
    }

    /// Launches what is left, waits for every reduction and, without ZeRO, copies the summed
    /// gradients back into `grads`.
    pub fn finish(&mut self, dev: &D, grads: &mut [D::Buffer]) -> Result<()> {
        for i in 0..self.buckets.len() {
            if !self.launched[i] {
                self.launch(dev, i, grads)?;
            }
        }
        self.comm.wait()?;
        self.launched.iter_mut().for_each(|l| *l = false);
        if self.shards.is_none() {
            for (b, flat) in self.buckets.iter().zip(&self.flats) {
                for e in &b.entries {
                    dev.copy(flat, e.offset, &mut grads[e.param], 0, e.len)?;
                }
            }
        }
        Ok(())
    }

    /// ZeRO: this rank's reduced gradient shards (valid after [`GradSync::finish`]).
    pub(crate) fn shards(&self) -> Option<&[D::Buffer]> {
        self.shards.as_deref()
    }

    /// The flat buffer of bucket `i` (free between steps: ZeRO gathers f32 weights into it).
    pub(crate) fn flat_mut(&mut self, i: usize) -> &mut D::Buffer {
        &mut self.flats[i]
    }
}

/// Everything a data-parallel rank adds to a trainer.
pub struct Dist<D: Device> {
    pub(crate) sync: GradSync<D>,
    pub(crate) overlap: bool,
    pub(crate) zero: Option<zero::ShardedAdamW<D>>,
    /// Two f32 scalars for reductions of host values (loss sums).
    scalars: D::Buffer,
}

impl<D: Device> Dist<D> {
    pub(crate) fn new(
        dev: &D,
        comm: Arc<dyn Collective<D>>,
        buckets: Vec<Bucket>,
        zero: Option<zero::ShardedAdamW<D>>,
        overlap: bool,
    ) -> Result<Self> {
        let sync = GradSync::new(dev, comm, buckets, zero.is_some())?;
        Ok(Self {
            sync,
            overlap,
            zero,
            scalars: dev.alloc(DType::F32, 2)?,
        })
    }

    pub fn comm(&self) -> &Arc<dyn Collective<D>> {
        self.sync.comm()
    }

    pub fn rank(&self) -> usize {
        self.comm().rank()
    }

    pub fn world_size(&self) -> usize {
        self.comm().world_size()
    }

    pub fn zero(&self) -> bool {
        self.zero.is_some()
    }

    /// Whether buckets are reduced during the backward pass.
    pub fn overlaps(&self) -> bool {
        self.overlap
    }

    /// ZeRO: bytes of optimizer state (FP32 masters and moments) this rank holds.
    pub fn sharded_state_bytes(&self) -> Option<u64> {
        self.zero.as_ref().map(|z| z.state_bytes())
    }

    /// The gradient buckets, in launch order.
    pub fn buckets(&self) -> &[Bucket] {
        self.sync.buckets()
    }

    /// Sums two host values over the ranks (one tiny all-reduce; waits for it).
    pub(crate) fn sum2(&mut self, dev: &D, a: f32, b: f32) -> Result<(f32, f32)> {
        dev.upload(&[a, b], &mut self.scalars, 0)?;
        let comm = self.sync.comm().clone();
        comm.all_reduce(&mut self.scalars, ReduceOp::Sum)?;
        comm.wait()?;
        let v: Vec<f32> = dev.download(&self.scalars)?;
        Ok((v[0], v[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_batch_splits_evenly_or_says_why() {
        assert_eq!(local_batch(16, 2).unwrap(), 8);
        assert_eq!(local_batch(16, 1).unwrap(), 16);
        let e = local_batch(10, 4).unwrap_err().to_string();
        assert!(e.contains("multiple of 4"), "{e}");
    }

    #[test]
    fn buckets_follow_the_backward_order_and_split_by_dtype() {
        let layers = 2;
        let np = 2 + 12 * layers + 2;
        let groups = ready_groups(layers, np);
        assert_eq!(groups.first().unwrap(), &vec![np - 2, np - 1]);
        assert_eq!(groups.last().unwrap(), &vec![0, 1]);
        assert_eq!(groups[1][0], param_index(1, BlockParam::Ln1W));
        let numels: Vec<usize> = (0..np).map(|i| 10 + i).collect();
        let dtypes: Vec<DType> = (0..np)
            .map(|i| if i % 3 == 0 { DType::BF16 } else { DType::F32 })
            .collect();
        let buckets = plan_buckets(&groups, &numels, &dtypes, 200, 4);
        let mut seen = vec![0; np];
        for b in &buckets {
            assert_eq!(b.len % 4, 0);
            let mut off = 0;
            for e in &b.entries {
                assert_eq!(dtypes[e.param], b.dtype);
                assert_eq!(e.offset, off);
                off += e.len;
                seen[e.param] += 1;
            }
            assert!(b.len >= off && b.len < off + 4);
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        assert!(buckets.len() > 2);
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].ready_after <= w[1].ready_after)
        );
        // The first bucket completes before the last group: it can travel during backward.
        assert!(buckets[0].ready_after < groups.len() - 1);
    }
}
