// LayerNorm over the last dimension, forward and backward: kernels-cuda/layernorm.cu's row
// kernels (layernorm_forward_*, layernorm_backward_dx_*, layernorm_dparams_partial_*; CUDA runs
// them for rows too wide for its fast path), with the same partition, reduction order and
// explicit roundings, so the same bits. One 32-lane group per row, 8 rows per block (grid
// ceil(n / 8), block DUET_BLOCK); the parameter gradients are column sums in two deterministic
// passes (pass 2 is reduce.hip's colsum_finish). Entry names and arguments match kernels-cuda.
#include "duet_hip.h"

// out = (x - mean) * rstd * gamma + beta; saves mean, rstd (f32).
#define DUET_LN_FWD(N, T, PN, P)                                                                 \
    DUET_KERNEL layernorm_forward_##N##_##PN(const T* __restrict__ x, const P* __restrict__ gamma, \
                                             const P* __restrict__ beta, T* __restrict__ out,      \
                                             float* __restrict__ mean, float* __restrict__ rstd,   \
                                             int n, int c, float eps) {                            \
        const int lane = threadIdx.x & 31;                                                         \
        const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                       \
        if (row >= n) return;                                                                      \
        const duet_u64 base = (duet_u64)row * c;                                                   \
        float s = 0.0f;                                                                            \
        for (int j = lane; j < c; j += 32) s = duet_fadd(s, duet_ld(x, base + j));                 \
        const float mu = duet_fdiv(duet_warp_sum(s), (float)c);                                    \
        float q = 0.0f;                                                                            \
        for (int j = lane; j < c; j += 32) {                                                       \
            const float d = duet_fsub(duet_ld(x, base + j), mu);                                   \
            q = duet_fma(d, d, q);                                                                 \
        }                                                                                          \
        const float var = duet_fdiv(duet_warp_sum(q), (float)c);                                   \
        const float rs = duet_fdiv(1.0f, duet_fsqrt(duet_fadd(var, eps)));                         \
        for (int j = lane; j < c; j += 32) {                                                       \
            const float xn = duet_fmul(duet_fsub(duet_ld(x, base + j), mu), rs);                   \
            duet_st(out, base + j, duet_fma(xn, duet_ld(gamma, j), duet_ld(beta, j)));             \
        }                                                                                          \
        if (lane == 0) {                                                                           \
            mean[row] = mu;                                                                        \
            rstd[row] = rs;                                                                        \
        }                                                                                          \
    }
DUET_FOR_ACT_AND_WIDE(DUET_LN_FWD)

// dx += (g - mean(g) - xhat * mean(g * xhat)) * rstd with g = dout * gamma.
#define DUET_LN_BWD_DX(N, T, PN, P)                                                               \
    DUET_KERNEL layernorm_backward_dx_##N##_##PN(                                                 \
        const T* __restrict__ dout, const T* __restrict__ x, const P* __restrict__ gamma,         \
        const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,       \
        int n, int c) {                                                                           \
        const int lane = threadIdx.x & 31;                                                        \
        const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                      \
        if (row >= n) return;                                                                     \
        const duet_u64 base = (duet_u64)row * c;                                                  \
        const float mu = mean[row], rs = rstd[row];                                               \
        float s1 = 0.0f, s2 = 0.0f;                                                               \
        for (int j = lane; j < c; j += 32) {                                                      \
            const float xh = duet_fmul(duet_fsub(duet_ld(x, base + j), mu), rs);                  \
            const float dn = duet_fmul(duet_ld(dout, base + j), duet_ld(gamma, j));               \
            s1 = duet_fadd(s1, dn);                                                               \
            s2 = duet_fma(dn, xh, s2);                                                            \
        }                                                                                         \
        const float m1 = duet_fdiv(duet_warp_sum(s1), (float)c);                                  \
        const float m2 = duet_fdiv(duet_warp_sum(s2), (float)c);                                  \
        for (int j = lane; j < c; j += 32) {                                                      \
            const float xh = duet_fmul(duet_fsub(duet_ld(x, base + j), mu), rs);                  \
            const float dn = duet_fmul(duet_ld(dout, base + j), duet_ld(gamma, j));               \
            const float t = duet_fsub(duet_fsub(dn, m1), duet_fmul(xh, m2));                                 \
            duet_st(dx, base + j, duet_fma(t, rs, duet_ld(dx, base + j)));                        \
        }                                                                                         \
    }
DUET_FOR_ACT_AND_WIDE(DUET_LN_BWD_DX)

// dgamma/dbeta, pass 1: pg[k * c + j] = sum of dout * xhat and pb[k * c + j] = sum of dout over
// the rows of chunk k. Launch: grid (ceil(c / 32), chunks), block DUET_BLOCK seen as CUDA's
// (32, 8): row phase y adds rows r0 + y, r0 + y + 8, ..., then the 8 phase sums in order.
#define DUET_LN_DPARAMS(N, T)                                                                   \
    DUET_KERNEL layernorm_dparams_partial_##N(                                                    \
        const T* __restrict__ dout, const T* __restrict__ x, const float* __restrict__ mean,      \
        const float* __restrict__ rstd, float* __restrict__ pg, float* __restrict__ pb, int n,    \
        int c, int rows_per_chunk) {                                                              \
        __shared__ float sg[8][33];                                                               \
        __shared__ float sb[8][33];                                                               \
        const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;                                   \
        const int col = blockIdx.x * 32 + tx;                                                     \
        const int r0 = blockIdx.y * rows_per_chunk;                                               \
        const int r1 = min(n, r0 + rows_per_chunk);                                               \
        float g = 0.0f, b = 0.0f;                                                                 \
        if (col < c) {                                                                            \
            for (int r = r0 + ty; r < r1; r += 8) {                                               \
                const duet_u64 idx = (duet_u64)r * c + col;                                       \
                const float d = duet_ld(dout, idx);                                               \
                g = duet_fma(duet_fmul(d, duet_fsub(duet_ld(x, idx), mean[r])), rstd[r], g);      \
                b = duet_fadd(b, d);                                                              \
            }                                                                                     \
        }                                                                                         \
        sg[ty][tx] = g;                                                                           \
        sb[ty][tx] = b;                                                                           \
        __syncthreads();                                                                          \
        if (ty == 0 && col < c) {                                                                 \
            float tg = 0.0f, tb = 0.0f;                                                           \
            for (int k = 0; k < 8; ++k) {                                                         \
                tg = duet_fadd(tg, sg[k][tx]);                                                    \
                tb = duet_fadd(tb, sb[k][tx]);                                                    \
            }                                                                                     \
            pg[(duet_u64)blockIdx.y * c + col] = tg;                                              \
            pb[(duet_u64)blockIdx.y * c + col] = tb;                                              \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_LN_DPARAMS)

// layernorm_forward_fp8 in one pass over a stripe of 32 rows per block: the rows' mean and rstd
// exactly as layernorm_forward_* computes them (the same 32-lane group sums; group g takes rows
// g, g + 8, ...), then per 32-column tile out = (x - mean) * rstd * gamma + beta rounded to x's
// dtype (layernorm_forward_*'s out), its FP8 code (quantize_S_D's) along the rows and, through
// a shared-memory tile, the transposed codes along theirs; amax[0] = max(amax[0], max |out|).
// out itself is never written. With `given`, mean and rstd are read instead (written before by
// layernorm_stats_*, the vectorised forward's statistics). Launch: grid ceil(n / 32),
// DUET_BLOCK threads.
template <typename T, typename P, typename D>
DUET_DEV void duet_ln_fp8(const T* __restrict__ x, const P* __restrict__ gamma,
                          const P* __restrict__ beta, float* __restrict__ mean,
                          float* __restrict__ rstd, D* __restrict__ dst, D* __restrict__ dst_t,
                          int n, int c, float eps, const float* __restrict__ scale,
                          float* __restrict__ amax, int given) {
    __shared__ float mus[32], rss[32];
    __shared__ unsigned char tile[32][33];
    __shared__ float sh[DUET_MAX_GROUPS];
    const int lane = threadIdx.x & 31, grp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * 32;
    for (int k = grp; k < 32; k += DUET_BLOCK / 32) {
        const int row = r0 + k;
        if (row >= n) break;
        if (given) {  // mean and rstd from layernorm_stats_* (the vectorised forward's)
            if (lane == 0) {
                mus[k] = mean[row];
                rss[k] = rstd[row];
            }
            continue;
        }
        const duet_u64 base = (duet_u64)row * c;
        float s = 0.0f;
        for (int j = lane; j < c; j += 32) s = duet_fadd(s, duet_ld(x, base + j));
        const float mu = duet_fdiv(duet_warp_sum(s), (float)c);
        float q = 0.0f;
        for (int j = lane; j < c; j += 32) {
            const float d = duet_fsub(duet_ld(x, base + j), mu);
            q = duet_fma(d, d, q);
        }
        const float var = duet_fdiv(duet_warp_sum(q), (float)c);
        const float rs = duet_fdiv(1.0f, duet_fsqrt(duet_fadd(var, eps)));
        if (lane == 0) {
            mus[k] = mu;
            rss[k] = rs;
            mean[row] = mu;
            rstd[row] = rs;
        }
    }
    __syncthreads();
    const float sc = scale[0];
    float m = 0.0f;
    for (int c0 = 0; c0 < c; c0 += 32) {
        const int col = c0 + lane;
        for (int k = grp; k < 32; k += DUET_BLOCK / 32) {
            const int row = r0 + k;
            if (row < n && col < c) {
                const duet_u64 i = (duet_u64)row * c + col;
                const float xn = duet_fmul(duet_fsub(duet_ld(x, i), mus[k]), rss[k]);
                T o;
                duet_st(&o, 0, duet_fma(xn, duet_ld(gamma, col), duet_ld(beta, col)));
                const float v = duet_ld(&o, 0);
                m = fmaxf(m, fabsf(v));
                D qd;
                duet_st(&qd, 0, v * sc);
                dst[i] = qd;
                tile[k][lane] = qd.bits;
            }
        }
        __syncthreads();
        if (dst_t != nullptr) {
            for (int k = grp; k < 32; k += DUET_BLOCK / 32) {
                const int cc = c0 + k, row = r0 + lane;
                if (row < n && cc < c) dst_t[(duet_u64)cc * n + row].bits = tile[lane][k];
            }
        }
        __syncthreads();
    }
    m = duet_block_max(m, sh);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), duet_f2u(m));
}

#define DUET_LN_FP8_ONE(N, T, PN, P, DN, D)                                                     \
    DUET_KERNEL layernorm_forward_fp8_##N##_##PN##_##DN(                                         \
        const T* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,         \
        float* __restrict__ mean, float* __restrict__ rstd, D* __restrict__ dst,                  \
        D* __restrict__ dst_t, int n, int c, float eps, const float* __restrict__ scale,          \
        float* __restrict__ amax, int given) {                                                    \
        duet_ln_fp8<T, P, D>(x, gamma, beta, mean, rstd, dst, dst_t, n, c, eps, scale, amax,      \
                             given);                                                              \
    }
#define DUET_LN_FP8(N, T, PN, P)                                                                \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e4m3, duet_e4m3)                                              \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e5m2, duet_e5m2)                                              \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e4m3fnuz, duet_e4m3fnuz)                                      \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT_AND_WIDE(DUET_LN_FP8)

// ------------------------------------------------------------------ the vectorised forward
// kernels-cuda/layernorm.cu's fast forward (layernorm_fwd_*, layernorm_stats_*) with the same row
// layout (duet_gpu::layernorm_plan: a row per group of G 32-lane groups, thread t owning the
// 16-byte vectors t, t + 32G, ... of the row, at most M), the same order of every sum (its
// elements in order, the 32-lane butterfly, then the G group sums in order from 0) and the
// roundings NVRTC gives CUDA's expressions (common.cuh: q += d·d and the affine's multiply-add
// fused, 1/√(q/c + ε) as a division, an add, a square root and a reciprocal): the same bits.
// Blocks of at most 256 threads (⌊8 / G⌋ row groups).
template <typename T, int V>
struct alignas((V * sizeof(T)) % 16 == 0 ? 16 : sizeof(T)) DuetLnVec {
    T v[V];
};

// Sums K values over the row group of G 32-lane groups (CUDA's group_sum<K>): each 32-lane
// butterfly, then (G > 1) the G group sums in group order from 0. `sh` holds 8·K floats.
// Reached by every thread of the block when G > 1 (it synchronises the block).
template <int K> DUET_DEV void duet_ln_group_sum(float (&s)[K], float* sh, int G) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = duet_warp_sum(s[k]);
    if (G > 1) {
        const int w = threadIdx.x >> 5, first = w / G * G;
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k * 8 + w] = s[k];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float t = 0.0f;
            for (int i = 0; i < G; ++i) t = duet_fadd(t, sh[k * 8 + first + i]);
            s[k] = t;
        }
        __syncthreads();
    }
}

template <typename A, typename P, int M, bool OUT>
DUET_DEV void duet_ln_fwd_vec(const A* __restrict__ x, const P* __restrict__ gamma,
                              const P* __restrict__ beta, A* __restrict__ out,
                              float* __restrict__ mean, float* __restrict__ rstd, int n, int c,
                              float eps, int G) {
    constexpr int V = 16 / (int)sizeof(A);
    __shared__ float sh[8];
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = threadIdx.x / gt, t = threadIdx.x - grp * gt;
    const int row = blockIdx.x * groups + grp;
    const bool live = row < n;
    const int nv = c / V;
    const duet_u64 base = (duet_u64)(live ? row : 0) * c;
    DuetLnVec<A, V> xr[M];
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (live && j < nv) xr[k] = reinterpret_cast<const DuetLnVec<A, V>*>(x + base)[j];
    }
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k)
        if (live && k * gt + t < nv)
#pragma unroll
            for (int e = 0; e < V; ++e) s[0] = duet_fadd(s[0], duet_ld(xr[k].v, e));
    duet_ln_group_sum<1>(s, sh, G);
    const float mu = duet_fdiv(s[0], (float)c);
    float q[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k)
        if (live && k * gt + t < nv)
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = duet_fsub(duet_ld(xr[k].v, e), mu);
                q[0] = duet_fma(d, d, q[0]);
            }
    duet_ln_group_sum<1>(q, sh, G);
    const float rs = duet_fdiv(1.0f, duet_fsqrt(duet_fadd(duet_fdiv(q[0], (float)c), eps)));
    if (OUT) {
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const DuetLnVec<P, V> g = reinterpret_cast<const DuetLnVec<P, V>*>(gamma)[j];
                const DuetLnVec<P, V> b = reinterpret_cast<const DuetLnVec<P, V>*>(beta)[j];
                DuetLnVec<A, V> o;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float xn = duet_fmul(duet_fsub(duet_ld(xr[k].v, e), mu), rs);
                    duet_st(o.v, e, duet_fma(xn, duet_ld(g.v, e), duet_ld(b.v, e)));
                }
                reinterpret_cast<DuetLnVec<A, V>*>(out + base)[j] = o;
            }
        }
    }
    if (live && t == 0) {
        mean[row] = mu;
        rstd[row] = rs;
    }
}

// layernorm_fwd_<A>_<P>_v<M>(x, gamma, beta, out, mean, rstd, n, c, eps, G); M in
// duet_gpu::layernorm_plan::LN_M.
#define DUET_LN_FWD_VEC(N, T, PN, P, M)                                                          \
    DUET_KERNEL layernorm_fwd_##N##_##PN##_v##M(                                                 \
        const T* __restrict__ x, const P* __restrict__ gamma, const P* __restrict__ beta,        \
        T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int n, int c,   \
        float eps, int G) {                                                                      \
        duet_ln_fwd_vec<T, P, M, true>(x, gamma, beta, out, mean, rstd, n, c, eps, G);           \
    }
#define DUET_LN_FWD_VECS(N, T, PN, P)                                                            \
    DUET_LN_FWD_VEC(N, T, PN, P, 1) DUET_LN_FWD_VEC(N, T, PN, P, 2)                              \
    DUET_LN_FWD_VEC(N, T, PN, P, 3) DUET_LN_FWD_VEC(N, T, PN, P, 4)                              \
    DUET_LN_FWD_VEC(N, T, PN, P, 6) DUET_LN_FWD_VEC(N, T, PN, P, 8)
DUET_FOR_ACT_AND_WIDE(DUET_LN_FWD_VECS)

// layernorm_stats_<A>_v(x, mean, rstd, n, c, eps, G): the vectorised forward's statistics only
// (M = 8 covers every forward plan; the loops skip vectors past the row, so the sums are
// layernorm_fwd's for the plan's G), for layernorm_forward_fp8 (ops/fp8.rs).
#define DUET_LN_STATS(N, T)                                                                      \
    DUET_KERNEL layernorm_stats_##N##_v(const T* __restrict__ x, float* __restrict__ mean,        \
                                        float* __restrict__ rstd, int n, int c, float eps, int G) { \
        duet_ln_fwd_vec<T, T, 8, false>(x, nullptr, nullptr, nullptr, mean, rstd, n, c, eps, G); \
    }
DUET_FOR_ACT(DUET_LN_STATS)

// ------------------------------------------------------------------ the vectorised backward
// kernels-cuda/layernorm.cu's fused backward (layernorm_bwd_*, layernorm_bwdsum_*) for the
// vectorised plans (duet_gpu::layernorm_plan, backward: G <= 4, M <= 3), over the chunk of
// rows [blockIdx.x·rpc, min(n, (blockIdx.x + 1)·rpc)):
//   dx += rstd · (dnorm − mean(dnorm) − x̂ · mean(dnorm · x̂)),  dnorm = dout · γ;
//   pg[chunk, :] = Σ dout · x̂,  pb[chunk, :] = Σ dout  (and with DSUM ps[chunk, :] = Σ dx as
//   stored) over the chunk's rows, each thread its columns in row order, then the row groups'
//   sums in group order. The multiply-adds are fused where NVRTC (fmad on, LLVM's aggressive
//   contraction on NVPTX) fuses CUDA's plain expressions: Σ dnorm as fma(dout, γ, s), Σ dnorm·x̂
//   as fma(dnorm, x̂, s), dnorm − m1 − x̂·m2 as fma(−x̂, m2, fma(dout, γ, −m1)), and the update as
//   fma(·, rstd, dx). Blocks of at most 128 threads (⌊4 / G⌋ row groups).
template <typename A, typename P, int M, bool DSUM>
DUET_DEV void duet_ln_bwd_vec(const A* __restrict__ dout, const A* __restrict__ x,
                              const P* __restrict__ gamma, const float* __restrict__ mean,
                              const float* __restrict__ rstd, A* __restrict__ dx,
                              float* __restrict__ pg, float* __restrict__ pb,
                              float* __restrict__ ps, int n, int c, int rpc, int G) {
    constexpr int V = 16 / (int)sizeof(A);
    constexpr int E = M * V;         // elements per thread
    constexpr int B = 128;           // most threads per block (slot stride)
    constexpr int S = DSUM ? 3 : 2;  // sums per element
    __shared__ float sh[16];
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
    for (int it = 0; it < iters; ++it) {
        const int row = r0 + it * groups + grp;
        const bool live = row < r1;
        const duet_u64 base = (duet_u64)(live ? row : 0) * c;
        DuetLnVec<A, V> cx[M], cd[M], cg[M];
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                cx[k] = reinterpret_cast<const DuetLnVec<A, V>*>(x + base)[j];
                cd[k] = reinterpret_cast<const DuetLnVec<A, V>*>(dout + base)[j];
                cg[k] = reinterpret_cast<const DuetLnVec<A, V>*>(dx + base)[j];
            }
        }
        const float mu = live ? mean[row] : 0.0f, rs = live ? rstd[row] : 0.0f;
        float sm[2] = {0.0f, 0.0f};  // Σ dnorm, Σ dnorm · x̂
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const DuetLnVec<P, V> g = reinterpret_cast<const DuetLnVec<P, V>*>(gamma)[j];
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float xh = duet_fmul(duet_fsub(duet_ld(cx[k].v, e), mu), rs);
                    const float d = duet_ld(cd[k].v, e), ge = duet_ld(g.v, e);
                    const float dn = duet_fmul(d, ge);
                    sm[0] = duet_fma(d, ge, sm[0]);
                    sm[1] = duet_fma(dn, xh, sm[1]);
                }
            }
        }
        duet_ln_group_sum<2>(sm, sh, G);
        const float m1 = duet_fdiv(sm[0], (float)c), m2 = duet_fdiv(sm[1], (float)c);
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const DuetLnVec<P, V> g = reinterpret_cast<const DuetLnVec<P, V>*>(gamma)[j];
                DuetLnVec<A, V> o;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float d = duet_ld(cd[k].v, e), ge = duet_ld(g.v, e);
                    const float xh = duet_fmul(duet_fsub(duet_ld(cx[k].v, e), mu), rs);
                    const float tt = duet_fma(-xh, m2, duet_fma(d, ge, -m1));
                    duet_st(o.v, e, duet_fma(tt, rs, duet_ld(cg[k].v, e)));
                    acc[k * V + e] = duet_fma(d, xh, acc[k * V + e]);
                    acc[E + k * V + e] = duet_fadd(acc[E + k * V + e], d);
                    if (DSUM) acc[2 * E + k * V + e] = duet_fadd(acc[2 * E + k * V + e], duet_ld(o.v, e));
                }
                reinterpret_cast<DuetLnVec<A, V>*>(dx + base)[j] = o;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < S * E; ++i) sacc[i * B + tid] = acc[i];
    // Group 0 adds the row groups' sums in group order and writes the chunk's partial rows.
    __syncthreads();
    if (grp == 0) {
        const duet_u64 prow = (duet_u64)blockIdx.x * c;
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (j < nv) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const int sg = (k * V + e) * B + t, sb = (E + k * V + e) * B + t;
                    float a = sacc[sg], b = sacc[sb];
                    for (int q = 1; q < groups; ++q) {
                        a = duet_fadd(a, sacc[sg + q * gt]);
                        b = duet_fadd(b, sacc[sb + q * gt]);
                    }
                    pg[prow + (duet_u64)j * V + e] = a;
                    pb[prow + (duet_u64)j * V + e] = b;
                    if (DSUM) {
                        const int ss = (2 * E + k * V + e) * B + t;
                        float u = sacc[ss];
                        for (int q = 1; q < groups; ++q) u = duet_fadd(u, sacc[ss + q * gt]);
                        ps[prow + (duet_u64)j * V + e] = u;
                    }
                }
            }
        }
    }
}

#define DUET_LN_BWD_VEC(N, T, PN, P, M)                                                          \
    extern "C" __global__ void __launch_bounds__(128) layernorm_bwd_##N##_##PN##_v##M(           \
        const T* __restrict__ dout, const T* __restrict__ x, const P* __restrict__ gamma,        \
        const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,      \
        float* __restrict__ pg, float* __restrict__ pb, int n, int c, int rpc, int G) {          \
        duet_ln_bwd_vec<T, P, M, false>(dout, x, gamma, mean, rstd, dx, pg, pb, nullptr, n, c,   \
                                        rpc, G);                                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) layernorm_bwdsum_##N##_##PN##_v##M(        \
        const T* __restrict__ dout, const T* __restrict__ x, const P* __restrict__ gamma,        \
        const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,      \
        float* __restrict__ pg, float* __restrict__ pb, float* __restrict__ ps, int n, int c,    \
        int rpc, int G) {                                                                        \
        duet_ln_bwd_vec<T, P, M, true>(dout, x, gamma, mean, rstd, dx, pg, pb, ps, n, c, rpc, G); \
    }
#define DUET_LN_BWD_VECS(N, T, PN, P)                                                            \
    DUET_LN_BWD_VEC(N, T, PN, P, 1) DUET_LN_BWD_VEC(N, T, PN, P, 2) DUET_LN_BWD_VEC(N, T, PN, P, 3)
DUET_FOR_ACT_AND_WIDE(DUET_LN_BWD_VECS)

// out[col] += Σ_k part[k·c + col] for the block's 32 columns (CUDA's layernorm_finish_cols):
// block (32, 32), thread row y adds chunks y, y + 32, ... in order from 0, then row 0 adds the
// 32 sums in y order from 0.
template <typename G>
DUET_DEV void duet_ln_finish_cols(const float* __restrict__ part, G* __restrict__ out, int chunks,
                                  int c, float (*sh)[33]) {
    const int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < c)
        for (int k = threadIdx.y; k < chunks; k += 32) s = duet_fadd(s, part[(duet_u64)k * c + col]);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) t = duet_fadd(t, sh[i][threadIdx.x]);
        duet_st(out, col, duet_fadd(duet_ld(out, col), t));
    }
}

// layernorm_dparams_finish_<G>(pg, pb, dgamma, dbeta, chunks, c): grid (⌈c / 32⌉, 2), block
// (32, 32); blockIdx.y picks dgamma (pg) or dbeta (pb).
#define DUET_LN_FINISH(N, T)                                                                     \
    DUET_KERNEL_1024 layernorm_dparams_finish_##N(const float* __restrict__ pg,                   \
                                                  const float* __restrict__ pb,                   \
                                                  T* __restrict__ dgamma, T* __restrict__ dbeta,  \
                                                  int chunks, int c) {                            \
        __shared__ float sh[32][33];                                                             \
        duet_ln_finish_cols<T>(blockIdx.y == 0 ? pg : pb, blockIdx.y == 0 ? dgamma : dbeta,       \
                               chunks, c, sh);                                                   \
    }
DUET_FOR_ACT(DUET_LN_FINISH)

// layernorm_dparams_finish3_<G>_<U>: the same plus dsum[col] += Σ_k ps[k·c + col]
// (blockIdx.y == 2, dsum of its own float type). Grid (⌈c / 32⌉, 3).
#define DUET_LN_FINISH3_ONE(N, T, UN, U)                                                         \
    DUET_KERNEL_1024 layernorm_dparams_finish3_##N##_##UN(                                        \
        const float* __restrict__ pg, const float* __restrict__ pb, const float* __restrict__ ps, \
        T* __restrict__ dgamma, T* __restrict__ dbeta, U* __restrict__ dsum, int chunks, int c) { \
        __shared__ float sh[32][33];                                                             \
        if (blockIdx.y == 2)                                                                     \
            duet_ln_finish_cols<U>(ps, dsum, chunks, c, sh);                                     \
        else                                                                                     \
            duet_ln_finish_cols<T>(blockIdx.y == 0 ? pg : pb, blockIdx.y == 0 ? dgamma : dbeta,   \
                                   chunks, c, sh);                                               \
    }
#define DUET_LN_FINISH3(N, T)                                                                    \
    DUET_LN_FINISH3_ONE(N, T, f32, float)                                                        \
    DUET_LN_FINISH3_ONE(N, T, bf16, duet_bf16) DUET_LN_FINISH3_ONE(N, T, f16, duet_f16)
DUET_FOR_ACT(DUET_LN_FINISH3)
