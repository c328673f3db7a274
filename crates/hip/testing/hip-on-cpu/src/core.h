// hip-on-cpu: the platform the stand-in libraries share (libhip-on-cpu-core.so, a TEST DOUBLE,
// ../README.md): its settings, streams with capture, kernel modules and the executor that runs
// a kernel's blocks as fibers. libamdhip64, libhiprtc, librocblas and libhipblaslt are thin API
// layers over it (each exports exactly what duet loads; this library exports the rest).
//
// Execution model: every operation runs on the calling thread when it is enqueued (or when a
// recorded graph is replayed), under its stream's lock, so a stream's operations run in order
// and complete before the call returns; events, waits and synchronisations have nothing left to
// wait for. Device memory is host memory.
#pragma once

#include "../include/hoc_abi.h"

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#define HOC_API extern "C" __attribute__((visibility("default")))
#define HOC_CORE __attribute__((visibility("default")))

namespace hoc {

// ---------------------------------------------------------------- settings
/// The platform's settings, read once from the environment:
///   HIP_ON_CPU_WAVE   wave (warp) size, default 64; 32 too (any power of two 1..64 is accepted,
///                     so that the backend's refusal of an unchecked size can be shown)
///   HIP_ON_CPU_ARCH   gcnArchName, default gfx942 (bare or with features)
///   HIP_ON_CPU_BARRIER_SITES  0 (default): a barrier opens when every thread of the block waits
///                     at one (AMD's s_barrier counts waves, not call sites); 1: they must wait
///                     at the same call site (meaningful at -O0 only: an optimising compiler
///                     may copy one __syncthreads into both arms of a branch)
///   HIP_ON_CPU_TRACE  a file: at exit, one line per kernel launched (name, launches, blocks)
///   HIP_ON_CPU_KERNEL_DIGESTS  a file: after every launch, one line per pointer argument that
///                     points into a device allocation: kernel, argument index, the allocation's
///                     size and the FNV-1a 64 of its bytes (compare two runs' files: which buffers
///                     every launch left bit-identical)
///   HIP_ON_CPU_CXX, HIP_ON_CPU_OPT  the compiler and its optimisation flag for kernels
///                     (default g++ and -O1)
struct Settings {
    int wave = 64;
    std::string arch_full;  // gfx942:sramecc+:xnack-
    std::string arch_base;  // gfx942
    bool barrier_sites = false;
    std::string trace;
    std::string kernel_digests;
    std::string cxx;
    std::string opt;
    std::string error;  // a malformed variable: the runtime refuses to start (hipInit fails)
};
HOC_CORE const Settings& settings();

/// Prints "hip-on-cpu: <fn>: <message>" to stderr (every refusal of the stand-ins goes here).
HOC_CORE void fail(const char* fn, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

/// The folder of the stand-in root (the parent of the lib/ holding the core library).
HOC_CORE std::string root_dir();

// ---------------------------------------------------------------- streams and graphs
/// An operation on a stream: returns 0 or a hipError_t value (with the reason printed).
using Op = std::function<int()>;

struct Stream {
    std::mutex mu;
    bool capturing = false;
    std::vector<Op> recorded;
};

/// Runs `op` on `stream` (nullptr: the null stream) now, or records it when the stream is
/// capturing. Returns the operation's status (0 when recorded).
HOC_CORE int submit(void* stream, Op op);
HOC_CORE int begin_capture(void* stream);
/// The recorded operations (ownership to the caller), or nullptr when not capturing.
HOC_CORE std::vector<Op>* end_capture(void* stream);
/// Replays a recording on `stream`: every operation in order, stopping at the first failure.
HOC_CORE int replay(const std::vector<Op>& ops, void* stream);

// ---------------------------------------------------------------- modules and kernels
struct Module;
struct Function {
    std::string name;
    HocEntry entry;
    unsigned nparams;
    std::vector<unsigned> sizes;
    unsigned launch_bound;
    Module* module;
};
struct Module {
    void* handle = nullptr;
    std::string label;  // the source's name, for messages
    int duet_warp = 0;  // -DDUET_WARP the module was compiled with (0: none)
    std::vector<Function> functions;
};

/// The code object the hiprtc stand-in produces: this magic, a u32 header length, the header
/// (key=value lines), then the shared object.
constexpr char kCodeMagic[8] = {'H', 'O', 'C', 'P', 'U', 'K', 'O', '1'};

/// Loads a code object (dlopen of the shared object it holds). nullptr with `why` otherwise.
HOC_CORE Module* load_module(const void* image, std::string* why);

/// Runs kernel `f` on grid × block with the argument values `args` (one per parameter, each
/// `f->sizes[i]` bytes). Returns "" or what went wrong (a barrier reached by only some threads,
/// a shuffle reading an exited lane, a launch shape the kernel does not allow).
HOC_CORE std::string run_kernel(const Function* f, const unsigned grid[3], const unsigned block[3],
                                void** args);

// ---------------------------------------------------------------- memory
HOC_CORE void* dev_alloc(size_t bytes);
HOC_CORE bool dev_free(void* p);
HOC_CORE size_t dev_allocated();
/// With HIP_ON_CPU_KERNEL_DIGESTS: records the buffers kernel `f` was passed (after it ran).
HOC_CORE void record_launch_digests(const Function* f, void** args);
/// Reported total device memory: 64 GiB.
constexpr size_t kDeviceMemory = size_t(64) << 30;

}  // namespace hoc
