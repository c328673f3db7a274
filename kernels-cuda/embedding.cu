// Token + position embedding, forward and backward.
//
// Backward is deterministic without floating-point atomics:
//   1. A stable LSD radix sort of the positions by token id, 8 bits per pass (one pass for a
//      vocabulary below 256, two below 65536). Keys are the token ids, with ids outside
//      [0, vocab) replaced by `vocab` so they sort last; values are the positions. Each pass is
//      embedding_sort_scatter (plus embedding_sort_count when there is more than one tile of
//      EMB_TILE keys): a block ranks its tile with warp-private digit counts (ballots),
//      so equal digits keep their order, and places every key at
//          (# keys with a smaller digit) + (# equal digits in earlier tiles) + (rank in the tile).
//      Integer counts only, so the permutation is the same on every run.
//   2. The runs of equal valid tokens in the sorted order: (start, token) pairs and their count.
//      A single-pass sort writes them straight from its digit counts; otherwise
//      embedding_runs_count / embedding_runs_write find them in the sorted keys.
//   3. embedding_backward_wte: one warp per (run, column group) sums the run's dout rows in
//      ascending position order into a zeroed f32 register and adds that sum to dwte once:
//          dwte[tok, j] = dwte[tok, j] + (((0 + dout[p0, j]) + dout[p1, j]) + ...),  p0 < p1 < ...
//      This is exactly the order of the previous implementation (a per-run sequential sum, then
//      one update), so the results are bit-identical to it. Many rows are loaded before they
//      are added, so the loads overlap while the additions keep their order.
//   4. The position gradient Σ_b dout[b, t, :] is a column sum of dout viewed as b × (t·c),
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


// ------------------------------------------------------------------ backward: sort

#define EMB_SORT_THREADS 1024                          // 32 warps per sort block
#define EMB_ITEMS 8                                    // keys per lane
#define EMB_SEG (32 * EMB_ITEMS)                       // keys per warp (a contiguous segment)
#define EMB_TILE (EMB_SORT_THREADS * EMB_ITEMS)        // keys per block (8192)
#define EMB_RADIX 256
#define EMB_NO_DIGIT 256u                              // lanes past the end of the keys

// The tile's keys (mapped token ids on the first pass) and values (positions), with their
// digits; lane l of warp w holds keys tile + w·EMB_SEG + j·32 + l, j < EMB_ITEMS, so the
// order (warp, j, lane) is the key order. Returns whether a lane met an out-of-range token.
__device__ __forceinline__ bool emb_load_tile(const int* __restrict__ keys_in,
                                              const int* __restrict__ vals_in, int n, int shift,
                                              int first, int vocab, unsigned (&key)[EMB_ITEMS],
                                              int (&val)[EMB_ITEMS],
                                              unsigned (&digit)[EMB_ITEMS]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int base = blockIdx.x * EMB_TILE + warp * EMB_SEG + lane;
    bool bad = false;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) {
        const int i = base + j * 32;
        key[j] = 0;
        val[j] = 0;
        digit[j] = EMB_NO_DIGIT;
        if (i < n) {
            const int k = keys_in[i];
            if (first) {
                const bool ok = k >= 0 && k < vocab;
                bad |= !ok;
                key[j] = ok ? (unsigned)k : (unsigned)vocab;
                val[j] = i;
            } else {
                key[j] = (unsigned)k;
                if (vals_in) val[j] = vals_in[i];  // null: counting only
            }
            digit[j] = (key[j] >> shift) & (EMB_RADIX - 1);
        }
    }
    return bad;
}

// The lanes of the warp whose d (< 512) equals this lane's: nine ballots, one per bit (works on
// every architecture, unlike __match_any_sync).
__device__ __forceinline__ unsigned emb_peers(unsigned d) {
    unsigned m = 0xffffffffu;
#pragma unroll
    for (int b = 0; b < 9; ++b) {
        const unsigned bit = (d >> b) & 1u;
        const unsigned set = __ballot_sync(0xffffffffu, bit);
        m &= bit ? set : ~set;
    }
    return m;
}

// Sum over the warp of an unsigned count.
__device__ __forceinline__ unsigned emb_warp_sum(unsigned v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// wh[w][d] = how many keys of warp w's segment have digit d (wh must be zeroed before).
__device__ __forceinline__ void emb_count_warp(const unsigned (&digit)[EMB_ITEMS],
                                               unsigned (*wh)[EMB_RADIX]) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) {
        const unsigned d = digit[j];
        const unsigned peers = emb_peers(d);
        if (d != EMB_NO_DIGIT && lane == __ffs(peers) - 1) wh[warp][d] += __popc(peers);
        __syncwarp();
    }
}

// Exclusive prefix sum over the 256 values held by threads 0..255 (one each; other threads
// pass anything and get garbage). Every thread of the block must call it. `sh` holds 8
// unsigned; *total receives the sum (in every thread).
__device__ __forceinline__ unsigned emb_scan256(unsigned v, unsigned* sh, unsigned* total) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // sh may still be read by an earlier call
    if (warp < 8 && lane == 31) sh[warp] = x;
    __syncthreads();
    unsigned before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        const unsigned s = sh[w];
        if (w < warp) before += s;
        all += s;
    }
    *total = all;
    return before + x - v;
}

// Pass 1 of a multi-tile sort pass: hist[d · num_tiles + tile] = keys of the tile with digit d.
// Grid num_tiles, block EMB_SORT_THREADS.
extern "C" __global__ void __launch_bounds__(EMB_SORT_THREADS)
    embedding_sort_count(const int* __restrict__ keys_in, int n, int shift, int first,
                         int vocab, unsigned* __restrict__ hist, int num_tiles) {
    __shared__ unsigned wh[32][EMB_RADIX];
    for (int i = threadIdx.x; i < 32 * EMB_RADIX; i += blockDim.x) (&wh[0][0])[i] = 0;
    unsigned key[EMB_ITEMS], digit[EMB_ITEMS];
    int val[EMB_ITEMS];
    emb_load_tile(keys_in, nullptr, n, shift, first, vocab, key, val, digit);
    __syncthreads();
    emb_count_warp(digit, wh);
    __syncthreads();
    if (threadIdx.x < EMB_RADIX) {
        unsigned s = 0;
        for (int w = 0; w < 32; ++w) s += wh[w][threadIdx.x];
        hist[(u64)threadIdx.x * num_tiles + blockIdx.x] = s;
    }
}

// One stable pass: keys_out/vals_out[rank] = key/val (keys_out may be null). With
// num_tiles > 1, hist comes from embedding_sort_count of the same pass. With emit_runs (a
// single-pass sort, every key < 256), block 0 also writes the runs of valid tokens:
// run_start[r], run_tok[r] for r < *run_count, and run_start[*run_count] = number of valid keys.
// Grid num_tiles, block EMB_SORT_THREADS.
extern "C" __global__ void __launch_bounds__(EMB_SORT_THREADS) embedding_sort_scatter(
    const int* __restrict__ keys_in, const int* __restrict__ vals_in, int* __restrict__ keys_out,
    int* __restrict__ vals_out, int n, int shift, int first, int vocab,
    const unsigned* __restrict__ hist, int num_tiles, int emit_runs, int* __restrict__ run_count,
    int* __restrict__ run_start, int* __restrict__ run_tok, unsigned int* err) {
    __shared__ unsigned wh[32][EMB_RADIX];
    __shared__ unsigned s_part[2][4][EMB_RADIX];
    __shared__ unsigned s_base[EMB_RADIX];
    __shared__ unsigned s_scan[8];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = tid; i < 32 * EMB_RADIX; i += blockDim.x) (&wh[0][0])[i] = 0;
    unsigned key[EMB_ITEMS], digit[EMB_ITEMS];
    int val[EMB_ITEMS];
    const bool bad = emb_load_tile(keys_in, vals_in, n, shift, first, vocab, key, val, digit);
    if (__any_sync(0xffffffffu, bad) && lane == 0) atomicOr(err, 1u);
    __syncthreads();
    emb_count_warp(digit, wh);
    __syncthreads();

    // wh[w][d] becomes the keys with digit d in warps before w; tile_cnt the tile's total.
    unsigned tile_cnt = 0;
    if (tid < EMB_RADIX) {
        for (int w = 0; w < 32; ++w) {
            const unsigned c = wh[w][tid];
            wh[w][tid] = tile_cnt;
            tile_cnt += c;
        }
    }
    // total[d] over all tiles and before[d] over the tiles before this one.
    unsigned total = tile_cnt, before = 0;
    if (num_tiles > 1) {
        const int d = tid & (EMB_RADIX - 1), q = tid >> 8;
        unsigned tot = 0, bef = 0;
        for (int t = q; t < num_tiles; t += EMB_SORT_THREADS / EMB_RADIX) {
            const unsigned h = hist[(u64)d * num_tiles + t];
            tot += h;
            if (t < (int)blockIdx.x) bef += h;
        }
        s_part[0][q][d] = tot;
        s_part[1][q][d] = bef;
        __syncthreads();
        if (tid < EMB_RADIX) {
            total = s_part[0][0][tid] + s_part[0][1][tid] + s_part[0][2][tid] + s_part[0][3][tid];
            before = s_part[1][0][tid] + s_part[1][1][tid] + s_part[1][2][tid] + s_part[1][3][tid];
        }
    }
    unsigned all;
    const unsigned below = emb_scan256(total, s_scan, &all);  // keys with a smaller digit
    if (tid < EMB_RADIX) s_base[tid] = below + before;

    if (emit_runs && blockIdx.x == 0) {
        // Every key is a digit here: the nonempty digits below vocab are the runs, in order.
        const bool run = tid < vocab && total > 0;  // vocab < 256 here
        unsigned runs;
        const unsigned r = emb_scan256(run ? 1u : 0u, s_scan, &runs);
        if (run) {
            run_start[r] = (int)below;
            run_tok[r] = tid;
        }
        // The invalid keys (== vocab) come last: the valid ones end where they start.
        if (tid == vocab) {
            run_start[runs] = (int)below;
            *run_count = (int)runs;
        }
    }
    __syncthreads();
    for (int i = tid; i < 32 * EMB_RADIX; i += blockDim.x)
        (&wh[0][0])[i] += s_base[i & (EMB_RADIX - 1)];
    __syncthreads();

    const unsigned lanes_below = (1u << lane) - 1u;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) {
        const unsigned d = digit[j];
        const unsigned peers = emb_peers(d);
        unsigned rank = 0;
        if (d != EMB_NO_DIGIT) rank = wh[warp][d] + __popc(peers & lanes_below);
        __syncwarp();
        if (d != EMB_NO_DIGIT && lane == __ffs(peers) - 1) wh[warp][d] += __popc(peers);
        __syncwarp();
        if (d != EMB_NO_DIGIT) {
            if (keys_out) keys_out[rank] = (int)key[j];
            vals_out[rank] = val[j];
        }
    }
}

// ------------------------------------------------------------------ backward: runs

// Sorted key i starts a run of a valid token.
__device__ __forceinline__ bool emb_run_start(const int* __restrict__ keys, int i, int n,
                                              int vocab) {
    if (i >= n) return false;
    const int k = keys[i];
    return k < vocab && (i == 0 || keys[i - 1] != k);
}

// counts[tile] = runs starting in the tile (EMB_TILE keys). Grid num_tiles, block
// EMB_SORT_THREADS.
extern "C" __global__ void __launch_bounds__(EMB_SORT_THREADS)
    embedding_runs_count(const int* __restrict__ keys, int n, int vocab,
                         unsigned* __restrict__ counts) {
    __shared__ unsigned s_count;
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    const int i0 = blockIdx.x * EMB_TILE + threadIdx.x * EMB_ITEMS;
    unsigned f = 0;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) f += emb_run_start(keys, i0 + j, n, vocab);
    f = emb_warp_sum(f);
    if ((threadIdx.x & 31) == 0 && f) atomicAdd(&s_count, f);  // integer: exact
    __syncthreads();
    if (threadIdx.x == 0) counts[blockIdx.x] = s_count;
}

// Writes the runs of the sorted keys: run_start[r] (first sorted index), run_tok[r] (the
// token) for r < *run_count, and run_start[*run_count] = number of valid keys. counts is the
// output of embedding_runs_count (unused when num_tiles == 1). Grid num_tiles, block
// EMB_SORT_THREADS; thread x handles the EMB_ITEMS keys from tile + x·EMB_ITEMS.
extern "C" __global__ void __launch_bounds__(EMB_SORT_THREADS)
    embedding_runs_write(const int* __restrict__ keys, int n, int vocab, int num_tiles,
                         const unsigned* __restrict__ counts, int* __restrict__ run_count,
                         int* __restrict__ run_start, int* __restrict__ run_tok) {
    __shared__ unsigned s_before, s_total, s_warp[32];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (tid == 0) s_before = s_total = 0;
    __syncthreads();
    if (num_tiles > 1) {
        unsigned bef = 0, tot = 0;
        for (int t = tid; t < num_tiles; t += blockDim.x) {
            const unsigned c = counts[t];
            tot += c;
            if (t < (int)blockIdx.x) bef += c;
        }
        bef = emb_warp_sum(bef);
        tot = emb_warp_sum(tot);
        if (lane == 0 && (bef | tot)) {
            atomicAdd(&s_before, bef);  // integers: exact
            atomicAdd(&s_total, tot);
        }
    }
    const int i0 = blockIdx.x * EMB_TILE + tid * EMB_ITEMS;
    unsigned flags = 0, f = 0;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) {
        const bool s = emb_run_start(keys, i0 + j, n, vocab);
        flags |= (unsigned)s << j;
        f += s;
    }
    // Exclusive scan of f over the block.
    unsigned x = f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    unsigned off = 0, block_total = 0;
    for (int w = 0; w < 32; ++w) {
        const unsigned s = s_warp[w];
        if (w < warp) off += s;
        block_total += s;
    }
    const unsigned first_run = s_before + off + x - f;
    const unsigned runs = num_tiles > 1 ? s_total : block_total;
    unsigned r = first_run;
#pragma unroll
    for (int j = 0; j < EMB_ITEMS; ++j) {
        const int i = i0 + j;
        if (i >= n) break;
        const int k = keys[i];
        if ((flags >> j) & 1u) {
            run_start[r] = i;
            run_tok[r] = k;
            ++r;
        }
        // The last valid key (the keys are sorted, the invalid ones equal vocab).
        if (k < vocab && (i + 1 == n || keys[i + 1] >= vocab)) run_start[runs] = i + 1;
    }
    if (blockIdx.x == num_tiles - 1 && tid == 0) *run_count = (int)runs;
}

// ------------------------------------------------------------------ backward: token rows

template <typename A, int VEC> struct alignas(sizeof(A) * VEC) EmbVec {
    A v[VEC];
};

// Grid (⌈max_runs / 8⌉, min(⌈chunks / CH⌉, 65535)), block 256: warp w of block x handles run
// 8x + w and the column groups y, y + gridDim.y, ... of CH chunks of 32·VEC columns (lane l:
// columns chunk·32·VEC + l·VEC + v). For every column the run's rows are added in ascending
// position order to a zeroed f32 accumulator, which is then added to dwte once: the order of the
// previous implementation, kept so results stay bit-identical (see the top of the file).
// Positions come 32 at a time (the next 32 prefetched), and RG rows × CH chunks are loaded
// before they are added, so the loads overlap while the additions keep their order. CH = 1,
// RG = 32 suits long runs (few tokens); CH = 4, RG = 4 short ones (many tokens).
template <typename A, typename G, int VEC, int CH, int RG>
__device__ __forceinline__ void embedding_backward_wte_body(
    const int* __restrict__ run_count, const int* __restrict__ run_start,
    const int* __restrict__ run_tok, const int* __restrict__ sorted, const A* __restrict__ dout,
    G* __restrict__ dwte, int c, int chunks) {
    typedef EmbVec<A, VEC> V;
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    // r < max_runs ≤ n: the loads stay inside the run arrays even past the last run, so they are
    // issued together and only then checked.
    const int runs = *run_count, s = run_start[r], e = run_start[r + 1], tok = run_tok[r];
    if (r >= runs) return;  // the whole warp
    for (int g = blockIdx.y; g * CH < chunks; g += gridDim.y) {
        G* w = dwte + (u64)tok * c;
        float acc[CH][VEC], old[CH][VEC];
        bool live[CH];
#pragma unroll
        for (int h = 0; h < CH; ++h) {
            const int col = ((g * CH + h) * 32 + lane) * VEC;
            live[h] = g * CH + h < chunks && col < c;
#pragma unroll
            for (int v = 0; v < VEC; ++v) {
                acc[h][v] = 0.0f;
                old[h][v] = live[h] ? to_f32(w[col + v]) : 0.0f;
            }
        }
        int my = s + lane < e ? sorted[s + lane] : 0;
        for (int k0 = s; k0 < e; k0 += 32) {
            const int cnt = e - k0 < 32 ? e - k0 : 32;
            const int next = k0 + 32 + lane < e ? sorted[k0 + 32 + lane] : 0;
            for (int j0 = 0; j0 < cnt; j0 += RG) {
                V x[RG][CH];
#pragma unroll
                for (int j = 0; j < RG; ++j) {
                    const int p = __shfl_sync(0xffffffffu, my, (j0 + j) & 31);
                    const A* row = dout + (u64)p * c;
#pragma unroll
                    for (int h = 0; h < CH; ++h) {
                        const int col = ((g * CH + h) * 32 + lane) * VEC;
                        if (live[h] && j0 + j < cnt)
                            x[j][h] = *reinterpret_cast<const V*>(row + col);
                    }
                }
#pragma unroll
                for (int j = 0; j < RG; ++j) {
#pragma unroll
                    for (int h = 0; h < CH; ++h) {
                        if (live[h] && j0 + j < cnt) {
#pragma unroll
                            for (int v = 0; v < VEC; ++v) acc[h][v] += to_f32(x[j][h].v[v]);
                        }
                    }
                }
            }
            my = next;
        }
#pragma unroll
        for (int h = 0; h < CH; ++h) {
            const int col = ((g * CH + h) * 32 + lane) * VEC;
            if (live[h]) {
#pragma unroll
                for (int v = 0; v < VEC; ++v) w[col + v] = from_f32<G>(old[h][v] + acc[h][v]);
            }
        }
    }
}

// Entry points embedding_backward_wte_<v1|v2>_<long|short>_<A>_<G>: v1 any c, v2 c even (two
// columns per lane, one 2-element load); long: CH = 1, RG = 32; short: CH = 4, RG = 4.
#define EMB_WTE_ENTRY(A, SA, G, SG, VEC, KIND, CH, RG)                                        \
    extern "C" __global__ void __launch_bounds__(256)                                         \
        embedding_backward_wte_v##VEC##_##KIND##_##SA##_##SG(                                 \
            const int* __restrict__ run_count, const int* __restrict__ run_start,             \
            const int* __restrict__ run_tok, const int* __restrict__ sorted,                  \
            const A* __restrict__ dout, G* __restrict__ dwte, int c, int chunks) {            \
        embedding_backward_wte_body<A, G, VEC, CH, RG>(run_count, run_start, run_tok, sorted, \
                                                       dout, dwte, c, chunks);                \
    }
#define EMBEDDING_BACKWARD(A, SA, G, SG)                                                      \
    EMB_WTE_ENTRY(A, SA, G, SG, 1, long, 1, 32)                                               \
    EMB_WTE_ENTRY(A, SA, G, SG, 2, long, 1, 32)                                               \
    EMB_WTE_ENTRY(A, SA, G, SG, 1, short, 4, 4)                                               \
    EMB_WTE_ENTRY(A, SA, G, SG, 2, short, 4, 4)
FOR_ACT_AND_WIDE(EMBEDDING_BACKWARD)
