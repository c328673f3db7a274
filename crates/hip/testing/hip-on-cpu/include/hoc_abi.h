// hip-on-cpu: the interface between a compiled kernel module and the runtime that runs it (a TEST
// DOUBLE, ../README.md). Included by kernel_lang.h (in every kernel compile) and by the runtime.
// Plain C++: no header of any library, so the kernel compile stays free of system headers.
//
// Every thread of a block runs as a fiber on its own stack. A stack lives in a region of
// HOC_REGION bytes aligned to HOC_REGION: a guard page at the bottom, the stack above it (growing
// down from just under the thread's HocLane), and the HocLane in the last HOC_LANE_AREA bytes, at
// an offset that depends on the region's index (hoc_lane_of), so that the lanes of a block, whose
// regions are 64 KiB apart, do not all fall in the same cache sets. The kernel code finds its own
// thread (threadIdx, blockIdx, the barrier and shuffle entry points) from the stack pointer
// alone: no thread-local lookup, no global state in the module.
#pragma once

#define HOC_ABI_VERSION 3
/// Bytes per fiber region: a guard page, the stack (grows down), the HocLane near the top.
#define HOC_REGION (64u * 1024u)
#define HOC_LANE_AREA 8192u
#define HOC_LANE_BYTES 256u
#define HOC_GUARD_BYTES 4096u

/// The HocLane of the region at `base` (HOC_REGION-aligned): 64-byte steps by region index.
#define HOC_LANE_OFFSET(base) \
    ((HOC_REGION - HOC_LANE_AREA) + ((((unsigned long)(base)) / HOC_REGION) & 63u) * 64u)

struct HocDim3 {
    unsigned int x, y, z;
};

struct HocLane;

/// Entry points of the runtime a kernel calls (through HocLane::ops).
struct HocOps {
    /// A block barrier: kind 0 = __syncthreads, 1 = __syncthreads_or(pred). Returns the OR of
    /// every thread's pred for kind 1, 0 for kind 0.
    int (*barrier)(HocLane* self, int kind, int pred);
    /// __shfl_xor: the 8-byte value `bits` of this lane, the xor mask and the width; returns the
    /// bits of the lane it reads (HIP's index arithmetic, amd_warp_functions.h).
    unsigned long long (*shfl_xor)(HocLane* self, unsigned long long bits, int mask, int width);
};

/// What a kernel sees of its thread (the runtime keeps more after it, in the same page).
struct HocLane {
    HocDim3 threadIdx, blockIdx, blockDim, gridDim;
    const HocOps* ops;
};

/// A module's table of kernels (exported as `hoc_kernels` / `hoc_kernel_count`).
typedef void (*HocEntry)(void** args);
struct HocKernel {
    const char* name;
    HocEntry entry;
    unsigned int nparams;
    const unsigned int* param_sizes;
    unsigned int launch_bound;  // __launch_bounds__'s maximum threads per block (0: none given)
};
