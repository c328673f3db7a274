// FP8 quantisation for delayed scaling (see duet_device::Device::quantize_fp8,
// Device::quantize_fp8_grad and Device::quantize_fp8_gelu).
//
// dst = encode(src * scale[0]) (round to nearest even, saturating, bit-identical to the CPU
// reference), and amax[0] = max(amax[0], max |src|) in the same pass. The amax is the one
// reduction with an atomic: a max is exact and order-independent, so the result is
// deterministic. NaN elements are skipped (fmaxf). |x| ≥ 0 compares like its bit pattern as an
// unsigned integer, so atomicMax on the bits is a float max.
//
// Kernels:
//   quantize_<S>_<D>          grid-stride over 8-element vectors (+ scalar tail), no transpose.
//   quantize_t_<S>_<D>        64 × 64 tiles, vectorised; rows and cols multiples of 8.
//   quantize_t_scalar_<S>_<D> 32 × 32 tiles, one element per thread; any shape.
//   quantize_t_many_<S>_<D>   the 64 × 64 tile kernel over a table of matrices, one tile per
//                             block (Device::quantize_fp8_many); see its section.
//   quantize_grad_t_<S>_<D>   the tile kernel on g = dout, plus per-tile column sums of g.
//   quantize_dgelu_t_<S>_<D>  the same on g = gelu'(pre) · dout rounded to S.
//   quantize_gelu_<S>_<D>, quantize_gelu_t_<S>_<D>, quantize_gelu_t_scalar_<S>_<D>
//                             the three quantize kernels on h = gelu(pre) rounded to S (exactly
//                             gelu_forward's output), h itself not written.
//   layernorm_fp8_<A>_<P>_<v|s>_<D>
//                             LayerNorm forward (mean, rstd) and the codes of its output rounded
//                             to A (exactly layernorm_forward's `out`, not written), 32-row
//                             blocks; see its section.
//   layernorm_quant_t_<A>_<P>_<D>
//                             the same for wide rows, after layernorm.cu's layernorm_stats
//                             (the 64 × 64 tile kernel on the LayerNorm output); see its
//                             section.
//   adamw_fp8_<D>             adamw_multi's update of f32 weights that also writes their codes
//                             (Device::adamw_clipped_fp8); see the last section.
//   transpose_codes_many      the transposed copies of codes (a table of matrices, bytes).
// The column sums are written to partial[tile_row · cols + col] (f32, a fixed order inside the
// tile). Then each block bumps the counter of its column tile (counters[blockIdx.y]); the block
// that arrives last adds the partial rows of its 64 columns into dbias, in the order of
// colsum_finish (reduce.cu): chain y sums tile rows y, y + 8, y + 16, ... (y = 0..7), then the
// 8 chains in order. The order is fixed whichever block finishes, so dbias is bit-identical run
// to run; no float atomics, no second launch. The finishing block resets the counter to 0, so
// the counters are zero between launches (a CUDA graph can replay the kernel).
#include "common.cuh"

// gelu_f_hw / gelu_grad_f_hw: common.cuh (the hardware-approximation GELU; see there).

__device__ __forceinline__ void record_amax(float m, float* amax) {
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

// The block's amax from its warps' maxima, recorded by one thread.
template <int WARPS>
__device__ __forceinline__ void record_block_amax(const float (&wmax)[WARPS], float* amax) {
    float b = wmax[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) b = fmaxf(b, wmax[w]);
    record_amax(b, amax);
}

// ------------------------------------------------------------------ 4 codes per word
//
// encode4<D>(a, b, c, d) packs the codes of a, b, c, d into bytes 0..3 of a word (little-endian
// memory order: a first).
//
// On sm_89 and later the OCP formats use the hardware conversion cvt.rn.satfinite.{e4m3x2,
// e5m2x2}.f32 (two values per instruction; the second source operand goes to the low byte).
// Why its codes equal the CPU reference (duet_device::Fp8Format::encode and
// duet_cpu's FastEncoder, i.e. fp8_encode in common.cuh), case by case:
//   * Finite values below the largest finite code: both round the exact f32 input once, to
//     nearest with ties to even, onto the format's grid (normals and subnormals alike; the
//     hardware handles FP8 subnormals, cuda_fp8.hpp's reference emulation of the same
//     instruction shows the denormal branch). Same code.
//   * Ties: .rn is IEEE round-half-even; the CPU picks the even code on an exact tie (rintf /
//     round_ties_even / the table's lo % 2 == 0). Same code.
//   * Tiny values that round to zero keep their sign: the hardware gives ±0 (0x00 / 0x80), the
//     CPU gives code 0 with the sign bit for a negative input (OCP formats have -0). f32
//     subnormal inputs lie far below half the smallest FP8 subnormal (2^-10 for E4M3, 2^-17
//     for E5M2), so flushing or not makes no difference: ±0 either way.
//   * ±0: sign preserved by both (0x00 / 0x80).
//   * |x| ≥ max finite (448 for E4M3, 57344 for E5M2), including ±inf: .satfinite clamps
//     results that would be inf (E5M2) or NaN/out of range (E4M3) to ±max finite; values in
//     [max, max + ulp/2] round to max anyway. The CPU maps every |x| ≥ max to the max code
//     with the sign. Same code (0x7e/0xfe for E4M3, 0x7b/0xfb for E5M2).
//   * NaN: the CPU always gives 0x7f (sign ignored). The hardware gives a NaN code for a NaN
//     input, but which one is not documented precisely enough (cuda_fp8.hpp's emulation keeps
//     the sign, giving 0xff for a negative NaN, and 0x7e|mantissa-bits for E5M2), so NaN codes
//     are rewritten to 0x7f below. Since .satfinite never produces an infinity, a code is NaN
//     exactly when its low 7 bits reach the format's first NaN pattern (E4M3 0x7f, E5M2 0x7d;
//     the largest finite codes are 0x7e and 0x7b): four bytes at once with integer arithmetic.
// FNUZ formats (no hardware conversion) and sm_80 use the software codec of common.cuh.
template <typename D> struct HwFp8 {
    static constexpr int kind = 0;  // 0: software codec, 1: e4m3x2, 2: e5m2x2
};
template <> struct HwFp8<e4m3_t> {
    static constexpr int kind = 1;
};
template <> struct HwFp8<e5m2_t> {
    static constexpr int kind = 2;
};

template <typename D>
__device__ __forceinline__ unsigned int encode4(float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    if constexpr (HwFp8<D>::kind != 0) {
        unsigned short lo, hi;
        if constexpr (HwFp8<D>::kind == 1) {
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
            asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
        } else {
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
            asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
        }
        const unsigned int w = (unsigned int)lo | ((unsigned int)hi << 16);
        // NaN → 0x7f whatever the sign (the CPU's code; see above). Adding 0x01 (E4M3) or 0x03
        // (E5M2) to each byte's low 7 bits carries into its bit 7 exactly for the NaN codes (no
        // carry crosses a byte); `fill` is 0x7f in those bytes.
        constexpr unsigned int K = HwFp8<D>::kind == 1 ? 0x01010101u : 0x03030303u;
        const unsigned int nan = ((w & 0x7f7f7f7fu) + K) & 0x80808080u;
        const unsigned int fill = nan - (nan >> 7);
        return (w & ~(nan | fill)) | fill;
    } else
#endif
    {
        return (unsigned int)from_f32<D>(a).bits | ((unsigned int)from_f32<D>(b).bits << 8) |
               ((unsigned int)from_f32<D>(c).bits << 16) |
               ((unsigned int)from_f32<D>(d).bits << 24);
    }
}

// 8 codes of v[0..8) * s as one 8-byte vector.
template <typename D> __device__ __forceinline__ uint2 encode8(const float (&v)[8], float s) {
    uint2 q;
    q.x = encode4<D>(v[0] * s, v[1] * s, v[2] * s, v[3] * s);
    q.y = encode4<D>(v[4] * s, v[5] * s, v[6] * s, v[7] * s);
    return q;
}

// 8 consecutive source elements (16-byte aligned) as raw 16-byte packs: loaded first, converted
// later, so a thread's loads are all in flight before it computes.
template <typename S> struct Raw8 {
    static const int N = Pack<S>::N;  // 8 for bf16/f16, 4 for f32
    Pack<S> p[8 / Pack<S>::N];
    __device__ __forceinline__ void load(const S* __restrict__ q) {
#pragma unroll
        for (int h = 0; h < 8 / N; ++h) p[h] = load_pack(q + h * N);
    }
    __device__ __forceinline__ float get(int j) const { return to_f32(p[j / N].v[j % N]); }
};

// x rounded to S (nearest, ties to even) and back: to_f32(from_f32<S>(x)) for every x but a
// NaN, which stays a NaN with another payload. For the values that are only quantised (their
// codes and the amax, where every NaN is alike) and summed (dbias, NaN either way); bf16 from
// sm_80 in the one conversion instruction, without from_f32's NaN branch.
template <typename S> __device__ __forceinline__ float round_to(float x) {
    return to_f32(from_f32<S>(x));
}
template <> __device__ __forceinline__ float round_to<bf16_t>(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __uint_as_float((unsigned int)bf16_bits_hw(x) << 16);
#else
    return to_f32(from_f32<bf16_t>(x));
#endif
}

// The value quantised for source element x: x itself, or with GELU gelu(x) rounded to S (with
// the hardware-approximation GELU: agrees with gelu_forward's to rounding).
template <typename S, bool GELU> __device__ __forceinline__ float src_value(float x) {
    if constexpr (GELU)
        return round_to<S>(gelu_f_hw(x));
    else
        return x;
}

// ------------------------------------------------------------------ without transpose

// Grid-stride over 8-element vectors (one or two 16-byte loads, one 8-byte store), then a scalar
// tail; blockDim.x = 256. Buffers start at allocation boundaries, so the vectors are aligned.
template <typename S, typename D, bool GELU>
__device__ __forceinline__ void quantize_body(const S* __restrict__ src, D* __restrict__ dst,
                                              u64 n, const float* __restrict__ scale,
                                              float* __restrict__ amax) {
    __shared__ float sh[32];
    const float s = scale[0];
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned char* out = reinterpret_cast<unsigned char*>(dst);
    const u64 units = n / 8;
    float m = 0.0f;
    for (u64 i = first; i < units; i += stride) {
        Raw8<S> x;
        x.load(src + i * 8);
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            v[j] = src_value<S, GELU>(x.get(j));
            m = fmaxf(m, fabsf(v[j]));
        }
        *reinterpret_cast<uint2*>(out + i * 8) = encode8<D>(v, s);
    }
    for (u64 i = units * 8 + first; i < n; i += stride) {
        const float x = src_value<S, GELU>(to_f32(src[i]));
        m = fmaxf(m, fabsf(x));
        dst[i] = from_f32<D>(x * s);
    }
    m = block_max(m, sh);
    if (threadIdx.x == 0) record_amax(m, amax);
}

// ------------------------------------------------------------------ 64 × 64 tiles, vectorised
//
// Block of QT_THREADS = 128 threads, grid (⌈rows / 64⌉, ⌈cols / 64⌉); rows and cols multiples
// of 8 (the host checks), so every 8-element vector is either wholly inside the matrix or
// wholly outside.
//
// Load phase: thread t owns columns 8·(t % 8) .. +7 of tile rows t / 8 + 16p (p = 0..3): it
// loads 4 vectors (all in flight at once), encodes each into 8 codes, stores them to dst with
// one 8-byte store and into the shared tile (64 rows × 16 words).
// Transpose phase: thread t owns tile rows 8·(t % 8) .. +7 and word column t / 8 (4 tile
// columns): it reads 8 words, transposes the 8 × 4 bytes in registers (__byte_perm) and writes
// 4 × 8 bytes to dst_t, rows of dst_t being tile columns. The 8 lanes with the same word column
// write 64 contiguous bytes of one dst_t row.
// The shared tile is XOR-swizzled by word (w ^ 4·((row / 8) % 4)), which keeps the 8-byte
// stores conflict-free and the transpose reads at most 2-way conflicted.
#define QT 64
#define QT_THREADS 128
#define QT_PASSES 4  // QT / (QT_THREADS / 8)
// Resident blocks per SM each tile kernel is compiled for (__launch_bounds__), chosen so that
// none spills (sm_90, NVRTC 13):
//   * without column sums (quantize_t, quantize_gelu_t, quantize_t_many): 12 blocks (48 warps,
//     at most 40 registers a thread) against the 9 their registers allowed unbounded, 7% faster
//     on the H200 (fp8_bench, 8192 × 8192 quantize_t: 78.7 vs 85.0 µs; 16 blocks spill and are
//     slower);
//   * LayerNorm (layernorm_quant_t, which also holds γ, β, mean and rstd): 7 blocks (72
//     registers). At 12 it spilled 120 bytes a thread and ran 56.6 µs at 8192 × 2048 (ln_fp8_t,
//     with layernorm_stats), slower than the separate LayerNorm + quantize ops; at 7, 34.8 µs;
//   * gradients: quantize_grad_t 9 blocks (56 registers), quantize_dgelu_t 8 (64), what their
//     registers take unbounded in the one-tile-per-block code; bounding them further spilled
//     and gained nothing.
// The -D overrides are for experiments (DUET_NVRTC_EXTRA).
#ifndef QT_MIN_BLOCKS
#define QT_MIN_BLOCKS 12
#endif
#ifndef QT_LN_MIN_BLOCKS
#define QT_LN_MIN_BLOCKS 7
#endif
#ifndef QT_GRAD_MIN_BLOCKS
#define QT_GRAD_MIN_BLOCKS 9
#endif
#ifndef QT_DGELU_MIN_BLOCKS
#define QT_DGELU_MIN_BLOCKS 8
#endif
static_assert(QT_THREADS == 2 * QT, "finish_colsum: two threads per tile column");

__device__ __forceinline__ int tile_word(int row, int w) { return w ^ (((row >> 3) & 3) << 2); }

// Transposes a 4 × 4 byte block: out[i] byte k = in[k] byte i.
__device__ __forceinline__ void transpose4x4(unsigned int a, unsigned int b, unsigned int c,
                                             unsigned int d, unsigned int (&out)[4]) {
    const unsigned int t0 = __byte_perm(a, b, 0x5140);  // a0 b0 a1 b1
    const unsigned int t1 = __byte_perm(a, b, 0x7362);  // a2 b2 a3 b3
    const unsigned int t2 = __byte_perm(c, d, 0x5140);  // c0 d0 c1 d1
    const unsigned int t3 = __byte_perm(c, d, 0x7362);  // c2 d2 c3 d3
    out[0] = __byte_perm(t0, t2, 0x5410);               // a0 b0 c0 d0
    out[1] = __byte_perm(t0, t2, 0x7632);               // a1 b1 c1 d1
    out[2] = __byte_perm(t1, t3, 0x5410);               // a2 b2 c2 d2
    out[3] = __byte_perm(t1, t3, 0x7632);               // a3 b3 c3 d3
}

// The transposed store of a 64 × 64 tile of codes (after the barrier that completes `tile`):
// thread t takes tile rows 8·(t % 8) .. +7 of word column t / 8, transposes the 8 × 4 bytes in
// registers and writes 4 × 8 bytes to dst_t, whose rows are the tile's columns. dst_t null:
// nothing (uniform across the block). cols is a multiple of 8, so columns 4w .. 4w + 3 are all
// inside or all outside; rows too.
__device__ __forceinline__ void store_tile_t(const unsigned int (&tile)[QT][QT / 4],
                                             unsigned char* __restrict__ dst_t, u64 r0, u64 c0,
                                             u64 rows, u64 cols) {
    const int t = threadIdx.x, g = t & 7, w = t >> 3;
    const u64 rr = r0 + 8 * g;
    if (dst_t != nullptr && rr < rows && c0 + 4 * w < cols) {
        unsigned int lo[4], hi[4];
        transpose4x4(tile[8 * g + 0][tile_word(8 * g + 0, w)],
                     tile[8 * g + 1][tile_word(8 * g + 1, w)],
                     tile[8 * g + 2][tile_word(8 * g + 2, w)],
                     tile[8 * g + 3][tile_word(8 * g + 3, w)], lo);
        transpose4x4(tile[8 * g + 4][tile_word(8 * g + 4, w)],
                     tile[8 * g + 5][tile_word(8 * g + 5, w)],
                     tile[8 * g + 6][tile_word(8 * g + 6, w)],
                     tile[8 * g + 7][tile_word(8 * g + 7, w)], hi);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u64 cc = c0 + 4 * w + i;
            *reinterpret_cast<uint2*>(dst_t + cc * rows + rr) = make_uint2(lo[i], hi[i]);
        }
    }
}

// The column-sum finish of the gradient tile kernels (see the top of the file). Called by every
// thread of the block after its partial row was written and fenced; `scratch` is the block's
// shared tile, free again (reused for the 8 × 64 chain sums after the barrier below).
__device__ __forceinline__ void finish_colsum(unsigned int (&scratch)[QT][QT / 4], int& finisher,
                                              const float* partial, unsigned int* counters,
                                              u64 dbias, int dbias_dt, u64 cols, u64 tiles) {
    const int t = threadIdx.x;
    __syncthreads();  // every partial store of this block fenced; the tile no longer read
    if (t == 0) {
        const unsigned int done = atomicAdd(&counters[blockIdx.y], 1u);
        finisher = done == gridDim.x - 1;
        if (finisher) {
            // Every block of this column tile has counted (so has written its row): reset for
            // the next launch, and order the partial reads below after the count.
            counters[blockIdx.y] = 0u;
            __threadfence();
        }
    }
    __syncthreads();
    if (!finisher) return;  // uniform across the block

    // Thread t: column j = t % 64, chains y = 4h .. 4h + 3 with h = t / 64; chain y adds tile
    // rows y, y + 8, ... in order. __ldcg: read at L2, where the other blocks' rows are.
    float(*chain)[QT] = reinterpret_cast<float(*)[QT]>(&scratch[0][0]);  // [8][QT]
    const int j = t & (QT - 1), h = t / QT;
    const u64 col = (u64)blockIdx.y * QT + j;
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (col < cols) {
        // FC_STEPS steps of each of the 4 chains per iteration: 4 · FC_STEPS loads in flight
        // (the finish is the kernel's tail: one round trip per iteration), then the adds in
        // chain order.
        constexpr int FC_STEPS = 4;
        for (u64 k0 = 4 * h; k0 < tiles; k0 += 8 * FC_STEPS) {
            float v[FC_STEPS][4];
#pragma unroll
            for (int q = 0; q < FC_STEPS; ++q)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const u64 k = k0 + 8 * q + i;
                    v[q][i] = k < tiles ? __ldcg(partial + k * cols + col) : 0.0f;
                }
#pragma unroll
            for (int q = 0; q < FC_STEPS; ++q)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (k0 + 8 * q + i < tiles) s[i] += v[q][i];
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) chain[4 * h + i][j] = s[i];
    __syncthreads();
    if (h == 0 && col < cols) {
        float sum = 0.0f;
#pragma unroll
        for (int y = 0; y < 8; ++y) sum += chain[y][j];
        store_dt(dbias, col, dbias_dt, load_dt(dbias, col, dbias_dt) + sum);
    }
}

// The LayerNorm operands of MODE 4: per-column gamma/beta (P), per-row mean/rstd (f32, as
// layernorm_forward writes them). Unused (null) in the other modes.
template <typename P> struct LnArgs {
    const P* gamma = nullptr;
    const P* beta = nullptr;
    const float* mean = nullptr;
    const float* rstd = nullptr;
};

// MODE 0: quantise src. MODE 1: g = src (dout), plus column sums into dbias. MODE 2:
// g = gelu'(pre) · src rounded to S, plus column sums into dbias. MODE 3: h = gelu(src) rounded
// to S. MODE 4: y = LayerNorm(src) rounded to S with the given mean and rstd (exactly
// layernorm_forward's `out`; ln_affine, common.cuh). dst_t may be null (no transposed copy; then
// rows need not be a multiple of 8).
// The block quantises the tiles (bx, by) for bx = bx0, bx0 + bstep, ... below ⌈rows / 64⌉:
// rows [64·bx, 64·bx + 64), columns [64·by, 64·by + 64). The one-matrix kernels pass
// (blockIdx.x, gridDim.x, blockIdx.y) and the host launches one block per row tile
// (CudaDevice::tile_grid), the many-matrix kernel passes one tile: the loop runs once. It is
// written as a loop over row tiles because that form compiles better (sm_90): the four loads
// issued up front as predicated instructions, no spills at the bounds above, 520 instead of 552
// instructions for quantize_t_bf16_f8e4m3, and 10% faster (fp8_bench, 8192 × 2048 quantize_t
// 23.1 → 20.8 µs, quantize_gelu_t 30.0 → 25.4 µs, the seed weights in one quantize_t_many
// 40.6 → 35.1 µs). Narrower grids, each block taking several row tiles (with or without the next
// tile's loads in flight during the stores), passed the GPU tests (codes and amaxes bit for bit,
// dbias within its tolerance; its partial rows and their order do not depend on the width) but
// were no faster, so the host does not use them. The amax is reduced and recorded once, after
// the transposed store, so that nothing is held across it.
//
// Modes 1 and 2: partial holds ⌈rows / 64⌉ rows of cols f32, row bx the column sums of row
// tile bx; counters[blockIdx.y] is 0 at launch (and again after it); dbias holds cols values of
// dtype dbias_dt (0 f32, 1 bf16, 2 f16). They need the one-matrix grid (finish_colsum counts
// gridDim.x blocks per column tile), so they take tile bx0 only, straight-line: the warps'
// amaxes are written with the column sums and recorded after the barrier that the column sums
// need anyway, one barrier fewer than the loop form. That form was 1-3% slower for these two
// kernels (fp8_bench on the H200: 8192 × 8192 grad_gelu 131.2 → 127.2 µs, grad 90.4 → 89.0 µs,
// 8192 × 2048 grad_gelu 41.3 → 40.0 µs); the other kernels keep the loop.
template <typename S, typename D, int MODE, typename P = S>
__device__ __forceinline__ void quantize_tile_body(
    const S* __restrict__ src, const S* __restrict__ pre, D* __restrict__ dst_,
    D* __restrict__ dst_t_, float* __restrict__ partial, unsigned int* __restrict__ counters,
    u64 dbias, int dbias_dt, u64 rows, u64 cols, const float* __restrict__ scale,
    float* __restrict__ amax, unsigned int bx0, unsigned int bstep, unsigned int by,
    LnArgs<P> ln = LnArgs<P>()) {
    constexpr bool SUMS = MODE == 1 || MODE == 2;
    __shared__ __align__(16) unsigned int tile[QT][QT / 4];
    __shared__ float wmax[QT_THREADS / 32];
    __shared__ float csum[SUMS ? QT_THREADS / 32 : 1][QT];
    __shared__ int finisher;
    unsigned char* dst = reinterpret_cast<unsigned char*>(dst_);
    unsigned char* dst_t = reinterpret_cast<unsigned char*>(dst_t_);
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const u64 tiles = (rows + QT - 1) / QT;
    const u64 c0 = (u64)by * QT;
    const float s = scale[0];

    const int cg = t & 7, rt = t >> 3;
    const u64 c = c0 + cg * 8;
    const bool col_ok = c < cols;
    Raw8<S> xs[QT_PASSES];
    Raw8<S> ps[MODE == 2 ? QT_PASSES : 1];
    Raw8<P> lg, lb;                                   // MODE 4: gamma, beta of the 8 columns
    float lmu[MODE == 4 ? QT_PASSES : 1], lrs[MODE == 4 ? QT_PASSES : 1];  // and of the rows
    // Issues the loads of row tile bx (all in flight at once).
    const auto load_tile = [&](u64 bx) {
#pragma unroll
        for (int p = 0; p < QT_PASSES; ++p) {
            const u64 r = bx * QT + rt + 16 * p;
            if (col_ok && r < rows) {
                xs[p].load(src + r * cols + c);
                if constexpr (MODE == 2) ps[p].load(pre + r * cols + c);
                if constexpr (MODE == 4) {
                    lmu[p] = ln.mean[r];
                    lrs[p] = ln.rstd[r];
                }
            }
        }
    };
    if constexpr (MODE == 4) {
        if (col_ok) {
            lg.load(ln.gamma + c);
            lb.load(ln.beta + c);
        }
    }
    float m = 0.0f;
    // Row tile bx: its codes and transposed codes, and with column sums its partial row and
    // the block's amax.
    const auto quantize_row_tile = [&](u64 bx) {
        const u64 r0 = bx * QT;
        load_tile(bx);
        float acc[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
#pragma unroll
        for (int p = 0; p < QT_PASSES; ++p) {
            const int tr = rt + 16 * p;
            const u64 r = r0 + tr;
            if (col_ok && r < rows) {
                float v[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if constexpr (MODE == 2)
                        v[j] = round_to<S>(gelu_grad_f_hw(ps[p].get(j)) * xs[p].get(j));
                    else if constexpr (MODE == 4)
                        v[j] = round_to<S>(
                            ln_affine(xs[p].get(j), lmu[p], lrs[p], lg.get(j), lb.get(j)));
                    else
                        v[j] = src_value<S, MODE == 3>(xs[p].get(j));
                    m = fmaxf(m, fabsf(v[j]));
                    if constexpr (SUMS) acc[j] += v[j];
                }
                const uint2 q = encode8<D>(v, s);
                *reinterpret_cast<uint2*>(dst + r * cols + c) = q;
                *reinterpret_cast<uint2*>(&tile[tr][tile_word(tr, 2 * cg)]) = q;
            }
        }
        if constexpr (SUMS) {
            // Column sums over the tile's rows: lanes l, l + 8, l + 16, l + 24 hold the same
            // columns (butterfly, so every lane gets the same sum), then the 4 warps in order.
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 8);
                acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], 16);
            }
            if (lane < 8) {
#pragma unroll
                for (int j = 0; j < 8; ++j) csum[warp][lane * 8 + j] = acc[j];
            }
        }
        if constexpr (SUMS) {
            m = warp_max(m);
            if (lane == 0) wmax[warp] = m;
        }
        __syncthreads();  // the tile (with column sums: those and the warps' amaxes) written
        if constexpr (SUMS) {
            if (t == 0) record_block_amax(wmax, amax);
            if (t < QT) {  // warps 0 and 1
                if (c0 + t < cols) {
                    float sum = csum[0][t];
#pragma unroll
                    for (int w = 1; w < QT_THREADS / 32; ++w) sum += csum[w][t];
                    partial[bx * cols + c0 + t] = sum;
                }
                // The partial row is visible device-wide before this block is counted
                // (finish_colsum).
                __threadfence();
            }
        }

        // The transposed store; store_tile_t below is the same code as a function (kept
        // inline here: as a call the gradient kernels compiled to another schedule).
        const int g = t & 7, w = t >> 3;
        const u64 rr = r0 + 8 * g;
        // dst_t null: uniform across the block. cols is a multiple of 8, so columns
        // 4w .. 4w + 3 are all inside or all outside.
        if (dst_t != nullptr && rr < rows && c0 + 4 * w < cols) {
            unsigned int lo[4], hi[4];
            transpose4x4(tile[8 * g + 0][tile_word(8 * g + 0, w)],
                         tile[8 * g + 1][tile_word(8 * g + 1, w)],
                         tile[8 * g + 2][tile_word(8 * g + 2, w)],
                         tile[8 * g + 3][tile_word(8 * g + 3, w)], lo);
            transpose4x4(tile[8 * g + 4][tile_word(8 * g + 4, w)],
                         tile[8 * g + 5][tile_word(8 * g + 5, w)],
                         tile[8 * g + 6][tile_word(8 * g + 6, w)],
                         tile[8 * g + 7][tile_word(8 * g + 7, w)], hi);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u64 cc = c0 + 4 * w + i;
                *reinterpret_cast<uint2*>(dst_t + cc * rows + rr) = make_uint2(lo[i], hi[i]);
            }
        }
    };

    if constexpr (SUMS) {
        quantize_row_tile(bx0);
        finish_colsum(tile, finisher, partial, counters, dbias, dbias_dt, cols, tiles);
    } else {
#pragma unroll 1
        for (u64 bx = bx0; bx < tiles; bx += bstep) {
            quantize_row_tile(bx);
            __syncthreads();  // the tile read: free for the next one
        }
        m = warp_max(m);
        if (lane == 0) wmax[warp] = m;
        __syncthreads();
        if (t == 0) record_block_amax(wmax, amax);
    }
}

// ------------------------------------------------------------------ 32 × 32 tiles, scalar

// Any shape. Block (32, 8): writes dst (rows × cols) and its transpose dst_t (cols × rows)
// through shared memory, so both stores are coalesced.
template <typename S, typename D, bool GELU>
__device__ __forceinline__ void quantize_t_scalar_body(const S* __restrict__ src,
                                                       D* __restrict__ dst, D* __restrict__ dst_t,
                                                       u64 rows, u64 cols,
                                                       const float* __restrict__ scale,
                                                       float* __restrict__ amax) {
    __shared__ unsigned char tile[32][33];
    __shared__ float sh[8];
    const float s = scale[0];
    const u64 r0 = (u64)blockIdx.y * 32, c0 = (u64)blockIdx.x * 32;
    float m = 0.0f;
    for (int j = threadIdx.y; j < 32; j += 8) {
        const u64 r = r0 + j, c = c0 + threadIdx.x;
        if (r < rows && c < cols) {
            const float x = src_value<S, GELU>(to_f32(src[r * cols + c]));
            m = fmaxf(m, fabsf(x));
            const D q = from_f32<D>(x * s);
            dst[r * cols + c] = q;
            tile[j][threadIdx.x] = q.bits;
        }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < 32; j += 8) {
        const u64 c = c0 + j, r = r0 + threadIdx.x;
        if (r < rows && c < cols) dst_t[c * rows + r].bits = tile[threadIdx.x][j];
    }
    // blockDim.x = 32: each threadIdx.y row is one warp.
    m = warp_max(m);
    if (threadIdx.x == 0) sh[threadIdx.y] = m;
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0) {
        float b = sh[0];
        for (int w = 1; w < 8; ++w) b = fmaxf(b, sh[w]);
        record_amax(b, amax);
    }
}

// ------------------------------------------------------------------ many matrices, one launch
//
// quantize_t_many_<S>_<D>(const QuantJob* jobs, unsigned njobs): Device::quantize_fp8_many for
// the jobs of one (source, FP8) dtype pair. Job j covers blocks [tile_start, tile_start +
// row tiles × col_tiles) of a 1-D grid (tile_start increasing from 0, no gaps); a block finds
// its job by binary search over tile_start (the same for every thread of the block: uniform
// loads of a small, L2-resident table) and runs quantize_tile_body (MODE 0) on its tile of that
// matrix. The tile body is the one quantize_t_<S>_<D> runs, so each element's code comes from
// the same expression (value · scale[0] through encode8) and the amax is the same exact max,
// recorded per block with atomicMax on the float bits (order-independent, so jobs sharing a slot
// give the same value as one after another). Requirements per job, as for quantize_t: cols a
// multiple of 8, rows too when dst_t is set (else dst_t is 0), src/dst/dst_t 16-byte aligned.
struct QuantJob {
    u64 src, dst, dst_t;       // dst_t: 0 for none
    u64 rows, cols;
    u64 scale, amax;           // the job's slot of each
    unsigned int tile_start;   // first block of this job
    unsigned int col_tiles;    // ⌈cols / 64⌉
};
static_assert(sizeof(QuantJob) == 64, "QuantJob: 64-byte records (fp8.rs builds them)");

template <typename S, typename D>
__device__ __forceinline__ void quantize_t_many_body(const QuantJob* __restrict__ jobs,
                                                     unsigned int njobs) {
    const unsigned int b = blockIdx.x;
    unsigned int lo = 0, hi = njobs - 1;  // the last job with tile_start <= b
    while (lo < hi) {
        const unsigned int mid = (lo + hi + 1) / 2;
        if (jobs[mid].tile_start <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const QuantJob& j = jobs[lo];
    const unsigned int k = b - j.tile_start;
    quantize_tile_body<S, D, 0>(reinterpret_cast<const S*>(j.src), nullptr,
                                reinterpret_cast<D*>(j.dst), reinterpret_cast<D*>(j.dst_t),
                                nullptr, nullptr, 0, 0, j.rows, j.cols,
                                reinterpret_cast<const float*>(j.scale),
                                reinterpret_cast<float*>(j.amax), k / j.col_tiles,
                                (unsigned int)((j.rows + QT - 1) / QT), k % j.col_tiles);
}

// quantize_grad_t_<S>_<D> (MODE 1) and quantize_dgelu_t_<S>_<D> (MODE 2): the same parameters.
#define QUANTIZE_GRAD(S, SS, D, SD, NAME, MODE, MIN_BLOCKS)                                   \
    extern "C" __global__ void __launch_bounds__(QT_THREADS, MIN_BLOCKS)                      \
        quantize_##NAME##_t_##SS##_##SD(                                                      \
        const S* __restrict__ dout, const S* __restrict__ pre, D* __restrict__ dst,           \
        D* __restrict__ dst_t, float* __restrict__ partial, unsigned int* __restrict__ ctr,   \
        u64 dbias, int dbias_dt, u64 rows, u64 cols, const float* __restrict__ scale,         \
        float* __restrict__ amax) {                                                           \
        quantize_tile_body<S, D, MODE>(dout, pre, dst, dst_t, partial, ctr, dbias, dbias_dt,  \
                                       rows, cols, scale, amax,                               \
                                       blockIdx.x, gridDim.x, blockIdx.y);                    \
    }
#define QUANTIZE(S, SS, D, SD)                                                                \
    extern "C" __global__ void quantize_##SS##_##SD(const S* __restrict__ src,                \
                                                    D* __restrict__ dst, u64 n,               \
                                                    const float* __restrict__ scale,          \
                                                    float* __restrict__ amax) {               \
        quantize_body<S, D, false>(src, dst, n, scale, amax);                                 \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(QT_THREADS, QT_MIN_BLOCKS)                   \
        quantize_t_##SS##_##SD(                                                               \
        const S* __restrict__ src, D* __restrict__ dst, D* __restrict__ dst_t, u64 rows,      \
        u64 cols, const float* __restrict__ scale, float* __restrict__ amax) {                \
        quantize_tile_body<S, D, 0>(src, nullptr, dst, dst_t, nullptr, nullptr, 0, 0, rows,   \
                                    cols, scale, amax, blockIdx.x, gridDim.x, blockIdx.y);    \
    }                                                                                         \
    extern "C" __global__ void quantize_t_scalar_##SS##_##SD(                                 \
        const S* __restrict__ src, D* __restrict__ dst, D* __restrict__ dst_t, u64 rows,      \
        u64 cols, const float* __restrict__ scale, float* __restrict__ amax) {                \
        quantize_t_scalar_body<S, D, false>(src, dst, dst_t, rows, cols, scale, amax);        \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(QT_THREADS, QT_MIN_BLOCKS)                   \
        quantize_t_many_##SS##_##SD(const QuantJob* __restrict__ jobs, unsigned int njobs) {  \
        quantize_t_many_body<S, D>(jobs, njobs);                                              \
    }                                                                                         \
    extern "C" __global__ void quantize_gelu_##SS##_##SD(const S* __restrict__ pre,           \
                                                         D* __restrict__ dst, u64 n,          \
                                                         const float* __restrict__ scale,     \
                                                         float* __restrict__ amax) {          \
        quantize_body<S, D, true>(pre, dst, n, scale, amax);                                  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(QT_THREADS, QT_MIN_BLOCKS)                   \
        quantize_gelu_t_##SS##_##SD(                                                          \
        const S* __restrict__ pre, D* __restrict__ dst, D* __restrict__ dst_t, u64 rows,      \
        u64 cols, const float* __restrict__ scale, float* __restrict__ amax) {                \
        quantize_tile_body<S, D, 3>(pre, nullptr, dst, dst_t, nullptr, nullptr, 0, 0, rows,   \
                                    cols, scale, amax, blockIdx.x, gridDim.x, blockIdx.y);    \
    }                                                                                         \
    extern "C" __global__ void quantize_gelu_t_scalar_##SS##_##SD(                            \
        const S* __restrict__ pre, D* __restrict__ dst, D* __restrict__ dst_t, u64 rows,      \
        u64 cols, const float* __restrict__ scale, float* __restrict__ amax) {                \
        quantize_t_scalar_body<S, D, true>(pre, dst, dst_t, rows, cols, scale, amax);         \
    }                                                                                         \
    QUANTIZE_GRAD(S, SS, D, SD, grad, 1, QT_GRAD_MIN_BLOCKS)                                  \
    QUANTIZE_GRAD(S, SS, D, SD, dgelu, 2, QT_DGELU_MIN_BLOCKS)
#define QUANTIZE_TO(S, SS)                                                                    \
    QUANTIZE(S, SS, e4m3_t, f8e4m3)                                                           \
    QUANTIZE(S, SS, e5m2_t, f8e5m2)                                                           \
    QUANTIZE(S, SS, e4m3fnuz_t, f8e4m3fnuz)                                                   \
    QUANTIZE(S, SS, e5m2fnuz_t, f8e5m2fnuz)
QUANTIZE_TO(float, f32)
QUANTIZE_TO(bf16_t, bf16)
QUANTIZE_TO(f16_t, f16)

// ------------------------------------------------------------------ LayerNorm + quantisation
//
// layernorm_fp8_<A>_<P>_<v|s>_<D>: Device::layernorm_forward_fp8. The block is the fast
// LayerNorm forward's (layernorm.cu, layernorm_fwd_*): ⌊8 / G⌋ row groups of G warps, the row
// layout (V = 16-byte vectors `v` or single elements `s`, G) chosen by the host exactly as for
// layernorm_forward (device/layernorm.rs, `plan`), and the row loaded, reduced and normalised by
// the helpers both kernels share (common.cuh: ln_load_row, ln_row_stats, ln_affine). So mean,
// rstd and every normalised value are layernorm_forward's bits; each value is rounded to A as
// its `out` is, then quantised as quantize_fp8 does it (encode4/encode8, value · scale[0]) with
// the amax over the rounded values (NaN skipped, one atomicMax per block).
//
// Block b handles the LNQ_ROWS = 32 rows [32b, 32b + 32): each row group takes every ⌊8 / G⌋-th
// of them, the next row's loads issued before the current row is reduced. Per row: mean and
// rstd (written by thread 0 of the group), then each thread normalises its vectors and stores
// their codes to dst (V bytes per vector, consecutive threads consecutive vectors) and, with
// dst_t, into the shared tile (32 rows × S words, S = ⌈c / 128⌉ · 32, dynamic shared memory).
// Transposed store: unit (word column w, row octet o) reads rows 8o .. 8o + 7 of tile word w,
// transposes the 8 × 4 bytes in registers and writes columns 4w .. 4w + 3, rows 8o .. 8o + 7 to
// dst_t (8 bytes each when n is a multiple of 8, else byte by byte, clipped to n and c). The
// 4 units of one word column are neighbouring threads: 32 contiguous bytes per dst_t row. The
// tile is XOR-swizzled by word (w ^ 8·((row / 8) % 4)): with S a multiple of 32 the transpose
// reads are conflict-free, and the row stores stay contiguous per warp.
#define LNQ_ROWS 32

template <typename A, typename P, typename D, bool VEC>
__device__ __forceinline__ void layernorm_fp8_body(
    const A* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,
    float* __restrict__ mean, float* __restrict__ rstd, D* __restrict__ dst_,
    D* __restrict__ dst_t_, int n, int c, float eps, int G, const float* __restrict__ scale,
    float* __restrict__ amax) {
    constexpr int V = VEC ? Pack<A>::N : 1;
    // Vectors per thread: 24 elements vectorised, 6 single ones (the host runs this kernel
    // only for plans within that, LNQ_MAX_ELEMENTS in fp8.rs); the row layout does not depend
    // on it.
    constexpr int M = VEC ? 24 / V : 6;
    static_assert(V == 1 || V == 4 || V == 8, "codes per vector");
    extern __shared__ __align__(16) unsigned int qtile[];  // LNQ_ROWS × S words, with dst_t
    __shared__ float gsh[8];
    __shared__ float msh[32];
    unsigned char* dst = reinterpret_cast<unsigned char*>(dst_);
    unsigned char* dst_t = reinterpret_cast<unsigned char*>(dst_t_);
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = threadIdx.x / gt, t = threadIdx.x - grp * gt;
    const int nv = c / V;
    const int S = (c + 127) / 128 * 32;
    const int r0 = blockIdx.x * LNQ_ROWS;
    const int iters = LNQ_ROWS / groups;  // groups is 1, 2, 4 or 8
    const float s = scale[0];
    float m = 0.0f;

    Vec<A, V> cur[M], nxt[M];
    {
        const int row = r0 + grp;
        ln_load_row<A, V, M>(cur, x + (u64)(row < n ? row : 0) * c, row < n, t, gt, nv);
    }
    for (int it = 0; it < iters; ++it) {
        const int tr = it * groups + grp;  // row in the tile
        const int row = r0 + tr;
        const bool live = row < n;
        if (it + 1 < iters) {
            const int nrow = row + groups;
            ln_load_row<A, V, M>(nxt, x + (u64)(nrow < n ? nrow : 0) * c, nrow < n, t, gt, nv);
        }
        float mu, rs;
        ln_row_stats<A, V, M>(cur, live, t, gt, nv, c, eps, G, gsh, mu, rs);
        if (live && t == 0) {
            mean[row] = mu;
            rstd[row] = rs;
        }
        const int swz = ((tr >> 3) & 3) << 3;
        unsigned int* trow = qtile + tr * S;
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
                const Vec<P, V> b = load_vec<P, V>(beta + j * V);
                float v[V];
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    // layernorm_forward's out element, as quantize_fp8 reads it back.
                    v[e] = round_to<A>(ln_affine(to_f32(cur[k].v[e]), mu, rs, to_f32(g.v[e]),
                                                 to_f32(b.v[e])));
                    m = fmaxf(m, fabsf(v[e]));
                }
                unsigned char* out = dst + (u64)row * c + (u64)j * V;
                if constexpr (V == 8) {
                    const uint2 q = encode8<D>(v, s);
                    *reinterpret_cast<uint2*>(out) = q;
                    if (dst_t != nullptr)
                        *reinterpret_cast<uint2*>(trow + ((2 * j) ^ swz)) = q;
                } else if constexpr (V == 4) {
                    const unsigned int q = encode4<D>(v[0] * s, v[1] * s, v[2] * s, v[3] * s);
                    *reinterpret_cast<unsigned int*>(out) = q;
                    if (dst_t != nullptr) trow[j ^ swz] = q;
                } else {
                    const unsigned char q = from_f32<D>(v[0] * s).bits;
                    *out = q;
                    if (dst_t != nullptr)
                        reinterpret_cast<unsigned char*>(trow + ((j >> 2) ^ swz))[j & 3] = q;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < M; ++k) cur[k] = nxt[k];
    }

    // Also the barrier between the tile stores above and the transposed reads below.
    m = block_max(m, msh);
    if (threadIdx.x == 0) record_amax(m, amax);
    if (dst_t == nullptr) return;  // uniform across the grid

    const int live_rows = min(n - r0, LNQ_ROWS);
    const int units = (c + 3) / 4 * (LNQ_ROWS / 8);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        const int o = u & 3, w = u >> 2;
        if (8 * o >= live_rows) continue;
        const unsigned int* col = qtile + 8 * o * S + (w ^ (o << 3));
        unsigned int lo[4], hi[4];
        transpose4x4(col[0], col[S], col[2 * S], col[3 * S], lo);
        transpose4x4(col[4 * S], col[5 * S], col[6 * S], col[7 * S], hi);
        const int rr = r0 + 8 * o;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int cc = 4 * w + i;
            if (cc >= c) break;
            unsigned char* p = dst_t + (u64)cc * n + rr;
            if ((n & 7) == 0) {
                // rr < n, both multiples of 8: all 8 rows exist, and p is 8-byte aligned.
                *reinterpret_cast<uint2*>(p) = make_uint2(lo[i], hi[i]);
            } else {
                const int k = min(8, n - rr);
                for (int r = 0; r < k; ++r)
                    p[r] = (unsigned char)((r < 4 ? lo[i] >> (8 * r) : hi[i] >> (8 * (r - 4))) &
                                           0xffu);
            }
        }
    }
}

#define LAYERNORM_FP8_ONE(A, SA, P, SP, VEC, VN, D, SD)                                        \
    extern "C" __global__ void __launch_bounds__(256)                                          \
        layernorm_fp8_##SA##_##SP##_##VN##_##SD(                                               \
            const A* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,  \
            float* __restrict__ mean, float* __restrict__ rstd, D* __restrict__ dst,           \
            D* __restrict__ dst_t, int n, int c, float eps, int G,                             \
            const float* __restrict__ scale, float* __restrict__ amax) {                       \
        layernorm_fp8_body<A, P, D, VEC>(x, gamma, beta, mean, rstd, dst, dst_t, n, c, eps,    \
                                         G, scale, amax);                                      \
    }
// The OCP formats (E4M3, E5M2); FNUZ destinations run the separate ops.
#define LAYERNORM_FP8(A, SA, P, SP)                                                           \
    LAYERNORM_FP8_ONE(A, SA, P, SP, true, v, e4m3_t, f8e4m3)                                  \
    LAYERNORM_FP8_ONE(A, SA, P, SP, false, s, e4m3_t, f8e4m3)                                 \
    LAYERNORM_FP8_ONE(A, SA, P, SP, true, v, e5m2_t, f8e5m2)                                  \
    LAYERNORM_FP8_ONE(A, SA, P, SP, false, s, e5m2_t, f8e5m2)
FOR_ACT_AND_WIDE(LAYERNORM_FP8)

// ------------------------------------------------------------------ LayerNorm + quantisation, split
//
// For wide rows the one-pass kernel above has too few rows in flight (a block owns 32 rows, each
// row group works through its rows one after another), so Device::layernorm_forward_fp8 splits
// it in two launches (device/fp8.rs chooses by the row width): layernorm.cu's
// layernorm_stats_<A>_v (the plan's mean and rstd, layernorm_forward's bits), then
//   layernorm_quant_t_<A>_<P>_<D>(x, gamma, beta, mean, rstd, dst, dst_t, rows, cols, scale,
//     amax): the 64 × 64 tile kernel (MODE 4) on y = ln_affine(x, mean, rstd, γ, β) rounded to
//     A, which is layernorm_forward's `out` element, so the codes are those of
//     layernorm_forward + quantize_fp8. cols a multiple of 8 (rows too with dst_t).
// x is read twice (the second read mostly from L2, right after the first).
#define LAYERNORM_QUANT_ONE(A, SA, P, SP, D, SD)                                               \
    extern "C" __global__ void __launch_bounds__(QT_THREADS, QT_LN_MIN_BLOCKS)                 \
        layernorm_quant_t_##SA##_##SP##_##SD(                                                  \
            const A* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,  \
            const float* __restrict__ mean, const float* __restrict__ rstd,                    \
            D* __restrict__ dst, D* __restrict__ dst_t, u64 rows, u64 cols,                    \
            const float* __restrict__ scale, float* __restrict__ amax) {                       \
        LnArgs<P> ln;                                                                          \
        ln.gamma = gamma;                                                                      \
        ln.beta = beta;                                                                        \
        ln.mean = mean;                                                                        \
        ln.rstd = rstd;                                                                        \
        quantize_tile_body<A, D, 4, P>(x, nullptr, dst, dst_t, nullptr, nullptr, 0, 0, rows,   \
                                       cols, scale, amax,                                      \
                                       blockIdx.x, gridDim.x, blockIdx.y, ln);                 \
    }
#define LAYERNORM_QUANT(A, SA, P, SP)                                                         \
    LAYERNORM_QUANT_ONE(A, SA, P, SP, e4m3_t, f8e4m3)                                         \
    LAYERNORM_QUANT_ONE(A, SA, P, SP, e5m2_t, f8e5m2)
FOR_ACT_AND_WIDE(LAYERNORM_QUANT)

// ------------------------------------------------------------------ AdamW + weight codes
//
// adamw_fp8_<D>(const AdamWFp8Chunk* chunks, const float* scalars, β1, β2, ε, max_norm,
// loss_scale): Device::adamw_clipped_fp8 for weights whose f32 `param` is the working weight
// (no low-precision copy). Block k handles chunk k (a piece of one tensor; the chunks of
// adamw_multi, device/multi.rs): adamw_multi's update of every element (adamw_update with the
// gradient factor from clip_grad_scale, common.cuh: the same bits), then the FP8 code of the
// updated value times scale[0] through encode4 (quantize_t_many's expression for an f32
// source) into `codes`, and the amax over the updated values (one atomicMax per block). So the
// update writes 1 byte more per element and no quantisation pass has to read the 4-byte weights
// again; the transposed codes come from these (transpose_codes_many below).
struct AdamWFp8Chunk {
    u64 param, grad, m, v, codes;  // f32, G, f32, f32, D: tensor starts
    u64 scale, amax;               // the tensor's slot of each
    u64 offset;                    // first element of this chunk within the tensor
    unsigned int len;              // elements in this chunk
    int grad_dt;                   // 0 f32, 1 bf16, 2 f16
    float weight_decay;
    unsigned int pad;
};
static_assert(sizeof(AdamWFp8Chunk) == 80, "AdamWFp8Chunk: 80-byte records (device/fp8.rs)");

// Four gradients at a global address (16 bytes of f32, 8 of bf16/f16).
template <typename G> __device__ __forceinline__ float4 grad4(const G* p) {
    const uint2 w = load2u(p);
    G a, b, c, d;
    a.bits = (unsigned short)(w.x & 0xffffu);
    b.bits = (unsigned short)(w.x >> 16);
    c.bits = (unsigned short)(w.y & 0xffffu);
    d.bits = (unsigned short)(w.y >> 16);
    return make_float4(to_f32(a), to_f32(b), to_f32(c), to_f32(d));
}
template <> __device__ __forceinline__ float4 grad4<float>(const float* p) { return load4(p); }

struct AdamWFp8Quad {
    float4 p, g, m, v;
};

// Updates 4 elements at index i (loaded into q), stores param, m, v and the 4 codes.
template <typename D>
__device__ __forceinline__ void adamw_fp8_store4(AdamWFp8Quad q, float* param, float* m,
                                                 float* v, unsigned char* codes, unsigned int i,
                                                 const AdamWConsts& k, float s, float& mx) {
    float4 p;
    p.x = adamw_update(q.g.x, q.m.x, q.v.x, q.p.x, k);
    p.y = adamw_update(q.g.y, q.m.y, q.v.y, q.p.y, k);
    p.z = adamw_update(q.g.z, q.m.z, q.v.z, q.p.z, k);
    p.w = adamw_update(q.g.w, q.m.w, q.v.w, q.p.w, k);
    store4(m + i, q.m);
    store4(v + i, q.v);
    store4(param + i, p);
    store1u(codes + i, encode4<D>(p.x * s, p.y * s, p.z * s, p.w * s));
    mx = fmaxf(mx, fmaxf(fmaxf(fabsf(p.x), fabsf(p.y)), fmaxf(fabsf(p.z), fabsf(p.w))));
}

// One chunk, as adamw_multi's adamw_chunk: 4-element groups two at a time (all loads issued
// before the first store) when every stream is aligned for them, then the rest one at a time.
template <typename G, typename D>
__device__ __forceinline__ void adamw_fp8_chunk(const AdamWFp8Chunk& c, const AdamWConsts& k,
                                                float s, float& mx) {
    float* param = reinterpret_cast<float*>(c.param) + c.offset;
    const G* grad = reinterpret_cast<const G*>(c.grad) + c.offset;
    float* m = reinterpret_cast<float*>(c.m) + c.offset;
    float* v = reinterpret_cast<float*>(c.v) + c.offset;
    unsigned char* codes = reinterpret_cast<unsigned char*>(c.codes) + c.offset;
    const unsigned int len = c.len, nt = blockDim.x;
    unsigned int tail = 0;
    const bool vec = (((u64)param | (u64)m | (u64)v) & 15) == 0 &&
                     ((u64)grad & (4 * sizeof(G) - 1)) == 0 && ((u64)codes & 3) == 0;
    const auto load = [&](unsigned int i) {
        AdamWFp8Quad q;
        q.p = load4(param + i);
        q.g = grad4(grad + i);
        q.m = load4(m + i);
        q.v = load4(v + i);
        return q;
    };
    if (vec) {
        const unsigned int groups = len / 4;
        unsigned int q = threadIdx.x;
        for (; q + nt < groups; q += 2 * nt) {
            const AdamWFp8Quad a = load(4 * q);
            const AdamWFp8Quad b = load(4 * (q + nt));
            adamw_fp8_store4<D>(a, param, m, v, codes, 4 * q, k, s, mx);
            adamw_fp8_store4<D>(b, param, m, v, codes, 4 * (q + nt), k, s, mx);
        }
        if (q < groups) adamw_fp8_store4<D>(load(4 * q), param, m, v, codes, 4 * q, k, s, mx);
        tail = 4 * groups;
    }
    for (unsigned int j = tail + threadIdx.x; j < len; j += nt) {
        float mj = m[j], vj = v[j];
        const float p = adamw_update(to_f32(grad[j]), mj, vj, param[j], k);
        m[j] = mj;
        v[j] = vj;
        param[j] = p;
        codes[j] = (unsigned char)(encode4<D>(p * s, 0.0f, 0.0f, 0.0f) & 0xffu);
        mx = fmaxf(mx, fabsf(p));
    }
}

template <typename D>
__device__ __forceinline__ void adamw_fp8_body(const AdamWFp8Chunk* __restrict__ chunks,
                                               const float* __restrict__ scalars, float beta1,
                                               float beta2, float eps, float max_norm,
                                               float loss_scale) {
    __shared__ float sh[32];
    const AdamWFp8Chunk c = chunks[blockIdx.x];
    AdamWConsts k;
    k.grad_scale = clip_grad_scale(scalars[0], max_norm, loss_scale);
    k.lr = scalars[1];
    k.bc1 = scalars[2];
    k.bc2 = scalars[3];
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.eps = eps;
    k.weight_decay = c.weight_decay;
    const float s = reinterpret_cast<const float*>(c.scale)[0];
    float mx = 0.0f;
    if (c.grad_dt == 0)
        adamw_fp8_chunk<float, D>(c, k, s, mx);
    else if (c.grad_dt == 1)
        adamw_fp8_chunk<bf16_t, D>(c, k, s, mx);
    else
        adamw_fp8_chunk<f16_t, D>(c, k, s, mx);
    mx = block_max(mx, sh);
    if (threadIdx.x == 0) record_amax(mx, reinterpret_cast<float*>(c.amax));
}

// Block size: THREADS in device/multi.rs (as adamw_multi).
#define ADAMW_FP8(D, SD)                                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        adamw_fp8_##SD(const AdamWFp8Chunk* __restrict__ chunks,                              \
                       const float* __restrict__ scalars, float beta1, float beta2, float eps, \
                       float max_norm, float loss_scale) {                                    \
        adamw_fp8_body<D>(chunks, scalars, beta1, beta2, eps, max_norm, loss_scale);          \
    }
ADAMW_FP8(e4m3_t, f8e4m3)
ADAMW_FP8(e5m2_t, f8e5m2)
ADAMW_FP8(e4m3fnuz_t, f8e4m3fnuz)
ADAMW_FP8(e5m2fnuz_t, f8e5m2fnuz)

// transpose_codes_many(const CodesJob* jobs, unsigned njobs): dst_t = srcᵀ for every job (FP8
// codes, any format: bytes; rows × cols → cols × rows). The tiles, the job search and the
// transposed store are quantize_t_many's; each thread loads its 4 vectors of 8 codes first.
// Requirements per job: rows and cols multiples of 8, src and dst_t 8-byte aligned.
struct CodesJob {
    u64 src, dst_t, rows, cols;
    unsigned int tile_start;  // first block of this job
    unsigned int col_tiles;   // ⌈cols / 64⌉
};
static_assert(sizeof(CodesJob) == 40, "CodesJob: 40-byte records (device/fp8.rs)");

extern "C" __global__ void __launch_bounds__(QT_THREADS, QT_MIN_BLOCKS)
    transpose_codes_many(const CodesJob* __restrict__ jobs, unsigned int njobs) {
    __shared__ __align__(16) unsigned int tile[QT][QT / 4];
    const unsigned int b = blockIdx.x;
    unsigned int lo = 0, hi = njobs - 1;  // the last job with tile_start <= b
    while (lo < hi) {
        const unsigned int mid = (lo + hi + 1) / 2;
        if (jobs[mid].tile_start <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const CodesJob& j = jobs[lo];
    const unsigned int k = b - j.tile_start;
    const u64 rows = j.rows, cols = j.cols;
    const u64 r0 = (u64)(k / j.col_tiles) * QT, c0 = (u64)(k % j.col_tiles) * QT;
    const unsigned char* src = reinterpret_cast<const unsigned char*>(j.src);
    const int t = threadIdx.x, cg = t & 7, rt = t >> 3;
    const u64 c = c0 + cg * 8;
    uint2 q[QT_PASSES];
#pragma unroll
    for (int p = 0; p < QT_PASSES; ++p) {
        const u64 r = r0 + rt + 16 * p;
        if (c < cols && r < rows) q[p] = *reinterpret_cast<const uint2*>(src + r * cols + c);
    }
#pragma unroll
    for (int p = 0; p < QT_PASSES; ++p) {
        const int tr = rt + 16 * p;
        if (c < cols && r0 + tr < rows)
            *reinterpret_cast<uint2*>(&tile[tr][tile_word(tr, 2 * cg)]) = q[p];
    }
    __syncthreads();
    store_tile_t(tile, reinterpret_cast<unsigned char*>(j.dst_t), r0, c0, rows, cols);
}
