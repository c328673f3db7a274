// Deterministic reductions: the sum of squares for the gradient norm, and column sums (bias and
// position-embedding gradients, LayerNorm parameter gradients), each in two passes whose
// partition depends only on the shape. Entry names, arguments, launch shapes and the order of
// every addition match kernels-cuda/reduce.cu, so the results are its bits.
#include "duet_hip.h"

// Pass 1: partial[block] = Σ x² in f64 (like the CPU reference and CUDA) over the block's
// elements. Thread t of the grid takes the 16-byte packs t, t + grid threads, ... (N = 16 /
// sizeof(T) consecutive elements each, in order), then the elements past the last whole pack,
// grid-stride: reduce.cu's partition (it loads the packs with 16-byte accesses). The backend
// fixes the grid from n alone (min(max(ceil(n / 4096), 1), 1024) blocks of DUET_BLOCK).
#define DUET_SUMSQ(NAME, T)                                                                   \
    DUET_KERNEL sum_squares_partial_##NAME(const T* __restrict__ x, duet_u64 n,                \
                                           double* __restrict__ partial) {                     \
        __shared__ double sh[DUET_MAX_GROUPS];                                                 \
        const duet_u64 N = 16 / sizeof(T);                                                     \
        const duet_u64 stride = (duet_u64)gridDim.x * blockDim.x;                              \
        const duet_u64 first = (duet_u64)blockIdx.x * blockDim.x + threadIdx.x;                \
        const duet_u64 packs = n / N;                                                          \
        double acc = 0.0;                                                                      \
        for (duet_u64 i = first; i < packs; i += stride)                                       \
            for (duet_u64 j = 0; j < N; ++j) {                                                 \
                const double a = (double)duet_ld(x, i * N + j);                                \
                acc = duet_dfma(a, a, acc);                                                    \
            }                                                                                  \
        for (duet_u64 i = packs * N + first; i < n; i += stride) {                             \
            const double a = (double)duet_ld(x, i);                                            \
            acc = duet_dfma(a, a, acc);                                                        \
        }                                                                                      \
        acc = duet_block_sum_f64(acc, sh);                                                     \
        if (threadIdx.x == 0) partial[blockIdx.x] = acc;                                       \
    }
DUET_FOR_FLOAT(DUET_SUMSQ)

// Pass 2: out[slot] = (f32)((f64)out[slot] + Σ partial[0..count)), the partials added in a fixed
// order. Launch: 1 block of DUET_BLOCK.
DUET_KERNEL sum_squares_finish(const double* __restrict__ partial, int count, float* out,
                               duet_u64 slot) {
    __shared__ double sh[DUET_MAX_GROUPS];
    double acc = 0.0;
    for (int k = threadIdx.x; k < count; k += blockDim.x) acc = duet_dadd(acc, partial[k]);
    acc = duet_block_sum_f64(acc, sh);
    if (threadIdx.x == 0) out[slot] = (float)duet_dadd((double)out[slot], acc);
}

// Column sums of x (rows x cols), pass 1: partial[k * cols + j] = Σ x[r, j] over the rows r of
// chunk k (rows [k * rows_per_chunk, (k + 1) * rows_per_chunk)). Launch: grid
// (ceil(cols / 64), chunks), block DUET_BLOCK, seen as CUDA's (32, 8): lane l = t % 32 of row
// phase y = t / 32 sums columns 64·blockIdx.x + 2l and + 2l + 1 over the rows r0 + y, r0 + y + 8,
// ... in order; each column's 8 phase sums are then added in order y = 0..7. reduce.cu's
// colsum_partial and colsum_partial_vec (which loads V columns per lane) both add in exactly
// this order.
#define DUET_COLSUM_PARTIAL(N, T)                                                             \
    DUET_KERNEL colsum_partial_##N(const T* __restrict__ x, float* __restrict__ partial,       \
                                   duet_u64 rows, duet_u64 cols, duet_u64 rows_per_chunk) {    \
        __shared__ float sh[8][65];                                                            \
        const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;                                \
        const duet_u64 col = (duet_u64)blockIdx.x * 64 + 2 * tx;                               \
        const duet_u64 r0 = (duet_u64)blockIdx.y * rows_per_chunk;                             \
        const duet_u64 r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;          \
        float a0 = 0.0f, a1 = 0.0f;                                                            \
        for (duet_u64 r = r0 + ty; r < r1; r += 8) {                                           \
            if (col < cols) a0 = duet_fadd(a0, duet_ld(x, r * cols + col));                    \
            if (col + 1 < cols) a1 = duet_fadd(a1, duet_ld(x, r * cols + col + 1));            \
        }                                                                                      \
        sh[ty][2 * tx] = a0;                                                                   \
        sh[ty][2 * tx + 1] = a1;                                                               \
        __syncthreads();                                                                       \
        for (int lc = threadIdx.x; lc < 64; lc += DUET_BLOCK) {                                \
            const duet_u64 c = (duet_u64)blockIdx.x * 64 + lc;                                 \
            if (c < cols) {                                                                    \
                float t = 0.0f;                                                                \
                for (int k = 0; k < 8; ++k) t = duet_fadd(t, sh[k][lc]);                       \
                partial[(duet_u64)blockIdx.y * cols + c] = t;                                  \
            }                                                                                  \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_COLSUM_PARTIAL)

// Pass 2: out[j] += Σ_{k < chunks} partial[k * cols + j]. Launch: grid ceil(cols / 32), block
// DUET_BLOCK as (32, 8): row phase y adds chunks y, y + 8, ..., then the 8 sums in order.
#define DUET_COLSUM_FINISH(N, T)                                                              \
    DUET_KERNEL colsum_finish_##N(const float* __restrict__ partial, T* out, duet_u64 chunks,  \
                                  duet_u64 cols) {                                             \
        __shared__ float sh[8][33];                                                            \
        const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;                                \
        const duet_u64 col = (duet_u64)blockIdx.x * 32 + tx;                                   \
        float s = 0.0f;                                                                        \
        if (col < cols)                                                                        \
            for (duet_u64 k = ty; k < chunks; k += 8) s = duet_fadd(s, partial[k * cols + col]); \
        sh[ty][tx] = s;                                                                        \
        __syncthreads();                                                                       \
        if (ty == 0 && col < cols) {                                                           \
            float t = 0.0f;                                                                    \
            for (int k = 0; k < 8; ++k) t = duet_fadd(t, sh[k][tx]);                           \
            duet_st(out, col, duet_fadd(duet_ld(out, col), t));                                \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_COLSUM_FINISH)

// ------------------------------------------------------------------ multi-tensor passes
// The chunk tables are built by ops/mod.rs (HipDevice::table) with kernels-cuda/reduce.cu's
// layouts; one block of DUET_BLOCK (= reduce.cu's SUMSQ_THREADS, 256) per chunk.

// sum_squares_many, pass 1: partial[k] = Σ x² (f64) over chunk k. Thread t adds the chunk's
// elements t, t + 256, t + 512, ... in order: exactly the order in which reduce.cu's tiled
// 16-byte path (tile position s·256 + t, tile after tile) and its element tail add them, so the
// partials, and after sum_squares_finish the result, are CUDA's bits.
struct DuetSumSqChunk {
    duet_u64 ptr, offset, len;
    int dt;  // 0 f32, 1 bf16, 2 f16
    int pad;
};

template <typename T> DUET_DEV double duet_sumsq_chunk(const T* x, duet_u64 len) {
    double acc = 0.0;
    for (duet_u64 j = threadIdx.x; j < len; j += blockDim.x) {
        const double a = (double)duet_ld(x, j);
        acc = duet_dfma(a, a, acc);
    }
    return acc;
}

DUET_KERNEL sum_squares_many_partial(const DuetSumSqChunk* __restrict__ chunks,
                                     double* __restrict__ partial) {
    __shared__ double sh[DUET_MAX_GROUPS];
    const DuetSumSqChunk c = chunks[blockIdx.x];
    double acc;
    if (c.dt == 0)
        acc = duet_sumsq_chunk((const float*)c.ptr + c.offset, c.len);
    else if (c.dt == 1)
        acc = duet_sumsq_chunk((const duet_bf16*)c.ptr + c.offset, c.len);
    else
        acc = duet_sumsq_chunk((const duet_f16*)c.ptr + c.offset, c.len);
    acc = duet_block_sum_f64(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// zero_many: every byte of every chunk (a byte range of one buffer, starting 16-byte aligned)
// set to 0, in 16-byte stores where whole.
struct DuetZeroChunk {
    duet_u64 ptr, len;
};
struct alignas(16) DuetZero16 {
    duet_u64 lo, hi;
};

DUET_KERNEL zero_many(const DuetZeroChunk* __restrict__ chunks) {
    const DuetZeroChunk c = chunks[blockIdx.x];
    unsigned char* p = (unsigned char*)c.ptr;
    const duet_u64 vecs = c.len / 16;
    const DuetZero16 z = {0ull, 0ull};
    for (duet_u64 i = threadIdx.x; i < vecs; i += blockDim.x) ((DuetZero16*)p)[i] = z;
    for (duet_u64 i = vecs * 16 + threadIdx.x; i < c.len; i += blockDim.x) p[i] = 0;
}
