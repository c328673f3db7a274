// hip-on-cpu: librocblas on the CPU. A TEST DOUBLE (../README.md).
//
// rocblas_gemm_strided_batched_ex as plain loops (cpu_gemm.h: f32 accumulation in k order),
// enqueued on the handle's stream (so a recorded graph replays it). f32 compute and host
// alpha/beta (rocBLAS's default pointer mode); D must be C (same pointer, type and layout) unless
// beta is 0, as duet calls it; other forms, types, compute types, algorithms and flags are
// refused by name.
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <rocblas/rocblas.h>

#include "core.h"
#include "cpu_gemm.h"

#include <cstdio>
#include <cstring>
#include <string>

using hoc::fail;

struct _rocblas_handle {
    rocblas_atomics_mode atomics = HIP_VERSION_MAJOR >= 7 ? rocblas_atomics_not_allowed : rocblas_atomics_allowed;
    hipStream_t stream = nullptr;
};

namespace {

std::string version_string() {
    return std::to_string(ROCBLAS_VERSION_MAJOR) + "." + std::to_string(ROCBLAS_VERSION_MINOR) + "." +
           std::to_string(ROCBLAS_VERSION_PATCH) + " (hip-on-cpu stand-in: CPU loops, f32 accumulation)";
}

bool blas_type(rocblas_datatype t, hoc::Ty* out) {
    switch (t) {
        case rocblas_datatype_f32_r: *out = hoc::Ty::F32; return true;
        case rocblas_datatype_f16_r: *out = hoc::Ty::F16; return true;
        case rocblas_datatype_bf16_r: *out = hoc::Ty::BF16; return true;
        default: return false;
    }
}

}  // namespace

HOC_API rocblas_status rocblas_create_handle(rocblas_handle* handle) {
    if (!handle) return rocblas_status_invalid_pointer;
    if (!hoc::settings().error.empty()) return rocblas_status_not_implemented;
    *handle = new _rocblas_handle;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_destroy_handle(rocblas_handle handle) {
    if (!handle) return rocblas_status_invalid_handle;
    delete handle;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_set_stream(rocblas_handle handle, hipStream_t stream) {
    if (!handle) return rocblas_status_invalid_handle;
    handle->stream = stream;
    return rocblas_status_success;
}

HOC_API rocblas_status rocblas_set_atomics_mode(rocblas_handle handle, rocblas_atomics_mode mode) {
    if (!handle) return rocblas_status_invalid_handle;
    if (mode != rocblas_atomics_allowed && mode != rocblas_atomics_not_allowed) {
        fail("rocblas_set_atomics_mode", "mode %d", static_cast<int>(mode));
        return rocblas_status_invalid_value;
    }
    handle->atomics = mode;  // the loops are deterministic either way
    return rocblas_status_success;
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
    hoc::Ty at, bt, ct;
    if (!blas_type(a_type, &at) || !blas_type(b_type, &bt) || !blas_type(c_type, &ct) ||
        a_type != b_type || d_type != c_type || !(c_type == a_type || c_type == rocblas_datatype_f32_r)) {
        fail(fn, "types a=%d b=%d c=%d d=%d (a = b in f32/f16/bf16, c = d = a or f32)", a_type, b_type,
             c_type, d_type);
        return rocblas_status_not_implemented;
    }
    const float alpha_v = *static_cast<const float*>(alpha);
    const float beta_v = *static_cast<const float*>(beta);
    if ((c != d || ldc != ldd || stride_c != stride_d) && beta_v != 0.0f) {
        fail(fn, "D distinct from C with beta != 0 is not implemented");
        return rocblas_status_not_implemented;
    }
    if (m == 0 || n == 0 || batch_count == 0) return rocblas_status_success;
    if (!d || (k > 0 && (!a || !b))) return rocblas_status_invalid_pointer;
    const bool ta = trans_a == rocblas_operation_transpose, tb = trans_b == rocblas_operation_transpose;
    int st = hoc::submit(handle->stream, [=] {
        std::vector<float> acc(static_cast<size_t>(m) * n);
        for (int bi = 0; bi < batch_count; bi++) {
            const char* ab = static_cast<const char*>(a) + hoc::ty_size(at) * static_cast<size_t>(stride_a) * bi;
            const char* bb = static_cast<const char*>(b) + hoc::ty_size(bt) * static_cast<size_t>(stride_b) * bi;
            char* db = static_cast<char*>(d) + hoc::ty_size(ct) * static_cast<size_t>(stride_d) * bi;
            if (k > 0)
                hoc::gemm_acc(ta, tb, m, n, k, ab, at, lda, bb, bt, ldb, acc.data());
            else
                std::fill(acc.begin(), acc.end(), 0.0f);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    const size_t at_d = static_cast<size_t>(j) * ldd + i;
                    float v = alpha_v * acc[static_cast<size_t>(j) * m + i];
                    if (beta_v != 0.0f) v = v + beta_v * hoc::load(db, at_d, ct);
                    hoc::store(db, at_d, ct, v);
                }
        }
        return 0;
    });
    return st ? rocblas_status_internal_error : rocblas_status_success;
}
