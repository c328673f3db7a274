// Fused softmax + cross-entropy over logits (n rows of ld ≥ v; only the first v are the
// vocabulary's, the rest a padding that takes no part and gets a zero gradient) with i32 targets.
//
// One block per row; the host picks the block size from v (duet_gpu::cross_entropy_threads:
// one warp for the 96-token vocabulary, 1024 threads for large vocabularies). Row layout: the
// row is cut into groups of 8 consecutive elements, and thread t owns the groups t, t + B,
// t + 2B, ... (B threads); its partial max and sum run over its elements in that order, then
// the block reductions (f32). Groups are read with 128-bit accesses where the row is 16-byte
// aligned (the same elements in the same order otherwise, so the bits never depend on ld or on
// the alignment). e^x is duet_exp_fma_f32 and ln x duet_log_f32 (common.cuh's shared math), the
// probability e^(x − max) · (1 / sum). With `cached` (the host passes it where the row's groups,
// 16·sizeof(T) bytes each — 100.6 KB for GPT-2's 50257 bf16 logits — fit in the dynamic shared
// memory a block may have) the row is read from global memory once, into shared memory, and the
// max, the sum and the gradient are taken from there: one read and one write of the row instead
// of three reads and a write. The *_exp_* entry points (the host takes them where the row's values
// in f32, 32 bytes per group — 201 KB for GPT-2's vocabulary — fit) hold the row in f32 in shared
// memory and then each element's e^(x − max), so e^x is computed once per element instead of
// twice (the sum's and the gradient's). Every path takes the same
// elements in the same order and computes the same values: the same bits.
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

// Group g's 8 elements as stored (those at or past `lim` are not read: zero bits, which
// ce_to_f32 turns into −inf), and their f32 values as ce_load8 gives them.
template <typename T>
__device__ __forceinline__ Vec<T, 8> ce_load_raw(const T* __restrict__ x, int g, int lim, bool vec) {
    const int j0 = 8 * g;
    Vec<T, 8> r;
    if (vec && j0 + 8 <= lim) {
        r = load_vec<T, 8>(x + j0);
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) r.v[e] = j0 + e < lim ? x[j0 + e] : from_f32<T>(0.0f);
    }
    return r;
}
template <typename T>
__device__ __forceinline__ void ce_to_f32(const Vec<T, 8>& r, int g, int lim, float (&f)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = 8 * g + e < lim ? to_f32(r.v[e]) : NEG_INF;
}

// Groups a thread of the cached paths loads at once (its groups g0, g0 + B, g0 + 2B, ... with
// B threads) before it stores any: one load's latency per batch instead of one per group (with
// one group per load-then-store the logits cache ran slower than no cache: ce_bench, H100). The
// same groups in the same order as one at a time. The logits cache's kernels keep 2 blocks of
// 1024 threads per SM (32 registers a thread): 8 registers of raw data; the f32 cache's, one
// block per SM anyway (its shared memory), have 64: 32 registers of raw data.
template <typename T> constexpr int CE_BATCH_LOGITS = sizeof(T) == 2 ? 2 : 1;
template <typename T> constexpr int CE_BATCH_EXP = sizeof(T) == 2 ? 4 : 2;

template <typename T, int N>
__device__ __forceinline__ void ce_load_batch(const T* __restrict__ x, int g0, int ng, int lim,
                                              bool vec, Vec<T, 8> (&raw)[N]) {
#pragma unroll
    for (int u = 0; u < N; ++u) {
        const int g = g0 + u * (int)blockDim.x;
        if (g < ng) raw[u] = ce_load_raw(x, g, lim, vec);
    }
}

// The gradient of the 8 elements of group g from their e^(x − max) (`ex`; 0 past v), stored at
// d + 8g.
template <typename T>
__device__ __forceinline__ void ce_store_grad_e(T* d, int g, int v, int ld, bool dvec, bool valid,
                                                int tgt, float rinv, float grad_scale,
                                                const float (&ex)[8]) {
    Vec<T, 8> o;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int j = 8 * g + e;
        float gr = 0.0f;
        if (valid && j < v) {
            const float p = duet_fmul(ex[e], rinv);
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

// The gradient of the 8 elements of group g from their f32 values, stored at d + 8g: their
// e^(x − max) (only where the gradient uses it), then ce_store_grad_e.
template <typename T>
__device__ __forceinline__ void ce_store_grad(T* d, int g, int v, int ld, bool dvec, bool valid,
                                              int tgt, float mx, float rinv, float grad_scale,
                                              const float (&f)[8]) {
    float ex[8];
#pragma unroll
    for (int e = 0; e < 8; ++e)
        ex[e] = valid && 8 * g + e < v ? duet_exp_fma_f32(duet_fsub(f[e], mx)) : 0.0f;
    ce_store_grad_e(d, g, v, ld, dvec, valid, tgt, rinv, grad_scale, ex);
}

// The row's loss (thread 0 writes it) from its max, its sum and the target's logit.
__device__ __forceinline__ void ce_write_loss(float* __restrict__ losses, u64 row, int tgt, int v,
                                              bool valid, float mx, float sum, float xt,
                                              unsigned int* err) {
    if (threadIdx.x != 0) return;
    float loss = 0.0f;
    if (valid) loss = duet_fsub(duet_fadd(duet_log_f32(sum), mx), xt);
    else if (tgt >= v) {
        loss = __int_as_float(0x7fc00000);
        atomicOr(err, 2u);
    }
    losses[row] = loss;
}

// The cached path of cross_entropy_row: each thread copies its groups of the row into
// dynamic shared memory (`cache`, one Vec<T, 8> per group, at the group's index) with one read of
// global memory, before the first barrier, and takes the max, the sum and the gradient from
// there. A thread reads back only what it wrote itself, so no barrier guards the cache; in place
// the writes of the gradient never meet a read of the logits.
template <typename T>
__device__ __forceinline__ void cross_entropy_row_cached(const T* x, T* d, u64 row, int tgt,
                                                         bool valid, float xt, bool vec, int v,
                                                         int ld, float grad_scale,
                                                         float* __restrict__ losses,
                                                         unsigned int* err, float* sh,
                                                         Vec<T, 8>* cache) {
    const int ng = (v + 7) / 8;
    constexpr int N = CE_BATCH_LOGITS<T>;
    for (int g0 = threadIdx.x; g0 < ng; g0 += N * blockDim.x) {
        Vec<T, 8> raw[N];
        ce_load_batch<T, N>(x, g0, ng, v, vec, raw);
#pragma unroll
        for (int u = 0; u < N; ++u) {
            const int g = g0 + u * blockDim.x;
            if (g < ng) cache[g] = raw[u];
        }
    }
    float mx = NEG_INF;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        float f[8];
        ce_to_f32(cache[g], g, v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) mx = fmaxf(mx, f[e]);
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        float f[8];
        ce_to_f32(cache[g], g, v, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum = duet_fadd(sum, duet_exp_fma_f32(duet_fsub(f[e], mx)));
    }
    sum = block_sum(sum, sh);
    ce_write_loss(losses, row, tgt, v, valid, mx, sum, xt, err);
    if (d == nullptr) return;
    d += row * ld;
    const bool dvec = (reinterpret_cast<u64>(d) & 15u) == 0;
    const float rinv = duet_fdiv(1.0f, sum);
    const int ngl = (ld + 7) / 8;
    for (int g = threadIdx.x; g < ngl; g += blockDim.x) {
        float f[8];
        if (g < ng) {
            ce_to_f32(cache[g], g, v, f);
        } else {
            // The padding's groups (all past v): their gradient is 0.
#pragma unroll
            for (int e = 0; e < 8; ++e) f[e] = NEG_INF;
        }
        ce_store_grad(d, g, v, ld, dvec, valid, tgt, mx, rinv, grad_scale, f);
    }
}

// The f32 path of cross_entropy_row (the *_exp_* entry points): each thread reads its groups of
// the row from global memory once, as f32, into dynamic shared memory (group g's first four
// values at lo[g], its last four at hi[g] = lo[ng + g], so a warp's 16-byte accesses are
// consecutive), replaces them there by e^(x − max) while it sums them, and takes the gradient
// from those. As in the
// cached path a thread reads back only what it wrote itself, and in place the writes of the
// gradient come after every read of the logits (before the first barrier).
template <typename T>
__device__ __forceinline__ void cross_entropy_row_exp_cached(const T* x, T* d, u64 row, int tgt,
                                                             bool valid, float xt, bool vec, int v,
                                                             int ld, float grad_scale,
                                                             float* __restrict__ losses,
                                                             unsigned int* err, float* sh,
                                                             float4* lo) {
    const int ng = (v + 7) / 8;
    float4* hi = lo + ng;
    float mx = NEG_INF;
    constexpr int N = CE_BATCH_EXP<T>;
    for (int g0 = threadIdx.x; g0 < ng; g0 += N * blockDim.x) {
        Vec<T, 8> raw[N];
        ce_load_batch<T, N>(x, g0, ng, v, vec, raw);
#pragma unroll
        for (int u = 0; u < N; ++u) {
            const int g = g0 + u * blockDim.x;
            if (g < ng) {
                float f[8];
                ce_to_f32(raw[u], g, v, f);
#pragma unroll
                for (int e = 0; e < 8; ++e) mx = fmaxf(mx, f[e]);
                lo[g] = make_float4(f[0], f[1], f[2], f[3]);
                hi[g] = make_float4(f[4], f[5], f[6], f[7]);
            }
        }
    }
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        const float4 a = lo[g], b = hi[g];
        float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        // Past v: e^(−inf) = 0, which leaves the sum's bits as they are.
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            f[e] = duet_exp_fma_f32(duet_fsub(f[e], mx));
            sum = duet_fadd(sum, f[e]);
        }
        lo[g] = make_float4(f[0], f[1], f[2], f[3]);
        hi[g] = make_float4(f[4], f[5], f[6], f[7]);
    }
    sum = block_sum(sum, sh);
    ce_write_loss(losses, row, tgt, v, valid, mx, sum, xt, err);
    if (d == nullptr) return;
    d += row * ld;
    const bool dvec = (reinterpret_cast<u64>(d) & 15u) == 0;
    const float rinv = duet_fdiv(1.0f, sum);
    const int ngl = (ld + 7) / 8;
    for (int g = threadIdx.x; g < ngl; g += blockDim.x) {
        float ex[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (g < ng) {
            // (The padding's groups, all past v, keep 0: their gradient is 0.)
            const float4 a = lo[g], b = hi[g];
            ex[0] = a.x, ex[1] = a.y, ex[2] = a.z, ex[3] = a.w;
            ex[4] = b.x, ex[5] = b.y, ex[6] = b.z, ex[7] = b.w;
        }
        ce_store_grad_e(d, g, v, ld, dvec, valid, tgt, rinv, grad_scale, ex);
    }
}

// One row: the loss, and with `d` (which may be `x` itself: the in-place classifier) the
// gradient (softmax − onehot) · grad_scale over all ld columns (0 past v). In place, every
// thread reads its groups for the max and the sum before the block reductions' barriers and
// overwrites a group only after reading it again; the target's logit is read before the first
// barrier. So in place and out of place give the same bits.
// EXP: the f32 cache (`cached` 2; the *_exp entry points), else `cached` 1 or 0.
template <typename T, bool EXP>
__device__ __forceinline__ void cross_entropy_row(const T* x, T* d, const int* __restrict__ targets,
                                                  float* __restrict__ losses, int v, int ld,
                                                  float grad_scale, unsigned int* err,
                                                  int cached) {
    __shared__ float sh[32];
    const u64 row = blockIdx.x;
    x += row * ld;
    const int tgt = targets[row];
    const bool valid = tgt >= 0 && tgt < v;
    const float xt = (threadIdx.x == 0 && valid) ? to_f32(x[tgt]) : 0.0f;
    const bool vec = (reinterpret_cast<u64>(x) & 15u) == 0;
    const int ng = (v + 7) / 8;
    if (EXP || cached) {
        extern __shared__ __align__(16) unsigned char ce_cache[];
        if constexpr (EXP)
            cross_entropy_row_exp_cached<T>(x, d, row, tgt, valid, xt, vec, v, ld, grad_scale,
                                            losses, err, sh, reinterpret_cast<float4*>(ce_cache));
        else
            cross_entropy_row_cached<T>(x, d, row, tgt, valid, xt, vec, v, ld, grad_scale, losses,
                                        err, sh, reinterpret_cast<Vec<T, 8>*>(ce_cache));
        return;
    }
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
    ce_write_loss(losses, row, tgt, v, valid, mx, sum, xt, err);
    if (d == nullptr) return;
    d += row * ld;
    const bool dvec = (reinterpret_cast<u64>(d) & 15u) == 0;
    const float rinv = duet_fdiv(1.0f, sum);
    const int ngl = (ld + 7) / 8;
    for (int g = threadIdx.x; g < ngl; g += blockDim.x) {
        float f[8];
        ce_load8(x, g, v, vec, f);
        ce_store_grad(d, g, v, ld, dvec, valid, tgt, mx, rinv, grad_scale, f);
    }
}

// cross_entropy_T: `cached` 0 or 1; cross_entropy_exp_T: the f32 cache (`cached` ignored; one
// block per SM by its shared memory at large vocabularies, so 64 registers a thread).
#define CROSS_ENTROPY(T, S)                                                                   \
    extern "C" __global__ void __launch_bounds__(1024, 2)                                      \
        cross_entropy_##S(const T* __restrict__ logits, const int* __restrict__ targets,      \
                          float* __restrict__ losses, T* __restrict__ dlogits, int v, int ld, \
                          float grad_scale, unsigned int* err, int cached) {                  \
        cross_entropy_row<T, false>(logits, dlogits, targets, losses, v, ld, grad_scale, err,  \
                                    cached);                                                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(1024, 1)                                      \
        cross_entropy_exp_##S(const T* __restrict__ logits, const int* __restrict__ targets,  \
                              float* __restrict__ losses, T* __restrict__ dlogits, int v,     \
                              int ld, float grad_scale, unsigned int* err, int cached) {      \
        cross_entropy_row<T, true>(logits, dlogits, targets, losses, v, ld, grad_scale, err,   \
                                   cached);                                                    \
    }
FOR_FLOAT(CROSS_ENTROPY)

// The same with the gradient written over the logits (llm.c's fused classifier: no second
// n × ld buffer); the same bits as cross_entropy's dlogits.
#define CROSS_ENTROPY_IN_PLACE(T, S)                                                          \
    extern "C" __global__ void __launch_bounds__(1024, 2)                                      \
        cross_entropy_in_place_##S(T* logits, const int* __restrict__ targets,                \
                                   float* __restrict__ losses, int v, int ld,                 \
                                   float grad_scale, unsigned int* err, int cached) {         \
        cross_entropy_row<T, false>(logits, logits, targets, losses, v, ld, grad_scale, err,   \
                                    cached);                                                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(1024, 1)                                      \
        cross_entropy_in_place_exp_##S(T* logits, const int* __restrict__ targets,            \
                                       float* __restrict__ losses, int v, int ld,             \
                                       float grad_scale, unsigned int* err, int cached) {     \
        cross_entropy_row<T, true>(logits, logits, targets, losses, v, ld, grad_scale, err,    \
                                   cached);                                                    \
    }
FOR_FLOAT(CROSS_ENTROPY_IN_PLACE)
