//! Run-time backend selection: `--backend` / `DUET_BACKEND` = cpu | cuda | hip | auto.

use crate::CliResult;
use duet_device::Runtime;
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
    quiet_cudarc_panics(|| duet_cuda::CudaDevice::new(0))
}

/// Runs `probe` with the panic hook silent for panics raised inside cudarc. cudarc panics when a
/// library it loads lacks a symbol (a broken or foreign libcuda.so.1 on the library path);
/// duet_cuda catches that panic and returns [`DeviceError::Unavailable`] naming it, but the hook
/// runs first and would print "thread 'main' panicked at ..." (and a backtrace) above duet's own
/// message. Any other panic is reported by the previous hook as usual, and that hook is back in
/// place when `probe` returns.
#[cfg(feature = "cuda")]
pub(crate) fn quiet_cudarc_panics<T>(probe: impl FnOnce() -> T) -> T {
    type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync + 'static>;
    struct Restore(Option<Arc<Hook>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            // The hook cannot be changed while unwinding (take_hook and set_hook panic then,
            // which aborts); ours stays, and it still passes every other panic on.
            if std::thread::panicking() {
                return;
            }
            // Taking our hook drops its handle on the previous one, which is then unshared.
            drop(std::panic::take_hook());
            if let Some(previous) = self.0.take() {
                match Arc::try_unwrap(previous) {
                    Ok(hook) => std::panic::set_hook(hook),
                    Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
                }
            }
        }
    }
    let previous: Arc<Hook> = Arc::new(std::panic::take_hook());
    let chained = previous.clone();
    std::panic::set_hook(Box::new(move |info| {
        let in_cudarc = info.location().is_some_and(|l| l.file().contains("cudarc"));
        if !in_cudarc {
            chained(info);
        }
    }));
    let _restore = Restore(Some(previous));
    probe()
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
        // The first backend that opens, in the order cuda, hip, cpu; the choice and why the
        // ones before it did not open are printed (stderr), so a run that fell back to the CPU
        // says so.
        BackendKind::Auto => {
            let cuda = match open_cuda() {
                Ok(d) => {
                    eprintln!("backend auto: cuda ({})", d.info().name);
                    return task.run(Arc::new(d));
                }
                Err(e) => e,
            };
            let hip = match open_hip() {
                Ok(d) => {
                    eprintln!(
                        "backend auto: hip ({}); cuda not available: {cuda}",
                        d.info().name
                    );
                    return task.run(Arc::new(d));
                }
                Err(e) => e,
            };
            eprintln!(
                "backend auto: cpu (the reference backend); cuda not available: {cuda}; hip not \
                 available: {hip}"
            );
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
    let hip = open_hip().map(|d| d.info());
    let hip_failed = hip.is_err();
    report("hip", hip);
    if hip_failed {
        print_hip_libraries();
    }
    Ok(())
}

/// What ROCm libraries were found when the hip backend did not open (their versions need no
/// GPU), so `duet info` still says which runtime, hiprtc, comgr, rocBLAS and hipBLASLt a
/// ROCm machine has.
#[cfg(feature = "hip")]
fn print_hip_libraries() {
    for (name, what) in duet_hip::libraries() {
        println!("    {name}: {what}");
    }
}

#[cfg(not(feature = "hip"))]
fn print_hip_libraries() {}

#[cfg(test)]
mod info_tests {
    /// `duet info`'s library lines never panic without ROCm and name every library.
    #[cfg(feature = "hip")]
    #[test]
    fn hip_library_lines_name_every_library() {
        let names: Vec<String> = duet_hip::libraries().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            ["runtime", "hiprtc", "comgr", "rocblas", "hipblaslt"]
        );
    }
}
