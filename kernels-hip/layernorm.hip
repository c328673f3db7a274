// LayerNorm over the last dimension, forward and backward. One block of DUET_BLOCK threads per
// row for the row statistics (wavefront reductions, then across the block's waves); the parameter
// gradients are column sums in two deterministic passes. Entry names and arguments match
// kernels-cuda.
#include "duet_hip.h"

// out = (x - mean) * rstd * gamma + beta; saves mean, rstd (f32). Launch: grid (n), block 256.
#define DUET_LN_FWD(N, T, PN, P)                                                                       \
    DUET_KERNEL layernorm_forward_##N##_##PN(const T* __restrict__ x, const P* __restrict__ gamma,       \
                                      const P* __restrict__ beta, T* __restrict__ out,            \
                                      float* __restrict__ mean, float* __restrict__ rstd, int n,  \
                                      int c, float eps) {                                         \
        __shared__ float sh[DUET_MAX_WAVES];                                                      \
        const int row = blockIdx.x;                                                               \
        if (row >= n) return;                                                                     \
        const duet_u64 base = (duet_u64)row * c;                                                  \
        float s = 0.0f;                                                                           \
        for (int j = threadIdx.x; j < c; j += blockDim.x) s += duet_ld(x, base + j);              \
        const float mu = duet_block_sum(s, sh) / (float)c;                                        \
        float s2 = 0.0f;                                                                          \
        for (int j = threadIdx.x; j < c; j += blockDim.x) {                                       \
            const float d = duet_ld(x, base + j) - mu;                                            \
            s2 += d * d;                                                                          \
        }                                                                                         \
        const float var = duet_block_sum(s2, sh) / (float)c;                                      \
        const float rs = 1.0f / sqrtf(var + eps);                                                 \
        for (int j = threadIdx.x; j < c; j += blockDim.x) {                                       \
            const float xn = (duet_ld(x, base + j) - mu) * rs;                                    \
            duet_st(out, base + j, xn * duet_ld(gamma, j) + duet_ld(beta, j));                    \
        }                                                                                         \
        if (threadIdx.x == 0) {                                                                   \
            mean[row] = mu;                                                                       \
            rstd[row] = rs;                                                                       \
        }                                                                                         \
    }
DUET_FOR_ACT_AND_WIDE(DUET_LN_FWD)

// dx += (g - mean(g) - xhat * mean(g * xhat)) * rstd with g = dout * gamma. Launch: grid (n).
#define DUET_LN_BWD_DX(N, T, PN, P)                                                                     \
    DUET_KERNEL layernorm_backward_dx_##N##_##PN(const T* __restrict__ dout, const T* __restrict__ x,     \
                                          const P* __restrict__ gamma,                             \
                                          const float* __restrict__ mean,                          \
                                          const float* __restrict__ rstd, T* __restrict__ dx,      \
                                          int n, int c) {                                          \
        __shared__ float sh[DUET_MAX_WAVES];                                                       \
        const int row = blockIdx.x;                                                                \
        if (row >= n) return;                                                                      \
        const duet_u64 base = (duet_u64)row * c;                                                   \
        const float mu = mean[row], rs = rstd[row];                                                \
        float sg = 0.0f, sgx = 0.0f;                                                               \
        for (int j = threadIdx.x; j < c; j += blockDim.x) {                                        \
            const float g = duet_ld(dout, base + j) * duet_ld(gamma, j);                           \
            sg += g;                                                                               \
            sgx += g * (duet_ld(x, base + j) - mu) * rs;                                           \
        }                                                                                          \
        const float mg = duet_block_sum(sg, sh) / (float)c;                                        \
        const float mgx = duet_block_sum(sgx, sh) / (float)c;                                      \
        for (int j = threadIdx.x; j < c; j += blockDim.x) {                                        \
            const float g = duet_ld(dout, base + j) * duet_ld(gamma, j);                           \
            const float xh = (duet_ld(x, base + j) - mu) * rs;                                     \
            duet_st(dx, base + j, duet_ld(dx, base + j) + (g - mg - xh * mgx) * rs);               \
        }                                                                                          \
    }
DUET_FOR_ACT_AND_WIDE(DUET_LN_BWD_DX)

// dgamma/dbeta, pass 1: pg[k * c + j] = sum of dout * xhat and pb[k * c + j] = sum of dout over
// the rows of chunk k. Launch: grid (ceil(c / DUET_BLOCK), chunks), block DUET_BLOCK. Pass 2 is
// colsum_finish (reduce.hip) into dgamma and into dbeta.
#define DUET_LN_DPARAMS(N, T)                                                                   \
    DUET_KERNEL layernorm_dparams_partial_##N(                                                    \
        const T* __restrict__ dout, const T* __restrict__ x, const float* __restrict__ mean,      \
        const float* __restrict__ rstd, float* __restrict__ pg, float* __restrict__ pb, int n,    \
        int c, int rows_per_chunk) {                                                              \
        const int j = blockIdx.x * blockDim.x + threadIdx.x;                                      \
        if (j >= c) return;                                                                       \
        const int r0 = blockIdx.y * rows_per_chunk;                                               \
        const int r1 = min(n, r0 + rows_per_chunk);                                               \
        float sgx = 0.0f, sg = 0.0f;                                                              \
        for (int r = r0; r < r1; ++r) {                                                           \
            const duet_u64 idx = (duet_u64)r * c + j;                                             \
            const float g = duet_ld(dout, idx);                                                   \
            sgx += g * (duet_ld(x, idx) - mean[r]) * rstd[r];                                     \
            sg += g;                                                                              \
        }                                                                                         \
        pg[(duet_u64)blockIdx.y * c + j] = sgx;                                                   \
        pb[(duet_u64)blockIdx.y * c + j] = sg;                                                    \
    }
DUET_FOR_ACT(DUET_LN_DPARAMS)
