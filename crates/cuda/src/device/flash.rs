//! Fused causal attention (kernels-cuda/flash_attention.cu): see
//! [`duet_device::Device::flash_attention_forward`].

use super::CudaDevice;
use crate::memory::CudaBuffer;
use duet_device::{Buffer, DType, DeviceError, Result};

impl CudaDevice {
    pub(super) fn flash_supported(&self, dtype: DType, hs: usize) -> bool {
        let _ = (dtype, hs);
        false
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn flash_forward_impl(
        &self,
        qkv: &CudaBuffer,
        out: &mut CudaBuffer,
        lse: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        let _ = (out, lse, b, t, nh, hs, scale);
        Err(DeviceError::Unsupported {
            op: "flash_attention_forward".into(),
            dtype: qkv.dtype(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn flash_backward_impl(
        &self,
        qkv: &CudaBuffer,
        out: &CudaBuffer,
        dout: &CudaBuffer,
        lse: &CudaBuffer,
        dqkv: &mut CudaBuffer,
        b: usize,
        t: usize,
        nh: usize,
        hs: usize,
        scale: f32,
    ) -> Result<()> {
        let _ = (out, dout, lse, dqkv, b, t, nh, hs, scale);
        Err(DeviceError::Unsupported {
            op: "flash_attention_backward".into(),
            dtype: qkv.dtype(),
        })
    }
}
