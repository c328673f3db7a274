//! hipBLASLt handle and descriptors that are destroyed in `Drop`, and the matmul (FP8 scales,
//! epilogues) built on them.

use super::result::{LtApi, check};
use super::sys;
use crate::error::HipError;
use std::ffi::c_void;
use std::sync::Arc;

macro_rules! owned {
    ($name:ident, $raw:ty, $destroy:ident, $call:literal) => {
        /// Destroyed in `Drop`; holds the API so it can outlive the call that made it (the
        /// FP8 plans keep their descriptors across calls).
        pub struct $name {
            api: Arc<LtApi>,
            pub raw: $raw,
        }
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the object is live and owned by this guard.
                let _ = check($call, unsafe { (self.api.lib.$destroy)(self.raw) });
            }
        }
        // SAFETY: a descriptor is plain host data inside hipBLASLt; it is used only under the
        // device's hipBLASLt mutex, one call at a time.
        unsafe impl Send for $name {}
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

    /// `hipblasLtGetVersion`: major·100000 + minor·100 + patch (e.g. 100401 for 1.4.1).
    pub fn version(&self) -> Result<i32, HipError> {
        let f = self
            .api
            .get_version
            .ok_or_else(|| HipError::MissingSymbols {
                library: self.api.name.clone(),
                missing: vec!["hipblasLtGetVersion".into()],
            })?;
        let mut v = 0;
        // SAFETY: live handle; writes one int.
        check("hipblasLtGetVersion", unsafe { f(self.raw, &mut v) })?;
        Ok(v)
    }
}

/// `major.minor.patch` of a [`LtHandle::version`] value.
pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 100_000, (v / 100) % 1000, v % 100)
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: live, owned handle.
        let _ = unsafe { (self.api.lib.hipblasLtDestroy)(self.raw) };
    }
}

/// One column-major matrix operand: type, rows, cols, leading dimension, batch stride.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    pub ty: sys::hipDataType,
    pub rows: u64,
    pub cols: u64,
    pub ld: i64,
    pub stride: i64,
}

/// Everything the descriptors and the algorithm of a matmul depend on: the operands' types and
/// layouts, the transposes, the batch, whether C is read (beta ≠ 0), how A and B are scaled
/// (FP8) and the epilogue. One [`Plan`] is built per key; the pointers (data, scales, bias,
/// auxiliary matrix, workspace) change from call to call and are not part of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PlanKey {
    pub trans_a: bool,
    pub trans_b: bool,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub batch: i32,
    /// beta ≠ 0 (the heuristic may pick other kernels when C is read).
    pub accumulate: bool,
    /// Whether A and B have device scale pointers (the FP8 GEMMs; hipBLASLt picks kernels with
    /// scale support only when they are set).
    pub scaled: bool,
    /// `hipblasLtMatmulMatrixScale_t` of A and B when `scaled`: always one f32 scalar per
    /// matrix through a device pointer ([`sys::HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F`]) today.
    pub scale_mode: u32,
    pub epilogue: EpilogueKey,
}

/// The epilogue part of a [`PlanKey`]: the `hipblasLtEpilogue_t`, the bias type (when the
/// epilogue reads a bias or writes a bias gradient) and the auxiliary matrix's leading
/// dimension (when it has one: the GELU pre-activation, written by GELU_AUX_BIAS and read by
/// DGELU, of D's type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpilogueKey {
    pub code: u32,
    pub bias_type: Option<sys::hipDataType>,
    pub aux_ld: Option<i64>,
}

impl EpilogueKey {
    /// No epilogue (`HIPBLASLT_EPILOGUE_DEFAULT`).
    pub const NONE: Self = Self {
        code: sys::HIPBLASLT_EPILOGUE_DEFAULT,
        bias_type: None,
        aux_ld: None,
    };
}

/// The descriptors and the algorithm of one [`PlanKey`], built once ([`LtHandle::plan`]) and
/// reused by every matmul of that shape ([`LtHandle::run`]).
pub struct Plan {
    desc: Desc,
    a: Layout,
    b: Layout,
    c: Layout,
    key: PlanKey,
    pub algo: sys::hipblasLtMatmulAlgo_t,
    /// Workspace the algorithm needs (at most the workspace the plan was made for).
    pub workspace_size: usize,
}

/// Device pointers of one matmul. Those the plan's key has no use for (the scales of an
/// unscaled matmul, the bias or auxiliary matrix of an epilogue without one) are not read and
/// may be null.
pub struct Ptrs {
    pub a: *const c_void,
    pub b: *const c_void,
    /// C, read when beta ≠ 0 (D itself, or a separate matrix of D's layout).
    pub c: *const c_void,
    /// D, written.
    pub d: *mut c_void,
    /// Device f32 scale for A and for B (the FP8 dequantisation factors).
    pub a_scale: *const c_void,
    pub b_scale: *const c_void,
    /// The bias (read), or the bias gradient (written, BGRADB).
    pub bias: *const c_void,
    /// The auxiliary matrix (written by GELU_AUX_BIAS, read by DGELU).
    pub aux: *const c_void,
    pub workspace: *mut c_void,
    pub workspace_size: usize,
}

impl LtHandle {
    fn layout(&self, o: &Operand, batch: i32) -> Result<Layout, HipError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatrixLayoutCreate", unsafe {
            (self.api.lib.hipblasLtMatrixLayoutCreate)(&mut raw, o.ty, o.rows, o.cols, o.ld)
        })?;
        let l = Layout {
            api: self.api.clone(),
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

    fn set_desc(
        &self,
        desc: &Desc,
        attr: u32,
        ptr: *const c_void,
        size: usize,
    ) -> Result<(), HipError> {
        // SAFETY: live descriptor; every caller passes `ptr` to `size` bytes of the attribute's
        // type.
        check("hipblasLtMatmulDescSetAttribute", unsafe {
            (self.api.lib.hipblasLtMatmulDescSetAttribute)(desc.raw, attr, ptr, size)
        })
    }

    /// Sets a pointer-valued attribute (a device address passed by value).
    fn set_ptr(&self, desc: &Desc, attr: u32, p: *const c_void) -> Result<(), HipError> {
        self.set_desc(
            desc,
            attr,
            (&p as *const *const c_void).cast(),
            size_of::<*const c_void>(),
        )
    }

    /// Sets the per-call pointers `key` uses: the scales of A and B, the bias, the auxiliary
    /// matrix.
    fn set_ptrs(&self, desc: &Desc, key: &PlanKey, p: &Ptrs) -> Result<(), HipError> {
        if key.scaled {
            self.set_ptr(desc, sys::HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER, p.a_scale)?;
            self.set_ptr(desc, sys::HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER, p.b_scale)?;
        }
        if key.epilogue.bias_type.is_some() {
            self.set_ptr(desc, sys::HIPBLASLT_MATMUL_DESC_BIAS_POINTER, p.bias)?;
        }
        if key.epilogue.aux_ld.is_some() {
            self.set_ptr(desc, sys::HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, p.aux)?;
        }
        Ok(())
    }

    /// Builds the descriptors of `key` (f32 compute and scale type) and asks the heuristic for
    /// one algorithm that fits in `workspace` bytes. `p` are this call's pointers: the heuristic
    /// must see the scale, bias and auxiliary pointers the key uses set (hipBLASLt picks
    /// kernels by which are non-null); it reads none of them, and every `run` sets its own.
    /// `Ok(None)` when hipBLASLt has no algorithm.
    pub fn plan(
        &self,
        key: &PlanKey,
        workspace: usize,
        p: &Ptrs,
    ) -> Result<Option<Plan>, HipError> {
        let lib = &self.api.lib;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatmulDescCreate", unsafe {
            (lib.hipblasLtMatmulDescCreate)(&mut raw, sys::HIPBLAS_COMPUTE_32F, sys::HIP_R_32F)
        })?;
        let desc = Desc {
            api: self.api.clone(),
            raw,
        };
        let op = |t: bool| {
            if t {
                sys::HIPBLAS_OP_T
            } else {
                sys::HIPBLAS_OP_N
            }
        };
        let (ta, tb) = (op(key.trans_a), op(key.trans_b));
        self.set_desc(
            &desc,
            sys::HIPBLASLT_MATMUL_DESC_TRANSA,
            (&ta as *const i32).cast(),
            4,
        )?;
        self.set_desc(
            &desc,
            sys::HIPBLASLT_MATMUL_DESC_TRANSB,
            (&tb as *const i32).cast(),
            4,
        )?;
        let epi = key.epilogue;
        if epi.code != sys::HIPBLASLT_EPILOGUE_DEFAULT {
            // EPILOGUE: uint32 hipblasLtEpilogue_t.
            self.set_desc(
                &desc,
                sys::HIPBLASLT_MATMUL_DESC_EPILOGUE,
                (&epi.code as *const u32).cast(),
                4,
            )?;
        }
        if let Some(bt) = epi.bias_type {
            // BIAS_DATA_TYPE: int32 hipDataType.
            let bt = bt as i32;
            self.set_desc(
                &desc,
                sys::HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                (&bt as *const i32).cast(),
                4,
            )?;
        }
        if let Some(ld) = epi.aux_ld {
            // EPILOGUE_AUX_LD: int64.
            self.set_desc(
                &desc,
                sys::HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                (&ld as *const i64).cast(),
                8,
            )?;
        }
        self.set_ptrs(&desc, key, p)?;
        let (la, lb, lc) = (
            self.layout(&key.a, key.batch)?,
            self.layout(&key.b, key.batch)?,
            self.layout(&key.c, key.batch)?,
        );
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("hipblasLtMatmulPreferenceCreate", unsafe {
            (lib.hipblasLtMatmulPreferenceCreate)(&mut raw)
        })?;
        let pref = Pref {
            api: self.api.clone(),
            raw,
        };
        let ws = workspace as u64;
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
        if count < 1 || result.workspace_size > workspace {
            return Ok(None);
        }
        Ok(Some(Plan {
            desc,
            a: la,
            b: lb,
            c: lc,
            key: *key,
            algo: result.algo,
            workspace_size: result.workspace_size,
        }))
    }

    /// `D = epilogue(alpha · scaleA·scaleB · op(A) op(B) + beta C)` (column-major; the scales
    /// only when the key is scaled) with a plan made by [`Self::plan`] on this handle: sets this
    /// call's scale, bias and auxiliary pointers on the plan's descriptor and enqueues the
    /// matmul. C and D share the plan's C layout.
    ///
    /// # Safety
    /// The plan must describe the operands `p` points to; the pointers must be device memory
    /// covering every operand and batch described (C too when beta ≠ 0), the scales one f32
    /// each, the bias the vector the epilogue reads or writes (of the key's bias type), the
    /// auxiliary matrix D's extent at the key's leading dimension, the workspace
    /// `workspace_size` bytes (at least the plan's), all valid until the stream gets there.
    pub unsafe fn run(
        &self,
        plan: &Plan,
        alpha: f32,
        beta: f32,
        p: &Ptrs,
        stream: crate::hip::sys::hipStream_t,
    ) -> Result<(), HipError> {
        self.set_ptrs(&plan.desc, &plan.key, p)?;
        // SAFETY: guaranteed by the caller; alpha/beta are host f32 (default pointer mode).
        check("hipblasLtMatmul", unsafe {
            (self.api.lib.hipblasLtMatmul)(
                self.raw,
                plan.desc.raw,
                (&alpha as *const f32).cast(),
                p.a,
                plan.a.raw,
                p.b,
                plan.b.raw,
                (&beta as *const f32).cast(),
                p.c,
                plan.c.raw,
                p.d,
                plan.c.raw,
                &plan.algo,
                p.workspace,
                p.workspace_size,
                stream,
            )
        })
    }
}
