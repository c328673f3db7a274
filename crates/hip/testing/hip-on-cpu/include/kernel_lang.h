// hip-on-cpu: the HIP kernel language, as far as duet's kernels use it, for host C++ (a TEST
// DOUBLE, ../README.md). The hiprtc stand-in force-includes this file in front of every program
// and compiles with -nostdinc: nothing else is declared, so a kernel that uses anything not
// below (a HIP builtin, a math function, an MFMA intrinsic, a wider atomic) fails to compile,
// and the stand-in's log names the symbol.
//
// What is here, and nothing more (what kernels-hip/ and kernels-shared/ use on the AMD path):
//   __global__ (extern "C" entry points), __device__, __forceinline__, __launch_bounds__(n)
//   threadIdx / blockIdx / blockDim / gridDim (.x .y .z)
//   static __shared__ arrays (one instance: the platform runs one block at a time)
//   __syncthreads(), __syncthreads_or(int)
//   __shfl_xor(float|double, laneMask, width)           (width required, as every caller passes it)
//   atomicMax(unsigned int*, unsigned int), atomicMin(unsigned long long*, unsigned long long)
//   __float_as_uint, __uint_as_float
//   fmaxf, fabsf, ldexpf, rintf, min(int, int)
//   the compiler's own: __builtin_bit_cast, __builtin_fmaf, __builtin_fma, __builtin_sqrtf,
//   _Float16 (f16 <-> f32 conversions round to nearest even, as the hardware's)
// The arch macros (__gfx942__, ...) are not defined: the target is this CPU, whatever
// gcnArchName the platform reports, so arch-guarded paths (the MFMA flash attention) are not
// compiled, and an MFMA builtin outside such a guard fails the compile by name.
#pragma once

#include "hoc_abi.h"

// ---------------------------------------------------------------- qualifiers
// Markers the stand-in finds in the preprocessed program (the kernels' names and launch bounds),
// then defines away for the compile proper.
#define __global__ __hoc_global__
#define __launch_bounds__(...) __hoc_launch_bounds__(__VA_ARGS__)
#define __device__
#define __forceinline__ inline
// One instance, the running block's: the platform runs one block at a time, on any thread (a
// block's threads are fibers of one OS thread). Contents are not cleared between blocks (on a GPU
// they are undefined).
#define __shared__ static

// ---------------------------------------------------------------- the current thread
/// This thread's HocLane: near the top of the HOC_REGION-aligned region holding its stack.
static inline __attribute__((always_inline)) HocLane* __hoc_self() {
    unsigned long sp;
#if defined(__x86_64__)
    __asm__("movq %%rsp, %0" : "=r"(sp));
#elif defined(__aarch64__)
    __asm__("mov %0, sp" : "=r"(sp));
#else
#error "hip-on-cpu: x86-64 or aarch64 only"
#endif
    const unsigned long base = sp & ~(unsigned long)(HOC_REGION - 1);
    return (HocLane*)(base + HOC_LANE_OFFSET(base));
}

#define threadIdx (__hoc_self()->threadIdx)
#define blockIdx (__hoc_self()->blockIdx)
#define blockDim (__hoc_self()->blockDim)
#define gridDim (__hoc_self()->gridDim)

// ---------------------------------------------------------------- synchronisation
static inline void __syncthreads() {
    HocLane* s = __hoc_self();
    s->ops->barrier(s, 0, 0);
}
static inline int __syncthreads_or(int pred) {
    HocLane* s = __hoc_self();
    return s->ops->barrier(s, 1, pred != 0);
}

// HIP's __shfl_xor (amd_warp_functions.h): index = lane ^ mask, or the lane itself when that is
// at or past the end of its width-segment; the wave's lanes exchange values through the
// runtime's per-wave scratchpad.
static inline float __shfl_xor(float var, int lane_mask, int width) {
    HocLane* s = __hoc_self();
    const unsigned long long r =
        s->ops->shfl_xor(s, (unsigned long long)__builtin_bit_cast(unsigned int, var), lane_mask, width);
    return __builtin_bit_cast(float, (unsigned int)r);
}
static inline double __shfl_xor(double var, int lane_mask, int width) {
    HocLane* s = __hoc_self();
    return __builtin_bit_cast(
        double, s->ops->shfl_xor(s, __builtin_bit_cast(unsigned long long, var), lane_mask, width));
}

// ---------------------------------------------------------------- atomics (device scope)
static inline unsigned int atomicMax(unsigned int* address, unsigned int val) {
    unsigned int old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old < val &&
           !__atomic_compare_exchange_n(address, &old, val, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline unsigned long long atomicMin(unsigned long long* address, unsigned long long val) {
    unsigned long long old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (old > val &&
           !__atomic_compare_exchange_n(address, &old, val, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

// ---------------------------------------------------------------- bits and math
static inline unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
static inline float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
static inline float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static inline float fabsf(float a) { return __builtin_fabsf(a); }
static inline float ldexpf(float a, int e) { return __builtin_ldexpf(a, e); }
static inline float rintf(float a) { return __builtin_rintf(a); }
static inline int min(int a, int b) { return a < b ? a : b; }
