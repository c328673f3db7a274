//! An in-process collective for the CPU backend: the ranks of a [`CpuGroup`] are threads of one
//! process, each with its own [`CpuDevice`], meeting at a shared rendezvous. It exists so the
//! data-parallel logic (bucketed all-reduce, ZeRO-1 sharding) can be tested without GPUs.
//!
//! Every collective is synchronous (the CPU backend has no streams): each rank deposits its
//! buffer, waits for the others, and computes the result itself from all deposits, combining
//! the ranks in rank order, so every rank gets bit-identical results and a run is deterministic.
//! Reductions compute in f32 (f16/bf16 are widened and rounded once); all-gather copies bytes
//! and takes any dtype. A rank whose communicator is dropped early (a failed thread) makes the
//! others' pending and later collectives fail instead of waiting forever.

use crate::{CpuBuffer, CpuDevice};
use duet_device::{
    Buffer, Collective, DType, DeviceError, ReduceOp, Result, Runtime, check_collective_lens,
};
use half::{bf16, f16};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

struct State {
    /// Completed barrier phases.
    generation: u64,
    arrived: usize,
    /// Each rank's deposit for the collective in progress.
    slots: Vec<Vec<u8>>,
    /// A rank left the group.
    broken: bool,
}

struct Shared {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
}

/// Creates the communicators of an in-process group.
pub struct CpuGroup;

impl CpuGroup {
    /// One communicator per device; rank `i` uses `devices[i]`. Hand each to its own thread.
    pub fn communicators(devices: Vec<Arc<CpuDevice>>) -> Result<Vec<CpuComm>> {
        if devices.is_empty() {
            return Err(DeviceError::InvalidArgument(
                "a collective group needs at least one rank".into(),
            ));
        }
        let world = devices.len();
        let shared = Arc::new(Shared {
            world,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                slots: vec![Vec::new(); world],
                broken: false,
            }),
            cv: Condvar::new(),
        });
        Ok(devices
            .into_iter()
            .enumerate()
            .map(|(rank, dev)| CpuComm {
                rank,
                dev,
                shared: shared.clone(),
            })
            .collect())
    }
}

/// One rank of a [`CpuGroup`].
pub struct CpuComm {
    rank: usize,
    dev: Arc<CpuDevice>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CpuComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuComm")
            .field("rank", &self.rank)
            .field("world", &self.shared.world)
            .finish()
    }
}

fn broken() -> DeviceError {
    DeviceError::Driver {
        backend: "cpu",
        call: "collective".into(),
        message: "another rank of the in-process group left (its thread failed or finished early)"
            .into(),
    }
}

impl CpuComm {
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.shared.state.lock().map_err(|_| broken())
    }

    /// Waits until every rank has arrived at this phase.
    fn barrier<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        let gen_now = st.generation;
        st.arrived += 1;
        if st.arrived == self.shared.world {
            st.arrived = 0;
            st.generation += 1;
            self.shared.cv.notify_all();
            return Ok(st);
        }
        loop {
            if st.generation != gen_now {
                return Ok(st);
            }
            if st.broken {
                return Err(broken());
            }
            st = self.shared.cv.wait(st).map_err(|_| broken())?;
        }
    }

    /// Deposits `mine`, waits for every rank, runs `f` on all deposits (rank order), and waits
    /// again so no deposit is overwritten before everyone has read it.
    fn exchange<T>(&self, mine: Vec<u8>, f: impl FnOnce(&[Vec<u8>]) -> Result<T>) -> Result<T> {
        let mut st = self.lock()?;
        if st.broken {
            return Err(broken());
        }
        st.slots[self.rank] = mine;
        let st = self.barrier(st)?;
        let out = f(&st.slots);
        let mut st = self.barrier(st)?;
        st.slots[self.rank] = Vec::new();
        drop(st);
        out
    }

    fn bytes(&self, buf: &CpuBuffer) -> Result<Vec<u8>> {
        self.dev.download_bytes(buf, 0, buf.len())
    }
}

impl Drop for CpuComm {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.broken = true;
        }
        self.shared.cv.notify_all();
    }
}

/// Element-wise reduction of `parts` (raw bytes of `dtype`, equal lengths) restricted to the
/// elements `range`, in rank order; returns the result's bytes.
fn reduce(
    dtype: DType,
    parts: &[Vec<u8>],
    range: std::ops::Range<usize>,
    op: ReduceOp,
    world: usize,
) -> Result<Vec<u8>> {
    let unsupported = || DeviceError::Unsupported {
        op: "cpu collective reduction".into(),
        dtype,
    };
    let es = dtype.size_bytes();
    let to_f32 = |p: &Vec<u8>| -> Result<Vec<f32>> {
        let b = &p[range.start * es..range.end * es];
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => dtype.bytes_to_f32(b),
            DType::I32 => Ok(b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect()),
            _ => Err(unsupported()),
        }
    };
    let mut acc = to_f32(&parts[0])?;
    for p in &parts[1..] {
        let x = to_f32(p)?;
        match op {
            ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(&x).for_each(|(a, b)| *a += b),
            // NaN wins, as in a max that must not hide a non-finite value.
            ReduceOp::Max => acc.iter_mut().zip(&x).for_each(|(a, &b)| {
                if b.is_nan() || b > *a {
                    *a = b
                }
            }),
        }
    }
    if op == ReduceOp::Avg {
        let w = world as f32;
        acc.iter_mut().for_each(|a| *a /= w);
    }
    Ok(match dtype {
        DType::F32 => acc.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => acc
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => acc
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::I32 => acc.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect(),
        _ => return Err(unsupported()),
    })
}

impl Collective<CpuDevice> for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn describe(&self) -> String {
        format!("cpu in-process group of {}", self.shared.world)
    }

    fn all_reduce(&self, buf: &mut CpuBuffer, op: ReduceOp) -> Result<()> {
        let (dtype, n, world) = (buf.dtype(), buf.len(), self.shared.world);
        let mine = self.bytes(buf)?;
        let out = self.exchange(mine, |parts| reduce(dtype, parts, 0..n, op, world))?;
        self.dev.upload_bytes(&out, buf, 0)
    }

    fn reduce_scatter(&self, src: &CpuBuffer, dst: &mut CpuBuffer, op: ReduceOp) -> Result<()> {
        let world = self.shared.world;
        check_collective_lens("reduce_scatter", src.len(), dst.len(), world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "reduce_scatter",
                expected: src.dtype(),
                got: dst.dtype(),
            });
        }
        let (dtype, n) = (src.dtype(), dst.len());
        let range = self.rank * n..(self.rank + 1) * n;
        let mine = self.bytes(src)?;
        let out = self.exchange(mine, |parts| reduce(dtype, parts, range, op, world))?;
        self.dev.upload_bytes(&out, dst, 0)
    }

    fn all_gather(&self, src: &CpuBuffer, dst: &mut CpuBuffer) -> Result<()> {
        check_collective_lens("all_gather", dst.len(), src.len(), self.shared.world)?;
        if src.dtype() != dst.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: "all_gather",
                expected: dst.dtype(),
                got: src.dtype(),
            });
        }
        let mine = self.bytes(src)?;
        let out = self.exchange(mine, |parts| Ok(parts.concat()))?;
        self.dev.upload_bytes(&out, dst, 0)
    }

    fn wait(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duet_device::DeviceExt;

    /// Runs `f(rank, device, comm)` on `world` threads and returns the results in rank order.
    fn on_ranks<T: Send + 'static>(
        world: usize,
        f: impl Fn(usize, &CpuDevice, &CpuComm) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let devs: Vec<_> = (0..world)
            .map(|_| Arc::new(CpuDevice::new(Some(1)).unwrap()))
            .collect();
        let comms = CpuGroup::communicators(devs.clone()).unwrap();
        let f = Arc::new(f);
        let handles: Vec<_> = comms
            .into_iter()
            .zip(devs)
            .enumerate()
            .map(|(r, (c, d))| {
                let f = f.clone();
                std::thread::spawn(move || f(r, &d, &c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_reduce_sum_avg_max() {
        let out = on_ranks(3, |r, dev, c| {
            let x = [r as f32 + 1.0, -(r as f32), 0.5 * r as f32];
            let mut results = Vec::new();
            for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                let mut b = dev.upload_new(&x).unwrap();
                c.all_reduce(&mut b, op).unwrap();
                results.push(dev.download::<f32>(&b).unwrap());
            }
            results
        });
        for r in &out {
            assert_eq!(r[0], vec![6.0, -3.0, 1.5]);
            assert_eq!(r[1], vec![2.0, -1.0, 0.5]);
            assert_eq!(r[2], vec![3.0, 0.0, 1.0]);
        }
    }

    #[test]
    fn reduce_scatter_and_all_gather_bf16() {
        let out = on_ranks(2, |r, dev, c| {
            let src: Vec<f32> = (0..4).map(|i| (10 * r + i) as f32).collect();
            let src = dev.upload_new(&src).unwrap();
            let mut part = dev.alloc(DType::F32, 2).unwrap();
            c.reduce_scatter(&src, &mut part, ReduceOp::Sum).unwrap();
            let mine = dev.download::<f32>(&part).unwrap();
            let mut lp = dev.alloc(DType::BF16, 2).unwrap();
            dev.cast(&part, &mut lp, 1.0).unwrap();
            let mut all = dev.alloc(DType::BF16, 4).unwrap();
            c.all_gather(&lp, &mut all).unwrap();
            (mine, dev.download_f32(&all).unwrap())
        });
        assert_eq!(out[0].0, vec![10.0, 12.0]);
        assert_eq!(out[1].0, vec![14.0, 16.0]);
        for (_, all) in &out {
            assert_eq!(all, &vec![10.0, 12.0, 14.0, 16.0]);
        }
    }

    #[test]
    fn wrong_lengths_and_a_departed_rank_are_errors() {
        let devs: Vec<_> = (0..2)
            .map(|_| Arc::new(CpuDevice::new(Some(1)).unwrap()))
            .collect();
        let mut comms = CpuGroup::communicators(devs.clone()).unwrap();
        let c1 = comms.pop().unwrap();
        let c0 = comms.pop().unwrap();
        let src = devs[0].upload_new(&[1.0f32; 5]).unwrap();
        let mut dst = devs[0].alloc(DType::F32, 2).unwrap();
        assert!(c0.reduce_scatter(&src, &mut dst, ReduceOp::Sum).is_err());
        drop(c1);
        let mut b = devs[0].upload_new(&[1.0f32]).unwrap();
        assert!(c0.all_reduce(&mut b, ReduceOp::Sum).is_err());
    }
}
