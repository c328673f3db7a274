// Attention helpers: head split/merge permutations and the causal scaled softmax. Entry names
// and arguments match kernels-cuda.
#include "duet_hip.h"

// qkv (b, t, 3, nh, hs) -> q, k, v (b, nh, t, hs). Grid-stride over b*nh*t*hs.
#define DUET_SPLIT(N, T)                                                                      \
    DUET_KERNEL split_heads_##N(const T* __restrict__ qkv, T* __restrict__ q, T* __restrict__ k, \
                                T* __restrict__ v, int b, int t, int nh, int hs) {             \
        const duet_u64 n = (duet_u64)b * nh * t * hs;                                          \
        const int c = nh * hs;                                                                 \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const int d = (int)(i % hs);                                                       \
            const int tt = (int)((i / hs) % t);                                                \
            const int h = (int)((i / ((duet_u64)hs * t)) % nh);                                \
            const int bb = (int)(i / ((duet_u64)hs * t * nh));                                 \
            const duet_u64 src = ((duet_u64)bb * t + tt) * 3 * c + (duet_u64)h * hs + d;       \
            duet_st(q, i, duet_ld(qkv, src));                                                  \
            duet_st(k, i, duet_ld(qkv, src + c));                                              \
            duet_st(v, i, duet_ld(qkv, src + 2 * (duet_u64)c));                                \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_SPLIT)

// dqkv (b, t, 3, nh, hs) <- dq, dk, dv (b, nh, t, hs) (overwrites). Grid-stride over dqkv.
#define DUET_SPLIT_BWD(N, T)                                                                   \
    DUET_KERNEL split_heads_backward_##N(const T* __restrict__ dq, const T* __restrict__ dk,     \
                                         const T* __restrict__ dv, T* __restrict__ dqkv, int b,  \
                                         int t, int nh, int hs) {                                \
        const duet_u64 n = (duet_u64)b * t * 3 * nh * hs;                                       \
        DUET_GRID_STRIDE(i, n) {                                                                \
            const int d = (int)(i % hs);                                                        \
            const int h = (int)((i / hs) % nh);                                                 \
            const int s = (int)((i / ((duet_u64)hs * nh)) % 3);                                 \
            const int tt = (int)((i / ((duet_u64)hs * nh * 3)) % t);                            \
            const int bb = (int)(i / ((duet_u64)hs * nh * 3 * t));                              \
            const duet_u64 src = (((duet_u64)bb * nh + h) * t + tt) * hs + d;                   \
            const T* from = s == 0 ? dq : (s == 1 ? dk : dv);                                   \
            duet_st(dqkv, i, duet_ld(from, src));                                               \
        }                                                                                       \
    }
DUET_FOR_ACT(DUET_SPLIT_BWD)

// merge_heads: out (b, t, nh*hs) <- y (b, nh, t, hs); merge_heads_backward: the inverse
// permutation, dy (b, nh, t, hs) <- dout (b, t, nh*hs). Grid-stride over b*nh*t*hs.
DUET_DEV duet_u64 duet_merged_index(duet_u64 i, int t, int nh, int hs) {
    const duet_u64 d = i % hs, tt = (i / hs) % t, h = (i / ((duet_u64)hs * t)) % nh,
                   bb = i / ((duet_u64)hs * t * nh);
    return (bb * t + tt) * nh * hs + h * hs + d;
}
#define DUET_MERGE(N, T)                                                                        \
    DUET_KERNEL merge_heads_##N(const T* __restrict__ y, T* __restrict__ out, int b, int t,       \
                                int nh, int hs) {                                                 \
        DUET_GRID_STRIDE(i, (duet_u64)b * nh * t * hs)                                            \
        duet_st(out, duet_merged_index(i, t, nh, hs), duet_ld(y, i));                             \
    }                                                                                             \
    DUET_KERNEL merge_heads_backward_##N(const T* __restrict__ dout, T* __restrict__ dy, int b,   \
                                         int t, int nh, int hs) {                                 \
        DUET_GRID_STRIDE(i, (duet_u64)b * nh * t * hs)                                            \
        duet_st(dy, i, duet_ld(dout, duet_merged_index(i, t, nh, hs)));                           \
    }
DUET_FOR_ACT(DUET_MERGE)

// probs[r, i, j] = softmax_j(scale * scores[r, i, j]) over j <= i, 0 above the diagonal, for
// total_rows = rows * t rows of length t. As kernels-cuda/softmax.cu: one 32-lane group per row,
// 8 rows per block (grid ceil(total_rows / 8), block DUET_BLOCK), the same explicit roundings
// and duet_exp_f32, so the same bits.
#define DUET_SOFTMAX_FWD(N, T)                                                                  \
    DUET_KERNEL softmax_causal_forward_##N(const T* __restrict__ scores, T* __restrict__ probs,   \
                                           duet_u64 total_rows, int t, float scale) {             \
        const int lane = threadIdx.x & 31;                                                        \
        const duet_u64 row = (duet_u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);       \
        if (row >= total_rows) return;                                                            \
        const int i = (int)(row % (duet_u64)t);                                                   \
        const duet_u64 base = row * t;                                                            \
        float mx = -duet_u2f(0x7f800000u);                                                        \
        for (int j = lane; j <= i; j += 32)                                                       \
            mx = fmaxf(mx, duet_fmul(scale, duet_ld(scores, base + j)));                          \
        mx = duet_warp_max(mx);                                                                   \
        float s = 0.0f;                                                                           \
        for (int j = lane; j <= i; j += 32)                                                       \
            s = duet_fadd(s, duet_exp_f32(duet_fsub(duet_fmul(scale, duet_ld(scores, base + j)), mx))); \
        s = duet_warp_sum(s);                                                                     \
        for (int j = lane; j < t; j += 32)                                                        \
            duet_st(probs, base + j,                                                              \
                    j <= i ? duet_fdiv(duet_exp_f32(duet_fsub(                                    \
                                           duet_fmul(scale, duet_ld(scores, base + j)), mx)),     \
                                       s)                                                         \
                           : 0.0f);                                                               \
    }
DUET_FOR_ACT(DUET_SOFTMAX_FWD)

// dscores = scale * P * (dP - sum_{j<=i} P dP), 0 above the diagonal (overwrites). Launch as
// the forward.
#define DUET_SOFTMAX_BWD(N, T)                                                                  \
    DUET_KERNEL softmax_causal_backward_##N(const T* __restrict__ probs,                          \
                                            const T* __restrict__ dprobs,                         \
                                            T* __restrict__ dscores, duet_u64 total_rows,        \
                                            int t, float scale) {                                 \
        const int lane = threadIdx.x & 31;                                                        \
        const duet_u64 row = (duet_u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);       \
        if (row >= total_rows) return;                                                            \
        const int i = (int)(row % (duet_u64)t);                                                   \
        const duet_u64 base = row * t;                                                            \
        float s = 0.0f;                                                                           \
        for (int j = lane; j <= i; j += 32)                                                       \
            s = duet_fma(duet_ld(probs, base + j), duet_ld(dprobs, base + j), s);                 \
        s = duet_warp_sum(s);                                                                     \
        for (int j = lane; j < t; j += 32) {                                                      \
            const float g = j <= i ? duet_fmul(duet_fmul(scale, duet_ld(probs, base + j)),        \
                                               duet_fsub(duet_ld(dprobs, base + j), s))           \
                                   : 0.0f;                                                        \
            duet_st(dscores, base + j, g);                                                        \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_SOFTMAX_BWD)
