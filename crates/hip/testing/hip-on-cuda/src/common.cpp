// hip-on-cuda: the CUDA driver loader and the helpers every stand-in library shares.
#include "common.h"

#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace hoc {

void fail(const char* fn, const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "hip-on-cuda: %s: %s\n", fn, buf);
    fflush(stderr);
}

namespace {
Driver g_driver;
bool g_ok = false;
std::string g_why;
std::once_flag g_once;

void load() {
    const char* names[] = {"libcuda.so.1", "libcuda.so"};
    void* h = nullptr;
    std::string tried;
    for (const char* n : names) {
        h = dlopen(n, RTLD_NOW | RTLD_LOCAL);
        if (h) break;
        const char* e = dlerror();
        tried += std::string(" ") + n + " (" + (e ? e : "?") + ")";
    }
    if (!h) {
        g_why = "the CUDA driver library could not be opened:" + tried;
        return;
    }
#define HOC_LOAD(f)                                                                 \
    g_driver.f = reinterpret_cast<decltype(&::f)>(dlsym(h, HOC_XSTR(f)));           \
    if (!g_driver.f) {                                                              \
        g_why = std::string("libcuda.so.1 does not export ") + HOC_XSTR(f);         \
        return;                                                                     \
    }
    HOC_CU_FUNCS(HOC_LOAD)
#undef HOC_LOAD
    CUresult r = g_driver.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char* name = nullptr;
        g_driver.cuGetErrorName(r, &name);
        g_why = std::string("cuInit failed: ") + (name ? name : "?");
        return;
    }
    g_ok = true;
}
}  // namespace

const Driver* driver(std::string* why) {
    std::call_once(g_once, [] {
        load();
        if (!g_ok) fail("cuda", "%s", g_why.c_str());
    });
    if (!g_ok && why) *why = g_why;
    return g_ok ? &g_driver : nullptr;
}

CUresult cu_check(const char* fn, const char* cu_call, CUresult r) {
    if (r != CUDA_SUCCESS && g_ok) {
        const char* name = nullptr;
        const char* text = nullptr;
        g_driver.cuGetErrorName(r, &name);
        g_driver.cuGetErrorString(r, &text);
        fail(fn, "%s failed: %s (%s)", cu_call, name ? name : "?", text ? text : "?");
    }
    return r;
}

int& thread_device() {
    thread_local int dev = 0;
    return dev;
}

namespace {
std::mutex g_ctx_mutex;
std::vector<CUcontext> g_primary;  // by ordinal, retained once for the process
}  // namespace

CUresult bind_device(const char* fn, int device) {
    const Driver* d = driver();
    if (!d) return CUDA_ERROR_NO_DEVICE;
    thread_local int bound = -1;
    thread_local CUcontext bound_ctx = nullptr;
    if (bound == device) {
        // The thread's context may have been changed by someone else (the CUDA backend in the
        // same process): check it is still ours.
        CUcontext cur = nullptr;
        if (d->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == bound_ctx) return CUDA_SUCCESS;
    }
    CUcontext ctx = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_ctx_mutex);
        if (device < 0) return CUDA_ERROR_INVALID_DEVICE;
        if (g_primary.size() <= static_cast<size_t>(device)) g_primary.resize(device + 1, nullptr);
        if (!g_primary[device]) {
            CUdevice dev;
            CUresult r = cu_check(fn, "cuDeviceGet", d->cuDeviceGet(&dev, device));
            if (r != CUDA_SUCCESS) return r;
            r = cu_check(fn, "cuDevicePrimaryCtxRetain", d->cuDevicePrimaryCtxRetain(&ctx, dev));
            if (r != CUDA_SUCCESS) return r;
            g_primary[device] = ctx;
        }
        ctx = g_primary[device];
    }
    CUresult r = cu_check(fn, "cuCtxSetCurrent", d->cuCtxSetCurrent(ctx));
    if (r == CUDA_SUCCESS) {
        bound = device;
        bound_ctx = ctx;
    }
    return r;
}

CUresult bind(const char* fn) { return bind_device(fn, thread_device()); }

CUresult current_device(const char* fn, CUdevice* dev) {
    const Driver* d = driver();
    if (!d) return CUDA_ERROR_NO_DEVICE;
    CUcontext cur = nullptr;
    if (d->cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur) {
        CUresult r = bind_device(fn, 0);
        if (r != CUDA_SUCCESS) return r;
    }
    return cu_check(fn, "cuCtxGetDevice", d->cuCtxGetDevice(dev));
}

std::string arch_base() {
    const char* v = getenv("HIP_ON_CUDA_ARCH");
    std::string a = (v && *v) ? v : "gfx942";
    size_t colon = a.find(':');
    return colon == std::string::npos ? a : a.substr(0, colon);
}

std::string arch_full() {
    const char* v = getenv("HIP_ON_CUDA_ARCH");
    std::string a = (v && *v) ? v : "gfx942";
    if (a.find(':') != std::string::npos) return a;
    // What ROCm reports for the MI300/MI350 parts in their default mode.
    if (a == "gfx942" || a == "gfx950" || a == "gfx90a") return a + ":sramecc+:xnack-";
    return a;
}

std::string root_dir() {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&root_dir), &info) == 0 || !info.dli_fname) return ".";
    std::string p = info.dli_fname;
    char* real = realpath(p.c_str(), nullptr);
    if (real) {
        p = real;
        free(real);
    }
    // <root>/lib/<file>
    size_t slash = p.rfind('/');
    if (slash == std::string::npos) return ".";
    p = p.substr(0, slash);
    slash = p.rfind('/');
    return slash == std::string::npos ? "." : p.substr(0, slash);
}

}  // namespace hoc
