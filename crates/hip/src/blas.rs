//! GEMMs: rocBLAS `gemm_strided_batched_ex` (f32 compute) for f32/f16/bf16 operands, hipBLASLt for
//! FP8 operands (FNUZ on gfx942, OCP on gfx950) with device scale pointers, and the hipBLASLt
//! state (handle, workspace, plan cache) that the 16-bit epilogue GEMMs (blaslt.rs) share.

use crate::conv;
use crate::hip::result::HipApi;
use crate::hipblaslt::result::LtApi;
use crate::hipblaslt::safe::{EpilogueKey, LtHandle, Operand, Plan, PlanKey, Ptrs};
use crate::hipblaslt::sys as ltsys;
use crate::memory::{HipBuffer, MemShared};
use crate::rocblas::safe::RocblasHandle;
use duet_device::{Buffer, DType, DeviceError, GemmDesc, Result};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// hipBLASLt state: the handle, device scales of 1.0 for A and B, a workspace, and the FP8
/// plans (descriptors and algorithm) built so far, one per [`PlanKey`] (`None`: hipBLASLt has
/// no algorithm for it, asked once too).
pub struct Lt {
    /// First field: the plans' descriptors are destroyed before the handle.
    pub plans: PlanCache,
    pub handle: LtHandle,
    pub ones: HipBuffer,
    pub workspace: HipBuffer,
}

pub const LT_WORKSPACE: usize = 32 << 20;

/// What `hipblasLtCreate` allocates on the device before anything else: a synchronizer of
/// 16 × 409600 ints (hipBLASLt `hipblaslt.cpp`, ROCm 6.x and 7.x), through a `CHECK_HIP_ERROR`
/// that calls `exit(EXIT_FAILURE)` inside the library when the `hipMalloc` fails: the process
/// would end with no error to report.
pub const LT_CREATE_BYTES: u64 = 16 * 409_600 * 4;
/// Headroom kept on top of [`LT_CREATE_BYTES`] before calling `hipblasLtCreate` (allocation
/// granularity, the Tensile code objects hipBLASLt loads on first use, other processes). The
/// check is a guard against the library's `exit`, not a guarantee: free memory can change
/// between the check and the call.
pub const LT_CREATE_MARGIN: u64 = 64 << 20;

/// Why `hipblasLtCreate` is not attempted with `free` bytes free, or `None` when it may be.
pub fn lt_memory_check(free: u64) -> Option<String> {
    let need = LT_CREATE_BYTES + LT_CREATE_MARGIN;
    (free < need).then(|| {
        format!(
            "only {} MiB free on the GPU; hipblasLtCreate allocates {} MiB and exits the process \
             when that fails, so it is not called below {} MiB free",
            free >> 20,
            LT_CREATE_BYTES >> 20,
            need >> 20
        )
    })
}

impl Lt {
    /// Creates the hipBLASLt state on GPU `ordinal` (made current on this thread first:
    /// hipBLASLt binds a handle to the current device). Our buffers are allocated first (a
    /// clean out-of-memory error), then free memory is checked ([`lt_memory_check`]) before
    /// `hipblasLtCreate`.
    pub fn create(
        api: &Arc<LtApi>,
        hip: &HipApi,
        mem: &Arc<MemShared>,
        ordinal: i32,
    ) -> std::result::Result<Self, LtCreateError> {
        let before = |e: String| LtCreateError {
            why: e,
            retry: true,
        };
        hip.set_device(ordinal).map_err(|e| before(e.to_string()))?;
        let ones = HipBuffer::new(mem, DType::F32, 2).map_err(|e| before(e.to_string()))?;
        let (bits, width) = conv::fill_pattern(DType::F32, 1.0);
        // SAFETY: `ones` holds 2 f32 on this device.
        unsafe {
            mem.stream
                .api()
                .memset_async(ones.ptr(), bits, width, 2, mem.stream.raw())
        }
        .map_err(|e| before(e.to_string()))?;
        let workspace =
            HipBuffer::new(mem, DType::U8, LT_WORKSPACE).map_err(|e| before(e.to_string()))?;
        let (free, _) = hip.mem_info().map_err(|e| before(e.to_string()))?;
        if let Some(why) = lt_memory_check(free) {
            return Err(before(why));
        }
        let handle = LtHandle::new(api.clone()).map_err(|e| LtCreateError {
            why: e.to_string(),
            retry: false,
        })?;
        Ok(Self {
            handle,
            ones,
            workspace,
            plans: PlanCache::default(),
        })
    }
}

/// The plans of one handle (FP8 GEMMs, 16-bit GEMMs with epilogues), by key.
#[derive(Default)]
pub struct PlanCache {
    plans: HashMap<PlanKey, Option<Plan>>,
    /// How many plans were built (heuristic queries), for tests and diagnostics.
    pub built: usize,
}

impl PlanCache {
    /// The plan of `key`, built on `handle` the first time with this call's pointers
    /// (`Ok(None)`: no algorithm).
    pub fn get(
        &mut self,
        handle: &LtHandle,
        key: &PlanKey,
        workspace: usize,
        ptrs: &Ptrs,
    ) -> std::result::Result<Option<&Plan>, crate::error::HipError> {
        if !self.plans.contains_key(key) {
            let plan = handle.plan(key, workspace, ptrs)?;
            self.built += 1;
            self.plans.insert(*key, plan);
        }
        Ok(self.plans.get(key).and_then(Option::as_ref))
    }

    /// Remembers that hipBLASLt refused `key`'s algorithm at launch: from now on the key has no
    /// plan, as when the heuristic finds none.
    pub fn refuse(&mut self, key: &PlanKey) {
        self.plans.insert(*key, None);
    }
}

/// Why the hipBLASLt state was not created.
#[derive(Clone, Debug, PartialEq)]
pub struct LtCreateError {
    pub why: String,
    /// Nothing inside hipBLASLt ran (our own allocations, the free-memory guard): the next FP8
    /// GEMM may try again, when memory has been freed. A failure inside `hipblasLtCreate` is
    /// final (the library's failure modes include `exit`).
    pub retry: bool,
}

enum LtState {
    NotCreated,
    Ready(Box<Lt>),
    /// `hipblasLtCreate` failed; the reason, reported by every FP8 GEMM (never retried: the
    /// library's failure modes include `exit`).
    Failed(String),
}

/// hipBLASLt, created on the first FP8 GEMM rather than when the device opens: a failure
/// (library missing, handle creation failing, too little free memory) disables only the paths
/// that need it, with the cause in their error (the GEMM epilogues then run their composition);
/// rocBLAS stays the plain bf16/f16/f32 path.
pub struct LazyLt {
    /// The library, when it was found at open.
    pub api: Option<Arc<LtApi>>,
    /// Why it was not found.
    pub missing: Option<String>,
    state: Mutex<LtState>,
}

impl LazyLt {
    pub fn new(api: std::result::Result<Arc<LtApi>, String>) -> Self {
        let (api, missing) = match api {
            Ok(a) => (Some(a), None),
            Err(e) => (None, Some(e)),
        };
        Self {
            api,
            missing,
            state: Mutex::new(LtState::NotCreated),
        }
    }

    /// Runs `f` on the hipBLASLt state, creating it first if needed (`create`). When hipBLASLt
    /// is unavailable: `Unsupported` for `op` on `dtype`, naming the cause.
    pub fn with<R>(
        &self,
        op: &str,
        dtype: DType,
        create: impl FnOnce(&Arc<LtApi>) -> std::result::Result<Lt, LtCreateError>,
        f: impl FnOnce(&mut Lt) -> Result<R>,
    ) -> Result<R> {
        let unavailable = |why: &str| DeviceError::Unsupported {
            op: format!("{op} (needs hipBLASLt, which is unavailable: {why})"),
            dtype,
        };
        let Some(api) = &self.api else {
            return Err(unavailable(self.missing.as_deref().unwrap_or("not found")));
        };
        let mut state = self
            .state
            .lock()
            .map_err(|_| DeviceError::InvalidArgument("hipBLASLt lock poisoned".into()))?;
        if matches!(*state, LtState::NotCreated) {
            *state = match create(api) {
                Ok(lt) => LtState::Ready(Box::new(lt)),
                Err(e) if e.retry => {
                    return Err(unavailable(&format!(
                        "hipBLASLt handle not created yet: {} (tried again on the next FP8 GEMM)",
                        e.why
                    )));
                }
                Err(e) => LtState::Failed(format!("hipBLASLt handle not created: {}", e.why)),
            };
        }
        match &mut *state {
            LtState::Ready(lt) => f(lt),
            LtState::Failed(why) => Err(unavailable(why)),
            LtState::NotCreated => unreachable!("set above"),
        }
    }

    /// For `duet info`: the hipBLASLt version once the handle exists, else its state.
    pub fn describe(&self) -> String {
        let Some(api) = &self.api else {
            return format!(
                "not available ({})",
                self.missing.as_deref().unwrap_or("not found")
            );
        };
        let file = api
            .file
            .as_ref()
            .map_or(api.name.clone(), |f| f.display().to_string());
        match self.state.lock().as_deref() {
            Ok(LtState::Ready(lt)) => match lt.handle.version() {
                Ok(v) => format!("{} ({file})", crate::hipblaslt::safe::version_string(v)),
                Err(e) => format!("version unknown: {e} ({file})"),
            },
            Ok(LtState::Failed(why)) => format!("unavailable: {why} ({file})"),
            _ => format!("{file} (handle created on the first FP8 GEMM or GEMM epilogue)"),
        }
    }
}

/// Validates and runs `desc` on rocBLAS.
pub fn gemm(
    blas: &RocblasHandle,
    desc: &GemmDesc,
    a: &HipBuffer,
    b: &HipBuffer,
    c: &mut HipBuffer,
) -> Result<()> {
    let ab = conv::rocblas_type(a.dtype()).ok_or_else(|| DeviceError::Unsupported {
        op: "gemm".into(),
        dtype: a.dtype(),
    })?;
    let ct =
        conv::rocblas_type(c.dtype()).filter(|_| c.dtype() == a.dtype() || c.dtype() == DType::F32);
    let ct = ct.ok_or_else(|| DeviceError::Unsupported {
        op: format!(
            "gemm with {} inputs (C must be {} or f32)",
            a.dtype(),
            a.dtype()
        ),
        dtype: c.dtype(),
    })?;
    let g = conv::col_major(desc)?;
    // SAFETY: `desc.validate` (called by the device) checked that every batch of A, B and C lies
    // inside the buffers; the pointers are offset inside their allocations.
    unsafe {
        blas.api.gemm_strided_batched(
            blas.raw,
            &g,
            desc.alpha,
            b.ptr_at(desc.b_offset),
            ab,
            a.ptr_at(desc.a_offset),
            desc.beta,
            c.ptr_at(desc.c_offset),
            ct,
        )
    }?;
    Ok(())
}

/// The [`PlanKey`] of an FP8 `desc` (unit-less scales through device pointers, no epilogue).
pub fn fp8_plan_key(desc: &GemmDesc, a: DType, b: DType, c: DType) -> Result<PlanKey> {
    plan_key(desc, (a, b, c), true, EpilogueKey::NONE)
}

/// The [`PlanKey`] of `desc` with duet's A, B and C of `types` (column-major: hipBLASLt's A
/// is duet's B, stored (rows, cols) = our (cols, rows)); `scaled`: A and B have device scale
/// pointers (FP8).
pub fn plan_key(
    desc: &GemmDesc,
    (a, b, c): (DType, DType, DType),
    scaled: bool,
    epilogue: EpilogueKey,
) -> Result<PlanKey> {
    let g = conv::col_major(desc)?;
    let ty = |d: DType| {
        conv::hip_data_type(d).ok_or_else(|| DeviceError::Unsupported {
            op: "gemm".into(),
            dtype: d,
        })
    };
    let (br, bc) = desc.b_stored();
    let (ar, ac) = desc.a_stored();
    Ok(PlanKey {
        trans_a: g.trans_a,
        trans_b: g.trans_b,
        a: Operand {
            ty: ty(b)?,
            rows: bc as u64,
            cols: br as u64,
            ld: g.lda as i64,
            stride: g.stride_a,
        },
        b: Operand {
            ty: ty(a)?,
            rows: ac as u64,
            cols: ar as u64,
            ld: g.ldb as i64,
            stride: g.stride_b,
        },
        c: Operand {
            ty: ty(c)?,
            rows: g.m as u64,
            cols: g.n as u64,
            ld: g.ldc as i64,
            stride: g.stride_c,
        },
        batch: g.batch,
        accumulate: desc.beta != 0.0,
        scaled,
        scale_mode: ltsys::HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F,
        epilogue,
    })
}

/// What an FP8 GEMM needs before hipBLASLt is involved (checked before its handle is created,
/// so a GPU without FP8 GEMMs, gfx90a, never creates one): this GPU's FP8 format for A, and a
/// float C.
pub fn fp8_check(arch_base: &str, a: DType, c: DType) -> Result<()> {
    if !conv::fp8_supported(arch_base, a) {
        return Err(DeviceError::Unsupported {
            op: format!("gemm with {a} operands on {arch_base}"),
            dtype: a,
        });
    }
    if !matches!(c, DType::F32 | DType::F16 | DType::BF16) {
        return Err(DeviceError::Unsupported {
            op: "fp8 gemm output (C must be f32, f16 or bf16)".into(),
            dtype: c,
        });
    }
    Ok(())
}

/// Runs an FP8 `desc` on hipBLASLt. `Unsupported` when the GPU lacks this FP8 format or
/// hipBLASLt has no kernel for the combination. `scales` are device pointers to the f32 factors
/// of A and B (`scale_inv` of delayed scaling); `None` uses ones. The descriptors and the
/// algorithm come from the plan cache: built (heuristic asked) once per shape, dtype, layout and
/// scale mode.
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp8(
    lt: &mut Lt,
    arch_base: &str,
    stream: crate::hip::sys::hipStream_t,
    desc: &GemmDesc,
    a: &HipBuffer,
    b: &HipBuffer,
    c: &mut HipBuffer,
    scales: Option<(*mut c_void, *mut c_void)>,
) -> Result<()> {
    let unsupported = |what: String, dtype| DeviceError::Unsupported { op: what, dtype };
    fp8_check(arch_base, a.dtype(), c.dtype())?;
    let key = fp8_plan_key(desc, a.dtype(), b.dtype(), c.dtype())?;
    let ptrs = Ptrs {
        a: b.ptr_at(desc.b_offset),
        b: a.ptr_at(desc.a_offset),
        c: c.ptr_at(desc.c_offset),
        d: c.ptr_at(desc.c_offset),
        // hipBLASLt's A is our B and vice versa.
        a_scale: scales.map_or(lt.ones.ptr_at(0), |(_, sb)| sb),
        b_scale: scales.map_or(lt.ones.ptr_at(1), |(sa, _)| sa),
        bias: std::ptr::null(),
        aux: std::ptr::null(),
        workspace: lt.workspace.ptr(),
        workspace_size: LT_WORKSPACE,
    };
    let Lt { handle, plans, .. } = lt;
    let plan = plans.get(handle, &key, LT_WORKSPACE, &ptrs)?;
    let Some(plan) = plan else {
        return Err(unsupported(
            format!(
                "gemm: hipBLASLt has no algorithm for {} x {} -> {} on {arch_base}",
                a.dtype(),
                b.dtype(),
                c.dtype()
            ),
            a.dtype(),
        ));
    };
    // SAFETY: `desc.validate` checked every batch lies inside the buffers, which the plan's
    // layouts describe (same key); the scales and the workspace are live device buffers of the
    // sizes given, the workspace at least the plan's.
    unsafe { handle.run(plan, desc.alpha, desc.beta, &ptrs, stream) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hipblaslt::sys::HipblasLtLib;

    fn key(desc: &GemmDesc, c: DType) -> PlanKey {
        fp8_plan_key(desc, DType::F8E4M3Fnuz, DType::F8E4M3Fnuz, c).unwrap()
    }

    #[test]
    fn plan_keys_separate_shape_dtype_layout_and_beta() {
        let d = GemmDesc::new(false, true, 128, 256, 64);
        let k = key(&d, DType::BF16);
        assert_eq!(k, key(&d, DType::BF16));
        // hipBLASLt's A is duet's B (column-major swap).
        assert_eq!(
            (k.a.rows, k.a.cols, k.c.rows, k.c.cols),
            (64, 256, 256, 128)
        );
        assert_eq!(
            k.scale_mode,
            ltsys::HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F
        );
        assert!(k.scaled);
        assert_eq!(k.epilogue, EpilogueKey::NONE);
        let mut others = vec![
            key(&d, DType::F32),
            key(&GemmDesc::new(false, true, 128, 256, 128), DType::BF16),
            key(&GemmDesc::new(false, true, 64, 256, 64), DType::BF16),
            key(&GemmDesc::new(false, false, 128, 256, 64), DType::BF16),
            key(&GemmDesc::new(true, true, 128, 256, 64), DType::BF16),
            fp8_plan_key(&d, DType::F8E4M3Fnuz, DType::F8E5M2Fnuz, DType::BF16).unwrap(),
            fp8_plan_key(&d, DType::F8E4M3, DType::F8E4M3, DType::BF16).unwrap(),
        ];
        let mut beta = d;
        beta.beta = 1.0;
        others.push(key(&beta, DType::BF16));
        let mut ld = d;
        ld.ldc = 512;
        others.push(key(&ld, DType::BF16));
        let mut batched = d;
        batched.batch = 4;
        others.push(key(&batched, DType::BF16));
        // The same shape unscaled (a 16-bit GEMM's key) is another plan.
        others.push(
            plan_key(
                &d,
                (DType::F8E4M3Fnuz, DType::F8E4M3Fnuz, DType::BF16),
                false,
                EpilogueKey::NONE,
            )
            .unwrap(),
        );
        for o in &others {
            assert_ne!(&k, o);
        }
        // alpha, the offsets and the scale values are per call, not part of the plan.
        let mut same = d;
        same.alpha = 0.5;
        same.a_offset = 1024;
        assert_eq!(k, key(&same, DType::BF16));
    }

    /// A fake hipBLASLt: objects are malloc'd `uint64_t`s holding a layout's rows; the
    /// heuristic counts its calls and finds no algorithm when A has 999 rows.
    const FAKE_LT: &str = r#"
#include <stdint.h>
#include <stdlib.h>
static int heuristics = 0, matmuls = 0;
int fake_heuristics(void) { return heuristics; }
int fake_matmuls(void) { return matmuls; }
unsigned hipblasLtCreate(void** h) { *h = malloc(8); return 0; }
unsigned hipblasLtDestroy(void* h) { free(h); return 0; }
unsigned hipblasLtGetVersion(void* h, int* v) { (void)h; *v = 100401; return 0; }
unsigned hipblasLtMatrixLayoutCreate(void** l, unsigned t, uint64_t r, uint64_t c, int64_t ld) {
    (void)t; (void)c; (void)ld; uint64_t* p = malloc(8); *p = r; *l = p; return 0;
}
unsigned hipblasLtMatrixLayoutDestroy(void* l) { free(l); return 0; }
unsigned hipblasLtMatmulDescCreate(void** d, unsigned c, unsigned s) {
    (void)c; (void)s; *d = malloc(8); return 0;
}
unsigned hipblasLtMatmulDescDestroy(void* d) { free(d); return 0; }
unsigned hipblasLtMatmulPreferenceCreate(void** p) { *p = malloc(8); return 0; }
unsigned hipblasLtMatmulPreferenceDestroy(void* p) { free(p); return 0; }
unsigned hipblasLtMatmulAlgoGetHeuristic(void* h, void* d, void* a, void* b, void* c, void* dd,
        void* p, int req, void* results, int* count) {
    (void)h; (void)d; (void)b; (void)c; (void)dd; (void)p; (void)req; (void)results;
    heuristics++;
    *count = *(uint64_t*)a == 999 ? 0 : 1;
    return 0;
}
unsigned hipblasLtMatmul(void) { matmuls++; return 0; }
"#;

    #[test]
    fn fp8_plans_are_built_once_per_key_and_reused() {
        let Some(path) =
            crate::test_support::fake_library("lt-plans", FAKE_LT, HipblasLtLib::SYMBOLS)
        else {
            panic!("needs a C compiler (cc) to build the fake hipBLASLt");
        };
        let name = path.to_string_lossy().into_owned();
        let lib = crate::loader::open_pinned(&name).unwrap();
        // SAFETY: the fake defines every function the test calls with hipBLASLt's signatures
        // (hipblasLtMatmul ignores its arguments).
        let api = Arc::new(unsafe { LtApi::from_library(lib, &name) }.unwrap());
        let counter = |sym: &[u8]| {
            let lib = crate::loader::open_pinned(&name).unwrap();
            // SAFETY: `int f(void)` counters of the fake.
            unsafe { (*lib.get::<unsafe extern "C" fn() -> i32>(sym).unwrap())() }
        };
        let handle = LtHandle::new(api).unwrap();
        assert_eq!(
            crate::hipblaslt::safe::version_string(handle.version().unwrap()),
            "1.4.1"
        );
        let mut cache = PlanCache::default();
        let one = std::ptr::dangling::<c_void>();
        let ptrs = Ptrs {
            a: one,
            b: one,
            c: one,
            d: one as *mut c_void,
            a_scale: one,
            b_scale: one,
            bias: std::ptr::null(),
            aux: std::ptr::null(),
            workspace: one as *mut c_void,
            workspace_size: LT_WORKSPACE,
        };
        let d = GemmDesc::new(false, true, 128, 256, 64);
        for _ in 0..3 {
            let plan = cache
                .get(&handle, &key(&d, DType::BF16), LT_WORKSPACE, &ptrs)
                .unwrap()
                .expect("an algorithm");
            // SAFETY: the fake matmul reads nothing.
            unsafe { handle.run(plan, 1.0, 0.0, &ptrs, std::ptr::null_mut()) }.unwrap();
        }
        assert_eq!(counter(b"fake_heuristics\0"), 1, "heuristic asked once");
        assert_eq!(counter(b"fake_matmuls\0"), 3);
        assert_eq!(cache.built, 1);
        // Another output type is another plan.
        cache
            .get(&handle, &key(&d, DType::F32), LT_WORKSPACE, &ptrs)
            .unwrap()
            .expect("an algorithm");
        assert_eq!((cache.built, counter(b"fake_heuristics\0")), (2, 2));
        // No algorithm: remembered too, not asked again.
        let none = key(&GemmDesc::new(false, true, 128, 999, 64), DType::BF16);
        assert_eq!(none.a.rows, 64);
        let mut none = none;
        none.a.rows = 999;
        for _ in 0..2 {
            assert!(
                cache
                    .get(&handle, &none, LT_WORKSPACE, &ptrs)
                    .unwrap()
                    .is_none()
            );
        }
        assert_eq!((cache.built, counter(b"fake_heuristics\0")), (3, 3));
    }

    #[test]
    fn hipblaslt_is_not_created_without_room_for_its_synchronizer() {
        assert_eq!(LT_CREATE_BYTES, 26_214_400);
        let why = lt_memory_check(LT_CREATE_BYTES).expect("too little");
        assert!(
            why.contains("hipblasLtCreate") && why.contains("exits"),
            "{why}"
        );
        assert!(lt_memory_check(LT_CREATE_BYTES + LT_CREATE_MARGIN).is_none());
        assert!(lt_memory_check(80 << 30).is_none());
    }

    #[test]
    fn a_failed_lazy_creation_disables_only_hipblaslt_with_its_cause() {
        // No library: Unsupported naming why, and `create` never runs.
        let lazy = LazyLt::new(Err("libhipblaslt.so.1 not found".into()));
        let e = lazy
            .with::<()>(
                "gemm_fp8",
                DType::F8E4M3Fnuz,
                |_| unreachable!(),
                |_| Ok(()),
            )
            .unwrap_err();
        assert!(
            matches!(e, DeviceError::Unsupported { .. }) && e.to_string().contains("not found"),
            "{e}"
        );
        assert!(lazy.describe().contains("not found"));
        // A library whose handle creation fails: tried once, the cause in every later error.
        let path = crate::test_support::fake_library("lt-lazy", FAKE_LT, HipblasLtLib::SYMBOLS)
            .expect("cc");
        let name = path.to_string_lossy().into_owned();
        let lib = crate::loader::open_pinned(&name).unwrap();
        // SAFETY: as in the test above; nothing is called.
        let api = Arc::new(unsafe { LtApi::from_library(lib, &name) }.unwrap());
        let lazy = LazyLt::new(Ok(api));
        assert!(
            lazy.describe().contains("first FP8 GEMM"),
            "{}",
            lazy.describe()
        );
        // Too little free memory: nothing inside hipBLASLt ran, so the next GEMM tries again.
        let mut tries = 0;
        for _ in 0..2 {
            let e = lazy
                .with::<()>(
                    "gemm_fp8",
                    DType::F8E4M3Fnuz,
                    |_| {
                        tries += 1;
                        Err(LtCreateError {
                            why: lt_memory_check(1 << 20).unwrap(),
                            retry: true,
                        })
                    },
                    |_| Ok(()),
                )
                .unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("gemm_fp8") && msg.contains("MiB free") && msg.contains("again"),
                "{msg}"
            );
        }
        assert_eq!(tries, 2);
        assert!(lazy.describe().contains("first FP8 GEMM"));
        // hipblasLtCreate itself failing: tried once, its cause in every later error.
        let mut tries = 0;
        for _ in 0..2 {
            let e = lazy
                .with::<()>(
                    "gemm_fp8",
                    DType::F8E4M3Fnuz,
                    |_| {
                        tries += 1;
                        Err(LtCreateError {
                            why: "hipblasLtCreate: HIPBLAS_STATUS_NOT_INITIALIZED".into(),
                            retry: false,
                        })
                    },
                    |_| Ok(()),
                )
                .unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("gemm_fp8") && msg.contains("NOT_INITIALIZED"),
                "{msg}"
            );
        }
        assert_eq!(tries, 1);
        assert!(
            lazy.describe().contains("unavailable"),
            "{}",
            lazy.describe()
        );
    }
}
