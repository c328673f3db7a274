// LayerNorm over the last dimension, forward and backward. One block per row for the row
// reductions; the parameter gradients are column sums done in two deterministic passes.
#include "duet_hip.h"

// out = (x - mean) * rstd * gamma + beta; saves mean, rstd (f32). Launch: grid (n), block 256.
#define DUET_LN_FWD(N, T)                                                                       \
    DUET_KERNEL layernorm_forward_##N(const T* __restrict__ x, const T* __restrict__ gamma,       \
                                      const T* __restrict__ beta, T* __restrict__ out,            \
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
DUET_FOR_ACT(DUET_LN_FWD)

// dx += (g - mean(g) - xhat * mean(g * xhat)) * rstd with g = dout * gamma. Launch: grid (n).
#define DUET_LN_BWD_DX(N, T)                                                                     \
    DUET_KERNEL layernorm_backward_dx_##N(const T* __restrict__ dout, const T* __restrict__ x,     \
                                          const T* __restrict__ gamma,                             \
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
DUET_FOR_ACT(DUET_LN_BWD_DX)

// Pass 1 of dgamma/dbeta: partial[k, j] = sum over rows of chunk k of dout*xhat (first c floats of
// the chunk's slot) and dout (next c floats). Launch: grid (ceil(c/256), chunks), block 256;
// partial holds chunks * 2c floats; chunk k covers rows [k*rows_per_chunk, ...).
#define DUET_LN_BWD_PARTIAL(N, T)                                                               \
    DUET_KERNEL layernorm_backward_partial_##N(                                                   \
        const T* __restrict__ dout, const T* __restrict__ x, const float* __restrict__ mean,      \
        const float* __restrict__ rstd, float* __restrict__ partial, int n, int c,                \
        int rows_per_chunk) {                                                                     \
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
        float* slot = partial + (duet_u64)blockIdx.y * 2 * c;                                     \
        slot[j] = sgx;                                                                            \
        slot[c + j] = sg;                                                                         \
    }
DUET_FOR_ACT(DUET_LN_BWD_PARTIAL)

// Pass 2: dgamma[j] += sum_k partial[k, j]; dbeta[j] += sum_k partial[k, c + j], k in order.
// Grid-stride over c.
#define DUET_LN_BWD_PARAMS(N, T)                                                                \
    DUET_KERNEL layernorm_backward_params_##N(const float* __restrict__ partial,                 \
                                              T* __restrict__ dgamma, T* __restrict__ dbeta,      \
                                              int c, int chunks) {                                \
        DUET_GRID_STRIDE(j, (duet_u64)c) {                                                        \
            float a = 0.0f, b = 0.0f;                                                             \
            for (int k = 0; k < chunks; ++k) {                                                    \
                a += partial[(duet_u64)k * 2 * c + j];                                            \
                b += partial[(duet_u64)k * 2 * c + c + j];                                        \
            }                                                                                     \
            duet_st(dgamma, j, duet_ld(dgamma, j) + a);                                           \
            duet_st(dbeta, j, duet_ld(dbeta, j) + b);                                             \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_LN_BWD_PARAMS)
