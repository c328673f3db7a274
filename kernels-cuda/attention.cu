// Attention head permutes.
//
//   split_heads:   qkv (b, t, 3, nh, hs) → q, k, v (b, nh, t, hs)      (and its backward)
//   merge_heads:   y (b, nh, t, hs) → out (b, t, nh·hs)                (and its backward)
//
// Each thread moves one 16-byte pack along hs when hs is a multiple of the pack width (hs = 64
// for GPT-2), otherwise one element. Both sides of every copy are contiguous along hs, so reads
// and writes are coalesced. gridDim.y selects q, k or v.
#include "common.cuh"

// Moves element (bi, h, ti, d) between the head-major layout (b, nh, t, hs) at `heads` and the
// token-major layout at `tokens`, whose rows (one per (bi, ti)) are `row_stride` elements apart
// and whose head block starts at `col_offset`. `to_heads` picks the direction.
template <typename T>
__device__ __forceinline__ void permute_heads(const T* __restrict__ src, T* __restrict__ dst,
                                              int b, int t, int nh, int hs, u64 row_stride,
                                              u64 col_offset, bool to_heads) {
    const u64 total = (u64)b * nh * t * hs;
    const int N = Pack<T>::N;
    const bool vec = hs % N == 0;
    const int step = vec ? N : 1;
    const u64 units = total / step;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += stride) {
        const u64 idx = u * step;  // index in the head-major layout
        const int d = (int)(idx % hs);
        u64 r = idx / hs;
        const int ti = (int)(r % t);
        r /= t;
        const int h = (int)(r % nh);
        const int bi = (int)(r / nh);
        const u64 tok = ((u64)bi * t + ti) * row_stride + col_offset + (u64)h * hs + d;
        const u64 from = to_heads ? tok : idx;
        const u64 to = to_heads ? idx : tok;
        if (vec) {
            store_pack(dst + to, load_pack(src + from));
        } else {
            dst[to] = src[from];
        }
    }
}

#define ATTENTION(T, S)                                                                       \
    extern "C" __global__ void split_heads_##S(const T* __restrict__ qkv, T* __restrict__ q,  \
                                               T* __restrict__ k, T* __restrict__ v, int b,   \
                                               int t, int nh, int hs) {                       \
        const int which = blockIdx.y;                                                         \
        T* dst = which == 0 ? q : (which == 1 ? k : v);                                       \
        const u64 c = (u64)nh * hs;                                                           \
        permute_heads(qkv, dst, b, t, nh, hs, 3 * c, which * c, true);                        \
    }                                                                                         \
    extern "C" __global__ void split_heads_backward_##S(                                      \
        const T* __restrict__ dq, const T* __restrict__ dk, const T* __restrict__ dv,         \
        T* __restrict__ dqkv, int b, int t, int nh, int hs) {                                 \
        const int which = blockIdx.y;                                                         \
        const T* src = which == 0 ? dq : (which == 1 ? dk : dv);                              \
        const u64 c = (u64)nh * hs;                                                           \
        permute_heads(src, dqkv, b, t, nh, hs, 3 * c, which * c, false);                      \
    }                                                                                         \
    extern "C" __global__ void merge_heads_##S(const T* __restrict__ y, T* __restrict__ out,  \
                                               int b, int t, int nh, int hs) {                \
        permute_heads(y, out, b, t, nh, hs, (u64)nh * hs, 0, false);                          \
    }                                                                                         \
    extern "C" __global__ void merge_heads_backward_##S(                                      \
        const T* __restrict__ dout, T* __restrict__ dy, int b, int t, int nh, int hs) {       \
        permute_heads(dout, dy, b, t, nh, hs, (u64)nh * hs, 0, true);                         \
    }
FOR_FLOAT(ATTENTION)
