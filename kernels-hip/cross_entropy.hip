// Fused softmax + cross-entropy. One block per row: grid (n rows); the block size follows the
// vocabulary exactly as on CUDA (duet_gpu::cross_entropy_threads: one thread per group of 8
// logits in whole 32-lane groups, 32..1024; see ops/loss.rs), and so do the reductions and
// roundings: kernels-cuda/cross_entropy.cu's bits.
// Entry names and arguments match kernels-cuda, less its error word (the HIP backend checks the
// targets on the host side of the stream, ops/loss.rs) and its `cached` flag: HIP reads the row
// once per pass, where CUDA may keep it in shared memory (the same elements in the same order).
#include "duet_hip.h"

// Rows of ld >= v logits, of which the first v are the vocabulary's (the rest: padding, not read,
// gradient 0). losses[r] = logsumexp(logits[r, :v]) - logits[r, target]; with dlogits != null also
// dlogits[r, :v] = (softmax(logits[r, :v]) - onehot(target)) * grad_scale, dlogits[r, v:ld] = 0. A
// negative target gives loss 0 and a zero gradient row; a target >= v gives a NaN loss and a zero
// gradient row. Row layout as on CUDA: groups of 8 consecutive elements, thread t owns the groups
// t, t + B, ...; each thread's max and sum run over its elements in that order (elements past v
// read as -inf: e^(-inf) = 0 leaves the sum as it is), then the block reductions; the
// probability is e^(x - max) * (1 / sum). Scalar loads here (CUDA's 128-bit groups read the same
// elements in the same order).
template <typename T>
DUET_DEV void duet_cross_entropy_row(const T* logits, T* dlogits, const int* __restrict__ targets,
                                     float* __restrict__ losses, int v, int ld, float grad_scale) {
    __shared__ float sh[DUET_MAX_GROUPS];
    const duet_u64 row = blockIdx.x;
    const duet_u64 base = row * ld;
    const float ninf = -duet_u2f(0x7f800000u);
    const int ng = (v + 7) / 8;
    float mx = ninf;
    for (int g = threadIdx.x; g < ng; g += blockDim.x)
        for (int e = 0; e < 8; ++e) {
            const int j = 8 * g + e;
            mx = fmaxf(mx, j < v ? duet_ld(logits, base + j) : ninf);
        }
    mx = duet_block_max(mx, sh);
    float s = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x)
        for (int e = 0; e < 8; ++e) {
            const int j = 8 * g + e;
            const float x = j < v ? duet_ld(logits, base + j) : ninf;
            s = duet_fadd(s, duet_exp_fma_f32(duet_fsub(x, mx)));
        }
    s = duet_block_sum(s, sh);
    const int tgt = targets[row];
    const bool valid = tgt >= 0 && tgt < v;
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        if (valid)
            loss = duet_fsub(duet_fadd(duet_log_f32(s), mx), duet_ld(logits, base + tgt));
        else if (tgt >= v)
            loss = duet_u2f(0x7fc00000u);
        losses[row] = loss;
    }
    if (dlogits) {
        // In place (dlogits == logits) thread 0 must have read the target's logit for the loss
        // before another thread overwrites it; past this barrier each element is read and then
        // written by the same thread.
        __syncthreads();
        const float rinv = duet_fdiv(1.0f, s);
        const int ngl = (ld + 7) / 8;
        for (int g = threadIdx.x; g < ngl; g += blockDim.x)
            for (int e = 0; e < 8; ++e) {
                const int j = 8 * g + e;
                if (j >= ld) break;
                float gr = 0.0f;
                if (valid && j < v) {
                    const float p =
                        duet_fmul(duet_exp_fma_f32(duet_fsub(duet_ld(logits, base + j), mx)), rinv);
                    gr = duet_fmul(duet_fsub(p, j == tgt ? 1.0f : 0.0f), grad_scale);
                }
                duet_st(dlogits, base + j, gr);
            }
    }
}

#define DUET_CE(N, T)                                                                          \
    DUET_KERNEL_1024 cross_entropy_##N(const T* __restrict__ logits,                             \
                                       const int* __restrict__ targets,                          \
                                       float* __restrict__ losses, T* __restrict__ dlogits,      \
                                       int v, int ld, float grad_scale) {                        \
        duet_cross_entropy_row<T>(logits, dlogits, targets, losses, v, ld, grad_scale);          \
    }
DUET_FOR_ACT(DUET_CE)

// The same with the gradient written over the logits (llm.c's fused classifier: no second
// n × ld buffer); the same bits as cross_entropy's dlogits (kernels-cuda's
// cross_entropy_in_place_*).
#define DUET_CE_IN_PLACE(N, T)                                                                 \
    DUET_KERNEL_1024 cross_entropy_in_place_##N(T* logits, const int* __restrict__ targets,      \
                                                float* __restrict__ losses, int v, int ld,       \
                                                float grad_scale) {                              \
        duet_cross_entropy_row<T>(logits, logits, targets, losses, v, ld, grad_scale);           \
    }
DUET_FOR_ACT(DUET_CE_IN_PLACE)
