//! The hip backend (not yet implemented): reports itself unavailable.
use duet_device::{DeviceError, Result};

/// Always fails: this backend is not implemented yet.
pub fn probe() -> Result<()> {
    Err(DeviceError::Unavailable {
        backend: "hip",
        reason: "not implemented in this build".into(),
        tried: vec![],
    })
}
