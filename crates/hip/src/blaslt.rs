//! 16-bit GEMMs with fused epilogues through hipBLASLt (f32 compute and scale type): the HIP
//! counterpart of crates/cuda blaslt.rs's `matmul` with an `LtEpilogue`. The FP8 GEMMs and the
//! hipBLASLt state (handle, workspace, plan cache) are in blas.rs.
//!
//! duet's row-major `C = op(A)·op(B)` becomes the column-major `Cᵀ = op(B)ᵀ·op(A)ᵀ` as for
//! rocBLAS ([`conv::col_major`]): hipBLASLt's A is duet's B and its B duet's A, so a bias per
//! column of duet's C is hipBLASLt's bias per row of D, and BGRADB (the column sums of
//! hipBLASLt's op(B), over k) is the row sum of duet's op(A). The epilogues and their attributes
//! are cuBLASLt's, with the same values (hipBLASLt `hipblaslt.h`, ROCm 6.4 and 7.2).
//!
//! The descriptors and the algorithm are built once per [`PlanKey`] (shape, layout, types,
//! beta, epilogue code, bias type, auxiliary leading dimension) and kept in the handle's
//! [`crate::blas::PlanCache`]; a key hipBLASLt has no algorithm for, or whose algorithm it
//! refuses at launch, is remembered as such and reported as [`Outcome::NoAlgorithm`] (the caller
//! then runs the composition).

use crate::blas::{LT_WORKSPACE, Lt, plan_key};
use crate::conv;
use crate::error::HipError;
use crate::hipblaslt::safe::{EpilogueKey, PlanKey, Ptrs};
use crate::hipblaslt::sys as ltsys;
use crate::memory::HipBuffer;
use duet_device::{Buffer, DType, DeviceError, GemmDesc, Result};
use std::ffi::c_void;

/// The epilogue of a [`matmul`], in hipBLASLt's terms (device addresses).
#[derive(Clone, Copy, Debug)]
pub(crate) enum LtEpilogue {
    Bias {
        bias: *const c_void,
        dtype: DType,
    },
    /// The bias, and C read from `residual` (beta 1) while D is written.
    BiasResidual {
        bias: *const c_void,
        dtype: DType,
        residual: *const c_void,
    },
    GeluAuxBias {
        bias: *const c_void,
        dtype: DType,
        aux: *const c_void,
        ld: i64,
    },
    DGelu {
        aux: *const c_void,
        ld: i64,
    },
    /// Bias gradient of hipBLASLt's B (duet's A) reduced over k, written to `bias`.
    BGradB {
        bias: *const c_void,
        dtype: DType,
    },
}

impl LtEpilogue {
    pub(crate) fn code(self) -> u32 {
        match self {
            Self::Bias { .. } | Self::BiasResidual { .. } => ltsys::HIPBLASLT_EPILOGUE_BIAS,
            Self::GeluAuxBias { .. } => ltsys::HIPBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Self::DGelu { .. } => ltsys::HIPBLASLT_EPILOGUE_DGELU,
            Self::BGradB { .. } => ltsys::HIPBLASLT_EPILOGUE_BGRADB,
        }
    }

    fn bias(self) -> Option<(*const c_void, DType)> {
        match self {
            Self::Bias { bias, dtype }
            | Self::BiasResidual { bias, dtype, .. }
            | Self::GeluAuxBias { bias, dtype, .. }
            | Self::BGradB { bias, dtype } => Some((bias, dtype)),
            _ => None,
        }
    }

    /// Where C is read from when that is not D.
    fn residual(self) -> Option<*const c_void> {
        match self {
            Self::BiasResidual { residual, .. } => Some(residual),
            _ => None,
        }
    }

    fn aux(self) -> Option<(*const c_void, i64)> {
        match self {
            Self::GeluAuxBias { aux, ld, .. } | Self::DGelu { aux, ld } => Some((aux, ld)),
            _ => None,
        }
    }

    /// The plan-key part: the code, the bias type, the auxiliary leading dimension.
    pub(crate) fn key(self) -> Result<EpilogueKey> {
        let bias_type = match self.bias() {
            Some((_, d)) => Some(
                conv::hip_data_type(d)
                    .filter(|_| matches!(d, DType::F32 | DType::F16 | DType::BF16))
                    .ok_or_else(|| DeviceError::Unsupported {
                        op: "hipBLASLt bias".into(),
                        dtype: d,
                    })?,
            ),
            None => None,
        };
        Ok(EpilogueKey {
            code: self.code(),
            bias_type,
            aux_ld: self.aux().map(|(_, ld)| ld),
        })
    }
}

/// What a [`matmul`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ran,
    /// hipBLASLt has no algorithm for this key (the heuristic found none, or the matmul refused
    /// the one it found): nothing was enqueued, and the key is not asked again.
    NoAlgorithm,
}

/// The [`PlanKey`] of a 16-bit `desc` (A and B of `ab`, C of `c`) with `epilogue`. When the
/// epilogue reads a separate C (the residual), beta is 1 and the key accumulates.
pub(crate) fn epilogue_plan_key(
    desc: &GemmDesc,
    ab: DType,
    c: DType,
    epilogue: LtEpilogue,
) -> Result<PlanKey> {
    let mut key = plan_key(desc, (ab, ab, c), false, epilogue.key()?)?;
    key.accumulate |= epilogue.residual().is_some();
    Ok(key)
}

/// One 16-bit GEMM through hipBLASLt with `epilogue` (arguments checked by the caller:
/// dtypes, lengths, the bias, residual and auxiliary extents; batch 1).
pub(crate) fn matmul(
    lt: &mut Lt,
    stream: crate::hip::sys::hipStream_t,
    desc: &GemmDesc,
    a: &HipBuffer,
    b: &HipBuffer,
    c: &mut HipBuffer,
    epilogue: LtEpilogue,
) -> Result<Outcome> {
    if desc.m == 0 || desc.n == 0 {
        return Ok(Outcome::Ran);
    }
    let key = epilogue_plan_key(desc, a.dtype(), c.dtype(), epilogue)?;
    let d = c.ptr_at(desc.c_offset);
    let beta = if epilogue.residual().is_some() {
        1.0f32
    } else {
        desc.beta
    };
    let ptrs = Ptrs {
        // hipBLASLt's A is duet's B and vice versa.
        a: b.ptr_at(desc.b_offset),
        b: a.ptr_at(desc.a_offset),
        c: epilogue.residual().unwrap_or(d),
        d,
        a_scale: std::ptr::null(),
        b_scale: std::ptr::null(),
        bias: epilogue.bias().map_or(std::ptr::null(), |(p, _)| p),
        aux: epilogue.aux().map_or(std::ptr::null(), |(p, _)| p),
        workspace: lt.workspace.ptr(),
        workspace_size: LT_WORKSPACE,
    };
    let Lt { handle, plans, .. } = lt;
    let Some(plan) = plans.get(handle, &key, LT_WORKSPACE, &ptrs)? else {
        return Ok(Outcome::NoAlgorithm);
    };
    // SAFETY: the caller checked the dtypes and that every operand range lies inside its live
    // buffer (A' = duet's B at b_offset, B' = duet's A at a_offset, D = duet's C at c_offset, C =
    // D or the residual of C's extent, the auxiliary matrix of C's extent at ldc, the bias of
    // one value per column of duet's C or, for BGRADB, per row); the plan was built for this
    // key; the workspace is a live LT_WORKSPACE-byte buffer; the stream is the device's.
    match unsafe { handle.run(plan, desc.alpha, beta, &ptrs, stream) } {
        Ok(()) => Ok(Outcome::Ran),
        Err(HipError::Lt { status, .. }) if status == ltsys::HIPBLAS_STATUS_NOT_SUPPORTED => {
            plans.refuse(&key);
            Ok(Outcome::NoAlgorithm)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blas::PlanCache;
    use crate::hipblaslt::result::LtApi;
    use crate::hipblaslt::safe::LtHandle;
    use crate::hipblaslt::sys::HipblasLtLib;
    use std::sync::Arc;

    fn p(addr: usize) -> *const c_void {
        std::ptr::without_provenance(addr)
    }

    fn bias(dtype: DType) -> LtEpilogue {
        LtEpilogue::Bias { bias: p(64), dtype }
    }

    fn key(desc: &GemmDesc, c: DType, e: LtEpilogue) -> PlanKey {
        epilogue_plan_key(desc, DType::BF16, c, e).unwrap()
    }

    #[test]
    fn epilogue_plan_keys_separate_code_bias_type_and_aux_ld() {
        let d = GemmDesc::new(false, true, 96, 136, 64);
        let k = key(&d, DType::BF16, bias(DType::F32));
        assert_eq!(
            k.epilogue,
            EpilogueKey {
                code: ltsys::HIPBLASLT_EPILOGUE_BIAS,
                bias_type: Some(ltsys::HIP_R_32F),
                aux_ld: None,
            }
        );
        assert!(!k.scaled && !k.accumulate);
        // hipBLASLt's A is duet's B (column-major swap); D is n × m.
        assert_eq!((k.a.ty, k.c.rows, k.c.cols), (ltsys::HIP_R_16BF, 136, 96));
        // The pointers are per call.
        assert_eq!(
            k,
            key(
                &d,
                DType::BF16,
                LtEpilogue::Bias {
                    bias: p(4096),
                    dtype: DType::F32
                }
            )
        );
        let gelu = |ld| LtEpilogue::GeluAuxBias {
            bias: p(64),
            dtype: DType::BF16,
            aux: p(128),
            ld,
        };
        let residual = key(
            &d,
            DType::BF16,
            LtEpilogue::BiasResidual {
                bias: p(64),
                dtype: DType::F32,
                residual: p(256),
            },
        );
        // Bias + residual is the bias epilogue reading C from the residual (beta 1).
        assert_eq!(residual.epilogue, k.epilogue);
        assert!(residual.accumulate);
        let mut beta = d;
        beta.beta = 1.0;
        let dgelu = key(&d, DType::BF16, LtEpilogue::DGelu { aux: p(8), ld: 136 });
        assert_eq!(
            (
                dgelu.epilogue.code,
                dgelu.epilogue.bias_type,
                dgelu.epilogue.aux_ld
            ),
            (ltsys::HIPBLASLT_EPILOGUE_DGELU, None, Some(136))
        );
        let g = key(&d, DType::BF16, gelu(136));
        assert_eq!(
            (g.epilogue.code, g.epilogue.bias_type, g.epilogue.aux_ld),
            (
                ltsys::HIPBLASLT_EPILOGUE_GELU_AUX_BIAS,
                Some(ltsys::HIP_R_16BF),
                Some(136)
            )
        );
        let w = GemmDesc::new(true, false, 136, 64, 96).beta(1.0);
        let bgrad = key(
            &w,
            DType::F32,
            LtEpilogue::BGradB {
                bias: p(8),
                dtype: DType::F32,
            },
        );
        assert_eq!(
            (
                bgrad.epilogue.code,
                bgrad.epilogue.bias_type,
                bgrad.accumulate
            ),
            (
                ltsys::HIPBLASLT_EPILOGUE_BGRADB,
                Some(ltsys::HIP_R_32F),
                true
            )
        );
        // ... which is the plan of the bias epilogue with beta 1 (C read; where from is per
        // call).
        assert_eq!(residual, key(&beta, DType::BF16, bias(DType::F32)));
        let others = [
            key(&d, DType::BF16, bias(DType::BF16)),
            key(&d, DType::F32, bias(DType::F32)),
            key(&beta, DType::BF16, bias(DType::F32)),
            dgelu,
            g,
            key(&d, DType::BF16, gelu(144)),
            epilogue_plan_key(&d, DType::F16, DType::F16, bias(DType::F32)).unwrap(),
            crate::blas::fp8_plan_key(&d, DType::BF16, DType::BF16, DType::BF16).unwrap(),
        ];
        for (i, o) in others.iter().enumerate() {
            assert_ne!(&k, o, "{i}");
            for o2 in &others[i + 1..] {
                assert_ne!(o, o2);
            }
        }
        // No FP8 or integer bias.
        assert!(epilogue_plan_key(&d, DType::BF16, DType::BF16, bias(DType::F8E4M3)).is_err());
    }

    /// A fake hipBLASLt recording what is set on the last descriptor (epilogue, bias type,
    /// bias and auxiliary pointers, auxiliary ld) and what each matmul got (C, D); its
    /// heuristic finds nothing for an epilogue of 192 (DGELU) and its matmul refuses 512
    /// (BGRADB) with HIPBLAS_STATUS_NOT_SUPPORTED.
    const FAKE: &str = r#"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef struct { uint32_t epi; int32_t bias_type; const void* bias; const void* aux; int64_t ld;
                 const void* sa; } desc_t;
static desc_t last;
static int heuristics = 0, matmuls = 0;
static const void *last_c, *last_d;
static float last_beta;
long fake_heuristics(void) { return heuristics; }
long fake_matmuls(void) { return matmuls; }
long fake_epi(void) { return last.epi; }
long fake_bias_type(void) { return last.bias_type; }
long fake_bias(void) { return (long)(intptr_t)last.bias; }
long fake_aux(void) { return (long)(intptr_t)last.aux; }
long fake_ld(void) { return (long)last.ld; }
long fake_scale(void) { return (long)(intptr_t)last.sa; }
long fake_c(void) { return (long)(intptr_t)last_c; }
long fake_d(void) { return (long)(intptr_t)last_d; }
long fake_beta_is_one(void) { return last_beta == 1.0f; }
unsigned hipblasLtCreate(void** h) { *h = malloc(8); return 0; }
unsigned hipblasLtDestroy(void* h) { free(h); return 0; }
unsigned hipblasLtMatrixLayoutCreate(void** l, unsigned t, uint64_t r, uint64_t c, int64_t ld) {
    (void)t; (void)r; (void)c; (void)ld; *l = malloc(8); return 0;
}
unsigned hipblasLtMatrixLayoutDestroy(void* l) { free(l); return 0; }
unsigned hipblasLtMatmulDescCreate(void** d, unsigned c, unsigned s) {
    (void)c; (void)s; desc_t* x = calloc(1, sizeof(desc_t)); x->epi = 1; *d = x; return 0;
}
unsigned hipblasLtMatmulDescDestroy(void* d) { free(d); return 0; }
unsigned hipblasLtMatmulDescSetAttribute(void* d, unsigned attr, const void* buf, size_t n) {
    desc_t* x = d;
    switch (attr) {
        case 2: if (n != 4) return 3; memcpy(&x->epi, buf, 4); break;
        case 3: if (n != 8) return 3; memcpy(&x->bias, buf, 8); break;
        case 4: if (n != 4) return 3; memcpy(&x->bias_type, buf, 4); break;
        case 5: if (n != 8) return 3; memcpy(&x->sa, buf, 8); break;
        case 10: if (n != 8) return 3; memcpy(&x->aux, buf, 8); break;
        case 11: if (n != 8) return 3; memcpy(&x->ld, buf, 8); break;
        case 0: case 1: case 6: break;
        default: return 7;
    }
    last = *x;
    return 0;
}
unsigned hipblasLtMatmulPreferenceCreate(void** p) { *p = malloc(8); return 0; }
unsigned hipblasLtMatmulPreferenceDestroy(void* p) { free(p); return 0; }
unsigned hipblasLtMatmulAlgoGetHeuristic(void* h, desc_t* d, void* a, void* b, void* c, void* dd,
        void* p, int req, void* results, int* count) {
    (void)h; (void)a; (void)b; (void)c; (void)dd; (void)p; (void)req; (void)results;
    heuristics++;
    *count = d->epi == 192 ? 0 : 1;
    return 0;
}
unsigned hipblasLtMatmul(void* h, desc_t* desc, const float* alpha, const void* a, void* la,
        const void* b, void* lb, const float* beta, const void* c, void* lc, void* d, void* ld,
        const void* algo, void* ws, size_t wss, void* stream) {
    (void)h; (void)alpha; (void)a; (void)la; (void)b; (void)lb; (void)lc; (void)ld; (void)algo;
    (void)ws; (void)wss; (void)stream;
    last = *desc; last_c = c; last_d = d; last_beta = *beta;
    if (desc->epi == 512) return 7;
    matmuls++;
    return 0;
}
"#;

    #[test]
    fn epilogue_plans_set_their_attributes_and_remember_refusals() {
        let Some(path) = crate::test_support::fake_library("lt-epi", FAKE, HipblasLtLib::SYMBOLS)
        else {
            panic!("needs a C compiler (cc) to build the fake hipBLASLt");
        };
        let name = path.to_string_lossy().into_owned();
        let lib = crate::loader::open_pinned(&name).unwrap();
        // SAFETY: the fake defines every function the test calls with hipBLASLt's signatures.
        let api = Arc::new(unsafe { LtApi::from_library(lib, &name) }.unwrap());
        let read = |sym: &[u8]| {
            let lib = crate::loader::open_pinned(&name).unwrap();
            // SAFETY: `long f(void)` readers of the fake (64-bit long on Linux).
            unsafe { (*lib.get::<unsafe extern "C" fn() -> i64>(sym).unwrap())() }
        };
        let handle = LtHandle::new(api).unwrap();
        let mut cache = PlanCache::default();
        let ptrs = |bias: usize, aux: usize, c: usize| Ptrs {
            a: p(16),
            b: p(32),
            c: p(c),
            d: p(4096) as *mut c_void,
            a_scale: std::ptr::null(),
            b_scale: std::ptr::null(),
            bias: p(bias),
            aux: p(aux),
            workspace: p(8192) as *mut c_void,
            workspace_size: LT_WORKSPACE,
        };
        let d = GemmDesc::new(false, true, 96, 136, 64);
        let gelu = LtEpilogue::GeluAuxBias {
            bias: p(64),
            dtype: DType::F32,
            aux: p(128),
            ld: 136,
        };
        let k = key(&d, DType::BF16, gelu);
        // The first call builds the plan with its pointers; a later one sets its own.
        for (bias, aux) in [(64, 128), (640, 1280)] {
            let ptrs = ptrs(bias, aux, 4096);
            let plan = cache
                .get(&handle, &k, LT_WORKSPACE, &ptrs)
                .unwrap()
                .expect("an algorithm");
            // SAFETY: the fake reads nothing through the pointers.
            unsafe { handle.run(plan, 1.0, 0.0, &ptrs, std::ptr::null_mut()) }.unwrap();
            assert_eq!(
                [
                    read(b"fake_epi\0"),
                    read(b"fake_bias_type\0"),
                    read(b"fake_bias\0"),
                    read(b"fake_aux\0"),
                    read(b"fake_ld\0"),
                    read(b"fake_scale\0"),
                    read(b"fake_c\0"),
                    read(b"fake_d\0"),
                ],
                [164, 0, bias as i64, aux as i64, 136, 0, 4096, 4096]
            );
        }
        assert_eq!((cache.built, read(b"fake_heuristics\0") as i32), (1, 1));
        // Bias + residual: C is the residual, beta 1.
        let res = key(
            &d,
            DType::BF16,
            LtEpilogue::BiasResidual {
                bias: p(64),
                dtype: DType::BF16,
                residual: p(2048),
            },
        );
        let rp = ptrs(64, 0, 2048);
        let plan = cache
            .get(&handle, &res, LT_WORKSPACE, &rp)
            .unwrap()
            .unwrap();
        // SAFETY: as above.
        unsafe { handle.run(plan, 1.0, 1.0, &rp, std::ptr::null_mut()) }.unwrap();
        assert_eq!(
            [
                read(b"fake_epi\0"),
                read(b"fake_bias_type\0"),
                read(b"fake_c\0")
            ],
            [4, ltsys::HIP_R_16BF as i64, 2048]
        );
        assert_eq!(read(b"fake_beta_is_one\0") as i32, 1);
        // No algorithm (the heuristic's count 0): remembered, not asked again.
        let dg = key(&d, DType::BF16, LtEpilogue::DGelu { aux: p(8), ld: 136 });
        for _ in 0..2 {
            assert!(
                cache
                    .get(&handle, &dg, LT_WORKSPACE, &ptrs(0, 8, 4096))
                    .unwrap()
                    .is_none()
            );
        }
        assert_eq!((cache.built, read(b"fake_heuristics\0") as i32), (3, 3));
        // A refusal at launch: the caller remembers it (`refuse`), and the key has no plan.
        let w = GemmDesc::new(true, false, 136, 64, 96).beta(1.0);
        let bg = key(
            &w,
            DType::F32,
            LtEpilogue::BGradB {
                bias: p(8),
                dtype: DType::F32,
            },
        );
        let bp = ptrs(8, 0, 4096);
        let plan = cache.get(&handle, &bg, LT_WORKSPACE, &bp).unwrap().unwrap();
        // SAFETY: as above.
        let e = unsafe { handle.run(plan, 1.0, 1.0, &bp, std::ptr::null_mut()) }.unwrap_err();
        assert!(matches!(
            e,
            HipError::Lt { status, .. } if status == ltsys::HIPBLAS_STATUS_NOT_SUPPORTED
        ));
        cache.refuse(&bg);
        assert!(
            cache
                .get(&handle, &bg, LT_WORKSPACE, &bp)
                .unwrap()
                .is_none()
        );
        assert_eq!((cache.built, read(b"fake_heuristics\0") as i32), (4, 4));
        assert_eq!(read(b"fake_matmuls\0") as i32, 3);
    }
}
