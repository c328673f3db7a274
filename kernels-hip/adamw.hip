// Fused AdamW on f32 master weights with f32 moments. Grid-stride over n.
#include "duet_hip.h"

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * param).
// When copy != null the updated weight is also stored there in dtype `copy_dtype` (the DType
// order: 0 f32, 1 f16, 2 bf16, 3 f8e4m3, 4 f8e5m2, 5 f8e4m3fnuz, 6 f8e5m2fnuz).
#define DUET_ADAMW(N, T)                                                                        \
    DUET_KERNEL adamw_##N(float* __restrict__ param, const T* __restrict__ grad,                  \
                          float* __restrict__ m, float* __restrict__ v, duet_u64 n, float lr,     \
                          float beta1, float beta2, float eps, float weight_decay, float bc1,     \
                          float bc2, float grad_scale, void* __restrict__ copy, int copy_dtype) { \
        DUET_GRID_STRIDE(i, n) {                                                                  \
            const float g = duet_ld(grad, i) * grad_scale;                                        \
            const float mi = beta1 * m[i] + (1.0f - beta1) * g;                                   \
            const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;                               \
            const float p = param[i];                                                             \
            const float upd = (mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p;            \
            const float np = p - lr * upd;                                                        \
            m[i] = mi;                                                                            \
            v[i] = vi;                                                                            \
            param[i] = np;                                                                        \
            if (copy) duet_st_dyn(copy, copy_dtype, i, np);                                       \
        }                                                                                         \
    }
DUET_FOR_ACT(DUET_ADAMW)
