//! The HIP backend's error type, and its one mapping into [`DeviceError`].
//!
//! Each vendor library's `result` layer turns a non-success status into a [`HipError`] naming
//! the call; [`From<HipError> for DeviceError`] is the only place that decides which
//! `DeviceError` variant the engine sees.

use duet_device::DeviceError;
use std::fmt;

#[derive(Debug, Clone)]
pub enum HipError {
    /// A HIP runtime call returned a `hipError_t` other than `hipSuccess`.
    Runtime {
        call: &'static str,
        code: u32,
        /// `hipGetErrorName` / `hipGetErrorString` of the code.
        message: String,
    },
    /// A hiprtc call failed (compile errors are reported with their log separately).
    Rtc {
        call: &'static str,
        code: u32,
        message: String,
    },
    /// A rocBLAS call returned a `rocblas_status` other than success.
    Rocblas { call: &'static str, status: u32 },
    /// A hipBLASLt call returned a `hipblasStatus_t` other than success.
    Lt { call: &'static str, status: u32 },
    /// A library was found but lacks symbols the backend needs.
    MissingSymbols {
        library: String,
        missing: Vec<String>,
    },
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HipError::Runtime {
                call,
                code,
                message,
            } => write!(f, "{call} failed with hipError_t {code} ({message})"),
            HipError::Rtc {
                call,
                code,
                message,
            } => write!(f, "{call} failed with hiprtcResult {code} ({message})"),
            HipError::Rocblas { call, status } => {
                write!(
                    f,
                    "{call} failed with rocblas_status {status} ({})",
                    rocblas_status_name(*status)
                )
            }
            HipError::Lt { call, status } => {
                write!(
                    f,
                    "{call} failed with hipblasStatus_t {status} ({})",
                    hipblas_status_name(*status)
                )
            }
            HipError::MissingSymbols { library, missing } => write!(
                f,
                "{library} lacks {} required symbol(s): {}",
                missing.len(),
                missing.join(", ")
            ),
        }
    }
}

impl std::error::Error for HipError {}

/// rocBLAS status names (rocBLAS `rocblas-types.h`).
pub fn rocblas_status_name(s: u32) -> &'static str {
    match s {
        0 => "success",
        1 => "invalid_handle",
        2 => "not_implemented",
        3 => "invalid_pointer",
        4 => "invalid_size",
        5 => "memory_error",
        6 => "internal_error",
        7 => "perf_degraded",
        8 => "size_query_mismatch",
        9 => "size_increased",
        10 => "size_unchanged",
        11 => "invalid_value",
        12 => "continue",
        13 => "check_numerics_fail",
        _ => "unknown",
    }
}

/// hipBLAS status names (hipBLAS-common `hipblas-common.h`).
pub fn hipblas_status_name(s: u32) -> &'static str {
    match s {
        0 => "HIPBLAS_STATUS_SUCCESS",
        1 => "HIPBLAS_STATUS_NOT_INITIALIZED",
        2 => "HIPBLAS_STATUS_ALLOC_FAILED",
        3 => "HIPBLAS_STATUS_INVALID_VALUE",
        4 => "HIPBLAS_STATUS_MAPPING_ERROR",
        5 => "HIPBLAS_STATUS_EXECUTION_FAILED",
        6 => "HIPBLAS_STATUS_INTERNAL_ERROR",
        7 => "HIPBLAS_STATUS_NOT_SUPPORTED",
        8 => "HIPBLAS_STATUS_ARCH_MISMATCH",
        9 => "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        10 => "HIPBLAS_STATUS_INVALID_ENUM",
        11 => "HIPBLAS_STATUS_UNKNOWN",
        _ => "unknown",
    }
}

impl From<HipError> for DeviceError {
    fn from(e: HipError) -> Self {
        match e {
            HipError::MissingSymbols { .. } => DeviceError::Unavailable {
                backend: "hip",
                reason: e.to_string(),
                tried: Vec::new(),
            },
            HipError::Runtime { call, .. }
            | HipError::Rtc { call, .. }
            | HipError::Rocblas { call, .. }
            | HipError::Lt { call, .. } => DeviceError::Driver {
                backend: "hip",
                call: call.to_string(),
                message: e.to_string(),
            },
        }
    }
}

/// `Unavailable` for the hip backend.
pub fn unavailable(reason: impl Into<String>, tried: Vec<String>) -> DeviceError {
    DeviceError::Unavailable {
        backend: "hip",
        reason: reason.into(),
        tried,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_symbols_map_to_unavailable_naming_them() {
        let e: DeviceError = HipError::MissingSymbols {
            library: "libamdhip64.so.6".into(),
            missing: vec!["hipModuleLaunchKernel".into()],
        }
        .into();
        let msg = e.to_string();
        assert!(matches!(e, DeviceError::Unavailable { backend: "hip", .. }));
        assert!(
            msg.contains("hipModuleLaunchKernel") && msg.contains("libamdhip64.so.6"),
            "{msg}"
        );
    }

    #[test]
    fn runtime_errors_map_to_driver_errors() {
        let e: DeviceError = HipError::Rocblas {
            call: "rocblas_gemm_ex",
            status: 4,
        }
        .into();
        assert!(e.to_string().contains("invalid_size"), "{e}");
    }
}
