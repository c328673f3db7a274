// The math both vendors' kernels share (e^x, ln x, GELU, the AdamW update), included by
// kernels-cuda/common.cuh and kernels-hip/duet_hip.h after each has defined the explicitly
// rounded primitives it is written with (duet_fadd, duet_fmul, duet_fma, ..., and DUET_SFN). Every
// tool that compiles kernels takes it from here: the CUDA backend and scripts/check_cuda_kernels.py
// paste it into common.cuh, the HIP backend into duet_hip.h (so NVRTC and hiprtc get one
// self-contained header each, and the kernel caches' keys cover it), and the HIP-on-NVIDIA
// harnesses add this folder to nvcc's include path.
// >>> duet shared math >>>
// One source for both vendors: kernels-cuda/common.cuh and kernels-hip/duet_hip.h include this
// file, so both compute these functions with the same operations in the same order. Every rounding is explicit (duet_fadd, duet_fmul, duet_fma,
// ... are the _rn intrinsics on CUDA and plain IEEE operations compiled without contraction on
// AMD), no vendor math library is called, so the results are bit-identical on both.

// e^x in f32: the CPU reference's exp_f32 (crates/cpu/src/ops/math.rs, Cephes expf polynomial)
// operation for operation, so it also gives the CPU's bits (Rust does not contract a·b + c).
DUET_SFN float duet_exp_f32(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float t = duet_fadd(duet_fmul(xc, 1.44269502f), 12582912.0f);
    const float n = duet_fsub(t, 12582912.0f);
    const unsigned n_int = duet_f2u(t) - duet_f2u(12582912.0f);
    const float r = duet_fsub(duet_fsub(xc, duet_fmul(n, 0.693359375f)), duet_fmul(n, -2.12194440e-4f));
    float p = 1.9875691e-4f;
    p = duet_fadd(duet_fmul(p, r), 1.3981999e-3f);
    p = duet_fadd(duet_fmul(p, r), 8.333452e-3f);
    p = duet_fadd(duet_fmul(p, r), 4.1665796e-2f);
    p = duet_fadd(duet_fmul(p, r), 1.6666665e-1f);
    p = duet_fadd(duet_fmul(p, r), 0.5f);
    const float y = duet_fadd(duet_fadd(duet_fmul(duet_fmul(p, r), r), r), 1.0f);
    const float v = duet_fmul(y, duet_u2f((n_int + 127u) << 23));
    return x > 88.72f ? duet_u2f(0x7f800000u) : (x < -87.33f ? 0.0f : v);
}

// e^x with FMAs: duet_exp_f32's polynomial with each a·b + c fused (about 15 operations instead
// of 25; within 2 ulp of e^x, but not the CPU's exp_f32 bits). For the softmax of the
// cross-entropy kernels, which ran compute-bound on the unfused form at GPT-2's 50K-token
// vocabulary; they compare with the CPU within a tolerance.
DUET_SFN float duet_exp_fma_f32(float x) {
    const float xc = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float t = duet_fma(xc, 1.44269502f, 12582912.0f);
    const float n = duet_fsub(t, 12582912.0f);
    const unsigned n_int = duet_f2u(t) - duet_f2u(12582912.0f);
    float r = duet_fma(n, -0.693359375f, xc);
    r = duet_fma(n, 2.12194440e-4f, r);
    float p = 1.9875691e-4f;
    p = duet_fma(p, r, 1.3981999e-3f);
    p = duet_fma(p, r, 8.333452e-3f);
    p = duet_fma(p, r, 4.1665796e-2f);
    p = duet_fma(p, r, 1.6666665e-1f);
    p = duet_fma(p, r, 0.5f);
    const float y = duet_fadd(duet_fma(p, duet_fmul(r, r), r), 1.0f);
    const float v = duet_fmul(y, duet_u2f((n_int + 127u) << 23));
    return x > 88.72f ? duet_u2f(0x7f800000u) : (x < -87.33f ? 0.0f : v);
}

// ln(x) in f32 for the cross-entropy loss: x = m·2^e with m in [√½, √2), ln m = 2·atanh(s),
// s = (m − 1)/(m + 1), |s| < 0.172, by its series to s^25 in f64 (truncation below 2^-60), then
// + e·ln 2 and one rounding to f32. Correctly rounded for all but a few inputs. x <= 0, inf and
// NaN follow logf: -inf for ±0, NaN below 0 and for NaN, +inf for +inf.
DUET_SFN float duet_log_f32(float x) {
    const unsigned u = duet_f2u(x);
    if (x != x || x < 0.0f) return duet_u2f(0x7fc00000u);
    if (x == 0.0f) return -duet_u2f(0x7f800000u);
    if (u == 0x7f800000u) return x;
    double m = (double)x;
    int e = 0;
    if (u < 0x00800000u) {  // subnormal: scale by 2^64 (exact)
        m = duet_dmul(m, 18446744073709551616.0);
        e = -64;
    }
    const unsigned long long b = duet_d2u(m);
    e += (int)((b >> 52) & 0x7ff) - 1023;
    m = duet_u2d((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
    if (m > 1.4142135623730951) {
        m = duet_dmul(m, 0.5);
        e += 1;
    }
    const double s = duet_ddiv(duet_dsub(m, 1.0), duet_dadd(m, 1.0));
    const double s2 = duet_dmul(s, s);
    double p = 1.0 / 25.0;
    for (int k = 23; k >= 1; k -= 2) p = duet_dadd(duet_dmul(p, s2), duet_ddiv(1.0, (double)k));
    const double lnm = duet_dmul(duet_dmul(2.0, s), p);
    return (float)duet_dadd(lnm, duet_dmul((double)e, 0.69314718055994531));
}

// σ(−z) = 1/(1 + e^z) for GELU, the hot path of the GELU kernels: e^z by duet_exp_fma_f32
// (z clamped to [−87, 80]; 0 above 80), then the reciprocal by three Newton steps from an integer
// first guess (relative error below 2^-24 after the third), all FMAs: about 25 operations, so
// the GELU kernels stay memory-bound (the IEEE division and the unfused e^x made them
// compute-bound: +3.6 % on the seed bf16 step). Deterministic on both vendors: only IEEE FMAs,
// adds, multiplies and integer operations.
DUET_SFN float duet_sigmoid_neg(float z) {
    // zc in [−87, 80]: duet_exp_fma_f32's own clamp and edge cases never apply.
    const float zc = z < -87.0f ? -87.0f : (z > 80.0f ? 80.0f : z);
    const float d = duet_fadd(1.0f, duet_exp_fma_f32(zc));
    float q = duet_u2f(0x7EF311C3u - duet_f2u(d));
    q = duet_fma(q, duet_fma(-d, q, 1.0f), q);
    q = duet_fma(q, duet_fma(-d, q, 1.0f), q);
    q = duet_fma(q, duet_fma(-d, q, 1.0f), q);
    // Past 80 the clamped e^z would make σ too large; the true σ is below 2^-115 there: 0, so
    // that gelu(−∞) is NaN as x·σ was with the vendor exponential.
    return z > 80.0f ? 0.0f : q;
}

// GELU, tanh approximation: gelu(x) = 0.5·x·(1 + tanh(u)) = x·σ(2u), u = √(2/π)·(x + 0.044715·x³)
// (the sigmoid form avoids tanhf, which made the GELU kernels compute-bound). Shared by every
// kernel that applies GELU (gelu_forward/backward, the fused FP8 quantisations), so they compute
// the same bits. The CPU reference evaluates the same formula with its own e^x and division:
// the backends agree to rounding, not bit for bit.
#define GELU_K 0.7978846f
#define GELU_C 0.044715f

// σ(2u(x)).
DUET_SFN float gelu_sigma(float x) {
    const float x2 = duet_fmul(x, x);
    const float u = duet_fmul(GELU_K, duet_fma(duet_fmul(GELU_C, x2), x, x));
    return duet_sigmoid_neg(duet_fmul(-2.0f, u));
}

DUET_SFN float gelu_f(float x) { return duet_fmul(x, gelu_sigma(x)); }

// d/dx [x·σ(2u)] = σ + 2x·σ(1 − σ)·√(2/π)·(1 + 3·0.044715·x²).
DUET_SFN float gelu_grad_f(float x) {
    const float s = gelu_sigma(x);
    const float a = duet_fmul(duet_fmul(duet_fmul(2.0f * GELU_K, x), s), duet_fsub(1.0f, s));
    const float b = duet_fma(duet_fmul(3.0f * GELU_C, x), x, 1.0f);
    return duet_fma(a, b, s);
}

// AdamW, one element:
//   g = grad · s;  m = β1 m + (1 − β1) g;  v = β2 v + (1 − β2) g g
//   p −= lr · ((m / bc1) / (√(v / bc2) + ε) + wd · p)
// with the m and v updates, the decay term and the final step as FMAs and everything else
// rounded on its own (how NVRTC had contracted the plain expressions), so the results do not
// depend on how code around it is scheduled. Used by adamw.cu, fp8.cu's adamw_fp8_<D> and
// adamw.hip.
struct AdamWConsts {
    float beta1, beta2, eps, lr, bc1, bc2, grad_scale, weight_decay;
};

DUET_SFN float adamw_update(float graw, float& m, float& v, float p, const AdamWConsts& k) {
    const float g = duet_fmul(graw, k.grad_scale);
    const float mi = duet_fma(k.beta1, m, duet_fmul(1.0f - k.beta1, g));
    const float vi = duet_fma(k.beta2, v, duet_fmul(duet_fmul(1.0f - k.beta2, g), g));
    m = mi;
    v = vi;
    const float mhat = duet_fdiv(mi, k.bc1);
    const float vhat = duet_fdiv(vi, k.bc2);
    const float step = duet_fdiv(mhat, duet_fadd(duet_fsqrt(vhat), k.eps));
    return duet_fma(-k.lr, duet_fma(k.weight_decay, p, step), p);
}
// <<< duet shared math <<<
