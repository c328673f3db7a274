// Elementwise ops: cast, scale, add, add_assign. Grid-stride loops over `n` elements; any grid
// size is correct (the backend launches min(ceil(n / 256), 65535) blocks of 256 threads).
#include "duet_hip.h"

// dst = cast(src * scale): every pair of float storage formats.
#define DUET_CAST(SN, ST, DN, DT)                                                          \
    DUET_KERNEL cast_##SN##_##DN(const ST* __restrict__ src, DT* __restrict__ dst, duet_u64 n, \
                                 float scale) {                                            \
        DUET_GRID_STRIDE(i, n) { duet_st(dst, i, duet_ld(src, i) * scale); }               \
    }
#define DUET_CAST_FROM(SN, ST) DUET_FOR_FLOAT_X(DUET_CAST, SN, ST)
DUET_FOR_FLOAT(DUET_CAST_FROM)

// x *= alpha
#define DUET_SCALE(N, T)                                             \
    DUET_KERNEL scale_##N(T* __restrict__ x, duet_u64 n, float alpha) { \
        DUET_GRID_STRIDE(i, n) { duet_st(x, i, duet_ld(x, i) * alpha); } \
    }
DUET_FOR_FLOAT(DUET_SCALE)

// out = a + b
#define DUET_ADD(N, T)                                                                    \
    DUET_KERNEL add_##N(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, \
                        duet_u64 n) {                                                     \
        DUET_GRID_STRIDE(i, n) { duet_st(out, i, duet_ld(a, i) + duet_ld(b, i)); }        \
    }
DUET_FOR_FLOAT(DUET_ADD)

// dst += src
#define DUET_ADD_ASSIGN(N, T)                                                            \
    DUET_KERNEL add_assign_##N(T* __restrict__ dst, const T* __restrict__ src, duet_u64 n) { \
        DUET_GRID_STRIDE(i, n) { duet_st(dst, i, duet_ld(dst, i) + duet_ld(src, i)); }   \
    }
DUET_FOR_FLOAT(DUET_ADD_ASSIGN)
