// FP8 delayed scaling on the device (see duet_device::Device::fp8_scaling_update), so a
// recorded training step includes it and no step waits for the host.
//
// One thread per operand: push amax[i] onto its history (newest first, the oldest entry falls
// off), take the history's max (NaN if any entry is NaN) or the newest entry, and compute the
// scale exactly as duet_device::fp8_delayed_scale does on the host: in double precision,
// fp8_max / a / 2^margin (IEEE division and an exact power of two), saturating at FLT_MAX,
// rounded once to float; the previous scale stays when a is not a finite positive number.
// scale_inv[i · inv_stride] = (float)(1.0 / (double)scale), like duet_device::fp8_scale_inv
// (the stride keeps each inverse where cuBLASLt reads it in place).
#include "common.cuh"

extern "C" __global__ void fp8_scaling_update(float* __restrict__ amax,
                                              float* __restrict__ history,
                                              float* __restrict__ scale,
                                              float* __restrict__ scale_inv, u64 inv_stride,
                                              const float* __restrict__ fp8_max, u64 ops,
                                              u64 len, int most_recent, int margin) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ops) return;
    float* h = history + i * len;
    const float a_new = amax[i];
    if (len > 0) {
        for (u64 j = len - 1; j > 0; --j) h[j] = h[j - 1];
        h[0] = a_new;
    }
    float a;
    if (most_recent) {
        a = a_new;
    } else {
        a = 0.0f;
        for (u64 j = 0; j < len; ++j) {
            const float x = h[j];
            a = (isnan(x) || isnan(a)) ? __int_as_float(0x7fc00000) : fmaxf(a, x);
        }
    }
    float s = scale[i];
    if (isfinite(a) && a > 0.0f) {
        const double d = __ddiv_rn(__ddiv_rn((double)fp8_max[i], (double)a), ldexp(1.0, margin));
        s = d >= (double)3.402823466e38f ? 3.402823466e38f : __double2float_rn(d);
    }
    scale[i] = s;
    scale_inv[i * inv_stride] = __double2float_rn(__ddiv_rn(1.0, (double)s));
    amax[i] = 0.0f;
}
