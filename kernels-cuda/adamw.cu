// Fused AdamW on f32 master weights with f32 moments.
//
//   g = grad · grad_scale;  m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   param −= lr · ((m / bc1) / (√(v / bc2) + ε) + wd · param)
//
// `copy` (nullable) receives the updated weights in its own dtype (the low-precision working
// copy). Entries: adamw_<grad dtype>_<copy dtype>; with no copy any entry of the grad dtype
// works. Grid-stride loop, one element per thread per iteration (four f32 streams in, up to four
// out: bandwidth-bound).
#include "common.cuh"

template <typename G, typename C>
__device__ __forceinline__ void adamw_body(float* __restrict__ param, const G* __restrict__ grad,
                                           float* __restrict__ m, float* __restrict__ v,
                                           C* __restrict__ copy, u64 n, float lr, float beta1,
                                           float beta2, float eps, float weight_decay, float bc1,
                                           float bc2, float grad_scale) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = to_f32(grad[i]) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / bc1;
        const float vhat = vi / bc2;
        float p = param[i];
        p -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
        param[i] = p;
        if (copy != nullptr) copy[i] = from_f32<C>(p);
    }
}

#define ADAMW(G, SG, C, SC)                                                                   \
    extern "C" __global__ void adamw_##SG##_##SC(                                             \
        float* __restrict__ param, const G* __restrict__ grad, float* __restrict__ m,         \
        float* __restrict__ v, C* __restrict__ copy, u64 n, float lr, float beta1,            \
        float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) { \
        adamw_body(param, grad, m, v, copy, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2, \
                   grad_scale);                                                               \
    }
FOR_FLOAT_PAIRS(ADAMW)

// ------------------------------------------------------------------ multi-tensor AdamW
// One launch updates every parameter tensor: block k handles chunk k of the table (a piece of
// one tensor). The gradient factor is derived here from the global sum of squares, exactly as
// duet_device::clip_grad_scale does on the host (f32 square root, f64 unscaling, one rounding),
// so no value travels through the host.

struct AdamWChunk {
    u64 param, grad, m, v, copy;  // copy: 0 when none
    u64 offset;                   // first element of this chunk within the tensor
    unsigned int len;             // elements in this chunk
    int grad_dt, copy_dt;         // 0 f32, 1 bf16, 2 f16
    float weight_decay;
};

__device__ __forceinline__ float clip_grad_scale(float norm_sq, float max_norm, float loss_scale) {
    const float raw = sqrtf(norm_sq);
    const float norm = (float)((double)raw / (double)loss_scale);
    const float coef = max_norm / (norm + 1e-6f);
    const float clip = (max_norm > 0.0f && coef < 1.0f) ? coef : 1.0f;
    return loss_scale == 1.0f ? clip : (float)((double)clip / (double)loss_scale);
}

// scalars: [sum of squares of the gradients, lr, 1 − β1^t, 1 − β2^t] (duet_device::ADAMW_SCALARS).
extern "C" __global__ void adamw_multi(const AdamWChunk* __restrict__ chunks,
                                       const float* __restrict__ scalars, float beta1,
                                       float beta2, float eps, float max_norm,
                                       float loss_scale) {
    const AdamWChunk c = chunks[blockIdx.x];
    const float grad_scale = clip_grad_scale(scalars[0], max_norm, loss_scale);
    const float lr = scalars[1], bc1 = scalars[2], bc2 = scalars[3];
    float* param = (float*)c.param;
    float* m = (float*)c.m;
    float* v = (float*)c.v;
    for (u64 j = threadIdx.x; j < c.len; j += blockDim.x) {
        const u64 i = c.offset + j;
        const float g = load_dt(c.grad, i, c.grad_dt) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * g;
        const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        const float mhat = mi / bc1;
        const float vhat = vi / bc2;
        float p = param[i];
        p -= lr * (mhat / (sqrtf(vhat) + eps) + c.weight_decay * p);
        param[i] = p;
        if (c.copy != 0) store_dt(c.copy, i, c.copy_dt, p);
    }
}
