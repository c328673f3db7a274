//! FP8 GEMMs through cuBLASLt (`cublasLtMatmul`, FP32 compute and scale type).
//!
//! duet's row-major `C = op(A)·op(B)` becomes the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ` exactly as
//! for the cuBLAS GEMMs ([`conv::col_major_gemm`]): cuBLASLt's first operand is duet's B. On
//! sm_89/sm_90 FP8 matmuls must be "TN" (cuBLASLt's A transposed, B not, both K-major), which in
//! duet's terms is `trans_a = false, trans_b = true`; the engine arranges its operands that way
//! (the quantisation kernels write the transposed copies the backward pass needs). Leading
//! dimensions and `k` must be multiples of 16 and the operand offsets 16-byte aligned.
//!
//! The inverse scales are device pointers (`A_SCALE_POINTER`/`B_SCALE_POINTER`): cuBLASLt
//! computes `D = alpha·(sa·sb)·op(A)·op(B) + beta·C`, the same formula the CPU backend emulates.
//! C and D are one buffer (bf16, f16 or f32).

use crate::conv;
use crate::error::BACKEND;
use crate::memory::{CudaBuffer, DeviceMemory, MemTracker};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    self as ltsys, cublasComputeType_t, cublasLtMatmulDescAttributes_t as DescAttr,
    cublasLtMatmulPreferenceAttributes_t as PrefAttr, cudaDataType,
};
use cudarc::driver::{CudaContext, CudaStream};
use duet_device::{Buffer, DType, DeviceError, GemmDesc, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// cuBLASLt workspace: NVIDIA recommends 32 MiB on Hopper (4 MiB before).
const WORKSPACE_HOPPER: usize = 32 << 20;
const WORKSPACE_OTHER: usize = 4 << 20;
/// Alignment (bytes) at which cuBLASLt takes the FP8 scale pointers in place.
pub(crate) const SCALE_ALIGN: u64 = 256;
/// Algorithms asked of the heuristic for a new GEMM shape (tried in order, or timed when
/// autotuning).
const HEURISTIC_CANDIDATES: usize = 16;
/// Timed runs per candidate when autotuning (after one untimed run).
const TUNE_REPS: usize = 3;

fn lt_err(call: &str, e: lt::CublasError) -> DeviceError {
    DeviceError::Driver {
        backend: BACKEND,
        call: call.into(),
        message: format!("{:?}", e.0),
    }
}

/// cuBLASLt's type for an FP8 operand (OCP formats only; cuBLASLt has no FNUZ types).
fn fp8_type(d: DType) -> Option<cudaDataType> {
    match d {
        DType::F8E4M3 => Some(cudaDataType::CUDA_R_8F_E4M3),
        DType::F8E5M2 => Some(cudaDataType::CUDA_R_8F_E5M2),
        _ => None,
    }
}

fn out_type(d: DType) -> Option<cudaDataType> {
    match d {
        DType::F32 => Some(cudaDataType::CUDA_R_32F),
        DType::BF16 => Some(cudaDataType::CUDA_R_16BF),
        DType::F16 => Some(cudaDataType::CUDA_R_16F),
        _ => None,
    }
}

/// What the algorithm choice depends on: shape, layout, types and whether C is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct AlgoKey {
    m: i32,
    n: i32,
    k: i32,
    lda: i32,
    ldb: i32,
    ldc: i32,
    types: (DType, DType, DType),
    accumulate: bool,
    /// FP8 fast accumulation (a different set of kernels).
    fast_accum: bool,
    trans: (bool, bool),
    /// cuBLASLt epilogue code and the bias dtype (F32 when there is none).
    epilogue: (u32, DType),
}

/// The epilogue of a [`BlasLt::matmul`], in cuBLASLt's terms (device addresses).
#[derive(Clone, Copy, Debug)]
pub(crate) enum LtEpilogue {
    None,
    Bias {
        bias: u64,
        dtype: DType,
    },
    /// The bias, and C read from `residual` (beta 1) while D is written.
    BiasResidual {
        bias: u64,
        dtype: DType,
        residual: u64,
    },
    GeluAuxBias {
        bias: u64,
        dtype: DType,
        aux: u64,
        ld: i64,
    },
    DGelu {
        aux: u64,
        ld: i64,
    },
    /// Bias gradient of cuBLASLt's B (duet's A) reduced over k, written to `bias`.
    BGradB {
        bias: u64,
        dtype: DType,
    },
}

impl LtEpilogue {
    fn code(self) -> ltsys::cublasLtEpilogue_t {
        use ltsys::cublasLtEpilogue_t as E;
        match self {
            Self::None => E::CUBLASLT_EPILOGUE_DEFAULT,
            Self::Bias { .. } | Self::BiasResidual { .. } => E::CUBLASLT_EPILOGUE_BIAS,
            Self::GeluAuxBias { .. } => E::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Self::DGelu { .. } => E::CUBLASLT_EPILOGUE_DGELU,
            Self::BGradB { .. } => E::CUBLASLT_EPILOGUE_BGRADB,
        }
    }

    fn bias(self) -> Option<(u64, DType)> {
        match self {
            Self::Bias { bias, dtype }
            | Self::BiasResidual { bias, dtype, .. }
            | Self::GeluAuxBias { bias, dtype, .. }
            | Self::BGradB { bias, dtype } => Some((bias, dtype)),
            _ => None,
        }
    }

    /// Where C is read from when that is not D.
    fn residual(self) -> Option<u64> {
        match self {
            Self::BiasResidual { residual, .. } => Some(residual),
            _ => None,
        }
    }

    fn aux(self) -> Option<(u64, i64)> {
        match self {
            Self::GeluAuxBias { aux, ld, .. } | Self::DGelu { aux, ld } => Some((aux, ld)),
            _ => None,
        }
    }
}

/// cuBLASLt's type for a GEMM operand of a non-FP8 GEMM.
pub(crate) fn float_type(d: DType) -> Option<cudaDataType> {
    out_type(d)
}

/// A cuBLASLt handle and its workspace, created on the first FP8 GEMM, and the algorithms the
/// heuristic picked per problem (asked once per shape, not on every call).
pub(crate) struct BlasLt {
    handle: ltsys::cublasLtHandle_t,
    workspace: DeviceMemory,
    /// The two inverse scales of the current GEMM, copied to 256-byte aligned addresses (byte 0
    /// and byte 256) when they are not aligned themselves: cuBLASLt refuses
    /// (CUBLAS_STATUS_NOT_SUPPORTED) scale pointers 4 bytes apart. Scales laid out
    /// [`SCALE_ALIGN`] bytes apart ([`duet_device::Capabilities::fp8_scale_inv_stride`]) are read in
    /// place, with no copy (two graph nodes less per GEMM).
    scales: DeviceMemory,
    /// `DUET_CUDA_FP8_SCALE_COPY` at creation
    /// ([`duet_device::knobs::Knobs::cuda_fp8_scale_copy`]): copy even aligned scales (A/B
    /// comparisons).
    copy_scales: bool,
    /// `DUET_GEMM_AUTOTUNE_LOG` at creation ([`duet_device::knobs::Knobs::gemm_autotune_log`]):
    /// print each autotuned GEMM's candidate timings and choice on stderr.
    tune_log: bool,
    algos: HashMap<AlgoKey, ltsys::cublasLtMatmulAlgo_t>,
    /// Whether a new shape may be autotuned now (set by the device before each call: only
    /// when autotuning is on and no graph is being recorded).
    pub(crate) may_tune: bool,
    ctx: Arc<CudaContext>,
    mem: Arc<MemTracker>,
}

// SAFETY: the handle is used only under the device's mutex (one thread at a time), and
// cuBLASLt handles may be used from any thread as long as calls do not overlap.
unsafe impl Send for BlasLt {}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // SAFETY: the handle was created by cublasLtCreate and is destroyed only here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// Destroys cuBLASLt descriptors when dropped.
struct Descs {
    matmul: Option<ltsys::cublasLtMatmulDesc_t>,
    layouts: Vec<ltsys::cublasLtMatrixLayout_t>,
    pref: Option<ltsys::cublasLtMatmulPreference_t>,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: every descriptor here was created by the matching cublasLt*Create call and is
        // destroyed exactly once.
        unsafe {
            if let Some(m) = self.matmul {
                let _ = lt::destroy_matmul_desc(m);
            }
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            if let Some(p) = self.pref {
                let _ = lt::destroy_matmul_pref(p);
            }
        }
    }
}

/// Checks everything an FP8 GEMM needs that the descriptor alone cannot show.
#[allow(clippy::too_many_arguments)]
pub(crate) fn validate(
    desc: &GemmDesc,
    a: &CudaBuffer,
    b: &CudaBuffer,
    _c: &CudaBuffer,
    _scale_inv: &CudaBuffer,
    _a_slot: usize,
    _b_slot: usize,
    cc: i32,
) -> Result<()> {
    const OP: &str = "gemm_fp8";
    // The contract (FP8 operands of one family, a float C, the scale_inv slots, the lengths)
    // was checked by `Check` for GemmFp8 / GemmFp8Epilogue; here what cuBLASLt takes.
    for x in [a, b] {
        if fp8_type(x.dtype()).is_none() {
            return Err(DeviceError::Unsupported {
                op: format!("{OP} on CUDA (cuBLASLt has OCP FP8 types only, no FNUZ)"),
                dtype: x.dtype(),
            });
        }
    }
    if a.dtype() == DType::F8E5M2 && b.dtype() == DType::F8E5M2 {
        return Err(DeviceError::Unsupported {
            op: format!("{OP} (cuBLASLt has no E5M2 × E5M2 matmul)"),
            dtype: a.dtype(),
        });
    }
    if cc < 89 {
        return Err(DeviceError::Unsupported {
            op: format!("{OP} (FP8 tensor cores need sm_89+, this GPU is sm_{cc})"),
            dtype: a.dtype(),
        });
    }
    let layout_err = |what: String| {
        Err(DeviceError::InvalidArgument(format!(
            "{OP}: {what} (cuBLASLt FP8 on sm_89/sm_90)"
        )))
    };
    if desc.trans_a || !desc.trans_b {
        return layout_err(
            "needs trans_a = false and trans_b = true (both operands K-major, \"TN\")".into(),
        );
    }
    if desc.batch != 1 {
        return layout_err(format!(
            "batched FP8 GEMMs are not supported (batch {})",
            desc.batch
        ));
    }
    if !(desc.lda.is_multiple_of(16) && desc.ldb.is_multiple_of(16) && desc.k.is_multiple_of(16)) {
        return layout_err(format!(
            "lda {}, ldb {} and k {} must be multiples of 16",
            desc.lda, desc.ldb, desc.k
        ));
    }
    if !(desc.a_offset.is_multiple_of(16) && desc.b_offset.is_multiple_of(16)) {
        return layout_err("operand offsets must be multiples of 16 elements".into());
    }
    Ok(())
}

impl BlasLt {
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        cc: i32,
        mem: &Arc<MemTracker>,
    ) -> Result<Self> {
        let knobs = duet_device::knobs::device_knobs()?;
        let handle = lt::create_handle().map_err(|e| lt_err("cublasLtCreate", e))?;
        let bytes = if cc >= 90 {
            WORKSPACE_HOPPER
        } else {
            WORKSPACE_OTHER
        };
        let workspace = match DeviceMemory::zeroed(ctx, stream, bytes, mem) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created just above, not used anywhere else.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(e);
            }
        };
        let scales = match DeviceMemory::zeroed(ctx, stream, 512, mem) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: created just above, not used anywhere else.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(e);
            }
        };
        Ok(Self {
            handle,
            workspace,
            scales,
            copy_scales: knobs.cuda_fp8_scale_copy,
            tune_log: knobs.gemm_autotune_log,
            algos: HashMap::new(),
            may_tune: false,
            ctx: Arc::clone(ctx),
            mem: Arc::clone(mem),
        })
    }

    /// Runs one FP8 GEMM (arguments checked by [`validate`] first) with `epilogue`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_fp8(
        &mut self,
        stream: &Arc<CudaStream>,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        scale_inv: &CudaBuffer,
        (a_slot, b_slot): (usize, usize),
        epilogue: LtEpilogue,
    ) -> Result<()> {
        let types = (
            fp8_type(a.dtype()).expect("validated"),
            fp8_type(b.dtype()).expect("validated"),
        );
        let scales = (scale_inv.ptr_at(a_slot), scale_inv.ptr_at(b_slot));
        self.matmul(stream, desc, a, b, c, types, Some(scales), epilogue)
    }

    /// One GEMM through cuBLASLt: `types` are cuBLASLt's types of duet's A and B; `scales`
    /// the device addresses of the inverse scales of A and B (FP8); `epilogue` what follows
    /// the product. Arguments are checked by the caller.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &mut self,
        stream: &Arc<CudaStream>,
        desc: &GemmDesc,
        a: &CudaBuffer,
        b: &CudaBuffer,
        c: &mut CudaBuffer,
        types: (cudaDataType, cudaDataType),
        scales: Option<(u64, u64)>,
        epilogue: LtEpilogue,
    ) -> Result<()> {
        if desc.m == 0 || desc.n == 0 {
            return Ok(());
        }
        let g = conv::col_major_gemm(desc)?;
        // cuBLASLt's A is duet's B (stored column-major with ld = ldb, op = trans_b), its B is
        // duet's A (ld = lda, op = trans_a); C/D is n × m with ld = ldc.
        let (b_type, a_type) = types;
        let c_type = out_type(c.dtype()).ok_or_else(|| DeviceError::Unsupported {
            op: "cuBLASLt matmul output".into(),
            dtype: c.dtype(),
        })?;
        let (m, n, k) = (g.m as u64, g.n as u64, g.k as u64);
        let mut d = Descs {
            matmul: None,
            layouts: Vec::with_capacity(3),
            pref: None,
        };
        d.matmul = Some(
            lt::create_matmul_desc(
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cudaDataType::CUDA_R_32F,
            )
            .map_err(|e| lt_err("cublasLtMatmulDescCreate", e))?,
        );
        let md = d.matmul.expect("set above");
        let set = |attr: DescAttr, ptr: *const c_void, size: usize, what: &str| {
            // SAFETY: `md` is a live descriptor; `ptr` points to `size` readable bytes of the
            // type cuBLASLt documents for `attr` (checked at each call site below).
            unsafe { lt::set_matmul_desc_attribute(md, attr, ptr, size) }
                .map_err(|e| lt_err(&format!("cublasLtMatmulDescSetAttribute({what})"), e))
        };
        let transa = g.transa as i32;
        let transb = g.transb as i32;
        // TRANSA/TRANSB: int32 cublasOperation_t.
        set(
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSA,
            (&transa as *const i32).cast(),
            4,
            "TRANSA",
        )?;
        set(
            DescAttr::CUBLASLT_MATMUL_DESC_TRANSB,
            (&transb as *const i32).cast(),
            4,
            "TRANSB",
        )?;
        if let Some((sa, sb)) = scales {
            // Scale pointers: a `const float*` device address each, passed by value (8 bytes),
            // pointing at the slots themselves when both are aligned, else at aligned copies
            // (stream-ordered before the matmul).
            let in_place = sa % SCALE_ALIGN == 0 && sb % SCALE_ALIGN == 0;
            let (a_scale, b_scale) = if in_place && !self.copy_scales {
                (sb, sa)
            } else {
                let copies = (self.scales.ptr(), self.scales.ptr() + SCALE_ALIGN);
                for (dst, src) in [(copies.0, sb), (copies.1, sa)] {
                    // SAFETY: the caller checked that both sources are f32 slots inside a live
                    // buffer; `dst` is one of two 4-byte places inside the live 512-byte
                    // `scales` allocation; the copy is ordered on the device's stream like the
                    // matmul.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(dst, src, 4, stream.cu_stream())
                    }
                    .map_err(|e| crate::error::driver("cuMemcpyDtoDAsync", e))?;
                }
                copies
            };
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                (&a_scale as *const u64).cast(),
                8,
                "A_SCALE_POINTER",
            )?;
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                (&b_scale as *const u64).cast(),
                8,
                "B_SCALE_POINTER",
            )?;
            if desc.fp8_fast_accum {
                // FAST_ACCUM: int8.
                let v: i8 = 1;
                set(
                    DescAttr::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                    (&v as *const i8).cast(),
                    1,
                    "FAST_ACCUM",
                )?;
            }
        }
        let epi = epilogue.code() as u32;
        if epilogue.code() != ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT {
            // EPILOGUE: uint32 cublasLtEpilogue_t.
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epi as *const u32).cast(),
                4,
                "EPILOGUE",
            )?;
        }
        if let Some((bias, dtype)) = epilogue.bias() {
            let bt = out_type(dtype).ok_or_else(|| DeviceError::Unsupported {
                op: "cuBLASLt bias".into(),
                dtype,
            })? as i32;
            // BIAS_POINTER: a device address by value; BIAS_DATA_TYPE: int32 cudaDataType.
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&bias as *const u64).cast(),
                8,
                "BIAS_POINTER",
            )?;
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                (&bt as *const i32).cast(),
                4,
                "BIAS_DATA_TYPE",
            )?;
        }
        if let Some((aux, ld)) = epilogue.aux() {
            // EPILOGUE_AUX_POINTER: a device address by value; EPILOGUE_AUX_LD: int64.
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                (&aux as *const u64).cast(),
                8,
                "EPILOGUE_AUX_POINTER",
            )?;
            set(
                DescAttr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                (&ld as *const i64).cast(),
                8,
                "EPILOGUE_AUX_LD",
            )?;
        }
        let layout = |t: cudaDataType, rows: u64, cols: u64, ld: i32| {
            lt::create_matrix_layout(t, rows, cols, ld as i64)
                .map_err(|e| lt_err("cublasLtMatrixLayoutCreate", e))
        };
        let (ta, tb) = (
            g.transa == cublasOperation_t::CUBLAS_OP_T,
            g.transb == cublasOperation_t::CUBLAS_OP_T,
        );
        // Stored shapes (rows × cols, column-major): op(A') is m × k, op(B') is k × n.
        let (ar, ac) = if ta { (k, m) } else { (m, k) };
        let (br, bc) = if tb { (n, k) } else { (k, n) };
        d.layouts.push(layout(a_type, ar, ac, g.lda)?);
        d.layouts.push(layout(b_type, br, bc, g.ldb)?);
        d.layouts.push(layout(c_type, m, n, g.ldc)?);
        let (la, lb, lc) = (d.layouts[0], d.layouts[1], d.layouts[2]);
        let key = AlgoKey {
            m: g.m,
            n: g.n,
            k: g.k,
            lda: g.lda,
            ldb: g.ldb,
            ldc: g.ldc,
            types: (a.dtype(), b.dtype(), c.dtype()),
            accumulate: desc.beta != 0.0 || epilogue.residual().is_some(),
            fast_accum: desc.fp8_fast_accum && scales.is_some(),
            trans: (ta, tb),
            epilogue: (epi, epilogue.bias().map_or(DType::F32, |(_, d)| d)),
        };
        let ws = self.workspace.bytes() as u64;
        let cptr = c.ptr_at(desc.c_offset);
        // C (read when beta ≠ 0) and D (written): one buffer, or a separate residual as C
        // (beta 1).
        let alpha = desc.alpha;
        let beta = if epilogue.residual().is_some() {
            1.0f32
        } else {
            desc.beta
        };
        let c_in = epilogue.residual().unwrap_or(cptr);
        let (handle, wsp) = (self.handle, self.workspace.ptr());
        let run = |algo: &ltsys::cublasLtMatmulAlgo_t| {
            // SAFETY: `validate` checked the dtypes, the layout rules and that every operand
            // range lies inside its (live) buffer; the layouts above describe exactly those
            // ranges (A' = duet's B at b_offset, B' = duet's A at a_offset, D = duet's C at
            // c_offset, C = D or the residual the caller checked has C's extent); the scale pointers address slots inside `scale_inv`; alpha/beta are
            // host f32 values (the default host pointer mode with an f32 scale type); the
            // workspace is a live allocation of `ws` bytes, 256-byte aligned like every
            // allocation; `algo` came from the heuristic for these descriptors; the stream is
            // the device's stream, so the matmul is ordered with every other op.
            unsafe {
                lt::matmul(
                    handle,
                    md,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    b.ptr_at(desc.b_offset) as *const c_void,
                    la,
                    a.ptr_at(desc.a_offset) as *const c_void,
                    lb,
                    c_in as *const c_void,
                    lc,
                    cptr as *mut c_void,
                    lc,
                    algo,
                    wsp as *mut c_void,
                    ws as usize,
                    stream.cu_stream() as ltsys::cudaStream_t,
                )
            }
        };
        let what = || {
            format!(
                "cublasLtMatmul (m {} n {} k {}, {} × {} → {}, beta {}, epilogue {:?})",
                desc.m,
                desc.n,
                desc.k,
                a.dtype(),
                b.dtype(),
                c.dtype(),
                desc.beta,
                epilogue.code()
            )
        };
        if let Some(algo) = self.algos.get(&key) {
            return run(algo).map_err(|e| lt_err(&what(), e));
        }
        d.pref = Some(
            lt::create_matmul_pref().map_err(|e| lt_err("cublasLtMatmulPreferenceCreate", e))?,
        );
        let pref = d.pref.expect("set above");
        // SAFETY: live preference descriptor; MAX_WORKSPACE_BYTES takes a uint64.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                PrefAttr::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
        }
        .map_err(|e| lt_err("cublasLtMatmulPreferenceSetAttribute", e))?;
        // The heuristic's candidates, best first. A candidate the matmul then refuses (seen as
        // CUBLAS_STATUS_NOT_SUPPORTED at launch, which enqueues nothing) is skipped; the first
        // that runs is cached for this shape.
        // SAFETY: the result array is plain old data that the call fills (the first `count`
        // entries); the count out-parameter is a plain int.
        let mut results: [ltsys::cublasLtMatmulHeuristicResult_t; HEURISTIC_CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut count: std::ffi::c_int = 0;
        // SAFETY: every descriptor is live and describes the buffers of this matmul; `results`
        // holds HEURISTIC_CANDIDATES entries.
        unsafe {
            ltsys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                md,
                la,
                lb,
                lc,
                lc,
                pref,
                HEURISTIC_CANDIDATES as std::ffi::c_int,
                results.as_mut_ptr(),
                &mut count,
            )
        }
        .result()
        .map_err(|e| lt_err("cublasLtMatmulAlgoGetHeuristic", lt::CublasError(e.0)))?;
        let candidates = &results[..(count.max(0) as usize).min(HEURISTIC_CANDIDATES)];
        if self.may_tune && candidates.len() > 1 {
            let (c_ptr, c_bytes) = (c.ptr(), c.size_bytes());
            let best = tune(
                &self.ctx,
                stream,
                &self.mem,
                candidates,
                (beta != 0.0 && c_in == cptr).then_some((c_ptr, c_bytes)),
                &run,
                self.tune_log,
            )
            .map_err(|e| match e {
                TuneError::Lt(e) => lt_err(&what(), e),
                TuneError::Other(e) => e,
            })?;
            if let Some(i) = best {
                run(&candidates[i].algo).map_err(|e| lt_err(&what(), e))?;
                if self.tune_log {
                    eprintln!(
                        "gemm autotune: {} -> candidate {i} of {}",
                        what(),
                        candidates.len()
                    );
                }
                self.algos.insert(key, candidates[i].algo);
                return Ok(());
            }
        }
        let mut last = lt::CublasError(ltsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED);
        for h in candidates {
            match run(&h.algo) {
                Ok(()) => {
                    self.algos.insert(key, h.algo);
                    return Ok(());
                }
                Err(e) if e.0 == ltsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => last = e,
                Err(e) => return Err(lt_err(&what(), e)),
            }
        }
        Err(lt_err(
            &format!("{} ({} heuristic candidates)", what(), candidates.len()),
            last,
        ))
    }
}

enum TuneError {
    Lt(lt::CublasError),
    Other(DeviceError),
}

/// Times every candidate (one untimed run, then [`TUNE_REPS`] between two events) and returns
/// the fastest's index (None when none runs). `accumulate`: the address and size of C when the
/// GEMM reads it (beta ≠ 0); C is saved first and restored afterwards, so the trial runs leave
/// no trace. Outputs the GEMM only writes (D with beta = 0, the GELU pre-activation, the bias
/// gradient) are rewritten by the caller's final run. `log`: print each candidate's time.
fn tune(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    mem: &Arc<MemTracker>,
    candidates: &[ltsys::cublasLtMatmulHeuristicResult_t],
    accumulate: Option<(u64, usize)>,
    run: &dyn Fn(&ltsys::cublasLtMatmulAlgo_t) -> std::result::Result<(), lt::CublasError>,
    log: bool,
) -> std::result::Result<Option<usize>, TuneError> {
    let drv = |call: &'static str| {
        move |e: cudarc::driver::DriverError| TuneError::Other(crate::error::driver(call, e))
    };
    let copy = |dst: u64, src: u64, bytes: usize| {
        // SAFETY: both ranges are live device allocations of at least `bytes` bytes (C, and
        // the backup made for it below); the copy is ordered on the GEMM's stream.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(drv("cuMemcpyDtoDAsync"))
    };
    let backup = match accumulate {
        Some((c, bytes)) => {
            let b = DeviceMemory::zeroed(ctx, stream, bytes, mem).map_err(TuneError::Other)?;
            copy(b.ptr(), c, bytes)?;
            Some((b, c, bytes))
        }
        None => None,
    };
    let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
    let end = ctx.new_event(timed).map_err(drv("cuEventCreate"))?;
    let mut best: Option<(usize, f32)> = None;
    for (i, h) in candidates.iter().enumerate() {
        match run(&h.algo) {
            Ok(()) => {}
            Err(e) if e.0 == ltsys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED => continue,
            Err(e) => return Err(TuneError::Lt(e)),
        }
        start.record(stream).map_err(drv("cuEventRecord"))?;
        for _ in 0..TUNE_REPS {
            run(&h.algo).map_err(TuneError::Lt)?;
        }
        end.record(stream).map_err(drv("cuEventRecord"))?;
        end.synchronize().map_err(drv("cuEventSynchronize"))?;
        let ms = start.elapsed_ms(&end).map_err(drv("cuEventElapsedTime"))?;
        if log {
            eprintln!(
                "gemm autotune:   candidate {i}: {:.1} us",
                ms * 1e3 / TUNE_REPS as f32
            );
        }
        if best.is_none_or(|(_, b)| ms < b) {
            best = Some((i, ms));
        }
    }
    if let Some((b, c, bytes)) = &backup {
        copy(*c, b.ptr(), *bytes)?;
        // The backup is freed when dropped: wait until the restore has read it.
        stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
    }
    Ok(best.map(|(i, _)| i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_types_are_ocp_only() {
        assert_eq!(fp8_type(DType::F8E4M3), Some(cudaDataType::CUDA_R_8F_E4M3));
        assert_eq!(fp8_type(DType::F8E5M2), Some(cudaDataType::CUDA_R_8F_E5M2));
        assert_eq!(fp8_type(DType::F8E4M3Fnuz), None);
        assert_eq!(out_type(DType::BF16), Some(cudaDataType::CUDA_R_16BF));
        assert_eq!(out_type(DType::F8E4M3), None);
    }
}
