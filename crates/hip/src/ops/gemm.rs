//! GEMMs through rocBLAS (and FP8 GEMMs through hipBLASLt, see fp8.rs).

use super::prelude::*;
use crate::blas;
use duet_device::GemmDesc;

impl HipDevice {
    pub(crate) fn gemm_impl(
        &self,
        desc: &GemmDesc,
        a: &HipBuffer,
        b: &HipBuffer,
        c: &mut HipBuffer,
    ) -> Result<()> {
        check_dtype("gemm", b, a.dtype())?;
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        if a.dtype().is_fp8() {
            blas::fp8_check(&self.arch_base, a.dtype(), c.dtype())?;
            return self.with_lt("gemm (fp8)", a.dtype(), |lt| {
                blas::gemm_fp8(lt, &self.arch_base, self.stream.raw(), desc, a, b, c, None)
            });
        }
        let h = self
            .blas
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("rocBLAS lock poisoned".into()))?;
        blas::gemm(&h, desc, a, b, c)
    }
}
