// Shared helpers for duet's CUDA kernels.
//
// The kernels are compiled at run time by NVRTC. They include no CUDA header: the storage types
// below convert to and from f32 with bit operations (fp8, bf16 before sm_80) or single PTX
// instructions (f16, bf16 from sm_80), so a machine needs only the driver and libnvrtc, not the
// toolkit's headers. The Rust side replaces the `#include "common.cuh"` line of each kernel file
// with this text before compiling; scripts/check-cuda-kernels.sh passes `-I kernels-cuda`
// instead.
//
// Conventions: arithmetic is f32; every rounding to a storage type is round-to-nearest-even and
// matches the CPU reference (the `half` crate for f16/bf16, duet_device::Fp8Format for fp8).
#pragma once

typedef unsigned long long u64;
typedef long long i64;

// ------------------------------------------------------------------ storage types

struct __align__(2) bf16_t {
    unsigned short bits;
};
struct __align__(2) f16_t {
    unsigned short bits;
};
// fp8 storage: one byte each; the struct tag selects the codec.
struct e4m3_t {
    unsigned char bits;
};
struct e5m2_t {
    unsigned char bits;
};
struct e4m3fnuz_t {
    unsigned char bits;
};
struct e5m2fnuz_t {
    unsigned char bits;
};

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) {
    return __uint_as_float(((unsigned int)x.bits) << 16);
}
__device__ __forceinline__ float to_f32(f16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// The bf16 bits of x by the hardware conversion: round to nearest even, subnormals kept (a NaN
// gives a NaN, its payload the hardware's).
__device__ __forceinline__ unsigned short bf16_bits_hw(float x) {
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}
#endif

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
    unsigned int u = __float_as_uint(x);
    bf16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        // NaN: keep the sign and the top payload bits, force a quiet NaN.
        r.bits = (unsigned short)((u >> 16) | 0x0040u);
        return r;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // The hardware conversion: the same bits as the integer rounding below for every non-NaN
    // input, in one instruction instead of five.
    r.bits = bf16_bits_hw(x);
#else
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    r.bits = (unsigned short)(u >> 16);
#endif
    return r;
}
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) {
    f16_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

// ------------------------------------------------------------------ fp8 codecs
// KIND: 0 = OCP "FN" (E4M3: no inf, S.1111.111 is NaN), 1 = IEEE-like (E5M2),
//       2 = FNUZ (only 0x80 is NaN, no negative zero, no inf).

template <int EXP, int MAN, int BIAS, int KIND>
__device__ __forceinline__ float fp8_decode(unsigned char code) {
    const int e_max = (1 << EXP) - 1;
    const int e = (code >> MAN) & e_max;
    const int m = code & ((1 << MAN) - 1);
    const bool neg = (code & 0x80) != 0;
    if (KIND == 2 && code == 0x80) return __uint_as_float(0x7fc00000u);
    if (KIND == 0 && e == e_max && m == (1 << MAN) - 1) return __uint_as_float(0x7fc00000u);
    if (KIND == 1 && e == e_max) {
        if (m != 0) return __uint_as_float(0x7fc00000u);
        return neg ? __uint_as_float(0xff800000u) : __uint_as_float(0x7f800000u);
    }
    // value = (e == 0 ? m : 2^MAN + m) * 2^(max(e,1) - BIAS - MAN); every factor is exact in f32.
    const int mant = e == 0 ? m : ((1 << MAN) + m);
    const int ex = (e == 0 ? 1 : e) - BIAS - MAN;
    const float mag = (float)mant * __uint_as_float((unsigned int)(ex + 127) << 23);
    return neg ? -mag : mag;
}

// Round-to-nearest-even with saturation to ±max (infinities saturate, NaN maps to the NaN code).
template <int EXP, int MAN, int BIAS, int KIND>
__device__ __forceinline__ unsigned char fp8_encode(float x) {
    const unsigned char nan_code = KIND == 2 ? 0x80 : 0x7f;
    // Largest finite code: FN loses the all-ones mantissa at the top exponent, IEEE the whole
    // top exponent, FNUZ nothing.
    const int max_code = KIND == 0 ? 0x7e : (KIND == 1 ? (((1 << EXP) - 1) << MAN) - 1 : 0x7f);
    const unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return nan_code;
    const bool neg = (u >> 31) != 0;
    const float a = __uint_as_float(u & 0x7fffffffu);
    int code;
    // The largest finite value, computed exactly like fp8_decode does.
    const float maxv = fp8_decode<EXP, MAN, BIAS, KIND>((unsigned char)max_code);
    if (a >= maxv) {
        code = max_code;
    } else if (a == 0.0f) {
        code = 0;
    } else {
        int e = (int)((u >> 23) & 0xffu) - 127;  // floor(log2(a)) for normal f32
        if (e < 1 - BIAS) e = 1 - BIAS;          // subnormal range of the fp8 format
        const int q = e - MAN;                   // quantum exponent, always a normal f32
        const float scaled = a * __uint_as_float((unsigned int)(127 - q) << 23);  // exact
        const float r = rintf(scaled);           // ties to even
        // (e + BIAS - 1) * 2^MAN + r covers subnormals (e = 1 - BIAS) and carries into the
        // next binade when r reaches 2^(MAN+1).
        code = (e + BIAS - 1) * (1 << MAN) + (int)r;
        if (code > max_code) code = max_code;
    }
    if (neg && !(KIND == 2 && code == 0)) code |= 0x80;
    return (unsigned char)code;
}

__device__ __forceinline__ float to_f32(e4m3_t x) { return fp8_decode<4, 3, 7, 0>(x.bits); }
__device__ __forceinline__ float to_f32(e5m2_t x) { return fp8_decode<5, 2, 15, 1>(x.bits); }
__device__ __forceinline__ float to_f32(e4m3fnuz_t x) { return fp8_decode<4, 3, 8, 2>(x.bits); }
__device__ __forceinline__ float to_f32(e5m2fnuz_t x) { return fp8_decode<5, 2, 16, 2>(x.bits); }
template <> __device__ __forceinline__ e4m3_t from_f32<e4m3_t>(float x) {
    e4m3_t r;
    r.bits = fp8_encode<4, 3, 7, 0>(x);
    return r;
}
template <> __device__ __forceinline__ e5m2_t from_f32<e5m2_t>(float x) {
    e5m2_t r;
    r.bits = fp8_encode<5, 2, 15, 1>(x);
    return r;
}
template <> __device__ __forceinline__ e4m3fnuz_t from_f32<e4m3fnuz_t>(float x) {
    e4m3fnuz_t r;
    r.bits = fp8_encode<4, 3, 8, 2>(x);
    return r;
}
template <> __device__ __forceinline__ e5m2fnuz_t from_f32<e5m2fnuz_t>(float x) {
    e5m2fnuz_t r;
    r.bits = fp8_encode<5, 2, 16, 2>(x);
    return r;
}

// ------------------------------------------------------------------ 16-byte vectors

// A 16-byte pack of storage elements, loaded and stored with one 128-bit access.
template <typename T> struct __align__(16) Pack {
    static const int N = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};

template <typename T> __device__ __forceinline__ Pack<T> load_pack(const T* p) {
    Pack<T> r;
    *reinterpret_cast<uint4*>(&r) = *reinterpret_cast<const uint4*>(p);
    return r;
}
template <typename T> __device__ __forceinline__ void store_pack(T* p, const Pack<T>& r) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
}

// 16 bytes at a global address (as plain addresses from a job table are: generic pointers to
// device allocations, which equal their global addresses), spelled out as global accesses.
__device__ __forceinline__ float4 load4(const float* p) {
    float4 r;
    asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                 : "l"(p));
    return r;
}
__device__ __forceinline__ void store4(float* p, float4 x) {
    asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(x.x), "f"(x.y),
                 "f"(x.z), "f"(x.w)
                 : "memory");
}
__device__ __forceinline__ uint2 load2u(const void* p) {
    uint2 r;
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
__device__ __forceinline__ void store1u(void* p, unsigned int x) {
    asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(x) : "memory");
}

// ------------------------------------------------------------------ reductions
// All reductions have a fixed order (shuffles and shared-memory trees), so they are
// deterministic run to run.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide sum; blockDim.x must be a multiple of 32 (≤ 1024). `sh` holds 32 floats. Every
// thread gets the result. Safe to call repeatedly with the same `sh`.
__device__ __forceinline__ float block_sum(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
    return warp_max(v);
}

#define NEG_INF (-__int_as_float(0x7f800000))

// ------------------------------------------------------------------ LayerNorm forward rows
// The fast LayerNorm forward (layernorm.cu, layernorm_fwd_*) and the fused LayerNorm + FP8
// quantisation (fp8.cu, layernorm_fp8_*) share the code below, so for the same row layout (V, G;
// device/layernorm.rs `plan`) they compute the same mean, rstd and normalised values bit for
// bit. Row layout: thread t of a row group of G warps owns the vectors t, t + 32G, ... of V
// consecutive elements of the row (at most M; which ones and their order do not depend on M
// once M covers the row). The expressions are layernorm.cu's original ones, kept as plain
// operators so its kernels compile to the same instructions as before they were shared (with
// explicit rounding intrinsics NVRTC schedules and branches differently): NVRTC (fmad on, the
// default) turns `q += d·d` into fma.rn(d, d, q), `1 / sqrtf(q / c + eps)` into div.rn, add,
// sqrt.rn, rcp.rn, and `(x − μ)·rstd·γ + β` into fma.rn((x − μ)·rstd, γ, β); the remaining
// mul/add/sub have no product to contract with. Each contraction is decided inside one inlined
// expression, so every kernel that inlines these helpers gets the same instructions (checked on
// the PTX of both files when the fused kernel was added).

// V consecutive storage elements, aligned for 128-bit accesses when they fill whole 16 bytes.
template <typename T, int V>
struct alignas((V * sizeof(T)) % 16 == 0 ? 16 : sizeof(T)) Vec {
    T v[V];
};

template <typename T, int V> __device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
    Vec<T, V> r;
    if constexpr ((V * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < (int)(V * sizeof(T) / 16); ++i)
            reinterpret_cast<uint4*>(&r)[i] = reinterpret_cast<const uint4*>(p)[i];
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) r.v[i] = p[i];
    }
    return r;
}

template <typename T, int V> __device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& r) {
    if constexpr ((V * sizeof(T)) % 16 == 0) {
#pragma unroll
        for (int i = 0; i < (int)(V * sizeof(T) / 16); ++i)
            reinterpret_cast<uint4*>(p)[i] = reinterpret_cast<const uint4*>(&r)[i];
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = r.v[i];
    }
}

// Sums K values over the row group of G warps: warp_sum, then the G warp sums in warp order.
// Every thread of the group gets the same bits. `sh` holds 8·K floats. Must be reached by every
// thread of the block when G > 1 (it synchronises the block).
template <int K>
__device__ __forceinline__ void group_sum(float (&s)[K], float* sh, int G) {
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = warp_sum(s[k]);
    if (G > 1) {
        const int w = threadIdx.x >> 5, first = w / G * G;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k * 8 + w] = s[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float t = 0.0f;
            for (int i = 0; i < G; ++i) t += sh[k * 8 + first + i];
            s[k] = t;
        }
        __syncthreads();
    }
}

// Loads the vectors of a row (starting at `xrow`, nv vectors of V elements) that thread t of
// its row group owns. `live` false (a row past the end) loads nothing.
template <typename A, int V, int M>
__device__ __forceinline__ void ln_load_row(Vec<A, V> (&xr)[M], const A* __restrict__ xrow,
                                            bool live, int t, int gt, int nv) {
#pragma unroll
    for (int k = 0; k < M; ++k) {
        const int j = k * gt + t;
        if (live && j < nv) xr[k] = load_vec<A, V>(xrow + (u64)j * V);
    }
}

// Mean and rstd of a row loaded by ln_load_row (c elements): each thread sums its elements in
// order, then group_sum; the same for Σ (x − μ)². Every thread of the group gets the same bits.
// Must be reached by every thread of the block (group_sum).
template <typename A, int V, int M>
__device__ __forceinline__ void ln_row_stats(const Vec<A, V> (&xr)[M], bool live, int t, int gt,
                                             int nv, int c, float eps, int G, float* sh,
                                             float& mu, float& rs) {
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k) {
        if (live && k * gt + t < nv) {
#pragma unroll
            for (int e = 0; e < V; ++e) s[0] += to_f32(xr[k].v[e]);
        }
    }
    group_sum<1>(s, sh, G);
    mu = s[0] / (float)c;
    float q[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < M; ++k) {
        if (live && k * gt + t < nv) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                const float d = to_f32(xr[k].v[e]) - mu;
                q[0] += d * d;
            }
        }
    }
    group_sum<1>(q, sh, G);
    rs = 1.0f / sqrtf(q[0] / (float)c + eps);
}

// One normalised element before rounding: (x − μ)·rstd·γ + β.
__device__ __forceinline__ float ln_affine(float x, float mu, float rs, float g, float b) {
    return (x - mu) * rs * g + b;
}

// ------------------------------------------------------------------ instantiation helpers
// Kernel entry points are `extern "C"` functions named `<op>_<dtype>[_<dtype>...]`, generated by
// the macros below from one template body each.

// One storage type per entry: f32, bf16, f16.
#define FOR_FLOAT(M) M(float, f32) M(bf16_t, bf16) M(f16_t, f16)
// Activation type A with a second type that is either A or f32 (parameters, gradients, copies).
#define FOR_ACT_AND_WIDE(M)                                                                   \
    M(float, f32, float, f32)                                                                 \
    M(bf16_t, bf16, bf16_t, bf16) M(bf16_t, bf16, float, f32) M(f16_t, f16, f16_t, f16)      \
        M(f16_t, f16, float, f32)
// Every pair of the three float types.
#define FOR_FLOAT_PAIRS(M)                                                                    \
    M(float, f32, float, f32) M(float, f32, bf16_t, bf16) M(float, f32, f16_t, f16)          \
        M(bf16_t, bf16, float, f32) M(bf16_t, bf16, bf16_t, bf16) M(bf16_t, bf16, f16_t, f16) \
            M(f16_t, f16, float, f32) M(f16_t, f16, bf16_t, bf16) M(f16_t, f16, f16_t, f16)

// ------------------------------------------------------------------ runtime-typed access
// Multi-tensor kernels see tensors of different dtypes in one launch: the code (0 f32, 1 bf16,
// 2 f16) is uniform within a block, so the branch costs nothing.

__device__ __forceinline__ float load_dt(u64 base, u64 i, int dt) {
    if (dt == 0) return ((const float*)base)[i];
    if (dt == 1) return to_f32(((const bf16_t*)base)[i]);
    return to_f32(((const f16_t*)base)[i]);
}

__device__ __forceinline__ void store_dt(u64 base, u64 i, int dt, float x) {
    if (dt == 0)
        ((float*)base)[i] = x;
    else if (dt == 1)
        ((bf16_t*)base)[i] = from_f32<bf16_t>(x);
    else
        ((f16_t*)base)[i] = from_f32<f16_t>(x);
}

// ------------------------------------------------------------------ shared math
// The explicitly rounded operations the block below is written with (kernels-hip/duet_hip.h
// defines the same names for AMD): CUDA's _rn intrinsics, which the compiler never contracts.
#define DUET_SFN __device__ __forceinline__
DUET_SFN float duet_fadd(float a, float b) { return __fadd_rn(a, b); }
DUET_SFN float duet_fsub(float a, float b) { return __fsub_rn(a, b); }
DUET_SFN float duet_fmul(float a, float b) { return __fmul_rn(a, b); }
DUET_SFN float duet_fdiv(float a, float b) { return __fdiv_rn(a, b); }
DUET_SFN float duet_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DUET_SFN float duet_fsqrt(float a) { return __fsqrt_rn(a); }
DUET_SFN double duet_dadd(double a, double b) { return __dadd_rn(a, b); }
DUET_SFN double duet_dsub(double a, double b) { return __dsub_rn(a, b); }
DUET_SFN double duet_dmul(double a, double b) { return __dmul_rn(a, b); }
DUET_SFN double duet_ddiv(double a, double b) { return __ddiv_rn(a, b); }
DUET_SFN double duet_dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
DUET_SFN unsigned duet_f2u(float x) { return __float_as_uint(x); }
DUET_SFN float duet_u2f(unsigned x) { return __uint_as_float(x); }
DUET_SFN unsigned long long duet_d2u(double x) { return (unsigned long long)__double_as_longlong(x); }
DUET_SFN double duet_u2d(unsigned long long x) { return __longlong_as_double((long long)x); }

// The shared math block, one source for both vendors (kernels-shared/duet_math.h).
#include "duet_math.h"

// GELU with the hardware exponential and reciprocal (__expf, __fdividef: relative error about
// 2^-21), for CUDA's fused FP8 kernels only (quantize_gelu_*, quantize_grad_t_* with GELU). Those
// kernels have no HIP counterpart (HIP composes gelu_forward and the quantisation, whose GELU is
// the shared one above), and there the shared form's extra arithmetic showed in the step (+3 %
// on the seed fp8 step). Their codes agree with the composition to FP8 rounding, not bit for bit.
DUET_SFN float gelu_sigma_hw(float x) {
    const float x2 = __fmul_rn(x, x);
    const float u = __fmul_rn(GELU_K, __fmaf_rn(__fmul_rn(GELU_C, x2), x, x));
    return __fdividef(1.0f, __fadd_rn(1.0f, __expf(__fmul_rn(-2.0f, u))));
}
DUET_SFN float gelu_f_hw(float x) { return __fmul_rn(x, gelu_sigma_hw(x)); }
DUET_SFN float gelu_grad_f_hw(float x) {
    const float s = gelu_sigma_hw(x);
    const float a = __fmul_rn(__fmul_rn(__fmul_rn(2.0f * GELU_K, x), s), __fsub_rn(1.0f, s));
    const float b = __fmaf_rn(__fmul_rn(3.0f * GELU_C, x), x, 1.0f);
    return __fmaf_rn(a, b, s);
}

// The gradient factor of a clipped step from the global sum of squares, exactly as
// duet_device::clip_grad_scale does on the host (f32 square root, f64 unscaling, one rounding).
__device__ __forceinline__ float clip_grad_scale(float norm_sq, float max_norm, float loss_scale) {
    const float raw = sqrtf(norm_sq);
    const float norm = (float)((double)raw / (double)loss_scale);
    const float coef = max_norm / (norm + 1e-6f);
    const float clip = (max_norm > 0.0f && coef < 1.0f) ? coef : 1.0f;
    return loss_scale == 1.0f ? clip : (float)((double)clip / (double)loss_scale);
}
