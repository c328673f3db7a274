// Deterministic reductions: the sum of squares for the gradient norm, and column sums (bias and
// position-embedding gradients, LayerNorm parameter gradients), each in two passes whose
// partition depends only on the shape. Entry names and arguments match kernels-cuda.
#include "duet_hip.h"

// Pass 1: partial[block] = sum of x^2 over the block's grid-stride elements. The backend fixes
// the grid from n alone (min(ceil(n / 256), 1024) blocks of DUET_BLOCK).
#define DUET_SUMSQ(N, T)                                                                      \
    DUET_KERNEL sum_squares_partial_##N(const T* __restrict__ x, duet_u64 n,                   \
                                        float* __restrict__ partial) {                         \
        __shared__ float sh[DUET_MAX_WAVES];                                                   \
        float s = 0.0f;                                                                        \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float a = duet_ld(x, i);                                                     \
            s += a * a;                                                                        \
        }                                                                                      \
        s = duet_block_sum(s, sh);                                                             \
        if (threadIdx.x == 0) partial[blockIdx.x] = s;                                         \
    }
DUET_FOR_FLOAT(DUET_SUMSQ)

// Pass 2: out[slot] += sum of partial[0..count) in a fixed order. Launch: 1 block of DUET_BLOCK.
DUET_KERNEL sum_squares_finish(const float* __restrict__ partial, int count, float* out,
                               duet_u64 slot) {
    __shared__ float sh[DUET_MAX_WAVES];
    float s = 0.0f;
    for (int k = threadIdx.x; k < count; k += blockDim.x) s += partial[k];
    s = duet_block_sum(s, sh);
    if (threadIdx.x == 0) out[slot] += s;
}

// Column sums of x (rows x cols), pass 1: partial[k * cols + j] = sum of x[r, j] over the rows r
// of chunk k (rows [k * rows_per_chunk, (k + 1) * rows_per_chunk)), in row order.
// Launch: grid (ceil(cols / DUET_BLOCK), chunks), block DUET_BLOCK; one thread per column, so
// consecutive lanes read consecutive addresses.
#define DUET_COLSUM_PARTIAL(N, T)                                                             \
    DUET_KERNEL colsum_partial_##N(const T* __restrict__ x, float* __restrict__ partial,       \
                                   duet_u64 rows, duet_u64 cols, duet_u64 rows_per_chunk) {    \
        const duet_u64 j = (duet_u64)blockIdx.x * blockDim.x + threadIdx.x;                   \
        if (j >= cols) return;                                                                 \
        const duet_u64 r0 = (duet_u64)blockIdx.y * rows_per_chunk;                             \
        const duet_u64 r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;          \
        float s = 0.0f;                                                                        \
        for (duet_u64 r = r0; r < r1; ++r) s += duet_ld(x, r * cols + j);                      \
        partial[(duet_u64)blockIdx.y * cols + j] = s;                                          \
    }
DUET_FOR_ACT(DUET_COLSUM_PARTIAL)

// Pass 2: out[j] += sum over k < chunks of partial[k * cols + j], in chunk order. Grid-stride.
#define DUET_COLSUM_FINISH(N, T)                                                              \
    DUET_KERNEL colsum_finish_##N(const float* __restrict__ partial, T* out, duet_u64 chunks,  \
                                  duet_u64 cols) {                                             \
        DUET_GRID_STRIDE(j, cols) {                                                            \
            float s = 0.0f;                                                                    \
            for (duet_u64 k = 0; k < chunks; ++k) s += partial[k * cols + j];                  \
            duet_st(out, j, duet_ld(out, j) + s);                                              \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_COLSUM_FINISH)
