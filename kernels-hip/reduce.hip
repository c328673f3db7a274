// Deterministic sum of squares for the global gradient norm, in two passes.
#include "duet_hip.h"

// Pass 1: partial[block] = sum over the block's grid-stride elements of x^2.
// Launch: grid (g) with g fixed by n alone (the backend uses min(ceil(n/256), 1024)), block 256.
#define DUET_SUMSQ_PARTIAL(N, T)                                                               \
    DUET_KERNEL sum_squares_partial_##N(const T* __restrict__ x, float* __restrict__ partial,   \
                                        duet_u64 n) {                                          \
        __shared__ float sh[DUET_MAX_WAVES];                                                   \
        float s = 0.0f;                                                                        \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float a = duet_ld(x, i);                                                     \
            s += a * a;                                                                        \
        }                                                                                      \
        s = duet_block_sum(s, sh);                                                             \
        if (threadIdx.x == 0) partial[blockIdx.x] = s;                                         \
    }
DUET_FOR_FLOAT(DUET_SUMSQ_PARTIAL)

// Pass 2: out[slot] += sum of partial[0..g) (fixed order). Launch: grid (1), block 256.
DUET_KERNEL sum_squares_finish(const float* __restrict__ partial, int g, float* __restrict__ out,
                               int slot) {
    __shared__ float sh[DUET_MAX_WAVES];
    float s = 0.0f;
    for (int k = threadIdx.x; k < g; k += blockDim.x) s += partial[k];
    s = duet_block_sum(s, sh);
    if (threadIdx.x == 0) out[slot] += s;
}
