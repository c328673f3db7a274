//! LayerNorm forward and backward (kernels-hip/layernorm.hip): one block per row, the
//! parameter gradients in two deterministic passes.

use super::prelude::*;
use crate::device::{group_rows_grid, rows_per_chunk};
use std::ffi::c_void;

impl HipDevice {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_forward_impl(
        &self,
        x: &HipBuffer,
        gamma: &HipBuffer,
        beta: &HipBuffer,
        out: &mut HipBuffer,
        mean: &mut HipBuffer,
        rstd: &mut HipBuffer,
        n: usize,
        c: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm_forward";
        RowsDesc::new(OP, n, c)?.validate_layernorm_forward(
            x,
            gamma,
            beta,
            Some(&*out),
            mean,
            rstd,
        )?;
        let sa = float_suffix(OP, x.dtype())?;
        // The kernels take gamma and beta in one dtype, the activations' or f32, and write
        // `out` in the activations' dtype.
        let sp = wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        same_dtype(OP, gamma.dtype(), &[beta])?;
        same_dtype(OP, x.dtype(), &[out])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: layernorm_forward_A_P(const A* x, const P* gamma, const P* beta, A* out,
        // float* mean, float* rstd, int n, int c, float eps): one block per row < n; x/out hold
        // n·c, gamma/beta c, mean/rstd n elements (checked).
        unsafe {
            self.kernel(&format!("{OP}_{sa}_{sp}"))?
                .grid(group_rows_grid(OP, n)?)
                .arg_buf(x)
                .arg_buf(gamma)
                .arg_buf(beta)
                .arg_buf(out)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_i32(dim(OP, "n", n)?)
                .arg_i32(dim(OP, "c", c)?)
                .arg_f32(eps)
                .launch()
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layernorm_backward_impl(
        &self,
        dout: &HipBuffer,
        x: &HipBuffer,
        gamma: &HipBuffer,
        mean: &HipBuffer,
        rstd: &HipBuffer,
        dx: &mut HipBuffer,
        dgamma: &mut HipBuffer,
        dbeta: &mut HipBuffer,
        n: usize,
        c: usize,
    ) -> Result<()> {
        const OP: &str = "layernorm_backward";
        RowsDesc::new(OP, n, c)?
            .validate_layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, None)?;
        let sa = float_suffix(OP, x.dtype())?;
        // The kernels take x, dout and dx in one dtype and gamma in theirs or f32.
        let sp = wide_suffix(OP, x.dtype(), "gamma", gamma.dtype())?;
        same_dtype(OP, x.dtype(), &[dout, dx])?;
        if n == 0 {
            return Ok(());
        }
        let (ni, ci) = (dim(OP, "n", n)?, dim(OP, "c", c)?);
        // SAFETY: layernorm_backward_dx_A_P(const A* dout, const A* x, const P* gamma,
        // const float* mean, const float* rstd, A* dx, int n, int c): one block per row < n;
        // dout/x/dx hold n·c, gamma c, mean/rstd n elements (checked).
        unsafe {
            self.kernel(&format!("layernorm_backward_dx_{sa}_{sp}"))?
                .grid(group_rows_grid(OP, n)?)
                .arg_buf(dout)
                .arg_buf(x)
                .arg_buf(gamma)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_buf(dx)
                .arg_i32(ni)
                .arg_i32(ci)
                .launch()?;
        };
        let rpc = rows_per_chunk(n);
        let chunks = n.div_ceil(rpc);
        let scratch = self.scratch(2 * chunks * c)?;
        let pg = scratch.ptr();
        // SAFETY: the scratch holds 2·chunks·c f32; pb is its second half.
        let pb = unsafe { pg.cast::<f32>().add(chunks * c) }.cast::<c_void>();
        let gx = grid_dim(OP, c.div_ceil(32))?;
        // SAFETY: layernorm_dparams_partial_A(const A* dout, const A* x, const float* mean,
        // const float* rstd, float* pg, float* pb, int n, int c, int rows_per_chunk): reads
        // n·c / n elements (checked), writes chunks·c f32 to each half of the scratch (sized
        // above); 32 columns per block, one grid row per chunk.
        unsafe {
            self.kernel(&format!("layernorm_dparams_partial_{sa}"))?
                .grid((gx.max(1), grid_dim(OP, chunks)?, 1))
                .arg_buf(dout)
                .arg_buf(x)
                .arg_buf(mean)
                .arg_buf(rstd)
                .arg_ptr(pg)
                .arg_ptr(pb)
                .arg_i32(ni)
                .arg_i32(ci)
                .arg_i32(dim(OP, "rows per chunk", rpc)?)
                .launch()?;
        };
        for (part, out) in [(pg, &*dgamma), (pb, &*dbeta)] {
            let so = float_suffix(OP, out.dtype())?;
            // SAFETY: colsum_finish_G(const float* partial, G* out, u64 chunks, u64 cols): the
            // chunks·c partials written above; out holds c elements (checked).
            unsafe {
                self.kernel(&format!("colsum_finish_{so}"))?
                    .grid((grid_dim(OP, c.div_ceil(32))?, 1, 1))
                    .arg_ptr(part)
                    .arg_buf(out)
                    .arg_u64(chunks as u64)
                    .arg_u64(c as u64)
                    .launch()?;
            };
        }
        Ok(())
    }
}
