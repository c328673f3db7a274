// LayerNorm over the last dimension, forward and backward.
//
// Row kernels use one warp per row (8 rows per 256-thread block): loads are coalesced across
// the warp and the statistics are warp-shuffle reductions. The parameter gradients dgamma/dbeta
// are column sums over rows; they are computed deterministically in two passes
// (layernorm_dparams_partial here, colsum_finish in reduce.cu) with a partition fixed by the
// shape.
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
