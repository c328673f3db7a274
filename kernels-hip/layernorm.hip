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
// out itself is never written. Launch: grid ceil(n / 32), DUET_BLOCK threads.
template <typename T, typename P, typename D>
DUET_DEV void duet_ln_fp8(const T* __restrict__ x, const P* __restrict__ gamma,
                          const P* __restrict__ beta, float* __restrict__ mean,
                          float* __restrict__ rstd, D* __restrict__ dst, D* __restrict__ dst_t,
                          int n, int c, float eps, const float* __restrict__ scale,
                          float* __restrict__ amax) {
    __shared__ float mus[32], rss[32];
    __shared__ unsigned char tile[32][33];
    __shared__ float sh[DUET_MAX_GROUPS];
    const int lane = threadIdx.x & 31, grp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * 32;
    for (int k = grp; k < 32; k += DUET_BLOCK / 32) {
        const int row = r0 + k;
        if (row >= n) break;
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
        float* __restrict__ amax) {                                                               \
        duet_ln_fp8<T, P, D>(x, gamma, beta, mean, rstd, dst, dst_t, n, c, eps, scale, amax);     \
    }
#define DUET_LN_FP8(N, T, PN, P)                                                                \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e4m3, duet_e4m3)                                              \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e5m2, duet_e5m2)                                              \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e4m3fnuz, duet_e4m3fnuz)                                      \
    DUET_LN_FP8_ONE(N, T, PN, P, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT_AND_WIDE(DUET_LN_FP8)
