//! GEMMs through cuBLAS (`cublasGemmStridedBatchedEx`, FP32 compute).
//!
//! f32 GEMMs use `CUBLAS_COMPUTE_32F` (true FP32, no TF32) unless TF32 is explicitly allowed
//! ([`crate::CudaDevice::set_allow_tf32`] or `DUET_CUDA_ALLOW_TF32=1`), so results match the CPU
//! backend to FP32 rounding. f16/bf16 operands always accumulate in FP32 on the tensor cores.
//! Note that NVIDIA's `NVIDIA_TF32_OVERRIDE` environment variable, if set, overrides this.

use crate::conv;
use crate::error;
use crate::memory::CudaBuffer;
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{self, cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t};
use cudarc::driver::{CudaContext, CudaStream};
use duet_device::{Buffer, DType, DeviceError, GemmDesc, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct Blas {
    ctx: Arc<CudaContext>,
    handle: Mutex<CudaBlas>,
    allow_tf32: AtomicBool,
    /// cuBLAS version as major.minor.patch.
    pub(crate) version: String,
}

impl Blas {
    pub(crate) fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self> {
        // DUET_CUDA_ALLOW_TF32.
        let allow_tf32 = duet_device::knobs::device_knobs()?.cuda_allow_tf32;
        let blas = CudaBlas::new(stream).map_err(|e| error::cublas("cublasCreate", e))?;
        // SAFETY: the handle is live; the math mode is a plain enum value.
        unsafe { sys::cublasSetMathMode(*blas.handle(), cublasMath_t::CUBLAS_DEFAULT_MATH) }
            .result()
            .map_err(|e| error::cublas("cublasSetMathMode", e))?;
        let mut v = 0i32;
        // SAFETY: live handle, plain out-parameter.
        unsafe { sys::cublasGetVersion_v2(*blas.handle(), &mut v) }
            .result()
            .map_err(|e| error::cublas("cublasGetVersion", e))?;
        let version = format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
        Ok(Self {
            ctx,
            handle: Mutex::new(blas),
            allow_tf32: AtomicBool::new(allow_tf32),
            version,
        })
    }

    pub(crate) fn set_allow_tf32(&self, allow: bool) {
        self.allow_tf32.store(allow, Ordering::Relaxed);
    }

    pub(crate) fn allow_tf32(&self) -> bool {
        self.allow_tf32.load(Ordering::Relaxed)
    }

    /// `C = alpha · op(A) · op(B) + beta · C` per [`GemmDesc`] (validated here).
    pub(crate) fn gemm(
        &self,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
    ) -> Result<()> {
        const OP: &str = "gemm";
        let in_type = conv::blas_dtype(a.dtype()).ok_or_else(|| DeviceError::Unsupported {
            op: OP.into(),
            dtype: a.dtype(),
        })?;
        if b.dtype() != a.dtype() {
            return Err(DeviceError::DTypeMismatch {
                op: OP,
                expected: a.dtype(),
                got: b.dtype(),
            });
        }
        if c.dtype() != a.dtype() && c.dtype() != DType::F32 {
            return Err(DeviceError::DTypeMismatch {
                op: OP,
                expected: a.dtype(),
                got: c.dtype(),
            });
        }
        let c_type = conv::blas_dtype(c.dtype()).expect("f32/f16/bf16");
        desc.validate(a.len(), b.len(), c.len())?;
        if desc.batch == 0 || desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        let g = conv::col_major_gemm(desc)?;
        let compute = if a.dtype() == DType::F32 && self.allow_tf32() {
            cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (alpha, beta) = (desc.alpha, desc.beta);
        let handle = self.handle.lock().map_err(|_| DeviceError::Driver {
            backend: error::BACKEND,
            call: "gemm".into(),
            message: "cuBLAS handle lock poisoned".into(),
        })?;
        // cuBLAS runs on the device's stream; its calls need the context current on this thread.
        self.ctx
            .bind_to_thread()
            .map_err(error::drv("cuCtxSetCurrent"))?;
        // SAFETY: `desc.validate` checked that every batch of A, B and C (with offsets, leading
        // dimensions and strides) lies inside the three buffers, which are live device
        // allocations; `col_major_gemm` swapped A/B consistently with the pointers passed below
        // (cuBLAS's A is duet's B); alpha/beta are host f32 values as CUBLAS_COMPUTE_32F expects.
        unsafe {
            sys::cublasGemmStridedBatchedEx(
                *handle.handle(),
                g.transa,
                g.transb,
                g.m,
                g.n,
                g.k,
                (&alpha as *const f32).cast(),
                b.ptr_at(desc.b_offset) as *const std::ffi::c_void,
                in_type,
                g.lda,
                g.stride_a,
                a.ptr_at(desc.a_offset) as *const std::ffi::c_void,
                in_type,
                g.ldb,
                g.stride_b,
                (&beta as *const f32).cast(),
                c.ptr_at(desc.c_offset) as *mut std::ffi::c_void,
                c_type,
                g.ldc,
                g.stride_c,
                g.batch,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .result()
        .map_err(|e| error::cublas("cublasGemmStridedBatchedEx", e))
    }
}
