//! Collective communication between the devices of a data-parallel group: the [`Collective`]
//! trait each backend's communicator implements (NCCL on CUDA, RCCL on HIP, an in-process
//! group of threads on the CPU).
//!
//! Ordering contract (the same on every backend):
//! - A collective sees every write to its buffers that was enqueued on the device before the
//!   call (it is ordered after the device's stream at the moment of the call).
//! - It may still be running when the call returns, concurrently with device work enqueued
//!   afterwards: GPU backends run collectives on a communication stream of their own, which is
//!   what lets gradient buckets travel while the backward pass continues.
//! - [`Collective::wait`] orders all device work enqueued after it behind every collective
//!   issued so far. Until then, the buffers of a pending collective must not be written, read
//!   for its results, or dropped.
//!
//! All ranks must issue the same collectives, with the same lengths and dtypes, in the same
//! order; a rank that does not take part blocks the others.

use crate::{Device, Result};

/// How a reduction combines the ranks' elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the number of ranks.
    Avg,
    Max,
}

/// One rank's handle on a group of devices that reduce and exchange buffers.
pub trait Collective<D: Device>: Send + Sync {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;

    fn world_size(&self) -> usize;

    /// What carries the collectives, e.g. "nccl 2.27.3" (for logs).
    fn describe(&self) -> String;

    /// In place: every rank's `buf` becomes the reduction over the ranks of their `buf`s.
    fn all_reduce(&self, buf: &mut D::Buffer, op: ReduceOp) -> Result<()>;

    /// `src` holds `world_size · n` elements; `dst` (`n`) receives block `rank` of the
    /// element-wise reduction over the ranks.
    fn reduce_scatter(&self, src: &D::Buffer, dst: &mut D::Buffer, op: ReduceOp) -> Result<()>;

    /// `src` holds `n` elements; `dst` (`world_size · n`) receives every rank's `src`, in rank
    /// order. Any dtype (the bytes are copied).
    fn all_gather(&self, src: &D::Buffer, dst: &mut D::Buffer) -> Result<()>;

    /// Orders device work enqueued from now on after every collective issued so far.
    fn wait(&self) -> Result<()>;
}

/// Checks the lengths of a reduce-scatter or all-gather: `full` must be `world · part`.
pub fn check_collective_lens(
    op: &'static str,
    full: usize,
    part: usize,
    world: usize,
) -> Result<()> {
    if part.checked_mul(world) == Some(full) {
        Ok(())
    } else {
        Err(crate::DeviceError::Shape {
            op,
            detail: format!(
                "the full buffer has {full} elements, expected world size {world} × {part}"
            ),
        })
    }
}
