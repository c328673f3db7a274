// hip-on-cpu: libhipblaslt's matmuls on the CPU. A TEST DOUBLE (../README.md).
//
// duet uses hipBLASLt for two kinds of matmul, both with f32 compute and scale type:
//  - FP8 GEMMs: A and B FP8 codes (FNUZ on gfx942, OCP on gfx950), one f32 scale per operand
//    through A/B_SCALE_POINTER, C = D in f32/f16/bf16, no epilogue;
//  - 16-bit GEMMs with an epilogue: A and B both bf16 or both f16, D of their type or f32, C read
//    from D or from a separate matrix of D's layout (the residual), batch 1, and one of the
//    epilogues DEFAULT, BIAS, GELU_AUX_BIAS, DGELU, BGRADB.
// Both are computed by the same loops as the hip-on-cuda stand-in's emulation, on the CPU and
// enqueued on the matmul's stream: operands decoded exactly to f32 (every FP8, f16 and bf16 value
// is an f32 value), products accumulated in f32 in k order (cpu_gemm.h), then
// v = (alpha * scaleA * scaleB) * acc + beta * C and the epilogue:
//   BIAS           v += bias[row]                       (bias of D's type or f32)
//   GELU_AUX_BIAS  v += bias[row]; aux = v; v = gelu(v)  (tanh approximation as x·σ(2u); aux of
//                  D's type at EPILOGUE_AUX_LD)
//   DGELU          v *= gelu'(aux)
//   BGRADB         bias[j] = Σ_k op(B)[k][j] (f32 in k order, rounded to the bias type)
// D is rounded to its type (nearest even). The FP8 family must be the one the reported
// architecture has (FNUZ for gfx942, OCP for gfx950), as on the hardware; anything else duet's
// calls do not use is refused with a line naming it. The checks of a matmul are the hip-on-cuda
// stand-in's, word for word.
#include <hip/hip_runtime_api.h>
#include <hip/library_types.h>
#include <hipblaslt/hipblaslt-version.h>
#include <hipblaslt/hipblaslt.h>

#include "core.h"
#include "cpu_gemm.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using hoc::fail;

namespace hoc {
// The arch the platform reports (the checks below are shared with hip-on-cuda, which names it so).
inline std::string arch_base() { return settings().arch_base; }
}  // namespace hoc

namespace {

struct Handle {
    int unused = 0;
};

#include "../../hipblaslt_common.inc"

hoc::Ty ty_of(hipDataType t) {
    switch (t) {
        case HIP_R_32F: return hoc::Ty::F32;
        case HIP_R_16F: return hoc::Ty::F16;
        case HIP_R_16BF: return hoc::Ty::BF16;
        case HIP_R_8F_E4M3: return hoc::Ty::E4M3;
        case HIP_R_8F_E5M2: return hoc::Ty::E5M2;
        case HIP_R_8F_E4M3_FNUZ: return hoc::Ty::E4M3Fnuz;
        default: return hoc::Ty::E5M2Fnuz;
    }
}

// The CPU backend's GELU formulas (tanh approximation as x·σ(2u)), as hip-on-cuda's emulation.
float sigm(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float gelu_u(float x) { return 0.7978846f * (x + 0.044715f * x * x * x); }
float gelu(float x) { return x * sigm(2.0f * gelu_u(x)); }
float gelu_grad(float x) {
    float s = sigm(2.0f * gelu_u(x));
    return s + 2.0f * x * s * (1.0f - s) * 0.7978846f * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace

// ---------------------------------------------------------------- handle

HOC_API hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle) {
    if (!handle) return HIPBLAS_STATUS_INVALID_VALUE;
    if (!hoc::settings().error.empty()) return HIPBLAS_STATUS_NOT_INITIALIZED;
    *handle = new Handle;
    return HIPBLAS_STATUS_SUCCESS;
}

HOC_API hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle) {
    if (!handle) return HIPBLAS_STATUS_NOT_INITIALIZED;
    delete H(handle);
    return HIPBLAS_STATUS_SUCCESS;
}

#include "../../hipblaslt_api.inc"

HOC_API hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t desc,
                                        const void* alpha, const void* A, hipblasLtMatrixLayout_t a,
                                        const void* B, hipblasLtMatrixLayout_t b, const void* beta,
                                        const void* C, hipblasLtMatrixLayout_t c, void* Dp,
                                        hipblasLtMatrixLayout_t d, const hipblasLtMatmulAlgo_t* algo,
                                        void* workspace, size_t workspace_size, hipStream_t stream) {
    const char* fn = "hipblasLtMatmul";
    (void)algo;
    (void)workspace;
    (void)workspace_size;
    if (!handle) return HIPBLAS_STATUS_NOT_INITIALIZED;
    if (!desc || !alpha || !beta || !a || !b || !c || !d) return HIPBLAS_STATUS_INVALID_VALUE;
    Problem p;
    std::string why;
    if (!check(D(desc), L(a), L(b), L(c), L(d), &p, &why)) {
        fail(fn, "%s", why.c_str());
        return HIPBLAS_STATUS_NOT_SUPPORTED;
    }
    const float alpha_v = *static_cast<const float*>(alpha);
    const float beta_v = *static_cast<const float*>(beta);
    if (p.m == 0 || p.n == 0 || p.batch == 0) return HIPBLAS_STATUS_SUCCESS;
    if (!Dp || (p.k > 0 && (!A || !B)) || (beta_v != 0.0f && !C)) return HIPBLAS_STATUS_INVALID_VALUE;
    const Desc dd = *D(desc);  // copied: a recorded matmul outlives the descriptor's settings
    if ((p.epi == 1 || p.epi == 2 || p.epi == 4) && !dd.bias) {
        fail(fn, "epilogue %u without a BIAS_POINTER", dd.epilogue);
        return HIPBLAS_STATUS_INVALID_VALUE;
    }
    if ((p.epi == 2 || p.epi == 3) && !dd.aux) {
        fail(fn, "epilogue %u without an EPILOGUE_AUX_POINTER", dd.epilogue);
        return HIPBLAS_STATUS_INVALID_VALUE;
    }
    const Layout la = *L(a), lb = *L(b), ld = *L(d);
    const bool fp8 = p.fa >= 0;
    int st = hoc::submit(reinterpret_cast<void*>(stream), [=] {
        const hoc::Ty ta = ty_of(la.type), tb = ty_of(lb.type), tyd = ty_of(ld.type);
        const float sa = fp8 && dd.a_scale ? *static_cast<const float*>(dd.a_scale) : 1.0f;
        const float sb = fp8 && dd.b_scale ? *static_cast<const float*>(dd.b_scale) : 1.0f;
        const float s = alpha_v * (sa * sb);
        const hoc::Ty bias_ty = p.bias_ty == 0 ? hoc::Ty::F32 : p.bias_ty == 1 ? hoc::Ty::F16 : hoc::Ty::BF16;
        std::vector<float> acc(static_cast<size_t>(p.m) * p.n);
        for (int bi = 0; bi < p.batch; bi++) {
            const char* ab = static_cast<const char*>(A) + hoc::ty_size(ta) * static_cast<size_t>(la.stride) * bi;
            const char* bb = static_cast<const char*>(B) + hoc::ty_size(tb) * static_cast<size_t>(lb.stride) * bi;
            char* db = static_cast<char*>(Dp) + hoc::ty_size(tyd) * static_cast<size_t>(ld.stride) * bi;
            const char* cb = C ? static_cast<const char*>(C) + hoc::ty_size(tyd) * static_cast<size_t>(ld.stride) * bi
                               : nullptr;
            if (p.k > 0)
                hoc::gemm_acc(dd.trans_a == HIPBLAS_OP_T, dd.trans_b == HIPBLAS_OP_T, p.m, p.n, p.k, ab, ta, la.ld,
                              bb, tb, lb.ld, acc.data());
            else
                std::fill(acc.begin(), acc.end(), 0.0f);
            for (int j = 0; j < p.n; j++)
                for (int i = 0; i < p.m; i++) {
                    const size_t at = static_cast<size_t>(j) * ld.ld + i;
                    float v = s * acc[static_cast<size_t>(j) * p.m + i];
                    if (beta_v != 0.0f) v = v + beta_v * hoc::load(cb, at, tyd);
                    if (p.epi == 1 || p.epi == 2) v = v + hoc::load(dd.bias, i, bias_ty);
                    if (p.epi == 2) {
                        hoc::store(const_cast<void*>(dd.aux), static_cast<size_t>(j) * dd.aux_ld + i, tyd, v);
                        v = gelu(v);
                    } else if (p.epi == 3) {
                        v = v * gelu_grad(hoc::load(dd.aux, static_cast<size_t>(j) * dd.aux_ld + i, tyd));
                    }
                    hoc::store(db, at, tyd, v);
                }
        }
        if (p.epi == 4) {
            // hipBLASLt's B is op(B) k x n: stored k x n (N) or n x k (T).
            const bool trans = dd.trans_b == HIPBLAS_OP_T;
            for (int j = 0; j < p.n; j++) {
                float sum = 0.0f;
                for (int kk = 0; kk < p.k; kk++)
                    sum = sum + hoc::load(B, trans ? static_cast<size_t>(kk) * lb.ld + j
                                                   : static_cast<size_t>(j) * lb.ld + kk, tb);
                hoc::store(const_cast<void*>(dd.bias), j, bias_ty, sum);
            }
        }
        return 0;
    });
    return st ? HIPBLAS_STATUS_EXECUTION_FAILED : HIPBLAS_STATUS_SUCCESS;
}
