// Token + position embedding, forward and deterministic backward. The position-embedding gradient
// is a column sum (reduce.hip: colsum over b rows of t*c columns).
#include "duet_hip.h"

// out[p, :] = wte[tokens[p], :] + wpe[p % t, :]. One block per position p: grid (b*t).
// A token outside [0, vocab) reads as a zero row, as on CUDA (the host checks the tokens on the
// stream and reports them; the CPU reference rejects such tokens with InvalidArgument).
#define DUET_EMB_FWD(AN, AT, PN, PT)                                                           \
    DUET_KERNEL embedding_forward_##AN##_##PN(const int* __restrict__ tokens,                    \
                                              const PT* __restrict__ wte,                        \
                                              const PT* __restrict__ wpe, AT* __restrict__ out,  \
                                              int t, int c, int vocab) {                         \
        const duet_u64 p = blockIdx.x;                                                           \
        const int tok = tokens[p];                                                               \
        const bool valid = tok >= 0 && tok < vocab;                                              \
        const duet_u64 w = (duet_u64)(valid ? tok : 0) * c, q = (p % t) * c;                     \
        for (int j = threadIdx.x; j < c; j += blockDim.x) {                                      \
            const float e = valid ? duet_ld(wte, w + j) : 0.0f;                 \
            duet_st(out, p * c + j, e + duet_ld(wpe, q + j));                                    \
        }                                                                                        \
    }
DUET_FOR_ACT_AND_WIDE(DUET_EMB_FWD)

// dwte[tok, :] += dout[p, :] for every position p holding tok (n = b*t positions). One block per
// position p (grid (n)); only the block of a token's first occurrence works, adding that token's
// rows to the f32 value of dwte[tok, :] in increasing p, the CPU reference's order. No atomics, so
// the result is deterministic and bit-identical to a sequential loop.
#define DUET_EMB_TILE 1024
#define DUET_EMB_BWD(AN, AT, GN, GT)                                                           \
    DUET_KERNEL embedding_backward_wte_##AN##_##GN(const int* __restrict__ tokens,               \
                                                   const AT* __restrict__ dout,                  \
                                                   GT* __restrict__ dwte, int n, int c,          \
                                                   int vocab) {                                  \
        __shared__ int tile[DUET_EMB_TILE];                                                      \
        const int p = blockIdx.x;                                                                \
        const int tok = tokens[p];                                                               \
        if (tok < 0 || tok >= vocab) return;                                                     \
        int seen = 0;                                                                            \
        for (int q = threadIdx.x; q < p; q += blockDim.x) seen |= tokens[q] == tok;              \
        if (__syncthreads_or(seen)) return;                                                      \
        for (int j0 = 0; j0 < c; j0 += blockDim.x) {                                             \
            const int j = j0 + threadIdx.x;                                                      \
            float acc = j < c ? duet_ld(dwte, (duet_u64)tok * c + j) : 0.0f;                     \
            for (int q0 = p; q0 < n; q0 += DUET_EMB_TILE) {                                      \
                const int len = min(DUET_EMB_TILE, n - q0);                                      \
                __syncthreads();                                                                 \
                for (int k = threadIdx.x; k < len; k += blockDim.x) tile[k] = tokens[q0 + k];    \
                __syncthreads();                                                                 \
                if (j < c)                                                                       \
                    for (int k = 0; k < len; ++k)                                                \
                        if (tile[k] == tok) acc += duet_ld(dout, (duet_u64)(q0 + k) * c + j);    \
            }                                                                                    \
            if (j < c) duet_st(dwte, (duet_u64)tok * c + j, acc);                                \
        }                                                                                        \
    }
DUET_FOR_ACT_AND_WIDE(DUET_EMB_BWD)

// The id check of every op that reads token ids or targets (HipDevice::queue_id_check): report
// keeps the smallest (position << 32) | id over the ids outside [0, limit) (negative ids allowed
// for targets: ignored rows), so the host reports the first bad one of each op at the next
// synchronize. Grid-stride over n < 2^32 ids; one 64-bit atomic per bad id, none otherwise.
DUET_KERNEL check_ids(const int* __restrict__ ids, duet_u64 n, int limit, int negative_ok,
                      unsigned long long* report) {
    DUET_GRID_STRIDE(i, n) {
        const int x = ids[i];
        const bool bad = negative_ok ? x >= limit : (x < 0 || x >= limit);
        if (bad) atomicMin(report, (i << 32) | (unsigned long long)(unsigned)x);
    }
}
