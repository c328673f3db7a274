// hip-on-cuda: libamdhip64 (the HIP runtime) over the CUDA driver API. A TEST DOUBLE for running
// duet's HIP backend on an NVIDIA GPU; see ../README.md for what it can and cannot show.
//
// Exactly the functions duet's HIP backend loads are exported (crates/hip/bindgen/
// hip_functions.txt, HOST_SYMBOLS and GRAPH_SYMBOLS in src/hip/result.rs, HipSyncLib in src/rccl.rs, the
// two device-property entry points); their signatures are checked by the compiler against the
// real ROCm headers this file is built with. A hipStream_t is a CUstream, a hipEvent_t a
// CUevent, a hipModule_t a CUmodule, a hipFunction_t a CUfunction, a device pointer a
// CUdeviceptr. Arguments or attributes these stand-ins do not implement are refused with
// hipErrorNotSupported or hipErrorInvalidValue and a "hip-on-cuda: <function>: ..." line.
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <hip/hip_deprecated.h>

#include "common.h"
#include "hip_errors.h"

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

using hoc::bind;
using hoc::cu_check;
using hoc::driver;
using hoc::fail;

namespace {

hipError_t to_hip(CUresult r) {
    switch (r) {
        case CUDA_SUCCESS: return hipSuccess;
        case CUDA_ERROR_INVALID_VALUE: return hipErrorInvalidValue;
        case CUDA_ERROR_OUT_OF_MEMORY: return hipErrorOutOfMemory;
        case CUDA_ERROR_NOT_INITIALIZED: return hipErrorNotInitialized;
        case CUDA_ERROR_DEINITIALIZED: return hipErrorDeinitialized;
        case CUDA_ERROR_NO_DEVICE: return hipErrorNoDevice;
        case CUDA_ERROR_INVALID_DEVICE: return hipErrorInvalidDevice;
        case CUDA_ERROR_INVALID_IMAGE: return hipErrorInvalidImage;
        case CUDA_ERROR_INVALID_CONTEXT: return hipErrorInvalidContext;
        case CUDA_ERROR_NO_BINARY_FOR_GPU: return hipErrorNoBinaryForGpu;
        case CUDA_ERROR_INVALID_SOURCE: return hipErrorInvalidSource;
        case CUDA_ERROR_FILE_NOT_FOUND: return hipErrorFileNotFound;
        case CUDA_ERROR_INVALID_HANDLE: return hipErrorInvalidHandle;
        case CUDA_ERROR_NOT_FOUND: return hipErrorNotFound;
        case CUDA_ERROR_NOT_READY: return hipErrorNotReady;
        case CUDA_ERROR_ILLEGAL_ADDRESS: return hipErrorIllegalAddress;
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return hipErrorLaunchOutOfResources;
        case CUDA_ERROR_LAUNCH_TIMEOUT: return hipErrorLaunchTimeOut;
        case CUDA_ERROR_LAUNCH_FAILED: return hipErrorLaunchFailure;
        case CUDA_ERROR_NOT_SUPPORTED: return hipErrorNotSupported;
        case CUDA_ERROR_ASSERT: return hipErrorAssert;
        default: return hipErrorUnknown;
    }
}

// A CUDA call made on behalf of HIP function `fn`: printed when it fails, mapped to hipError_t.
#define CU(fn, call) to_hip(cu_check(fn, #call, (call)))

// Loads the driver and binds the thread's context; returns from the entry point on failure.
#define ENTER(fn)                                                     \
    const hoc::Driver* d = driver();                                  \
    if (!d) return hipErrorNoDevice;                                  \
    if (CUresult br = bind(fn); br != CUDA_SUCCESS) return to_hip(br)

CUstream cs(hipStream_t s) { return reinterpret_cast<CUstream>(s); }
CUdeviceptr dp(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

int cu_attr(const hoc::Driver* d, CUdevice_attribute a, int dev) {
    CUdevice cd = 0;
    int v = 0;
    if (d->cuDeviceGet(&cd, dev) != CUDA_SUCCESS) return 0;
    if (d->cuDeviceGetAttribute(&v, a, cd) != CUDA_SUCCESS) return 0;
    return v;
}

// gfx942 -> 9.4, gfx950 -> 9.5, gfx90a -> 9.0: what ROCm reports as the compute capability.
void arch_version(int* major, int* minor) {
    std::string a = hoc::arch_base();
    *major = 9;
    *minor = 0;
    if (a.size() >= 6 && a.compare(0, 3, "gfx") == 0) {
        std::string digits = a.substr(3);
        if (digits.size() == 3) {
            *major = digits[0] - '0';
            *minor = digits[1] - '0';
        } else if (digits.size() == 4) {
            *major = (digits[0] - '0') * 10 + (digits[1] - '0');
            *minor = digits[2] - '0';
        }
    }
}

std::string device_name(const hoc::Driver* d, int dev) {
    char buf[200] = {0};
    CUdevice cd = 0;
    if (d->cuDeviceGet(&cd, dev) == CUDA_SUCCESS) d->cuDeviceGetName(buf, sizeof buf - 1, cd);
    return std::string("HIP-on-CUDA stand-in (") + hoc::arch_base() + " on " + buf + ")";
}

template <typename Props>
hipError_t fill_props(const char* fn, Props* p, int dev) {
    ENTER(fn);
    int count = 0;
    d->cuDeviceGetCount(&count);
    if (dev < 0 || dev >= count) return hipErrorInvalidDevice;
    std::memset(p, 0, sizeof *p);
    std::string name = device_name(d, dev);
    std::snprintf(p->name, sizeof p->name, "%s", name.c_str());
    std::snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", hoc::arch_full().c_str());
    CUdevice cd = 0;
    d->cuDeviceGet(&cd, dev);
    size_t total = 0;
    d->cuDeviceTotalMem(&total, cd);
    p->totalGlobalMem = total;
    p->sharedMemPerBlock = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, dev);
    p->regsPerBlock = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, dev);
    p->warpSize = cu_attr(d, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev);
    p->maxThreadsPerBlock = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev);
    p->maxThreadsDim[0] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, dev);
    p->maxThreadsDim[1] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, dev);
    p->maxThreadsDim[2] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, dev);
    p->maxGridSize[0] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, dev);
    p->maxGridSize[1] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, dev);
    p->maxGridSize[2] = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, dev);
    p->multiProcessorCount = cu_attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    p->l2CacheSize = cu_attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
    p->pciBusID = cu_attr(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
    p->pciDeviceID = cu_attr(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
    p->pciDomainID = cu_attr(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
    arch_version(&p->major, &p->minor);
    return hipSuccess;
}

}  // namespace

// ---------------------------------------------------------------- init, versions, devices

HOC_API hipError_t hipInit(unsigned int flags) {
    if (flags != 0) {
        fail("hipInit", "flags %u (only 0 exists)", flags);
        return hipErrorInvalidValue;
    }
    return driver() ? hipSuccess : hipErrorNoDevice;
}

HOC_API hipError_t hipRuntimeGetVersion(int* v) {
    if (!v) return hipErrorInvalidValue;
    *v = HIP_VERSION;  // the ROCm headers this stand-in was built against
    return hipSuccess;
}

HOC_API hipError_t hipDriverGetVersion(int* v) {
    if (!v) return hipErrorInvalidValue;
    *v = HIP_VERSION;
    return hipSuccess;
}

HOC_API hipError_t hipGetDeviceCount(int* count) {
    if (!count) return hipErrorInvalidValue;
    const hoc::Driver* d = driver();
    if (!d) {
        *count = 0;
        return hipErrorNoDevice;
    }
    hipError_t e = CU("hipGetDeviceCount", d->cuDeviceGetCount(count));
    if (e == hipSuccess && *count == 0) return hipErrorNoDevice;
    return e;
}

HOC_API hipError_t hipSetDevice(int id) {
    const hoc::Driver* d = driver();
    if (!d) return hipErrorNoDevice;
    int count = 0;
    d->cuDeviceGetCount(&count);
    if (id < 0 || id >= count) return hipErrorInvalidDevice;
    hoc::thread_device() = id;
    return to_hip(hoc::bind_device("hipSetDevice", id));
}

HOC_API hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int dev) {
    if (!pi) return hipErrorInvalidValue;
    ENTER("hipDeviceGetAttribute");
    int count = 0;
    d->cuDeviceGetCount(&count);
    if (dev < 0 || dev >= count) return hipErrorInvalidDevice;
    int major = 0, minor = 0;
    arch_version(&major, &minor);
    switch (attr) {
        case hipDeviceAttributeWarpSize:
            // The hardware's: kernels run 32 wide here (see the README: wave64 is not shown).
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev);
            return hipSuccess;
        case hipDeviceAttributeMultiprocessorCount:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
            return hipSuccess;
        case hipDeviceAttributeMaxSharedMemoryPerBlock:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, dev);
            return hipSuccess;
        case hipDeviceAttributeMaxThreadsPerBlock:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev);
            return hipSuccess;
        case hipDeviceAttributeL2CacheSize:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev);
            return hipSuccess;
        case hipDeviceAttributeMemoryPoolsSupported:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
            return hipSuccess;
        case hipDeviceAttributeClockRate:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev);
            return hipSuccess;
        case hipDeviceAttributeMemoryClockRate:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev);
            return hipSuccess;
        case hipDeviceAttributeMemoryBusWidth:
            *pi = cu_attr(d, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev);
            return hipSuccess;
        case hipDeviceAttributeComputeCapabilityMajor:
            *pi = major;
            return hipSuccess;
        case hipDeviceAttributeComputeCapabilityMinor:
            *pi = minor;
            return hipSuccess;
        default:
            fail("hipDeviceGetAttribute", "attribute %d is not implemented by the stand-in",
                 static_cast<int>(attr));
            return hipErrorInvalidValue;
    }
}

HOC_API hipError_t hipDeviceGetName(char* name, int len, hipDevice_t dev) {
    if (!name || len <= 0) return hipErrorInvalidValue;
    ENTER("hipDeviceGetName");
    int count = 0;
    d->cuDeviceGetCount(&count);
    if (dev < 0 || dev >= count) return hipErrorInvalidDevice;
    std::snprintf(name, static_cast<size_t>(len), "%s", device_name(d, dev).c_str());
    return hipSuccess;
}

HOC_API hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600* p, int dev) {
    if (!p) return hipErrorInvalidValue;
    return fill_props("hipGetDevicePropertiesR0600", p, dev);
}

// The unsuffixed symbol ROCm 6/7 still exports fills the pre-6.0 layout.
#undef hipGetDeviceProperties
HOC_API hipError_t hipGetDeviceProperties(hipDeviceProp_tR0000* p, int dev) {
    if (!p) return hipErrorInvalidValue;
    return fill_props("hipGetDeviceProperties", p, dev);
}

// ---------------------------------------------------------------- memory

HOC_API hipError_t hipMalloc(void** ptr, size_t size) {
    if (!ptr) return hipErrorInvalidValue;
    ENTER("hipMalloc");
    *ptr = nullptr;
    if (size == 0) return hipSuccess;  // HIP: a zero-size allocation succeeds with nullptr
    CUdeviceptr p = 0;
    hipError_t e = CU("hipMalloc", d->cuMemAlloc(&p, size));
    if (e == hipSuccess) *ptr = reinterpret_cast<void*>(p);
    return e;
}

HOC_API hipError_t hipFree(void* ptr) {
    if (!ptr) return hipSuccess;
    ENTER("hipFree");
    return CU("hipFree", d->cuMemFree(dp(ptr)));
}

HOC_API hipError_t hipMallocAsync(void** ptr, size_t size, hipStream_t stream) {
    if (!ptr) return hipErrorInvalidValue;
    ENTER("hipMallocAsync");
    *ptr = nullptr;
    if (size == 0) return hipSuccess;
    CUdeviceptr p = 0;
    hipError_t e = CU("hipMallocAsync", d->cuMemAllocAsync(&p, size, cs(stream)));
    if (e == hipSuccess) *ptr = reinterpret_cast<void*>(p);
    return e;
}

HOC_API hipError_t hipFreeAsync(void* ptr, hipStream_t stream) {
    if (!ptr) return hipSuccess;
    ENTER("hipFreeAsync");
    return CU("hipFreeAsync", d->cuMemFreeAsync(dp(ptr), cs(stream)));
}

HOC_API hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total) {
    if (!free_bytes || !total) return hipErrorInvalidValue;
    ENTER("hipMemGetInfo");
    return CU("hipMemGetInfo", d->cuMemGetInfo(free_bytes, total));
}

HOC_API hipError_t hipMemcpyAsync(void* dst, const void* src, size_t n, hipMemcpyKind kind,
                                  hipStream_t stream) {
    switch (kind) {
        case hipMemcpyHostToHost:
        case hipMemcpyHostToDevice:
        case hipMemcpyDeviceToHost:
        case hipMemcpyDeviceToDevice:
        case hipMemcpyDefault:
        case hipMemcpyDeviceToDeviceNoCU:
            break;
        default:
            fail("hipMemcpyAsync", "copy kind %d", static_cast<int>(kind));
            return hipErrorInvalidMemcpyDirection;
    }
    if (n == 0) return hipSuccess;
    if (!dst || !src) return hipErrorInvalidValue;
    ENTER("hipMemcpyAsync");
    // Unified addressing: the driver tells host from device memory by the pointers.
    return CU("hipMemcpyAsync", d->cuMemcpyAsync(dp(dst), dp(src), n, cs(stream)));
}

HOC_API hipError_t hipMemsetAsync(void* dst, int value, size_t n, hipStream_t stream) {
    if (n == 0) return hipSuccess;
    ENTER("hipMemsetAsync");
    return CU("hipMemsetAsync",
              d->cuMemsetD8Async(dp(dst), static_cast<unsigned char>(value), n, cs(stream)));
}

HOC_API hipError_t hipMemsetD8Async(hipDeviceptr_t dst, unsigned char value, size_t count,
                                    hipStream_t stream) {
    if (count == 0) return hipSuccess;
    ENTER("hipMemsetD8Async");
    return CU("hipMemsetD8Async", d->cuMemsetD8Async(dp(dst), value, count, cs(stream)));
}

HOC_API hipError_t hipMemsetD16Async(hipDeviceptr_t dst, unsigned short value, size_t count,
                                     hipStream_t stream) {
    if (count == 0) return hipSuccess;
    ENTER("hipMemsetD16Async");
    return CU("hipMemsetD16Async", d->cuMemsetD16Async(dp(dst), value, count, cs(stream)));
}

HOC_API hipError_t hipMemsetD32Async(hipDeviceptr_t dst, int value, size_t count,
                                     hipStream_t stream) {
    if (count == 0) return hipSuccess;
    ENTER("hipMemsetD32Async");
    return CU("hipMemsetD32Async",
              d->cuMemsetD32Async(dp(dst), static_cast<unsigned int>(value), count, cs(stream)));
}

HOC_API hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
    if (!ptr) return hipErrorInvalidValue;
    // hipHostMallocDefault (0) and Portable/Mapped/WriteCombined, which have CUDA's values.
    const unsigned known = hipHostMallocPortable | hipHostMallocMapped | hipHostMallocWriteCombined;
    if (flags & ~known) {
        fail("hipHostMalloc", "flags 0x%x are not implemented by the stand-in", flags & ~known);
        return hipErrorNotSupported;
    }
    ENTER("hipHostMalloc");
    *ptr = nullptr;
    return CU("hipHostMalloc", d->cuMemHostAlloc(ptr, size, flags));
}

HOC_API hipError_t hipHostFree(void* ptr) {
    if (!ptr) return hipSuccess;
    ENTER("hipHostFree");
    return CU("hipHostFree", d->cuMemFreeHost(ptr));
}

// ---------------------------------------------------------------- streams and events

HOC_API hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
    if (!stream) return hipErrorInvalidValue;
    if (flags != hipStreamDefault && flags != hipStreamNonBlocking) {
        fail("hipStreamCreateWithFlags", "flags 0x%x", flags);
        return hipErrorInvalidValue;
    }
    ENTER("hipStreamCreateWithFlags");
    CUstream s = nullptr;
    // hipStreamNonBlocking == CU_STREAM_NON_BLOCKING == 1.
    hipError_t e = CU("hipStreamCreateWithFlags", d->cuStreamCreate(&s, flags));
    if (e == hipSuccess) *stream = reinterpret_cast<hipStream_t>(s);
    return e;
}

HOC_API hipError_t hipStreamSynchronize(hipStream_t stream) {
    ENTER("hipStreamSynchronize");
    return CU("hipStreamSynchronize", d->cuStreamSynchronize(cs(stream)));
}

HOC_API hipError_t hipStreamDestroy(hipStream_t stream) {
    if (!stream) return hipErrorInvalidHandle;
    ENTER("hipStreamDestroy");
    return CU("hipStreamDestroy", d->cuStreamDestroy(cs(stream)));
}

HOC_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    if (!event) return hipErrorInvalidHandle;
    if (flags != 0) {
        fail("hipStreamWaitEvent", "flags 0x%x", flags);
        return hipErrorInvalidValue;
    }
    ENTER("hipStreamWaitEvent");
    return CU("hipStreamWaitEvent",
              d->cuStreamWaitEvent(cs(stream), reinterpret_cast<CUevent>(event), 0));
}

HOC_API hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
    if (!event) return hipErrorInvalidValue;
    // Default/BlockingSync/DisableTiming/Interprocess have CUDA's values (0, 1, 2, 4).
    const unsigned known = hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess;
    if (flags & ~known) {
        fail("hipEventCreateWithFlags", "flags 0x%x are not implemented by the stand-in",
             flags & ~known);
        return hipErrorInvalidValue;
    }
    ENTER("hipEventCreateWithFlags");
    CUevent e = nullptr;
    hipError_t r = CU("hipEventCreateWithFlags", d->cuEventCreate(&e, flags));
    if (r == hipSuccess) *event = reinterpret_cast<hipEvent_t>(e);
    return r;
}

HOC_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    if (!event) return hipErrorInvalidHandle;
    ENTER("hipEventRecord");
    return CU("hipEventRecord", d->cuEventRecord(reinterpret_cast<CUevent>(event), cs(stream)));
}

HOC_API hipError_t hipEventSynchronize(hipEvent_t event) {
    if (!event) return hipErrorInvalidHandle;
    ENTER("hipEventSynchronize");
    return CU("hipEventSynchronize", d->cuEventSynchronize(reinterpret_cast<CUevent>(event)));
}

HOC_API hipError_t hipEventDestroy(hipEvent_t event) {
    if (!event) return hipErrorInvalidHandle;
    ENTER("hipEventDestroy");
    return CU("hipEventDestroy", d->cuEventDestroy(reinterpret_cast<CUevent>(event)));
}

HOC_API hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
    if (!ms) return hipErrorInvalidValue;
    if (!start || !stop) return hipErrorInvalidHandle;
    ENTER("hipEventElapsedTime");
    return CU("hipEventElapsedTime", d->cuEventElapsedTime(ms, reinterpret_cast<CUevent>(start),
                                                            reinterpret_cast<CUevent>(stop)));
}

// ---------------------------------------------------------------- stream capture and graphs
// hipGraph_t = CUgraph, hipGraphExec_t = CUgraphExec; the capture modes have CUDA's values
// (global 0, thread-local 1, relaxed 2).

HOC_API hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode) {
    if (mode != hipStreamCaptureModeGlobal && mode != hipStreamCaptureModeThreadLocal &&
        mode != hipStreamCaptureModeRelaxed) {
        fail("hipStreamBeginCapture", "capture mode %d", static_cast<int>(mode));
        return hipErrorInvalidValue;
    }
    ENTER("hipStreamBeginCapture");
    return CU("hipStreamBeginCapture",
              d->cuStreamBeginCapture(cs(stream), static_cast<CUstreamCaptureMode>(mode)));
}

HOC_API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t* graph) {
    if (!graph) return hipErrorInvalidValue;
    ENTER("hipStreamEndCapture");
    CUgraph g = nullptr;
    hipError_t e = CU("hipStreamEndCapture", d->cuStreamEndCapture(cs(stream), &g));
    *graph = reinterpret_cast<hipGraph_t>(g);
    return e;
}

HOC_API hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t* exec, hipGraph_t graph,
                                                unsigned long long flags) {
    if (!exec) return hipErrorInvalidValue;
    if (!graph) return hipErrorInvalidHandle;
    if (flags != 0) {
        fail("hipGraphInstantiateWithFlags", "flags 0x%llx are not implemented by the stand-in",
             flags);
        return hipErrorInvalidValue;
    }
    ENTER("hipGraphInstantiateWithFlags");
    CUgraphExec x = nullptr;
    hipError_t e = CU("hipGraphInstantiateWithFlags",
                      d->cuGraphInstantiateWithFlags(&x, reinterpret_cast<CUgraph>(graph), 0));
    if (e == hipSuccess) *exec = reinterpret_cast<hipGraphExec_t>(x);
    return e;
}

HOC_API hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    if (!exec) return hipErrorInvalidHandle;
    ENTER("hipGraphLaunch");
    return CU("hipGraphLaunch", d->cuGraphLaunch(reinterpret_cast<CUgraphExec>(exec), cs(stream)));
}

HOC_API hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    if (!exec) return hipErrorInvalidHandle;
    ENTER("hipGraphExecDestroy");
    return CU("hipGraphExecDestroy", d->cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(exec)));
}

HOC_API hipError_t hipGraphDestroy(hipGraph_t graph) {
    if (!graph) return hipErrorInvalidHandle;
    ENTER("hipGraphDestroy");
    return CU("hipGraphDestroy", d->cuGraphDestroy(reinterpret_cast<CUgraph>(graph)));
}

// ---------------------------------------------------------------- modules and launches

HOC_API hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
    if (!module || !image) return hipErrorInvalidValue;
    ENTER("hipModuleLoadData");
    CUmodule m = nullptr;
    // An AMD code object (or anything but what the hiprtc stand-in made) is refused by the
    // driver with CUDA_ERROR_INVALID_IMAGE -> hipErrorInvalidImage, as ROCm refuses a code
    // object for another target.
    hipError_t e = CU("hipModuleLoadData", d->cuModuleLoadData(&m, image));
    if (e == hipSuccess) *module = reinterpret_cast<hipModule_t>(m);
    return e;
}

HOC_API hipError_t hipModuleGetFunction(hipFunction_t* f, hipModule_t module, const char* name) {
    if (!f || !module || !name) return hipErrorInvalidValue;
    ENTER("hipModuleGetFunction");
    CUfunction cf = nullptr;
    CUresult r = d->cuModuleGetFunction(&cf, reinterpret_cast<CUmodule>(module), name);
    if (r == CUDA_ERROR_NOT_FOUND) {
        fail("hipModuleGetFunction", "no kernel named '%s' in the module", name);
        return hipErrorNotFound;
    }
    hipError_t e = to_hip(cu_check("hipModuleGetFunction", "cuModuleGetFunction", r));
    if (e == hipSuccess) *f = reinterpret_cast<hipFunction_t>(cf);
    return e;
}

HOC_API hipError_t hipModuleUnload(hipModule_t module) {
    if (!module) return hipErrorInvalidHandle;
    ENTER("hipModuleUnload");
    return CU("hipModuleUnload", d->cuModuleUnload(reinterpret_cast<CUmodule>(module)));
}

HOC_API hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy,
                                         unsigned int gz, unsigned int bx, unsigned int by,
                                         unsigned int bz, unsigned int shared, hipStream_t stream,
                                         void** params, void** extra) {
    if (!f) return hipErrorInvalidResourceHandle;
    if (extra) {
        // HIP's HIP_LAUNCH_PARAM_END is 0x03, CUDA's CU_LAUNCH_PARAM_END 0x00: the packed-buffer
        // form would need translating; duet passes kernelParams only.
        fail("hipModuleLaunchKernel", "the 'extra' (packed argument buffer) form is not implemented");
        return hipErrorNotSupported;
    }
    ENTER("hipModuleLaunchKernel");
    CUfunction cf = reinterpret_cast<CUfunction>(f);
    if (shared > 48 * 1024) {
        // CUDA needs an opt-in above 48 KiB of dynamic shared memory; HIP does not. The opt-in
        // belongs to the function, which every thread shares: it only ever rises (under a lock),
        // so a launch asking for less never lowers it under another thread's launch that asked
        // for more (issue 49: a per-launch setting made that launch fail).
        static std::mutex opt_in_lock;
        static std::unordered_map<CUfunction, unsigned> opt_in;
        std::lock_guard<std::mutex> g(opt_in_lock);
        unsigned& have = opt_in[cf];
        if (shared > have) {
            hipError_t e = CU("hipModuleLaunchKernel",
                              d->cuFuncSetAttribute(cf, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    static_cast<int>(shared)));
            if (e != hipSuccess) return e;
            have = shared;
        }
    }
    return CU("hipModuleLaunchKernel",
              d->cuLaunchKernel(cf, gx, gy, gz, bx, by, bz, shared, cs(stream), params, nullptr));
}

// ---------------------------------------------------------------- errors

HOC_API const char* hipGetErrorName(hipError_t e) {
#define HOC_NAME(n) \
    if (e == n) return #n;
    HOC_HIP_ERRORS(HOC_NAME)
#undef HOC_NAME
    return "hipErrorUnknown";
}

HOC_API const char* hipGetErrorString(hipError_t e) {
    switch (e) {
        case hipSuccess: return "no error";
        case hipErrorOutOfMemory: return "out of memory";
        case hipErrorInvalidValue: return "invalid argument";
        case hipErrorNoDevice: return "no GPU usable through the HIP-on-CUDA stand-in (see stderr)";
        case hipErrorInvalidDevice: return "invalid device ordinal";
        case hipErrorInvalidImage: return "device kernel image is invalid";
        case hipErrorNotSupported: return "operation not supported by the HIP-on-CUDA stand-in";
        default: return hipGetErrorName(e);
    }
}
