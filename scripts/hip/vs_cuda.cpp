// HIP kernels vs CUDA kernels, bit for bit, on one NVIDIA GPU
// (scripts/hip-nvidia.sh kernels-vs-cuda run).
//
// The HIP side is every kernels-hip/*.hip compiled into this program by nvcc through HIP's NVIDIA
// platform headers (warp 32, --fmad=false like the AMD build's -ffp-contract=off). The CUDA side
// is kernels-cuda/*.cu compiled at run time by NVRTC exactly as crates/cuda/src/kernels.rs does
// (`#include "common.cuh"` replaced by the header's text, --std=c++17
// --gpu-architecture=sm_<cc>), loaded with the driver API and launched by name. Both sides get
// the same inputs (a fixed-seed generator) and launch shapes mirroring their backends
// (crates/hip/src/ops, crates/cuda/src/ops); every output is compared byte for byte.
//
// usage: vs_cuda KERNELS_CUDA_DIR   -> one table row per case; exit 1 on an unexplained difference
#include "duet_hip.h"

#include "adamw.hip"
#include "attention.hip"
#include "cross_entropy.hip"
#include "elementwise.hip"
#include "embedding.hip"
#include "fp8.hip"
#include "layernorm.hip"
#include "reduce.hip"

#include <cuda.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        hipError_t e_ = (call);                                                                \
        if (e_ != hipSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, hipGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)
#define CU(call)                                                                               \
    do {                                                                                       \
        CUresult e_ = (call);                                                                  \
        if (e_ != CUDA_SUCCESS) {                                                              \
            const char* s_ = "?";                                                              \
            cuGetErrorString(e_, &s_);                                                         \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, s_);                  \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

// ------------------------------------------------------------------ HIP kernel registry
static std::map<std::string, const void*>& registry() {
    static std::map<std::string, const void*> r;
    return r;
}
struct Reg {
    Reg(const char* n, const void* f) { registry()[n] = f; }
};
#define R1(OP, N) static Reg reg_##OP##_##N(#OP "_" #N, (const void*)OP##_##N);
#define R2(OP, A, B) static Reg reg_##OP##_##A##_##B(#OP "_" #A "_" #B, (const void*)OP##_##A##_##B);
#define R_CAST(SN, ST, DN, DT) R2(cast, SN, DN)
#define R_CAST_FROM(SN, ST) DUET_FOR_FLOAT_X(R_CAST, SN, ST)
DUET_FOR_FLOAT(R_CAST_FROM)
#define R_ADD_ASSIGN(SN, ST, DN, DT) R2(add_assign, DN, SN)
#define R_ADD_ASSIGN_FROM(SN, ST) DUET_FOR_FLOAT_X(R_ADD_ASSIGN, SN, ST)
DUET_FOR_FLOAT(R_ADD_ASSIGN_FROM)
#define R_FLOAT(N, T) R1(scale, N) R1(add, N) R1(sum_squares_partial, N)
DUET_FOR_FLOAT(R_FLOAT)
#define R_ACT(N, T)                                                                            \
    R1(gelu_forward, N) R1(gelu_backward, N) R1(split_heads, N) R1(split_heads_backward, N)    \
    R1(merge_heads, N) R1(merge_heads_backward, N) R1(softmax_causal_forward, N)               \
    R1(softmax_causal_backward, N) R1(cross_entropy, N) R1(colsum_partial, N)                  \
    R1(colsum_finish, N) R1(layernorm_dparams_partial, N)                                      \
    R2(quantize, N, f8e4m3) R2(quantize, N, f8e5m2) R2(quantize, N, f8e4m3fnuz)                \
    R2(quantize, N, f8e5m2fnuz)
DUET_FOR_ACT(R_ACT)
#define R_WIDE(AN, AT, PN, PT)                                                                 \
    R2(bias_add, AN, PN) R2(embedding_forward, AN, PN) R2(embedding_backward_wte, AN, PN)      \
    R2(layernorm_forward, AN, PN) R2(layernorm_backward_dx, AN, PN)
DUET_FOR_ACT_AND_WIDE(R_WIDE)
#define R_ADAMW(GN, GT, CN, CT) R2(adamw, GN, CN)
#define R_ADAMW_FROM(GN, GT) DUET_FOR_FLOAT_X(R_ADAMW, GN, GT)
DUET_FOR_ACT(R_ADAMW_FROM)
static Reg reg_sum_squares_finish("sum_squares_finish", (const void*)sum_squares_finish);

// ------------------------------------------------------------------ CUDA modules (NVRTC)
static std::string read_text(const std::string& path) {
    std::ifstream f(path);
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path.c_str());
        exit(2);
    }
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

static std::vector<CUmodule> g_modules;
static void load_cuda_modules(const std::string& dir, int cc) {
    // common.cuh with the shared math pasted in for its include line, as the backend does.
    std::string common = read_text(dir + "/common.cuh");
    {
        const std::string minc = "#include \"duet_math.h\"";
        const size_t m = common.find("\n" + minc + "\n");
        if (m == std::string::npos) {
            fprintf(stderr, "common.cuh does not include duet_math.h\n");
            exit(2);
        }
        common.replace(m + 1, minc.size(), read_text(dir + "/../kernels-shared/duet_math.h"));
    }
    const char* files[] = {"adamw.cu",   "attention.cu", "cross_entropy.cu", "elementwise.cu",
                           "embedding.cu", "fp8.cu",     "layernorm.cu",     "reduce.cu",
                           "softmax.cu"};
    const std::string arch = "--gpu-architecture=sm_" + std::to_string(cc);
    for (const char* f : files) {
        std::string src = read_text(dir + "/" + f);
        const std::string inc = "#include \"common.cuh\"";
        const size_t k = src.find(inc);
        if (k == std::string::npos) {
            fprintf(stderr, "%s does not include common.cuh\n", f);
            exit(2);
        }
        src.replace(k, inc.size(), common);
        nvrtcProgram prog;
        if (nvrtcCreateProgram(&prog, src.c_str(), f, 0, nullptr, nullptr) != NVRTC_SUCCESS) exit(2);
        const char* opts[] = {"--std=c++17", arch.c_str()};
        const nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
        size_t log_size = 0;
        nvrtcGetProgramLogSize(prog, &log_size);
        if (r != NVRTC_SUCCESS) {
            std::string log(log_size, '\0');
            nvrtcGetProgramLog(prog, &log[0]);
            fprintf(stderr, "NVRTC failed on %s:\n%s\n", f, log.c_str());
            exit(2);
        }
        size_t n = 0;
        nvrtcGetCUBINSize(prog, &n);
        std::vector<char> cubin(n);
        nvrtcGetCUBIN(prog, cubin.data());
        nvrtcDestroyProgram(&prog);
        CUmodule m;
        CU(cuModuleLoadData(&m, cubin.data()));
        g_modules.push_back(m);
    }
}
static CUfunction cuda_function(const std::string& name) {
    static std::map<std::string, CUfunction> cache;
    auto it = cache.find(name);
    if (it != cache.end()) return it->second;
    for (CUmodule m : g_modules) {
        CUfunction f;
        if (cuModuleGetFunction(&f, m, name.c_str()) == CUDA_SUCCESS) return cache[name] = f;
    }
    fprintf(stderr, "no CUDA kernel named %s\n", name.c_str());
    exit(2);
}

// ------------------------------------------------------------------ launching
// Arguments, each in an 8-byte slot (both launch APIs read the parameter's size from the
// kernel's signature, from the front of the slot).
struct Args {
    std::vector<uint64_t> store;
    template <class T> Args& operator<<(T v) {
        uint64_t s = 0;
        memcpy(&s, &v, sizeof(T));
        store.push_back(s);
        return *this;
    }
};
enum Side { HIP = 0, CUDA = 1 };
static void launch(Side side, const std::string& name, dim3 grid, dim3 block, Args& a) {
    std::vector<void*> ptrs;
    for (auto& s : a.store) ptrs.push_back(&s);
    if (side == HIP) {
        auto it = registry().find(name);
        if (it == registry().end()) {
            fprintf(stderr, "no HIP kernel named %s\n", name.c_str());
            exit(2);
        }
        CHECK(hipLaunchKernel(it->second, grid, block, ptrs.data(), 0, 0));
        CHECK(hipGetLastError());
    } else {
        CU(cuLaunchKernel(cuda_function(name), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                          0, 0, ptrs.data(), nullptr));
    }
    CHECK(hipDeviceSynchronize());
}
static unsigned blocks_for(uint64_t n) {
    uint64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// ------------------------------------------------------------------ buffers and inputs
// dtype codes: 0 f32, 1 f16, 2 bf16, 3 e4m3, 4 e5m2, 5 e4m3fnuz, 6 e5m2fnuz, 7 i32, 8 f64.
static const int DT_SIZE[] = {4, 2, 2, 1, 1, 1, 1, 4, 8};
static int dt_of(const std::string& n) {
    static const char* names[] = {"f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz"};
    for (int i = 0; i < 7; ++i)
        if (n == names[i]) return i;
    fprintf(stderr, "bad dtype %s\n", n.c_str());
    exit(2);
}
struct Buf {
    void* p = nullptr;
    size_t n = 0;
    int dt = 0;
};
static std::vector<Buf> g_live;
static uint64_t g_seed = 1;
static uint64_t rnd() {  // splitmix64
    uint64_t z = (g_seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)((rnd() >> 40) * (1.0 / 16777216.0)); }
static void put(int dt, uint8_t* p, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (dt == 0) memcpy(p, &x, 4);
    else if (dt == 2) { uint16_t b = (uint16_t)(u >> 16); memcpy(p, &b, 2); }
    else if (dt == 1) {  // truncating f32 -> f16 for |x| in [2^-14, 65504), else ±0
        const int e = (int)((u >> 23) & 0xff) - 127 + 15;
        uint16_t h = (uint16_t)((u >> 16) & 0x8000);
        if (e >= 1 && e < 31) h |= (uint16_t)((e << 10) | ((u >> 13) & 0x3ff));
        memcpy(p, &h, 2);
    } else if (dt == 7) { int32_t i = (int32_t)x; memcpy(p, &i, 4); }
    else *p = (uint8_t)rnd();  // fp8: any code, NaN codes included
}
static Buf alloc(int dt, size_t n) {
    Buf b;
    b.n = n;
    b.dt = dt;
    CHECK(hipMalloc(&b.p, n * DT_SIZE[dt] + 16));
    CHECK(hipMemset(b.p, 0, n * DT_SIZE[dt] + 16));
    g_live.push_back(b);
    return b;
}
static Buf upload(int dt, const std::vector<float>& v) {
    Buf b = alloc(dt, v.size());
    std::vector<uint8_t> h(v.size() * DT_SIZE[dt]);
    for (size_t i = 0; i < v.size(); ++i) put(dt, &h[i * DT_SIZE[dt]], v[i]);
    CHECK(hipMemcpy(b.p, h.data(), h.size(), hipMemcpyHostToDevice));
    return b;
}
static Buf rand_buf(int dt, size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return upload(dt, v);
}

struct Out {
    std::string name;
    int dt;
    std::vector<uint8_t> bytes;
};
using Outs = std::vector<Out>;
static void get(Outs& o, const char* name, const Buf& b) {
    Out r{name, b.dt, std::vector<uint8_t>(b.n * DT_SIZE[b.dt])};
    CHECK(hipMemcpy(r.bytes.data(), b.p, r.bytes.size(), hipMemcpyDeviceToHost));
    o.push_back(r);
}

// ------------------------------------------------------------------ cases
struct Case {
    std::string name;
    std::function<Outs(Side)> run;
};
static std::vector<Case> g_cases;
static void add_case(const std::string& name, std::function<Outs(Side)> f) { g_cases.push_back({name, f}); }
static const char* ACT[] = {"f32", "bf16", "f16"};
static const char* FLOAT7[] = {"f32", "f16", "bf16", "f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz"};
static const char* WIDE[][2] = {{"f32", "f32"}, {"bf16", "bf16"}, {"bf16", "f32"}, {"f16", "f16"}, {"f16", "f32"}};
static const char* FP8[] = {"f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz"};

static void build_cases() {
    const uint64_t N = 100003;
    for (const char* s : FLOAT7)
        for (const char* d : FLOAT7) {
            const std::string v = std::string(s) + "_" + d;
            add_case("cast_" + v, [=](Side side) {
                Buf x = rand_buf(dt_of(s), 10007, -300.0f, 300.0f), y = alloc(dt_of(d), 10007);
                Args a;
                a << x.p << y.p << (uint64_t)10007 << 0.75f;
                launch(side, "cast_" + v, blocks_for(10007), 256, a);
                Outs o;
                get(o, "dst", y);
                return o;
            });
        }
    for (const char* t : ACT) {
        const std::string T = t;
        const int dt = dt_of(T);
        add_case("scale_" + T, [=](Side side) {
            Buf x = rand_buf(dt, N, -4, 4);
            Args a;
            a << x.p << 0.3f << N;
            launch(side, "scale_" + T, blocks_for(N), 256, a);
            Outs o;
            get(o, "x", x);
            return o;
        });
        add_case("add_" + T, [=](Side side) {
            Buf x = rand_buf(dt, N, -4, 4), y = rand_buf(dt, N, -4, 4), z = alloc(dt, N);
            Args a;
            a << x.p << y.p << z.p << N;
            launch(side, "add_" + T, blocks_for(N), 256, a);
            Outs o;
            get(o, "out", z);
            return o;
        });
        add_case("add_assign_" + T, [=](Side side) {
            Buf x = rand_buf(dt, N, -4, 4), y = rand_buf(dt, N, -4, 4);
            Args a;
            a << x.p << y.p << N;
            launch(side, "add_assign_" + T + "_" + T, blocks_for(N), 256, a);
            Outs o;
            get(o, "dst", x);
            return o;
        });
        add_case("gelu_forward_" + T, [=](Side side) {
            Buf x = rand_buf(dt, N, -10, 10), y = alloc(dt, N);
            Args a;
            a << x.p << y.p << N;
            launch(side, "gelu_forward_" + T, blocks_for(N), 256, a);
            Outs o;
            get(o, "out", y);
            return o;
        });
        add_case("gelu_backward_" + T, [=](Side side) {
            Buf x = rand_buf(dt, N, -10, 10), d = rand_buf(dt, N, -2, 2), y = alloc(dt, N);
            Args a;
            a << x.p << d.p << y.p << N;
            launch(side, "gelu_backward_" + T, blocks_for(N), 256, a);
            Outs o;
            get(o, "dx", y);
            return o;
        });
        for (int hs : {64, 12}) {
            const std::string sfx = "_" + T + " (hs " + std::to_string(hs) + ")";
            const int b = 2, tt = 5, nh = 3;
            const uint64_t n = (uint64_t)b * tt * nh * hs;
            add_case("split_heads" + sfx, [=](Side side) {
                Buf qkv = rand_buf(dt, 3 * n, -4, 4), q = alloc(dt, n), k = alloc(dt, n), v = alloc(dt, n);
                Args a;
                a << qkv.p << q.p << k.p << v.p << b << tt << nh << hs;
                launch(side, "split_heads_" + T, side == HIP ? dim3(blocks_for(n)) : dim3(blocks_for(n), 3), 256, a);
                Outs o;
                get(o, "q", q); get(o, "k", k); get(o, "v", v);
                return o;
            });
            add_case("split_heads_backward" + sfx, [=](Side side) {
                Buf dq = rand_buf(dt, n, -4, 4), dk = rand_buf(dt, n, -4, 4), dv = rand_buf(dt, n, -4, 4);
                Buf dqkv = alloc(dt, 3 * n);
                Args a;
                a << dq.p << dk.p << dv.p << dqkv.p << b << tt << nh << hs;
                launch(side, "split_heads_backward_" + T,
                       side == HIP ? dim3(blocks_for(3 * n)) : dim3(blocks_for(n), 3), 256, a);
                Outs o;
                get(o, "dqkv", dqkv);
                return o;
            });
            for (const char* op : {"merge_heads", "merge_heads_backward"}) {
                const std::string OP = op;
                add_case(OP + sfx, [=](Side side) {
                    Buf x = rand_buf(dt, n, -4, 4), y = alloc(dt, n);
                    Args a;
                    a << x.p << y.p << b << tt << nh << hs;
                    launch(side, OP + "_" + T, blocks_for(n), 256, a);
                    Outs o;
                    get(o, "out", y);
                    return o;
                });
            }
        }
        for (int tt : {77, 150}) {
            const uint64_t rows = 3, lines = rows * tt;
            const std::string sfx = "_" + T + " (t " + std::to_string(tt) + ")";
            add_case("softmax_causal_forward" + sfx, [=](Side side) {
                Buf s = rand_buf(dt, lines * tt, -20, 20), p = alloc(dt, lines * tt);
                Args a;
                a << s.p << p.p << lines << tt << 0.125f;
                launch(side, "softmax_causal_forward_" + T, (unsigned)((lines + 7) / 8), 256, a);
                Outs o;
                get(o, "probs", p);
                return o;
            });
            add_case("softmax_causal_backward" + sfx, [=](Side side) {
                Buf p = rand_buf(dt, lines * tt, 0, 0.1f), dp = rand_buf(dt, lines * tt, -1, 1);
                Buf ds = alloc(dt, lines * tt);
                Args a;
                a << p.p << dp.p << ds.p << lines << tt << 0.125f;
                launch(side, "softmax_causal_backward_" + T, (unsigned)((lines + 7) / 8), 256, a);
                Outs o;
                get(o, "dscores", ds);
                return o;
            });
        }
        for (int v : {96, 1000, 5003}) {
            add_case("cross_entropy_" + T + " (v " + std::to_string(v) + ")", [=](Side side) {
                const int n = 37;
                Buf l = rand_buf(dt, (size_t)n * v, -15, 15);
                std::vector<float> tg(n);
                for (int r = 0; r < n; ++r) tg[r] = (float)(rnd() % v);
                tg[3] = -1.0f;      // ignored
                tg[5] = (float)v;   // invalid: NaN loss, zero gradient row
                Buf t = upload(7, tg), losses = alloc(0, n), dl = alloc(dt, (size_t)n * v);
                Buf err = alloc(7, 1);
                const unsigned block = (unsigned)std::min(1024, std::max(32, ((v + 3) / 4 + 31) / 32 * 32));
                Args a;
                a << l.p << t.p << losses.p << dl.p << v << 0.01f;
                if (side == CUDA) a << err.p;
                launch(side, "cross_entropy_" + T, n, block, a);
                Outs o;
                get(o, "losses", losses); get(o, "dlogits", dl);
                return o;
            });
        }
        for (uint64_t n : {(uint64_t)1000, (uint64_t)1000003}) {
            add_case("sum_squares_" + T + " (n " + std::to_string(n) + ")", [=](Side side) {
                Buf x = rand_buf(dt, n, -3, 3);
                Buf out = upload(0, {0.25f, 1.5f, -7.0f});
                const unsigned g = (unsigned)std::min<uint64_t>(1024, std::max<uint64_t>(1, (n + 4095) / 4096));
                Buf part = alloc(8, g);
                Args a, b2;
                a << x.p << n << part.p;
                launch(side, "sum_squares_partial_" + T, g, 256, a);
                b2 << part.p << (int)g << out.p << (uint64_t)1;
                launch(side, "sum_squares_finish", 1, 256, b2);
                Outs o;
                get(o, "partials", part); get(o, "out", out);
                return o;
            });
        }
        for (const char* d : FP8) {
            const std::string D = d;
            add_case("quantize_" + T + "_" + D, [=](Side side) {
                const uint64_t n = 10007;
                Buf x = rand_buf(dt, n, -600, 600), y = alloc(dt_of(D), n);
                Buf scale = upload(0, {0.37f}), amax = upload(0, {0.0f});
                Args a;
                if (side == HIP) a << x.p << y.p << (void*)nullptr << (uint64_t)1 << n << scale.p << amax.p;
                else a << x.p << y.p << n << scale.p << amax.p;
                launch(side, "quantize_" + T + "_" + D, blocks_for(n), 256, a);
                Outs o;
                get(o, "dst", y); get(o, "amax", amax);
                return o;
            });
        }
        add_case("layernorm_dparams_partial_" + T, [=](Side side) {
            const int n = 150, c = 300, rpc = 64, chunks = (n + rpc - 1) / rpc;
            Buf d = rand_buf(dt, (size_t)n * c, -2, 2), x = rand_buf(dt, (size_t)n * c, -3, 3);
            Buf mu = rand_buf(0, n, -0.5f, 0.5f), rs = rand_buf(0, n, 0.5f, 2.0f);
            Buf pg = alloc(0, (size_t)chunks * c), pb = alloc(0, (size_t)chunks * c);
            Buf dg = rand_buf(0, c, -1, 1);
            Args a, b2;
            a << d.p << x.p << mu.p << rs.p << pg.p << pb.p << n << c << rpc;
            launch(side, "layernorm_dparams_partial_" + T, dim3((c + 31) / 32, chunks),
                   side == HIP ? dim3(256) : dim3(32, 8), a);
            b2 << pg.p << dg.p << (uint64_t)chunks << (uint64_t)c;
            launch(side, "colsum_finish_f32", (c + 31) / 32, side == HIP ? dim3(256) : dim3(32, 8), b2);
            Outs o;
            get(o, "pg", pg); get(o, "pb", pb); get(o, "dgamma", dg);
            return o;
        });
    }
    for (auto& w : WIDE) {
        const std::string A = w[0], P = w[1], v = A + "_" + P;
        const int da = dt_of(A), dp = dt_of(P);
        for (uint64_t c : {(uint64_t)264, (uint64_t)300}) {
            add_case("bias_add_" + v + " (c " + std::to_string(c) + ")", [=](Side side) {
                const uint64_t rows = 333;
                Buf x = rand_buf(da, rows * c, -4, 4), b = rand_buf(dp, c, -4, 4);
                Args a;
                a << x.p << b.p << rows << c;
                launch(side, "bias_add_" + v, blocks_for(rows * c), 256, a);
                Outs o;
                get(o, "x", x);
                return o;
            });
            // bias_backward / the position-embedding gradient: colsum_partial + colsum_finish
            // (CUDA: colsum_partial_vec where rows are whole 16-byte vectors, as its backend
            // picks; both add in the same order).
            for (int vec = 0; vec < 2; ++vec) {
                if (vec && c % (16 / DT_SIZE[da])) continue;
                add_case(std::string(vec ? "colsum_vec_" : "colsum_") + v + " (c " + std::to_string(c) + ")",
                         [=](Side side) {
                    const uint64_t rows = 300, rpc = 64, chunks = (rows + rpc - 1) / rpc;
                    Buf x = rand_buf(da, rows * c, -4, 4), out = rand_buf(dp, c, -1, 1);
                    Buf part = alloc(0, chunks * c);
                    const uint64_t cols_per_block = side == CUDA && vec ? 32 * (16 / DT_SIZE[da]) : 64;
                    Args a, b2;
                    a << x.p << part.p << rows << c << rpc;
                    launch(side, std::string(side == CUDA && vec ? "colsum_partial_vec_" : "colsum_partial_") + A,
                           dim3((unsigned)((c + cols_per_block - 1) / cols_per_block), (unsigned)chunks),
                           side == HIP ? dim3(256) : dim3(32, 8), a);
                    b2 << part.p << out.p << chunks << c;
                    launch(side, "colsum_finish_" + P, (unsigned)((c + 31) / 32),
                           side == HIP ? dim3(256) : dim3(32, 8), b2);
                    Outs o;
                    get(o, "partial", part); get(o, "out", out);
                    return o;
                });
            }
        }
        add_case("layernorm_forward_" + v, [=](Side side) {
            const int n = 50, c = 300;
            Buf x = rand_buf(da, (size_t)n * c, -3, 5), g = rand_buf(dp, c, 0.5f, 1.5f), b = rand_buf(dp, c, -1, 1);
            Buf out = alloc(da, (size_t)n * c), mu = alloc(0, n), rs = alloc(0, n);
            Args a;
            a << x.p << g.p << b.p << out.p << mu.p << rs.p << n << c << 1e-5f;
            launch(side, "layernorm_forward_" + v, (n + 7) / 8, 256, a);
            Outs o;
            get(o, "out", out); get(o, "mean", mu); get(o, "rstd", rs);
            return o;
        });
        add_case("layernorm_backward_dx_" + v, [=](Side side) {
            const int n = 50, c = 300;
            Buf d = rand_buf(da, (size_t)n * c, -2, 2), x = rand_buf(da, (size_t)n * c, -3, 5);
            Buf g = rand_buf(dp, c, 0.5f, 1.5f), mu = rand_buf(0, n, 0.5f, 1.5f), rs = rand_buf(0, n, 0.3f, 1);
            Buf dx = rand_buf(da, (size_t)n * c, -1, 1);
            Args a;
            a << d.p << x.p << g.p << mu.p << rs.p << dx.p << n << c;
            launch(side, "layernorm_backward_dx_" + v, (n + 7) / 8, 256, a);
            Outs o;
            get(o, "dx", dx);
            return o;
        });
        add_case("embedding_forward_" + v, [=](Side side) {
            const int b = 4, t = 16, c = 96, vocab = 50;
            std::vector<float> tk(b * t);
            for (auto& k : tk) k = (float)(rnd() % vocab);
            tk[7] = (float)vocab;  // invalid: a zero row plus the position embedding on both
            Buf tok = upload(7, tk), wte = rand_buf(dp, (size_t)vocab * c, -1, 1), wpe = rand_buf(dp, (size_t)t * c, -1, 1);
            Buf out = alloc(da, (size_t)b * t * c), err = alloc(7, 1);
            Args a;
            a << tok.p << wte.p << wpe.p << out.p << t << c << vocab;
            if (side == CUDA) a << err.p;
            launch(side, "embedding_forward_" + v, b * t, 256, a);
            Outs o;
            get(o, "out", out);
            return o;
        });
    }
    const char* GA[] = {"f32", "bf16", "f16"};
    for (const char* gq : GA)
        for (const char* cq : GA) {
            const std::string v = std::string(gq) + "_" + cq;
            add_case("adamw_" + v, [=](Side side) {
                const uint64_t n = 100003;
                Buf p = rand_buf(0, n, -1, 1), g = rand_buf(dt_of(gq), n, -0.1f, 0.1f);
                Buf m = rand_buf(0, n, -0.01f, 0.01f), vv = rand_buf(0, n, 0, 1e-4f), cp = alloc(dt_of(cq), n);
                Args a;
                a << p.p << g.p << m.p << vv.p << cp.p << n << 1e-3f << 0.9f << 0.999f << 1e-8f << 0.1f
                  << 0.271f << 0.0030f << 0.5f;
                launch(side, "adamw_" + v, blocks_for(n), 256, a);
                Outs o;
                get(o, "param", p); get(o, "m", m); get(o, "v", vv); get(o, "copy", cp);
                return o;
            });
        }
}

// Kernels that are not compared, each with its reason (printed as exceptions).
static const char* EXCEPTIONS[][2] = {
    {"embedding_backward_wte_*",
     "different algorithms: CUDA sorts positions by token (embedding_sort_*, embedding_runs_*, "
     "host-driven, crates/cuda/src/ops/embedding.rs), HIP scans for each token's first "
     "occurrence; both add the rows in position order in f32 into dwte (the HIP-vs-CPU check "
     "compares HIP's bits with the CPU's)"},
    {"layernorm_fwd_* / layernorm_bwd_* / layernorm_stats_* (CUDA)",
     "CUDA's fast LayerNorm path (rows in registers, G-warp row groups) has no HIP port: HIP "
     "runs the fallback kernels compared above, whose sums are ordered differently"},
    {"sum_squares_many_partial / adamw_multi / zero_many (CUDA)",
     "CUDA's multi-tensor kernels (chunk tables) have no HIP port: HIP runs the per-tensor "
     "kernels through the trait defaults; the grad norm's partition differs from CUDA's"},
    {"flash_attention_* (CUDA)", "CUDA-only (mma.sync tensor cores); HIP composes attention from GEMMs and softmax"},
    {"quantize_t_* / quantize_gelu_* / quantize_grad_t_* / layernorm_fp8_* / adamw_fp8_* (CUDA)",
     "CUDA-only fused FP8 kernels (their GELU is the hardware-approximation one, common.cuh gelu_f_hw); HIP composes them (gelu_forward + quantize_S_D, compared above)"},
};

// ------------------------------------------------------------------ comparison
// Distance in units in the last place between two storage values of one dtype: the bit
// patterns mapped to a monotone integer scale (sign-magnitude to two's complement).
static int64_t ordered(const uint8_t* p, int size) {
    uint64_t u = 0;
    memcpy(&u, p, size);
    const uint64_t sign = 1ull << (8 * size - 1);
    const int64_t mag = (int64_t)(u & (sign - 1));
    return (u & sign) ? -mag : mag;
}

int main(int argc, char** argv) {
    const std::string dir = argc > 1 ? argv[1] : "kernels-cuda";
    CHECK(hipSetDevice(0));
    CHECK(hipFree(nullptr));  // the primary context, shared with the driver API below
    // The CUDA runtime and driver directly (HIP's property wrappers may be pruned for CUDA 13).
    int major = 9, minor = 0;
    char dev_name[256] = "?";
#if defined(__HIP_PLATFORM_NVIDIA__)
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CU(cuDeviceGetName(dev_name, sizeof dev_name, dev));
#endif
    const int cc = major * 10 + minor;
    printf("device %s (sm_%d); HIP kernels: DUET_WARP=%d, nvcc --fmad=false; CUDA kernels: NVRTC --std=c++17 sm_%d\n",
           dev_name, cc, DUET_WARP, cc);
    load_cuda_modules(dir, cc);
    build_cases();
    int identical = 0, differs = 0;
    printf("%-44s %-10s %s\n", "kernel (case)", "result", "detail");
    for (const Case& c : g_cases) {
        g_seed = std::hash<std::string>{}(c.name);
        const Outs h = c.run(HIP);
        for (auto& b : g_live) CHECK(hipFree(b.p));
        g_live.clear();
        g_seed = std::hash<std::string>{}(c.name);
        const Outs k = c.run(CUDA);
        for (auto& b : g_live) CHECK(hipFree(b.p));
        g_live.clear();
        std::string detail;
        bool same = h.size() == k.size();
        for (size_t i = 0; i < h.size() && i < k.size(); ++i) {
            const Out& a = h[i];
            const Out& b = k[i];
            const int sz = DT_SIZE[a.dt];
            size_t ndiff = 0, first = 0;
            int64_t max_ulp = 0;
            for (size_t e = 0; e * sz < a.bytes.size(); ++e) {
                if (memcmp(&a.bytes[e * sz], &b.bytes[e * sz], sz) == 0) continue;
                if (ndiff++ == 0) first = e;
                int64_t d = ordered(&a.bytes[e * sz], sz) - ordered(&b.bytes[e * sz], sz);
                if (d < 0) d = -d;
                if (d > max_ulp) max_ulp = d;
            }
            if (ndiff) {
                same = false;
                char buf[200];
                snprintf(buf, sizeof buf, "%s: %zu of %zu differ, max %lld ulp (first at %zu); ", a.name.c_str(),
                         ndiff, a.bytes.size() / sz, (long long)max_ulp, first);
                detail += buf;
            }
        }
        printf("%-44s %-10s %s\n", c.name.c_str(), same ? "identical" : "DIFFERS", detail.c_str());
        (same ? identical : differs)++;
    }
    printf("\nnot compared (exceptions):\n");
    for (auto& e : EXCEPTIONS) printf("  %-44s %s\n", e[0], e[1]);
    printf("\n%d identical, %d differ, %zu exceptions\n", identical, differs,
           sizeof(EXCEPTIONS) / sizeof(EXCEPTIONS[0]));
    return differs ? 1 : 0;
}
