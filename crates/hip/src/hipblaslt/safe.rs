//! hipBLASLt handle and descriptors that are destroyed in `Drop`, and the FP8 matmul built on them.

use super::result::{LtApi, check};
use super::sys;
use crate::error::HipError;
use std::ffi::c_void;
use std::sync::Arc;

macro_rules! owned {
    ($name:ident, $raw:ty, $destroy:ident, $call:literal) => {
        pub struct $name<'a> {
            api: &'a LtApi,
            pub raw: $raw,
        }
        impl Drop for $name<'_> {
            fn drop(&mut self) {
                // SAFETY: the object is live and owned by this guard.
                let _ = check($call, unsafe { (self.api.lib.$destroy)(self.raw) });
            }
        }
    };
}
owned!(
    Layout,
    sys::hipblasLtMatrixLayout_t,
    hipblasLtMatrixLayoutDestroy,
    "hipblasLtMatrixLayoutDestroy"
);
owned!(
    Desc,
    sys::hipblasLtMatmulDesc_t,
    hipblasLtMatmulDescDestroy,
    "hipblasLtMatmulDescDestroy"
);
owned!(
    Pref,
    sys::hipblasLtMatmulPreference_t,
    hipblasLtMatmulPreferenceDestroy,
    "hipblasLtMatmulPreferenceDestroy"
);

pub struct LtHandle {
    pub api: Arc<LtApi>,
    pub raw: sys::hipblasLtHandle_t,
}

// SAFETY: used behind the device's mutex, one call at a time.
unsafe impl Send for LtHandle {}
// SAFETY: as above.
unsafe impl Sync for LtHandle {}

impl LtHandle {
    pub fn new(api: Arc<LtApi>) -> Result<Self, HipError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtCreate", unsafe {
            (api.lib.hipblasLtCreate)(&mut raw)
        })?;
        Ok(Self { api, raw })
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: live, owned handle.
        let _ = unsafe { (self.api.lib.hipblasLtDestroy)(self.raw) };
    }
}

/// One column-major matrix operand: type, rows, cols, leading dimension, batch stride.
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ty: sys::hipDataType,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub stride: i64,
}

/// Device pointers of one FP8 matmul.
pub struct Fp8Ptrs {
    pub a: *const c_void,
    pub b: *const c_void,
    pub c: *mut c_void,
    /// Device f32 scale for A and for B (the FP8 dequantisation factors).
    pub a_scale: *const c_void,
    pub b_scale: *const c_void,
    pub workspace: *mut c_void,
    pub workspace_size: usize,
}

impl LtHandle {
    fn layout(&self, o: &Operand, batch: i32) -> Result<Layout<'_>, HipError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatrixLayoutCreate", unsafe {
            (self.api.lib.hipblasLtMatrixLayoutCreate)(&mut raw, o.ty, o.rows, o.cols, o.ld)
        })?;
        let l = Layout {
            api: &self.api,
            raw,
        };
        if batch > 1 {
            // SAFETY: live layout; int32 and int64 attributes passed with their sizes.
            unsafe {
                check(
                    "hipblasLtMatrixLayoutSetAttribute",
                    (self.api.lib.hipblasLtMatrixLayoutSetAttribute)(
                        l.raw,
                        sys::HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&batch as *const i32).cast(),
                        4,
                    ),
                )?;
                check(
                    "hipblasLtMatrixLayoutSetAttribute",
                    (self.api.lib.hipblasLtMatrixLayoutSetAttribute)(
                        l.raw,
                        sys::HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&o.stride as *const i64).cast(),
                        8,
                    ),
                )?;
            }
        }
        Ok(l)
    }

    /// `C = alpha · scaleA·scaleB · op(A) op(B) + beta C` (column-major), f32 compute. Returns
    /// `Ok(false)` when hipBLASLt has no algorithm for the combination.
    ///
    /// # Safety
    /// The pointers must be device memory covering every operand and batch described, the scales
    /// one f32 each, the workspace `workspace_size` bytes, all valid until the stream gets there.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn matmul(
        &self,
        trans_a: bool,
        trans_b: bool,
        a: &Operand,
        b: &Operand,
        c: &Operand,
        batch: i32,
        alpha: f32,
        beta: f32,
        p: &Fp8Ptrs,
        stream: crate::hip::sys::hipStream_t,
    ) -> Result<bool, HipError> {
        let lib = &self.api.lib;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatmulDescCreate", unsafe {
            (lib.hipblasLtMatmulDescCreate)(&mut raw, sys::HIPBLAS_COMPUTE_32F, sys::HIP_R_32F)
        })?;
        let desc = Desc {
            api: &self.api,
            raw,
        };
        let op = |t: bool| {
            if t {
                sys::HIPBLAS_OP_T
            } else {
                sys::HIPBLAS_OP_N
            }
        };
        let (ta, tb) = (op(trans_a), op(trans_b));
        let set = |attr: u32, ptr: *const c_void, size: usize| {
            // SAFETY: live descriptor; `ptr` points to `size` bytes of the attribute's type.
            check("hipblasLtMatmulDescSetAttribute", unsafe {
                (lib.hipblasLtMatmulDescSetAttribute)(desc.raw, attr, ptr, size)
            })
        };
        set(
            sys::HIPBLASLT_MATMUL_DESC_TRANSA,
            (&ta as *const i32).cast(),
            4,
        )?;
        set(
            sys::HIPBLASLT_MATMUL_DESC_TRANSB,
            (&tb as *const i32).cast(),
            4,
        )?;
        set(
            sys::HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER,
            (&p.a_scale as *const *const c_void).cast(),
            size_of::<*const c_void>(),
        )?;
        set(
            sys::HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            (&p.b_scale as *const *const c_void).cast(),
            size_of::<*const c_void>(),
        )?;
        let (la, lb, lc) = (
            self.layout(a, batch)?,
            self.layout(b, batch)?,
            self.layout(c, batch)?,
        );
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatmulPreferenceCreate", unsafe {
            (lib.hipblasLtMatmulPreferenceCreate)(&mut raw)
        })?;
        let pref = Pref {
            api: &self.api,
            raw,
        };
        let ws = p.workspace_size as u64;
        // SAFETY: live preference; uint64 attribute.
        check("hipblasLtMatmulPreferenceSetAttribute", unsafe {
            (lib.hipblasLtMatmulPreferenceSetAttribute)(
                pref.raw,
                sys::HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
        })?;
        let mut result = sys::hipblasLtMatmulHeuristicResult_t::default();
        let mut count = 0i32;
        // SAFETY: live objects; room for one result.
        check("hipblasLtMatmulAlgoGetHeuristic", unsafe {
            (lib.hipblasLtMatmulAlgoGetHeuristic)(
                self.raw,
                desc.raw,
                la.raw,
                lb.raw,
                lc.raw,
                lc.raw,
                pref.raw,
                1,
                &mut result,
                &mut count,
            )
        })?;
        if count < 1 || result.workspace_size > p.workspace_size {
            return Ok(false);
        }
        // SAFETY: guaranteed by the caller; alpha/beta are host f32 (default pointer mode).
        check("hipblasLtMatmul", unsafe {
            (lib.hipblasLtMatmul)(
                self.raw,
                desc.raw,
                (&alpha as *const f32).cast(),
                p.a,
                la.raw,
                p.b,
                lb.raw,
                (&beta as *const f32).cast(),
                p.c,
                lc.raw,
                p.c,
                lc.raw,
                &result.algo,
                p.workspace,
                p.workspace_size,
                stream,
            )
        })?;
        Ok(true)
    }
}
