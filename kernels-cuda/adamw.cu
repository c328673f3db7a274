// Fused AdamW on f32 master weights with f32 moments.
//
//   g = grad · grad_scale;  m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g²
//   param −= lr · ((m / bc1) / (√(v / bc2) + ε) + wd · param)
//
// `copy` (nullable) receives the updated weights in its own dtype (the low-precision working
// copy). Entries: adamw_<grad dtype>_<copy dtype>; with no copy any entry of the grad dtype
// works. Grid-stride loop, one element per thread per iteration (four f32 streams in, up to four
// out: bandwidth-bound). The multi-tensor adamw_multi below moves 4-element vectors instead.
#include "common.cuh"

// adamw_update (the update of one element) and AdamWConsts: common.cuh (fp8.cu's
// adamw_fp8_<D> kernels use them too).

template <typename G, typename C>
__device__ __forceinline__ void adamw_body(float* __restrict__ param, const G* __restrict__ grad,
                                           float* __restrict__ m, float* __restrict__ v,
                                           C* __restrict__ copy, u64 n, float lr, float beta1,
                                           float beta2, float eps, float weight_decay, float bc1,
                                           float bc2, float grad_scale) {
    AdamWConsts k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.eps = eps;
    k.lr = lr;
    k.bc1 = bc1;
    k.bc2 = bc2;
    k.grad_scale = grad_scale;
    k.weight_decay = weight_decay;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float mi = m[i], vi = v[i];
        const float p = adamw_update(to_f32(grad[i]), mi, vi, param[i], k);
        m[i] = mi;
        v[i] = vi;
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
// one tensor). The gradient factor is derived here from the global sum of squares
// (clip_grad_scale, common.cuh), so no value travels through the host.

struct AdamWChunk {
    u64 param, grad, m, v, copy;  // copy: 0 when none
    u64 offset;                   // first element of this chunk within the tensor
    unsigned int len;             // elements in this chunk
    int grad_dt, copy_dt;         // 0 f32, 1 bf16, 2 f16
    float weight_decay;
};


// Four consecutive elements in one access: 16 bytes of f32 (load4/store4, common.cuh), 8 bytes
// of bf16/f16 (below). The table holds plain addresses (generic pointers to device
// allocations, which equal their global addresses), so the accesses are spelled out as global
// ones.
template <typename T> __device__ __forceinline__ float4 load4(const T* p) {
    unsigned int lo, hi;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(lo), "=r"(hi) : "l"(p));
    T a, b, c, d;
    a.bits = (unsigned short)(lo & 0xffffu);
    b.bits = (unsigned short)(lo >> 16);
    c.bits = (unsigned short)(hi & 0xffffu);
    d.bits = (unsigned short)(hi >> 16);
    return make_float4(to_f32(a), to_f32(b), to_f32(c), to_f32(d));
}
template <typename T> __device__ __forceinline__ void store4(T* p, float4 x) {
    const unsigned int lo =
        (unsigned int)from_f32<T>(x.x).bits | ((unsigned int)from_f32<T>(x.y).bits << 16);
    const unsigned int hi =
        (unsigned int)from_f32<T>(x.z).bits | ((unsigned int)from_f32<T>(x.w).bits << 16);
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(lo), "r"(hi) : "memory");
}

// Four elements held in registers between the loads and the stores.
template <typename G> struct AdamWQuad {
    float4 p, g, m, v;
};

template <typename G>
__device__ __forceinline__ AdamWQuad<G> adamw_load4(const float* param, const G* grad,
                                                    const float* m, const float* v,
                                                    unsigned int i) {
    AdamWQuad<G> q;
    q.p = load4(param + i);
    q.g = load4(grad + i);
    q.m = load4(m + i);
    q.v = load4(v + i);
    return q;
}

template <typename G, typename C, bool COPY>
__device__ __forceinline__ void adamw_store4(AdamWQuad<G> q, float* param, float* m, float* v,
                                             C* copy, unsigned int i, const AdamWConsts& k) {
    float4 p;
    p.x = adamw_update(q.g.x, q.m.x, q.v.x, q.p.x, k);
    p.y = adamw_update(q.g.y, q.m.y, q.v.y, q.p.y, k);
    p.z = adamw_update(q.g.z, q.m.z, q.v.z, q.p.z, k);
    p.w = adamw_update(q.g.w, q.m.w, q.v.w, q.p.w, k);
    store4(m + i, q.m);
    store4(v + i, q.v);
    store4(param + i, p);
    if (COPY) store4(copy + i, p);
}

// One chunk (blockDim.x threads). When every stream is aligned for 4-element accesses (always so
// for whole allocations: they are 256-byte aligned and chunks start at multiples of 4 elements),
// thread t handles the 4-element groups t, t + blockDim.x, ... two at a time (all eight loads
// issued before the first store), then the last len mod 4 elements one each; otherwise every
// element one at a time. Every element gets the same arithmetic on either path.
template <typename G, typename C, bool COPY>
__device__ __forceinline__ void adamw_chunk(const AdamWChunk& c, const AdamWConsts& k) {
    float* param = (float*)c.param + c.offset;
    const G* grad = (const G*)c.grad + c.offset;
    float* m = (float*)c.m + c.offset;
    float* v = (float*)c.v + c.offset;
    C* copy = COPY ? (C*)c.copy + c.offset : nullptr;
    const unsigned int len = c.len, nt = blockDim.x;
    unsigned int tail = 0;
    const bool vec = (((u64)param | (u64)m | (u64)v) & 15) == 0 &&
                     ((u64)grad & (4 * sizeof(G) - 1)) == 0 &&
                     (!COPY || ((u64)copy & (4 * sizeof(C) - 1)) == 0);
    if (vec) {
        const unsigned int groups = len / 4;
        unsigned int q = threadIdx.x;
        for (; q + nt < groups; q += 2 * nt) {
            const AdamWQuad<G> a = adamw_load4(param, grad, m, v, 4 * q);
            const AdamWQuad<G> b = adamw_load4(param, grad, m, v, 4 * (q + nt));
            adamw_store4<G, C, COPY>(a, param, m, v, copy, 4 * q, k);
            adamw_store4<G, C, COPY>(b, param, m, v, copy, 4 * (q + nt), k);
        }
        if (q < groups) {
            const AdamWQuad<G> a = adamw_load4(param, grad, m, v, 4 * q);
            adamw_store4<G, C, COPY>(a, param, m, v, copy, 4 * q, k);
        }
        tail = 4 * groups;
    }
    for (unsigned int j = tail + threadIdx.x; j < len; j += nt) {
        float mj = m[j], vj = v[j];
        const float p = adamw_update(to_f32(grad[j]), mj, vj, param[j], k);
        m[j] = mj;
        v[j] = vj;
        param[j] = p;
        if (COPY) copy[j] = from_f32<C>(p);
    }
}

template <typename G>
__device__ __forceinline__ void adamw_chunk_copy(const AdamWChunk& c, const AdamWConsts& k) {
    if (c.copy == 0)
        adamw_chunk<G, float, false>(c, k);
    else if (c.copy_dt == 0)
        adamw_chunk<G, float, true>(c, k);
    else if (c.copy_dt == 1)
        adamw_chunk<G, bf16_t, true>(c, k);
    else
        adamw_chunk<G, f16_t, true>(c, k);
}

// scalars: [sum of squares of the gradients, lr, 1 − β1^t, 1 − β2^t] (duet_device::ADAMW_SCALARS).
// Block size: THREADS in multi.rs; the dtypes are uniform within a block, so the dispatch
// below costs nothing per element.
extern "C" __global__ void __launch_bounds__(256)
    adamw_multi(const AdamWChunk* __restrict__ chunks, const float* __restrict__ scalars,
                float beta1, float beta2, float eps, float max_norm, float loss_scale) {
    const AdamWChunk c = chunks[blockIdx.x];
    AdamWConsts k;
    k.grad_scale = clip_grad_scale(scalars[0], max_norm, loss_scale);
    k.lr = scalars[1];
    k.bc1 = scalars[2];
    k.bc2 = scalars[3];
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.eps = eps;
    k.weight_decay = c.weight_decay;
    if (c.grad_dt == 0)
        adamw_chunk_copy<float>(c, k);
    else if (c.grad_dt == 1)
        adamw_chunk_copy<bf16_t>(c, k);
    else
        adamw_chunk_copy<f16_t>(c, k);
}
