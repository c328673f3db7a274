// hip-on-cuda: libhipblaslt's matmuls, emulated over cuBLAS. A TEST DOUBLE (../README.md).
//
// duet uses hipBLASLt for two kinds of matmul, both with f32 compute and scale type:
//  - FP8 GEMMs: A and B FP8 codes (FNUZ on gfx942, OCP on gfx950), one f32 scale per operand
//    through A/B_SCALE_POINTER, C = D in f32/f16/bf16, no epilogue;
//  - 16-bit GEMMs with an epilogue: A and B both bf16 or both f16, D of their type or f32, C read
//    from D or from a separate matrix of D's layout (the residual), batch 1, and one of the
//    epilogues DEFAULT, BIAS, GELU_AUX_BIAS, DGELU, BGRADB.
// cuBLASLt has no FNUZ formats (and takes FP8 only transposed-normal), so every matmul is
// emulated the same way, for every layout:
//   1. FP8 codes of A and B are decoded exactly to bf16 (every value of the four FP8 formats is
//      a bf16 value; NaN stays NaN, E5M2's infinities stay infinite), by a kernel of this file
//      compiled with NVRTC; 16-bit operands are used as they are;
//   2. cuBLAS multiplies them with f32 accumulation into an f32 buffer
//      (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F);
//   3. an epilogue kernel forms v = (alpha * scaleA * scaleB) * acc + beta * C (C read only when
//      beta != 0) in f32, then as hipBLASLt documents each epilogue:
//        BIAS           v += bias[row]                       (bias of D's type or f32)
//        GELU_AUX_BIAS  v += bias[row]; aux = v; v = gelu(v)  (tanh approximation; aux of D's
//                       type at EPILOGUE_AUX_LD, rounded to it; gelu of the unrounded f32 sum)
//        DGELU          v *= gelu'(aux)                       (aux read, D's type)
//      and writes D rounded to its type (nearest even);
//   4. for BGRADB, a kernel writes bias[j] = sum over k of op(B)[k][j] (f32 accumulation in k
//      order, unscaled by alpha, rounded to the bias type), B being the layout-B operand.
// The FP8 family must be the one the reported architecture has (FNUZ for gfx942, OCP for gfx950),
// as on the hardware; anything else duet's calls do not use is refused with a line naming it.
#include <hip/hip_runtime_api.h>
#include <hip/library_types.h>
#include <hipblaslt/hipblaslt-version.h>
#include <hipblaslt/hipblaslt.h>
#include <nvrtc.h>

#include "common.h"
#include "cublas_side.h"

#include <dlfcn.h>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using hoc::fail;

namespace {

// ---------------------------------------------------------------- the emulation kernels

const char* const kKernels = R"(
__device__ __forceinline__ float pow2(int e) { return __int_as_float((e + 127) << 23); }

// fmt: 0 OCP E4M3, 1 OCP E5M2, 2 E4M3 FNUZ, 3 E5M2 FNUZ. Exact: every FP8 value is a bf16 value.
extern "C" __global__ void hoc_decode_fp8(const unsigned char* in, unsigned short* out,
                                          unsigned long long n, int fmt) {
    const int mbits = (fmt == 0 || fmt == 2) ? 3 : 2;
    const int bias = fmt == 0 ? 7 : fmt == 1 ? 15 : fmt == 2 ? 8 : 16;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += step) {
        unsigned int c = in[i];
        unsigned int s = c >> 7;
        unsigned int e = (c & 0x7fu) >> mbits;
        unsigned int m = c & ((1u << mbits) - 1u);
        bool nan = fmt >= 2 ? c == 0x80u : fmt == 0 ? (c & 0x7fu) == 0x7fu : (e == 31u && m != 0u);
        bool inf = fmt == 1 && e == 31u && m == 0u;
        unsigned short bits;
        if (nan) {
            bits = 0x7fc0;
        } else if (inf) {
            bits = (unsigned short)((s << 15) | 0x7f80u);
        } else {
            float v = e == 0u ? (float)m * pow2(1 - bias - mbits)
                              : (float)(m + (1u << mbits)) * pow2((int)e - bias - mbits);
            bits = (unsigned short)((__float_as_uint(v) >> 16) | (s << 15));
        }
        out[i] = bits;
    }
}

__device__ __forceinline__ float load(const void* p, long long i, int ty) {
    if (ty == 0) return ((const float*)p)[i];
    unsigned short h = ((const unsigned short*)p)[i];
    if (ty == 2) return __uint_as_float((unsigned int)h << 16);
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ void store(void* p, long long i, int ty, float v) {
    if (ty == 0) {
        ((float*)p)[i] = v;
        return;
    }
    unsigned short h;
    if (ty == 2)
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    ((unsigned short*)p)[i] = h;
}

// tanh-approximation GELU as x * sigmoid(2u), u = sqrt(2/pi) * (x + 0.044715 x^3), and its
// derivative (the CPU backend's formulas).
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_u(float x) {
    return 0.7978846f * (x + 0.044715f * x * x * x);
}
__device__ __forceinline__ float gelu(float x) { return x * sigm(2.0f * gelu_u(x)); }
__device__ __forceinline__ float gelu_grad(float x) {
    float s = sigm(2.0f * gelu_u(x));
    return s + 2.0f * x * s * (1.0f - s) * 0.7978846f * (1.0f + 3.0f * 0.044715f * x * x);
}

// ty: 0 f32, 1 f16, 2 bf16. acc is m x n x batch, packed column-major. epi: 0 none, 1 bias,
// 2 bias + gelu with aux written, 3 dgelu with aux read (epilogues only with batch 1).
extern "C" __global__ void hoc_epilogue(const float* acc, const void* c, void* d, int ty, int m,
                                        int n, int batch, long long ld, long long stride,
                                        float alpha, float beta, const float* sa,
                                        const float* sb, int epi, const void* bias, int bias_ty,
                                        void* aux, long long aux_ld) {
    const float s = __fmul_rn(alpha, __fmul_rn(sa ? *sa : 1.0f, sb ? *sb : 1.0f));
    long long mn = (long long)m * n;
    long long total = mn * batch;
    long long step = (long long)gridDim.x * blockDim.x;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += step) {
        long long b = idx / mn, r = idx % mn;
        long long j = r / m, i = r % m;
        long long at = b * stride + j * ld + i;
        float v = __fmul_rn(s, acc[idx]);
        if (beta != 0.0f) v = __fadd_rn(v, __fmul_rn(beta, load(c, at, ty)));
        if (epi == 1 || epi == 2) v = __fadd_rn(v, load(bias, i, bias_ty));
        if (epi == 2) {
            store(aux, j * aux_ld + i, ty, v);
            v = gelu(v);
        } else if (epi == 3) {
            v = __fmul_rn(v, gelu_grad(load(aux, j * aux_ld + i, ty)));
        }
        store(d, at, ty, v);
    }
}

// BGRADB: out[j] = sum over kk of op(B)[kk][j], op(B) k x n; B stored k x n (trans 0) or
// n x k (trans 1) with leading dimension ld, of type bty (1 f16, 2 bf16).
extern "C" __global__ void hoc_bgradb(const void* b, int bty, int k, int n, long long ld,
                                      int trans, void* out, int out_ty) {
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n;
         j += (long long)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (long long kk = 0; kk < k; ++kk)
            sum = __fadd_rn(sum, load(b, trans ? kk * ld + j : j * ld + kk, bty));
        store(out, j, out_ty, sum);
    }
}
)";

#define HOC_NVRTC_FUNCS(X)                                                                      \
    X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)         \
    X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcDestroyProgram) X(nvrtcGetErrorString)

struct Nvrtc {
#define HOC_MEMBER(f) decltype(&::f) f;
    HOC_NVRTC_FUNCS(HOC_MEMBER)
#undef HOC_MEMBER
};

// The kernels' cubin for `arch` (compiled once per process), or empty with `why`.
std::vector<char> kernels_cubin(const std::string& arch, std::string* why) {
    static std::mutex mu;
    static std::string built_for;
    static std::vector<char> cubin;
    std::lock_guard<std::mutex> lock(mu);
    if (!cubin.empty() && built_for == arch) return cubin;
    void* h = nullptr;
    for (const char* n : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}) {
        h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
        if (h) break;
    }
    if (!h) {
        *why = "NVRTC (libnvrtc.so.13/.12) could not be opened";
        return {};
    }
    Nvrtc r;
#define HOC_LOAD(f)                                                         \
    r.f = reinterpret_cast<decltype(&::f)>(dlsym(h, HOC_XSTR(f)));          \
    if (!r.f) {                                                             \
        *why = std::string("libnvrtc does not export ") + HOC_XSTR(f);      \
        return {};                                                          \
    }
    HOC_NVRTC_FUNCS(HOC_LOAD)
#undef HOC_LOAD
    nvrtcProgram p = nullptr;
    if (r.nvrtcCreateProgram(&p, kKernels, "hip_on_cuda_fp8.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) {
        *why = "nvrtcCreateProgram failed";
        return {};
    }
    std::string opt = "-arch=" + arch;
    const char* opts[] = {opt.c_str(), "--fmad=false"};
    nvrtcResult res = r.nvrtcCompileProgram(p, 2, opts);
    if (res != NVRTC_SUCCESS) {
        size_t n = 0;
        r.nvrtcGetProgramLogSize(p, &n);
        std::string log(n, '\0');
        r.nvrtcGetProgramLog(p, log.data());
        *why = std::string("NVRTC could not compile the emulation kernels: ") +
               r.nvrtcGetErrorString(res) + "\n" + log;
        r.nvrtcDestroyProgram(&p);
        return {};
    }
    size_t n = 0;
    r.nvrtcGetCUBINSize(p, &n);
    cubin.assign(n, 0);
    r.nvrtcGetCUBIN(p, cubin.data());
    r.nvrtcDestroyProgram(&p);
    built_for = arch;
    return cubin;
}

// ---------------------------------------------------------------- the objects

struct Handle {
    void* cublas = nullptr;
    CUmodule module = nullptr;
    CUfunction decode = nullptr;
    CUfunction epilogue = nullptr;
    CUfunction bgradb = nullptr;
};

#include "../../hipblaslt_common.inc"

// Elements from the first to the last one a layout addresses.
uint64_t span(const Layout* l) {
    if (l->rows == 0 || l->cols == 0 || l->batch == 0) return 0;
    return static_cast<uint64_t>(l->batch - 1) * static_cast<uint64_t>(l->stride) +
           (l->cols - 1) * static_cast<uint64_t>(l->ld) + l->rows;
}

hipblasStatus_t cu_status(const char* fn, const char* call, CUresult r) {
    if (hoc::cu_check(fn, call, r) == CUDA_SUCCESS) return HIPBLAS_STATUS_SUCCESS;
    return r == CUDA_ERROR_OUT_OF_MEMORY ? HIPBLAS_STATUS_ALLOC_FAILED : HIPBLAS_STATUS_EXECUTION_FAILED;
}

unsigned grid_for(uint64_t n) {
    uint64_t g = (n + 255) / 256;
    if (g > 8192) g = 8192;
    return g == 0 ? 1 : static_cast<unsigned>(g);
}

}  // namespace

// ---------------------------------------------------------------- handle

HOC_API hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle) {
    const char* fn = "hipblasLtCreate";
    if (!handle) return HIPBLAS_STATUS_INVALID_VALUE;
    std::string why;
    const hoc::Driver* d = hoc::driver(&why);
    if (!d) return HIPBLAS_STATUS_NOT_INITIALIZED;
    CUdevice dev;
    if (hoc::current_device(fn, &dev) != CUDA_SUCCESS) return HIPBLAS_STATUS_NOT_INITIALIZED;
    int major = 0, minor = 0;
    d->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    std::vector<char> cubin =
        kernels_cubin("sm_" + std::to_string(major) + std::to_string(minor), &why);
    if (cubin.empty()) {
        fail(fn, "%s", why.c_str());
        return HIPBLAS_STATUS_NOT_INITIALIZED;
    }
    if (!hoc::blas::available(&why)) {
        fail(fn, "%s", why.c_str());
        return HIPBLAS_STATUS_NOT_INITIALIZED;
    }
    auto* h = new Handle;
    if (hoc::cu_check(fn, "cuModuleLoadData", d->cuModuleLoadData(&h->module, cubin.data())) ||
        hoc::cu_check(fn, "cuModuleGetFunction", d->cuModuleGetFunction(&h->decode, h->module, "hoc_decode_fp8")) ||
        hoc::cu_check(fn, "cuModuleGetFunction", d->cuModuleGetFunction(&h->epilogue, h->module, "hoc_epilogue")) ||
        hoc::cu_check(fn, "cuModuleGetFunction", d->cuModuleGetFunction(&h->bgradb, h->module, "hoc_bgradb"))) {
        if (h->module) d->cuModuleUnload(h->module);
        delete h;
        return HIPBLAS_STATUS_NOT_INITIALIZED;
    }
    if (int s = hoc::blas::create(&h->cublas); s != 0) {
        fail(fn, "cublasCreate: %s", hoc::blas::status_name(s));
        d->cuModuleUnload(h->module);
        delete h;
        return HIPBLAS_STATUS_NOT_INITIALIZED;
    }
    hoc::blas::set_atomics(h->cublas, false);
    *handle = h;
    return HIPBLAS_STATUS_SUCCESS;
}

HOC_API hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle) {
    if (!handle) return HIPBLAS_STATUS_NOT_INITIALIZED;
    Handle* h = H(handle);
    if (h->cublas) hoc::blas::destroy(h->cublas);
    if (const hoc::Driver* d = hoc::driver(); d && h->module) d->cuModuleUnload(h->module);
    delete h;
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
    Desc* dd = D(desc);
    if ((p.epi == 1 || p.epi == 2 || p.epi == 4) && !dd->bias) {
        fail(fn, "epilogue %u without a BIAS_POINTER", dd->epilogue);
        return HIPBLAS_STATUS_INVALID_VALUE;
    }
    if ((p.epi == 2 || p.epi == 3) && !dd->aux) {
        fail(fn, "epilogue %u without an EPILOGUE_AUX_POINTER", dd->epilogue);
        return HIPBLAS_STATUS_INVALID_VALUE;
    }
    const hoc::Driver* drv = hoc::driver();
    if (!drv) return HIPBLAS_STATUS_NOT_INITIALIZED;
    Handle* h = H(handle);
    CUstream s = reinterpret_cast<CUstream>(stream);
    const bool fp8 = p.fa >= 0;
    const uint64_t na = fp8 ? span(L(a)) : 0, nb = fp8 ? span(L(b)) : 0;
    const uint64_t nacc = static_cast<uint64_t>(p.m) * p.n * p.batch;
    CUdeviceptr a16 = 0, b16 = 0, acc = 0;
    hipblasStatus_t st = HIPBLAS_STATUS_SUCCESS;
    auto alloc = [&](CUdeviceptr* ptr, uint64_t bytes) {
        if (st != HIPBLAS_STATUS_SUCCESS) return;
        st = cu_status(fn, "cuMemAllocAsync", drv->cuMemAllocAsync(ptr, bytes ? bytes : 16, s));
    };
    if (fp8) {
        alloc(&a16, na * 2);
        alloc(&b16, nb * 2);
    }
    alloc(&acc, nacc * 4);
    auto decode = [&](const void* src, CUdeviceptr dst, uint64_t n, int fmt) {
        if (st != HIPBLAS_STATUS_SUCCESS || n == 0) return;
        unsigned long long nn = n;
        void* args[] = {&src, &dst, &nn, &fmt};
        st = cu_status(fn, "cuLaunchKernel(decode)",
                       drv->cuLaunchKernel(h->decode, grid_for(n), 1, 1, 256, 1, 1, 0, s, args, nullptr));
    };
    if (fp8) {
        decode(A, a16, na, p.fa);
        decode(B, b16, nb, p.fb);
    }
    // The operands cuBLAS multiplies: the decoded copies, or the 16-bit inputs themselves.
    const void* ga = fp8 ? reinterpret_cast<const void*>(a16) : A;
    const void* gb = fp8 ? reinterpret_cast<const void*>(b16) : B;
    const hoc::blas::Ty ta = !fp8 && p.ha == 1 ? hoc::blas::Ty::F16 : hoc::blas::Ty::BF16;
    const hoc::blas::Ty tb = !fp8 && p.hb == 1 ? hoc::blas::Ty::F16 : hoc::blas::Ty::BF16;
    if (st == HIPBLAS_STATUS_SUCCESS) {
        const float one = 1.0f, zero = 0.0f;
        if (hoc::blas::set_stream(h->cublas, s) != 0) st = HIPBLAS_STATUS_EXECUTION_FAILED;
        int bs = st == HIPBLAS_STATUS_SUCCESS
                     ? hoc::blas::gemm(h->cublas, dd->trans_a == HIPBLAS_OP_T, dd->trans_b == HIPBLAS_OP_T,
                                       p.m, p.n, p.k, &one, ga,
                                       ta, static_cast<int>(L(a)->ld), L(a)->stride,
                                       gb, tb,
                                       static_cast<int>(L(b)->ld), L(b)->stride, &zero,
                                       reinterpret_cast<void*>(acc), hoc::blas::Ty::F32, p.m,
                                       static_cast<long long>(p.m) * p.n, p.batch)
                     : 0;
        if (bs != 0) {
            fail(fn, "cublasGemmStridedBatchedEx: %s", hoc::blas::status_name(bs));
            st = HIPBLAS_STATUS_EXECUTION_FAILED;
        }
    }
    if (st == HIPBLAS_STATUS_SUCCESS) {
        const void* accp = reinterpret_cast<void*>(acc);
        int ty = p.ty, m = p.m, n = p.n, batch = p.batch;
        long long ld = L(d)->ld, stride = L(d)->stride;
        float al = alpha_v, be = beta_v;
        // FP8 scales only when A and B are FP8 (a 16-bit matmul's are never set).
        const void* sa = fp8 ? dd->a_scale : nullptr;
        const void* sb = fp8 ? dd->b_scale : nullptr;
        int epi = p.epi == 4 ? 0 : p.epi, bias_ty = p.bias_ty;
        const void* bias = dd->bias;
        void* aux = const_cast<void*>(dd->aux);
        long long aux_ld = dd->aux_ld;
        void* args[] = {&accp, &C,   &Dp,      &ty,  &m,   &n,   &batch, &ld,     &stride,
                        &al,   &be,  &sa,      &sb,  &epi, &bias, &bias_ty, &aux, &aux_ld};
        st = cu_status(fn, "cuLaunchKernel(epilogue)",
                       drv->cuLaunchKernel(h->epilogue, grid_for(nacc), 1, 1, 256, 1, 1, 0, s, args, nullptr));
    }
    if (st == HIPBLAS_STATUS_SUCCESS && p.epi == 4) {
        // hipBLASLt's B is op(B) k x n: stored k x n (N) or n x k (T).
        const void* bp = B;
        int bty = p.hb, k = p.k, n = p.n, trans = dd->trans_b == HIPBLAS_OP_T, out_ty = p.bias_ty;
        long long ldb = L(b)->ld;
        void* out = const_cast<void*>(dd->bias);
        void* args[] = {&bp, &bty, &k, &n, &ldb, &trans, &out, &out_ty};
        st = cu_status(fn, "cuLaunchKernel(bgradb)",
                       drv->cuLaunchKernel(h->bgradb, grid_for(static_cast<uint64_t>(n)), 1, 1, 256, 1, 1, 0, s,
                                           args, nullptr));
    }
    for (CUdeviceptr ptr : {a16, b16, acc})
        if (ptr) drv->cuMemFreeAsync(ptr, s);
    return st;
}
