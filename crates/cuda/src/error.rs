//! Maps cudarc's driver, cuBLAS and NVRTC errors onto [`DeviceError`], in one place.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use cudarc::driver::sys::CUresult;
use duet_device::DeviceError;

pub(crate) const BACKEND: &str = "cuda";

/// A driver call failed. Out-of-memory is reported as [`DeviceError::OutOfMemory`] by the
/// allocation paths themselves (they know the requested size); here it is a driver error.
pub(crate) fn driver(call: impl Into<String>, err: DriverError) -> DeviceError {
    let name = err
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", err.0));
    let text = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    DeviceError::Driver {
        backend: BACKEND,
        call: call.into(),
        message: if text.is_empty() {
            name
        } else {
            format!("{name}: {text}")
        },
    }
}

/// Shorthand for `.map_err(drv("cuMemAlloc"))`.
pub(crate) fn drv(call: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| driver(call, e)
}

pub(crate) fn is_out_of_memory(err: &DriverError) -> bool {
    err.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

pub(crate) fn cublas(call: impl Into<String>, err: CublasError) -> DeviceError {
    DeviceError::Driver {
        backend: BACKEND,
        call: call.into(),
        message: format!("{:?}", err.0),
    }
}

pub(crate) fn nvrtc(
    call: impl Into<String>,
    err: cudarc::nvrtc::result::NvrtcError,
) -> DeviceError {
    DeviceError::Driver {
        backend: BACKEND,
        call: call.into(),
        message: format!("{:?}", err.0),
    }
}

/// Turns a panic payload (cudarc panics when a library or symbol cannot be loaded) into text.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}
