// Fused causal self-attention (flash-attention style), forward and backward.
//
// Layouts (see duet_device::Device::flash_attention_forward): `qkv` is b × t × 3 × nh × HS
// (row-major), `out`/`dout` b × t × nh·HS, `lse` (f32) b × nh × t, `dqkv` like `qkv`.
// Tensor cores through inline PTX (mma.sync m16n8k16, ldmatrix, cp.async: sm_80 and newer);
// softmax and every accumulation in f32. Every sum has a fixed order and no float atomics are
// used, so results are bit-identical run to run.
//
// Grids: x = b·nh (one head per block column), y = tile index, ordered so the tiles with the
// most work start first. Blocks are 128 threads (4 warps); each warp owns 16 rows of the block's
// tile. Shared memory is dynamic (sizes in crates/cuda/src/device/flash.rs); tiles are stored
// with 16-byte chunks XOR-swizzled by row so ldmatrix reads are free of bank conflicts.
//
// Entry points (T = bf16 | f16, HS = 64 | 128):
//   flash_attention_forward_hsHS_T(const T* qkv, T* out, float* lse, int t, int nh, float scale)
//   flash_attention_rowdot_hsHS_T(const T* out, const T* dout, float* d, u64 rows, int t, int nh)
//   flash_attention_backward_dkv_hsHS_T(const T* qkv, const T* dout, const float* lse,
//                                       const float* d, T* dqkv, int t, int nh, float scale)
//   flash_attention_backward_dq_hsHS_T(same parameters as _dkv)
#include "common.cuh"

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

typedef unsigned int u32;

#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

// ------------------------------------------------------------------ PTX helpers

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}
// 16 bytes global → shared; `bytes` = 0 writes zeros (rows past the end).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

__device__ __forceinline__ void ldsm4(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm4t(u32* r, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The tensor-core product D += A·B (16×16 · 16×8, f32 accumulation) and the packing of two f32
// values into the A operand's pair type, per storage type.
template <typename T> struct Mma;
template <> struct Mma<bf16_t> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // lo → bits 0..15, hi → bits 16..31 (round to nearest even).
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct Mma<f16_t> {
    static __device__ __forceinline__ void run(float* d, const u32* a, u32 b0, u32 b1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

// ------------------------------------------------------------------ shared-memory tiles

// Element offset of 8-element chunk `c` of row `r` in a swizzled tile with HS columns.
template <int HS> __device__ __forceinline__ int swz(int r, int c) {
    return r * HS + ((c ^ (r & 7)) << 3);
}

// Queues the copy of a ROWS × HS tile (global rows `stride` elements apart) into `s`; rows at
// or past `valid` (≥ 1) are zero-filled.
template <typename T, int HS, int ROWS>
__device__ __forceinline__ void load_tile(T* s, const T* g, i64 stride, int valid) {
    const int CPR = HS / 8;
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CPR; i += FA_THREADS) {
        const int r = i / CPR, c = i % CPR;
        const bool ok = r < valid;
        const T* src = g + (ok ? (i64)r * stride : 0) + c * 8;
        cp_async16(smem_u32(s + swz<HS>(r, c)), src, ok ? 16 : 0);
    }
}

// A operand (16 rows × 16 columns, k-chunk kc) from rows r0.. of a row-major tile.
template <int HS>
__device__ __forceinline__ void ld_a(u32* a, const void* s, int r0, int kc, int lane) {
    const int r = r0 + (lane & 15), c = 2 * kc + (lane >> 4);
    ldsm4(a, smem_u32((const unsigned short*)s + swz<HS>(r, c)));
}
// B operands of two n-blocks (rows n0..n0+15 of a tile stored n-major, i.e. B = tileᵀ) for
// k-chunk kc: b[0], b[1] for rows n0..n0+7, b[2], b[3] for rows n0+8..n0+15.
template <int HS>
__device__ __forceinline__ void ld_bt(u32* b, const void* s, int n0, int kc, int lane) {
    const int r = n0 + (lane & 7) + ((lane >> 4) << 3), c = 2 * kc + ((lane >> 3) & 1);
    ldsm4(b, smem_u32((const unsigned short*)s + swz<HS>(r, c)));
}
// B operands of two n-blocks (columns 8·nb.. 8·nb+15) for k-chunk kc of a tile stored k-major
// (B = tile): b[0], b[1] for n-block nb, b[2], b[3] for nb+1.
template <int HS>
__device__ __forceinline__ void ld_b(u32* b, const void* s, int kc, int nb, int lane) {
    const int r = 16 * kc + (lane & 7) + (((lane >> 3) & 1) << 3), c = nb + (lane >> 4);
    ldsm4t(b, smem_u32((const unsigned short*)s + swz<HS>(r, c)));
}

// Writes a warp's 16 × HS accumulator (times `mul`) into its rows r0.. of tile `s`, then copies
// those rows to global memory (row r0 + i at g + i·stride) for the rows before `valid`.
template <typename T, int HS>
__device__ __forceinline__ void store_rows(T* s, const float (*acc)[4], float mul, int r0,
                                           T* g, i64 stride, int valid, int lane) {
    const int gr = lane >> 2, tg = lane & 3;
#pragma unroll
    for (int nb = 0; nb < HS / 8; ++nb) {
        *(u32*)(s + swz<HS>(r0 + gr, nb) + 2 * tg) =
            Mma<T>::pack(acc[nb][0] * mul, acc[nb][1] * mul);
        *(u32*)(s + swz<HS>(r0 + gr + 8, nb) + 2 * tg) =
            Mma<T>::pack(acc[nb][2] * mul, acc[nb][3] * mul);
    }
    __syncwarp();
    const int CPR = HS / 8;
#pragma unroll
    for (int i = lane; i < 16 * CPR; i += 32) {
        const int r = i / CPR, c = i % CPR;
        if (r < valid) {
            *(uint4*)(g + (i64)r * stride + c * 8) = *(const uint4*)(s + swz<HS>(r0 + r, c));
        }
    }
}

// ------------------------------------------------------------------ forward

// One block: 64 queries of one head; loops over the key tiles up to the diagonal, with the next
// K/V tile loading (cp.async, two stages) while the current one is used.
template <typename T, int HS>
__device__ __forceinline__ void fa_forward(const T* __restrict__ qkv, T* __restrict__ out,
                                           float* __restrict__ lse, int t, int nh,
                                           float scale) {
    constexpr int BQ = 64, BK = 64;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sQ = (T*)fa_smem;
    T* sK = sQ + BQ * HS;       // [2][BK × HS]
    T* sV = sK + 2 * BK * HS;   // [2][BK × HS]

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const float sl2 = scale * FA_LOG2E;

    load_tile<T, HS, BQ>(sQ, gq + q0 * rs, rs, min(BQ, t - q0));
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, HS, BK>(sV, gv, rs, min(BK, t));
    cp_commit();

    float o[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8
    const int nkt = qt + 1;               // BQ == BK: key tiles 0..qt

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1;
        if (kt + 1 < nkt) {
            const int k1 = (kt + 1) * BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, HS, BK>(sV + (st ^ 1) * BK * HS, gv + k1 * rs, rs, min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        const T* cK = sK + st * BK * HS;
        const T* cV = sV + st * BK * HS;

        float s[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
            u32 a[4];
            ld_a<HS>(a, sQ, warp * 16, kc, lane);
#pragma unroll
            for (int nb = 0; nb < BK / 8; nb += 2) {
                u32 b[4];
                ld_bt<HS>(b, cK, nb * 8, kc, lane);
                Mma<T>::run(s[nb], a, b[0], b[1]);
                Mma<T>::run(s[nb + 1], a, b[2], b[3]);
            }
        }
        const bool diag = kt == qt;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = s[nb][e] * sl2;
                if (diag) {
                    const int col = kt * BK + nb * 8 + 2 * tg + (e & 1);
                    if (col > row0 + 8 * (e >> 1)) v = NEG_INF;
                }
                s[nb][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            // Key 0 is in tile 0 and never masked, so mx is finite from the first tile on.
            alpha[r] = fa_exp2(m[r] - mx[r]);
            m[r] = mx[r];
            l[r] *= alpha[r];
        }
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = fa_exp2(s[nb][e] - m[e >> 1]);
                s[nb][e] = p;
                l[e >> 1] += p;
            }
        }
#pragma unroll
        for (int nb = 0; nb < HS / 8; ++nb) {
            o[nb][0] *= alpha[0];
            o[nb][1] *= alpha[0];
            o[nb][2] *= alpha[1];
            o[nb][3] *= alpha[1];
        }
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            u32 a[4];
            a[0] = Mma<T>::pack(s[2 * kc][0], s[2 * kc][1]);
            a[1] = Mma<T>::pack(s[2 * kc][2], s[2 * kc][3]);
            a[2] = Mma<T>::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            a[3] = Mma<T>::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int nb = 0; nb < HS / 8; nb += 2) {
                u32 b[4];
                ld_b<HS>(b, cV, kc, nb, lane);
                Mma<T>::run(o[nb], a, b[0], b[1]);
                Mma<T>::run(o[nb + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = 1.0f / l[r];
        const int row = row0 + 8 * r;
        if (tg == 0 && row < t) lse[(i64)bh * t + row] = (m[r] + log2f(l[r])) * FA_LN2;
    }
#pragma unroll
    for (int nb = 0; nb < HS / 8; ++nb) {
        o[nb][0] *= inv[0];
        o[nb][1] *= inv[0];
        o[nb][2] *= inv[1];
        o[nb][3] *= inv[1];
    }
    // The warp's own Q rows are free now (each warp reads only its rows of sQ).
    const i64 os = (i64)nh * HS;
    store_rows<T, HS>(sQ, o, 1.0f, warp * 16, out + ((i64)bb * t + q0 + warp * 16) * os + h * HS,
                      os, t - q0 - warp * 16, lane);
}

// ------------------------------------------------------------------ backward

// d[b, h, i] = Σ_c dout[b, i, h, c] · out[b, i, h, c] (f32), HS/8 threads per row.
template <typename T, int HS>
__device__ __forceinline__ void fa_rowdot(const T* __restrict__ out, const T* __restrict__ dout,
                                          float* __restrict__ d, u64 rows, int t, int nh) {
    constexpr int G = HS / 8;
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 row = gid / G;
    const int sub = (int)(gid % G);
    float acc = 0.0f;
    if (row < rows) {
        const Pack<T> a = load_pack(out + row * HS + sub * 8);
        const Pack<T> b = load_pack(dout + row * HS + sub * 8);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(a.v[i]), to_f32(b.v[i]), acc);
    }
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (row < rows && sub == 0) {
        const u64 bt = row / nh, h = row % nh, bb = bt / t, i = bt % t;
        d[(bb * nh + h) * t + i] = acc;
    }
}

// dK, dV for 64 keys of one head: loops over the query tiles from the diagonal to the end,
// recomputing Pᵀ = exp(scale·K·Qᵀ − lse) tile by tile. BQ = 64 (HS = 64) or 32 (HS = 128).
// With DS (version 3) it also stores dSᵀ = (P ∘ (dP − D))ᵀ, rounded to T exactly as it enters
// dK's product, into `ds`: per head a tp × tp matrix (tp = t rounded up to 64), row = key,
// column = query; every query tile from the diagonal on is written (zeros where masked and for
// queries ≥ t), key rows ≥ t are not. fa_backward_dq3 reads it back.
template <typename T, int HS, bool DS = false>
__device__ __forceinline__ void fa_backward_dkv(const T* __restrict__ qkv,
                                                const T* __restrict__ dout,
                                                const float* __restrict__ lse,
                                                const float* __restrict__ dd,
                                                T* __restrict__ dqkv, int t, int nh,
                                                float scale, T* __restrict__ ds = nullptr,
                                                int tp = 0) {
    constexpr int BK = 64, BQ = HS == 64 ? 64 : 32;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sK = (T*)fa_smem;
    T* sV = sK + BK * HS;
    T* sQ = sV + BK * HS;       // [2][BQ × HS]
    T* sO = sQ + 2 * BQ * HS;   // [2][BQ × HS] (dout)
    float* sL = (float*)(sO + 2 * BQ * HS);  // [2][BQ] lse
    float* sD = sL + 2 * BQ;                 // [2][BQ] d

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int kt = blockIdx.y, k0 = kt * BK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS, os = (i64)nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const T* go = dout + (i64)bb * t * os + (i64)h * HS;
    const float* gl = lse + (i64)bh * t;
    const float* gd = dd + (i64)bh * t;
    const float sl2 = scale * FA_LOG2E;

    const int qt0 = k0 / BQ, nqt = (t + BQ - 1) / BQ;
    auto load_q = [&](int qi, int st) {
        const int qs = qi * BQ, valid = min(BQ, t - qs);
        load_tile<T, HS, BQ>(sQ + st * BQ * HS, gq + qs * rs, rs, valid);
        load_tile<T, HS, BQ>(sO + st * BQ * HS, go + qs * os, os, valid);
        const int i = threadIdx.x;
        if (i < 2 * BQ) {
            const int r = i % BQ;
            const bool ok = r < valid;
            const float* src = (i < BQ ? gl : gd) + qs + (ok ? r : 0);
            cp_async4(smem_u32((i < BQ ? sL : sD) + st * BQ + r), src, ok ? 4 : 0);
        }
    };
    load_tile<T, HS, BK>(sK, gk + k0 * rs, rs, min(BK, t - k0));
    load_tile<T, HS, BK>(sV, gv + k0 * rs, rs, min(BK, t - k0));
    load_q(qt0, 0);
    cp_commit();

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    const int key0 = k0 + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

    for (int qi = qt0; qi < nqt; ++qi) {
        const int st = (qi - qt0) & 1, qs = qi * BQ;
        if (qi + 1 < nqt) load_q(qi + 1, st ^ 1);
        cp_commit();
        cp_wait1();
        __syncthreads();
        const T* cQ = sQ + st * BQ * HS;
        const T* cO = sO + st * BQ * HS;
        const float* cL = sL + st * BQ;
        const float* cD = sD + st * BQ;

        // Sᵀ = K·Qᵀ (16 keys × BQ queries per warp) and dPᵀ = V·dOᵀ.
        float p[BQ / 8][4], dp[BQ / 8][4];
#pragma unroll
        for (int i = 0; i < BQ / 8; ++i) {
            p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
            dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        }
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
            u32 a[4], av[4];
            ld_a<HS>(a, sK, warp * 16, kc, lane);
            ld_a<HS>(av, sV, warp * 16, kc, lane);
#pragma unroll
            for (int nb = 0; nb < BQ / 8; nb += 2) {
                u32 b[4];
                ld_bt<HS>(b, cQ, nb * 8, kc, lane);
                Mma<T>::run(p[nb], a, b[0], b[1]);
                Mma<T>::run(p[nb + 1], a, b[2], b[3]);
                ld_bt<HS>(b, cO, nb * 8, kc, lane);
                Mma<T>::run(dp[nb], av, b[0], b[1]);
                Mma<T>::run(dp[nb + 1], av, b[2], b[3]);
            }
        }
        const bool mask = qs < k0 + BK || qs + BQ > t;
#pragma unroll
        for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = nb * 8 + 2 * tg + (e & 1);
                float pv = fa_exp2(fmaf(p[nb][e], sl2, -cL[c] * FA_LOG2E));
                if (mask) {
                    const int q = qs + c, key = key0 + 8 * (e >> 1);
                    if (q < key || q >= t) pv = 0.0f;
                }
                p[nb][e] = pv;
                dp[nb][e] = pv * (dp[nb][e] - cD[c]);
            }
        }
        if constexpr (DS) {
            // dSᵀ rows key0, key0 + 8 (before t), columns qs + 8·nb + 2·tg (+1), as packed
            // for the product below.
            T* drow = ds + ((i64)bh * tp + key0) * tp + qs + 2 * tg;
#pragma unroll
            for (int nb = 0; nb < BQ / 8; ++nb) {
                if (key0 < t)
                    *(u32*)(drow + nb * 8) = Mma<T>::pack(dp[nb][0], dp[nb][1]);
                if (key0 + 8 < t)
                    *(u32*)(drow + 8 * (i64)tp + nb * 8) = Mma<T>::pack(dp[nb][2], dp[nb][3]);
            }
        }
        // dV += Pᵀ·dO, dK += dSᵀ·Q (scale applied at the end).
#pragma unroll
        for (int kc = 0; kc < BQ / 16; ++kc) {
            u32 a[4], ad[4];
            a[0] = Mma<T>::pack(p[2 * kc][0], p[2 * kc][1]);
            a[1] = Mma<T>::pack(p[2 * kc][2], p[2 * kc][3]);
            a[2] = Mma<T>::pack(p[2 * kc + 1][0], p[2 * kc + 1][1]);
            a[3] = Mma<T>::pack(p[2 * kc + 1][2], p[2 * kc + 1][3]);
            ad[0] = Mma<T>::pack(dp[2 * kc][0], dp[2 * kc][1]);
            ad[1] = Mma<T>::pack(dp[2 * kc][2], dp[2 * kc][3]);
            ad[2] = Mma<T>::pack(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
            ad[3] = Mma<T>::pack(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
#pragma unroll
            for (int nb = 0; nb < HS / 8; nb += 2) {
                u32 b[4];
                ld_b<HS>(b, cO, kc, nb, lane);
                Mma<T>::run(dv[nb], a, b[0], b[1]);
                Mma<T>::run(dv[nb + 1], a, b[2], b[3]);
                ld_b<HS>(b, cQ, kc, nb, lane);
                Mma<T>::run(dk[nb], ad, b[0], b[1]);
                Mma<T>::run(dk[nb + 1], ad, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    // Each warp reads only its own rows of sK and sV: reuse them to stage the results.
    const int r0 = warp * 16, valid = t - k0 - r0;
    T* gdk = dqkv + ((i64)bb * t + k0 + r0) * rs + (i64)(nh + h) * HS;
    store_rows<T, HS>(sK, dk, scale, r0, gdk, rs, valid, lane);
    store_rows<T, HS>(sV, dv, 1.0f, r0, gdk + (i64)nh * HS, rs, valid, lane);
}

// dQ for 64 queries of one head: loops over the key tiles up to the diagonal.
// BK = 64 (HS = 64) or 32 (HS = 128).
template <typename T, int HS>
__device__ __forceinline__ void fa_backward_dq(const T* __restrict__ qkv,
                                               const T* __restrict__ dout,
                                               const float* __restrict__ lse,
                                               const float* __restrict__ dd,
                                               T* __restrict__ dqkv, int t, int nh,
                                               float scale) {
    constexpr int BQ = 64, BK = HS == 64 ? 64 : 32;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sQ = (T*)fa_smem;
    T* sO = sQ + BQ * HS;
    T* sK = sO + BQ * HS;       // [2][BK × HS]
    T* sV = sK + 2 * BK * HS;   // [2][BK × HS]

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS, os = (i64)nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const T* go = dout + (i64)bb * t * os + (i64)h * HS;
    const float sl2 = scale * FA_LOG2E;

    const int qvalid = min(BQ, t - q0);
    load_tile<T, HS, BQ>(sQ, gq + q0 * rs, rs, qvalid);
    load_tile<T, HS, BQ>(sO, go + q0 * os, os, qvalid);
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, HS, BK>(sV, gv, rs, min(BK, t));
    cp_commit();

    const int row0 = q0 + warp * 16 + g;
    float l2[2], drow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        l2[r] = row < t ? lse[(i64)bh * t + row] * FA_LOG2E : 0.0f;
        drow[r] = row < t ? dd[(i64)bh * t + row] : 0.0f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    const int kend = min(t, q0 + BQ), nkt = (kend + BK - 1) / BK;

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1, k0 = kt * BK;
        if (kt + 1 < nkt) {
            const int k1 = k0 + BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, HS, BK>(sV + (st ^ 1) * BK * HS, gv + k1 * rs, rs, min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        const T* cK = sK + st * BK * HS;
        const T* cV = sV + st * BK * HS;

        // S = Q·Kᵀ and dP = dO·Vᵀ (16 queries × BK keys per warp).
        float p[BK / 8][4], dp[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; ++i) {
            p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
            dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        }
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
            u32 a[4], ao[4];
            ld_a<HS>(a, sQ, warp * 16, kc, lane);
            ld_a<HS>(ao, sO, warp * 16, kc, lane);
#pragma unroll
            for (int nb = 0; nb < BK / 8; nb += 2) {
                u32 b[4];
                ld_bt<HS>(b, cK, nb * 8, kc, lane);
                Mma<T>::run(p[nb], a, b[0], b[1]);
                Mma<T>::run(p[nb + 1], a, b[2], b[3]);
                ld_bt<HS>(b, cV, nb * 8, kc, lane);
                Mma<T>::run(dp[nb], ao, b[0], b[1]);
                Mma<T>::run(dp[nb + 1], ao, b[2], b[3]);
            }
        }
        const bool mask = k0 + BK - 1 > q0;
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float pv = fa_exp2(fmaf(p[nb][e], sl2, -l2[e >> 1]));
                if (mask) {
                    const int key = k0 + nb * 8 + 2 * tg + (e & 1);
                    if (key > row0 + 8 * (e >> 1)) pv = 0.0f;
                }
                dp[nb][e] = pv * (dp[nb][e] - drow[e >> 1]);
            }
        }
        // dQ += dS·K (scale applied at the end).
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            u32 a[4];
            a[0] = Mma<T>::pack(dp[2 * kc][0], dp[2 * kc][1]);
            a[1] = Mma<T>::pack(dp[2 * kc][2], dp[2 * kc][3]);
            a[2] = Mma<T>::pack(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
            a[3] = Mma<T>::pack(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
#pragma unroll
            for (int nb = 0; nb < HS / 8; nb += 2) {
                u32 b[4];
                ld_b<HS>(b, cK, kc, nb, lane);
                Mma<T>::run(dq[nb], a, b[0], b[1]);
                Mma<T>::run(dq[nb + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    const int r0 = warp * 16;
    store_rows<T, HS>(sQ, dq, scale, r0, dqkv + ((i64)bb * t + q0 + r0) * rs + (i64)h * HS, rs,
                      t - q0 - r0, lane);
}

// ------------------------------------------------------------------ entry points

#define FA_ENTRIES(T, S, HS, MB_FWD, MB_DKV, MB_DQ)                                           \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_FWD)                          \
        flash_attention_forward_hs##HS##_##S(const T* qkv, T* out, float* lse, int t, int nh, \
                                             float scale) {                                   \
        fa_forward<T, HS>(qkv, out, lse, t, nh, scale);                                       \
    }                                                                                          \
    extern "C" __global__ void flash_attention_rowdot_hs##HS##_##S(                           \
        const T* out, const T* dout, float* d, u64 rows, int t, int nh) {                     \
        fa_rowdot<T, HS>(out, dout, d, rows, t, nh);                                          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DKV)                          \
        flash_attention_backward_dkv_hs##HS##_##S(const T* qkv, const T* dout,                \
                                                  const float* lse, const float* d, T* dqkv,  \
                                                  int t, int nh, float scale) {               \
        fa_backward_dkv<T, HS>(qkv, dout, lse, d, dqkv, t, nh, scale);                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DQ)                           \
        flash_attention_backward_dq_hs##HS##_##S(const T* qkv, const T* dout,                 \
                                                 const float* lse, const float* d, T* dqkv,   \
                                                 int t, int nh, float scale) {                \
        fa_backward_dq<T, HS>(qkv, dout, lse, d, dqkv, t, nh, scale);                         \
    }

// Minimum resident blocks per SM (forward, dK/dV, dQ): caps the registers so that many blocks
// fit (a few bytes of spill at most); the shared memory of each kernel allows as many.
FA_ENTRIES(bf16_t, bf16, 64, 4, 3, 3)
FA_ENTRIES(bf16_t, bf16, 128, 2, 2, 3)
FA_ENTRIES(f16_t, f16, 64, 4, 3, 3)
FA_ENTRIES(f16_t, f16, 128, 2, 2, 3)

// ------------------------------------------------------------------ version 2

// Forward, version 2: one block per 128 queries of one head, each warp owning 32 rows (two
// 16-row mma tiles), so every K/V fragment read from shared memory feeds two mma instead of one
// (version 1 is bound by ldmatrix traffic). Key tiles of BK rows (64 for HS = 64, 32 for
// HS = 128), double-buffered with cp.async; a warp skips the key tiles that lie entirely past
// its last row. Same arithmetic per row as version 1 (same order of the per-tile sums).
template <typename T, int HS, int BK>
__device__ __forceinline__ void fa_forward2(const T* __restrict__ qkv, T* __restrict__ out,
                                            float* __restrict__ lse, int t, int nh,
                                            float scale) {
    constexpr int BQ = 128;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sQ = (T*)fa_smem;
    T* sK = sQ + BQ * HS;       // [2][BK × HS]
    T* sV = sK + 2 * BK * HS;   // [2][BK × HS]

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const float sl2 = scale * FA_LOG2E;

    load_tile<T, HS, BQ>(sQ, gq + q0 * rs, rs, min(BQ, t - q0));
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, HS, BK>(sV, gv, rs, min(BK, t));
    cp_commit();

    float o[2][HS / 8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int i = 0; i < HS / 8; ++i) o[mi][i][0] = o[mi][i][1] = o[mi][i][2] = o[mi][i][3] = 0.0f;
    float m[2][2] = {{NEG_INF, NEG_INF}, {NEG_INF, NEG_INF}};
    float l[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    const int wr0 = warp * 32;              // the warp's first row in the tile
    const int row0 = q0 + wr0 + g;          // this thread's rows: row0 + 16·mi + 8·r
    const int wlast = q0 + wr0 + 31;        // the warp's last row
    const int nkt = min((q0 + BQ) / BK, (t + BK - 1) / BK);

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1, k0 = kt * BK;
        if (kt + 1 < nkt) {
            const int k1 = k0 + BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, HS, BK>(sV + (st ^ 1) * BK * HS, gv + k1 * rs, rs, min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        // Key tile 0 is never skipped (key 0 is visible to every row), so m is finite after it.
        if (k0 <= wlast) {
            const T* cK = sK + st * BK * HS;
            const T* cV = sV + st * BK * HS;

            float s[2][BK / 8][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int i = 0; i < BK / 8; ++i)
                    s[mi][i][0] = s[mi][i][1] = s[mi][i][2] = s[mi][i][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < HS / 16; ++kc) {
                u32 a0[4], a1[4];
                ld_a<HS>(a0, sQ, wr0, kc, lane);
                ld_a<HS>(a1, sQ, wr0 + 16, kc, lane);
#pragma unroll
                for (int nb = 0; nb < BK / 8; nb += 2) {
                    u32 b[4];
                    ld_bt<HS>(b, cK, nb * 8, kc, lane);
                    Mma<T>::run(s[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(s[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(s[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(s[1][nb + 1], a1, b[2], b[3]);
                }
            }
            const bool diag = k0 + BK - 1 > q0 + wr0;
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                float mx[2] = {m[mi][0], m[mi][1]};
#pragma unroll
                for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float v = s[mi][nb][e] * sl2;
                        if (diag) {
                            const int col = k0 + nb * 8 + 2 * tg + (e & 1);
                            if (col > row0 + 16 * mi + 8 * (e >> 1)) v = NEG_INF;
                        }
                        s[mi][nb][e] = v;
                        mx[e >> 1] = fmaxf(mx[e >> 1], v);
                    }
                }
                float alpha[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                    alpha[r] = fa_exp2(m[mi][r] - mx[r]);
                    m[mi][r] = mx[r];
                    l[mi][r] *= alpha[r];
                }
#pragma unroll
                for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float p = fa_exp2(s[mi][nb][e] - m[mi][e >> 1]);
                        s[mi][nb][e] = p;
                        l[mi][e >> 1] += p;
                    }
                }
#pragma unroll
                for (int nb = 0; nb < HS / 8; ++nb) {
                    o[mi][nb][0] *= alpha[0];
                    o[mi][nb][1] *= alpha[0];
                    o[mi][nb][2] *= alpha[1];
                    o[mi][nb][3] *= alpha[1];
                }
            }
#pragma unroll
            for (int kc = 0; kc < BK / 16; ++kc) {
                u32 a0[4], a1[4];
                a0[0] = Mma<T>::pack(s[0][2 * kc][0], s[0][2 * kc][1]);
                a0[1] = Mma<T>::pack(s[0][2 * kc][2], s[0][2 * kc][3]);
                a0[2] = Mma<T>::pack(s[0][2 * kc + 1][0], s[0][2 * kc + 1][1]);
                a0[3] = Mma<T>::pack(s[0][2 * kc + 1][2], s[0][2 * kc + 1][3]);
                a1[0] = Mma<T>::pack(s[1][2 * kc][0], s[1][2 * kc][1]);
                a1[1] = Mma<T>::pack(s[1][2 * kc][2], s[1][2 * kc][3]);
                a1[2] = Mma<T>::pack(s[1][2 * kc + 1][0], s[1][2 * kc + 1][1]);
                a1[3] = Mma<T>::pack(s[1][2 * kc + 1][2], s[1][2 * kc + 1][3]);
#pragma unroll
                for (int nb = 0; nb < HS / 8; nb += 2) {
                    u32 b[4];
                    ld_b<HS>(b, cV, kc, nb, lane);
                    Mma<T>::run(o[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(o[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(o[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(o[1][nb + 1], a1, b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }

    const i64 os = (i64)nh * HS;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
        float inv[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[mi][r] += __shfl_xor_sync(0xffffffffu, l[mi][r], 1);
            l[mi][r] += __shfl_xor_sync(0xffffffffu, l[mi][r], 2);
            inv[r] = 1.0f / l[mi][r];
            const int row = row0 + 16 * mi + 8 * r;
            if (tg == 0 && row < t) lse[(i64)bh * t + row] = (m[mi][r] + log2f(l[mi][r])) * FA_LN2;
        }
#pragma unroll
        for (int nb = 0; nb < HS / 8; ++nb) {
            o[mi][nb][0] *= inv[0];
            o[mi][nb][1] *= inv[0];
            o[mi][nb][2] *= inv[1];
            o[mi][nb][3] *= inv[1];
        }
        // The warp's own Q rows are free now (each warp reads only its rows of sQ).
        const int r0 = wr0 + 16 * mi;
        store_rows<T, HS>(sQ, o[mi], 1.0f, r0, out + ((i64)bb * t + q0 + r0) * os + h * HS, os,
                          t - q0 - r0, lane);
    }
}

// dQ, version 2: fa_backward_dq with the row dot products D = rowsum(dO∘O) computed in the
// prologue (the separate rowdot launch of version 1 is gone) and written to `dd` for the dK/dV
// kernel, which therefore runs after this one. Each warp computes D for its own 16 rows: two
// lanes per row, each summing half of the row in order, then one exchange (fixed order).
template <typename T, int HS>
__device__ __forceinline__ void fa_backward_dq2(const T* __restrict__ qkv,
                                                const T* __restrict__ out,
                                                const T* __restrict__ dout,
                                                const float* __restrict__ lse,
                                                float* __restrict__ dd,
                                                T* __restrict__ dqkv, int t, int nh,
                                                float scale) {
    constexpr int BQ = 64, BK = HS == 64 ? 64 : 32;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sQ = (T*)fa_smem;
    T* sO = sQ + BQ * HS;
    T* sK = sO + BQ * HS;       // [2][BK × HS]
    T* sV = sK + 2 * BK * HS;   // [2][BK × HS]

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS, os = (i64)nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const T* go = dout + (i64)bb * t * os + (i64)h * HS;
    const float sl2 = scale * FA_LOG2E;

    const int qvalid = min(BQ, t - q0);
    load_tile<T, HS, BQ>(sQ, gq + q0 * rs, rs, qvalid);
    load_tile<T, HS, BQ>(sO, go + q0 * os, os, qvalid);
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, HS, BK>(sV, gv, rs, min(BK, t));
    cp_commit();

    const int row0 = q0 + warp * 16 + g;
    float l2[2], drow[2];
    {
        const int j = lane >> 1, half = lane & 1, row = q0 + warp * 16 + j;
        float acc = 0.0f;
        if (row < t) {
            const i64 off = ((i64)bb * t + row) * os + (i64)h * HS + half * (HS / 2);
#pragma unroll
            for (int c = 0; c < HS / 16; ++c) {
                const Pack<T> a = load_pack(out + off + c * 8);
                const Pack<T> b = load_pack(dout + off + c * 8);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(a.v[i]), to_f32(b.v[i]), acc);
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (half == 0 && row < t) dd[(i64)bh * t + row] = acc;
        drow[0] = __shfl_sync(0xffffffffu, acc, 2 * g);
        drow[1] = __shfl_sync(0xffffffffu, acc, 2 * g + 16);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        l2[r] = row < t ? lse[(i64)bh * t + row] * FA_LOG2E : 0.0f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    const int kend = min(t, q0 + BQ), nkt = (kend + BK - 1) / BK;

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1, k0 = kt * BK;
        if (kt + 1 < nkt) {
            const int k1 = k0 + BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, HS, BK>(sV + (st ^ 1) * BK * HS, gv + k1 * rs, rs, min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        const T* cK = sK + st * BK * HS;
        const T* cV = sV + st * BK * HS;

        // S = Q·Kᵀ and dP = dO·Vᵀ (16 queries × BK keys per warp).
        float p[BK / 8][4], dp[BK / 8][4];
#pragma unroll
        for (int i = 0; i < BK / 8; ++i) {
            p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0.0f;
            dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.0f;
        }
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
            u32 a[4], ao[4];
            ld_a<HS>(a, sQ, warp * 16, kc, lane);
            ld_a<HS>(ao, sO, warp * 16, kc, lane);
#pragma unroll
            for (int nb = 0; nb < BK / 8; nb += 2) {
                u32 b[4];
                ld_bt<HS>(b, cK, nb * 8, kc, lane);
                Mma<T>::run(p[nb], a, b[0], b[1]);
                Mma<T>::run(p[nb + 1], a, b[2], b[3]);
                ld_bt<HS>(b, cV, nb * 8, kc, lane);
                Mma<T>::run(dp[nb], ao, b[0], b[1]);
                Mma<T>::run(dp[nb + 1], ao, b[2], b[3]);
            }
        }
        const bool mask = k0 + BK - 1 > q0;
#pragma unroll
        for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float pv = fa_exp2(fmaf(p[nb][e], sl2, -l2[e >> 1]));
                if (mask) {
                    const int key = k0 + nb * 8 + 2 * tg + (e & 1);
                    if (key > row0 + 8 * (e >> 1)) pv = 0.0f;
                }
                dp[nb][e] = pv * (dp[nb][e] - drow[e >> 1]);
            }
        }
        // dQ += dS·K (scale applied at the end).
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            u32 a[4];
            a[0] = Mma<T>::pack(dp[2 * kc][0], dp[2 * kc][1]);
            a[1] = Mma<T>::pack(dp[2 * kc][2], dp[2 * kc][3]);
            a[2] = Mma<T>::pack(dp[2 * kc + 1][0], dp[2 * kc + 1][1]);
            a[3] = Mma<T>::pack(dp[2 * kc + 1][2], dp[2 * kc + 1][3]);
#pragma unroll
            for (int nb = 0; nb < HS / 8; nb += 2) {
                u32 b[4];
                ld_b<HS>(b, cK, kc, nb, lane);
                Mma<T>::run(dq[nb], a, b[0], b[1]);
                Mma<T>::run(dq[nb + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    const int r0 = warp * 16;
    store_rows<T, HS>(sQ, dq, scale, r0, dqkv + ((i64)bb * t + q0 + r0) * rs + (i64)h * HS, rs,
                      t - q0 - r0, lane);
}

// Version 2 entry points (HS, key tile of the forward, min blocks per SM of forward and dQ).
//   flash_attention_forward2_hsHS_T(const T* qkv, T* out, float* lse, int t, int nh,
//                                   float scale)                      (128-query tiles)
//   flash_attention_backward_dq2_hsHS_T(const T* qkv, const T* out, const T* dout,
//                                       const float* lse, float* d, T* dqkv, int t, int nh,
//                                       float scale)       (writes d; run before _dkv)
#define FA_ENTRIES2(T, S, HS, BK, MB_FWD, MB_DQ)                                               \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_FWD)                          \
        flash_attention_forward2_hs##HS##_##S(const T* qkv, T* out, float* lse, int t,       \
                                              int nh, float scale) {                          \
        fa_forward2<T, HS, BK>(qkv, out, lse, t, nh, scale);                                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DQ)                           \
        flash_attention_backward_dq2_hs##HS##_##S(const T* qkv, const T* out, const T* dout,  \
                                                  const float* lse, float* d, T* dqkv, int t, \
                                                  int nh, float scale) {                      \
        fa_backward_dq2<T, HS>(qkv, out, dout, lse, d, dqkv, t, nh, scale);                   \
    }

FA_ENTRIES2(bf16_t, bf16, 64, 64, 2, 3)
FA_ENTRIES2(bf16_t, bf16, 128, 32, 2, 3)
FA_ENTRIES2(f16_t, f16, 64, 64, 2, 3)
FA_ENTRIES2(f16_t, f16, 128, 32, 2, 3)

// ------------------------------------------------------------------ version 3 backward
//
// Version 3 runs rowdot (D), then dK/dV with dSᵀ stored (fa_backward_dkv<DS = true>), then
// this dQ kernel, which only multiplies: dQ = scale · dS·K over the key tiles up to the
// diagonal, reading dS from the stored dSᵀ (no recomputation of S, P and dP: 1 product of the
// 3 of fa_backward_dq). One block per 64 queries of one head; each warp owns 16 query rows.
// Key tiles of BK = 64 rows: K (BK × HS) and the dSᵀ tile (BK keys × 64 queries), both
// double-buffered with cp.async. The A operand dS (queries × keys) comes from the dSᵀ tile
// through ldmatrix.trans.

// A operand (16 rows × 16 columns) of the transpose of a tile stored k-major (64 columns):
// rows r0.. of A are columns of the tile, k-chunk kc its rows 16·kc...
__device__ __forceinline__ void ld_at64(u32* a, const void* s, int r0, int kc, int lane) {
    const int r = 16 * kc + (lane & 7) + ((lane >> 4) << 3), c = r0 / 8 + ((lane >> 3) & 1);
    ldsm4t(a, smem_u32((const unsigned short*)s + swz<64>(r, c)));
}

template <typename T, int HS>
__device__ __forceinline__ void fa_backward_dq3(const T* __restrict__ qkv,
                                                const T* __restrict__ ds,
                                                T* __restrict__ dqkv, int t, int nh, int tp,
                                                float scale) {
    constexpr int BQ = 64, BK = 64;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sK = (T*)fa_smem;       // [2][BK × HS]
    T* sS = sK + 2 * BK * HS;  // [2][BK × BQ] (dSᵀ: keys × queries)

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 rs = 3ll * nh * HS;
    const T* gk = qkv + (i64)bb * t * rs + (i64)(nh + h) * HS;
    const T* gs = ds + (i64)bh * tp * tp + q0;  // column q0 of key row 0

    const int kend = min(t, q0 + BQ), nkt = (kend + BK - 1) / BK;
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, BQ, BK>(sS, gs, tp, min(BK, t));
    cp_commit();

    float dq[HS / 8][4];
#pragma unroll
    for (int i = 0; i < HS / 8; ++i) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1;
        if (kt + 1 < nkt) {
            const int k1 = (kt + 1) * BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, BQ, BK>(sS + (st ^ 1) * BK * BQ, gs + (i64)k1 * tp, tp,
                                 min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        const T* cK = sK + st * BK * HS;
        const T* cS = sS + st * BK * BQ;
#pragma unroll
        for (int kc = 0; kc < BK / 16; ++kc) {
            u32 a[4];
            ld_at64(a, cS, warp * 16, kc, lane);
#pragma unroll
            for (int nb = 0; nb < HS / 8; nb += 2) {
                u32 b[4];
                ld_b<HS>(b, cK, kc, nb, lane);
                Mma<T>::run(dq[nb], a, b[0], b[1]);
                Mma<T>::run(dq[nb + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }

    // sK's first stage is free now: stage the rows for the store.
    const int r0 = warp * 16;
    store_rows<T, HS>(sK, dq, scale, r0, dqkv + ((i64)bb * t + q0 + r0) * rs + (i64)h * HS, rs,
                      t - q0 - r0, lane);
}

// Version 3 entry points:
//   flash_attention_backward_dkv3_hsHS_T(const T* qkv, const T* dout, const float* lse,
//                                        const float* d, T* dqkv, int t, int nh, float scale,
//                                        T* ds, int tp)          (after rowdot; writes dSᵀ)
//   flash_attention_backward_dq3_hsHS_T(const T* qkv, const T* ds, T* dqkv, int t, int nh,
//                                       int tp, float scale)     (after dkv3)
#define FA_ENTRIES3(T, S, HS, MB_DKV, MB_DQ)                                                   \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DKV)                          \
        flash_attention_backward_dkv3_hs##HS##_##S(const T* qkv, const T* dout,               \
                                                   const float* lse, const float* d,          \
                                                   T* dqkv, int t, int nh, float scale,       \
                                                   T* ds, int tp) {                           \
        fa_backward_dkv<T, HS, true>(qkv, dout, lse, d, dqkv, t, nh, scale, ds, tp);           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DQ)                           \
        flash_attention_backward_dq3_hs##HS##_##S(const T* qkv, const T* ds, T* dqkv, int t,  \
                                                  int nh, int tp, float scale) {              \
        fa_backward_dq3<T, HS>(qkv, ds, dqkv, t, nh, tp, scale);                              \
    }

FA_ENTRIES3(bf16_t, bf16, 64, 3, 4)
FA_ENTRIES3(bf16_t, bf16, 128, 2, 3)
FA_ENTRIES3(f16_t, f16, 64, 3, 4)
FA_ENTRIES3(f16_t, f16, 128, 2, 3)

// ------------------------------------------------------------------ version 4 backward
//
// Version 2's backward with each warp owning 32 rows (two 16-row mma tiles) instead of 16, so
// every fragment of the other side read from shared memory (Q and dO in the dK/dV kernel, K
// and V in the dQ kernel) feeds two tensor-core products instead of one: version 2's backward
// is bound by ldmatrix traffic, as version 1's forward was. Blocks of 128 keys (dK/dV) or 128
// queries (dQ); the other side in tiles of 32 rows, double-buffered with cp.async. The
// accumulators of 32 rows fit the registers for HS = 64 only.
//
// Every element takes the same products in the same order as in version 2 (the sums run over
// the same 16-row chunks one after another; a warp only skips the tiles that lie wholly on the
// masked side of the diagonal, which add exact zeros in version 2), and D is summed as
// fa_backward_dq2 sums it: the results are version 2's.

// dQ for 128 queries of one head (each warp 32), writing D for fa_backward_dkv4 first, as
// fa_backward_dq2 does: loops over key tiles of 32 up to the diagonal.
template <typename T, int HS>
__device__ __forceinline__ void fa_backward_dq4(const T* __restrict__ qkv,
                                                const T* __restrict__ out,
                                                const T* __restrict__ dout,
                                                const float* __restrict__ lse,
                                                float* __restrict__ dd,
                                                T* __restrict__ dqkv, int t, int nh,
                                                float scale) {
    constexpr int BQ = 128, BK = 32;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sQ = (T*)fa_smem;
    T* sO = sQ + BQ * HS;
    T* sK = sO + BQ * HS;       // [2][BK × HS]
    T* sV = sK + 2 * BK * HS;   // [2][BK × HS]

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int qt = gridDim.y - 1 - blockIdx.y, q0 = qt * BQ;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS, os = (i64)nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const T* go = dout + (i64)bb * t * os + (i64)h * HS;
    const float sl2 = scale * FA_LOG2E;

    const int qvalid = min(BQ, t - q0);
    load_tile<T, HS, BQ>(sQ, gq + q0 * rs, rs, qvalid);
    load_tile<T, HS, BQ>(sO, go + q0 * os, os, qvalid);
    load_tile<T, HS, BK>(sK, gk, rs, min(BK, t));
    load_tile<T, HS, BK>(sV, gv, rs, min(BK, t));
    cp_commit();

    const int wr0 = warp * 32;          // the warp's first row in the tile
    const int row0 = q0 + wr0 + g;      // this thread's rows: row0 + 16·mi + 8·r
    const int wlast = q0 + wr0 + 31;    // the warp's last row
    float l2[2][2], drow[2][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
        // D of the warp's rows 16·mi.. as fa_backward_dq2 sums it: two lanes per row, each
        // half of the row in order, then one exchange.
        const int j = lane >> 1, half = lane & 1, row = q0 + wr0 + 16 * mi + j;
        float acc = 0.0f;
        if (row < t) {
            const i64 off = ((i64)bb * t + row) * os + (i64)h * HS + half * (HS / 2);
#pragma unroll
            for (int c = 0; c < HS / 16; ++c) {
                const Pack<T> a = load_pack(out + off + c * 8);
                const Pack<T> b = load_pack(dout + off + c * 8);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc = fmaf(to_f32(a.v[i]), to_f32(b.v[i]), acc);
            }
        }
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (half == 0 && row < t) dd[(i64)bh * t + row] = acc;
        drow[mi][0] = __shfl_sync(0xffffffffu, acc, 2 * g);
        drow[mi][1] = __shfl_sync(0xffffffffu, acc, 2 * g + 16);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int rr = row0 + 16 * mi + 8 * r;
            l2[mi][r] = rr < t ? lse[(i64)bh * t + rr] * FA_LOG2E : 0.0f;
        }
    }
    float dq[2][HS / 8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int i = 0; i < HS / 8; ++i)
            dq[mi][i][0] = dq[mi][i][1] = dq[mi][i][2] = dq[mi][i][3] = 0.0f;
    const int kend = min(t, q0 + BQ), nkt = (kend + BK - 1) / BK;

    for (int kt = 0; kt < nkt; ++kt) {
        const int st = kt & 1, k0 = kt * BK;
        if (kt + 1 < nkt) {
            const int k1 = k0 + BK;
            load_tile<T, HS, BK>(sK + (st ^ 1) * BK * HS, gk + k1 * rs, rs, min(BK, t - k1));
            load_tile<T, HS, BK>(sV + (st ^ 1) * BK * HS, gv + k1 * rs, rs, min(BK, t - k1));
        }
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (k0 <= wlast) {
            const T* cK = sK + st * BK * HS;
            const T* cV = sV + st * BK * HS;

            // S = Q·Kᵀ and dP = dO·Vᵀ (32 queries × BK keys per warp).
            float p[2][BK / 8][4], dp[2][BK / 8][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int i = 0; i < BK / 8; ++i) {
                    p[mi][i][0] = p[mi][i][1] = p[mi][i][2] = p[mi][i][3] = 0.0f;
                    dp[mi][i][0] = dp[mi][i][1] = dp[mi][i][2] = dp[mi][i][3] = 0.0f;
                }
#pragma unroll
            for (int kc = 0; kc < HS / 16; ++kc) {
                u32 a0[4], a1[4], o0[4], o1[4];
                ld_a<HS>(a0, sQ, wr0, kc, lane);
                ld_a<HS>(a1, sQ, wr0 + 16, kc, lane);
                ld_a<HS>(o0, sO, wr0, kc, lane);
                ld_a<HS>(o1, sO, wr0 + 16, kc, lane);
#pragma unroll
                for (int nb = 0; nb < BK / 8; nb += 2) {
                    u32 b[4];
                    ld_bt<HS>(b, cK, nb * 8, kc, lane);
                    Mma<T>::run(p[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(p[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(p[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(p[1][nb + 1], a1, b[2], b[3]);
                    ld_bt<HS>(b, cV, nb * 8, kc, lane);
                    Mma<T>::run(dp[0][nb], o0, b[0], b[1]);
                    Mma<T>::run(dp[0][nb + 1], o0, b[2], b[3]);
                    Mma<T>::run(dp[1][nb], o1, b[0], b[1]);
                    Mma<T>::run(dp[1][nb + 1], o1, b[2], b[3]);
                }
            }
            const bool mask = k0 + BK - 1 > q0 + wr0;
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int nb = 0; nb < BK / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float pv = fa_exp2(fmaf(p[mi][nb][e], sl2, -l2[mi][e >> 1]));
                        if (mask) {
                            const int key = k0 + nb * 8 + 2 * tg + (e & 1);
                            if (key > row0 + 16 * mi + 8 * (e >> 1)) pv = 0.0f;
                        }
                        dp[mi][nb][e] = pv * (dp[mi][nb][e] - drow[mi][e >> 1]);
                    }
                }
            // dQ += dS·K (scale applied at the end).
#pragma unroll
            for (int kc = 0; kc < BK / 16; ++kc) {
                u32 a0[4], a1[4];
                a0[0] = Mma<T>::pack(dp[0][2 * kc][0], dp[0][2 * kc][1]);
                a0[1] = Mma<T>::pack(dp[0][2 * kc][2], dp[0][2 * kc][3]);
                a0[2] = Mma<T>::pack(dp[0][2 * kc + 1][0], dp[0][2 * kc + 1][1]);
                a0[3] = Mma<T>::pack(dp[0][2 * kc + 1][2], dp[0][2 * kc + 1][3]);
                a1[0] = Mma<T>::pack(dp[1][2 * kc][0], dp[1][2 * kc][1]);
                a1[1] = Mma<T>::pack(dp[1][2 * kc][2], dp[1][2 * kc][3]);
                a1[2] = Mma<T>::pack(dp[1][2 * kc + 1][0], dp[1][2 * kc + 1][1]);
                a1[3] = Mma<T>::pack(dp[1][2 * kc + 1][2], dp[1][2 * kc + 1][3]);
#pragma unroll
                for (int nb = 0; nb < HS / 8; nb += 2) {
                    u32 b[4];
                    ld_b<HS>(b, cK, kc, nb, lane);
                    Mma<T>::run(dq[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(dq[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(dq[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(dq[1][nb + 1], a1, b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }

    // The warp's own Q rows are free now (each warp reads only its rows of sQ).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
        const int r0 = wr0 + 16 * mi;
        store_rows<T, HS>(sQ, dq[mi], scale, r0,
                          dqkv + ((i64)bb * t + q0 + r0) * rs + (i64)h * HS, rs, t - q0 - r0,
                          lane);
    }
}

// dK, dV for 128 keys of one head (each warp 32): loops over query tiles of 32 from the block's
// first key to the end, recomputing Pᵀ = exp(scale·K·Qᵀ − lse); a warp skips the tiles before
// its first key.
template <typename T, int HS>
__device__ __forceinline__ void fa_backward_dkv4(const T* __restrict__ qkv,
                                                 const T* __restrict__ dout,
                                                 const float* __restrict__ lse,
                                                 const float* __restrict__ dd,
                                                 T* __restrict__ dqkv, int t, int nh,
                                                 float scale) {
    constexpr int BK = 128, BQ = 32;
    extern __shared__ __align__(128) unsigned char fa_smem[];
    T* sK = (T*)fa_smem;
    T* sV = sK + BK * HS;
    T* sQ = sV + BK * HS;       // [2][BQ × HS]
    T* sO = sQ + 2 * BQ * HS;   // [2][BQ × HS] (dout)
    float* sL = (float*)(sO + 2 * BQ * HS);  // [2][BQ] lse
    float* sD = sL + 2 * BQ;                 // [2][BQ] d

    const int bh = blockIdx.x, bb = bh / nh, h = bh % nh;
    const int kt = blockIdx.y, k0 = kt * BK;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const i64 rs = 3ll * nh * HS, os = (i64)nh * HS;
    const T* gq = qkv + (i64)bb * t * rs + (i64)h * HS;
    const T* gk = gq + (i64)nh * HS;
    const T* gv = gk + (i64)nh * HS;
    const T* go = dout + (i64)bb * t * os + (i64)h * HS;
    const float* gl = lse + (i64)bh * t;
    const float* gd = dd + (i64)bh * t;
    const float sl2 = scale * FA_LOG2E;

    const int qt0 = k0 / BQ, nqt = (t + BQ - 1) / BQ;
    auto load_q = [&](int qi, int st) {
        const int qs = qi * BQ, valid = min(BQ, t - qs);
        load_tile<T, HS, BQ>(sQ + st * BQ * HS, gq + qs * rs, rs, valid);
        load_tile<T, HS, BQ>(sO + st * BQ * HS, go + qs * os, os, valid);
        const int i = threadIdx.x;
        if (i < 2 * BQ) {
            const int r = i % BQ;
            const bool ok = r < valid;
            const float* src = (i < BQ ? gl : gd) + qs + (ok ? r : 0);
            cp_async4(smem_u32((i < BQ ? sL : sD) + st * BQ + r), src, ok ? 4 : 0);
        }
    };
    load_tile<T, HS, BK>(sK, gk + k0 * rs, rs, min(BK, t - k0));
    load_tile<T, HS, BK>(sV, gv + k0 * rs, rs, min(BK, t - k0));
    load_q(qt0, 0);
    cp_commit();

    float dk[2][HS / 8][4], dv[2][HS / 8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int i = 0; i < HS / 8; ++i) {
            dk[mi][i][0] = dk[mi][i][1] = dk[mi][i][2] = dk[mi][i][3] = 0.0f;
            dv[mi][i][0] = dv[mi][i][1] = dv[mi][i][2] = dv[mi][i][3] = 0.0f;
        }
    const int wr0 = warp * 32;            // the warp's first row (key) in the tile
    const int wfirst = k0 + wr0;          // the warp's first key
    const int key0 = wfirst + g;          // this thread's keys: key0 + 16·mi + 8·r

    for (int qi = qt0; qi < nqt; ++qi) {
        const int st = (qi - qt0) & 1, qs = qi * BQ;
        if (qi + 1 < nqt) load_q(qi + 1, st ^ 1);
        cp_commit();
        cp_wait1();
        __syncthreads();
        if (qs + BQ > wfirst) {
            const T* cQ = sQ + st * BQ * HS;
            const T* cO = sO + st * BQ * HS;
            const float* cL = sL + st * BQ;
            const float* cD = sD + st * BQ;

            // Sᵀ = K·Qᵀ (32 keys × BQ queries per warp) and dPᵀ = V·dOᵀ.
            float p[2][BQ / 8][4], dp[2][BQ / 8][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int i = 0; i < BQ / 8; ++i) {
                    p[mi][i][0] = p[mi][i][1] = p[mi][i][2] = p[mi][i][3] = 0.0f;
                    dp[mi][i][0] = dp[mi][i][1] = dp[mi][i][2] = dp[mi][i][3] = 0.0f;
                }
#pragma unroll
            for (int kc = 0; kc < HS / 16; ++kc) {
                u32 a0[4], a1[4], v0[4], v1[4];
                ld_a<HS>(a0, sK, wr0, kc, lane);
                ld_a<HS>(a1, sK, wr0 + 16, kc, lane);
                ld_a<HS>(v0, sV, wr0, kc, lane);
                ld_a<HS>(v1, sV, wr0 + 16, kc, lane);
#pragma unroll
                for (int nb = 0; nb < BQ / 8; nb += 2) {
                    u32 b[4];
                    ld_bt<HS>(b, cQ, nb * 8, kc, lane);
                    Mma<T>::run(p[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(p[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(p[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(p[1][nb + 1], a1, b[2], b[3]);
                    ld_bt<HS>(b, cO, nb * 8, kc, lane);
                    Mma<T>::run(dp[0][nb], v0, b[0], b[1]);
                    Mma<T>::run(dp[0][nb + 1], v0, b[2], b[3]);
                    Mma<T>::run(dp[1][nb], v1, b[0], b[1]);
                    Mma<T>::run(dp[1][nb + 1], v1, b[2], b[3]);
                }
            }
            const bool mask = qs < wfirst + 32 || qs + BQ > t;
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int nb = 0; nb < BQ / 8; ++nb) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int c = nb * 8 + 2 * tg + (e & 1);
                        float pv = fa_exp2(fmaf(p[mi][nb][e], sl2, -cL[c] * FA_LOG2E));
                        if (mask) {
                            const int q = qs + c, key = key0 + 16 * mi + 8 * (e >> 1);
                            if (q < key || q >= t) pv = 0.0f;
                        }
                        p[mi][nb][e] = pv;
                        dp[mi][nb][e] = pv * (dp[mi][nb][e] - cD[c]);
                    }
                }
            // dV += Pᵀ·dO, dK += dSᵀ·Q (scale applied at the end).
#pragma unroll
            for (int kc = 0; kc < BQ / 16; ++kc) {
                u32 a0[4], a1[4], d0[4], d1[4];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    u32* a = mi ? a1 : a0;
                    u32* ad = mi ? d1 : d0;
                    a[0] = Mma<T>::pack(p[mi][2 * kc][0], p[mi][2 * kc][1]);
                    a[1] = Mma<T>::pack(p[mi][2 * kc][2], p[mi][2 * kc][3]);
                    a[2] = Mma<T>::pack(p[mi][2 * kc + 1][0], p[mi][2 * kc + 1][1]);
                    a[3] = Mma<T>::pack(p[mi][2 * kc + 1][2], p[mi][2 * kc + 1][3]);
                    ad[0] = Mma<T>::pack(dp[mi][2 * kc][0], dp[mi][2 * kc][1]);
                    ad[1] = Mma<T>::pack(dp[mi][2 * kc][2], dp[mi][2 * kc][3]);
                    ad[2] = Mma<T>::pack(dp[mi][2 * kc + 1][0], dp[mi][2 * kc + 1][1]);
                    ad[3] = Mma<T>::pack(dp[mi][2 * kc + 1][2], dp[mi][2 * kc + 1][3]);
                }
#pragma unroll
                for (int nb = 0; nb < HS / 8; nb += 2) {
                    u32 b[4];
                    ld_b<HS>(b, cO, kc, nb, lane);
                    Mma<T>::run(dv[0][nb], a0, b[0], b[1]);
                    Mma<T>::run(dv[0][nb + 1], a0, b[2], b[3]);
                    Mma<T>::run(dv[1][nb], a1, b[0], b[1]);
                    Mma<T>::run(dv[1][nb + 1], a1, b[2], b[3]);
                    ld_b<HS>(b, cQ, kc, nb, lane);
                    Mma<T>::run(dk[0][nb], d0, b[0], b[1]);
                    Mma<T>::run(dk[0][nb + 1], d0, b[2], b[3]);
                    Mma<T>::run(dk[1][nb], d1, b[0], b[1]);
                    Mma<T>::run(dk[1][nb + 1], d1, b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }

    // Each warp reads only its own rows of sK and sV: reuse them to stage the results.
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
        const int r0 = wr0 + 16 * mi, valid = t - k0 - r0;
        T* gdk = dqkv + ((i64)bb * t + k0 + r0) * rs + (i64)(nh + h) * HS;
        store_rows<T, HS>(sK, dk[mi], scale, r0, gdk, rs, valid, lane);
        store_rows<T, HS>(sV, dv[mi], 1.0f, r0, gdk + (i64)nh * HS, rs, valid, lane);
    }
}

// Version 4 entry points (HS = 64):
//   flash_attention_backward_dq4_hs64_T(const T* qkv, const T* out, const T* dout,
//                                       const float* lse, float* d, T* dqkv, int t, int nh,
//                                       float scale)       (128-query tiles; writes d)
//   flash_attention_backward_dkv4_hs64_T(const T* qkv, const T* dout, const float* lse,
//                                        const float* d, T* dqkv, int t, int nh, float scale)
//                                                          (128-key tiles; after _dq4)
#define FA_ENTRIES4(T, S, HS, MB_DQ, MB_DKV)                                                   \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DQ)                           \
        flash_attention_backward_dq4_hs##HS##_##S(const T* qkv, const T* out, const T* dout,  \
                                                  const float* lse, float* d, T* dqkv, int t, \
                                                  int nh, float scale) {                      \
        fa_backward_dq4<T, HS>(qkv, out, dout, lse, d, dqkv, t, nh, scale);                   \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(FA_THREADS, MB_DKV)                          \
        flash_attention_backward_dkv4_hs##HS##_##S(const T* qkv, const T* dout,               \
                                                   const float* lse, const float* d,          \
                                                   T* dqkv, int t, int nh, float scale) {     \
        fa_backward_dkv4<T, HS>(qkv, dout, lse, d, dqkv, t, nh, scale);                       \
    }

FA_ENTRIES4(bf16_t, bf16, 64, 2, 2)
FA_ENTRIES4(f16_t, f16, 64, 2, 2)

#endif  // __CUDA_ARCH__ >= 800
