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
        let desc = RowsDesc::new(OP, rows, cols)?;
        desc.validate_quantize_fp8(Some(src), dst, dst_t.as_deref(), scale, amax, slot)?;
        let n = desc.total;
        let s = float_suffix(OP, src.dtype())?;
        let d = kernel_suffix(dst.dtype()).expect("an fp8 dtype");
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
        args::validate_gemm_fp8(desc, a, b, c, scale_inv, a_slot, b_slot)?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        blas::fp8_check(&self.arch_base, a.dtype(), c.dtype())?;
        let scales = (scale_inv.ptr_at(a_slot), scale_inv.ptr_at(b_slot));
        self.with_lt("gemm_fp8", a.dtype(), |lt| {
            blas::gemm_fp8(
                lt,
                &self.arch_base,
                self.stream.raw(),
                desc,
                a,
                b,
                c,
                Some(scales),
            )
        })
    }
}
