// hip-on-cuda: the cuBLAS calls of the rocBLAS and hipBLASLt stand-ins (see cublas_side.h).
#include "cublas_side.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>

#define HOC_STR(x) #x
#define HOC_XSTR(x) HOC_STR(x)

#define HOC_BLAS_FUNCS(X)                                                                   \
    X(cublasCreate) X(cublasDestroy) X(cublasSetStream) X(cublasSetAtomicsMode)            \
    X(cublasGetStatusName) X(cublasGetProperty)

// cublas_api.h overloads cublasGemmStridedBatchedEx in C++ (a legacy cudaDataType compute
// type); the pointer type picks the cublasComputeType_t one, and the decltype below makes the
// compiler check it against the header.
using GemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                  int, const void*, const void*, cudaDataType, int, long long,
                                  const void*, cudaDataType, int, long long, const void*, void*,
                                  cudaDataType, int, long long, int, cublasComputeType_t,
                                  cublasGemmAlgo_t);
using GemmFnChecked = decltype(static_cast<GemmFn>(&::cublasGemmStridedBatchedEx));

namespace hoc::blas {
namespace {
struct Lib {
#define HOC_MEMBER(f) decltype(&::f) f;
    HOC_BLAS_FUNCS(HOC_MEMBER)
#undef HOC_MEMBER
    GemmFnChecked cublasGemmStridedBatchedEx;
};
Lib g_lib;
bool g_ok = false;
std::string g_why;
std::once_flag g_once;

void load() {
    void* h = nullptr;
    for (const char* n : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
        h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
        if (h) break;
    }
    if (!h) {
        const char* e = dlerror();
        g_why = std::string("cuBLAS (libcublas.so.13/.12) could not be opened: ") + (e ? e : "?");
        return;
    }
#define HOC_LOAD(f)                                                              \
    g_lib.f = reinterpret_cast<decltype(g_lib.f)>(dlsym(h, HOC_XSTR(f)));           \
    if (!g_lib.f) {                                                              \
        g_why = std::string("libcublas does not export ") + HOC_XSTR(f);         \
        return;                                                                  \
    }
    HOC_BLAS_FUNCS(HOC_LOAD)
    HOC_LOAD(cublasGemmStridedBatchedEx)
#undef HOC_LOAD
    g_ok = true;
}

const Lib* lib() {
    std::call_once(g_once, load);
    return g_ok ? &g_lib : nullptr;
}

cudaDataType_t ty(Ty t) {
    switch (t) {
        case Ty::F32: return CUDA_R_32F;
        case Ty::F16: return CUDA_R_16F;
        case Ty::BF16: return CUDA_R_16BF;
    }
    return CUDA_R_32F;
}
}  // namespace

bool available(std::string* why) {
    if (lib()) return true;
    if (why) *why = g_why;
    return false;
}

int create(void** handle) {
    const Lib* l = lib();
    if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
    cublasHandle_t h = nullptr;
    cublasStatus_t s = l->cublasCreate(&h);
    *handle = h;
    return s;
}

int destroy(void* handle) {
    const Lib* l = lib();
    return l ? l->cublasDestroy(static_cast<cublasHandle_t>(handle)) : CUBLAS_STATUS_NOT_INITIALIZED;
}

int set_stream(void* handle, void* stream) {
    const Lib* l = lib();
    return l ? l->cublasSetStream(static_cast<cublasHandle_t>(handle),
                                  static_cast<cudaStream_t>(stream))
             : CUBLAS_STATUS_NOT_INITIALIZED;
}

int set_atomics(void* handle, bool allowed) {
    const Lib* l = lib();
    return l ? l->cublasSetAtomicsMode(static_cast<cublasHandle_t>(handle),
                                       allowed ? CUBLAS_ATOMICS_ALLOWED : CUBLAS_ATOMICS_NOT_ALLOWED)
             : CUBLAS_STATUS_NOT_INITIALIZED;
}

int gemm(void* handle, bool trans_a, bool trans_b, int m, int n, int k, const float* alpha,
         const void* a, Ty a_ty, int lda, long long stride_a, const void* b, Ty b_ty, int ldb,
         long long stride_b, const float* beta, void* c, Ty c_ty, int ldc, long long stride_c,
         int batch) {
    const Lib* l = lib();
    if (!l) return CUBLAS_STATUS_NOT_INITIALIZED;
    return l->cublasGemmStridedBatchedEx(
        static_cast<cublasHandle_t>(handle), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
        trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, alpha, a, ty(a_ty), lda, stride_a, b, ty(b_ty),
        ldb, stride_b, beta, c, ty(c_ty), ldc, stride_c, batch, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
}

const char* status_name(int status) {
    const Lib* l = lib();
    return l ? l->cublasGetStatusName(static_cast<cublasStatus_t>(status)) : "cuBLAS not loaded";
}

std::string version() {
    const Lib* l = lib();
    if (!l) return "cuBLAS not loaded";
    int ma = 0, mi = 0, pa = 0;
    if (l->cublasGetProperty(MAJOR_VERSION, &ma) || l->cublasGetProperty(MINOR_VERSION, &mi) ||
        l->cublasGetProperty(PATCH_LEVEL, &pa))
        return "cuBLAS ?";
    return "cuBLAS " + std::to_string(ma) + "." + std::to_string(mi) + "." + std::to_string(pa);
}

}  // namespace hoc::blas
