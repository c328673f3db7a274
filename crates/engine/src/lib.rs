//! duet's engine: the GPT model, its explicit backward pass, AdamW, and the trainer — generic
//! over any [`duet_device::Device`].
#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod dataset;
pub mod dist;
pub mod export;
pub mod fp8;
pub mod generate;
pub mod init;
pub mod model;
pub mod optim;
pub mod precision;
pub mod rng;
pub mod run;
pub mod saves;
pub mod trace;
pub mod train;

pub use config::{Config, ModelConfig, Preset, TrainConfig};
pub use model::Gpt;
pub use precision::Precision;
pub use train::Trainer;

use duet_device::DeviceError;

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("data file {path}: {message}")]
    Data { path: String, message: String },
    /// A data file changed while the run read it (truncated: a read of its map faulted). The
    /// run stops at the step before the batch that could not be read, so that it can be saved
    /// and resumed once the file is restored.
    #[error("data file {path} {message}: restore it and resume from the last checkpoint")]
    DataChanged { path: String, message: String },
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: String, message: String },
    #[error(
        "the memory plan needs about {} but only {} is free on the device: {hint}",
        duet_device::human_bytes(*.needed),
        duet_device::human_bytes(*.free)
    )]
    OutOfMemory {
        needed: u64,
        free: u64,
        hint: String,
    },
    #[error("training diverged at step {step}: loss is {loss}")]
    Diverged { step: u64, loss: f32 },
    #[error(
        "{what} needs about {} of host memory, but this process may allocate only {} more \
         (bound by {bound})",
        duet_device::human_bytes(*.needed),
        duet_device::human_bytes(*.available)
    )]
    HostOutOfMemory {
        what: String,
        needed: u64,
        available: u64,
        bound: &'static str,
    },
}

/// Refuses a host allocation of `needed` bytes that this process cannot make — the machine's
/// free memory, its cgroup's memory limit and its address-space limit all count
/// ([`duet_device::host_memory_report`]) — before it is made: an aborted allocation (SIGABRT)
/// or the OOM killer would end the run without a word. `what` names what needs the memory.
pub fn check_host_memory(needed: u64, what: impl FnOnce() -> String) -> Result<()> {
    match duet_device::host_memory_report() {
        Some(h) if needed > h.available => Err(EngineError::HostOutOfMemory {
            what: what(),
            needed,
            available: h.available,
            bound: h.bound,
        }),
        _ => Ok(()),
    }
}
