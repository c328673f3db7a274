//! Run-time backend selection: `--backend` / `DUET_BACKEND` = cpu | cuda | hip | auto.

use crate::CliResult;
use duet_device::{BackendKind, Device, DeviceError, DeviceInfo, human_bytes};
use std::sync::Arc;

/// Work that runs on whichever backend was chosen (a generic closure, monomorphised per backend).
pub trait OnDevice {
    type Output;
    fn run<D: Device>(self, dev: Arc<D>) -> CliResult<Self::Output>;
}

pub fn open_cpu(threads: Option<usize>) -> Result<duet_cpu::CpuDevice, DeviceError> {
    duet_cpu::CpuDevice::new(threads)
}

#[cfg(feature = "cuda")]
fn open_cuda() -> Result<duet_cuda::CudaDevice, DeviceError> {
    duet_cuda::CudaDevice::new(0)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<NeverDevice, DeviceError> {
    Err(DeviceError::NotCompiled("cuda"))
}

#[cfg(feature = "hip")]
fn open_hip() -> Result<duet_hip::HipDevice, DeviceError> {
    duet_hip::HipDevice::new(0)
}

#[cfg(not(feature = "hip"))]
fn open_hip() -> Result<NeverDevice, DeviceError> {
    Err(DeviceError::NotCompiled("hip"))
}

/// Stands in for a backend that was not compiled in (never constructed).
#[cfg(any(not(feature = "cuda"), not(feature = "hip")))]
type NeverDevice = duet_cpu::CpuDevice;

/// Opens the backend `kind` and runs `task` on it.
pub fn dispatch<T: OnDevice>(
    kind: BackendKind,
    threads: Option<usize>,
    task: T,
) -> CliResult<T::Output> {
    match kind {
        BackendKind::Cpu => task.run(Arc::new(open_cpu(threads)?)),
        BackendKind::Cuda => task.run(Arc::new(open_cuda()?)),
        BackendKind::Hip => task.run(Arc::new(open_hip()?)),
        BackendKind::Auto => {
            if let Ok(d) = open_cuda() {
                return task.run(Arc::new(d));
            }
            if let Ok(d) = open_hip() {
                return task.run(Arc::new(d));
            }
            task.run(Arc::new(open_cpu(threads)?))
        }
    }
}

fn print_info(info: &DeviceInfo) {
    println!("    device:  {}", info.name);
    println!("    arch:    {}", info.arch);
    println!("    memory:  {}", human_bytes(info.total_memory));
    println!(
        "    bf16:    {}\n    fp8:     {}",
        if info.supports_bf16 { "yes" } else { "no" },
        if info.supports_fp8 { "yes" } else { "no" }
    );
    for (k, v) in &info.details {
        println!("    {k}: {v}");
    }
}

/// `duet info`.
pub fn info() -> CliResult<()> {
    let compiled: Vec<&str> = ["cpu"]
        .into_iter()
        .chain(cfg!(feature = "cuda").then_some("cuda"))
        .chain(cfg!(feature = "hip").then_some("hip"))
        .collect();
    println!(
        "duet {} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("DUET_GIT_REV")
    );
    println!("compiled-in backends: {}", compiled.join(", "));
    let report = |name: &str, r: Result<DeviceInfo, DeviceError>| match r {
        Ok(info) => {
            println!("{name}: available");
            print_info(&info);
        }
        Err(e) => println!("{name}: not available: {e}"),
    };
    report("cpu", open_cpu(None).map(|d| d.info()));
    report("cuda", open_cuda().map(|d| d.info()));
    report("hip", open_hip().map(|d| d.info()));
    Ok(())
}
