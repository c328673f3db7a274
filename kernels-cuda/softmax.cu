// Causal scaled softmax over `rows` independent t × t score matrices, forward and backward.
//
// One warp per query row i (8 rows per 256-thread block); only columns j ≤ i are read, columns
// above the diagonal are written as 0. Max and sum are warp-shuffle reductions in f32. Every
// rounding is explicit and e^x is duet_exp_f32 (common.cuh's shared math), so kernels-hip's
// softmax, written the same way, computes the same bits on AMD.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void softmax_causal_forward_body(const T* __restrict__ scores,
                                                            T* __restrict__ probs, u64 total_rows,
                                                            int t, float scale) {
    const int lane = threadIdx.x & 31;
    const u64 row = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= total_rows) return;
    const int i = (int)(row % (u64)t);
    const T* s = scores + row * t;
    T* p = probs + row * t;
    float mx = NEG_INF;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, __fmul_rn(scale, to_f32(s[j])));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32)
        sum = __fadd_rn(sum, duet_exp_f32(__fsub_rn(__fmul_rn(scale, to_f32(s[j])), mx)));
    sum = warp_sum(sum);
    for (int j = lane; j < t; j += 32)
        p[j] = from_f32<T>(
            j <= i ? __fdiv_rn(duet_exp_f32(__fsub_rn(__fmul_rn(scale, to_f32(s[j])), mx)), sum)
                   : 0.0f);
}

// dscores[i, j] = scale · P[i, j] · (dP[i, j] − Σ_k P[i, k] · dP[i, k]) for j ≤ i, else 0.
template <typename T>
__device__ __forceinline__ void softmax_causal_backward_body(const T* __restrict__ probs,
                                                             const T* __restrict__ dprobs,
                                                             T* __restrict__ dscores,
                                                             u64 total_rows, int t, float scale) {
    const int lane = threadIdx.x & 31;
    const u64 row = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= total_rows) return;
    const int i = (int)(row % (u64)t);
    const T* p = probs + row * t;
    const T* dp = dprobs + row * t;
    T* ds = dscores + row * t;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += 32) dot = __fmaf_rn(to_f32(p[j]), to_f32(dp[j]), dot);
    dot = warp_sum(dot);
    for (int j = lane; j < t; j += 32)
        ds[j] = from_f32<T>(
            j <= i ? __fmul_rn(__fmul_rn(scale, to_f32(p[j])), __fsub_rn(to_f32(dp[j]), dot)) : 0.0f);
}

#define SOFTMAX(T, S)                                                                         \
    extern "C" __global__ void softmax_causal_forward_##S(                                    \
        const T* __restrict__ scores, T* __restrict__ probs, u64 total_rows, int t,           \
        float scale) {                                                                        \
        softmax_causal_forward_body(scores, probs, total_rows, t, scale);                     \
    }                                                                                         \
    extern "C" __global__ void softmax_causal_backward_##S(                                   \
        const T* __restrict__ probs, const T* __restrict__ dprobs, T* __restrict__ dscores,   \
        u64 total_rows, int t, float scale) {                                                 \
        softmax_causal_backward_body(probs, dprobs, dscores, total_rows, t, scale);           \
    }
FOR_FLOAT(SOFTMAX)
