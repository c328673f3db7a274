// hip-on-cuda: librocblas over cuBLAS. A TEST DOUBLE (../README.md).
//
// rocblas_gemm_strided_batched_ex maps onto cublasGemmStridedBatchedEx: both are column-major
// with the same operand conventions, f32 compute and host alpha/beta (rocBLAS's default pointer
// mode). D must be C (same pointer, type and layout) unless beta is 0 (then C is not read), as
// duet calls it; other forms, types, compute types, algorithms and flags are refused by name.
// The atomics mode is kept per handle and passed to cublasSetAtomicsMode; its default is
// rocBLAS's own (allowed in rocBLAS 4 / ROCm 6, not allowed in rocBLAS 5 / ROCm 7).
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <rocblas/rocblas.h>

#include "common.h"
#include "cublas_side.h"

#include <cstdio>
#include <cstring>
#include <string>

using hoc::fail;

struct _rocblas_handle {
    void* cublas = nullptr;
    rocblas_atomics_mode atomics = HIP_VERSION_MAJOR >= 7 ? rocblas_atomics_not_allowed
                                                          : rocblas_atomics_allowed;
    hipStream_t stream = nullptr;
};

namespace {

// rocBLAS 4.4 (ROCm 6.4) / 5.x (ROCm 7): the version this stand-in's headers are.
std::string version_string() {
    return std::to_string(ROCBLAS_VERSION_MAJOR) + "." + std::to_string(ROCBLAS_VERSION_MINOR) + "." +
           std::to_string(ROCBLAS_VERSION_PATCH) + " (hip-on-cuda stand-in over " +
           hoc::blas::version() + ")";
}

bool blas_type(rocblas_datatype t, hoc::blas::Ty* out) {
    switch (t) {
        case rocblas_datatype_f32_r: *out = hoc::blas::Ty::F32; return true;
        case rocblas_datatype_f16_r: *out = hoc::blas::Ty::F16; return true;
        case rocblas_datatype_bf16_r: *out = hoc::blas::Ty::BF16; return true;
        default: return false;
    }
}

rocblas_status from_cublas(const char* fn, int s) {
    if (s == 0) return rocblas_status_success;
    fail(fn, "cuBLAS returned %s", hoc::blas::status_name(s));
    return s == 3 /* CUBLAS_STATUS_ALLOC_FAILED */ ? rocblas_status_memory_error
                                                   : rocblas_status_internal_error;
}

}  // namespace

HOC_API rocblas_status rocblas_create_handle(rocblas_handle* handle) {
    if (!handle) return rocblas_status_invalid_pointer;
    std::string why;
    if (!hoc::driver(&why)) return rocblas_status_not_implemented;
    CUdevice dev;
    if (hoc::current_device("rocblas_create_handle", &dev) != CUDA_SUCCESS)
        return rocblas_status_internal_error;
    if (!hoc::blas::available(&why)) {
        fail("rocblas_create_handle", "%s", why.c_str());
        return rocblas_status_not_implemented;
    }
    auto* h = new _rocblas_handle;
    rocblas_status s = from_cublas("rocblas_create_handle", hoc::blas::create(&h->cublas));
    if (s == rocblas_status_success)
        s = from_cublas("rocblas_create_handle",
                        hoc::blas::set_atomics(h->cublas, h->atomics == rocblas_atomics_allowed));
    if (s != rocblas_status_success) {
        if (h->cublas) hoc::blas::destroy(h->cublas);
        delete h;
        return s;
    }
    *handle = h;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_destroy_handle(rocblas_handle handle) {
    if (!handle) return rocblas_status_invalid_handle;
    rocblas_status s = from_cublas("rocblas_destroy_handle", hoc::blas::destroy(handle->cublas));
    delete handle;
    return s;
}

HOC_API rocblas_status rocblas_set_stream(rocblas_handle handle, hipStream_t stream) {
    if (!handle) return rocblas_status_invalid_handle;
    handle->stream = stream;
    return from_cublas("rocblas_set_stream", hoc::blas::set_stream(handle->cublas, stream));
}

HOC_API rocblas_status rocblas_set_atomics_mode(rocblas_handle handle, rocblas_atomics_mode mode) {
    if (!handle) return rocblas_status_invalid_handle;
    if (mode != rocblas_atomics_allowed && mode != rocblas_atomics_not_allowed) {
        fail("rocblas_set_atomics_mode", "mode %d", static_cast<int>(mode));
        return rocblas_status_invalid_value;
    }
    rocblas_status s = from_cublas("rocblas_set_atomics_mode",
                                   hoc::blas::set_atomics(handle->cublas, mode == rocblas_atomics_allowed));
    if (s == rocblas_status_success) handle->atomics = mode;
    return s;
}

HOC_API rocblas_status rocblas_get_atomics_mode(rocblas_handle handle, rocblas_atomics_mode* mode) {
    if (!handle) return rocblas_status_invalid_handle;
    if (!mode) return rocblas_status_invalid_pointer;
    *mode = handle->atomics;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_get_version_string_size(size_t* len) {
    if (!len) return rocblas_status_invalid_pointer;
    *len = version_string().size() + 1;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_get_version_string(char* buf, size_t len) {
    if (!buf) return rocblas_status_invalid_pointer;
    std::string v = version_string();
    if (len < v.size() + 1) return rocblas_status_invalid_size;
    std::memcpy(buf, v.c_str(), v.size() + 1);
    return rocblas_status_success;
}

#undef rocblas_gemm_strided_batched_ex
HOC_API rocblas_status rocblas_gemm_strided_batched_ex(
    rocblas_handle handle, rocblas_operation trans_a, rocblas_operation trans_b, rocblas_int m,
    rocblas_int n, rocblas_int k, const void* alpha, const void* a, rocblas_datatype a_type,
    rocblas_int lda, rocblas_stride stride_a, const void* b, rocblas_datatype b_type, rocblas_int ldb,
    rocblas_stride stride_b, const void* beta, const void* c, rocblas_datatype c_type,
    rocblas_int ldc, rocblas_stride stride_c, void* d, rocblas_datatype d_type, rocblas_int ldd,
    rocblas_stride stride_d, rocblas_int batch_count, rocblas_datatype compute_type,
    rocblas_gemm_algo algo, int32_t solution_index, uint32_t flags) {
    const char* fn = "rocblas_gemm_strided_batched_ex";
    if (!handle) return rocblas_status_invalid_handle;
    if (!alpha || !beta) return rocblas_status_invalid_pointer;
    if (m < 0 || n < 0 || k < 0 || batch_count < 0) return rocblas_status_invalid_size;
    auto op_ok = [](rocblas_operation o) {
        return o == rocblas_operation_none || o == rocblas_operation_transpose;
    };
    if (!op_ok(trans_a) || !op_ok(trans_b)) {
        fail(fn, "operations %d/%d (only none and transpose are implemented)", trans_a, trans_b);
        return rocblas_status_not_implemented;
    }
    if (compute_type != rocblas_datatype_f32_r) {
        fail(fn, "compute type %d (only f32_r is implemented)", compute_type);
        return rocblas_status_not_implemented;
    }
    if (algo != rocblas_gemm_algo_standard || solution_index != 0 || flags != rocblas_gemm_flags_none) {
        fail(fn, "algo %d, solution %d, flags 0x%x (only the standard algorithm, no flags)", algo,
             solution_index, flags);
        return rocblas_status_not_implemented;
    }
    hoc::blas::Ty at, bt, ct;
    if (!blas_type(a_type, &at) || !blas_type(b_type, &bt) || !blas_type(c_type, &ct) ||
        a_type != b_type || d_type != c_type ||
        !(c_type == a_type || c_type == rocblas_datatype_f32_r)) {
        fail(fn, "types a=%d b=%d c=%d d=%d (a = b in f32/f16/bf16, c = d = a or f32)", a_type,
             b_type, c_type, d_type);
        return rocblas_status_not_implemented;
    }
    const float beta_v = *static_cast<const float*>(beta);
    if (c != d || ldc != ldd || stride_c != stride_d) {
        if (beta_v != 0.0f) {
            fail(fn, "D distinct from C with beta != 0 is not implemented");
            return rocblas_status_not_implemented;
        }
    }
    if (m == 0 || n == 0 || batch_count == 0) return rocblas_status_success;
    if (!d || (k > 0 && (!a || !b))) return rocblas_status_invalid_pointer;
    return from_cublas(fn, hoc::blas::gemm(handle->cublas, trans_a == rocblas_operation_transpose,
                                           trans_b == rocblas_operation_transpose, m, n, k,
                                           static_cast<const float*>(alpha), a, at, lda, stride_a, b,
                                           bt, ldb, stride_b, &beta_v, d, ct, ldd, stride_d,
                                           batch_count));
}
