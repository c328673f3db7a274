// FP8 quantisation for delayed scaling (see duet_device::Device::quantize_fp8).
//
// dst = encode(src * scale[0]) with the codecs of common.cuh (round to nearest even, saturating,
// bit-identical to the CPU reference), and amax[0] = max(amax[0], max |src|) in the same pass.
// The amax is the one reduction with an atomic: a max is exact and order-independent, so the
// result is deterministic. NaN elements are skipped (fmaxf). |x| ≥ 0 compares like its bit
// pattern as an unsigned integer, so atomicMax on the bits is a float max.
#include "common.cuh"

__device__ __forceinline__ void record_amax(float m, float* amax) {
    atomicMax(reinterpret_cast<unsigned int*>(amax), __float_as_uint(m));
}

// Grid-stride version without a transposed copy; blockDim.x = 256.
template <typename S, typename D>
__device__ __forceinline__ void quantize_body(const S* __restrict__ src, D* __restrict__ dst,
                                              u64 n, const float* __restrict__ scale,
                                              float* __restrict__ amax) {
    __shared__ float sh[32];
    const float s = scale[0];
    const u64 stride = (u64)gridDim.x * blockDim.x;
    float m = 0.0f;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = to_f32(src[i]);
        m = fmaxf(m, fabsf(x));
        dst[i] = from_f32<D>(x * s);
    }
    m = block_max(m, sh);
    if (threadIdx.x == 0) record_amax(m, amax);
}

// 32 × 32 tiles with a (32, 8) block: writes dst (rows × cols) and its transpose dst_t
// (cols × rows) through shared memory, so both stores are coalesced.
template <typename S, typename D>
__device__ __forceinline__ void quantize_t_body(const S* __restrict__ src, D* __restrict__ dst,
                                                D* __restrict__ dst_t, u64 rows, u64 cols,
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
            const float x = to_f32(src[r * cols + c]);
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

#define QUANTIZE(S, SS, D, SD)                                                                \
    extern "C" __global__ void quantize_##SS##_##SD(const S* __restrict__ src,                 \
                                                    D* __restrict__ dst, u64 n,                \
                                                    const float* __restrict__ scale,           \
                                                    float* __restrict__ amax) {                \
        quantize_body(src, dst, n, scale, amax);                                              \
    }                                                                                         \
    extern "C" __global__ void quantize_t_##SS##_##SD(                                        \
        const S* __restrict__ src, D* __restrict__ dst, D* __restrict__ dst_t, u64 rows,     \
        u64 cols, const float* __restrict__ scale, float* __restrict__ amax) {               \
        quantize_t_body(src, dst, dst_t, rows, cols, scale, amax);                            \
    }
#define QUANTIZE_TO(S, SS)                                                                    \
    QUANTIZE(S, SS, e4m3_t, f8e4m3)                                                           \
    QUANTIZE(S, SS, e5m2_t, f8e5m2)                                                           \
    QUANTIZE(S, SS, e4m3fnuz_t, f8e4m3fnuz)                                                   \
    QUANTIZE(S, SS, e5m2fnuz_t, f8e5m2fnuz)
QUANTIZE_TO(float, f32)
QUANTIZE_TO(bf16_t, bf16)
QUANTIZE_TO(f16_t, f16)
