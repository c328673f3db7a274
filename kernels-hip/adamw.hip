// Fused AdamW on f32 master weights with f32 moments. Grid-stride over n. Entry names and
// arguments match kernels-cuda (which stamps copy types f32/f16/bf16; the FP8 copies are extra).
#include "duet_hip.h"

// g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param -= lr * (m / bc1 / (sqrt(v / bc2) + eps) + wd * param); copy (if not null) = param.
// The update is adamw_update (duet_hip.h's shared math block): CUDA's roundings, pinned.
// Entry adamw_<grad dtype>_<copy dtype>.
#define DUET_ADAMW(GN, GT, CN, CT)                                                            \
    DUET_KERNEL adamw_##GN##_##CN(float* __restrict__ param, const GT* __restrict__ grad,      \
                                  float* __restrict__ m, float* __restrict__ v,                \
                                  CT* __restrict__ copy, duet_u64 n, float lr, float beta1,    \
                                  float beta2, float eps, float weight_decay, float bc1,       \
                                  float bc2, float grad_scale) {                               \
        AdamWConsts k;                                                                         \
        k.beta1 = beta1;                                                                       \
        k.beta2 = beta2;                                                                       \
        k.eps = eps;                                                                           \
        k.lr = lr;                                                                             \
        k.bc1 = bc1;                                                                           \
        k.bc2 = bc2;                                                                           \
        k.grad_scale = grad_scale;                                                             \
        k.weight_decay = weight_decay;                                                         \
        DUET_GRID_STRIDE(i, n) {                                                               \
            float mi = m[i], vi = v[i];                                                        \
            const float np = adamw_update(duet_ld(grad, i), mi, vi, param[i], k);              \
            m[i] = mi;                                                                         \
            v[i] = vi;                                                                         \
            param[i] = np;                                                                     \
            if (copy) duet_st(copy, i, np);                                                    \
        }                                                                                      \
    }
#define DUET_ADAMW_FROM(GN, GT) DUET_FOR_FLOAT_X(DUET_ADAMW, GN, GT)
DUET_FOR_ACT(DUET_ADAMW_FROM)
