// Elementwise ops: cast, scale, add, add_assign, bias_add and GELU. Grid-stride loops: any grid
// is correct (the backend launches min(ceil(n / 256), 65535) blocks of DUET_BLOCK threads).
// Entry names and arguments match kernels-cuda.
#include "duet_hip.h"

// dst = cast(src * scale) between every pair of float storage formats.
#define DUET_CAST(SN, ST, DN, DT)                                                          \
    DUET_KERNEL cast_##SN##_##DN(const ST* __restrict__ src, DT* __restrict__ dst, duet_u64 n, \
                                 float scale) {                                            \
        DUET_GRID_STRIDE(i, n) { duet_st(dst, i, duet_ld(src, i) * scale); }               \
    }
#define DUET_CAST_FROM(SN, ST) DUET_FOR_FLOAT_X(DUET_CAST, SN, ST)
DUET_FOR_FLOAT(DUET_CAST_FROM)

// x *= alpha; out = a + b.
#define DUET_ELEMENTWISE(N, T)                                                                 \
    DUET_KERNEL scale_##N(T* x, float alpha, duet_u64 n) {                                     \
        DUET_GRID_STRIDE(i, n) { duet_st(x, i, duet_ld(x, i) * alpha); }                       \
    }                                                                                          \
    DUET_KERNEL add_##N(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,  \
                        duet_u64 n) {                                                          \
        DUET_GRID_STRIDE(i, n) { duet_st(out, i, duet_ld(a, i) + duet_ld(b, i)); }             \
    }
DUET_FOR_FLOAT(DUET_ELEMENTWISE)

// dst += src (gradient accumulation); dst and src may differ in dtype (e.g. f32 += bf16), as in
// kernels-cuda: add_assign_<dst>_<src>.
#define DUET_ADD_ASSIGN(SN, ST, DN, DT)                                                        \
    DUET_KERNEL add_assign_##DN##_##SN(DT* dst, const ST* __restrict__ src, duet_u64 n) {       \
        DUET_GRID_STRIDE(i, n) { duet_st(dst, i, duet_ld(dst, i) + duet_ld(src, i)); }         \
    }
#define DUET_ADD_ASSIGN_FROM(SN, ST) DUET_FOR_FLOAT_X(DUET_ADD_ASSIGN, SN, ST)
DUET_FOR_FLOAT(DUET_ADD_ASSIGN_FROM)

// GELU: gelu_f / gelu_grad_f (duet_hip.h's shared math block, the CUDA kernels' code).

// out = gelu(x); dx = gelu'(x) * dout (overwrites dx).
#define DUET_GELU(N, T)                                                                        \
    DUET_KERNEL gelu_forward_##N(const T* __restrict__ x, T* __restrict__ out, duet_u64 n) {    \
        DUET_GRID_STRIDE(i, n) { duet_st(out, i, gelu_f(duet_ld(x, i))); }                   \
    }                                                                                           \
    DUET_KERNEL gelu_backward_##N(const T* __restrict__ x, const T* __restrict__ dout,          \
                                  T* __restrict__ dx, duet_u64 n) {                             \
        DUET_GRID_STRIDE(i, n) { duet_st(dx, i, duet_fmul(gelu_grad_f(duet_ld(x, i)), duet_ld(dout, i))); } \
    }
DUET_FOR_ACT(DUET_GELU)

// x[r, j] += bias[j] for x (rows x c).
#define DUET_BIAS_ADD(AN, AT, PN, PT)                                                          \
    DUET_KERNEL bias_add_##AN##_##PN(AT* x, const PT* __restrict__ bias, duet_u64 rows,        \
                                     duet_u64 c) {                                             \
        DUET_GRID_STRIDE(i, rows * c) { duet_st(x, i, duet_ld(x, i) + duet_ld(bias, i % c)); } \
    }
DUET_FOR_ACT_AND_WIDE(DUET_BIAS_ADD)
