// LayerNorm over the last dimension, forward and backward.
//
// Fast path (layernorm_fwd_* / layernorm_bwd_* + layernorm_dparams_finish_*), for rows of whole
// 16-byte vectors (c a multiple of V = 16 bytes of the activation type, buffers 16-byte
// aligned): a row is held in registers by a "row group" of G warps; thread t of a group owns
// the vectors t, t + 32G, ... of the row (M at most, a compile-time bound). G and M are chosen
// by the host (device/layernorm.rs, `plan`) from c and the dtypes:
//   * forward: 256-thread blocks of 8 / G groups, a grid of one wave (a few blocks per SM);
//     each group loops over rows (grid stride), loading the next row while it normalises the
//     current one. Row statistics: each thread sums its elements in order, then warp_sum (xor
//     tree), then the group's G warp sums in warp order: fixed by (G, M), not by the grid.
//   * backward: one block per chunk of rows [b·rpc, (b+1)·rpc) (about one chunk per SM); group g
//     handles the chunk's rows g, g + groups, ... in order, updates dx and keeps its columns'
//     dgamma/dbeta sums in registers; at the end the groups' sums are added in group order and
//     written as one partial row per chunk; layernorm_dparams_finish adds the chunks' partial
//     rows in a fixed order and accumulates into dgamma and dbeta. The chunking depends on n
//     and the device's SM count only, so the sums are bit-reproducible on a device.
// No floating-point atomics anywhere.
//
// Fallback (rows that are not whole vectors, or too wide for the fast path): the row kernels
// right below use one warp per row (8 rows per 256-thread block) reading global memory for every
// pass; dgamma/dbeta are computed in two passes (layernorm_dparams_partial here, colsum_finish in
// reduce.cu) with a partition fixed by the shape.
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
    for (int j = lane; j < c; j += 32) s += to_f32(xr[j]);
    const float mu = warp_sum(s) / (float)c;
    float v = 0.0f;
    for (int j = lane; j < c; j += 32) {
        const float d = to_f32(xr[j]) - mu;
        v += d * d;
    }
    const float var = warp_sum(v) / (float)c;
    const float rs = 1.0f / sqrtf(var + eps);
    A* o = out + (u64)row * c;
    for (int j = lane; j < c; j += 32)
        o[j] = from_f32<A>((to_f32(xr[j]) - mu) * rs * to_f32(gamma[j]) + to_f32(beta[j]));
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
        const float xh = (to_f32(x[base + j]) - mu) * rs;
        const float dn = to_f32(dout[base + j]) * to_f32(gamma[j]);
        s1 += dn;
        s2 += dn * xh;
    }
    const float m1 = warp_sum(s1) / (float)c;
    const float m2 = warp_sum(s2) / (float)c;
    for (int j = lane; j < c; j += 32) {
        const float xh = (to_f32(x[base + j]) - mu) * rs;
        const float dn = to_f32(dout[base + j]) * to_f32(gamma[j]);
        dx[base + j] = from_f32<A>(to_f32(dx[base + j]) + (dn - m1 - xh * m2) * rs);
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
            g += d * (to_f32(x[idx]) - mean[r]) * rstd[r];
            b += d;
        }
    }
    sg[threadIdx.y][threadIdx.x] = g;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float tg = 0.0f, tb = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            tg += sg[k][threadIdx.x];
            tb += sb[k][threadIdx.x];
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

// V consecutive storage elements, aligned for 128-bit accesses when they fill whole 16 bytes.
template <typename T, int V>
struct alignas((V * sizeof(T)) % 16 == 0 ? 16 : sizeof(T)) Vec {
    T v[V];
};

template <typename T, int V> __device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
    Vec<T, V> r;
    if constexpr ((V * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < (int)(V * sizeof(T) / 16); ++i)
            reinterpret_cast<uint4*>(&r)[i] = reinterpret_cast<const uint4*>(p)[i];
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) r.v[i] = p[i];
    }
    return r;
}

template <typename T, int V> __device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& r) {
    if constexpr ((V * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < (int)(V * sizeof(T) / 16); ++i)
            reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(&r)[i];
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = r.v[i];
    }
}

// V floats rounded to the storage type (round to nearest even, as from_f32). bf16 on sm_80+:
// one cvt.rn.bf16x2.f32 per pair (the same bits as from_f32 for every non-NaN value; a vector
// holding a NaN takes from_f32, which keeps the NaN's sign and payload like the CPU reference).
template <typename A, int V> struct RoundVec {
    static __device__ __forceinline__ Vec<A, V> run(const float (&y)[V]) {
        Vec<A, V> o;
#pragma unroll
        for (int e = 0; e < V; ++e) o.v[e] = from_f32<A>(y[e]);
        return o;
    }
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
template <int V> struct RoundVec<bf16_t, V> {
    static __device__ __forceinline__ Vec<bf16_t, V> run(const float (&y)[V]) {
        static_assert(V % 2 == 0, "bf16 vectors hold pairs");
        Vec<bf16_t, V> o;
        bool nan = false;
#pragma unroll
        for (int e = 0; e < V; ++e) nan |= y[e] != y[e];
        if (nan) {
#pragma unroll
            for (int e = 0; e < V; ++e) o.v[e] = from_f32<bf16_t>(y[e]);
        } else {
            unsigned int* w = reinterpret_cast<unsigned int*>(&o);
#pragma unroll
            for (int e = 0; e < V; e += 2)
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[e / 2]) : "f"(y[e + 1]), "f"(y[e]));
        }
        return o;
    }
};
#endif

// Sums K values over the row group of G warps: warp_sum (xor tree), then the G warp sums in warp
// order. Every thread of the group gets the same bits. `sh` holds 2·K·W floats (W warps per
// block), used alternately (`ph`), so one barrier per call suffices; when G > 1 every thread of
// the block must make the same calls.
template <int K, int W>
__device__ __forceinline__ void ln_group_sum(float (&s)[K], float* sh, int& ph, int G) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = warp_sum(s[k]);
    if (G > 1) {
        float* b = sh + ph * K * W;
        ph ^= 1;
        const int w = threadIdx.x >> 5, first = w - w % G;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) b[k * W + w] = s[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float t = 0.0f;
            for (int i = 0; i < G; ++i) t += b[k * W + first + i];
            s[k] = t;
        }
    }
}

// The thread's M vectors of row `row` (vector j = k·gt + t, k < M, when j < nv).
template <typename A, int V, int M>
__device__ __forceinline__ void ln_load(Vec<A, V> (&r)[M], const A* __restrict__ p, int row,
                                        int c, int t, int gt, int nv) {
    const A* q = p + (u64)row * c;
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (j < nv) r[k] = load_vec<A, V>(q + j * V);
    }
}

// Forward: blocks of 256 threads, 8 / G row groups of G warps, a grid of at most
// sm_count · LN_FWD_BPS(M) blocks (host: layernorm.rs). Group g of block b handles the rows
// b·groups + g + i·stride (stride = gridDim.x · groups), the row kept in registers, and loads
// the next row while it finishes the current one. Each row's arithmetic does not depend on the
// grid, only on (G, M).
#define LN_FWD_BPS(M) ((M) <= 3 ? 4 : (M) == 4 ? 3 : 2)
template <typename A, typename P, int M>
__device__ __forceinline__ void ln_fwd_body(const A* __restrict__ x, const P* __restrict__ gamma,
                                            const P* __restrict__ beta, A* __restrict__ out,
                                            float* __restrict__ mean, float* __restrict__ rstd,
                                            int n, int c, float eps, int G) {
    constexpr int V = Pack<A>::N;
    __shared__ float sh[2 * 8];
    int ph = 0;
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = threadIdx.x / gt, t = threadIdx.x - grp * gt;
    const int nv = c / V;
    const int stride = gridDim.x * groups;
    const int iters = (n - 1) / stride + 1;  // the same for every group of the block
    int row = blockIdx.x * groups + grp;
    Vec<A, V> cur[M], nxt[M];
    if (row < n) ln_load(cur, x, row, c, t, gt, nv);
    for (int it = 0; it < iters; ++it, row += stride) {
        const bool live = row < n;
        if (row < n - stride) ln_load(nxt, x, row + stride, c, t, gt, nv);
        float s[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < M; ++k) {
            if (live && k * gt + t < nv) {
#pragma unroll
                for (int e = 0; e < V; ++e) s[0] += to_f32(cur[k].v[e]);
            }
        }
        ln_group_sum<1, 8>(s, sh, ph, G);
        const float mu = s[0] / (float)c;
        float q[1] = {0.0f};
#pragma unroll
        for (int k = 0; k < M; ++k) {
            if (live && k * gt + t < nv) {
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float d = to_f32(cur[k].v[e]) - mu;
                    q[0] += d * d;
                }
            }
        }
        ln_group_sum<1, 8>(q, sh, ph, G);
        const float rs = 1.0f / sqrtf(q[0] / (float)c + eps);
        if (live) {
            A* o = out + (u64)row * c;
#pragma unroll
            for (int k = 0; k < M; ++k) {
                const int j = k * gt + t;
                if (j < nv) {
                    const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
                    const Vec<P, V> b = load_vec<P, V>(beta + j * V);
                    float y[V];
#pragma unroll
                    for (int e = 0; e < V; ++e)
                        y[e] = (to_f32(cur[k].v[e]) - mu) * rs * to_f32(g.v[e]) + to_f32(b.v[e]);
                    store_vec<A, V>(o + j * V, RoundVec<A, V>::run(y));
                }
            }
            if (t == 0) {
                mean[row] = mu;
                rstd[row] = rs;
            }
        }
#pragma unroll
        for (int k = 0; k < M; ++k) cur[k] = nxt[k];
    }
}

// Backward: one block of LN_BWD_THREADS(M) threads per chunk of rows [b·rpc, min(n, (b+1)·rpc))
// (host: about one chunk per SM), NT / (32·G) row groups of G warps; group g handles the chunk's
// rows g, g + groups, ... in order, loading the next row's x and dout while it finishes the
// current one (and the next row's dx right after):
//   dx += rstd · (dnorm − mean(dnorm) − x̂ · mean(dnorm · x̂)),  dnorm = dout · γ;
// and keeps Σ dout · x̂ and Σ dout for its columns in registers. At the end the groups' sums are
// added in group order (through shared memory) into the chunk's partial rows pg[b, :], pb[b, :].
#define LN_BWD_THREADS(M) ((M) >= 3 ? 384 : 512)
template <typename A, typename P, int M>
__device__ __forceinline__ void ln_bwd_body(const A* __restrict__ dout, const A* __restrict__ x,
                                            const P* __restrict__ gamma,
                                            const float* __restrict__ mean,
                                            const float* __restrict__ rstd, A* __restrict__ dx,
                                            float* __restrict__ pg, float* __restrict__ pb, int n,
                                            int c, int rpc, int G) {
    constexpr int V = Pack<A>::N;
    constexpr int E = M * V;  // elements per thread
    constexpr int NT = LN_BWD_THREADS(M), W = NT / 32;
    __shared__ float sh[2 * 2 * W];
    __shared__ float sacc[E * NT];
    int ph = 0;
    const int tid = threadIdx.x;
    const int gt = G * 32, groups = NT / gt;
    const int grp = tid / gt, t = tid - grp * gt;
    const int nv = c / V;
    const int r0 = blockIdx.x * rpc, r1 = min(n, r0 + rpc);
    const int iters = (rpc - 1) / groups + 1;
    float ag[E], ab[E];
#pragma unroll
    for (int i = 0; i < E; ++i) ag[i] = ab[i] = 0.0f;
    Vec<A, V> cx[M], cd[M], cg[M], nx[M], nd[M];
    int row = r0 + grp;
    float mu = 0.0f, rs = 0.0f;
    if (row < r1) {
        ln_load(cx, x, row, c, t, gt, nv);
        ln_load(cd, dout, row, c, t, gt, nv);
        ln_load(cg, dx, row, c, t, gt, nv);
        mu = mean[row];
        rs = rstd[row];
    }
    for (int it = 0; it < iters; ++it, row += groups) {
        const bool live = row < r1;
        float nmu = 0.0f, nrs = 0.0f;
        const bool nlive = row + groups < r1;
        if (nlive) {
            ln_load(nx, x, row + groups, c, t, gt, nv);
            ln_load(nd, dout, row + groups, c, t, gt, nv);
            nmu = mean[row + groups];
            nrs = rstd[row + groups];
        }
        float s[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (live && j < nv) {
                const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const float xh = (to_f32(cx[k].v[e]) - mu) * rs;
                    const float dn = to_f32(cd[k].v[e]) * to_f32(g.v[e]);
                    s[0] += dn;
                    s[1] += dn * xh;
                }
            }
        }
        ln_group_sum<2, W>(s, sh, ph, G);
        const float m1 = s[0] / (float)c, m2 = s[1] / (float)c;
        if (live) {
            A* o = dx + (u64)row * c;
#pragma unroll
            for (int k = 0; k < M; ++k) {
                const int j = k * gt + t;
                if (j < nv) {
                    const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
                    float y[V];
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        const float d = to_f32(cd[k].v[e]);
                        const float xh = (to_f32(cx[k].v[e]) - mu) * rs;
                        const float dn = d * to_f32(g.v[e]);
                        y[e] = to_f32(cg[k].v[e]) + (dn - m1 - xh * m2) * rs;
                        ag[k * V + e] += d * xh;
                        ab[k * V + e] += d;
                    }
                    store_vec<A, V>(o + j * V, RoundVec<A, V>::run(y));
                }
            }
        }
        // The next row's dx only now, when this row's is dead (fewer live registers).
        if (nlive) ln_load(cg, dx, row + groups, c, t, gt, nv);
#pragma unroll
        for (int k = 0; k < M; ++k) {
            cx[k] = nx[k];
            cd[k] = nd[k];
        }
        mu = nmu;
        rs = nrs;
    }
    // The chunk's partial rows: slot i = k·V + e of thread t holds column (k·gt + t)·V + e; the
    // groups' sums are added in group order, spread over all threads of the block.
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) __syncthreads();
#pragma unroll
        for (int i = 0; i < E; ++i) sacc[i * NT + tid] = pass == 0 ? ag[i] : ab[i];
        __syncthreads();
        float* dst = (pass == 0 ? pg : pb) + (u64)blockIdx.x * c;
        for (int u = tid; u < E * gt; u += NT) {
            const int i = u / gt, tt = u - i * gt;
            const int k = i / V, e = i - k * V, j = k * gt + tt;
            if (j < nv) {
                float a = sacc[i * NT + tt];
                for (int q = 1; q < groups; ++q) a += sacc[i * NT + q * gt + tt];
                dst[j * V + e] = a;
            }
        }
    }
}

// Entry points: layernorm_fwd_<act>_<param>_v<M> and layernorm_bwd_<act>_<param>_v<M>, M = 16-byte
// vectors per thread (host: layernorm.rs, `plan`).
#define LN_FWD(A, SA, P, SP, M)                                                               \
    extern "C" __global__ void __launch_bounds__(256, LN_FWD_BPS(M))                          \
        layernorm_fwd_##SA##_##SP##_v##M(const A* __restrict__ x,                             \
                                         const P* __restrict__ gamma,                         \
                                         const P* __restrict__ beta, A* __restrict__ out,     \
                                         float* __restrict__ mean, float* __restrict__ rstd,  \
                                         int n, int c, float eps, int G) {                    \
        ln_fwd_body<A, P, M>(x, gamma, beta, out, mean, rstd, n, c, eps, G);                  \
    }
#define LN_BWD(A, SA, P, SP, M)                                                               \
    extern "C" __global__ void __launch_bounds__(LN_BWD_THREADS(M), 1)                        \
        layernorm_bwd_##SA##_##SP##_v##M(                                                     \
            const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma, \
            const float* __restrict__ mean, const float* __restrict__ rstd,                   \
            A* __restrict__ dx, float* __restrict__ pg, float* __restrict__ pb, int n, int c, \
            int rpc, int G) {                                                                 \
        ln_bwd_body<A, P, M>(dout, x, gamma, mean, rstd, dx, pg, pb, n, c, rpc, G);           \
    }
// Forward M in {1, 2, 3, 4, 6, 8}, backward M in {1, 2, 3}.
#define LN_SET(A, SA, P, SP)                                                                  \
    LN_FWD(A, SA, P, SP, 1)                                                                   \
    LN_FWD(A, SA, P, SP, 2)                                                                   \
    LN_FWD(A, SA, P, SP, 3)                                                                   \
    LN_FWD(A, SA, P, SP, 4)                                                                   \
    LN_FWD(A, SA, P, SP, 6)                                                                   \
    LN_FWD(A, SA, P, SP, 8)                                                                   \
    LN_BWD(A, SA, P, SP, 1)                                                                   \
    LN_BWD(A, SA, P, SP, 2)                                                                   \
    LN_BWD(A, SA, P, SP, 3)
FOR_ACT_AND_WIDE(LN_SET)

// dgamma[col] += Σ_k pg[k·c + col] and dbeta[col] += Σ_k pb[k·c + col] (blockIdx.y picks
// which); c a multiple of 4, the areas 16-byte aligned. Block (8, 32), grid (⌈c / 32⌉, 2):
// thread (x, y) adds the float4 of columns 4·(8·blockIdx.x + x) .. +3 of chunks y, y + 32, ...
// in order, then the 32 sums are added in y order.
template <typename G>
__device__ __forceinline__ void ln_finish_body(const float* __restrict__ pg,
                                               const float* __restrict__ pb,
                                               G* __restrict__ dgamma, G* __restrict__ dbeta,
                                               int chunks, int c) {
    __shared__ float4 sh[32][8];
    const float* part = blockIdx.y == 0 ? pg : pb;
    G* out = blockIdx.y == 0 ? dgamma : dbeta;
    const int col = (blockIdx.x * 8 + threadIdx.x) * 4;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (col < c) {
        const float* p = part + col;
        int k = threadIdx.y;
        // Four loads in flight per step; the additions stay in chunk order.
        for (; k + 96 < chunks; k += 128) {
            float4 a[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                a[i] = *reinterpret_cast<const float4*>(p + (u64)(k + 32 * i) * c);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s.x += a[i].x;
                s.y += a[i].y;
                s.z += a[i].z;
                s.w += a[i].w;
            }
        }
        for (; k < chunks; k += 32) {
            const float4 a = *reinterpret_cast<const float4*>(p + (u64)k * c);
            s.x += a.x;
            s.y += a.y;
            s.z += a.z;
            s.w += a.w;
        }
    }
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y < 4 && col < c) {
        // Thread (x, y < 4) finishes column col + y.
        const int e = threadIdx.y;
        float tsum = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const float4 v = sh[i][threadIdx.x];
            tsum += e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
        }
        out[col + e] = from_f32<G>(to_f32(out[col + e]) + tsum);
    }
}

#define LAYERNORM_FINISH(T, S)                                                                \
    extern "C" __global__ void __launch_bounds__(256) layernorm_dparams_finish_##S(          \
        const float* __restrict__ pg, const float* __restrict__ pb, T* __restrict__ dgamma,   \
        T* __restrict__ dbeta, int chunks, int c) {                                           \
        ln_finish_body(pg, pb, dgamma, dbeta, chunks, c);                                     \
    }
FOR_FLOAT(LAYERNORM_FINISH)

// ------------------------------------------------------------------ previous kernels
// The previous fast path (one block per 16-row chunk, shared-memory dgamma/dbeta slots, 512
// partial rows, the old finish), bf16 activations with f32 parameters at M = 2 and 3 only: kept
// so examples/layernorm_bench can time old against new in one run (DUET_LN_LEGACY=1, see
// layernorm.rs). Not used otherwise; delete once the comparison is no longer needed.

// Sums K values over the row group of G warps: warp_sum, then the G warp sums in warp order.
// Every thread of the group gets the same bits. `sh` holds 8·K floats. Must be reached by every
// thread of the block when G > 1 (it synchronises the block).
template <int K>
__device__ __forceinline__ void legacy_group_sum(float (&s)[K], float* sh, int G) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = warp_sum(s[k]);
    if (G > 1) {
        const int w = threadIdx.x >> 5, first = w / G * G;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k * 8 + w] = s[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float t = 0.0f;
            for (int i = 0; i < G; ++i) t += sh[k * 8 + first + i];
            s[k] = t;
        }
        __syncthreads();
    }
}

// out = (x − μ)·rstd·γ + β, one row per group of G warps, the row kept in registers.
template <typename A, typename P, bool VEC, int M>
__device__ __forceinline__ void legacy_fwd_body(const A* __restrict__ x,
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
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (live && j < nv) xr[k] = load_vec<A, V>(x + base + (u64)j * V);
    }
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k) {
        if (live && k * gt + t < nv) {
#pragma unroll
            for (int e = 0; e < V; ++e) s[0] += to_f32(xr[k].v[e]);
        }
    }
    legacy_group_sum<1>(s, sh, G);
    const float mu = s[0] / (float)c;
    float q[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k) {
        if (live && k * gt + t < nv) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = to_f32(xr[k].v[e]) - mu;
                q[0] += d * d;
            }
        }
    }
    legacy_group_sum<1>(q, sh, G);
    const float rs = 1.0f / sqrtf(q[0] / (float)c + eps);
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (live && j < nv) {
            const Vec<P, V> g = load_vec<P, V>(gamma + j * V);
            const Vec<P, V> b = load_vec<P, V>(beta + j * V);
            Vec<A, V> o;
#pragma unroll
            for (int e = 0; e < V; ++e)
                o.v[e] = from_f32<A>((to_f32(xr[k].v[e]) - mu) * rs * to_f32(g.v[e]) +
                                     to_f32(b.v[e]));
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
// shared-memory slots of its own, leaving the registers to the x, dout and dx vectors of two
// rows: the next row's loads are issued before the current row is computed.
template <typename A, int V, int M> struct LegacyRow {
    Vec<A, V> x[M], d[M], g[M];  // x, dout, dx (before the update)
};

template <typename A, int V, int M>
__device__ __forceinline__ void legacy_load_row(LegacyRow<A, V, M>& r, const A* __restrict__ x,
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

template <typename A, typename P, bool VEC, int M>
__device__ __forceinline__ void legacy_bwd_body(
    const A* __restrict__ dout, const A* __restrict__ x, const P* __restrict__ gamma,
    const float* __restrict__ mean, const float* __restrict__ rstd, A* __restrict__ dx,
    float* __restrict__ pg, float* __restrict__ pb, int n, int c, int rpc, int G) {
    constexpr int V = VEC ? Pack<A>::N : 1;
    constexpr int E = M * V;  // elements per thread
    constexpr int B = 128;    // most threads per block (slot stride)
    __shared__ float sh[16];
    // sacc[slot·B + thread]: Σ dout · x̂; sacc[(E + slot)·B + thread]: Σ dout.
    __shared__ float sacc[2 * E * B];
    const int tid = threadIdx.x;
    const int gt = G * 32, groups = blockDim.x / gt;
    const int grp = tid / gt, t = tid - grp * gt;
    const int nv = c / V;
    const int r0 = blockIdx.x * rpc, r1 = min(n, r0 + rpc);
#pragma unroll
    for (int i = 0; i < 2 * E; ++i) sacc[i * B + tid] = 0.0f;
    const int iters = (rpc + groups - 1) / groups;
    LegacyRow<A, V, M> cur, nxt;
    {
        const int row = r0 + grp;
        legacy_load_row(cur, x, dout, dx, (u64)(row < r1 ? row : 0) * c, row < r1, t, gt, nv);
    }
    for (int it = 0; it < iters; ++it) {
        const int row = r0 + it * groups + grp;
        const bool live = row < r1;
        const u64 base = (u64)(live ? row : 0) * c;
        {
            const int nrow = row + groups;
            const bool nlive = it + 1 < iters && nrow < r1;
            legacy_load_row(nxt, x, dout, dx, (u64)(nlive ? nrow : 0) * c, nlive, t, gt, nv);
        }
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
        legacy_group_sum<2>(s, sh, G);
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
                    sacc[(k * V + e) * B + tid] += d * xh;
                    sacc[(E + k * V + e) * B + tid] += d;
                }
                store_vec<A, V>(dx + base + (u64)j * V, o);
            }
        }
        cur = nxt;
    }
    // Group 0 adds the row groups' sums in group order and writes the chunk's partial rows.
    __syncthreads();
    if (grp == 0) {
        const u64 prow = (u64)blockIdx.x * c;
#pragma unroll
        for (int k = 0; k < M; ++k) {
            const int j = k * gt + t;
            if (j < nv) {
                float ag[V], ab[V];
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
                }
                float* qg = pg + prow + (u64)j * V;
                float* qb = pb + prow + (u64)j * V;
                if constexpr (V % 4 == 0) {
#pragma unroll
                    for (int e = 0; e < V; e += 4) {
                        reinterpret_cast<float4*>(qg)[e / 4] =
                            make_float4(ag[e], ag[e + 1], ag[e + 2], ag[e + 3]);
                        reinterpret_cast<float4*>(qb)[e / 4] =
                            make_float4(ab[e], ab[e + 1], ab[e + 2], ab[e + 3]);
                    }
                } else {
#pragma unroll
                    for (int e = 0; e < V; ++e) {
                        qg[e] = ag[e];
                        qb[e] = ab[e];
                    }
                }
            }
        }
    }
}

// dgamma[col] += Σ_k pg[k·c + col] and dbeta[col] += Σ_k pb[k·c + col] (blockIdx.y picks
// which).
// Block (32, 32), grid (⌈c / 32⌉, 2): thread row y adds chunks y, y + 32, ... in order, then the
// 32 sums are added in y order.
template <typename G>
__device__ __forceinline__ void legacy_finish_body(const float* __restrict__ pg,
                                                              const float* __restrict__ pb,
                                                              G* __restrict__ dgamma,
                                                              G* __restrict__ dbeta, int chunks,
                                                              int c) {
    __shared__ float sh[32][33];
    const float* part = blockIdx.y == 0 ? pg : pb;
    G* out = blockIdx.y == 0 ? dgamma : dbeta;
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

extern "C" __global__ void __launch_bounds__(256)
    layernorm_legacy_fwd_bf16_f32_v2(const bf16_t* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, bf16_t* __restrict__ out,
                                     float* __restrict__ mean, float* __restrict__ rstd, int n,
                                     int c, float eps, int G) {
    legacy_fwd_body<bf16_t, float, true, 2>(x, gamma, beta, out, mean, rstd, n, c, eps, G);
}
extern "C" __global__ void __launch_bounds__(256)
    layernorm_legacy_fwd_bf16_f32_v3(const bf16_t* __restrict__ x, const float* __restrict__ gamma,
                                     const float* __restrict__ beta, bf16_t* __restrict__ out,
                                     float* __restrict__ mean, float* __restrict__ rstd, int n,
                                     int c, float eps, int G) {
    legacy_fwd_body<bf16_t, float, true, 3>(x, gamma, beta, out, mean, rstd, n, c, eps, G);
}
extern "C" __global__ void __launch_bounds__(128, 4) layernorm_legacy_bwd_bf16_f32_v2(
    const bf16_t* __restrict__ dout, const bf16_t* __restrict__ x, const float* __restrict__ gamma,
    const float* __restrict__ mean, const float* __restrict__ rstd, bf16_t* __restrict__ dx,
    float* __restrict__ pg, float* __restrict__ pb, int n, int c, int rpc, int G) {
    legacy_bwd_body<bf16_t, float, true, 2>(dout, x, gamma, mean, rstd, dx, pg, pb, n, c, rpc, G);
}
extern "C" __global__ void __launch_bounds__(128, 4) layernorm_legacy_bwd_bf16_f32_v3(
    const bf16_t* __restrict__ dout, const bf16_t* __restrict__ x, const float* __restrict__ gamma,
    const float* __restrict__ mean, const float* __restrict__ rstd, bf16_t* __restrict__ dx,
    float* __restrict__ pg, float* __restrict__ pb, int n, int c, int rpc, int G) {
    legacy_bwd_body<bf16_t, float, true, 3>(dout, x, gamma, mean, rstd, dx, pg, pb, n, c, rpc, G);
}
extern "C" __global__ void layernorm_legacy_finish_f32(const float* __restrict__ pg,
                                                       const float* __restrict__ pb,
                                                       float* __restrict__ dgamma,
                                                       float* __restrict__ dbeta, int chunks,
                                                       int c) {
    legacy_finish_body(pg, pb, dgamma, dbeta, chunks, c);
}
