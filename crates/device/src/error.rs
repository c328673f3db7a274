use crate::DType;

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

/// Errors a backend reports. Each backend maps its raw status codes into these in one place.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The backend could not be loaded on this machine.
    #[error("{backend} backend unavailable: {reason}{}", tried_list(.tried))]
    Unavailable {
        backend: &'static str,
        reason: String,
        /// Libraries, paths or devices that were tried.
        tried: Vec<String>,
    },
    /// The backend was not compiled into this binary.
    #[error("{0} backend was not compiled into this binary (rebuild with `--features {0}`)")]
    NotCompiled(&'static str),
    #[error(
        "out of device memory: requested {} but only {} free",
        human_bytes(*.requested),
        human_bytes(*.free)
    )]
    OutOfMemory { requested: u64, free: u64 },
    #[error("{op} does not support dtype {dtype}")]
    Unsupported { op: String, dtype: DType },
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A driver, runtime or library call failed.
    #[error("{backend} driver error in {call}: {message}")]
    Driver {
        backend: &'static str,
        call: String,
        message: String,
    },
    /// A kernel failed to compile (message holds the options and the compiler log).
    #[error("{backend} kernel compilation failed for {module}: {log}")]
    Compile {
        backend: &'static str,
        module: String,
        log: String,
    },
}

fn tried_list(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" (tried: {})", tried.join(", "))
    }
}

/// Formats a byte count as MiB/GiB for messages.
pub fn human_bytes(b: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = b as f64 / MIB;
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}
