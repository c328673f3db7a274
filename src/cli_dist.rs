//! Data-parallel launches: `duet train --gpus N` starts one process per GPU, each running the
//! same command line as one rank; a process that finds `RANK`/`WORLD_SIZE` in its environment
//! (set by `--gpus`, torchrun, Slurm scripts, ...) joins the group, rank 0 handing out the
//! collective library's unique id over TCP (`MASTER_ADDR:MASTER_PORT`).

use crate::CliResult;
use duet_device::{BackendKind, Collective, Device};
use duet_engine::dist::rendezvous::{LaunchEnv, tag_of};
use std::process::{Child, Command};
use std::time::Duration;

/// NVLink multicast (NVLS) stays off unless the user set it: on shared machines it can take
/// GPUs out of service.
const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";

const CPU_REFUSED: &str = "data parallelism (--gpus, RANK/WORLD_SIZE) needs a GPU backend: --backend cuda or hip \
     (the CPU backend's collective is in-process, for tests)";

/// The work each rank of a data-parallel run does (`duet train`'s task): [`run_rank`] opens
/// the rank's GPU and joins the group, then hands both over.
pub trait RankTask {
    type Output;

    /// What every rank of a run must agree on (the rendezvous refuses ranks that differ).
    fn fingerprint(&self) -> String;

    /// Runs on `dev` as one rank of the group that `comm` connects (called for the GPU
    /// backends only: unused in a build without them).
    #[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
    fn run_in_group<D: Device>(
        self,
        dev: std::sync::Arc<D>,
        comm: std::sync::Arc<dyn Collective<D>>,
    ) -> CliResult<Self::Output>;
}

/// Starts `n` ranks of this command line (with `extra_args` after it) on this machine and
/// waits for them: `Ok(true)` when a rank stopped on Ctrl-C (exit status 130; it saved a
/// checkpoint), `Ok(false)` when every rank finished.
pub fn spawn_ranks(
    n: usize,
    global_batch: usize,
    kind: BackendKind,
    extra_args: &[std::ffi::OsString],
) -> CliResult<bool> {
    if kind == BackendKind::Cpu {
        return Err(CPU_REFUSED.into());
    }
    if !global_batch.is_multiple_of(n) {
        return Err(format!(
            "--batch {global_batch} is the global batch and must split evenly over {n} GPUs: use a multiple of {n}"
        )
        .into());
    }
    let addr = std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into());
    let port = match std::env::var("MASTER_PORT") {
        Ok(p) => p,
        Err(_) => {
            // A free port on loopback (released for rank 0 to bind again).
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port().to_string()
        }
    };
    let exe = std::env::current_exe()?;
    let args: Vec<_> = std::env::args_os()
        .skip(1)
        .chain(extra_args.iter().cloned())
        .collect();
    let mut children: Vec<Child> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&args)
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("MASTER_ADDR", &addr)
            .env("MASTER_PORT", &port);
        if std::env::var_os(NVLS_ENV).is_none() {
            cmd.env(NVLS_ENV, "0");
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                return Err(format!("cannot start rank {r}: {e}").into());
            }
        }
    }
    // Wait for every rank; the first failure stops the others (they would wait for it).
    let mut codes: Vec<Option<i32>> = vec![None; n];
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if codes[r].is_some() {
                continue;
            }
            if let Some(st) = c.try_wait()? {
                let code = st.code().unwrap_or(-1);
                codes[r] = Some(code);
                if code != 0 && code != 130 {
                    stop(&mut children);
                    return Err(format!("rank {r} of {n} failed (exit status {code})").into());
                }
            }
        }
        if codes.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(codes.contains(&Some(130)))
}

/// Kills the ranks still running (the processes this launcher started) and reaps them.
fn stop(children: &mut [Child]) {
    for c in children.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// Runs this process as rank `env.rank`: opens GPU `LOCAL_RANK`, joins the NCCL/RCCL group
/// and trains.
pub fn run_rank<T: RankTask>(kind: BackendKind, env: &LaunchEnv, task: T) -> CliResult<T::Output> {
    let tag = tag_of(task.fingerprint().as_bytes());
    let r = match kind {
        BackendKind::Cpu => Err(CPU_REFUSED.into()),
        BackendKind::Cuda => run_cuda(env, tag, task),
        BackendKind::Hip => run_hip(env, tag, task),
        BackendKind::Auto => {
            if cuda_present() {
                run_cuda(env, tag, task)
            } else {
                run_hip(env, tag, task)
            }
        }
    };
    // Say which rank failed (every rank prints its own errors).
    r.map_err(|e| format!("rank {} of {}: {e}", env.rank, env.world_size).into())
}

#[cfg(feature = "cuda")]
fn cuda_present() -> bool {
    crate::backends::quiet_cudarc_panics(duet_cuda::CudaDevice::device_count).is_ok_and(|n| n > 0)
}

#[cfg(not(feature = "cuda"))]
fn cuda_present() -> bool {
    false
}

#[cfg(feature = "cuda")]
fn run_cuda<T: RankTask>(env: &LaunchEnv, tag: u64, task: T) -> CliResult<T::Output> {
    use std::sync::Arc;
    let dev = Arc::new(crate::backends::quiet_cudarc_panics(|| {
        duet_cuda::CudaDevice::new(env.local_rank)
    })?);
    let id = env.share(tag, || Ok(duet_cuda::NcclComm::unique_id()?))?;
    let comm = duet_cuda::NcclComm::new(dev.clone(), env.rank, env.world_size, &id)?;
    task.run_in_group(dev, Arc::new(comm))
}

#[cfg(not(feature = "cuda"))]
fn run_cuda<T: RankTask>(_: &LaunchEnv, _: u64, _: T) -> CliResult<T::Output> {
    Err(duet_device::DeviceError::NotCompiled("cuda").into())
}

#[cfg(feature = "hip")]
fn run_hip<T: RankTask>(env: &LaunchEnv, tag: u64, task: T) -> CliResult<T::Output> {
    use std::sync::Arc;
    let dev = Arc::new(duet_hip::HipDevice::new(env.local_rank)?);
    let id = env.share(tag, || Ok(duet_hip::RcclComm::unique_id()?))?;
    let comm = duet_hip::RcclComm::new(dev.clone(), env.rank, env.world_size, &id)?;
    task.run_in_group(dev, Arc::new(comm))
}

#[cfg(not(feature = "hip"))]
fn run_hip<T: RankTask>(_: &LaunchEnv, _: u64, _: T) -> CliResult<T::Output> {
    Err(duet_device::DeviceError::NotCompiled("hip").into())
}
