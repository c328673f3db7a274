// hip-on-cpu: libamdhip64 (the HIP runtime) on the CPU. A TEST DOUBLE for running duet's HIP
// backend with its kernels executed at a chosen wave size; see ../README.md.
//
// Exactly the functions duet's HIP backend loads are exported (crates/hip/bindgen/
// hip_functions.txt, HOST_SYMBOLS and GRAPH_SYMBOLS in src/hip/result.rs, HipSyncLib in
// src/rccl.rs, the two device-property entry points); their signatures are checked by the
// compiler against the real ROCm headers this file is built with. One device: this CPU,
// reporting $HIP_ON_CPU_ARCH and a wavefront of $HIP_ON_CPU_WAVE lanes. Arguments or attributes
// not implemented are refused with an error code and a "hip-on-cpu: <function>: ..." line.
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>
#include <hip/hip_deprecated.h>

#include "core.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

using hoc::fail;

namespace {

#define HOC_HIP_ERRORS_USED(X)                                                                   \
    X(hipSuccess) X(hipErrorInvalidValue) X(hipErrorOutOfMemory) X(hipErrorNotInitialized)      \
    X(hipErrorNoDevice) X(hipErrorInvalidDevice) X(hipErrorInvalidImage) X(hipErrorNotFound)    \
    X(hipErrorInvalidHandle) X(hipErrorNotSupported) X(hipErrorLaunchFailure)                  \
    X(hipErrorInvalidConfiguration) X(hipErrorInvalidMemcpyDirection) X(hipErrorIllegalState)  \
    X(hipErrorStreamCaptureUnsupported) X(hipErrorInvalidResourceHandle) X(hipErrorUnknown)

/// The platform refuses to start on a malformed setting.
bool ready(const char* fn) {
    if (!hoc::settings().error.empty()) {
        fail(fn, "%s", hoc::settings().error.c_str());
        return false;
    }
    return true;
}

// gfx942 -> 9.4, gfx950 -> 9.5, gfx90a -> 9.0: what ROCm reports as the compute capability.
void arch_version(int* major, int* minor) {
    const std::string& a = hoc::settings().arch_base;
    *major = 9;
    *minor = 0;
    if (a.size() >= 6 && a.compare(0, 3, "gfx") == 0) {
        std::string d = a.substr(3);
        if (d.size() == 3) {
            *major = d[0] - '0';
            *minor = d[1] - '0';
        } else if (d.size() == 4) {
            *major = (d[0] - '0') * 10 + (d[1] - '0');
            *minor = d[2] - '0';
        }
    }
}

std::string device_name() {
    return "HIP-on-CPU stand-in (" + hoc::settings().arch_base + ", wave" +
           std::to_string(hoc::settings().wave) + ")";
}

constexpr int kSharedPerBlock = 64 * 1024;  // CDNA's LDS per workgroup

template <typename Props>
hipError_t fill_props(const char* fn, Props* p, int dev) {
    if (!ready(fn)) return hipErrorNoDevice;
    if (dev != 0) return hipErrorInvalidDevice;
    std::memset(p, 0, sizeof *p);
    std::snprintf(p->name, sizeof p->name, "%s", device_name().c_str());
    std::snprintf(p->gcnArchName, sizeof p->gcnArchName, "%s", hoc::settings().arch_full.c_str());
    p->totalGlobalMem = hoc::kDeviceMemory;
    p->sharedMemPerBlock = kSharedPerBlock;
    p->regsPerBlock = 65536;
    p->warpSize = hoc::settings().wave;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = p->maxThreadsDim[2] = 1024;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65536;
    p->multiProcessorCount = 1;
    p->l2CacheSize = 4 << 20;
    arch_version(&p->major, &p->minor);
    return hipSuccess;
}

hoc::Stream* S(hipStream_t s) { return reinterpret_cast<hoc::Stream*>(s); }

struct Event {
    std::chrono::steady_clock::time_point t{};
    bool recorded = false;
};
Event* E(hipEvent_t e) { return reinterpret_cast<Event*>(e); }

}  // namespace

// ---------------------------------------------------------------- init, versions, devices

HOC_API hipError_t hipInit(unsigned int flags) {
    if (flags != 0) {
        fail("hipInit", "flags %u (only 0 exists)", flags);
        return hipErrorInvalidValue;
    }
    return ready("hipInit") ? hipSuccess : hipErrorNoDevice;
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
    *count = ready("hipGetDeviceCount") ? 1 : 0;
    return *count ? hipSuccess : hipErrorNoDevice;
}

HOC_API hipError_t hipSetDevice(int id) {
    if (!ready("hipSetDevice")) return hipErrorNoDevice;
    return id == 0 ? hipSuccess : hipErrorInvalidDevice;
}

HOC_API hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int dev) {
    if (!pi) return hipErrorInvalidValue;
    if (!ready("hipDeviceGetAttribute")) return hipErrorNoDevice;
    if (dev != 0) return hipErrorInvalidDevice;
    int major = 0, minor = 0;
    arch_version(&major, &minor);
    switch (attr) {
        case hipDeviceAttributeWarpSize: *pi = hoc::settings().wave; return hipSuccess;
        case hipDeviceAttributeMultiprocessorCount: *pi = 1; return hipSuccess;
        case hipDeviceAttributeMaxSharedMemoryPerBlock: *pi = kSharedPerBlock; return hipSuccess;
        case hipDeviceAttributeMaxThreadsPerBlock: *pi = 1024; return hipSuccess;
        case hipDeviceAttributeL2CacheSize: *pi = 4 << 20; return hipSuccess;
        case hipDeviceAttributeMemoryPoolsSupported: *pi = 1; return hipSuccess;
        case hipDeviceAttributeComputeCapabilityMajor: *pi = major; return hipSuccess;
        case hipDeviceAttributeComputeCapabilityMinor: *pi = minor; return hipSuccess;
        default:
            fail("hipDeviceGetAttribute", "attribute %d is not implemented by the stand-in",
                 static_cast<int>(attr));
            return hipErrorInvalidValue;
    }
}

HOC_API hipError_t hipDeviceGetName(char* name, int len, hipDevice_t dev) {
    if (!name || len <= 0) return hipErrorInvalidValue;
    if (dev != 0) return hipErrorInvalidDevice;
    std::snprintf(name, static_cast<size_t>(len), "%s", device_name().c_str());
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
    *ptr = nullptr;
    if (size == 0) return hipSuccess;  // HIP: a zero-size allocation succeeds with nullptr
    *ptr = hoc::dev_alloc(size);
    return *ptr ? hipSuccess : hipErrorOutOfMemory;
}

HOC_API hipError_t hipFree(void* ptr) {
    if (!ptr) return hipSuccess;
    if (!hoc::dev_free(ptr)) {
        fail("hipFree", "%p is not an allocation of this device", ptr);
        return hipErrorInvalidValue;
    }
    return hipSuccess;
}

// Stream-ordered allocation: every earlier operation of the stream has completed when the call
// returns (operations run as they are enqueued), so allocating and freeing now is in order.
HOC_API hipError_t hipMallocAsync(void** ptr, size_t size, hipStream_t stream) {
    (void)stream;
    return hipMalloc(ptr, size);
}

HOC_API hipError_t hipFreeAsync(void* ptr, hipStream_t stream) {
    (void)stream;
    return hipFree(ptr);
}

HOC_API hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total) {
    if (!free_bytes || !total) return hipErrorInvalidValue;
    *total = hoc::kDeviceMemory;
    size_t used = hoc::dev_allocated();
    *free_bytes = used < *total ? *total - used : 0;
    return hipSuccess;
}

HOC_API hipError_t hipMemcpyAsync(void* dst, const void* src, size_t n, hipMemcpyKind kind,
                                  hipStream_t stream) {
    switch (kind) {
        case hipMemcpyHostToHost:
        case hipMemcpyHostToDevice:
        case hipMemcpyDeviceToHost:
        case hipMemcpyDeviceToDevice:
        case hipMemcpyDefault:
            break;
        default:
            fail("hipMemcpyAsync", "copy kind %d", static_cast<int>(kind));
            return hipErrorInvalidMemcpyDirection;
    }
    if (n == 0) return hipSuccess;
    if (!dst || !src) return hipErrorInvalidValue;
    return static_cast<hipError_t>(hoc::submit(S(stream), [=] {
        std::memmove(dst, src, n);
        return 0;
    }));
}

namespace {
template <typename T>
hipError_t fill(void* dst, T value, size_t count, hipStream_t stream) {
    if (count == 0) return hipSuccess;
    if (!dst) return hipErrorInvalidValue;
    return static_cast<hipError_t>(hoc::submit(S(stream), [=] {
        T* d = static_cast<T*>(dst);
        for (size_t i = 0; i < count; i++) d[i] = value;
        return 0;
    }));
}
}  // namespace

HOC_API hipError_t hipMemsetAsync(void* dst, int value, size_t n, hipStream_t stream) {
    return fill(dst, static_cast<unsigned char>(value), n, stream);
}

HOC_API hipError_t hipMemsetD8Async(hipDeviceptr_t dst, unsigned char value, size_t count,
                                    hipStream_t stream) {
    return fill(dst, value, count, stream);
}

HOC_API hipError_t hipMemsetD16Async(hipDeviceptr_t dst, unsigned short value, size_t count,
                                     hipStream_t stream) {
    return fill(dst, value, count, stream);
}

HOC_API hipError_t hipMemsetD32Async(hipDeviceptr_t dst, int value, size_t count,
                                     hipStream_t stream) {
    return fill(dst, static_cast<unsigned int>(value), count, stream);
}

HOC_API hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
    if (!ptr) return hipErrorInvalidValue;
    const unsigned known = hipHostMallocPortable | hipHostMallocMapped | hipHostMallocWriteCombined;
    if (flags & ~known) {
        fail("hipHostMalloc", "flags 0x%x are not implemented by the stand-in", flags & ~known);
        return hipErrorNotSupported;
    }
    *ptr = aligned_alloc(256, (size + 255) / 256 * 256 + (size == 0 ? 256 : 0));
    return *ptr ? hipSuccess : hipErrorOutOfMemory;
}

HOC_API hipError_t hipHostFree(void* ptr) {
    free(ptr);
    return hipSuccess;
}

// ---------------------------------------------------------------- streams and events

HOC_API hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
    if (!stream) return hipErrorInvalidValue;
    if (flags != hipStreamDefault && flags != hipStreamNonBlocking) {
        fail("hipStreamCreateWithFlags", "flags 0x%x", flags);
        return hipErrorInvalidValue;
    }
    *stream = reinterpret_cast<hipStream_t>(new hoc::Stream);
    return hipSuccess;
}

HOC_API hipError_t hipStreamSynchronize(hipStream_t stream) {
    // Every operation completed when it was enqueued; a capturing stream cannot synchronise.
    if (stream && S(stream)->capturing) return hipErrorStreamCaptureUnsupported;
    return hipSuccess;
}

HOC_API hipError_t hipStreamDestroy(hipStream_t stream) {
    if (!stream) return hipErrorInvalidHandle;
    delete S(stream);
    return hipSuccess;
}

HOC_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
    (void)stream;
    if (!event) return hipErrorInvalidHandle;
    if (flags != 0) {
        fail("hipStreamWaitEvent", "flags 0x%x", flags);
        return hipErrorInvalidValue;
    }
    return hipSuccess;  // the event's work completed when it was enqueued
}

HOC_API hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
    if (!event) return hipErrorInvalidValue;
    const unsigned known = hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess;
    if (flags & ~known) {
        fail("hipEventCreateWithFlags", "flags 0x%x are not implemented by the stand-in", flags & ~known);
        return hipErrorInvalidValue;
    }
    *event = reinterpret_cast<hipEvent_t>(new Event);
    return hipSuccess;
}

HOC_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    if (!event) return hipErrorInvalidHandle;
    Event* e = E(event);
    return static_cast<hipError_t>(hoc::submit(S(stream), [e] {
        e->t = std::chrono::steady_clock::now();
        e->recorded = true;
        return 0;
    }));
}

HOC_API hipError_t hipEventSynchronize(hipEvent_t event) {
    return event ? hipSuccess : hipErrorInvalidHandle;
}

HOC_API hipError_t hipEventDestroy(hipEvent_t event) {
    if (!event) return hipErrorInvalidHandle;
    delete E(event);
    return hipSuccess;
}

HOC_API hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
    if (!ms) return hipErrorInvalidValue;
    if (!start || !stop) return hipErrorInvalidHandle;
    if (!E(start)->recorded || !E(stop)->recorded) return hipErrorInvalidHandle;
    *ms = std::chrono::duration<float, std::milli>(E(stop)->t - E(start)->t).count();
    return hipSuccess;
}

// ---------------------------------------------------------------- stream capture and graphs
// A graph is the list of operations recorded between begin and end capture; its executable form
// is a copy; a launch replays it on the stream.

HOC_API hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode) {
    if (mode != hipStreamCaptureModeGlobal && mode != hipStreamCaptureModeThreadLocal &&
        mode != hipStreamCaptureModeRelaxed) {
        fail("hipStreamBeginCapture", "capture mode %d", static_cast<int>(mode));
        return hipErrorInvalidValue;
    }
    if (!stream) {
        fail("hipStreamBeginCapture", "the null stream cannot be captured");
        return hipErrorStreamCaptureUnsupported;
    }
    return hoc::begin_capture(S(stream)) ? hipErrorIllegalState : hipSuccess;
}

HOC_API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t* graph) {
    if (!graph) return hipErrorInvalidValue;
    auto* ops = hoc::end_capture(S(stream));
    *graph = reinterpret_cast<hipGraph_t>(ops);
    return ops ? hipSuccess : hipErrorIllegalState;
}

HOC_API hipError_t hipGraphInstantiateWithFlags(hipGraphExec_t* exec, hipGraph_t graph,
                                                unsigned long long flags) {
    if (!exec) return hipErrorInvalidValue;
    if (!graph) return hipErrorInvalidHandle;
    if (flags != 0) {
        fail("hipGraphInstantiateWithFlags", "flags 0x%llx are not implemented by the stand-in", flags);
        return hipErrorInvalidValue;
    }
    *exec = reinterpret_cast<hipGraphExec_t>(
        new std::vector<hoc::Op>(*reinterpret_cast<std::vector<hoc::Op>*>(graph)));
    return hipSuccess;
}

HOC_API hipError_t hipGraphLaunch(hipGraphExec_t exec, hipStream_t stream) {
    if (!exec) return hipErrorInvalidHandle;
    return static_cast<hipError_t>(hoc::replay(*reinterpret_cast<std::vector<hoc::Op>*>(exec), S(stream)));
}

HOC_API hipError_t hipGraphExecDestroy(hipGraphExec_t exec) {
    if (!exec) return hipErrorInvalidHandle;
    delete reinterpret_cast<std::vector<hoc::Op>*>(exec);
    return hipSuccess;
}

HOC_API hipError_t hipGraphDestroy(hipGraph_t graph) {
    if (!graph) return hipErrorInvalidHandle;
    delete reinterpret_cast<std::vector<hoc::Op>*>(graph);
    return hipSuccess;
}

// ---------------------------------------------------------------- modules and launches

HOC_API hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
    if (!module || !image) return hipErrorInvalidValue;
    std::string why;
    hoc::Module* m = hoc::load_module(image, &why);
    if (!m) {
        fail("hipModuleLoadData", "%s", why.c_str());
        return hipErrorInvalidImage;
    }
    *module = reinterpret_cast<hipModule_t>(m);
    return hipSuccess;
}

HOC_API hipError_t hipModuleGetFunction(hipFunction_t* f, hipModule_t module, const char* name) {
    if (!f || !module || !name) return hipErrorInvalidValue;
    auto* m = reinterpret_cast<hoc::Module*>(module);
    for (hoc::Function& fn : m->functions)
        if (fn.name == name) {
            *f = reinterpret_cast<hipFunction_t>(&fn);
            return hipSuccess;
        }
    fail("hipModuleGetFunction", "no kernel named '%s' in %s", name, m->label.c_str());
    return hipErrorNotFound;
}

HOC_API hipError_t hipModuleUnload(hipModule_t module) {
    // Modules stay loaded (a shared object is never unmapped while a thread may still have its
    // thread-local shared memory); the handle is forgotten.
    return module ? hipSuccess : hipErrorInvalidHandle;
}

HOC_API hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int gx, unsigned int gy,
                                         unsigned int gz, unsigned int bx, unsigned int by,
                                         unsigned int bz, unsigned int shared, hipStream_t stream,
                                         void** params, void** extra) {
    const char* fn = "hipModuleLaunchKernel";
    if (!f) return hipErrorInvalidResourceHandle;
    auto* func = reinterpret_cast<const hoc::Function*>(f);
    if (extra) {
        fail(fn, "the 'extra' (packed argument buffer) form is not implemented");
        return hipErrorNotSupported;
    }
    if (shared != 0) {
        fail(fn, "%s: %u bytes of dynamic shared memory (only static __shared__ is implemented)",
             func->name.c_str(), shared);
        return hipErrorNotSupported;
    }
    if (func->nparams > 0 && !params) return hipErrorInvalidValue;
    // The argument values are copied now (a recorded launch outlives the caller's array).
    std::vector<uint64_t> store;
    std::vector<size_t> offsets;
    for (unsigned i = 0; i < func->nparams; i++) {
        offsets.push_back(store.size());
        std::vector<uint64_t> slot((func->sizes[i] + 7) / 8 + 1, 0);
        std::memcpy(slot.data(), params[i], func->sizes[i]);
        store.insert(store.end(), slot.begin(), slot.end());
    }
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    return static_cast<hipError_t>(hoc::submit(S(stream), [=]() mutable {
        std::vector<void*> args(offsets.size());
        for (size_t i = 0; i < offsets.size(); i++) args[i] = &store[offsets[i]];
        std::string err = hoc::run_kernel(func, grid, block, args.data());
        if (err.empty()) {
            hoc::record_launch_digests(func, args.data());
            return 0;
        }
        fail("hipModuleLaunchKernel", "%s: %s", func->name.c_str(), err.c_str());
        return static_cast<int>(hipErrorLaunchFailure);
    }));
}

// ---------------------------------------------------------------- errors

HOC_API const char* hipGetErrorName(hipError_t e) {
#define HOC_NAME(n) \
    if (e == n) return #n;
    HOC_HIP_ERRORS_USED(HOC_NAME)
#undef HOC_NAME
    return "hipErrorUnknown";
}

HOC_API const char* hipGetErrorString(hipError_t e) {
    switch (e) {
        case hipSuccess: return "no error";
        case hipErrorOutOfMemory: return "out of memory";
        case hipErrorInvalidValue: return "invalid argument";
        case hipErrorNoDevice: return "the HIP-on-CPU platform is not usable (see stderr)";
        case hipErrorInvalidDevice: return "invalid device ordinal";
        case hipErrorInvalidImage: return "device kernel image is invalid (see stderr)";
        case hipErrorLaunchFailure: return "kernel failed on the HIP-on-CPU platform (see stderr)";
        case hipErrorNotSupported: return "operation not supported by the HIP-on-CPU stand-in";
        default: return hipGetErrorName(e);
    }
}
