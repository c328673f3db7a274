// Fused softmax + cross-entropy over logits (n rows of ld ≥ v; only the first v are the
// vocabulary's, the rest a padding that takes no part and gets a zero gradient) with i32 targets.
//
// One block per row; the host picks the block size from v (duet_device::cross_entropy_threads:
// one warp for the 96-token vocabulary, 1024 threads for large vocabularies). Row layout: the
// row is cut into groups of 8 consecutive elements, and thread t owns the groups t, t + B,
// t + 2B, ... (B threads); its partial max and sum run over its elements in that order, then
// the block reductions (f32). Groups are read with 128-bit accesses where the row is 16-byte
// aligned (the same elements in the same order otherwise, so the bits never depend on ld or on
// the alignment). e^x is duet_exp_fma_f32 and ln x duet_log_f32 (common.cuh's shared math), the
// probability e^(x − max) · (1 / sum): the kernel is bound by memory, not by its arithmetic.
// A negative target is ignored (loss 0, gradient 0). A target ≥ v is invalid: its loss is NaN,
// its gradient row is 0, and it sets bit 2 of the device's error word, which the host reports at
// the next synchronize. kernels-hip/cross_entropy.hip computes the same bits (scalar loads).
#include "common.cuh"

// The 8 elements of group g (elements 8g .. 8g + 7) as f32; those at or past `lim` read as −inf.
template <typename T>
__device__ __forceinline__ void ce_load8(const T* __restrict__ x, int g, int lim, bool vec,
                                         float (&f)[8]) {
    const int j0 = 8 * g;
    if (vec && j0 + 8 <= lim) {
        const Vec<T, 8> r = load_vec<T, 8>(x + j0);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = to_f32(r.v[e]);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = j0 + e < lim ? to_f32(x[j0 + e]) : NEG_INF;
    }
}

// One row: the loss, and with `d` (which may be `x` itself: the in-place classifier) the
// gradient (softmax − onehot) · grad_scale over all ld columns (0 past v). In place, every
// thread reads its groups for the max and the sum before the block reductions' barriers and
// overwrites a group only after reading it again; the target's logit is read before the first
// barrier. So in place and out of place give the same bits.
template <typename T>
__device__ __forceinline__ void cross_entropy_row(const T* x, T* d, const int* __restrict__ targets,
                                                  float* __restrict__ losses, int v, int ld,
                                                  float grad_scale, unsigned int* err) {
    __shared__ float sh[32];
    const u64 row = blockIdx.x;
    x += row * ld;
    const int tgt = targets[row];
    const bool valid = tgt >= 0 && tgt < v;
    const float xt = (threadIdx.x == 0 && valid) ? to_f32(x[tgt]) : 0.0f;
    const bool vec = (reinterpret_cast<u64>(x) & 15u) == 0;
    const int ng = (v + 7) / 8;
    float mx = NEG_INF;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        float f[8];
        ce_load8(x, g, v, vec, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) mx = fmaxf(mx, f[e]);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        float f[8];
        ce_load8(x, g, v, vec, f);
        // Past v: e^(−inf) = 0, which leaves the sum's bits as they are.
#pragma unroll
        for (int e = 0; e < 8; ++e) sum = duet_fadd(sum, duet_exp_fma_f32(duet_fsub(f[e], mx)));
    }
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (valid) loss = duet_fsub(duet_fadd(duet_log_f32(sum), mx), xt);
        else if (tgt >= v) {
            loss = __int_as_float(0x7fc00000);
            atomicOr(err, 2u);
        }
        losses[row] = loss;
    }
    if (d == nullptr) return;
    d += row * ld;
    const bool dvec = (reinterpret_cast<u64>(d) & 15u) == 0;
    const float rinv = duet_fdiv(1.0f, sum);
    const int ngl = (ld + 7) / 8;
    for (int g = threadIdx.x; g < ngl; g += blockDim.x) {
        float f[8];
        ce_load8(x, g, v, vec, f);
        Vec<T, 8> o;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int j = 8 * g + e;
            float gr = 0.0f;
            if (valid && j < v) {
                const float p = duet_fmul(duet_exp_fma_f32(duet_fsub(f[e], mx)), rinv);
                gr = duet_fmul(duet_fsub(p, j == tgt ? 1.0f : 0.0f), grad_scale);
            }
            o.v[e] = from_f32<T>(gr);
        }
        if (dvec && 8 * g + 8 <= ld) {
            store_vec<T, 8>(d + 8 * g, o);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e)
                if (8 * g + e < ld) d[8 * g + e] = o.v[e];
        }
    }
}

#define CROSS_ENTROPY(T, S)                                                                   \
    extern "C" __global__ void __launch_bounds__(1024)                                        \
        cross_entropy_##S(const T* __restrict__ logits, const int* __restrict__ targets,      \
                          float* __restrict__ losses, T* __restrict__ dlogits, int v, int ld, \
                          float grad_scale, unsigned int* err) {                              \
        cross_entropy_row<T>(logits, dlogits, targets, losses, v, ld, grad_scale, err);       \
    }
FOR_FLOAT(CROSS_ENTROPY)

// The same with the gradient written over the logits (llm.c's fused classifier: no second
// n × ld buffer); the same bits as cross_entropy's dlogits.
#define CROSS_ENTROPY_IN_PLACE(T, S)                                                          \
    extern "C" __global__ void __launch_bounds__(1024)                                        \
        cross_entropy_in_place_##S(T* logits, const int* __restrict__ targets,                \
                                   float* __restrict__ losses, int v, int ld,                 \
                                   float grad_scale, unsigned int* err) {                     \
        cross_entropy_row<T>(logits, logits, targets, losses, v, ld, grad_scale, err);        \
    }
FOR_FLOAT(CROSS_ENTROPY_IN_PLACE)
