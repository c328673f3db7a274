// hip-on-cuda: shared pieces of the stand-in libraries (a TEST DOUBLE, see ../README.md).
//
// Every stand-in library (libamdhip64, libhiprtc, librocblas, libhipblaslt, librccl) is built
// from its own source file plus common.cpp; each has its own copy of this state, and they meet
// only through CUDA itself: a hipStream_t is a CUstream, a hipEvent_t a CUevent, a device pointer
// a CUdeviceptr, and every thread works in the primary context of its current device, which
// libcuda keeps per thread for all of them.
//
// This header includes the CUDA driver API (cuda.h) only; cuBLAS (whose headers clash with HIP's
// vector types) is reached through cublas_side.h.
#pragma once

#include <cuda.h>
#include <cstdarg>
#include <cstddef>
#include <string>

#define HOC_API extern "C" __attribute__((visibility("default")))

#define HOC_STR(x) #x
#define HOC_XSTR(x) HOC_STR(x)

// The CUDA driver functions the stand-ins call. cuda.h maps some names to versioned symbols
// (cuMemAlloc -> cuMemAlloc_v2); the member names and the dlsym names both go through that
// macro expansion, so each member holds the symbol the header declares.
#define HOC_CU_FUNCS(X)                                                                         \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)       \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent)  \
    X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync)         \
    X(cuMemFreeAsync) X(cuMemGetInfo) X(cuMemcpyAsync) X(cuMemsetD8Async) X(cuMemsetD16Async)   \
    X(cuMemsetD32Async) X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamDestroy)             \
    X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize)                \
    X(cuEventDestroy) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuModuleLoadData)                    \
    X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) X(cuFuncSetAttribute)            \
    X(cuGetErrorName) X(cuGetErrorString) X(cuStreamBeginCapture) X(cuStreamEndCapture)          \
    X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)     \
    X(cuEventElapsedTime)

namespace hoc {

struct Driver {
#define HOC_MEMBER(f) decltype(&::f) f;
    HOC_CU_FUNCS(HOC_MEMBER)
#undef HOC_MEMBER
};

// The CUDA driver, loaded (dlopen libcuda.so.1) and initialised (cuInit) once; nullptr when that
// failed, with the reason in `why` (also printed once to stderr).
const Driver* driver(std::string* why = nullptr);

// Prints "hip-on-cuda: <fn>: <message>" to stderr. Every call or argument a stand-in does not
// implement goes through here (and then returns the library's error code), never silently.
void fail(const char* fn, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Prints a failed CUDA call with its name and text; returns `r`.
CUresult cu_check(const char* fn, const char* cu_call, CUresult r);

// The calling thread's current device (hipSetDevice; 0 until set) and making its primary
// context current on this thread. Every entry point that touches the GPU calls bind() first.
int& thread_device();
CUresult bind(const char* fn);
CUresult bind_device(const char* fn, int device);

// For the libraries other than the HIP runtime (rocBLAS, hipBLASLt, hiprtc), which like ROCm's
// work on the calling thread's current device: the device of the thread's current context, or
// device 0's primary context made current when the thread has none (HIP's default device).
CUresult current_device(const char* fn, CUdevice* dev);

// The architecture the HIP runtime stand-in reports: $HIP_ON_CUDA_ARCH (gfx942 or gfx950, bare or
// with features; gfx942 when unset). `full` is the gcnArchName ("gfx942:sramecc+:xnack-").
std::string arch_base();
std::string arch_full();

// The folder of the stand-in root (the parent of the lib/ holding this library).
std::string root_dir();

}  // namespace hoc
