//! [`ElementwiseOps`] for [`CudaDevice`]: element-wise ops, bias add and its gradient, GELU
//! (kernels-cuda/elementwise.cu, reduce.cu).

use super::prelude::*;

impl ElementwiseOps for CudaDevice {
    fn scale(&self, args: Checked<Scale<'_, Self::Buffer>>) -> Result<()> {
        let Scale { x, alpha } = args.into_inner();
        const OP: &str = "scale";
        let s = float_suffix(OP, x.dtype())?;
        let n = x.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: scale_T(T*, float, u64); x holds n elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("scale_{s}"))?
                .grid(self.grid_1d(n.div_ceil(16 / x.dtype().size_bytes())))
                .block((EW_BLOCK, 1, 1))
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
        if n == 0 {
            return Ok(());
        }
        // SAFETY: add_T(const T*, const T*, T*, u64); all three hold n elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("add_{s}"))?
                .grid(self.grid_1d(n.div_ceil(16 / a.dtype().size_bytes())))
                .block((EW_BLOCK, 1, 1))
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
        if n == 0 {
            return Ok(());
        }
        // SAFETY: add_assign_D_S(D*, const S*, u64); both hold n elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("add_assign_{d}_{s}"))?
                .grid(self.grid_1d(n.div_ceil(16 / dst.dtype().size_bytes())))
                .block((EW_BLOCK, 1, 1))
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
        let act = x.dtype();
        let sa = float_suffix(OP, act)?;
        // The kernels take the bias in the activations' dtype or in f32.
        let sp = wide_suffix(OP, act, "bias", bias.dtype())?;
        if total == 0 {
            return Ok(());
        }
        // SAFETY: bias_add(A*, const P*, u64 rows, u64 c): x holds rows·c, bias c elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("bias_add_{sa}_{sp}"))?
                .grid(self.grid_1d(total.div_ceil(16 / act.size_bytes())))
                .block((EW_BLOCK, 1, 1))
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
        let mut scratch = lock(&self.scratch, OP)?;
        // SAFETY: dout holds rows × c elements, dbias c.
        unsafe {
            self.column_sum(
                OP,
                &mut scratch,
                dout.ptr(),
                dout.dtype(),
                dbias.ptr(),
                dbias.dtype(),
                rows,
                c,
            )
        }
    }

    fn gelu_forward(&self, args: Checked<GeluForward<'_, Self::Buffer>>) -> Result<()> {
        let GeluForward { x, out } = args.into_inner();
        const OP: &str = "gelu_forward";
        let n = x.len();
        let s = float_suffix(OP, x.dtype())?;
        // The kernels write `out` in `x`'s dtype.
        check_dtype(OP, out, x.dtype())?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: gelu_forward_T(const T*, T*, u64); both hold n elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("gelu_forward_{s}"))?
                .grid(self.grid_1d(n.div_ceil(16 / x.dtype().size_bytes())))
                .block((EW_BLOCK, 1, 1))
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
        if n == 0 {
            return Ok(());
        }
        // SAFETY: gelu_backward_T(const T*, const T*, T*, u64); all hold n elements.
        unsafe {
            self.kernel(KernelModule::Elementwise, &format!("gelu_backward_{s}"))?
                .grid(self.grid_1d(n.div_ceil(16 / x.dtype().size_bytes())))
                .block((EW_BLOCK, 1, 1))
                .arg_buf(x)
                .arg_buf(dout)
                .arg_buf(dx)
                .arg_u64(n as u64)
                .launch()
        }
    }
}
