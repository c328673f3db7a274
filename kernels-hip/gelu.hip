// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#include "duet_hip.h"

#define DUET_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DUET_GELU_C 0.044715f

#define DUET_GELU_FWD(N, T)                                                                   \
    DUET_KERNEL gelu_forward_##N(const T* __restrict__ x, T* __restrict__ out, duet_u64 n) {   \
        DUET_GRID_STRIDE(i, n) {                                                              \
            const float v = duet_ld(x, i);                                                    \
            const float u = DUET_GELU_K * (v + DUET_GELU_C * v * v * v);                      \
            duet_st(out, i, 0.5f * v * (1.0f + tanhf(u)));                                    \
        }                                                                                     \
    }
DUET_FOR_ACT(DUET_GELU_FWD)

// dx = gelu'(x) * dout (overwrites dx).
#define DUET_GELU_BWD(N, T)                                                                    \
    DUET_KERNEL gelu_backward_##N(const T* __restrict__ x, const T* __restrict__ dout,          \
                                  T* __restrict__ dx, duet_u64 n) {                             \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float v = duet_ld(x, i);                                                     \
            const float u = DUET_GELU_K * (v + DUET_GELU_C * v * v * v);                       \
            const float th = tanhf(u);                                                         \
            const float sech2 = 1.0f - th * th;                                                \
            const float grad = 0.5f * (1.0f + th) +                                            \
                               0.5f * v * sech2 * DUET_GELU_K * (1.0f + 3.0f * DUET_GELU_C * v * v); \
            duet_st(dx, i, grad * duet_ld(dout, i));                                           \
        }                                                                                      \
    }
DUET_FOR_ACT(DUET_GELU_BWD)
