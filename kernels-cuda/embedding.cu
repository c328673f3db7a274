// Token + position embedding, forward and backward.
//
// Backward is deterministic without atomics:
//   1. embedding_sort_positions: a stable counting sort of the positions by token id (each
//      position's rank is "tokens smaller than mine + equal tokens before me"), O(n²/256) integer
//      work in shared-memory tiles — about 67M compares for n = 8192 tokens.
//   2. embedding_backward_wte: one block per (run of equal tokens, column tile) sums the dout rows
//      of that token in position order and adds the result to dwte once.
//   3. The position gradient Σ_b dout[b, t, :] is a column sum of dout viewed as b × (t·c),
//      done with colsum_partial/colsum_finish from reduce.cu.
// Token ids outside [0, vocab) contribute nothing (the forward pass treats their wte row as 0)
// and set bit 1 of the device's error word, which the host reports at the next synchronize.
#include "common.cuh"

// out[r, :] = wte[tokens[r], :] + wpe[r % t, :]; one block per row r of the b·t rows.
template <typename A, typename P>
__device__ __forceinline__ void embedding_forward_body(const int* __restrict__ tokens,
                                                       const P* __restrict__ wte,
                                                       const P* __restrict__ wpe,
                                                       A* __restrict__ out, int t, int c,
                                                       int vocab, unsigned int* err) {
    const u64 row = blockIdx.x;
    const int tok = tokens[row];
    const bool valid = tok >= 0 && tok < vocab;
    if (!valid && threadIdx.x == 0) atomicOr(err, 1u);
    const P* w = wte + (u64)(valid ? tok : 0) * c;
    const P* p = wpe + (u64)(row % t) * c;
    A* o = out + row * c;
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
        const float e = valid ? to_f32(w[j]) : 0.0f;
        o[j] = from_f32<A>(e + to_f32(p[j]));
    }
}

#define EMBEDDING_FORWARD(A, SA, P, SP)                                                       \
    extern "C" __global__ void embedding_forward_##SA##_##SP(                                 \
        const int* __restrict__ tokens, const P* __restrict__ wte, const P* __restrict__ wpe, \
        A* __restrict__ out, int t, int c, int vocab, unsigned int* err) {                    \
        embedding_forward_body(tokens, wte, wpe, out, t, c, vocab, err);                      \
    }
FOR_ACT_AND_WIDE(EMBEDDING_FORWARD)

// sorted[rank(i)] = i, where rank orders positions by (token, position). blockDim.x = 256.
extern "C" __global__ void embedding_sort_positions(const int* __restrict__ tokens,
                                                    int* __restrict__ sorted, int n) {
    __shared__ int tile[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int tok = i < n ? tokens[i] : 0;
    int less = 0, equal_before = 0;
    for (int base = 0; base < n; base += 256) {
        __syncthreads();
        if (base + (int)threadIdx.x < n) tile[threadIdx.x] = tokens[base + threadIdx.x];
        __syncthreads();
        const int m = n - base < 256 ? n - base : 256;
        for (int k = 0; k < m; ++k) {
            const int other = tile[k];
            less += other < tok;
            equal_before += (other == tok) & (base + k < i);
        }
    }
    if (i < n) sorted[less + equal_before] = i;
}

// grid (n, ceil(c / blockDim.x)): block s handles sorted position s if it starts a run of equal
// tokens; it sums the run's dout rows (in position order) and adds the sum to dwte once.
template <typename A, typename G>
__device__ __forceinline__ void embedding_backward_wte_body(const int* __restrict__ tokens,
                                                            const int* __restrict__ sorted,
                                                            const A* __restrict__ dout,
                                                            G* __restrict__ dwte, int n, int c,
                                                            int vocab, unsigned int* err) {
    const int s = blockIdx.x;
    const int tok = tokens[sorted[s]];
    if (s > 0 && tokens[sorted[s - 1]] == tok) return;
    if (tok < 0 || tok >= vocab) {
        if (threadIdx.x == 0 && blockIdx.y == 0) atomicOr(err, 1u);
        return;
    }
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float acc = 0.0f;
    for (int k = s; k < n; ++k) {
        const int pos = sorted[k];
        if (tokens[pos] != tok) break;
        acc += to_f32(dout[(u64)pos * c + col]);
    }
    G* w = dwte + (u64)tok * c + col;
    *w = from_f32<G>(to_f32(*w) + acc);
}

#define EMBEDDING_BACKWARD(A, SA, G, SG)                                                      \
    extern "C" __global__ void embedding_backward_wte_##SA##_##SG(                            \
        const int* __restrict__ tokens, const int* __restrict__ sorted,                       \
        const A* __restrict__ dout, G* __restrict__ dwte, int n, int c, int vocab,            \
        unsigned int* err) {                                                                  \
        embedding_backward_wte_body(tokens, sorted, dout, dwte, n, c, vocab, err);            \
    }
FOR_ACT_AND_WIDE(EMBEDDING_BACKWARD)
