// FP8 delayed scaling on the device (see duet_device::Fused::fp8_scaling_update), so a recorded
// training step includes it and no step waits for the host: kernels-cuda/fp8_scaling.cu, the
// same arithmetic (its bits).
//
// One thread per operand: push amax[i] onto its history (newest first, the oldest entry falls
// off), take the history's max (NaN if any entry is NaN) or the newest entry, and compute the
// scale exactly as duet_device::fp8_delayed_scale does on the host: in double precision,
// fp8_max / a / 2^margin (IEEE division and an exact power of two), saturating at FLT_MAX,
// rounded once to float; the previous scale stays when a is not a finite positive number.
// scale_inv[i · inv_stride] = (float)(1.0 / (double)scale), like duet_device::fp8_scale_inv.
#include "duet_hip.h"

// 2^e as a double, exactly (CUDA's ldexp(1.0, e), the host's 2f64.powi(e)): +inf past the
// largest double, subnormal below 2^-1022, 0 below 2^-1074.
DUET_DEV double duet_pow2(int e) {
    if (e > 1023) return duet_u2d(0x7ff0000000000000ull);
    if (e >= -1022) return duet_u2d((unsigned long long)(1023 + e) << 52);
    if (e >= -1074) return duet_u2d(1ull << (e + 1074));
    return 0.0;
}

DUET_KERNEL fp8_scaling_update(float* __restrict__ amax, float* __restrict__ history,
                               float* __restrict__ scale, float* __restrict__ scale_inv,
                               duet_u64 inv_stride, const float* __restrict__ fp8_max,
                               duet_u64 ops, duet_u64 len, int most_recent, int margin) {
    const duet_u64 i = (duet_u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ops) return;
    float* h = history + i * len;
    const float a_new = amax[i];
    if (len > 0) {
        for (duet_u64 j = len - 1; j > 0; --j) h[j] = h[j - 1];
        h[0] = a_new;
    }
    float a;
    if (most_recent) {
        a = a_new;
    } else {
        a = 0.0f;
        for (duet_u64 j = 0; j < len; ++j) {
            const float x = h[j];
            a = (duet_isnan(x) || duet_isnan(a)) ? duet_u2f(0x7fc00000u) : fmaxf(a, x);
        }
    }
    float s = scale[i];
    const bool finite = (duet_f2u(a) & 0x7fffffffu) < 0x7f800000u;
    if (finite && a > 0.0f) {
        const double d = duet_ddiv(duet_ddiv((double)fp8_max[i], (double)a), duet_pow2(margin));
        s = d >= (double)3.402823466e38f ? 3.402823466e38f : (float)d;
    }
    scale[i] = s;
    scale_inv[i * inv_stride] = (float)duet_ddiv(1.0, (double)s);
    amax[i] = 0.0f;
}
