// Token + position embedding, forward and deterministic backward.
#include "duet_hip.h"

// out[p, :] = wte[tokens[p], :] + wpe[p % t, :] for p in [0, b*t). Grid-stride over b*t*c.
// A token outside [0, vocab) yields NaN in its row (the host cannot check without a sync).
#define DUET_EMB_FWD(N, T)                                                                    \
    DUET_KERNEL embedding_forward_##N(const int* __restrict__ tokens, const T* __restrict__ wte, \
                                      const T* __restrict__ wpe, T* __restrict__ out, int bt,   \
                                      int t, int c, int vocab) {                                \
        const duet_u64 n = (duet_u64)bt * c;                                                    \
        DUET_GRID_STRIDE(i, n) {                                                                \
            const int p = (int)(i / c), j = (int)(i % c);                                       \
            const int tok = tokens[p];                                                          \
            float v;                                                                            \
            if (tok < 0 || tok >= vocab)                                                        \
                v = duet_u2f(0x7fc00000u);                                                      \
            else                                                                                \
                v = duet_ld(wte, (duet_u64)tok * c + j) + duet_ld(wpe, (duet_u64)(p % t) * c + j); \
            duet_st(out, i, v);                                                                 \
        }                                                                                       \
    }
DUET_FOR_ACT(DUET_EMB_FWD)

// dwte[tok, :] += dout[p, :] for every position p holding tok. One block per position p; only the
// block of a token's first occurrence does the work, adding that token's rows in increasing p
// order (the CPU reference's order), so the result is deterministic and needs no atomics.
// Launch: grid (b*t), block DUET_BLOCK.
#define DUET_EMB_TILE 1024
#define DUET_EMB_BWD_WTE(N, T)                                                                 \
    DUET_KERNEL embedding_backward_wte_##N(const int* __restrict__ tokens,                      \
                                           const T* __restrict__ dout, T* __restrict__ dwte,    \
                                           int bt, int c, int vocab) {                          \
        __shared__ int tile[DUET_EMB_TILE];                                                     \
        const int p = blockIdx.x;                                                               \
        const int tok = tokens[p];                                                              \
        if (tok < 0 || tok >= vocab) return;                                                    \
        int seen = 0;                                                                           \
        for (int q = threadIdx.x; q < p; q += blockDim.x) seen |= tokens[q] == tok;             \
        if (__syncthreads_or(seen)) return;                                                     \
        for (int j0 = 0; j0 < c; j0 += blockDim.x) {                                            \
            const int j = j0 + threadIdx.x;                                                     \
            float acc = j < c ? duet_ld(dwte, (duet_u64)tok * c + j) : 0.0f;                    \
            for (int q0 = p; q0 < bt; q0 += DUET_EMB_TILE) {                                    \
                const int len = min(DUET_EMB_TILE, bt - q0);                                    \
                __syncthreads();                                                                \
                for (int k = threadIdx.x; k < len; k += blockDim.x) tile[k] = tokens[q0 + k];   \
                __syncthreads();                                                                \
                if (j < c)                                                                      \
                    for (int k = 0; k < len; ++k)                                               \
                        if (tile[k] == tok) acc += duet_ld(dout, (duet_u64)(q0 + k) * c + j);   \
            }                                                                                   \
            if (j < c) duet_st(dwte, (duet_u64)tok * c + j, acc);                               \
        }                                                                                       \
    }
DUET_FOR_ACT(DUET_EMB_BWD_WTE)

// dwpe[tt, :] += sum over batch rows bb (in order) of dout[bb*t + tt, :]. Grid-stride over t*c.
#define DUET_EMB_BWD_WPE(N, T)                                                               \
    DUET_KERNEL embedding_backward_wpe_##N(const T* __restrict__ dout, T* __restrict__ dwpe,  \
                                           int b, int t, int c) {                             \
        const duet_u64 n = (duet_u64)t * c;                                                   \
        DUET_GRID_STRIDE(i, n) {                                                              \
            float acc = duet_ld(dwpe, i);                                                     \
            for (int bb = 0; bb < b; ++bb) acc += duet_ld(dout, (duet_u64)bb * n + i);        \
            duet_st(dwpe, i, acc);                                                            \
        }                                                                                     \
    }
DUET_FOR_ACT(DUET_EMB_BWD_WPE)
