// Fused AdamW on f32 master weights with f32 moments. Grid-stride over n. Entry names and
// arguments match kernels-cuda (which stamps copy types f32/f16/bf16; the FP8 copies are extra).
#include "duet_hip.h"

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * param); copy (if not null) = param.
// Entry adamw_<grad dtype>_<copy dtype>.
#define DUET_ADAMW(GN, GT, CN, CT)                                                            \
    DUET_KERNEL adamw_##GN##_##CN(float* __restrict__ param, const GT* __restrict__ grad,      \
                                  float* __restrict__ m, float* __restrict__ v,                \
                                  CT* __restrict__ copy, duet_u64 n, float lr, float beta1,    \
                                  float beta2, float eps, float weight_decay, float bc1,       \
                                  float bc2, float grad_scale) {                               \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float g = duet_ld(grad, i) * grad_scale;                                     \
            const float mi = beta1 * m[i] + (1.0f - beta1) * g;                                \
            const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;                            \
            m[i] = mi;                                                                         \
            v[i] = vi;                                                                         \
            const float p = param[i];                                                          \
            const float np = p - lr * ((mi / bc1) / (sqrtf(vi / bc2) + eps) + weight_decay * p); \
            param[i] = np;                                                                     \
            if (copy) duet_st(copy, i, np);                                                    \
        }                                                                                      \
    }
#define DUET_ADAMW_FROM(GN, GT) DUET_FOR_FLOAT_X(DUET_ADAMW, GN, GT)
DUET_FOR_ACT(DUET_ADAMW_FROM)
