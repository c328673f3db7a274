//! [`duet_device::ElementwiseOps`] on HIP: element-wise ops, bias add and its gradient, GELU
//! (kernels-hip/elementwise.hip, reduce.hip).

use super::prelude::*;

impl ElementwiseOps for HipDevice {
    fn scale(&self, args: Checked<Scale<'_, Self::Buffer>>) -> Result<()> {
        let Scale { x, alpha } = args.into_inner();
        let s = float_suffix("scale", x.dtype())?;
        let n = x.len();
        // SAFETY: scale_T(T* x, float alpha, u64 n): x holds n elements.
        unsafe {
            self.kernel(&format!("scale_{s}"))?
                .grid(self.grid_1d(n))
                .arg_buf(x)
                .arg_f32(alpha)
                .arg_u64(n as u64)
                .launch()
        }
    }

    fn add(&self, args: Checked<Add<'_, Self::Buffer>>) -> Result<()> {
        let Add { a, b, out } = args.into_inner();
        const OP: &str = "add";
        let n = a.len();
        let s = float_suffix(OP, a.dtype())?;
        // SAFETY: add_T(const T* a, const T* b, T* out, u64 n): all three hold n elements.
        unsafe {
            self.kernel(&format!("add_{s}"))?
                .grid(self.grid_1d(n))
                .arg_buf(a)
                .arg_buf(b)
                .arg_buf(out)
                .arg_u64(n as u64)
                .launch()
        }
    }

    fn add_assign(&self, args: Checked<AddAssign<'_, Self::Buffer>>) -> Result<()> {
        let AddAssign { dst, src } = args.into_inner();
        const OP: &str = "add_assign";
        let n = dst.len();
        let d = float_suffix(OP, dst.dtype())?;
        let s = float_suffix(OP, src.dtype())?;
        // SAFETY: add_assign_D_S(D* dst, const S* src, u64 n): both hold n elements (the dtypes
        // may differ, as the trait allows and the CUDA kernels do).
        unsafe {
            self.kernel(&format!("add_assign_{d}_{s}"))?
                .grid(self.grid_1d(n))
                .arg_buf(dst)
                .arg_buf(src)
                .arg_u64(n as u64)
                .launch()
        }
    }

    fn bias_add(&self, args: Checked<BiasAdd<'_, Self::Buffer>>) -> Result<()> {
        let BiasAdd { x, bias, rows, c } = args.into_inner();
        const OP: &str = "bias_add";
        let desc = RowsDesc::new(OP, rows, c)?;
        let total = desc.total;
        let sa = float_suffix(OP, x.dtype())?;
        // The kernels take the bias in the activations' dtype or in f32.
        let sp = wide_suffix(OP, x.dtype(), "bias", bias.dtype())?;
        // SAFETY: bias_add_A_P(A* x, const P* bias, u64 rows, u64 c): x holds rows·c elements,
        // bias c.
        unsafe {
            self.kernel(&format!("{OP}_{sa}_{sp}"))?
                .grid(self.grid_1d(total))
                .arg_buf(x)
                .arg_buf(bias)
                .arg_u64(rows as u64)
                .arg_u64(c as u64)
                .launch()
        }
    }

    fn bias_backward(&self, args: Checked<BiasBackward<'_, Self::Buffer>>) -> Result<()> {
        let BiasBackward {
            dout,
            dbias,
            rows,
            c,
        } = args.into_inner();
        const OP: &str = "bias_backward";
        if c == 0 {
            return Ok(());
        }
        self.column_sum(OP, dout, rows, c, dbias)
    }

    fn gelu_forward(&self, args: Checked<GeluForward<'_, Self::Buffer>>) -> Result<()> {
        let GeluForward { x, out } = args.into_inner();
        const OP: &str = "gelu_forward";
        let n = x.len();
        let s = float_suffix(OP, x.dtype())?;
        // The kernels write `out` in `x`'s dtype.
        same_dtype(OP, x.dtype(), &[out])?;
        // SAFETY: gelu_forward_T(const T* x, T* out, u64 n): both hold n elements.
        unsafe {
            self.kernel(&format!("gelu_forward_{s}"))?
                .grid(self.grid_1d(n))
                .arg_buf(x)
                .arg_buf(out)
                .arg_u64(n as u64)
                .launch()
        }
    }

    fn gelu_backward(&self, args: Checked<GeluBackward<'_, Self::Buffer>>) -> Result<()> {
        let GeluBackward { x, dout, dx } = args.into_inner();
        const OP: &str = "gelu_backward";
        let n = x.len();
        let s = float_suffix(OP, x.dtype())?;
        // The kernels take all three in one dtype.
        same_dtype(OP, x.dtype(), &[dout, dx])?;
        // SAFETY: gelu_backward_T(const T* x, const T* dout, T* dx, u64 n): all hold n elements.
        unsafe {
            self.kernel(&format!("gelu_backward_{s}"))?
                .grid(self.grid_1d(n))
                .arg_buf(x)
                .arg_buf(dout)
                .arg_buf(dx)
                .arg_u64(n as u64)
                .launch()
        }
    }
}
