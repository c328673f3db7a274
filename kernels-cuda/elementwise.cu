// Elementwise ops: scale, add, add_assign, GELU (tanh approximation) and bias add.
// (bias_backward is a column sum: colsum_partial/colsum_finish in reduce.cu.)
//
// Every kernel is a grid-stride loop over 16-byte packs (4 f32 or 8 bf16/f16 per 128-bit access)
// followed by a scalar tail. Buffers start at allocation boundaries (256-byte aligned), so packs
// are aligned.
#include "common.cuh"

// gelu_f / gelu_grad_f: common.cuh.

// out[i] = f(a[i]) for one input, vectorised.
template <typename T, typename F>
__device__ __forceinline__ void map1(const T* a, T* out, u64 n, F f) {
    const int N = Pack<T>::N;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 packs = n / N;
    for (u64 i = first; i < packs; i += stride) {
        Pack<T> x = load_pack(a + i * N);
        Pack<T> y;
#pragma unroll
        for (int j = 0; j < N; ++j) y.v[j] = from_f32<T>(f(to_f32(x.v[j])));
        store_pack(out + i * N, y);
    }
    for (u64 i = packs * N + first; i < n; i += stride) out[i] = from_f32<T>(f(to_f32(a[i])));
}

// out[i] = f(a[i], b[i]) for two inputs, vectorised. `out` may alias `a` (in-place updates).
template <typename T, typename F>
__device__ __forceinline__ void map2(const T* a, const T* b, T* out, u64 n, F f) {
    const int N = Pack<T>::N;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 packs = n / N;
    for (u64 i = first; i < packs; i += stride) {
        Pack<T> x = load_pack(a + i * N);
        Pack<T> y = load_pack(b + i * N);
        Pack<T> z;
#pragma unroll
        for (int j = 0; j < N; ++j) z.v[j] = from_f32<T>(f(to_f32(x.v[j]), to_f32(y.v[j])));
        store_pack(out + i * N, z);
    }
    for (u64 i = packs * N + first; i < n; i += stride)
        out[i] = from_f32<T>(f(to_f32(a[i]), to_f32(b[i])));
}

#define ELEMENTWISE(T, S)                                                                     \
    extern "C" __global__ void scale_##S(T* x, float alpha, u64 n) {                          \
        map1(x, x, n, [=](float v) { return v * alpha; });                                    \
    }                                                                                         \
    extern "C" __global__ void add_##S(const T* __restrict__ a, const T* __restrict__ b,      \
                                       T* __restrict__ out, u64 n) {                          \
        map2(a, b, out, n, [](float x, float y) { return x + y; });                           \
    }                                                                                         \
    extern "C" __global__ void gelu_forward_##S(const T* __restrict__ x, T* __restrict__ out, \
                                                u64 n) {                                      \
        map1(x, out, n, [](float v) { return gelu_f(v); });                                   \
    }                                                                                         \
    extern "C" __global__ void gelu_backward_##S(const T* __restrict__ x,                     \
                                                 const T* __restrict__ dout,                  \
                                                 T* __restrict__ dx, u64 n) {                 \
        map2(x, dout, dx, n, [](float v, float d) { return gelu_grad_f(v) * d; });            \
    }
FOR_FLOAT(ELEMENTWISE)

// dst[i] += src[i] (gradient accumulation); dst and src may differ in dtype (e.g. f32 += bf16).
template <typename D, typename S>
__device__ __forceinline__ void add_assign_body(D* dst, const S* __restrict__ src, u64 n) {
    if constexpr (sizeof(D) == sizeof(S) && Pack<D>::N == Pack<S>::N) {
        const int N = Pack<D>::N;
        const u64 stride = (u64)gridDim.x * blockDim.x;
        const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
        for (u64 i = first; i < n / N; i += stride) {
            Pack<D> d = load_pack(dst + i * N);
            Pack<S> x = load_pack(src + i * N);
#pragma unroll
            for (int j = 0; j < N; ++j) d.v[j] = from_f32<D>(to_f32(d.v[j]) + to_f32(x.v[j]));
            store_pack(dst + i * N, d);
        }
        for (u64 i = (n / N) * N + first; i < n; i += stride)
            dst[i] = from_f32<D>(to_f32(dst[i]) + to_f32(src[i]));
    } else {
        const u64 stride = (u64)gridDim.x * blockDim.x;
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
            dst[i] = from_f32<D>(to_f32(dst[i]) + to_f32(src[i]));
    }
}

#define ADD_ASSIGN(D, SD, S, SS)                                                              \
    extern "C" __global__ void add_assign_##SD##_##SS(D* dst, const S* __restrict__ src,      \
                                                      u64 n) {                                \
        add_assign_body(dst, src, n);                                                         \
    }
FOR_FLOAT_PAIRS(ADD_ASSIGN)

// x[r, j] += bias[j] for x (rows × c). With c a multiple of the pack width every pack lies in
// one row, so x moves in 128-bit accesses; otherwise element by element.
template <typename A, typename P>
__device__ __forceinline__ void bias_add_body(A* x, const P* __restrict__ bias, u64 rows, u64 c) {
    const int N = Pack<A>::N;
    const u64 n = rows * c;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c % N == 0) {
        for (u64 i = first; i < n / N; i += stride) {
            const u64 col = (i * N) % c;
            Pack<A> v = load_pack(x + i * N);
#pragma unroll
            for (int j = 0; j < N; ++j) v.v[j] = from_f32<A>(to_f32(v.v[j]) + to_f32(bias[col + j]));
            store_pack(x + i * N, v);
        }
    } else {
        for (u64 i = first; i < n; i += stride) x[i] = from_f32<A>(to_f32(x[i]) + to_f32(bias[i % c]));
    }
}

#define BIAS_ADD(A, SA, P, SP)                                                                \
    extern "C" __global__ void bias_add_##SA##_##SP(A* x, const P* __restrict__ bias,         \
                                                    u64 rows, u64 c) {                        \
        bias_add_body(x, bias, rows, c);                                                      \
    }
FOR_ACT_AND_WIDE(BIAS_ADD)
