// FP8 quantisation for delayed scaling (duet_device::Device::quantize_fp8). Entry names and
// arguments follow kernels-cuda/fp8.cu's `quantize_S_D`, with the transposed copy folded into
// the same kernel (dst_t may be null).
//
// dst = encode(src * scale[0]) with duet_hip.h's codecs (round to nearest even, saturating,
// bit-identical to the CPU reference), and amax[0] = max(amax[0], max |src|) in the same pass.
// NaN elements are skipped (fmaxf). |x| >= 0 orders like its bits as an unsigned integer, so
// atomicMax on the bits is a float max; a max is order-independent, so this is deterministic.
#include "duet_hip.h"

#define DUET_QUANTIZE(SN, S, DN, D)                                                            \
    DUET_KERNEL quantize_##SN##_##DN(const S* __restrict__ src, D* __restrict__ dst,            \
                                     D* __restrict__ dst_t, duet_u64 rows, duet_u64 cols,      \
                                     const float* __restrict__ scale,                          \
                                     float* __restrict__ amax) {                               \
        __shared__ float sh[DUET_MAX_GROUPS];                                                   \
        const float s = scale[0];                                                              \
        const duet_u64 n = rows * cols;                                                        \
        float m = 0.0f;                                                                        \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float x = duet_ld(src, i);                                                   \
            m = fmaxf(m, fabsf(x));                                                            \
            duet_st(dst, i, x * s);                                                            \
            if (dst_t != nullptr) dst_t[(i % cols) * rows + i / cols] = dst[i];                \
        }                                                                                      \
        m = duet_block_max(m, sh);                                                             \
        if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), duet_f2u(m));   \
    }
#define DUET_QUANTIZE_TO(SN, S)                                                                \
    DUET_QUANTIZE(SN, S, f8e4m3, duet_e4m3)                                                    \
    DUET_QUANTIZE(SN, S, f8e5m2, duet_e5m2)                                                    \
    DUET_QUANTIZE(SN, S, f8e4m3fnuz, duet_e4m3fnuz)                                            \
    DUET_QUANTIZE(SN, S, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT(DUET_QUANTIZE_TO)

// ------------------------------------------------------------------ tiled, with the transpose
// The same codes and amax as quantize_S_D, for a job that also wants the transposed codes: a
// 32 x 32 tile per block (DUET_BLOCK threads seen as 32 x 8), read and written along rows, the
// codes passed through shared memory so the transposed copy is written along its rows too
// (quantize_S_D scatters it one byte per `rows` bytes). Launch: grid (ceil(cols / 32),
// ceil(rows / 32)). With GELU (quantize_gelu_*), each element is gelu(pre) rounded to pre's
// dtype first, exactly gelu_forward_* (elementwise.hip), so the codes equal gelu_forward
// followed by quantize_S_D without the activation ever being written.
#define DUET_QTILE 32

template <bool GELU, typename S, typename D>
DUET_DEV void duet_quantize_tile(const S* __restrict__ src, D* __restrict__ dst,
                                 D* __restrict__ dst_t, duet_u64 rows, duet_u64 cols,
                                 const float* __restrict__ scale, float* __restrict__ amax,
                                 duet_u64 r0, duet_u64 c0) {
    __shared__ unsigned char tile[DUET_QTILE][DUET_QTILE + 1];
    __shared__ float sh[DUET_MAX_GROUPS];
    const float s = scale[0];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    float m = 0.0f;
    for (int k = ty; k < DUET_QTILE; k += DUET_BLOCK / 32) {
        const duet_u64 r = r0 + k, c = c0 + tx;
        if (r < rows && c < cols) {
            float x = duet_ld(src, r * cols + c);
            if (GELU) {
                S h;
                duet_st(&h, 0, gelu_f(x));
                x = duet_ld(&h, 0);
            }
            m = fmaxf(m, fabsf(x));
            D q;
            duet_st(&q, 0, x * s);
            dst[r * cols + c] = q;
            tile[k][tx] = q.bits;
        }
    }
    __syncthreads();
    if (dst_t != nullptr) {
        for (int k = ty; k < DUET_QTILE; k += DUET_BLOCK / 32) {
            const duet_u64 c = c0 + k, r = r0 + tx;
            if (r < rows && c < cols) dst_t[c * rows + r].bits = tile[tx][k];
        }
    }
    m = duet_block_max(m, sh);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), duet_f2u(m));
}

#define DUET_QUANTIZE_TILED(SN, S, DN, D)                                                      \
    DUET_KERNEL quantize_tiled_##SN##_##DN(const S* __restrict__ src, D* __restrict__ dst,      \
                                           D* __restrict__ dst_t, duet_u64 rows,               \
                                           duet_u64 cols, const float* __restrict__ scale,     \
                                           float* __restrict__ amax) {                         \
        duet_quantize_tile<false>(src, dst, dst_t, rows, cols, scale, amax,                    \
                                  (duet_u64)blockIdx.y * DUET_QTILE,                           \
                                  (duet_u64)blockIdx.x * DUET_QTILE);                          \
    }                                                                                          \
    DUET_KERNEL quantize_gelu_##SN##_##DN(const S* __restrict__ pre, D* __restrict__ dst,       \
                                          D* __restrict__ dst_t, duet_u64 rows, duet_u64 cols, \
                                          const float* __restrict__ scale,                     \
                                          float* __restrict__ amax) {                          \
        duet_quantize_tile<true>(pre, dst, dst_t, rows, cols, scale, amax,                     \
                                 (duet_u64)blockIdx.y * DUET_QTILE,                            \
                                 (duet_u64)blockIdx.x * DUET_QTILE);                           \
    }
#define DUET_QUANTIZE_TILED_TO(SN, S)                                                          \
    DUET_QUANTIZE_TILED(SN, S, f8e4m3, duet_e4m3)                                              \
    DUET_QUANTIZE_TILED(SN, S, f8e5m2, duet_e5m2)                                              \
    DUET_QUANTIZE_TILED(SN, S, f8e4m3fnuz, duet_e4m3fnuz)                                      \
    DUET_QUANTIZE_TILED(SN, S, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT(DUET_QUANTIZE_TILED_TO)

// quantize_fp8_many in one launch: block k quantises tile k of the table (ops/fp8.rs builds one
// record per 32 x 32 tile of every job), the job's dtypes dispatched per block. Each tile is
// exactly quantize_tiled_S_D's tile, so the codes and every amax equal the jobs run one by one.
struct DuetQuantTile {
    duet_u64 src, dst, dst_t;  // dst_t: 0 when the job has no transposed copy
    duet_u64 rows, cols;
    unsigned int r0, c0;       // the tile's first row and column
    int sdt, ddt;              // source 0 f32, 1 bf16, 2 f16; codes 0 e4m3, 1 e5m2, 2 e4m3fnuz, 3 e5m2fnuz
    unsigned int slot, pad;
};

template <typename S>
DUET_DEV void duet_quantize_many_tile(const DuetQuantTile& t, const float* scale, float* amax) {
    const S* src = (const S*)t.src;
    const float* sc = scale + t.slot;
    float* am = amax + t.slot;
    if (t.ddt == 0)
        duet_quantize_tile<false>(src, (duet_e4m3*)t.dst, (duet_e4m3*)t.dst_t, t.rows, t.cols, sc, am, t.r0, t.c0);
    else if (t.ddt == 1)
        duet_quantize_tile<false>(src, (duet_e5m2*)t.dst, (duet_e5m2*)t.dst_t, t.rows, t.cols, sc, am, t.r0, t.c0);
    else if (t.ddt == 2)
        duet_quantize_tile<false>(src, (duet_e4m3fnuz*)t.dst, (duet_e4m3fnuz*)t.dst_t, t.rows, t.cols, sc, am, t.r0, t.c0);
    else
        duet_quantize_tile<false>(src, (duet_e5m2fnuz*)t.dst, (duet_e5m2fnuz*)t.dst_t, t.rows, t.cols, sc, am, t.r0, t.c0);
}

DUET_KERNEL quantize_many(const DuetQuantTile* __restrict__ tiles, const float* __restrict__ scale,
                          float* __restrict__ amax) {
    const DuetQuantTile t = tiles[blockIdx.x];
    if (t.sdt == 0)
        duet_quantize_many_tile<float>(t, scale, amax);
    else if (t.sdt == 1)
        duet_quantize_many_tile<duet_bf16>(t, scale, amax);
    else
        duet_quantize_many_tile<duet_f16>(t, scale, amax);
}

// quantize_fp8_grad in one pass: g = dout, or with GELU g = gelu'(pre) * dout rounded to dout's
// dtype (exactly gelu_backward_*), quantised and transposed per 32 x 32 tile as quantize_tiled
// does, and each tile's column sums of g into partial[tile row * cols + col] (the 8 row phases
// of the block, each adding its 4 rows in order, then added in order): reduce.hip's
// colsum_finish adds the tile rows into dbias. g itself is never written. Launch: grid
// (ceil(cols / 32), ceil(rows / 32)), DUET_BLOCK threads.
template <bool GELU, typename S, typename D>
DUET_DEV void duet_quantize_grad_tile(const S* __restrict__ dout, const S* __restrict__ pre,
                                      D* __restrict__ dst, D* __restrict__ dst_t,
                                      float* __restrict__ partial, duet_u64 rows, duet_u64 cols,
                                      const float* __restrict__ scale, float* __restrict__ amax) {
    __shared__ unsigned char tile[DUET_QTILE][DUET_QTILE + 1];
    __shared__ float colsum[DUET_BLOCK / 32][DUET_QTILE + 1];
    __shared__ float sh[DUET_MAX_GROUPS];
    const float s = scale[0];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const duet_u64 r0 = (duet_u64)blockIdx.y * DUET_QTILE, c0 = (duet_u64)blockIdx.x * DUET_QTILE;
    float m = 0.0f, cs = 0.0f;
    for (int k = ty; k < DUET_QTILE; k += DUET_BLOCK / 32) {
        const duet_u64 r = r0 + k, c = c0 + tx;
        if (r < rows && c < cols) {
            const duet_u64 i = r * cols + c;
            float x = duet_ld(dout, i);
            if (GELU) {
                S h;
                duet_st(&h, 0, duet_fmul(gelu_grad_f(duet_ld(pre, i)), x));
                x = duet_ld(&h, 0);
            }
            cs = duet_fadd(cs, x);
            m = fmaxf(m, fabsf(x));
            D q;
            duet_st(&q, 0, x * s);
            dst[i] = q;
            tile[k][tx] = q.bits;
        }
    }
    colsum[ty][tx] = cs;
    __syncthreads();
    if (ty == 0 && c0 + tx < cols) {
        float t = 0.0f;
        for (int y = 0; y < DUET_BLOCK / 32; ++y) t = duet_fadd(t, colsum[y][tx]);
        partial[(duet_u64)blockIdx.y * cols + c0 + tx] = t;
    }
    if (dst_t != nullptr) {
        for (int k = ty; k < DUET_QTILE; k += DUET_BLOCK / 32) {
            const duet_u64 c = c0 + k, r = r0 + tx;
            if (r < rows && c < cols) dst_t[c * rows + r].bits = tile[tx][k];
        }
    }
    m = duet_block_max(m, sh);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), duet_f2u(m));
}

#define DUET_QUANTIZE_GRAD(SN, S, DN, D)                                                       \
    DUET_KERNEL quantize_grad_##SN##_##DN(const S* __restrict__ dout, D* __restrict__ dst,      \
                                          D* __restrict__ dst_t, float* __restrict__ partial,  \
                                          duet_u64 rows, duet_u64 cols,                        \
                                          const float* __restrict__ scale,                     \
                                          float* __restrict__ amax) {                          \
        duet_quantize_grad_tile<false, S, D>(dout, nullptr, dst, dst_t, partial, rows, cols,   \
                                             scale, amax);                                     \
    }                                                                                          \
    DUET_KERNEL quantize_grad_gelu_##SN##_##DN(const S* __restrict__ dout,                      \
                                               const S* __restrict__ pre, D* __restrict__ dst, \
                                               D* __restrict__ dst_t,                          \
                                               float* __restrict__ partial, duet_u64 rows,     \
                                               duet_u64 cols, const float* __restrict__ scale, \
                                               float* __restrict__ amax) {                     \
        duet_quantize_grad_tile<true, S, D>(dout, pre, dst, dst_t, partial, rows, cols, scale, \
                                            amax);                                             \
    }
#define DUET_QUANTIZE_GRAD_TO(SN, S)                                                           \
    DUET_QUANTIZE_GRAD(SN, S, f8e4m3, duet_e4m3)                                               \
    DUET_QUANTIZE_GRAD(SN, S, f8e5m2, duet_e5m2)                                               \
    DUET_QUANTIZE_GRAD(SN, S, f8e4m3fnuz, duet_e4m3fnuz)                                       \
    DUET_QUANTIZE_GRAD(SN, S, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT(DUET_QUANTIZE_GRAD_TO)
