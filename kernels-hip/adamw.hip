// Fused AdamW on f32 master weights with f32 moments. Grid-stride over n. Entry names and
// arguments match kernels-cuda (which stamps copy types f32/f16/bf16; the FP8 copies are extra).
#include "duet_hip.h"

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * param); copy (if not null) = param.
// The update is adamw_update (duet_hip.h's shared math block): CUDA's roundings, pinned.
// Entry adamw_<grad dtype>_<copy dtype>.
// One element: m, v and the f32 weight updated, the copy (if not null) written in its dtype.
template <typename G, typename C>
DUET_DEV void duet_adamw_at(float* __restrict__ param, const G* __restrict__ grad,
                            float* __restrict__ m, float* __restrict__ v, C* __restrict__ copy,
                            duet_u64 i, const AdamWConsts& k) {
    float mi = m[i], vi = v[i];
    const float p = adamw_update(duet_ld(grad, i), mi, vi, param[i], k);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (copy) duet_st(copy, i, p);
}

#define DUET_ADAMW(GN, GT, CN, CT)                                                            \
    DUET_KERNEL adamw_##GN##_##CN(float* __restrict__ param, const GT* __restrict__ grad,      \
                                  float* __restrict__ m, float* __restrict__ v,                \
                                  CT* __restrict__ copy, duet_u64 n, float lr, float beta1,    \
                                  float beta2, float eps, float weight_decay, float bc1,       \
                                  float bc2, float grad_scale) {                               \
        AdamWConsts k;                                                                         \
        k.beta1 = beta1;                                                                       \
        k.beta2 = beta2;                                                                       \
        k.eps = eps;                                                                           \
        k.lr = lr;                                                                             \
        k.bc1 = bc1;                                                                           \
        k.bc2 = bc2;                                                                           \
        k.grad_scale = grad_scale;                                                             \
        k.weight_decay = weight_decay;                                                         \
        DUET_GRID_STRIDE(i, n) { duet_adamw_at(param, grad, m, v, copy, i, k); }               \
    }
#define DUET_ADAMW_FROM(GN, GT) DUET_FOR_FLOAT_X(DUET_ADAMW, GN, GT)
DUET_FOR_ACT(DUET_ADAMW_FROM)

// ------------------------------------------------------------------ multi-tensor AdamW
// One launch updates every parameter tensor: block k handles chunk k of the table (a piece of
// one tensor, ops/optim.rs), kernels-cuda/adamw.cu's adamw_multi with the same table layout. The
// gradient factor comes from the global sum of squares on the device (duet_clip_grad_scale), so
// nothing travels through the host and the step can be recorded in a graph. Each element gets
// adamw_update's arithmetic, so the results are CUDA's bits whatever the access pattern (CUDA
// moves 4-element vectors; here each thread takes the elements t, t + blockDim.x, ...).
struct DuetAdamWChunk {
    duet_u64 param, grad, m, v, copy;  // copy: 0 when none
    duet_u64 offset;                   // first element of this chunk within the tensor
    unsigned int len;                  // elements in this chunk
    int grad_dt, copy_dt;              // 0 f32, 1 bf16, 2 f16
    float weight_decay;
};

template <typename G, typename C>
DUET_DEV void duet_adamw_chunk(const DuetAdamWChunk& c, const AdamWConsts& k) {
    float* param = (float*)c.param + c.offset;
    const G* grad = (const G*)c.grad + c.offset;
    float* m = (float*)c.m + c.offset;
    float* v = (float*)c.v + c.offset;
    C* copy = c.copy ? (C*)c.copy + c.offset : nullptr;
    for (unsigned int j = threadIdx.x; j < c.len; j += blockDim.x)
        duet_adamw_at(param, grad, m, v, copy, j, k);
}

template <typename G> DUET_DEV void duet_adamw_chunk_copy(const DuetAdamWChunk& c, const AdamWConsts& k) {
    if (c.copy == 0 || c.copy_dt == 0)
        duet_adamw_chunk<G, float>(c, k);
    else if (c.copy_dt == 1)
        duet_adamw_chunk<G, duet_bf16>(c, k);
    else
        duet_adamw_chunk<G, duet_f16>(c, k);
}

// scalars: [sum of squares of the gradients, lr, 1 − β1^t, 1 − β2^t] (duet_device::ADAMW_SCALARS).
// Launch: one block of DUET_BLOCK per chunk.
DUET_KERNEL adamw_multi(const DuetAdamWChunk* __restrict__ chunks, const float* __restrict__ scalars,
                        float beta1, float beta2, float eps, float max_norm, float loss_scale) {
    const DuetAdamWChunk c = chunks[blockIdx.x];
    AdamWConsts k;
    k.grad_scale = duet_clip_grad_scale(scalars[0], max_norm, loss_scale);
    k.lr = scalars[1];
    k.bc1 = scalars[2];
    k.bc2 = scalars[3];
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.eps = eps;
    k.weight_decay = c.weight_decay;
    if (c.grad_dt == 0)
        duet_adamw_chunk_copy<float>(c, k);
    else if (c.grad_dt == 1)
        duet_adamw_chunk_copy<duet_bf16>(c, k);
    else
        duet_adamw_chunk_copy<duet_f16>(c, k);
}

// ------------------------------------------------------------------ AdamW writing FP8 codes
// adamw_clipped_fp8 (ops/optim.rs): block k updates tile k (32 x 32, clipped) of a weight that
// gets FP8 codes, with adamw_update's arithmetic, and quantises its working copy's value (the
// param's without a copy) from registers: the codes as fp8.hip's quantize_tiled_S_D writes them
// (the transpose through shared memory), amax[slot] = max(amax[slot], max |value|). The same
// bits as adamw_multi followed by quantize_fp8_many, without reading the copy back.
struct DuetAdamWFp8Tile {
    duet_u64 param, grad, m, v, copy;  // copy: 0 when none
    duet_u64 dst, dst_t;               // dst_t: 0 when none
    duet_u64 rows, cols;
    unsigned int r0, c0;
    int grad_dt, copy_dt, ddt;         // 0 f32, 1 bf16, 2 f16; codes 0 e4m3, 1 e5m2, 2/3 fnuz
    unsigned int slot;
    float weight_decay;
    unsigned int pad;
};

DUET_DEV float duet_ld_code(duet_u64 p, int dt, duet_u64 i) {
    if (dt == 0) return duet_ld((const float*)p, i);
    if (dt == 1) return duet_ld((const duet_bf16*)p, i);
    return duet_ld((const duet_f16*)p, i);
}

/// Stores v at p[i] in dtype dt and returns the stored value as f32.
DUET_DEV float duet_st_code(duet_u64 p, int dt, duet_u64 i, float v) {
    if (dt == 0) {
        duet_st((float*)p, i, v);
        return v;
    }
    if (dt == 1) {
        duet_st((duet_bf16*)p, i, v);
        return duet_ld((const duet_bf16*)p, i);
    }
    duet_st((duet_f16*)p, i, v);
    return duet_ld((const duet_f16*)p, i);
}

template <typename D>
DUET_DEV void duet_adamw_fp8_tile(const DuetAdamWFp8Tile& t, const AdamWConsts& k,
                                  const float* __restrict__ scale, float* __restrict__ amax) {
    __shared__ unsigned char tile[32][33];
    __shared__ float sh[DUET_MAX_GROUPS];
    const float s = scale[t.slot];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    float* param = (float*)t.param;
    float* m = (float*)t.m;
    float* v = (float*)t.v;
    D* dst = (D*)t.dst;
    D* dst_t = (D*)t.dst_t;
    float mx = 0.0f;
    for (int kk = ty; kk < 32; kk += DUET_BLOCK / 32) {
        const duet_u64 r = (duet_u64)t.r0 + kk, c = (duet_u64)t.c0 + tx;
        if (r < t.rows && c < t.cols) {
            const duet_u64 i = r * t.cols + c;
            float mi = m[i], vi = v[i];
            const float p = adamw_update(duet_ld_code(t.grad, t.grad_dt, i), mi, vi, param[i], k);
            m[i] = mi;
            v[i] = vi;
            param[i] = p;
            const float x = t.copy ? duet_st_code(t.copy, t.copy_dt, i, p) : p;
            mx = fmaxf(mx, fabsf(x));
            D q;
            duet_st(&q, 0, x * s);
            dst[i] = q;
            tile[kk][tx] = q.bits;
        }
    }
    __syncthreads();
    if (dst_t != nullptr) {
        for (int kk = ty; kk < 32; kk += DUET_BLOCK / 32) {
            const duet_u64 c = (duet_u64)t.c0 + kk, r = (duet_u64)t.r0 + tx;
            if (r < t.rows && c < t.cols) dst_t[c * t.rows + r].bits = tile[tx][kk];
        }
    }
    mx = duet_block_max(mx, sh);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax + t.slot), duet_f2u(mx));
}

DUET_KERNEL adamw_fp8_tiles(const DuetAdamWFp8Tile* __restrict__ tiles,
                            const float* __restrict__ scalars, float beta1, float beta2, float eps,
                            float max_norm, float loss_scale, const float* __restrict__ scale,
                            float* __restrict__ amax) {
    const DuetAdamWFp8Tile t = tiles[blockIdx.x];
    AdamWConsts k;
    k.grad_scale = duet_clip_grad_scale(scalars[0], max_norm, loss_scale);
    k.lr = scalars[1];
    k.bc1 = scalars[2];
    k.bc2 = scalars[3];
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.eps = eps;
    k.weight_decay = t.weight_decay;
    if (t.ddt == 0)
        duet_adamw_fp8_tile<duet_e4m3>(t, k, scale, amax);
    else if (t.ddt == 1)
        duet_adamw_fp8_tile<duet_e5m2>(t, k, scale, amax);
    else if (t.ddt == 2)
        duet_adamw_fp8_tile<duet_e4m3fnuz>(t, k, scale, amax);
    else
        duet_adamw_fp8_tile<duet_e5m2fnuz>(t, k, scale, amax);
}
