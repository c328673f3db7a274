// Fused softmax + cross-entropy. One block per row: grid (n rows); the block size follows the
// vocabulary exactly as on CUDA (ceil(ceil(v / 4) / 32) * 32 threads, clamped to 32..1024; see
// ops/loss.rs), and so do the reductions and roundings: kernels-cuda/cross_entropy.cu's bits.
// Entry names and arguments match kernels-cuda, less its error word (the HIP backend checks the
// targets on the host side of the stream, ops/loss.rs).
#include "duet_hip.h"

// Rows of ld >= v logits, of which the first v are the vocabulary's (the rest: padding, not read,
// gradient 0). losses[r] = logsumexp(logits[r, :v]) - logits[r, target]; with dlogits != null also
// dlogits[r, :v] = (softmax(logits[r, :v]) - onehot(target)) * grad_scale, dlogits[r, v:ld] = 0. A negative target gives
// loss 0 and a zero gradient row; a target >= v gives a NaN loss and a zero gradient row.
#define DUET_CE(N, T)                                                                          \
    DUET_KERNEL_1024 cross_entropy_##N(const T* __restrict__ logits,                             \
                                       const int* __restrict__ targets,                          \
                                       float* __restrict__ losses, T* __restrict__ dlogits,      \
                                       int v, int ld, float grad_scale) {                        \
        __shared__ float sh[DUET_MAX_GROUPS];                                                     \
        const duet_u64 row = blockIdx.x;                                                          \
        const duet_u64 base = row * ld;                                                           \
        float mx = -duet_u2f(0x7f800000u);                                                        \
        for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, duet_ld(logits, base + j)); \
        mx = duet_block_max(mx, sh);                                                              \
        float s = 0.0f;                                                                           \
        for (int j = threadIdx.x; j < v; j += blockDim.x)                                         \
            s = duet_fadd(s, duet_exp_f32(duet_fsub(duet_ld(logits, base + j), mx)));             \
        s = duet_block_sum(s, sh);                                                                \
        const int tgt = targets[row];                                                             \
        const bool valid = tgt >= 0 && tgt < v;                                                   \
        if (threadIdx.x == 0) {                                                                   \
            float loss = 0.0f;                                                                    \
            if (valid)                                                                            \
                loss = duet_fsub(duet_fadd(duet_log_f32(s), mx), duet_ld(logits, base + tgt));    \
            else if (tgt >= v)                                                                    \
                loss = duet_u2f(0x7fc00000u);                                                     \
            losses[row] = loss;                                                                   \
        }                                                                                         \
        if (dlogits) {                                                                            \
            for (int j = threadIdx.x; j < ld; j += blockDim.x) {                                  \
                float g = 0.0f;                                                                   \
                if (valid && j < v) {                                                             \
                    const float p =                                                               \
                        duet_fdiv(duet_exp_f32(duet_fsub(duet_ld(logits, base + j), mx)), s);     \
                    g = duet_fmul(duet_fsub(p, j == tgt ? 1.0f : 0.0f), grad_scale);              \
                }                                                                                 \
                duet_st(dlogits, base + j, g);                                                    \
            }                                                                                     \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_CE)
