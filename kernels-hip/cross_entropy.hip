// Fused softmax + cross-entropy. One block per row: grid (n rows), block DUET_BLOCK. Entry names
// and arguments match kernels-cuda.
#include "duet_hip.h"

// losses[r] = logsumexp(logits[r, :]) - logits[r, target]; with dlogits != null also
// dlogits[r, :] = (softmax(logits[r, :]) - onehot(target)) * grad_scale. A negative target gives
// loss 0 and a zero gradient row; a target >= v gives NaN (the host cannot check without a sync).
#define DUET_CE(N, T)                                                                          \
    DUET_KERNEL cross_entropy_##N(const T* __restrict__ logits, const int* __restrict__ targets,  \
                                  float* __restrict__ losses, T* __restrict__ dlogits, int v,      \
                                  float grad_scale) {                                      \
        __shared__ float sh[DUET_MAX_WAVES];                                                      \
        const int row = blockIdx.x;                                                               \
        const duet_u64 base = (duet_u64)row * v;                                                  \
        const int tgt = targets[row];                                                             \
        if (tgt < 0) {                                                                            \
            if (threadIdx.x == 0) losses[row] = 0.0f;                                             \
            if (dlogits)                                                                          \
                for (int j = threadIdx.x; j < v; j += blockDim.x) duet_st(dlogits, base + j, 0.0f); \
            return;                                                                               \
        }                                                                                         \
        float mx = -duet_u2f(0x7f800000u);                                                        \
        for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, duet_ld(logits, base + j)); \
        mx = duet_block_max(mx, sh);                                                              \
        float s = 0.0f;                                                                           \
        for (int j = threadIdx.x; j < v; j += blockDim.x) s += expf(duet_ld(logits, base + j) - mx); \
        s = duet_block_sum(s, sh);                                                                \
        const bool valid = tgt < v;                                                               \
        if (threadIdx.x == 0)                                                                     \
            losses[row] = valid ? logf(s) + mx - duet_ld(logits, base + tgt) : duet_u2f(0x7fc00000u); \
        if (dlogits) {                                                                            \
            const float inv = 1.0f / s;                                                           \
            for (int j = threadIdx.x; j < v; j += blockDim.x) {                                   \
                const float p = expf(duet_ld(logits, base + j) - mx) * inv;                       \
                const float g = valid ? (p - (j == tgt ? 1.0f : 0.0f)) * grad_scale               \
                                      : duet_u2f(0x7fc00000u);                                    \
                duet_st(dlogits, base + j, g);                                                    \
            }                                                                                     \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_CE)
