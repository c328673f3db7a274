// hip-on-cpu: the shared platform (see core.h): settings, streams, modules, memory, and the
// executor that runs a kernel's blocks one after another, each block's threads as fibers.
#include "core.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <iterator>
#include <map>
#include <memory>

namespace hoc {

// ================================================================ settings, messages

void fail(const char* fn, const char* fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "hip-on-cpu: %s: %s\n", fn, buf);
    fflush(stderr);
}

namespace {
std::string env(const char* name, const char* dflt) {
    const char* v = getenv(name);
    return (v && *v) ? v : dflt;
}

Settings load_settings() {
    Settings s;
    std::string w = env("HIP_ON_CPU_WAVE", "64");
    char* end = nullptr;
    long v = strtol(w.c_str(), &end, 10);
    if (!end || *end || v < 1 || v > 64 || (v & (v - 1)) != 0) {
        s.error = "HIP_ON_CPU_WAVE=" + w + ": a power of two from 1 to 64 (64 or 32 for duet)";
        v = 64;
    }
    s.wave = static_cast<int>(v);
    std::string a = env("HIP_ON_CPU_ARCH", "gfx942");
    s.arch_base = a.substr(0, a.find(':'));
    if (a.find(':') == std::string::npos &&
        (a == "gfx942" || a == "gfx950" || a == "gfx90a"))
        a += ":sramecc+:xnack-";  // what ROCm reports for these parts in their default mode
    s.arch_full = a;
    std::string b = env("HIP_ON_CPU_BARRIER_SITES", "0");
    if (b != "0" && b != "1") s.error = "HIP_ON_CPU_BARRIER_SITES=" + b + ": 0 or 1";
    s.barrier_sites = b == "1";
    s.trace = env("HIP_ON_CPU_TRACE", "");
    s.kernel_digests = env("HIP_ON_CPU_KERNEL_DIGESTS", "");
    s.cxx = env("HIP_ON_CPU_CXX", "g++");
    s.opt = env("HIP_ON_CPU_OPT", "-O1");
    if (!s.error.empty()) fail("settings", "%s", s.error.c_str());
    return s;
}
}  // namespace

const Settings& settings() {
    static const Settings s = load_settings();
    return s;
}

std::string root_dir() {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&root_dir), &info) == 0 || !info.dli_fname) return ".";
    std::string p = info.dli_fname;
    if (char* real = realpath(p.c_str(), nullptr)) {
        p = real;
        free(real);
    }
    size_t slash = p.rfind('/');  // <root>/lib/<file>
    if (slash == std::string::npos) return ".";
    p = p.substr(0, slash);
    slash = p.rfind('/');
    return slash == std::string::npos ? "." : p.substr(0, slash);
}

// ================================================================ streams and graphs

namespace {
std::mutex g_null_stream;
}

int submit(void* stream, Op op) {
    if (!stream) {
        std::lock_guard<std::mutex> g(g_null_stream);
        return op();
    }
    auto* s = static_cast<Stream*>(stream);
    std::lock_guard<std::mutex> g(s->mu);
    if (s->capturing) {
        s->recorded.push_back(std::move(op));
        return 0;
    }
    return op();
}

int begin_capture(void* stream) {
    if (!stream) return 1;  // the null stream cannot capture
    auto* s = static_cast<Stream*>(stream);
    std::lock_guard<std::mutex> g(s->mu);
    if (s->capturing) return 1;
    s->capturing = true;
    s->recorded.clear();
    return 0;
}

std::vector<Op>* end_capture(void* stream) {
    if (!stream) return nullptr;
    auto* s = static_cast<Stream*>(stream);
    std::lock_guard<std::mutex> g(s->mu);
    if (!s->capturing) return nullptr;
    s->capturing = false;
    auto* ops = new std::vector<Op>(std::move(s->recorded));
    s->recorded.clear();
    return ops;
}

int replay(const std::vector<Op>& ops, void* stream) {
    std::mutex* mu = stream ? &static_cast<Stream*>(stream)->mu : &g_null_stream;
    std::lock_guard<std::mutex> g(*mu);
    for (const Op& op : ops)
        if (int e = op()) return e;
    return 0;
}

// ================================================================ memory

namespace {
std::mutex g_mem_mu;
size_t g_allocated = 0;

std::map<uintptr_t, size_t> g_allocs;  // base -> requested bytes (ordered: which one holds a pointer)
size_t rounded(size_t bytes) { return bytes ? (bytes + 255) / 256 * 256 : 256; }
}  // namespace

void* dev_alloc(size_t bytes) {
    void* p = aligned_alloc(256, rounded(bytes));
    if (!p) return nullptr;
    // With kernel digests, memory starts zeroed, so that bytes no kernel writes hash the same in
    // two runs (device memory is otherwise uninitialised, as on a GPU).
    if (!settings().kernel_digests.empty()) memset(p, 0, rounded(bytes));
    std::lock_guard<std::mutex> g(g_mem_mu);
    g_allocs[reinterpret_cast<uintptr_t>(p)] = bytes;
    g_allocated += rounded(bytes);
    return p;
}

bool dev_free(void* p) {
    {
        std::lock_guard<std::mutex> g(g_mem_mu);
        auto it = g_allocs.find(reinterpret_cast<uintptr_t>(p));
        if (it == g_allocs.end()) return false;
        g_allocated -= rounded(it->second);
        g_allocs.erase(it);
    }
    free(p);
    return true;
}

size_t dev_allocated() {
    std::lock_guard<std::mutex> g(g_mem_mu);
    return g_allocated;
}

void record_launch_digests(const Function* f, void** args) {
    const std::string& path = settings().kernel_digests;
    if (path.empty()) return;
    std::string lines;
    {
        std::lock_guard<std::mutex> g(g_mem_mu);
        for (unsigned i = 0; i < f->nparams; i++) {
            if (f->sizes[i] != 8) continue;
            uintptr_t v = 0;
            memcpy(&v, args[i], 8);
            auto it = g_allocs.upper_bound(v);
            if (it == g_allocs.begin()) continue;
            --it;
            if (v >= it->first + it->second) continue;
            // FNV-1a 64 over the bytes, each aligned 8-byte word that holds an address inside a
            // device allocation (a chunk table's pointers) hashed as that allocation's size and
            // the offset instead: addresses differ from run to run, what they point at does not.
            const unsigned char* b = reinterpret_cast<const unsigned char*>(it->first);
            uint64_t h = 0xcbf29ce484222325ull;
            auto mix = [&h](const unsigned char* p, size_t n) {
                for (size_t k = 0; k < n; k++) h = (h ^ p[k]) * 0x100000001b3ull;
            };
            size_t k = 0;
            for (; k + 8 <= it->second; k += 8) {
                uintptr_t w = 0;
                memcpy(&w, b + k, 8);
                auto t = g_allocs.upper_bound(w);
                if (w != 0 && t != g_allocs.begin() && w < std::prev(t)->first + std::prev(t)->second) {
                    --t;
                    const uint64_t canon[2] = {t->second, w - t->first};
                    mix(reinterpret_cast<const unsigned char*>(canon), 16);
                } else {
                    mix(b + k, 8);
                }
            }
            mix(b + k, it->second - k);
            char line[512];
            snprintf(line, sizeof line, "%s\t%u\t%zu\t%016llx\n", f->name.c_str(), i, it->second,
                     static_cast<unsigned long long>(h));
            lines += line;
        }
    }
    static std::mutex mu;
    std::lock_guard<std::mutex> g(mu);
    if (FILE* out = fopen(path.c_str(), "a")) {
        fwrite(lines.data(), 1, lines.size(), out);
        fclose(out);
    }
}

// ================================================================ modules

namespace {
std::string header_value(const std::string& header, const std::string& key) {
    size_t pos = 0;
    while (pos < header.size()) {
        size_t nl = header.find('\n', pos);
        if (nl == std::string::npos) nl = header.size();
        std::string line = header.substr(pos, nl - pos);
        if (line.compare(0, key.size() + 1, key + "=") == 0) return line.substr(key.size() + 1);
        pos = nl + 1;
    }
    return "";
}
}  // namespace

Module* load_module(const void* image, std::string* why) {
    const char* p = static_cast<const char*>(image);
    if (memcmp(p, kCodeMagic, sizeof kCodeMagic) != 0) {
        *why = "not a HIP-on-CPU code object (an AMD or other target's code object cannot run here)";
        return nullptr;
    }
    uint32_t hlen = 0;
    uint64_t solen = 0;
    memcpy(&hlen, p + 8, 4);
    std::string header(p + 12, hlen);
    memcpy(&solen, p + 12 + hlen, 8);
    const char* so = p + 20 + hlen;
    if (solen < 4 || memcmp(so, "\x7f" "ELF", 4) != 0) {
        *why = "the code object holds no shared object";
        return nullptr;
    }
    auto m = std::make_unique<Module>();
    m->label = header_value(header, "source");
    std::string w = header_value(header, "duet_warp");
    m->duet_warp = w.empty() ? 0 : atoi(w.c_str());
    const std::string built = header_value(header, "build"), now = settings().cxx + " " + settings().opt;
    if (built != now) {
        *why = m->label + " was compiled by '" + built + "', the platform compiles with '" + now +
               "' (HIP_ON_CPU_CXX, HIP_ON_CPU_OPT): a stale code object";
        return nullptr;
    }
    if (m->duet_warp != 0 && m->duet_warp != settings().wave) {
        *why = m->label + " was compiled with DUET_WARP=" + w + " but the platform runs waves of " +
               std::to_string(settings().wave) + " (HIP_ON_CPU_WAVE)";
        return nullptr;
    }
    char path[] = "/tmp/hip-on-cpu-module-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        *why = "no temporary file for the module";
        return nullptr;
    }
    size_t off = 0;
    while (off < solen) {
        ssize_t n = write(fd, so + off, solen - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
    }
    close(fd);
    if (off != solen) {
        unlink(path);
        *why = "could not write the module's shared object";
        return nullptr;
    }
    m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    unlink(path);
    if (!m->handle) {
        const char* e = dlerror();
        *why = std::string("dlopen: ") + (e ? e : "?");
        return nullptr;
    }
    auto* abi = static_cast<const unsigned*>(dlsym(m->handle, "hoc_abi_version"));
    auto* table = static_cast<const HocKernel*>(dlsym(m->handle, "hoc_kernels"));
    auto* count = static_cast<const unsigned*>(dlsym(m->handle, "hoc_kernel_count"));
    if (!abi || *abi != HOC_ABI_VERSION || !table || !count) {
        *why = "the module lacks the kernel table of this platform's ABI";
        return nullptr;  // the handle stays loaded: modules are never unloaded
    }
    for (unsigned i = 0; i < *count; i++) {
        const HocKernel& k = table[i];
        m->functions.push_back(Function{k.name, k.entry, k.nparams,
                                        std::vector<unsigned>(k.param_sizes, k.param_sizes + k.nparams),
                                        k.launch_bound, m.get()});
    }
    return m.release();
}

// ================================================================ the executor
//
// A block's threads are fibers on one OS thread. Each runs until it reaches a barrier, a
// shuffle or the end of the kernel; when none can run on, the scheduler resolves what they wait
// for: shuffles whose source lanes are waiting at a shuffle too exchange their values through the
// wave's scratchpad (each lane's posted value), and a barrier opens when every thread of the
// block waits at it. Anything else is reported, never waited for: a barrier some threads left
// the kernel before reaching, threads waiting at different barriers, a shuffle reading a lane
// that exited or waits at a barrier, or one reading past the block's last thread.

extern "C" void hoc_switch(void** save_sp, void* to_sp);
extern "C" void hoc_fiber_start();

#if defined(__x86_64__)
// hoc_switch(save, to): saves the callee-saved registers on the current stack, stores the stack
// pointer to *save, and resumes the context saved at `to`. (MXCSR and the x87 control word are
// not switched: no kernel changes them.)
asm(R"(
    .text
    .globl hoc_switch
    .hidden hoc_switch
    .type hoc_switch, @function
hoc_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hoc_switch, .-hoc_switch

    .globl hoc_fiber_start
    .hidden hoc_fiber_start
    .type hoc_fiber_start, @function
hoc_fiber_start:
    movq %r12, %rdi
    andq $-16, %rsp
    call hoc_lane_main
    ud2
    .size hoc_fiber_start, .-hoc_fiber_start
)");
#else
#error "hip-on-cpu: the fiber switch is written for x86-64"
#endif

namespace {

enum State : unsigned char { RUN = 0, AT_BARRIER = 1, AT_SHUFFLE = 2, DONE = 3 };

struct Exec;

/// A thread as the kernel sees it (HocLane), plus its index in the executor's tables.
struct Lane : HocLane {
    Exec* exec;
    unsigned index;
};
static_assert(sizeof(Lane) <= HOC_LANE_BYTES, "Lane must fit the top of its region");

/// The scheduler's view of a thread, in one compact table (the regions are 64 KiB apart).
struct Slot {
    void* sp;
    unsigned char state;
    unsigned char bar_kind;
    unsigned char bar_pred;
    int mask, width;
    unsigned long long bits;    // the value posted at a shuffle: the wave's scratchpad slot
    unsigned long long result;
    const void* site;
};

int lane_barrier(HocLane* self, int kind, int pred);
unsigned long long lane_shfl_xor(HocLane* self, unsigned long long bits, int mask, int width);
const HocOps kOps = {lane_barrier, lane_shfl_xor};

/// The fibers of one OS thread: regions of HOC_REGION bytes, HOC_REGION-aligned.
struct Exec {
    char* base = nullptr;
    unsigned capacity = 0;
    void* sched_sp = nullptr;
    HocEntry entry = nullptr;
    void** args = nullptr;
    unsigned n = 0, W = 64;
    std::vector<Slot> slots;
    std::vector<unsigned> runnable, next, waiting;
    std::vector<unsigned long long> res;

    ~Exec() {
        if (base) munmap(base, static_cast<size_t>(capacity) * HOC_REGION);
    }
    Lane* lane(unsigned i) {
        char* r = base + static_cast<size_t>(i) * HOC_REGION;
        return reinterpret_cast<Lane*>(r + HOC_LANE_OFFSET(r));
    }

    bool reserve(unsigned threads) {
        if (threads <= capacity) return true;
        const unsigned want = 1024;  // the most threads a block may have
        const size_t bytes = static_cast<size_t>(want) * HOC_REGION;
        char* raw = static_cast<char*>(mmap(nullptr, bytes + HOC_REGION, PROT_READ | PROT_WRITE,
                                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
        if (raw == MAP_FAILED) return false;
        uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + HOC_REGION - 1) & ~uintptr_t(HOC_REGION - 1);
        char* b = reinterpret_cast<char*>(aligned);
        if (b > raw) munmap(raw, static_cast<size_t>(b - raw));  // the unaligned head and tail
        char* tail = b + bytes;
        size_t tail_len = static_cast<size_t>(raw + bytes + HOC_REGION - tail);
        if (tail_len) munmap(tail, tail_len);
        for (unsigned i = 0; i < want; i++)  // a guard page under each stack
            mprotect(b + static_cast<size_t>(i) * HOC_REGION, HOC_GUARD_BYTES, PROT_NONE);
        base = b;
        capacity = want;
        slots.resize(want);
        res.resize(want);
        runnable.reserve(want);
        next.reserve(want);
        waiting.reserve(want);
        return true;
    }
};

__attribute__((noinline)) Exec& exec() {
    thread_local Exec e;
    return e;
}

/// A fresh context for lane `i`: a stack that hoc_switch resumes into hoc_fiber_start (r12 = the
/// lane), just below the lane's HocLane.
void prepare(Exec& e, unsigned i, Lane* l) {
    uint64_t* s = reinterpret_cast<uint64_t*>(l);
    s[-1] = 0;                                              // fake return address
    s[-2] = reinterpret_cast<uint64_t>(&hoc_fiber_start);  // hoc_switch's ret
    s[-3] = 0;                                              // rbp
    s[-4] = 0;                                              // rbx
    s[-5] = reinterpret_cast<uint64_t>(l);                  // r12
    s[-6] = 0;                                              // r13
    s[-7] = 0;                                              // r14
    s[-8] = 0;                                              // r15
    e.slots[i].sp = &s[-8];
    e.slots[i].state = RUN;
}

int lane_barrier(HocLane* self, int kind, int pred) {
    Lane* l = static_cast<Lane*>(self);
    Slot& s = l->exec->slots[l->index];
    s.state = AT_BARRIER;
    s.bar_kind = static_cast<unsigned char>(kind);
    s.bar_pred = pred != 0;
    s.site = __builtin_return_address(0);
    hoc_switch(&s.sp, l->exec->sched_sp);
    return static_cast<int>(l->exec->slots[l->index].result);
}

unsigned long long lane_shfl_xor(HocLane* self, unsigned long long bits, int mask, int width) {
    Lane* l = static_cast<Lane*>(self);
    Slot& s = l->exec->slots[l->index];
    s.state = AT_SHUFFLE;
    s.bits = bits;
    s.mask = mask;
    s.width = width;
    s.site = __builtin_return_address(0);
    hoc_switch(&s.sp, l->exec->sched_sp);
    return l->exec->slots[l->index].result;
}

std::string thread_name(Exec& e, unsigned i) {
    const Lane* l = e.lane(i);
    char b[96];
    snprintf(b, sizeof b, "thread (%u,%u,%u) [wave %u lane %u]", l->threadIdx.x, l->threadIdx.y,
             l->threadIdx.z, i / e.W, i % e.W);
    return b;
}

/// Resolves the shuffles of wave lanes [lo, hi) waiting in `e.waiting`: each reads its source
/// lane's posted value if that lane waits at a shuffle too (all from the posted values, before
/// any lane runs again). The resolved lanes go to `e.runnable`, the others back to `e.waiting`.
/// "" or what went wrong.
std::string resolve_shuffles(Exec& e, unsigned lo, unsigned hi) {
    const unsigned W = e.W;
    e.next.clear();
    e.runnable.clear();
    for (unsigned i : e.waiting) {
        const Slot& s = e.slots[i];
        const int self = static_cast<int>(i - lo), width = s.width;
        if (width <= 0 || (width & (width - 1)) != 0)
            return thread_name(e, i) + ": __shfl_xor width " + std::to_string(width) + " is not a power of two";
        int index = self ^ s.mask;
        if (index >= ((self + width) & ~(width - 1))) index = self;  // HIP's __shfl_xor
        index &= static_cast<int>(W - 1);  // ds_bpermute addresses lanes modulo the wave
        if (index == self) {
            e.res[i] = s.bits;
            e.runnable.push_back(i);
            continue;
        }
        const unsigned src = lo + static_cast<unsigned>(index);
        if (src >= hi)
            return thread_name(e, i) + ": __shfl_xor(mask " + std::to_string(s.mask) + ", width " +
                   std::to_string(width) + ") reads lane " + std::to_string(index) +
                   " of its wave, past the block's last thread (" + std::to_string(e.n) + " threads)";
        const Slot& o = e.slots[src];
        if (o.state == AT_SHUFFLE) {
            e.res[i] = o.bits;
            e.runnable.push_back(i);
        } else if (o.state == DONE || o.state == AT_BARRIER) {
            return thread_name(e, i) + ": __shfl_xor(mask " + std::to_string(s.mask) + ", width " +
                   std::to_string(width) + ") reads " + thread_name(e, src) + ", which " +
                   (o.state == DONE ? "has left the kernel" : "waits at a barrier") +
                   ": the lanes of a shuffle diverged";
        } else {
            e.next.push_back(i);
        }
    }
    for (unsigned i : e.runnable) {
        e.slots[i].result = e.res[i];
        e.slots[i].state = RUN;
    }
    e.waiting.swap(e.next);
    return "";
}

/// Runs the current block's lanes to the end; "" or what went wrong. A wave at a time: its lanes
/// run until each waits at a barrier, waits at a shuffle or has finished; its shuffles are
/// resolved and those lanes run on, until every lane of the wave is at a barrier or done. Then
/// the next wave; when no lane can run, the block's barrier opens if every thread waits at it.
std::string run_block(Exec& e) {
    const unsigned n = e.n, W = e.W;
    unsigned done = 0, at_bar = 0;
    for (;;) {
        for (unsigned lo = 0; lo < n; lo += W) {
            const unsigned hi = lo + W < n ? lo + W : n;
            e.waiting.clear();
            e.runnable.clear();
            for (unsigned i = lo; i < hi; i++)
                if (e.slots[i].state == RUN) e.runnable.push_back(i);
            while (!e.runnable.empty()) {
                for (unsigned i : e.runnable) {
                    hoc_switch(&e.sched_sp, e.slots[i].sp);
                    switch (e.slots[i].state) {
                        case DONE: done++; break;
                        case AT_BARRIER: at_bar++; break;
                        default: e.waiting.push_back(i); break;  // at a shuffle
                    }
                }
                if (e.waiting.empty()) break;
                std::string err = resolve_shuffles(e, lo, hi);
                if (!err.empty()) return err;
            }
            if (!e.waiting.empty())
                return "threads stuck at a shuffle (the first: " + thread_name(e, e.waiting[0]) + ")";
        }
        if (done == n) return "";
        // Every lane waits at a barrier or has finished.
        if (done > 0) {
            unsigned first_done = 0;
            while (e.slots[first_done].state != DONE) first_done++;
            return "a barrier reached by only " + std::to_string(at_bar) + " of the block's " + std::to_string(n) +
                   " threads: " + std::to_string(done) + " left the kernel before it (the first: " +
                   thread_name(e, first_done) + ")";
        }
        const Slot& s0 = e.slots[0];
        unsigned char any_pred = 0;
        for (unsigned i = 0; i < n; i++) {
            const Slot& s = e.slots[i];
            if (s.bar_kind != s0.bar_kind)
                return thread_name(e, 0) + " waits at " + (s0.bar_kind ? "__syncthreads_or" : "__syncthreads") +
                       " while " + thread_name(e, i) + " waits at " + (s.bar_kind ? "__syncthreads_or" : "__syncthreads");
            if (settings().barrier_sites && s.site != s0.site) {
                char b[256];
                snprintf(b, sizeof b, " waits at the barrier called from %p while %s waits at the one from %p",
                         s0.site, thread_name(e, i).c_str(), s.site);
                return thread_name(e, 0) + b + " (threads at different barriers)";
            }
            any_pred |= s.bar_pred;
        }
        for (unsigned i = 0; i < n; i++) {
            e.slots[i].result = any_pred;
            e.slots[i].state = RUN;
        }
        at_bar = 0;
    }
}

// Per-kernel launch counts for HIP_ON_CPU_TRACE, written at exit. The path is copied when the
// first launch is counted: at exit the settings may already be destroyed (static destruction
// runs in reverse order of construction, and they are built after this object).
struct Trace {
    std::mutex mu;
    std::string path;
    std::map<std::string, std::pair<unsigned long long, unsigned long long>> counts;
    ~Trace() {
        if (path.empty() || counts.empty()) return;
        FILE* f = fopen(path.c_str(), "a");
        if (!f) return;
        for (auto& [name, c] : counts) fprintf(f, "%s\t%llu\t%llu\n", name.c_str(), c.first, c.second);
        fclose(f);
    }
};
Trace g_trace;

}  // namespace

extern "C" __attribute__((visibility("hidden"), noreturn)) void hoc_lane_main(void* arg) {
    Lane* l = static_cast<Lane*>(arg);
    Exec* e = l->exec;
    e->entry(e->args);
    Slot& s = e->slots[l->index];
    s.state = DONE;
    hoc_switch(&s.sp, e->sched_sp);
    __builtin_trap();  // a finished fiber is never resumed
}

std::string run_kernel(const Function* f, const unsigned grid[3], const unsigned block[3], void** args) {
    const unsigned long long threads = 1ull * block[0] * block[1] * block[2];
    if (threads == 0 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return "an empty grid or block";
    if (threads > 1024) return "a block of " + std::to_string(threads) + " threads (at most 1024)";
    if (f->launch_bound && threads > f->launch_bound)
        return "a block of " + std::to_string(threads) + " threads, above the kernel's __launch_bounds__(" +
               std::to_string(f->launch_bound) + ")";
    if (!settings().trace.empty()) {
        std::lock_guard<std::mutex> g(g_trace.mu);
        g_trace.path = settings().trace;
        auto& c = g_trace.counts[f->name];
        c.first += 1;
        c.second += 1ull * grid[0] * grid[1] * grid[2];
    }
    // One kernel at a time in the process (static __shared__ arrays are one instance each):
    // the device has one compute unit.
    static std::mutex device;
    std::lock_guard<std::mutex> running(device);
    Exec& e = exec();
    if (!e.reserve(static_cast<unsigned>(threads))) return "no memory for the block's fiber stacks";
    e.W = static_cast<unsigned>(settings().wave);
    e.entry = f->entry;
    e.args = args;
    e.n = static_cast<unsigned>(threads);
    for (unsigned i = 0; i < e.n; i++) {
        Lane* l = e.lane(i);
        l->threadIdx = {i % block[0], (i / block[0]) % block[1], i / (block[0] * block[1])};
        l->blockDim = {block[0], block[1], block[2]};
        l->gridDim = {grid[0], grid[1], grid[2]};
        l->ops = &kOps;
        l->exec = &e;
        l->index = i;
    }
    std::string err;
    for (unsigned bz = 0; bz < grid[2] && err.empty(); bz++)
        for (unsigned by = 0; by < grid[1] && err.empty(); by++)
            for (unsigned bx = 0; bx < grid[0] && err.empty(); bx++) {
                for (unsigned i = 0; i < e.n; i++) {
                    Lane* l = e.lane(i);
                    l->blockIdx = {bx, by, bz};
                    prepare(e, i, l);
                }
                err = run_block(e);
                if (!err.empty()) {
                    char b[96];
                    snprintf(b, sizeof b, "block (%u,%u,%u): ", bx, by, bz);
                    err = b + err;
                }
            }
    e.entry = nullptr;
    return err;
}

}  // namespace hoc
