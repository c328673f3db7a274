// Fused softmax + cross-entropy over logits (n rows of ld ≥ v; only the first v are the
// vocabulary's, the rest a padding that takes no part and gets a zero gradient) with i32 targets.
//
// One block per row; the host picks the block size from v (one warp for the 96-token vocabulary,
// up to 1024 threads for large vocabularies). Max and sum are block reductions in f32.
// A negative target is ignored (loss 0, gradient 0). A target ≥ v is invalid: its loss is NaN,
// its gradient row is 0, and it sets bit 2 of the device's error word, which the host reports at
// the next synchronize. Every rounding is explicit and e^x, ln x are duet_exp_f32, duet_log_f32
// (common.cuh's shared math), so kernels-hip/cross_entropy.hip computes the same bits.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void cross_entropy_body(const T* __restrict__ logits,
                                                   const int* __restrict__ targets,
                                                   float* __restrict__ losses,
                                                   T* __restrict__ dlogits, int v, int ld,
                                                   float grad_scale, unsigned int* err) {
    __shared__ float sh[32];
    const u64 row = blockIdx.x;
    const T* x = logits + row * ld;
    float mx = NEG_INF;
    for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, to_f32(x[j]));
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        sum = __fadd_rn(sum, duet_exp_f32(__fsub_rn(to_f32(x[j]), mx)));
    sum = block_sum(sum, sh);
    const int tgt = targets[row];
    const bool valid = tgt >= 0 && tgt < v;
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (valid) loss = __fsub_rn(__fadd_rn(duet_log_f32(sum), mx), to_f32(x[tgt]));
        else if (tgt >= v) {
            loss = __int_as_float(0x7fc00000);
            atomicOr(err, 2u);
        }
        losses[row] = loss;
    }
    if (dlogits != nullptr) {
        T* d = dlogits + row * ld;
        for (int j = threadIdx.x; j < ld; j += blockDim.x) {
            float g = 0.0f;
            if (valid && j < v) {
                const float p = __fdiv_rn(duet_exp_f32(__fsub_rn(to_f32(x[j]), mx)), sum);
                g = __fmul_rn(__fsub_rn(p, j == tgt ? 1.0f : 0.0f), grad_scale);
            }
            d[j] = from_f32<T>(g);
        }
    }
}

#define CROSS_ENTROPY(T, S)                                                                   \
    extern "C" __global__ void cross_entropy_##S(const T* __restrict__ logits,                \
                                                 const int* __restrict__ targets,             \
                                                 float* __restrict__ losses,                  \
                                                 T* __restrict__ dlogits, int v, int ld,      \
                                                 float grad_scale, unsigned int* err) {       \
        cross_entropy_body(logits, targets, losses, dlogits, v, ld, grad_scale, err);         \
    }
FOR_FLOAT(CROSS_ENTROPY)

// The same with the gradient written over the logits (llm.c's fused classifier: no second
// n × ld buffer). Every thread reads its elements for the max and the sum before the block
// reductions' barriers and overwrites them only after; the target's logit is read before the
// first barrier. The same arithmetic, so the same bits, as cross_entropy's dlogits.
template <typename T>
__device__ __forceinline__ void cross_entropy_in_place_body(T* logits,
                                                            const int* __restrict__ targets,
                                                            float* __restrict__ losses, int v,
                                                            int ld, float grad_scale,
                                                            unsigned int* err) {
    __shared__ float sh[32];
    const u64 row = blockIdx.x;
    T* x = logits + row * ld;
    const int tgt = targets[row];
    const bool valid = tgt >= 0 && tgt < v;
    const float xt = (threadIdx.x == 0 && valid) ? to_f32(x[tgt]) : 0.0f;
    float mx = NEG_INF;
    for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, to_f32(x[j]));
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < v; j += blockDim.x)
        sum = __fadd_rn(sum, duet_exp_f32(__fsub_rn(to_f32(x[j]), mx)));
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (valid) loss = __fsub_rn(__fadd_rn(duet_log_f32(sum), mx), xt);
        else if (tgt >= v) {
            loss = __int_as_float(0x7fc00000);
            atomicOr(err, 2u);
        }
        losses[row] = loss;
    }
    for (int j = threadIdx.x; j < ld; j += blockDim.x) {
        float g = 0.0f;
        if (valid && j < v) {
            const float p = __fdiv_rn(duet_exp_f32(__fsub_rn(to_f32(x[j]), mx)), sum);
            g = __fmul_rn(__fsub_rn(p, j == tgt ? 1.0f : 0.0f), grad_scale);
        }
        x[j] = from_f32<T>(g);
    }
}

#define CROSS_ENTROPY_IN_PLACE(T, S)                                                          \
    extern "C" __global__ void cross_entropy_in_place_##S(T* logits,                          \
                                                          const int* __restrict__ targets,    \
                                                          float* __restrict__ losses, int v,  \
                                                          int ld, float grad_scale,           \
                                                          unsigned int* err) {                \
        cross_entropy_in_place_body(logits, targets, losses, v, ld, grad_scale, err);         \
    }
FOR_FLOAT(CROSS_ENTROPY_IN_PLACE)
