// Fused causal self-attention (flash-attention style), forward and backward, with no t × t
// buffer: duet_device::Fused::flash_attention_forward / _backward.
//
// Layouts (as kernels-cuda/flash_attention.cu): `qkv` is b × t × 3 × nh × HS (row-major), `out`
// and `dout` b × t × nh·HS, `lse` (f32) b × nh × t, `dqkv` like `qkv`; `d` (f32, b × nh × t) is
// backend scratch holding D_i = Σ_c dO·O per query row.
//
// One tiling, masking and online softmax, two inner products:
//  - portable (the default, every target and the HIP-over-CUDA test platform): each query (or
//    key) row of a block's tile is owned by TPR consecutive lanes; a score is one lane's dot
//    product in a fixed order (column 0 first, one FMA per element); each lane accumulates its
//    CPT = 16 output columns over the inner tile's rows in order. Reductions across a row's
//    lanes (max, sum, D) are xor butterflies of width TPR (4 or 8 lanes, inside any 32-lane
//    group): no result depends on the wavefront size, so wave32 and wave64 give the same bits.
//  - MFMA (opt-in, DUET_HIP_FLASH_MFMA; gfx90a, gfx942, gfx950 only): the same kernels with
//    every product (S = Q·Kᵀ, dP = dO·Vᵀ, P·V, dS·K, Pᵀ·dO, dSᵀ·Q) on v_mfma_f32_16x16x16
//    {bf16_1k,f16} (16-bit operands, f32 accumulation; P and dS rounded to the storage type as
//    they enter a product, as CUDA's kernels do); a product's tile goes through shared memory to
//    the lanes that own its rows. Not run on AMD hardware yet: compiled by CI's real hiprtc
//    only, so not the default.
// Softmax and every accumulation are f32; e^x is duet_exp_fma_f32, ln duet_log_f32. Every
// output element is written by one lane with a fixed summation order and no atomics: results
// are bit-identical run to run.
//
// Tiles (BR rows owned by a block, BC rows of the inner loop; 256 threads):
//   HS = 64: BR = 64, BC = 32, TPR = 4;   HS = 128: BR = 32, BC = 32, TPR = 8.
// Shared memory stays under 48 KiB per block (static) on the portable path (the MFMA path adds
// a BR × (HS + 4) f32 product tile: at most 59 KiB, within CDNA's 64 KiB), in 32-bit words: a
// 16-bit tile row is HS/2 + 1 words (one word of padding: consecutive rows start in different
// banks).
//
// Entry points (T = bf16 | f16, HS = 64 | 128; grids x = b·nh, y = tile):
//   flash_attention_forward_hsHS_T(const T* qkv, T* out, float* lse, int t, int nh, float scale)
//   flash_attention_backward_dq_hsHS_T(const T* qkv, const T* out, const T* dout,
//       const float* lse, float* d, T* dqkv, int t, int nh, float scale)   (writes d, dQ)
//   flash_attention_backward_dkv_hsHS_T(const T* qkv, const T* dout, const float* lse,
//       const float* d, T* dqkv, int t, int nh, float scale)               (after _dq: dK, dV)
// and the same names with `flash_attention_mfma_` for the MFMA inner product.
#include "duet_hip.h"

#define FA_NEG_INF (-duet_u2f(0x7f800000u))

// 16-bit storage: the raw bits to f32 and back (round to nearest even).
template <typename T> struct FaBits;
template <> struct FaBits<duet_bf16> {
    static __device__ __forceinline__ float f(unsigned b) { return duet_bf16_to_f32((unsigned short)b); }
    static __device__ __forceinline__ unsigned r(float x) { return duet_f32_to_bf16(x); }
};
template <> struct FaBits<duet_f16> {
    static __device__ __forceinline__ float f(unsigned b) { return duet_f16_to_f32((unsigned short)b); }
    static __device__ __forceinline__ unsigned r(float x) { return duet_f32_to_f16(x); }
};

template <int HS> struct FaTile;
template <> struct FaTile<64> { static constexpr int BR = 64, BC = 32; };
template <> struct FaTile<128> { static constexpr int BR = 32, BC = 32; };

template <typename T, int HS> struct FaCfg {
    static constexpr int BR = FaTile<HS>::BR, BC = FaTile<HS>::BC;
    static constexpr int TPR = DUET_BLOCK / BR;  // lanes per owned row
    static constexpr int CPT = HS / TPR;         // output columns per lane (16)
    static constexpr int KPT = BC / TPR;         // inner rows per lane in a score pass
    static constexpr int W = HS / 2 + 1;         // words per 16-bit tile row in shared memory
    static constexpr int PW = BC + 1;            // floats per row of a score tile
};

// Sum / max over the TPR lanes of a row (consecutive lanes): a xor butterfly, fixed order.
template <int TPR> DUET_DEV float fa_group_sum(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v = duet_fadd(v, __shfl_xor(v, o, TPR));
    return v;
}
template <int TPR> DUET_DEV float fa_group_max(float v) {
    for (int o = TPR / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o, TPR));
    return v;
}

// rows × HS elements from `src` (row i at src + i·stride, rows at and past `limit` zero) into
// shared memory, HS/2 words per row at the padded stride W. Coalesced: consecutive lanes read
// consecutive words of a row.
template <int HS>
DUET_DEV void fa_load(unsigned* __restrict__ dst, const unsigned short* __restrict__ src,
                      duet_u64 stride, int row0, int rows, int limit) {
    constexpr int HW = HS / 2, W = HS / 2 + 1;
    for (int i = threadIdx.x; i < rows * HW; i += DUET_BLOCK) {
        const int rr = i / HW, c = i % HW, tt = row0 + rr;
        unsigned w = 0u;
        if (tt < limit) w = reinterpret_cast<const unsigned*>(src + (duet_u64)tt * stride)[c];
        dst[rr * W + c] = w;
    }
}

// The dot product of two shared-memory 16-bit rows (HS elements), element 0 first.
template <typename T, int HS>
DUET_DEV float fa_dot(const unsigned* __restrict__ a, const unsigned* __restrict__ b) {
    float acc = 0.0f;
#pragma unroll 8
    for (int w = 0; w < HS / 2; ++w) {
        const unsigned x = a[w], y = b[w];
        acc = duet_fma(FaBits<T>::f(x & 0xffffu), FaBits<T>::f(y & 0xffffu), acc);
        acc = duet_fma(FaBits<T>::f(x >> 16), FaBits<T>::f(y >> 16), acc);
    }
    return acc;
}

// acc[0..CPT) += Σ_i coef[i] · row_i[col0 .. col0 + CPT) over the BC rows of a shared tile,
// row 0 first (coef: one float per row, stride 1; rows at the padded stride W).
template <typename T, int HS, int CPT, int BC>
DUET_DEV void fa_accumulate(float* acc, const float* __restrict__ coef,
                            const unsigned* __restrict__ tile, int col0) {
    constexpr int W = HS / 2 + 1;
    for (int i = 0; i < BC; ++i) {
        const float c = coef[i];
        const unsigned* row = tile + i * W + col0 / 2;
#pragma unroll
        for (int w = 0; w < CPT / 2; ++w) {
            const unsigned x = row[w];
            acc[2 * w] = duet_fma(c, FaBits<T>::f(x & 0xffffu), acc[2 * w]);
            acc[2 * w + 1] = duet_fma(c, FaBits<T>::f(x >> 16), acc[2 * w + 1]);
        }
    }
}

// CPT consecutive values rounded to T, stored as CPT/2 words at dst (4-byte aligned).
template <typename T, int CPT>
DUET_DEV void fa_store(unsigned short* dst, const float* v) {
    unsigned* d = reinterpret_cast<unsigned*>(dst);
#pragma unroll
    for (int w = 0; w < CPT / 2; ++w)
        d[w] = FaBits<T>::r(v[2 * w]) | (FaBits<T>::r(v[2 * w + 1]) << 16);
}

// ------------------------------------------------------------------------------ inner products
// The score pass writes sp[r][c] (r < BR owned rows, c < BC inner rows; stride PW) =
// dot(own row r, inner row c) of two shared tiles; the products accumulate one CPT-column slice
// per lane. The portable one: lane (r, j) computes c = j + u·TPR.
struct FaPortable {
    template <typename T, int HS, int BR, int BC, int TPR>
    DUET_DEV void scores(float* __restrict__ sp, const unsigned* __restrict__ own,
                                const unsigned* __restrict__ inner) {
        constexpr int W = HS / 2 + 1, PW = BC + 1;
        const int r = threadIdx.x / TPR, j = threadIdx.x % TPR;
#pragma unroll
        for (int u = 0; u < BC / TPR; ++u) {
            const int c = j + u * TPR;
            sp[r * PW + c] = fa_dot<T, HS>(own + r * W, inner + c * W);
        }
    }
    // acc (lane (r, j)'s CPT columns from j·CPT) += Σ_c coef[r][c] · tile[c][cols], c in order.
    template <typename T, int HS, int BR, int BC, int TPR>
    DUET_DEV void accumulate(float* acc, const float* __restrict__ coef,
                             const unsigned* __restrict__ tile) {
        constexpr int CPT = HS / TPR, PW = BC + 1;
        const int r = threadIdx.x / TPR, j = threadIdx.x % TPR;
        fa_accumulate<T, HS, CPT, BC>(acc, coef + r * PW, tile, j * CPT);
    }
};

// The MFMA inner products (gfx90a / gfx942 / gfx950, wave64): 16 × 16 output tiles of
// v_mfma_f32_16x16x16{bf16_1k,f16}, split over the block's four waves; K = HS in steps of 16.
// Operand layout (AMD's matrix instruction calculator for these instructions): lane l holds
// A[l % 16][4·(l / 16) .. +4) and B[4·(l / 16) .. +4)[l % 16] (here B = innerᵀ, so both read
// four consecutive elements of a tile row), and D[4·(l / 16) + v][l % 16] for v = 0..3.
#if defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx950__)
#define FA_HAVE_MFMA 1
typedef short fa_short4 __attribute__((ext_vector_type(4)));
typedef _Float16 fa_half4 __attribute__((ext_vector_type(4)));
typedef float fa_float4 __attribute__((ext_vector_type(4)));

template <typename T> struct FaMma;
template <> struct FaMma<duet_bf16> {
    static __device__ __forceinline__ fa_float4 run(fa_short4 a, fa_short4 b, fa_float4 c) {
        return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
    }
};
template <> struct FaMma<duet_f16> {
    static __device__ __forceinline__ fa_float4 run(fa_short4 a, fa_short4 b, fa_float4 c) {
        return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(fa_half4, a),
                                                     __builtin_bit_cast(fa_half4, b), c, 0, 0, 0);
    }
};

DUET_DEV fa_short4 fa_operand(const unsigned* w) {
    fa_short4 s;
    s.x = (short)(w[0] & 0xffffu);
    s.y = (short)(w[0] >> 16);
    s.z = (short)(w[1] & 0xffffu);
    s.w = (short)(w[1] >> 16);
    return s;
}

struct FaMfma {
    template <typename T, int HS, int BR, int BC, int TPR>
    DUET_DEV void scores(float* __restrict__ sp, const unsigned* __restrict__ own,
                                const unsigned* __restrict__ inner) {
        static_assert(DUET_WARP == 64, "the MFMA path needs wave64");
        constexpr int W = HS / 2 + 1, PW = BC + 1, TN = BC / 16, TILES = (BR / 16) * TN;
        constexpr int WAVES = DUET_BLOCK / 64;
        const int wave = threadIdx.x / 64, lane = threadIdx.x % 64;
        const int li = lane % 16, lk = (lane / 16) * 4;
        for (int tile = wave; tile < TILES; tile += WAVES) {
            const int ti = tile / TN, tj = tile % TN;
            const unsigned* a = own + (ti * 16 + li) * W + lk / 2;
            const unsigned* b = inner + (tj * 16 + li) * W + lk / 2;
            fa_float4 acc = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k0 = 0; k0 < HS; k0 += 16)
                acc = FaMma<T>::run(fa_operand(a + k0 / 2), fa_operand(b + k0 / 2), acc);
#pragma unroll
            for (int v = 0; v < 4; ++v) sp[(ti * 16 + lk + v) * PW + tj * 16 + li] = acc[v];
        }
    }
    // acc (lane (r, j)'s CPT columns) += (coef · tile)[r][cols]: the BR × HS product by MFMA
    // (coef, f32, rounded to T as it enters; tile rows at the padded stride), through a shared
    // f32 tile that the owning lanes then add. Reached by the whole block (it synchronises).
    template <typename T, int HS, int BR, int BC, int TPR>
    DUET_DEV void accumulate(float* acc, const float* __restrict__ coef,
                             const unsigned* __restrict__ tile) {
        constexpr int W = HS / 2 + 1, PW = BC + 1, CPT = HS / TPR, OW = HS + 4;
        constexpr int TN = HS / 16, TILES = (BR / 16) * TN, WAVES = DUET_BLOCK / 64;
        __shared__ float so[BR * OW];
        const int wave = threadIdx.x / 64, lane = threadIdx.x % 64;
        const int li = lane % 16, lk = (lane / 16) * 4;
        const unsigned short* t16 = reinterpret_cast<const unsigned short*>(tile);
        for (int tl = wave; tl < TILES; tl += WAVES) {
            const int ti = tl / TN, tj = tl % TN;
            fa_float4 o = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k0 = 0; k0 < BC; k0 += 16) {
                const float* a = coef + (ti * 16 + li) * PW + k0 + lk;
                fa_short4 av, bv;
                av.x = (short)FaBits<T>::r(a[0]);
                av.y = (short)FaBits<T>::r(a[1]);
                av.z = (short)FaBits<T>::r(a[2]);
                av.w = (short)FaBits<T>::r(a[3]);
                const int col = tj * 16 + li;
                bv.x = (short)t16[(k0 + lk + 0) * 2 * W + col];
                bv.y = (short)t16[(k0 + lk + 1) * 2 * W + col];
                bv.z = (short)t16[(k0 + lk + 2) * 2 * W + col];
                bv.w = (short)t16[(k0 + lk + 3) * 2 * W + col];
                o = FaMma<T>::run(av, bv, o);
            }
#pragma unroll
            for (int v = 0; v < 4; ++v) so[(ti * 16 + lk + v) * OW + tj * 16 + li] = o[v];
        }
        __syncthreads();
        const int r = threadIdx.x / TPR, j = threadIdx.x % TPR;
#pragma unroll
        for (int c = 0; c < CPT; ++c) acc[c] = duet_fadd(acc[c], so[r * OW + j * CPT + c]);
        __syncthreads();  // so is reused by the next call
    }
};
#endif

// ----------------------------------------------------------------------------------- forward
template <typename T, int HS, typename IP>
DUET_DEV void fa_forward(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse,
                         int t, int nh, float scale) {
    typedef FaCfg<T, HS> C;
    __shared__ unsigned sq[C::BR * C::W];
    __shared__ unsigned sk[C::BC * C::W];
    __shared__ unsigned sv[C::BC * C::W];
    __shared__ float sp[C::BR * C::PW];
    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int tiles = (t + C::BR - 1) / C::BR;
    const int q0 = (tiles - 1 - (int)blockIdx.y) * C::BR;  // the tiles with most work first
    const int r = threadIdx.x / C::TPR, j = threadIdx.x % C::TPR, qi = q0 + r;
    const unsigned short* base =
        reinterpret_cast<const unsigned short*>(qkv) + (duet_u64)bb * t * 3 * nh * HS + (duet_u64)h * HS;
    const duet_u64 stride = 3ull * nh * HS;
    fa_load<HS>(sq, base, stride, q0, C::BR, t);
    float m = FA_NEG_INF, l = 0.0f, o[C::CPT];
#pragma unroll
    for (int c = 0; c < C::CPT; ++c) o[c] = 0.0f;
    const int last = (min(q0 + C::BR, t) - 1) / C::BC;
    for (int kt = 0; kt <= last; ++kt) {
        const int k0 = kt * C::BC;
        __syncthreads();  // the previous tile's K, V and P are no longer read
        fa_load<HS>(sk, base + (duet_u64)nh * HS, stride, k0, C::BC, t);
        fa_load<HS>(sv, base + 2ull * nh * HS, stride, k0, C::BC, t);
        __syncthreads();
        IP::template scores<T, HS, C::BR, C::BC, C::TPR>(sp, sq, sk);
        __syncthreads();
        float x[C::KPT], mx = FA_NEG_INF;
#pragma unroll
        for (int u = 0; u < C::KPT; ++u) {
            const int c = j + u * C::TPR;
            const float s = duet_fmul(sp[r * C::PW + c], scale);
            x[u] = (k0 + c > qi || qi >= t) ? FA_NEG_INF : s;
            mx = fmaxf(mx, x[u]);
        }
        mx = fa_group_max<C::TPR>(mx);
        const float mn = fmaxf(m, mx);
        const float ref = mn == FA_NEG_INF ? 0.0f : mn;  // a row past t: everything masked
        const float corr = duet_exp_fma_f32(duet_fsub(m, ref));
        float ps = 0.0f;
#pragma unroll
        for (int u = 0; u < C::KPT; ++u) {
            const float p = duet_exp_fma_f32(duet_fsub(x[u], ref));
            sp[r * C::PW + j + u * C::TPR] = p;
            ps = duet_fadd(ps, p);
        }
        ps = fa_group_sum<C::TPR>(ps);
        l = duet_fma(l, corr, ps);
        m = mn;
#pragma unroll
        for (int c = 0; c < C::CPT; ++c) o[c] = duet_fmul(o[c], corr);
        __syncthreads();  // the row's P is written by its TPR lanes
        IP::template accumulate<T, HS, C::BR, C::BC, C::TPR>(o, sp, sv);
    }
    if (qi < t) {
        const float inv_l = duet_fdiv(1.0f, l);
#pragma unroll
        for (int c = 0; c < C::CPT; ++c) o[c] = duet_fmul(o[c], inv_l);
        unsigned short* dst = reinterpret_cast<unsigned short*>(out) +
                              ((duet_u64)bb * t + qi) * nh * HS + (duet_u64)h * HS + j * C::CPT;
        fa_store<T, C::CPT>(dst, o);
        if (j == 0) lse[(duet_u64)bh * t + qi] = duet_fadd(m, duet_log_f32(l));
    }
}

// ------------------------------------------------------------------------------- backward dQ
// A block per BR queries: D_i = Σ dO·O for its rows (written to `d` for the dK/dV kernel), then
// over the key tiles up to the diagonal: S, P = exp(scale·S − lse), dP = dO·Vᵀ,
// dS = P ⊙ (dP − D), dQ += dS·K; finally dQ · scale.
template <typename T, int HS, typename IP>
DUET_DEV void fa_backward_dq(const T* __restrict__ qkv, const T* __restrict__ out,
                             const T* __restrict__ dout, const float* __restrict__ lse,
                             float* __restrict__ d, T* __restrict__ dqkv, int t, int nh,
                             float scale) {
    typedef FaCfg<T, HS> C;
    __shared__ unsigned sq[C::BR * C::W];
    __shared__ unsigned sdo[C::BR * C::W];
    __shared__ unsigned sk[C::BC * C::W];
    __shared__ unsigned sv[C::BC * C::W];
    __shared__ float sp[C::BR * C::PW];
    __shared__ float sdp[C::BR * C::PW];
    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int tiles = (t + C::BR - 1) / C::BR;
    const int q0 = (tiles - 1 - (int)blockIdx.y) * C::BR;
    const int r = threadIdx.x / C::TPR, j = threadIdx.x % C::TPR, qi = q0 + r;
    const unsigned short* base = reinterpret_cast<const unsigned short*>(qkv) +
                                 (duet_u64)bb * t * 3 * nh * HS + (duet_u64)h * HS;
    const duet_u64 stride = 3ull * nh * HS;
    const unsigned short* obase =
        reinterpret_cast<const unsigned short*>(out) + (duet_u64)bb * t * nh * HS + (duet_u64)h * HS;
    const unsigned short* dobase =
        reinterpret_cast<const unsigned short*>(dout) + (duet_u64)bb * t * nh * HS + (duet_u64)h * HS;
    fa_load<HS>(sq, base, stride, q0, C::BR, t);
    fa_load<HS>(sdo, dobase, (duet_u64)nh * HS, q0, C::BR, t);
    __syncthreads();
    // D for the row: each lane its CPT columns (dO from shared memory, O from memory), then the
    // row's lanes in the butterfly.
    float part = 0.0f;
    if (qi < t) {
        const unsigned* ow =
            reinterpret_cast<const unsigned*>(obase + (duet_u64)qi * nh * HS + j * C::CPT);
        const unsigned* dw = sdo + r * C::W + j * C::CPT / 2;
#pragma unroll
        for (int w = 0; w < C::CPT / 2; ++w) {
            const unsigned x = ow[w], y = dw[w];
            part = duet_fma(FaBits<T>::f(x & 0xffffu), FaBits<T>::f(y & 0xffffu), part);
            part = duet_fma(FaBits<T>::f(x >> 16), FaBits<T>::f(y >> 16), part);
        }
    }
    const float di = fa_group_sum<C::TPR>(part);
    const float li = qi < t ? lse[(duet_u64)bh * t + qi] : 0.0f;
    if (qi < t && j == 0) d[(duet_u64)bh * t + qi] = di;
    float dq[C::CPT];
#pragma unroll
    for (int c = 0; c < C::CPT; ++c) dq[c] = 0.0f;
    const int last = (min(q0 + C::BR, t) - 1) / C::BC;
    for (int kt = 0; kt <= last; ++kt) {
        const int k0 = kt * C::BC;
        __syncthreads();
        fa_load<HS>(sk, base + (duet_u64)nh * HS, stride, k0, C::BC, t);
        fa_load<HS>(sv, base + 2ull * nh * HS, stride, k0, C::BC, t);
        __syncthreads();
        IP::template scores<T, HS, C::BR, C::BC, C::TPR>(sp, sq, sk);
        IP::template scores<T, HS, C::BR, C::BC, C::TPR>(sdp, sdo, sv);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < C::KPT; ++u) {
            const int c = j + u * C::TPR;
            const float x = duet_fmul(sp[r * C::PW + c], scale);
            const float p =
                (k0 + c > qi || qi >= t) ? 0.0f : duet_exp_fma_f32(duet_fsub(x, li));
            sp[r * C::PW + c] = duet_fmul(p, duet_fsub(sdp[r * C::PW + c], di));
        }
        __syncthreads();
        IP::template accumulate<T, HS, C::BR, C::BC, C::TPR>(dq, sp, sk);
    }
    if (qi < t) {
#pragma unroll
        for (int c = 0; c < C::CPT; ++c) dq[c] = duet_fmul(dq[c], scale);
        unsigned short* dst = reinterpret_cast<unsigned short*>(dqkv) +
                              ((duet_u64)bb * t + qi) * 3 * nh * HS + (duet_u64)h * HS + j * C::CPT;
        fa_store<T, C::CPT>(dst, dq);
    }
}

// ---------------------------------------------------------------------------- backward dK, dV
// A block per BR keys, over the query tiles from the diagonal on: S (queries × own keys),
// P, dP = dO·Vᵀ, dS; dV += Pᵀ·dO, dK += dSᵀ·Q; finally dK · scale. Reads `d` written by _dq.
template <typename T, int HS, typename IP>
DUET_DEV void fa_backward_dkv(const T* __restrict__ qkv, const T* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ d,
                              T* __restrict__ dqkv, int t, int nh, float scale) {
    typedef FaCfg<T, HS> C;
    __shared__ unsigned sk[C::BR * C::W];
    __shared__ unsigned sv[C::BR * C::W];
    __shared__ unsigned sq[C::BC * C::W];
    __shared__ unsigned sdo[C::BC * C::W];
    __shared__ float sp[C::BR * C::PW];
    __shared__ float sds[C::BR * C::PW];
    __shared__ float sl[C::BC];
    __shared__ float sd[C::BC];
    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int k0 = (int)blockIdx.y * C::BR;  // the first key tiles have the most work
    const int r = threadIdx.x / C::TPR, j = threadIdx.x % C::TPR, ki = k0 + r;
    const unsigned short* base = reinterpret_cast<const unsigned short*>(qkv) +
                                 (duet_u64)bb * t * 3 * nh * HS + (duet_u64)h * HS;
    const duet_u64 stride = 3ull * nh * HS;
    const unsigned short* dobase =
        reinterpret_cast<const unsigned short*>(dout) + (duet_u64)bb * t * nh * HS + (duet_u64)h * HS;
    fa_load<HS>(sk, base + (duet_u64)nh * HS, stride, k0, C::BR, t);
    fa_load<HS>(sv, base + 2ull * nh * HS, stride, k0, C::BR, t);
    float dk[C::CPT], dv[C::CPT];
#pragma unroll
    for (int c = 0; c < C::CPT; ++c) dk[c] = dv[c] = 0.0f;
    const int last = (t - 1) / C::BC;
    for (int qt = k0 / C::BC; qt <= last; ++qt) {
        const int q0 = qt * C::BC;
        __syncthreads();
        fa_load<HS>(sq, base, stride, q0, C::BC, t);
        fa_load<HS>(sdo, dobase, (duet_u64)nh * HS, q0, C::BC, t);
        for (int i = threadIdx.x; i < C::BC; i += DUET_BLOCK) {
            const bool in = q0 + i < t;
            sl[i] = in ? lse[(duet_u64)bh * t + q0 + i] : 0.0f;
            sd[i] = in ? d[(duet_u64)bh * t + q0 + i] : 0.0f;
        }
        __syncthreads();
        IP::template scores<T, HS, C::BR, C::BC, C::TPR>(sp, sk, sq);
        IP::template scores<T, HS, C::BR, C::BC, C::TPR>(sds, sv, sdo);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < C::KPT; ++u) {
            const int i = j + u * C::TPR, qi = q0 + i;
            const float x = duet_fmul(sp[r * C::PW + i], scale);
            const float p =
                (qi < ki || qi >= t || ki >= t) ? 0.0f : duet_exp_fma_f32(duet_fsub(x, sl[i]));
            sp[r * C::PW + i] = p;
            sds[r * C::PW + i] = duet_fmul(p, duet_fsub(sds[r * C::PW + i], sd[i]));
        }
        __syncthreads();
        IP::template accumulate<T, HS, C::BR, C::BC, C::TPR>(dv, sp, sdo);
        IP::template accumulate<T, HS, C::BR, C::BC, C::TPR>(dk, sds, sq);
    }
    if (ki < t) {
#pragma unroll
        for (int c = 0; c < C::CPT; ++c) dk[c] = duet_fmul(dk[c], scale);
        unsigned short* dst = reinterpret_cast<unsigned short*>(dqkv) +
                              ((duet_u64)bb * t + ki) * 3 * nh * HS + (duet_u64)h * HS + j * C::CPT;
        fa_store<T, C::CPT>(dst + (duet_u64)nh * HS, dk);
        fa_store<T, C::CPT>(dst + 2ull * nh * HS, dv);
    }
}

#define FA_ENTRIES(PFX, IP, HS, N, T)                                                              \
    DUET_KERNEL PFX##forward_hs##HS##_##N(const T* __restrict__ qkv, T* __restrict__ out,           \
                                          float* __restrict__ lse, int t, int nh, float scale) {    \
        fa_forward<T, HS, IP>(qkv, out, lse, t, nh, scale);                                         \
    }                                                                                               \
    DUET_KERNEL PFX##backward_dq_hs##HS##_##N(                                                      \
        const T* __restrict__ qkv, const T* __restrict__ out, const T* __restrict__ dout,           \
        const float* __restrict__ lse, float* __restrict__ d, T* __restrict__ dqkv, int t, int nh,  \
        float scale) {                                                                              \
        fa_backward_dq<T, HS, IP>(qkv, out, dout, lse, d, dqkv, t, nh, scale);                      \
    }                                                                                               \
    DUET_KERNEL PFX##backward_dkv_hs##HS##_##N(                                                     \
        const T* __restrict__ qkv, const T* __restrict__ dout, const float* __restrict__ lse,       \
        const float* __restrict__ d, T* __restrict__ dqkv, int t, int nh, float scale) {            \
        fa_backward_dkv<T, HS, IP>(qkv, dout, lse, d, dqkv, t, nh, scale);                          \
    }

FA_ENTRIES(flash_attention_, FaPortable, 64, bf16, duet_bf16)
FA_ENTRIES(flash_attention_, FaPortable, 128, bf16, duet_bf16)
FA_ENTRIES(flash_attention_, FaPortable, 64, f16, duet_f16)
FA_ENTRIES(flash_attention_, FaPortable, 128, f16, duet_f16)

#if defined(FA_HAVE_MFMA) && DUET_WARP == 64
FA_ENTRIES(flash_attention_mfma_, FaMfma, 64, bf16, duet_bf16)
FA_ENTRIES(flash_attention_mfma_, FaMfma, 128, bf16, duet_bf16)
FA_ENTRIES(flash_attention_mfma_, FaMfma, 64, f16, duet_f16)
FA_ENTRIES(flash_attention_mfma_, FaMfma, 128, f16, duet_f16)
#endif
