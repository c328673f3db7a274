// hip-on-cuda: cuBLAS behind plain types. cuBLAS's headers (through cuComplex.h/vector_types.h)
// clash with HIP's vector types, so only cublas_side.cpp includes them; rocblas.cpp and
// hipblaslt.cpp call through here.
#pragma once

#include <string>

namespace hoc::blas {

enum class Ty { F32, F16, BF16 };

// cuBLAS loaded (libcublas.so.13/.12) or the reason it is not.
bool available(std::string* why);
// cublasStatus_t values; 0 is success.
int create(void** handle);
int destroy(void* handle);
int set_stream(void* handle, void* cu_stream);
int set_atomics(void* handle, bool allowed);
// cublasGemmStridedBatchedEx with f32 compute (CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) and host
// alpha/beta: column-major C = alpha op(A) op(B) + beta C.
int gemm(void* handle, bool trans_a, bool trans_b, int m, int n, int k, const float* alpha,
         const void* a, Ty a_ty, int lda, long long stride_a, const void* b, Ty b_ty, int ldb,
         long long stride_b, const float* beta, void* c, Ty c_ty, int ldc, long long stride_c,
         int batch);
const char* status_name(int status);
std::string version();

}  // namespace hoc::blas
