// Shared device code of duet's HIP kernels: storage types, conversions and wavefront reductions.
//
// Included by every kernels-hip/*.hip file. It builds three ways:
//  - hiprtc at backend start (ROCm 6/7; `__HIPCC_RTC__` defined, no system headers: the backend
//    passes this file through hiprtcCreateProgram's `headers`),
//  - hipcc ahead of time (scripts/check-hip-kernels.sh, gfx90a / gfx940),
//  - nvcc through HIP's NVIDIA platform headers (scripts/hip-nvidia.sh kernels-vs-cpu).
//
// The backend passes -DDUET_WARP=<the device's hipDeviceAttributeWarpSize> (64 on CDNA; part of
// the cache key); otherwise the compiler's own wavefront-size macro is used, and 32 on NVIDIA.
// No result depends on it: reductions run in fixed 32-lane groups (see "reductions" below), so
// the kernels compute the CUDA kernels' bits on wave32 and wave64 alike.
//
// Storage formats: f32 is `float`; f16, bf16 and the four FP8 formats are one-member structs holding
// the raw bits, converted with the same rounding as the CPU reference (round to nearest even; FP8
// saturates to ±max and never produces an infinity). Arithmetic is always f32.
#pragma once

#if !defined(__HIPCC_RTC__)
#include <hip/hip_runtime.h>
#if defined(__HIP_PLATFORM_NVIDIA__)
#include <hip/hip_fp16.h>
#endif
#endif

#ifndef DUET_WARP
#if defined(__HIP_PLATFORM_NVIDIA__) || defined(__CUDACC__)
#define DUET_WARP 32
#elif defined(__AMDGCN_WAVEFRONT_SIZE__)
#define DUET_WARP __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define DUET_WARP __AMDGCN_WAVEFRONT_SIZE
#elif defined(__HIP_DEVICE_COMPILE__)
#error "DUET_WARP is not set: pass -DDUET_WARP=<wavefront size>"
#else
#define DUET_WARP 64 /* host pass of a single-source compile: never used for device code */
#endif
#endif

/// Threads per block of every kernel (a multiple of the wavefront size, 32 or 64).
#define DUET_BLOCK 256
#define DUET_KERNEL extern "C" __global__ void __launch_bounds__(DUET_BLOCK)
/// A kernel launched with up to 1024 threads (cross_entropy: the block size follows the vocabulary).
#define DUET_KERNEL_1024 extern "C" __global__ void __launch_bounds__(1024)
#define DUET_DEV static __device__ __forceinline__

typedef unsigned long long duet_u64;
typedef long long duet_i64;

// ------------------------------------------------------------------------------------ storage types
struct duet_f16 { unsigned short bits; };
struct duet_bf16 { unsigned short bits; };
struct duet_e4m3 { unsigned char bits; };
struct duet_e5m2 { unsigned char bits; };
struct duet_e4m3fnuz { unsigned char bits; };
struct duet_e5m2fnuz { unsigned char bits; };

DUET_DEV unsigned duet_f2u(float x) { return __float_as_uint(x); }
DUET_DEV float duet_u2f(unsigned x) { return __uint_as_float(x); }
DUET_DEV bool duet_isnan(float x) { return (duet_f2u(x) & 0x7fffffffu) > 0x7f800000u; }

// f16 <-> f32, round to nearest even (hardware conversions).
#if defined(__HIP_PLATFORM_NVIDIA__) || defined(__CUDACC__)
DUET_DEV float duet_f16_to_f32(unsigned short h) { return __half2float(__ushort_as_half(h)); }
DUET_DEV unsigned short duet_f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
#else
DUET_DEV float duet_f16_to_f32(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }
DUET_DEV unsigned short duet_f32_to_f16(float f) {
    return __builtin_bit_cast(unsigned short, (_Float16)f);
}
#endif

// bf16 <-> f32 on raw bits: round to nearest even; NaN stays NaN (quiet bit set).
DUET_DEV float duet_bf16_to_f32(unsigned short b) { return duet_u2f(((unsigned)b) << 16); }
DUET_DEV unsigned short duet_f32_to_bf16(float f) {
    unsigned u = duet_f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// FP8 codecs, bit-exact with duet_device::Fp8Format. KIND: 0 = OCP E4M3FN (no inf, S.1111.111
// is NaN), 1 = OCP E5M2 (IEEE-like), 2 = FNUZ (0x80 is the only NaN, no -0, no inf).
#define DUET_FP8_FN 0
#define DUET_FP8_IEEE 1
#define DUET_FP8_FNUZ 2

template <int EB, int MB, int BIAS, int KIND>
struct DuetFp8 {
    static constexpr int EMAX = (1 << EB) - 1;
    static constexpr int MMAX = (1 << MB) - 1;
    /// Largest finite code (positive).
    static constexpr int MAX_CODE = KIND == DUET_FP8_FN     ? 0x7e
                                    : KIND == DUET_FP8_IEEE ? (((EMAX - 1) << MB) | MMAX)
                                                            : 0x7f;
    static __device__ __forceinline__ float decode(unsigned char code) {
        const int e = (code >> MB) & EMAX;
        const int m = code & MMAX;
        const bool neg = (code & 0x80) != 0;
        if (KIND == DUET_FP8_FNUZ && code == 0x80) return duet_u2f(0x7fc00000u);
        if (KIND == DUET_FP8_FN && e == EMAX && m == MMAX) return duet_u2f(0x7fc00000u);
        if (KIND == DUET_FP8_IEEE && e == EMAX) {
            if (m != 0) return duet_u2f(0x7fc00000u);
            return neg ? -duet_u2f(0x7f800000u) : duet_u2f(0x7f800000u);
        }
        float mag = e == 0 ? ldexpf((float)m, 1 - BIAS - MB) : ldexpf((float)(m + (1 << MB)), e - BIAS - MB);
        return neg ? -mag : mag;
    }
    /// Round to nearest even, saturating to ±max (infinities too); NaN -> the NaN code.
    static __device__ __forceinline__ unsigned char encode(float x) {
        if (duet_isnan(x)) return KIND == DUET_FP8_FNUZ ? 0x80 : 0x7f;
        const bool neg = (duet_f2u(x) >> 31) != 0;
        const float a = fabsf(x);
        int code;
        if (a >= decode((unsigned char)MAX_CODE)) {
            code = MAX_CODE;
        } else if (a < ldexpf(1.0f, 1 - BIAS)) {
            // Subnormal range: the code is the mantissa (2^MB rounds up into the first normal).
            code = (int)rintf(ldexpf(a, BIAS - 1 + MB));
        } else {
            const int e = (int)((duet_f2u(a) >> 23) & 0xff) - 127;  // a is a normal f32 here
            const float q = rintf(ldexpf(a, MB - e));               // in [2^MB, 2^(MB+1)]
            code = ((e + BIAS) << MB) + ((int)q - (1 << MB));       // a carry bumps the exponent
        }
        if (neg && !(code == 0 && KIND == DUET_FP8_FNUZ)) code |= 0x80;
        return (unsigned char)code;
    }
};
typedef DuetFp8<4, 3, 7, DUET_FP8_FN> DuetE4M3;
typedef DuetFp8<5, 2, 15, DUET_FP8_IEEE> DuetE5M2;
typedef DuetFp8<4, 3, 8, DUET_FP8_FNUZ> DuetE4M3Fnuz;
typedef DuetFp8<5, 2, 16, DUET_FP8_FNUZ> DuetE5M2Fnuz;

// Typed load/store: `duet_ld(p, i)` reads element i as f32, `duet_st(p, i, v)` rounds v into it.
DUET_DEV float duet_ld(const float* p, duet_u64 i) { return p[i]; }
DUET_DEV float duet_ld(const duet_f16* p, duet_u64 i) { return duet_f16_to_f32(p[i].bits); }
DUET_DEV float duet_ld(const duet_bf16* p, duet_u64 i) { return duet_bf16_to_f32(p[i].bits); }
DUET_DEV float duet_ld(const duet_e4m3* p, duet_u64 i) { return DuetE4M3::decode(p[i].bits); }
DUET_DEV float duet_ld(const duet_e5m2* p, duet_u64 i) { return DuetE5M2::decode(p[i].bits); }
DUET_DEV float duet_ld(const duet_e4m3fnuz* p, duet_u64 i) { return DuetE4M3Fnuz::decode(p[i].bits); }
DUET_DEV float duet_ld(const duet_e5m2fnuz* p, duet_u64 i) { return DuetE5M2Fnuz::decode(p[i].bits); }

DUET_DEV void duet_st(float* p, duet_u64 i, float v) { p[i] = v; }
DUET_DEV void duet_st(duet_f16* p, duet_u64 i, float v) { p[i].bits = duet_f32_to_f16(v); }
DUET_DEV void duet_st(duet_bf16* p, duet_u64 i, float v) { p[i].bits = duet_f32_to_bf16(v); }
DUET_DEV void duet_st(duet_e4m3* p, duet_u64 i, float v) { p[i].bits = DuetE4M3::encode(v); }
DUET_DEV void duet_st(duet_e5m2* p, duet_u64 i, float v) { p[i].bits = DuetE5M2::encode(v); }
DUET_DEV void duet_st(duet_e4m3fnuz* p, duet_u64 i, float v) { p[i].bits = DuetE4M3Fnuz::encode(v); }
DUET_DEV void duet_st(duet_e5m2fnuz* p, duet_u64 i, float v) { p[i].bits = DuetE5M2Fnuz::encode(v); }

// The dtype lists that entry points are stamped out for: M(name, storage type). Names match
// duet_device::DType::name(), so the entry of op `foo` for bf16 is `foo_bf16`.
#define DUET_FOR_ACT(M) M(f32, float) M(f16, duet_f16) M(bf16, duet_bf16)
#define DUET_FOR_FLOAT(M)                                                                     \
    DUET_FOR_ACT(M) M(f8e4m3, duet_e4m3) M(f8e5m2, duet_e5m2) M(f8e4m3fnuz, duet_e4m3fnuz) \
        M(f8e5m2fnuz, duet_e5m2fnuz)
#define DUET_FOR_FLOAT_X(M, A, B)                                                            \
    M(A, B, f32, float) M(A, B, f16, duet_f16) M(A, B, bf16, duet_bf16) M(A, B, f8e4m3, duet_e4m3) \
        M(A, B, f8e5m2, duet_e5m2) M(A, B, f8e4m3fnuz, duet_e4m3fnuz)                          \
            M(A, B, f8e5m2fnuz, duet_e5m2fnuz)
// Activation type A with a second type P that is A or f32 (parameters, gradients): the entry of
// op `foo` for bf16 activations and f32 parameters is `foo_bf16_f32`.
#define DUET_FOR_ACT_AND_WIDE(M)                                                               \
    M(f32, float, f32, float) M(f16, duet_f16, f16, duet_f16) M(f16, duet_f16, f32, float)    \
        M(bf16, duet_bf16, bf16, duet_bf16) M(bf16, duet_bf16, f32, float)

// ------------------------------------------------------------------------------------ roundings
// Explicitly rounded operations, for arithmetic that must give the CUDA kernels' bits. On NVIDIA
// (scripts/hip-nvidia.sh kernels-vs-cpu, kernels-vs-cuda) they are CUDA's _rn intrinsics, which are never
// contracted; on AMD they are plain IEEE operations, and the backend compiles with
// -ffp-contract=off (kernels.rs `options`), so a·b + c is only fused where duet_fma says so.
// (HIP's own __fsqrt_rn is __ocml_native_sqrt_f32, an approximation: not used.)
#if defined(__HIP_PLATFORM_NVIDIA__) || defined(__CUDACC__)
DUET_DEV float duet_fadd(float a, float b) { return __fadd_rn(a, b); }
DUET_DEV float duet_fsub(float a, float b) { return __fsub_rn(a, b); }
DUET_DEV float duet_fmul(float a, float b) { return __fmul_rn(a, b); }
DUET_DEV float duet_fdiv(float a, float b) { return __fdiv_rn(a, b); }
DUET_DEV float duet_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DUET_DEV float duet_fsqrt(float a) { return __fsqrt_rn(a); }
DUET_DEV double duet_dadd(double a, double b) { return __dadd_rn(a, b); }
DUET_DEV double duet_dsub(double a, double b) { return __dsub_rn(a, b); }
DUET_DEV double duet_dmul(double a, double b) { return __dmul_rn(a, b); }
DUET_DEV double duet_ddiv(double a, double b) { return __ddiv_rn(a, b); }
DUET_DEV double duet_dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
DUET_DEV unsigned long long duet_d2u(double x) { return (unsigned long long)__double_as_longlong(x); }
DUET_DEV double duet_u2d(unsigned long long x) { return __longlong_as_double((long long)x); }
#else
DUET_DEV float duet_fadd(float a, float b) { return a + b; }
DUET_DEV float duet_fsub(float a, float b) { return a - b; }
DUET_DEV float duet_fmul(float a, float b) { return a * b; }
DUET_DEV float duet_fdiv(float a, float b) { return a / b; }  // correctly rounded (hipcc default)
DUET_DEV float duet_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
DUET_DEV float duet_fsqrt(float a) { return __builtin_sqrtf(a); }  // correctly rounded
DUET_DEV double duet_dadd(double a, double b) { return a + b; }
DUET_DEV double duet_dsub(double a, double b) { return a - b; }
DUET_DEV double duet_dmul(double a, double b) { return a * b; }
DUET_DEV double duet_ddiv(double a, double b) { return a / b; }
DUET_DEV double duet_dfma(double a, double b, double c) { return __builtin_fma(a, b, c); }
DUET_DEV unsigned long long duet_d2u(double x) { return __builtin_bit_cast(unsigned long long, x); }
DUET_DEV double duet_u2d(unsigned long long x) { return __builtin_bit_cast(double, x); }
#endif

#define DUET_SFN DUET_DEV
// The shared math block, one source for both vendors (kernels-shared/duet_math.h).
#include "duet_math.h"

// The gradient factor of a clipped step from the global sum of squares, exactly as
// duet_device::clip_grad_scale does on the host and kernels-cuda/common.cuh's clip_grad_scale on
// the device (f32 square root, f64 unscaling, one rounding). Used by adamw_multi (adamw.hip).
DUET_DEV float duet_clip_grad_scale(float norm_sq, float max_norm, float loss_scale) {
    const float raw = duet_fsqrt(norm_sq);
    const float norm = (float)duet_ddiv((double)raw, (double)loss_scale);
    const float coef = duet_fdiv(max_norm, duet_fadd(norm, 1e-6f));
    const float clip = (max_norm > 0.0f && coef < 1.0f) ? coef : 1.0f;
    return loss_scale == 1.0f ? clip : (float)duet_ddiv((double)clip, (double)loss_scale);
}

// ------------------------------------------------------------------------------------ reductions
// Every cross-lane reduction works in fixed groups of 32 lanes, whatever the wavefront size (a
// wave64 is two groups; __shfl_xor with width 32 stays inside one), and combines the groups
// exactly as kernels-cuda/common.cuh's warp_sum/block_sum combine warps: a xor butterfly with
// offsets 16, 8, 4, 2, 1, then the group sums of a block, padded with zeros to 32, through the
// same butterfly. So wave32 and wave64 devices, and the CUDA kernels, add in the same order
// (crates/hip/tests/wave_order.rs emulates both). Blocks are whole groups (multiples of 32).
#define DUET_GROUP 32
/// Most 32-lane groups in a block (1024 threads), the size of the block reductions' scratch.
#define DUET_MAX_GROUPS 32

DUET_DEV float duet_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = duet_fadd(v, __shfl_xor(v, o, DUET_GROUP));
    return v;
}
DUET_DEV float duet_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor(v, o, DUET_GROUP));
    return v;
}
DUET_DEV double duet_warp_sum_f64(double v) {
    for (int o = 16; o > 0; o >>= 1) v = duet_dadd(v, __shfl_xor(v, o, DUET_GROUP));
    return v;
}

/// Sum over the block (CUDA's block_sum), returned to every thread. `sh` holds
/// DUET_MAX_GROUPS floats; safe to call repeatedly with the same `sh`.
DUET_DEV float duet_block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5, ng = blockDim.x >> 5;
    v = duet_warp_sum(v);
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0) sh[g] = v;
    __syncthreads();
    v = lane < ng ? sh[lane] : 0.0f;
    return duet_warp_sum(v);
}
DUET_DEV float duet_block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5, ng = blockDim.x >> 5;
    v = duet_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[g] = v;
    __syncthreads();
    v = lane < ng ? sh[lane] : -duet_u2f(0x7f800000u);
    return duet_warp_max(v);
}
DUET_DEV double duet_block_sum_f64(double v, double* sh) {
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5, ng = blockDim.x >> 5;
    v = duet_warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) sh[g] = v;
    __syncthreads();
    v = lane < ng ? sh[lane] : 0.0;
    return duet_warp_sum_f64(v);
}

#define DUET_GRID_STRIDE(i, n)                                                    \
    for (duet_u64 i = (duet_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (duet_u64)gridDim.x * blockDim.x)
