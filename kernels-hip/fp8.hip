// FP8 quantisation for delayed scaling (duet_device::Device::quantize_fp8). Entry names and
// arguments follow kernels-cuda/fp8.cu's `quantize_S_D`, with the transposed copy folded into
// the same kernel (dst_t may be null).
//
// dst = encode(src * scale[0]) with duet_hip.h's codecs (round to nearest even, saturating,
// bit-identical to the CPU reference), and amax[0] = max(amax[0], max |src|) in the same pass.
// NaN elements are skipped (fmaxf). |x| >= 0 orders like its bits as an unsigned integer, so
// atomicMax on the bits is a float max; a max is order-independent, so this is deterministic.
#include "duet_hip.h"

#define DUET_QUANTIZE(SN, S, DN, D)                                                            \
    DUET_KERNEL quantize_##SN##_##DN(const S* __restrict__ src, D* __restrict__ dst,            \
                                     D* __restrict__ dst_t, duet_u64 rows, duet_u64 cols,      \
                                     const float* __restrict__ scale,                          \
                                     float* __restrict__ amax) {                               \
        __shared__ float sh[DUET_MAX_GROUPS];                                                   \
        const float s = scale[0];                                                              \
        const duet_u64 n = rows * cols;                                                        \
        float m = 0.0f;                                                                        \
        DUET_GRID_STRIDE(i, n) {                                                               \
            const float x = duet_ld(src, i);                                                   \
            m = fmaxf(m, fabsf(x));                                                            \
            duet_st(dst, i, x * s);                                                            \
            if (dst_t != nullptr) dst_t[(i % cols) * rows + i / cols] = dst[i];                \
        }                                                                                      \
        m = duet_block_max(m, sh);                                                             \
        if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), duet_f2u(m));   \
    }
#define DUET_QUANTIZE_TO(SN, S)                                                                \
    DUET_QUANTIZE(SN, S, f8e4m3, duet_e4m3)                                                    \
    DUET_QUANTIZE(SN, S, f8e5m2, duet_e5m2)                                                    \
    DUET_QUANTIZE(SN, S, f8e4m3fnuz, duet_e4m3fnuz)                                            \
    DUET_QUANTIZE(SN, S, f8e5m2fnuz, duet_e5m2fnuz)
DUET_FOR_ACT(DUET_QUANTIZE_TO)
