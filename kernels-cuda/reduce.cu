// Reductions and casts.
//
// Deterministic reductions: every sum is split into a fixed partition that depends only on the
// shape (never on the GPU or on scheduling), reduced in a fixed order inside each block, written
// to an f32 scratch buffer, and finished by a second kernel that adds the partials in index
// order. No float atomics anywhere.
#include "common.cuh"

// ------------------------------------------------------------------ casts

// dst[i] = cast(src[i] * scale) for every pair of storage types (f32, f16, bf16, fp8 x4).
template <typename S, typename D>
__device__ __forceinline__ void cast_body(const S* __restrict__ src, D* __restrict__ dst, u64 n,
                                          float scale) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = from_f32<D>(to_f32(src[i]) * scale);
}

#define CAST(S, SS, D, SD)                                                                    \
    extern "C" __global__ void cast_##SS##_##SD(const S* __restrict__ src, D* __restrict__ dst, \
                                                u64 n, float scale) {                         \
        cast_body(src, dst, n, scale);                                                        \
    }
#define CAST_FROM(S, SS)                                                                      \
    CAST(S, SS, float, f32)                                                                   \
    CAST(S, SS, bf16_t, bf16)                                                                 \
    CAST(S, SS, f16_t, f16)                                                                   \
    CAST(S, SS, e4m3_t, f8e4m3)                                                               \
    CAST(S, SS, e5m2_t, f8e5m2)                                                               \
    CAST(S, SS, e4m3fnuz_t, f8e4m3fnuz)                                                       \
    CAST(S, SS, e5m2fnuz_t, f8e5m2fnuz)
CAST_FROM(float, f32)
CAST_FROM(bf16_t, bf16)
CAST_FROM(f16_t, f16)
CAST_FROM(e4m3_t, f8e4m3)
CAST_FROM(e5m2_t, f8e5m2)
CAST_FROM(e4m3fnuz_t, f8e4m3fnuz)
CAST_FROM(e5m2fnuz_t, f8e5m2fnuz)

// ------------------------------------------------------------------ sum of squares
// Squares are accumulated in f64 (like the CPU reference), per thread and per block, and the
// block partials are added in index order; the final sum is added to out[slot] in f64 and
// rounded to f32 once.

__device__ __forceinline__ double block_sum_f64(double v, double* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// partial[blockIdx.x] = Σ x² over the elements this block visits. The grid size is chosen by the
// host from n alone, so the partition is fixed. blockDim.x is 256.
template <typename T>
__device__ __forceinline__ void sum_squares_partial_body(const T* __restrict__ x, u64 n,
                                                         double* __restrict__ partial) {
    __shared__ double sh[32];
    const int N = Pack<T>::N;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    double acc = 0.0;
    const u64 packs = n / N;
    for (u64 i = first; i < packs; i += stride) {
        Pack<T> p = load_pack(x + i * N);
#pragma unroll
        for (int j = 0; j < N; ++j) {
            const double v = (double)to_f32(p.v[j]);
            acc = __fma_rn(v, v, acc);  // what NVRTC contracted `acc += v * v` to
        }
    }
    for (u64 i = packs * N + first; i < n; i += stride) {
        const double v = (double)to_f32(x[i]);
        acc = __fma_rn(v, v, acc);  // what NVRTC contracted `acc += v * v` to
    }
    acc = block_sum_f64(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

#define SUM_SQUARES(T, S)                                                                     \
    extern "C" __global__ void sum_squares_partial_##S(const T* __restrict__ x, u64 n,       \
                                                       double* __restrict__ partial) {        \
        sum_squares_partial_body(x, n, partial);                                              \
    }
FOR_FLOAT(SUM_SQUARES)

// out[slot] += Σ partial[0..count) — one block of 256 threads, fixed order.
extern "C" __global__ void sum_squares_finish(const double* __restrict__ partial, int count,
                                              float* out, u64 slot) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = block_sum_f64(acc, sh);
    if (threadIdx.x == 0) out[slot] = (float)((double)out[slot] + acc);
}

// Multi-tensor sum of squares: block k sums chunk k of the table (a piece of one tensor) into
// partial[k]; sum_squares_finish then adds the partials in table order. The table depends only
// on the tensors' lengths and dtypes, so the result is reproducible.
struct SumSqChunk {
    u64 ptr;
    u64 offset;
    u64 len;
    int dt;  // 0 f32, 1 bf16, 2 f16
    int pad;
};

// Thread t adds the squares of elements t, t + 256, t + 512, ... of its chunk in that order. With
// a 16-byte aligned chunk (always so for whole allocations: 256-byte aligned, chunks start at
// multiples of 16384 elements), the chunk is read in tiles of SUMSQ_TILE elements with 16-byte
// loads (element-consecutive per thread) and passed through shared memory, so each thread still
// adds exactly its own elements in the same order; the next tile's loads are issued before the
// current tile is added. The rest (and any misaligned chunk) is read one element at a time.
#define SUMSQ_THREADS 256
#define SUMSQ_TILE 4096

// One 16-byte pack through the read-only global path (the table holds plain addresses, which the
// compiler would otherwise read with generic loads).
template <typename T> __device__ __forceinline__ Pack<T> load_pack_global(const T* p) {
    Pack<T> r;
    uint4 u;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p));
    *reinterpret_cast<uint4*>(&r) = u;
    return r;
}

template <typename T>
__device__ __forceinline__ double sum_squares_chunk(const T* __restrict__ x, u64 len,
                                                   float* __restrict__ tile) {
    const int N = Pack<T>::N;
    const int R = SUMSQ_TILE / (SUMSQ_THREADS * N);  // packs per thread per tile
    const int t = threadIdx.x;
    double acc = 0.0;
    u64 done = 0;
    if (blockDim.x == SUMSQ_THREADS && ((u64)x & 15) == 0) {
        const u64 tiles = len / SUMSQ_TILE;
        Pack<T> cur[R];
        if (tiles > 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) cur[r] = load_pack_global(x + (r * SUMSQ_THREADS + t) * N);
        }
        for (u64 k = 0; k < tiles; ++k) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < N; ++j)
                    tile[(r * SUMSQ_THREADS + t) * N + j] = to_f32(cur[r].v[j]);
            __syncthreads();
            if (k + 1 < tiles) {
                const T* next = x + (k + 1) * SUMSQ_TILE;
#pragma unroll
                for (int r = 0; r < R; ++r)
                    cur[r] = load_pack_global(next + (r * SUMSQ_THREADS + t) * N);
            }
#pragma unroll
            for (int s = 0; s < SUMSQ_TILE / SUMSQ_THREADS; ++s) {
                const double v = (double)tile[s * SUMSQ_THREADS + t];
                acc = __fma_rn(v, v, acc);  // what NVRTC contracted `acc += v * v` to
            }
            __syncthreads();
        }
        done = tiles * SUMSQ_TILE;
    }
    for (u64 j = done + t; j < len; j += blockDim.x) {
        const double v = (double)to_f32(x[j]);
        acc = __fma_rn(v, v, acc);  // what NVRTC contracted `acc += v * v` to
    }
    return acc;
}

extern "C" __global__ void sum_squares_many_partial(const SumSqChunk* __restrict__ chunks,
                                                    double* __restrict__ partial) {
    __shared__ double sh[32];
    __shared__ __align__(16) float tile[SUMSQ_TILE];
    const SumSqChunk c = chunks[blockIdx.x];
    double acc;
    if (c.dt == 0)
        acc = sum_squares_chunk((const float*)c.ptr + c.offset, c.len, tile);
    else if (c.dt == 1)
        acc = sum_squares_chunk((const bf16_t*)c.ptr + c.offset, c.len, tile);
    else
        acc = sum_squares_chunk((const f16_t*)c.ptr + c.offset, c.len, tile);
    acc = block_sum_f64(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// ------------------------------------------------------------------ column sums
// Used by bias_backward (rows × c) and the position-embedding gradient (b × t·c).

// The end of both partial-sum kernels below: the block's W columns from col0, each the sum of
// its eight row-phase sums sh[0..7] in order, into the chunk's (blockIdx.y's) partial row.
// Block (32, 8); call after the barrier that follows the writes to sh.
template <int W>
__device__ __forceinline__ void colsum_store_partial(const float (&sh)[8][W + 1],
                                                     float* __restrict__ partial, u64 cols,
                                                     u64 col0) {
    for (int lc = threadIdx.y * 32 + threadIdx.x; lc < W; lc += 256) {
        const u64 c = col0 + lc;
        if (c < cols) {
            float t = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; ++k) t += sh[k][lc];
            partial[(u64)blockIdx.y * cols + c] = t;
        }
    }
}

// Block (32, 8): 64 consecutive columns (two per thread, so a warp reads whole 128-byte lines
// of bf16/f16) × one chunk of `rows_per_chunk` rows; the 8 row phases are added in order.
// partial[chunk * cols + col] = Σ_{r in chunk} x[r * cols + col].
template <typename A>
__device__ __forceinline__ void colsum_partial_body(const A* __restrict__ x,
                                                    float* __restrict__ partial, u64 rows,
                                                    u64 cols, u64 rows_per_chunk) {
    __shared__ float sh[8][65];
    const u64 col = (u64)blockIdx.x * 64 + 2 * threadIdx.x;
    const u64 r0 = (u64)blockIdx.y * rows_per_chunk;
    u64 r1 = r0 + rows_per_chunk;
    if (r1 > rows) r1 = rows;
    float a0 = 0.0f, a1 = 0.0f;
    for (u64 r = r0 + threadIdx.y; r < r1; r += 8) {
        const A* row = x + r * cols;
        if (col < cols) a0 += to_f32(row[col]);
        if (col + 1 < cols) a1 += to_f32(row[col + 1]);
    }
    sh[threadIdx.y][2 * threadIdx.x] = a0;
    sh[threadIdx.y][2 * threadIdx.x + 1] = a1;
    __syncthreads();
    colsum_store_partial<64>(sh, partial, cols, (u64)blockIdx.x * 64);
}

#define COLSUM_PARTIAL(T, S)                                                                  \
    extern "C" __global__ void colsum_partial_##S(const T* __restrict__ x,                    \
                                                  float* __restrict__ partial, u64 rows,      \
                                                  u64 cols, u64 rows_per_chunk) {             \
        colsum_partial_body(x, partial, rows, cols, rows_per_chunk);                          \
    }
FOR_FLOAT(COLSUM_PARTIAL)

// The same partial sums with 16-byte loads, for rows of a whole number of 16-byte vectors
// (cols % (16 / sizeof(A)) == 0, x 16-byte aligned). Block (32, 8), grid
// (⌈cols / (32·V)⌉, chunks): lane l of thread row y adds the V columns from
// blockIdx.x·32·V + l·V over rows r0 + y, r0 + y + 8, ... of its chunk, then each column's eight
// row sums are added in order y = 0..7 (a fixed order: the result depends on the shape only).
template <typename A>
__device__ __forceinline__ void colsum_partial_vec_body(const A* __restrict__ x,
                                                        float* __restrict__ partial, u64 rows,
                                                        u64 cols, u64 rows_per_chunk) {
    constexpr int V = 16 / sizeof(A);
    __shared__ float sh[8][32 * V + 1];
    const u64 col0 = (u64)blockIdx.x * 32 * V + (u64)threadIdx.x * V;
    const u64 r0 = (u64)blockIdx.y * rows_per_chunk;
    u64 r1 = r0 + rows_per_chunk;
    if (r1 > rows) r1 = rows;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    if (col0 < cols) {
        u64 r = r0 + threadIdx.y;
        // Two rows in flight per iteration; the additions keep row order.
        for (; r + 8 < r1; r += 16) {
            const Vec<A, V> a = load_vec<A, V>(x + r * cols + col0);
            const Vec<A, V> b = load_vec<A, V>(x + (r + 8) * cols + col0);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[v] += to_f32(a.v[v]);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[v] += to_f32(b.v[v]);
        }
        if (r < r1) {
            const Vec<A, V> a = load_vec<A, V>(x + r * cols + col0);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[v] += to_f32(a.v[v]);
        }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) sh[threadIdx.y][threadIdx.x * V + v] = acc[v];
    __syncthreads();
    colsum_store_partial<32 * V>(sh, partial, cols, (u64)blockIdx.x * 32 * V);
}

#define COLSUM_PARTIAL_VEC(T, S)                                                              \
    extern "C" __global__ void colsum_partial_vec_##S(const T* __restrict__ x,                \
                                                      float* __restrict__ partial, u64 rows,  \
                                                      u64 cols, u64 rows_per_chunk) {         \
        colsum_partial_vec_body(x, partial, rows, cols, rows_per_chunk);                      \
    }
FOR_FLOAT(COLSUM_PARTIAL_VEC)

// out[col] += Σ_{k < chunks} partial[k * cols + col]. Block (32, 8), grid ⌈cols / 32⌉: thread
// row y adds chunks y, y + 8, ...; the 8 sums are then added in order (a fixed order).
template <typename G>
__device__ __forceinline__ void colsum_finish_body(const float* __restrict__ partial, G* out,
                                                   u64 chunks, u64 cols) {
    __shared__ float sh[8][33];
    const u64 col = (u64)blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < cols)
        for (u64 k = threadIdx.y; k < chunks; k += 8) s += partial[k * cols + col];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) t += sh[k][threadIdx.x];
        out[col] = from_f32<G>(to_f32(out[col]) + t);
    }
}

#define COLSUM_FINISH(T, S)                                                                   \
    extern "C" __global__ void colsum_finish_##S(const float* __restrict__ partial, T* out,   \
                                                 u64 chunks, u64 cols) {                      \
        colsum_finish_body(partial, out, chunks, cols);                                       \
    }
FOR_FLOAT(COLSUM_FINISH)

// ------------------------------------------------------------------ multi-tensor zeroing
// Block k clears `len` bytes at `ptr` (a chunk of one buffer, 16-byte aligned start), 16 bytes
// per thread-iteration with a byte tail.
struct ZeroChunk {
    u64 ptr;
    u64 len;
};

extern "C" __global__ void zero_many(const ZeroChunk* __restrict__ chunks) {
    const ZeroChunk c = chunks[blockIdx.x];
    unsigned char* p = (unsigned char*)c.ptr;
    const u64 vecs = c.len / 16;
    uint4 z = make_uint4(0u, 0u, 0u, 0u);
    for (u64 i = threadIdx.x; i < vecs; i += blockDim.x) ((uint4*)p)[i] = z;
    for (u64 i = vecs * 16 + threadIdx.x; i < c.len; i += blockDim.x) p[i] = 0;
}
