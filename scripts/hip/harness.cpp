// Runs every kernel in kernels-hip/ on the inputs of a fixture file written by the CPU backend
// (crates/hip/examples/hip_fixtures.rs) and compares the results with the CPU's outputs.
//
// Written against the HIP runtime API only, so the same file builds with hipcc on an AMD GPU and
// with nvcc through HIP's NVIDIA platform headers (scripts/hip-nvidia.sh kernels-vs-cpu). The launch
// shapes mirror crates/hip/src/ops (grid-stride loops; one block per row for cross-entropy, with the
// CUDA backend's block size; one 32-lane group per row, 8 rows per block, for softmax and
// LayerNorm; rows_per_chunk rows per chunk for the two-pass column sums, 64 columns per block).
//
// usage: harness FIXTURE_FILE   -> one line per case, then "N passed, M failed"; exit 1 on a failure
#include "duet_hip.h"

#include "adamw.hip"
#include "attention.hip"
#include "cross_entropy.hip"
#include "elementwise.hip"
#include "embedding.hip"
#include "fp8.hip"
#include "layernorm.hip"
#include "reduce.hip"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#define CHECK(call)                                                                   \
    do {                                                                              \
        hipError_t e_ = (call);                                                       \
        if (e_ != hipSuccess) {                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,              \
                    hipGetErrorString(e_));                                           \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

// ------------------------------------------------------------------ kernel registry
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
    R1(colsum_finish, N) R1(layernorm_dparams_partial, N)
DUET_FOR_ACT(R_ACT)
#define R_WIDE(AN, AT, PN, PT)                                                                 \
    R2(bias_add, AN, PN) R2(embedding_forward, AN, PN) R2(embedding_backward_wte, AN, PN)      \
    R2(layernorm_forward, AN, PN) R2(layernorm_backward_dx, AN, PN)
DUET_FOR_ACT_AND_WIDE(R_WIDE)
#define R_ADAMW(GN, GT, CN, CT) R2(adamw, GN, CN)
#define R_ADAMW_FROM(GN, GT) DUET_FOR_FLOAT_X(R_ADAMW, GN, GT)
DUET_FOR_ACT(R_ADAMW_FROM)
static Reg reg_sum_squares_finish("sum_squares_finish", (const void*)sum_squares_finish);

// Arguments packed for hipLaunchKernel: each value is copied into 8-byte storage.
struct Args {
    std::vector<uint64_t> store;
    std::vector<size_t> sizes;
    template <class T> Args& operator<<(T v) {
        uint64_t s = 0;
        memcpy(&s, &v, sizeof(T));
        store.push_back(s);
        sizes.push_back(sizeof(T));
        return *this;
    }
};

static void launch(const std::string& name, dim3 grid, dim3 block, Args& a) {
    auto it = registry().find(name);
    if (it == registry().end()) {
        fprintf(stderr, "no kernel named %s\n", name.c_str());
        exit(2);
    }
    std::vector<void*> ptrs;
    for (auto& s : a.store) ptrs.push_back(&s);
    CHECK(hipLaunchKernel(it->second, grid, block, ptrs.data(), 0, 0));
    CHECK(hipGetLastError());
}

static const unsigned BLOCK = DUET_BLOCK;
static unsigned blocks_for(uint64_t n) {
    uint64_t b = (n + BLOCK - 1) / BLOCK;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}
// Rows per chunk of the column sums (device.rs rows_per_chunk, the CUDA backend's).
static uint64_t rows_per_chunk(uint64_t rows) {
    const uint64_t c = (rows + 65534) / 65535;
    return c > 64 ? c : 64;
}
static unsigned rows8(uint64_t rows) { return (unsigned)((rows + 7) / 8 > 0 ? (rows + 7) / 8 : 1); }

// ------------------------------------------------------------------ host-side decoding
static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float f16_to_f32(uint16_t h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0)
        v = std::ldexp((float)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = std::ldexp((float)(m + 1024), e - 25);
    return s ? -v : v;
}
static float fp8_to_f32(uint8_t code, int eb, int mb, int bias, int kind) {
    const int emax = (1 << eb) - 1, mmax = (1 << mb) - 1;
    const int e = (code >> mb) & emax, m = code & mmax;
    const bool neg = code & 0x80;
    if (kind == 2 && code == 0x80) return NAN;
    if (kind == 0 && e == emax && m == mmax) return NAN;
    if (kind == 1 && e == emax) return m ? NAN : (neg ? -INFINITY : INFINITY);
    float v = e == 0 ? std::ldexp((float)m, 1 - bias - mb) : std::ldexp((float)(m + (1 << mb)), e - bias - mb);
    return neg ? -v : v;
}
static const int DT_SIZE[] = {4, 2, 2, 1, 1, 1, 1, 4};
static float decode(int dt, const uint8_t* p) {
    switch (dt) {
        case 0: { float f; memcpy(&f, p, 4); return f; }
        case 1: { uint16_t h; memcpy(&h, p, 2); return f16_to_f32(h); }
        case 2: { uint16_t h; memcpy(&h, p, 2); return bf16_to_f32(h); }
        case 3: return fp8_to_f32(*p, 4, 3, 7, 0);
        case 4: return fp8_to_f32(*p, 5, 2, 15, 1);
        case 5: return fp8_to_f32(*p, 4, 3, 8, 2);
        case 6: return fp8_to_f32(*p, 5, 2, 16, 2);
        default: { int32_t i; memcpy(&i, p, 4); return (float)i; }
    }
}

// ------------------------------------------------------------------ fixture file
struct Tensor {
    std::string name;
    int dtype, role;
    std::vector<uint8_t> bytes;
    size_t len() const { return bytes.size() / DT_SIZE[dtype]; }
};
struct Case {
    std::string op, variant;
    std::vector<int64_t> ints;
    std::vector<float> floats;
    std::vector<Tensor> tensors;
    const Tensor& get(const std::string& n, int role) const {
        for (auto& t : tensors)
            if (t.name == n && t.role == role) return t;
        fprintf(stderr, "%s_%s: no tensor %s (role %d)\n", op.c_str(), variant.c_str(), n.c_str(), role);
        exit(2);
    }
    bool has(const std::string& n, int role) const {
        for (auto& t : tensors)
            if (t.name == n && t.role == role) return true;
        return false;
    }
};

struct Reader {
    FILE* f;
    template <class T> T get() {
        T v;
        if (fread(&v, sizeof(T), 1, f) != 1) { fprintf(stderr, "truncated fixture\n"); exit(2); }
        return v;
    }
    std::string str() {
        uint32_t n = get<uint32_t>();
        std::string s(n, '\0');
        if (n && fread(&s[0], 1, n, f) != n) { fprintf(stderr, "truncated fixture\n"); exit(2); }
        return s;
    }
};

static std::vector<Case> load(const char* path) {
    Reader r{fopen(path, "rb")};
    if (!r.f) { perror(path); exit(2); }
    char magic[8];
    if (fread(magic, 1, 8, r.f) != 8 || memcmp(magic, "DUETFIX1", 8)) { fprintf(stderr, "bad magic\n"); exit(2); }
    std::vector<Case> cases(r.get<uint32_t>());
    for (auto& c : cases) {
        c.op = r.str();
        c.variant = r.str();
        c.ints.resize(r.get<uint32_t>());
        for (auto& i : c.ints) i = r.get<int64_t>();
        c.floats.resize(r.get<uint32_t>());
        for (auto& x : c.floats) x = r.get<float>();
        c.tensors.resize(r.get<uint32_t>());
        for (auto& t : c.tensors) {
            t.name = r.str();
            t.dtype = r.get<uint8_t>();
            t.role = r.get<uint8_t>();
            t.bytes.resize(r.get<uint64_t>());
            if (!t.bytes.empty() && fread(t.bytes.data(), 1, t.bytes.size(), r.f) != t.bytes.size()) exit(2);
        }
    }
    fclose(r.f);
    return cases;
}

// ------------------------------------------------------------------ device buffers
struct Dev {
    void* p = nullptr;
    size_t bytes = 0;
    int dtype = 0;
};
static Dev upload(const Tensor& t) {
    Dev d;
    d.bytes = t.bytes.size();
    d.dtype = t.dtype;
    CHECK(hipMalloc(&d.p, d.bytes ? d.bytes : 1));
    if (d.bytes) CHECK(hipMemcpy(d.p, t.bytes.data(), d.bytes, hipMemcpyHostToDevice));
    return d;
}
static Dev alloc_like(const Tensor& t) {
    Dev d;
    d.bytes = t.bytes.size();
    d.dtype = t.dtype;
    CHECK(hipMalloc(&d.p, d.bytes ? d.bytes : 1));
    CHECK(hipMemset(d.p, 0xcd, d.bytes));  // garbage: outputs must be fully written
    return d;
}
static Dev alloc_f32(size_t n) {
    Dev d;
    d.bytes = n * 4;
    CHECK(hipMalloc(&d.p, d.bytes ? d.bytes : 4));
    return d;
}

// Tolerance |got - want| <= atol + rtol |want| per output dtype; `exact` demands equal values.
struct Result {
    bool ok = true;
    double max_abs = 0, max_rel = 0;
    std::string detail;
};
static void compare(const Dev& d, const Tensor& want, bool exact, Result& r) {
    std::vector<uint8_t> got(d.bytes);
    CHECK(hipDeviceSynchronize());
    CHECK(hipMemcpy(got.data(), d.p, d.bytes, hipMemcpyDeviceToHost));
    const int dt = want.dtype, sz = DT_SIZE[dt];
    static const double ATOL[] = {3e-5, 2e-3, 1.6e-2, 0.13, 0.26, 0.13, 0.26, 0};
    static const double RTOL[] = {3e-4, 2e-3, 1.6e-2, 0.13, 0.26, 0.13, 0.26, 0};
    for (size_t i = 0; i < want.len(); ++i) {
        const float w = decode(dt, &want.bytes[i * sz]), g = decode(dt, &got[i * sz]);
        if (std::isnan(w) || std::isnan(g)) {
            if (std::isnan(w) != std::isnan(g) && r.ok) {
                r.ok = false;
                char buf[160];
                snprintf(buf, sizeof buf, "%s[%zu]: got %g want %g", want.name.c_str(), i, g, w);
                r.detail = buf;
            }
            continue;
        }
        if (std::isinf(w) || std::isinf(g)) {
            if (w != g && r.ok) {
                r.ok = false;
                char buf[160];
                snprintf(buf, sizeof buf, "%s[%zu]: got %g want %g", want.name.c_str(), i, g, w);
                r.detail = buf;
            }
            continue;
        }
        const double diff = std::fabs((double)g - (double)w);
        const double rel = diff / std::max(1e-30, std::fabs((double)w));
        r.max_abs = std::max(r.max_abs, diff);
        if (std::fabs(w) > 1e-3) r.max_rel = std::max(r.max_rel, rel);
        const bool bad = exact ? (memcmp(&want.bytes[i * sz], &got[i * sz], sz) != 0)
                               : diff > ATOL[dt] + RTOL[dt] * std::fabs((double)w);
        if (bad && r.ok) {
            r.ok = false;
            char buf[160];
            snprintf(buf, sizeof buf, "%s[%zu]: got %.8g want %.8g", want.name.c_str(), i, g, w);
            r.detail = buf;
        }
    }
}

static std::string split2(const std::string& v, int which) {
    // "bf16_f32" -> "bf16" / "f32"; dtype names contain no '_' except the separator.
    const size_t k = v.find('_');
    return which == 0 ? v.substr(0, k) : v.substr(k + 1);
}

// ------------------------------------------------------------------ one case
static Result run(const Case& c) {
    Result r;
    std::vector<Dev> owned;
    auto in = [&](const char* n) { owned.push_back(upload(c.get(n, 0))); return owned.back(); };
    auto out = [&](const char* n) { owned.push_back(alloc_like(c.get(n, 1))); return owned.back(); };
    auto check = [&](const Dev& d, const char* n, bool exact = false) { compare(d, c.get(n, 1), exact, r); };
    const std::string& op = c.op;
    const std::string& v = c.variant;
    Args a;
    if (op == "cast") {
        Dev s = in("src"), d = out("dst");
        uint64_t n = c.ints[0];
        a << s.p << d.p << n << c.floats[0];
        launch("cast_" + v, blocks_for(n), BLOCK, a);
        check(d, "dst", /*exact=*/true);
    } else if (op == "scale") {
        Dev x = in("x");
        uint64_t n = c.ints[0];
        a << x.p << c.floats[0] << n;
        launch("scale_" + v, blocks_for(n), BLOCK, a);
        check(x, "x", true);
    } else if (op == "add") {
        Dev x = in("a"), y = in("b"), o = out("out");
        uint64_t n = c.ints[0];
        a << x.p << y.p << o.p << n;
        launch("add_" + v, blocks_for(n), BLOCK, a);
        check(o, "out", true);
    } else if (op == "add_assign") {
        Dev d = in("dst"), s = in("src");
        uint64_t n = c.ints[0];
        a << d.p << s.p << n;
        launch("add_assign_" + v + "_" + v, blocks_for(n), BLOCK, a);
        check(d, "dst", true);
    } else if (op == "gelu_forward") {
        Dev x = in("x"), o = out("out");
        uint64_t n = c.ints[0];
        a << x.p << o.p << n;
        launch("gelu_forward_" + v, blocks_for(n), BLOCK, a);
        check(o, "out");
    } else if (op == "gelu_backward") {
        Dev x = in("x"), d = in("dout"), o = out("dx");
        uint64_t n = c.ints[0];
        a << x.p << d.p << o.p << n;
        launch("gelu_backward_" + v, blocks_for(n), BLOCK, a);
        check(o, "dx");
    } else if (op == "split_heads" || op == "split_heads_backward" || op == "merge_heads" ||
               op == "merge_heads_backward") {
        int b = c.ints[0], t = c.ints[1], nh = c.ints[2], hs = c.ints[3];
        uint64_t n = (uint64_t)b * t * nh * hs;
        if (op == "split_heads") {
            Dev qkv = in("qkv"), q = out("q"), k = out("k"), vv = out("v");
            a << qkv.p << q.p << k.p << vv.p << b << t << nh << hs;
            launch(op + "_" + v, blocks_for(n), BLOCK, a);
            check(q, "q", true); check(k, "k", true); check(vv, "v", true);
        } else if (op == "split_heads_backward") {
            Dev dq = in("dq"), dk = in("dk"), dv = in("dv"), o = out("dqkv");
            a << dq.p << dk.p << dv.p << o.p << b << t << nh << hs;
            launch(op + "_" + v, blocks_for(3 * n), BLOCK, a);
            check(o, "dqkv", true);
        } else {
            Dev x = in("in"), o = out("out");
            a << x.p << o.p << b << t << nh << hs;
            launch(op + "_" + v, blocks_for(n), BLOCK, a);
            check(o, "out", true);
        }
    } else if (op == "softmax_causal_forward" || op == "softmax_causal_backward") {
        uint64_t rows = c.ints[0] * c.ints[1];
        int t = c.ints[1];
        if (op == "softmax_causal_forward") {
            Dev s = in("scores"), p = out("probs");
            a << s.p << p.p << rows << t << c.floats[0];
            launch(op + "_" + v, rows8(rows), BLOCK, a);
            check(p, "probs");
        } else {
            Dev p = in("probs"), dp = in("dprobs"), ds = out("dscores");
            a << p.p << dp.p << ds.p << rows << t << c.floats[0];
            launch(op + "_" + v, rows8(rows), BLOCK, a);
            check(ds, "dscores");
        }
    } else if (op == "cross_entropy") {
        int n = c.ints[0], vocab = c.ints[1];
        Dev l = in("logits"), tg = in("targets"), losses = out("losses"), dl = out("dlogits");
        a << l.p << tg.p << losses.p << dl.p << vocab << c.floats[0];
        int block = ((vocab + 3) / 4 + 31) / 32 * 32;
        block = block < 32 ? 32 : (block > 1024 ? 1024 : block);
        launch("cross_entropy_" + v, n, block, a);
        check(losses, "losses");
        check(dl, "dlogits");
    } else if (op == "adamw") {
        Dev p = in("param"), g = in("grad"), m = in("m"), vv = in("v");
        const bool has_copy = c.has("copy", 1);
        Dev cp;
        if (has_copy) cp = out("copy");
        uint64_t n = c.ints[0];
        const float* f = c.floats.data();
        a << p.p << g.p << m.p << vv.p << (has_copy ? cp.p : nullptr) << n << f[0] << f[1] << f[2]
          << f[3] << f[4] << f[5] << f[6] << f[7];
        // Without a copy any copy type works: use f32.
        launch("adamw_" + (has_copy ? v : split2(v, 0) + "_f32"), blocks_for(n), BLOCK, a);
        check(p, "param"); check(m, "m"); check(vv, "v");
        if (has_copy) check(cp, "copy");
    } else if (op == "sum_squares") {
        Dev x = in("x"), o = in("out");
        uint64_t n = c.ints[0], slot = c.ints[1];
        uint64_t g64 = (n + 4095) / 4096;
        const unsigned g = (unsigned)(g64 < 1 ? 1 : (g64 > 1024 ? 1024 : g64));
        Dev part = alloc_f32(2 * g);  // g doubles
        owned.push_back(part);
        a << x.p << n << part.p;
        launch("sum_squares_partial_" + v, g, BLOCK, a);
        Args b2;
        b2 << part.p << (int)g << o.p << slot;
        launch("sum_squares_finish", 1, BLOCK, b2);
        check(o, "out");
    } else if (op == "bias_add") {
        Dev x = in("x"), bias = in("bias");
        uint64_t rows = c.ints[0], cc = c.ints[1];
        a << x.p << bias.p << rows << cc;
        launch("bias_add_" + v, blocks_for(rows * cc), BLOCK, a);
        check(x, "x", true);
    } else if (op == "bias_backward") {
        Dev d = in("dout"), db = in("dbias");
        uint64_t rows = c.ints[0], cc = c.ints[1], rpc = rows_per_chunk(rows);
        uint64_t chunks = (rows + rpc - 1) / rpc;
        Dev part = alloc_f32(chunks * cc);
        owned.push_back(part);
        a << d.p << part.p << rows << cc << rpc;
        launch("colsum_partial_" + split2(v, 0), dim3((cc + 63) / 64, chunks), BLOCK, a);
        Args b2;
        b2 << part.p << db.p << chunks << cc;
        launch("colsum_finish_" + split2(v, 1), (cc + 31) / 32, BLOCK, b2);
        check(db, "dbias");
    } else if (op == "layernorm_forward") {
        int n = c.ints[0], cc = c.ints[1];
        Dev x = in("x"), g = in("gamma"), b = in("beta"), o = out("out"), mu = out("mean"), rs = out("rstd");
        a << x.p << g.p << b.p << o.p << mu.p << rs.p << n << cc << c.floats[0];
        launch("layernorm_forward_" + v, rows8(n), BLOCK, a);
        check(o, "out"); check(mu, "mean"); check(rs, "rstd");
    } else if (op == "layernorm_backward") {
        int n = c.ints[0], cc = c.ints[1];
        Dev d = in("dout"), x = in("x"), g = in("gamma"), mu = in("mean"), rs = in("rstd");
        Dev dx = in("dx"), dg = in("dgamma"), db = in("dbeta");
        a << d.p << x.p << g.p << mu.p << rs.p << dx.p << n << cc;
        launch("layernorm_backward_dx_" + v, rows8(n), BLOCK, a);
        const uint64_t rpc = rows_per_chunk(n), chunks = (n + rpc - 1) / rpc;
        Dev pg = alloc_f32(chunks * cc), pb = alloc_f32(chunks * cc);
        owned.push_back(pg);
        owned.push_back(pb);
        Args b2;
        b2 << d.p << x.p << mu.p << rs.p << pg.p << pb.p << n << cc << (int)rpc;
        launch("layernorm_dparams_partial_" + split2(v, 0), dim3((cc + 31) / 32, chunks), BLOCK, b2);
        Args b3, b4;
        b3 << pg.p << dg.p << chunks << (uint64_t)cc;
        launch("colsum_finish_" + split2(v, 1), (cc + 31) / 32, BLOCK, b3);
        b4 << pb.p << db.p << chunks << (uint64_t)cc;
        launch("colsum_finish_" + split2(v, 1), (cc + 31) / 32, BLOCK, b4);
        check(dx, "dx"); check(dg, "dgamma"); check(db, "dbeta");
    } else if (op == "embedding_forward") {
        int b = c.ints[0], t = c.ints[1], cc = c.ints[2], vocab = c.ints[3];
        Dev tk = in("tokens"), wte = in("wte"), wpe = in("wpe"), o = out("out");
        a << tk.p << wte.p << wpe.p << o.p << t << cc << vocab;
        launch("embedding_forward_" + v, b * t, BLOCK, a);
        check(o, "out", true);
    } else if (op == "embedding_backward") {
        int b = c.ints[0], t = c.ints[1], cc = c.ints[2], vocab = c.ints[3];
        Dev tk = in("tokens"), d = in("dout"), dwte = in("dwte"), dwpe = in("dwpe");
        a << tk.p << d.p << dwte.p << b * t << cc << vocab;
        launch("embedding_backward_wte_" + v, b * t, BLOCK, a);
        const uint64_t rows = b, cols = (uint64_t)t * cc, rpc = rows_per_chunk(rows);
        const uint64_t chunks = (rows + rpc - 1) / rpc;
        Dev part = alloc_f32(chunks * cols);
        owned.push_back(part);
        Args b2, b3;
        b2 << d.p << part.p << rows << cols << rpc;
        launch("colsum_partial_" + split2(v, 0), dim3((cols + 63) / 64, chunks), BLOCK, b2);
        b3 << part.p << dwpe.p << chunks << cols;
        launch("colsum_finish_" + split2(v, 1), (cols + 31) / 32, BLOCK, b3);
        check(dwte, "dwte"); check(dwpe, "dwpe");
    } else {
        r.ok = false;
        r.detail = "unknown op " + op;
    }
    for (auto& d : owned) CHECK(hipFree(d.p));
    return r;
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURE_FILE\n", argv[0]);
        return 2;
    }
    int dev = 0;
    CHECK(hipSetDevice(dev));
    const std::vector<Case> cases = load(argv[1]);
    printf("%zu kernels registered, %zu cases, DUET_WARP=%d\n", registry().size(), cases.size(), DUET_WARP);
    int pass = 0, fail = 0;
    for (const Case& c : cases) {
        Result r = run(c);
        printf("%-4s %-26s %-22s max_abs %.3g max_rel %.3g %s\n", r.ok ? "ok" : "FAIL", c.op.c_str(),
               c.variant.c_str(), r.max_abs, r.max_rel, r.detail.c_str());
        (r.ok ? pass : fail)++;
    }
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
