// LayerNorm over the last dimension, forward and backward.
//
// Fast path (layernorm_fwd_* / layernorm_bwd_* + layernorm_dparams_finish_*): a row is held in
// registers by a "row group" of G warps (forward: G = 1..8, ⌊8 / G⌋ groups per block;
// backward: G = 1..4, ⌊4 / G⌋ groups per block). Thread t of a group owns the vectors t,
// t + 32G, ... of the row (M at most, M a compile-time bound), each of V consecutive elements:
// V = 16 bytes of the activation type when c is a multiple of that and the buffers are 16-byte
// aligned (one 128-bit access), else V = 1. G, M and V are chosen by the
// host (device/layernorm.rs, `plan`) from c and the dtypes, so every summation order is fixed by
// the shape:
//   * row statistics: each thread sums its elements in order, then warp_sum (xor tree), then the
//     group's G warp sums in warp order;
//   * backward: block b handles the fixed chunk of rows [b·rpc, (b+1)·rpc); group g of the block
//     handles the chunk's rows g, g + groups, ... in order, accumulates dx and keeps its
//     columns' dgamma/dbeta sums in registers; the groups' sums are added in group order and
//     written as one partial row per chunk;
//     layernorm_dparams_finish adds the chunks' partial rows in a fixed order and accumulates
//     into dgamma and dbeta.
//     layernorm_bwdsum_* (Device::layernorm_backward_colsum) also keep the column sums of the
//     updated dx as a third partial row per chunk (same order as dbeta's), and
//     layernorm_dparams_finish3 finishes all three.
// No floating-point atomics anywhere.
//
// Fallback (rows too wide for the fast path): the row kernels right below use one warp per row
// (8 rows per 256-thread block) reading global memory for every pass; dgamma/dbeta are computed
// in two passes (layernorm_dparams_partial here, colsum_finish in reduce.cu) with a partition
// fixed by the shape. Their roundings are explicit (the operations NVRTC's PTX had for the plain
// expressions, FMAs where it contracted), so kernels-hip/layernorm.hip, written the same way,
// gives the same bits.
#include "common.cuh"

template <typename A, typename P>
__device__ __forceinline__ void layernorm_forward_body(const A* __restrict__ x,
                                                       const P* __restrict__ gamma,
                                                       const P* __restrict__ beta,
                                                       A* __restrict__ out,
                                                       float* __restrict__ mean,
                                                       float* __restrict__ rstd, int n, int c,
                                                       float eps) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const A* xr = x + (u64)row * c;
    float s = 0.0f;
    for (int j = lane; j < c; j += 32) s = __fadd_rn(s, to_f32(xr[j]));
    const float mu = __fdiv_rn(warp_sum(s), (float)c);
    float v = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float d = __fsub_rn(to_f32(xr[j]), mu);
        v = __fmaf_rn(d, d, v);
    }
    const float var = __fdiv_rn(warp_sum(v), (float)c);
    const float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, eps)));
    A* o = out + (u64)row * c;
    for (int j = lane; j < c; j += 32)
        o[j] = from_f32<A>(__fmaf_rn(__fmul_rn(__fsub_rn(to_f32(xr[j]), mu), rs), to_f32(gamma[j]),
                                     to_f32(beta[j])));
    if (lane == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

#define LAYERNORM_FORWARD(A, SA, P, SP)                                                       \
    extern "C" __global__ void layernorm_forward_##SA##_##SP(                                 \
        const A* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,     \
        A* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int n, int c, \
        float eps) {                                                                          \
        layernorm_forward_body(x, gamma, beta, out, mean, rstd, n, c, eps);                   \
    }
FOR_ACT_AND_WIDE(LAYERNORM_FORWARD)

// dx += rstd · (dnorm − mean(dnorm) − x̂ · mean(dnorm · x̂)), dnorm = dout · γ. Warp per row.
template <typename A, typename P>
__device__ __forceinline__ void layernorm_backward_dx_body(const A* __restrict__ dout,
                                                           const A* __restrict__ x,
                                                           const P* __restrict__ gamma,
                                                           const float* __restrict__ mean,
                                                           const float* __restrict__ rstd,
                                                           A* __restrict__ dx, int n, int c) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const u64 base = (u64)row * c;
    const float mu = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float xh = __fmul_rn(__fsub_rn(to_f32(x[base + j]), mu), rs);
        const float dn = __fmul_rn(to_f32(dout[base + j]), to_f32(gamma[j]));
        s1 = __fadd_rn(s1, dn);
        s2 = __fmaf_rn(dn, xh, s2);
    }
    const float m1 = __fdiv_rn(warp_sum(s1), (float)c);
    const float m2 = __fdiv_rn(warp_sum(s2), (float)c);
    for (int j = lane; j < c; j += 32) {
        const float xh = __fmul_rn(__fsub_rn(to_f32(x[base + j]), mu), rs);
        const float dn = __fmul_rn(to_f32(dout[base + j]), to_f32(gamma[j]));
        const float t = __fsub_rn(__fsub_rn(dn, m1), __fmul_rn(xh, m2));
        dx[base + j] = from_f32<A>(__fmaf_rn(t, rs, to_f32(dx[base + j])));
    }
}

#define LAYERNORM_BACKWARD_DX(A, SA, P, SP)                                                   \
    extern "C" __global__ void layernorm_backward_dx_##SA##_##SP(                             \
        const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma,     \
        const float* __restrict__ mean, const float* __restrict__ rstd, A* __restrict__ dx,   \
        int n, int c) {                                                                       \
        layernorm_backward_dx_body(dout, x, gamma, mean, rstd, dx, n, c);                     \
    }
FOR_ACT_AND_WIDE(LAYERNORM_BACKWARD_DX)

// Block (32, 8) per (32-column tile, chunk of rows):
//   pg[chunk, col] = Σ dout · x̂,  pb[chunk, col] = Σ dout   over the chunk's rows.
template <typename A>
__device__ __forceinline__ void layernorm_dparams_partial_body(
    const A* __restrict__ dout, const A* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ rstd, float* __restrict__ pg, float* __restrict__ pb, int n, int c,
    int rows_per_chunk) {
    __shared__ float sg[8][33];
    __shared__ float sb[8][33];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(n, r0 + rows_per_chunk);
    float g = 0.0f, b = 0.0f;
    if (col < c) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            const u64 idx = (u64)r * c + col;
            const float d = to_f32(dout[idx]);
            g = __fmaf_rn(__fmul_rn(d, __fsub_rn(to_f32(x[idx]), mean[r])), rstd[r], g);
            b = __fadd_rn(b, d);
        }
    }
    sg[threadIdx.y][threadIdx.x] = g;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float tg = 0.0f, tb = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            tg = __fadd_rn(tg, sg[k][threadIdx.x]);
            tb = __fadd_rn(tb, sb[k][threadIdx.x]);
        }
        pg[(u64)blockIdx.y * c + col] = tg;
        pb[(u64)blockIdx.y * c + col] = tb;
    }
}

#define LAYERNORM_DPARAMS(A, SA)                                                              \
    extern "C" __global__ void layernorm_dparams_partial_##SA(                                \
        const A* __restrict__ dout, const A* __restrict__ x, const float* __restrict__ mean,  \
        const float* __restrict__ rstd, float* __restrict__ pg, float* __restrict__ pb, int n, \
        int c, int rows_per_chunk) {                                                          \
        layernorm_dparams_partial_body(dout, x, mean, rstd, pg, pb, n, c, rows_per_chunk);    \
    }
FOR_FLOAT(LAYERNORM_DPARAMS)

// ------------------------------------------------------------------ fast path

// Vec, load_vec, store_vec, group_sum and the forward row helpers (ln_load_row, ln_row_stats,
// ln_affine): common.cuh, shared with fp8.cu's fused LayerNorm + FP8 quantisation.

// out = (x − μ)·rstd·γ + β, one row per group of G warps, the row kept in registers. Without
// OUT only mean and rstd are written (gamma, beta and out unused): layernorm_stats_* below.
template <typename A, typename P, bool VEC, int M, bool OUT = true>
__device__ __forceinline__ void layernorm_fwd_body(const A* __restrict__ x,
                                                   const P* __restrict__ gamma,
                                                   const P* __restrict__ beta, A* __restrict__ out,
                                                   float* __restrict__ mean,
                                                   float* __restrict__ rstd, int n, int c,
                                                   float eps, int G) {
    constexpr int V = VEC ? Pack<A>::N : 1;
    __shared__ float sh[8];
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = threadIdx.x / gt, t = threadIdx.x - grp * gt;
    const int row = blockIdx.x * groups + grp;
    const bool live = row < n;
    const int nv = c / V;
    const u64 base = (u64)(live ? row : 0) * c;
    Vec<A, V> xr[M];
    ln_load_row<A, V, M>(xr, x + base, live, t, gt, nv);
    float mu, rs;
    ln_row_stats<A, V, M>(xr, live, t, gt, nv, c, eps, G, sh, mu, rs);
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (OUT && live && j < nv) {
            const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
            const Vec<P, V> b = load_vec<P, V>(beta + j * V);
            Vec<A, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e)
                o.v[e] = from_f32<A>(
                    ln_affine(to_f32(xr[k].v[e]), mu, rs, to_f32(g.v[e]), to_f32(b.v[e])));
            store_vec<A, V>(out + base + (u64)j * V, o);
        }
    }
    if (live && t == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// Backward for the chunk of rows [blockIdx.x·rpc, min(n, (blockIdx.x + 1)·rpc)):
//   dx += rstd · (dnorm − mean(dnorm) − x̂ · mean(dnorm · x̂)),  dnorm = dout · γ;
//   pg[chunk, :] = Σ dout · x̂,  pb[chunk, :] = Σ dout  over the chunk's rows (fixed order).
// Blocks of at most 128 threads (⌊4 / G⌋ row groups). Each thread keeps its columns' sums in
// registers and loads one row at a time (other warps hide the latency). The previous kernels
// kept the sums in shared-memory slots and prefetched the next row into registers; the same
// bits, but their load-add-store chains stalled the warps (ncu): 30.0 vs 26.5 µs at 8192 × 768
// and 61.2 vs 59.8 µs at 8192 × 2048 with the dx column sum, bf16 on the H200
// (results/2026-11-29-h200-layernorm-backward).
template <typename A, int V, int M> struct LnRow {
    Vec<A, V> x[M], d[M], g[M];  // x, dout, dx (before the update)
};

template <typename A, int V, int M>
__device__ __forceinline__ void ln_load_row(LnRow<A, V, M>& r, const A* __restrict__ x,
                                            const A* __restrict__ dout, const A* __restrict__ dx,
                                            u64 base, bool live, int t, int gt, int nv) {
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (live && j < nv) {
            r.x[k] = load_vec<A, V>(x + base + (u64)j * V);
            r.d[k] = load_vec<A, V>(dout + base + (u64)j * V);
            r.g[k] = load_vec<A, V>(dx + base + (u64)j * V);
        }
    }
}

// DSUM (the layernorm_bwdsum_* entry points): also ps[chunk, :] = Σ dx over the chunk's rows,
// of dx after the update as stored (rounded to A), in the same order as pb; a third set of
// sums. Without it the code is the plain backward's.
template <typename A, typename P, bool VEC, int M, bool DSUM>
__device__ __forceinline__ void layernorm_bwd_body(
    const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma,
    const float* __restrict__ mean, const float* __restrict__ rstd, A* __restrict__ dx,
    float* __restrict__ pg, float* __restrict__ pb, float* __restrict__ ps, int n, int c, int rpc,
    int G) {
    constexpr int V = VEC ? Pack<A>::N : 1;
    constexpr int E = M * V;  // elements per thread
    constexpr int B = 128;    // most threads per block (slot stride)
    constexpr int S = DSUM ? 3 : 2;  // sums per element
    __shared__ float sh[16];
    // acc[slot]: Σ dout · x̂; acc[E + slot]: Σ dout; acc[2E + slot]: Σ dx (DSUM only). After the
    // rows, sacc[i·B + thread] = acc[i] for the groups' sums below.
    __shared__ float sacc[S * E * B];
    float acc[S * E];
    const int tid = threadIdx.x;
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = tid / gt, t = tid - grp * gt;
    const int nv = c / V;
    const int r0 = blockIdx.x * rpc, r1 = min(n, r0 + rpc);
#pragma unroll
    for (int i = 0; i < S * E; ++i) acc[i] = 0.0f;
    const int iters = (rpc + groups - 1) / groups;
    LnRow<A, V, M> cur;
    for (int it = 0; it < iters; ++it) {
        const int row = r0 + it * groups + grp;
        const bool live = row < r1;
        const u64 base = (u64)(live ? row : 0) * c;
        ln_load_row(cur, x, dout, dx, base, live, t, gt, nv);
        const float mu = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
        float s[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float xh = (to_f32(cur.x[k].v[e]) - mu) * rs;
                    const float dn = to_f32(cur.d[k].v[e]) * to_f32(g.v[e]);
                    s[0] += dn;
                    s[1] += dn * xh;
                }
            }
        }
        group_sum<2>(s, sh, G);
        const float m1 = s[0] / (float)c, m2 = s[1] / (float)c;
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
                Vec<A, V> o;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float d = to_f32(cur.d[k].v[e]);
                    const float xh = (to_f32(cur.x[k].v[e]) - mu) * rs;
                    const float dn = d * to_f32(g.v[e]);
                    o.v[e] = from_f32<A>(to_f32(cur.g[k].v[e]) + (dn - m1 - xh * m2) * rs);
                    acc[k * V + e] = __fmaf_rn(d, xh, acc[k * V + e]);
                    acc[E + k * V + e] += d;
                    if constexpr (DSUM) acc[2 * E + k * V + e] += to_f32(o.v[e]);
                }
                store_vec<A, V>(dx + base + (u64)j * V, o);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < S * E; ++i) sacc[i * B + tid] = acc[i];
    // Group 0 adds the row groups' sums in group order and writes the chunk's partial rows.
    __syncthreads();
    if (grp == 0) {
        const u64 prow = (u64)blockIdx.x * c;
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (j < nv) {
                float ag[V], ab[V], ad[V];
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const int sg = (k * V + e) * B + t, sb = (E + k * V + e) * B + t;
                    float a = sacc[sg], b = sacc[sb];
                    for (int q = 1; q < groups; ++q) {
                        a += sacc[sg + q * gt];
                        b += sacc[sb + q * gt];
                    }
                    ag[e] = a;
                    ab[e] = b;
                    if constexpr (DSUM) {
                        const int ss = (2 * E + k * V + e) * B + t;
                        float u = sacc[ss];
                        for (int q = 1; q < groups; ++q) u += sacc[ss + q * gt];
                        ad[e] = u;
                    }
                }
                float* qg = pg + prow + (u64)j * V;
                float* qb = pb + prow + (u64)j * V;
                float* qs = DSUM ? ps + prow + (u64)j * V : nullptr;
                if constexpr (V % 4 == 0) {
#pragma unroll
                    for (int e = 0; e < V; e += 4) {
                        reinterpret_cast<float4*>(qg)[e / 4] =
                            make_float4(ag[e], ag[e + 1], ag[e + 2], ag[e + 3]);
                        reinterpret_cast<float4*>(qb)[e / 4] =
                            make_float4(ab[e], ab[e + 1], ab[e + 2], ab[e + 3]);
                        if constexpr (DSUM)
                            reinterpret_cast<float4*>(qs)[e / 4] =
                                make_float4(ad[e], ad[e + 1], ad[e + 2], ad[e + 3]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        qg[e] = ag[e];
                        qb[e] = ab[e];
                        if constexpr (DSUM) qs[e] = ad[e];
                    }
                }
            }
        }
    }
}

// Entry points: layernorm_fwd_<act>_<param>_<v|s><M> and layernorm_bwd_..., v = 16-byte
// vectors, s = single elements, M = vectors per thread (host: layernorm.rs, `plan`).
#define LN_FWD(A, SA, P, SP, VEC, VN, M)                                                      \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        layernorm_fwd_##SA##_##SP##_##VN##M(const A* __restrict__ x,                          \
                                            const P* __restrict__ gamma,                      \
                                            const P* __restrict__ beta, A* __restrict__ out,  \
                                            float* __restrict__ mean,                         \
                                            float* __restrict__ rstd, int n, int c,           \
                                            float eps, int G) {                               \
        layernorm_fwd_body<A, P, VEC, M>(x, gamma, beta, out, mean, rstd, n, c, eps, G);      \
    }
// layernorm_stats_<act>_v(x, mean, rstd, n, c, eps, G): the vectorised forward's row
// statistics only, for Device::layernorm_forward_fp8's split path (device/fp8.rs). M = 8, the
// most vectors any vectorised forward plan gives (LN_FWD_MAX_VECTORS in layernorm.rs); the
// loops skip the vectors past the row, so the sums are layernorm_fwd's for the plan's G.
#define LN_STATS(A, SA)                                                                       \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        layernorm_stats_##SA##_v(const A* __restrict__ x, float* __restrict__ mean,           \
                                 float* __restrict__ rstd, int n, int c, float eps, int G) {  \
        layernorm_fwd_body<A, A, true, 8, false>(x, nullptr, nullptr, nullptr, mean, rstd, n, \
                                                 c, eps, G);                                  \
    }
#define LN_BWD(A, SA, P, SP, VEC, VN, M)                                                      \
    extern "C" __global__ void __launch_bounds__(128, 4) layernorm_bwd_##SA##_##SP##_##VN##M( \
        const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma,     \
        const float* __restrict__ mean, const float* __restrict__ rstd, A* __restrict__ dx,   \
        float* __restrict__ pg, float* __restrict__ pb, int n, int c, int rpc, int G) {       \
        layernorm_bwd_body<A, P, VEC, M, false>(dout, x, gamma, mean, rstd, dx, pg, pb,       \
                                                nullptr, n, c, rpc, G);                       \
    }
// layernorm_bwdsum_*: the same, plus the third partial row ps (column sums of the new dx).
#define LN_BWDSUM(A, SA, P, SP, VEC, VN, M)                                                   \
    extern "C" __global__ void __launch_bounds__(128, 4)                                      \
        layernorm_bwdsum_##SA##_##SP##_##VN##M(                                               \
            const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma, \
            const float* __restrict__ mean, const float* __restrict__ rstd,                   \
            A* __restrict__ dx, float* __restrict__ pg, float* __restrict__ pb,               \
            float* __restrict__ ps, int n, int c, int rpc, int G) {                           \
        layernorm_bwd_body<A, P, VEC, M, true>(dout, x, gamma, mean, rstd, dx, pg, pb, ps, n, \
                                               c, rpc, G);                                    \
    }
#define LN_BOTH(A, SA, P, SP, VEC, VN, M)                                                     \
    LN_FWD(A, SA, P, SP, VEC, VN, M) LN_BWD(A, SA, P, SP, VEC, VN, M)
#define LN_ALL(A, SA, P, SP, VEC, VN, M)                                                      \
    LN_BOTH(A, SA, P, SP, VEC, VN, M) LN_BWDSUM(A, SA, P, SP, VEC, VN, M)
// M in {1, 2, 3, 4, 6, 8}; vectorised: at most 8 vectors per thread forward and 3 vectors
// (48 bytes of each of x, dout and dx) per thread backward. layernorm_bwdsum_* only for the
// vectorised plans (the rows of a model); with single elements the host composes the backward
// and a column sum (keeps NVRTC's compile time of this file down).
#define LN_SET(A, SA, P, SP)                                                                  \
    LN_BOTH(A, SA, P, SP, false, s, 1)                                                        \
    LN_BOTH(A, SA, P, SP, false, s, 2)                                                        \
    LN_BOTH(A, SA, P, SP, false, s, 3)                                                        \
    LN_BOTH(A, SA, P, SP, false, s, 4)                                                        \
    LN_BOTH(A, SA, P, SP, false, s, 6)                                                        \
    LN_ALL(A, SA, P, SP, true, v, 1)                                                          \
    LN_ALL(A, SA, P, SP, true, v, 2) LN_ALL(A, SA, P, SP, true, v, 3)                        \
    LN_FWD(A, SA, P, SP, true, v, 4) LN_FWD(A, SA, P, SP, true, v, 6)                          \
    LN_FWD(A, SA, P, SP, true, v, 8)
FOR_FLOAT(LN_STATS)
LN_SET(float, f32, float, f32)
LN_SET(bf16_t, bf16, bf16_t, bf16)
LN_SET(bf16_t, bf16, float, f32)
LN_SET(f16_t, f16, f16_t, f16)
LN_SET(f16_t, f16, float, f32)

// out[col] += Σ_k part[k·c + col] for the block's 32 columns.
// Block (32, 32): thread row y adds chunks y, y + 32, ... in order, then the 32 sums are added
// in y order.
template <typename G>
__device__ __forceinline__ void layernorm_finish_cols(const float* __restrict__ part,
                                                      G* __restrict__ out, int chunks, int c,
                                                      float (&sh)[32][33]) {
    const int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < c) {
        int k = threadIdx.y;
        // Four loads in flight per step; the additions stay in chunk order.
        for (; k + 96 < chunks; k += 128) {
            const float a0 = part[(u64)k * c + col];
            const float a1 = part[(u64)(k + 32) * c + col];
            const float a2 = part[(u64)(k + 64) * c + col];
            const float a3 = part[(u64)(k + 96) * c + col];
            s += a0;
            s += a1;
            s += a2;
            s += a3;
        }
        for (; k < chunks; k += 32) s += part[(u64)k * c + col];
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) t += sh[i][threadIdx.x];
        out[col] = from_f32<G>(to_f32(out[col]) + t);
    }
}

// dgamma[col] += Σ_k pg[k·c + col] and dbeta[col] += Σ_k pb[k·c + col] (blockIdx.y picks
// which). Grid (⌈c / 32⌉, 2).
#define LAYERNORM_FINISH(T, S)                                                                \
    extern "C" __global__ void layernorm_dparams_finish_##S(                                  \
        const float* __restrict__ pg, const float* __restrict__ pb, T* __restrict__ dgamma,   \
        T* __restrict__ dbeta, int chunks, int c) {                                           \
        __shared__ float sh[32][33];                                                          \
        layernorm_finish_cols<T>(blockIdx.y == 0 ? pg : pb, blockIdx.y == 0 ? dgamma : dbeta, \
                                 chunks, c, sh);                                              \
    }
FOR_FLOAT(LAYERNORM_FINISH)

// The same plus dsum[col] += Σ_k ps[k·c + col] (blockIdx.y == 2; dsum of its own float type).
// Grid (⌈c / 32⌉, 3); dgamma and dbeta get exactly layernorm_dparams_finish's arithmetic.
#define LAYERNORM_FINISH3(T, S, U, SU)                                                        \
    extern "C" __global__ void layernorm_dparams_finish3_##S##_##SU(                          \
        const float* __restrict__ pg, const float* __restrict__ pb,                           \
        const float* __restrict__ ps, T* __restrict__ dgamma, T* __restrict__ dbeta,          \
        U* __restrict__ dsum, int chunks, int c) {                                            \
        __shared__ float sh[32][33];                                                          \
        if (blockIdx.y == 2)                                                                  \
            layernorm_finish_cols<U>(ps, dsum, chunks, c, sh);                                \
        else                                                                                  \
            layernorm_finish_cols<T>(blockIdx.y == 0 ? pg : pb,                               \
                                     blockIdx.y == 0 ? dgamma : dbeta, chunks, c, sh);        \
    }
FOR_FLOAT_PAIRS(LAYERNORM_FINISH3)
