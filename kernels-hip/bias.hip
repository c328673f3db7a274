// Bias add and bias gradient (deterministic column sums in two passes).
#include "duet_hip.h"

// x[r, j] += bias[j]. Grid-stride over rows*c.
#define DUET_BIAS_ADD(N, T)                                                                 \
    DUET_KERNEL bias_add_##N(T* __restrict__ x, const T* __restrict__ bias, int rows, int c) { \
        const duet_u64 n = (duet_u64)rows * c;                                              \
        DUET_GRID_STRIDE(i, n) { duet_st(x, i, duet_ld(x, i) + duet_ld(bias, i % c)); }     \
    }
DUET_FOR_ACT(DUET_BIAS_ADD)

// Pass 1: partial[k, j] = sum of dout[r, j] over the rows of chunk k.
// Launch: grid (ceil(c/256), chunks), block 256; partial holds chunks * c floats.
#define DUET_BIAS_BWD_PARTIAL(N, T)                                                          \
    DUET_KERNEL bias_backward_partial_##N(const T* __restrict__ dout,                         \
                                          float* __restrict__ partial, int rows, int c,       \
                                          int rows_per_chunk) {                               \
        const int j = blockIdx.x * blockDim.x + threadIdx.x;                                  \
        if (j >= c) return;                                                                   \
        const int r0 = blockIdx.y * rows_per_chunk;                                           \
        const int r1 = min(rows, r0 + rows_per_chunk);                                        \
        float s = 0.0f;                                                                       \
        for (int r = r0; r < r1; ++r) s += duet_ld(dout, (duet_u64)r * c + j);                \
        partial[(duet_u64)blockIdx.y * c + j] = s;                                            \
    }
DUET_FOR_ACT(DUET_BIAS_BWD_PARTIAL)

// Pass 2: dbias[j] += sum_k partial[k, j] (k in order). Grid-stride over c.
#define DUET_BIAS_BWD_REDUCE(N, T)                                                            \
    DUET_KERNEL bias_backward_reduce_##N(const float* __restrict__ partial,                    \
                                         T* __restrict__ dbias, int c, int chunks) {           \
        DUET_GRID_STRIDE(j, (duet_u64)c) {                                                     \
            float s = 0.0f;                                                                    \
            for (int k = 0; k < chunks; ++k) s += partial[(duet_u64)k * c + j];                \
            duet_st(dbias, j, duet_ld(dbias, j) + s);                                          \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_BIAS_BWD_REDUCE)
