//! FP8: quantisation (kernels-hip/fp8.hip) and FP8 GEMMs through hipBLASLt.

use super::prelude::*;
use crate::blas;
use duet_device::GemmDesc;

impl HipDevice {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn quantize_fp8_impl(
        &self,
        src: &HipBuffer,
        dst: &mut HipBuffer,
        dst_t: Option<&mut HipBuffer>,
        rows: usize,
        cols: usize,
        scale: &HipBuffer,
        amax: &mut HipBuffer,
        slot: usize,
    ) -> Result<()> {
        const OP: &str = "quantize_fp8";
        let s = float_suffix(OP, src.dtype())?;
        if !dst.dtype().is_fp8() {
            return Err(unsupported(OP, dst.dtype()));
        }
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
        let n = checked_product(OP, &[rows, cols])?;
        check_len(OP, "src", src, n)?;
        check_len(OP, "dst", dst, n)?;
        if let Some(t) = &dst_t {
            check_dtype(OP, *t, dst.dtype())?;
            check_len(OP, "dst_t", *t, n)?;
        }
        check_dtype(OP, scale, DType::F32)?;
        check_dtype(OP, amax, DType::F32)?;
        check_range(OP, slot, 1, scale.len())?;
        check_range(OP, slot, 1, amax.len())?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: quantize_S_D(const S*, D*, D* dst_t (or null), u64 rows, u64 cols,
        // const float*, float*): src, dst (and dst_t) hold rows × cols elements; scale/amax at
        // slot (checked).
        unsafe {
            self.kernel(&format!("quantize_{s}_{d}"))?
                .grid(self.grid_1d(n))
                .arg_buf(src)
                .arg_buf(dst)
                .arg_ptr(dst_t.map_or(std::ptr::null_mut(), |t| t.ptr()))
                .arg_u64(rows as u64)
                .arg_u64(cols as u64)
                .arg_ptr(scale.ptr_at(slot))
                .arg_ptr(amax.ptr_at(slot))
                .launch()
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_fp8_impl(
        &self,
        desc: &GemmDesc,
        a: &HipBuffer,
        b: &HipBuffer,
        c: &mut HipBuffer,
        scale_inv: &HipBuffer,
        a_slot: usize,
        b_slot: usize,
    ) -> Result<()> {
        const OP: &str = "gemm_fp8";
        for x in [a, b] {
            if !x.dtype().is_fp8() {
                return Err(unsupported(OP, x.dtype()));
            }
        }
        check_dtype(OP, scale_inv, DType::F32)?;
        check_range(OP, a_slot, 1, scale_inv.len())?;
        check_range(OP, b_slot, 1, scale_inv.len())?;
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        let lt = self.lt.as_ref().ok_or_else(|| {
            unsupported("gemm_fp8 (needs hipBLASLt, which was not found)", a.dtype())
        })?;
        let lt = lt
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("hipBLASLt lock poisoned".into()))?;
        let scales = (scale_inv.ptr_at(a_slot), scale_inv.ptr_at(b_slot));
        blas::gemm_fp8(
            &lt,
            &self.arch_base,
            self.stream.raw(),
            desc,
            a,
            b,
            c,
            Some(scales),
        )
    }
}
