// hip-on-cpu: the GEMM loops of the rocBLAS and hipBLASLt stand-ins (a TEST DOUBLE, ../README.md).
// Column-major, as both libraries: D[i + j·ldd] = alpha · Σ_k op(A)[i][k] · op(B)[k][j] (+ beta·C),
// the products accumulated in f32 in k order (one rounding per multiply and per add), operands
// decoded exactly to f32 first (f16, bf16 and all four FP8 formats are exact in f32).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace hoc {

/// Element types of the loops.
enum class Ty { F32, F16, BF16, E4M3, E5M2, E4M3Fnuz, E5M2Fnuz };

inline float bits_f32(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t f32_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float f16_to_f32(uint16_t h) {
    const uint32_t s = (h >> 15) & 1u, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float v;
    if (e == 0)
        v = std::ldexp(static_cast<float>(m), -24);
    else if (e == 31)
        v = m ? bits_f32(0x7fc00000u) : bits_f32(0x7f800000u);
    else
        v = std::ldexp(static_cast<float>(m | 0x400u), static_cast<int>(e) - 25);
    return s ? -v : v;
}

/// Round to nearest even (the hardware's conversion).
inline uint16_t f32_to_f16(float f) {
    const uint32_t u = f32_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (a < 0x38800000u) {                                                 // subnormal or zero in f16
        const float x = bits_f32(a);
        const float q = std::nearbyint(std::ldexp(x, 24));  // default rounding: to nearest even
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(q));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    r -= 0x38000000u;  // rebias 127 -> 15
    return static_cast<uint16_t>(sign | (r >> 13));
}

inline float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }
inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

/// FP8 codes, exactly: fmt 0 OCP E4M3, 1 OCP E5M2, 2 E4M3 FNUZ, 3 E5M2 FNUZ.
inline float fp8_to_f32(uint8_t c, int fmt) {
    const int mbits = (fmt == 0 || fmt == 2) ? 3 : 2;
    const int bias = fmt == 0 ? 7 : fmt == 1 ? 15 : fmt == 2 ? 8 : 16;
    const unsigned s = c >> 7, e = (c & 0x7fu) >> mbits, m = c & ((1u << mbits) - 1u);
    if (fmt >= 2 ? c == 0x80u : fmt == 0 ? (c & 0x7fu) == 0x7fu : (e == 31u && m != 0u))
        return bits_f32(0x7fc00000u);
    if (fmt == 1 && e == 31u) return s ? -INFINITY : INFINITY;
    const float v = e == 0 ? std::ldexp(static_cast<float>(m), 1 - bias - mbits)
                           : std::ldexp(static_cast<float>(m + (1u << mbits)), static_cast<int>(e) - bias - mbits);
    return s ? -v : v;
}

inline size_t ty_size(Ty t) {
    switch (t) {
        case Ty::F32: return 4;
        case Ty::F16:
        case Ty::BF16: return 2;
        default: return 1;
    }
}

inline float load(const void* p, size_t i, Ty t) {
    switch (t) {
        case Ty::F32: return static_cast<const float*>(p)[i];
        case Ty::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
        case Ty::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
        case Ty::E4M3: return fp8_to_f32(static_cast<const uint8_t*>(p)[i], 0);
        case Ty::E5M2: return fp8_to_f32(static_cast<const uint8_t*>(p)[i], 1);
        case Ty::E4M3Fnuz: return fp8_to_f32(static_cast<const uint8_t*>(p)[i], 2);
        case Ty::E5M2Fnuz: return fp8_to_f32(static_cast<const uint8_t*>(p)[i], 3);
    }
    return 0.0f;
}

/// Stores f32/f16/bf16 (the output types of both libraries).
inline void store(void* p, size_t i, Ty t, float v) {
    switch (t) {
        case Ty::F32: static_cast<float*>(p)[i] = v; return;
        case Ty::F16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); return;
        case Ty::BF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); return;
        default: return;
    }
}

/// acc[j·m + i] = Σ_k op(A)[i][k]·op(B)[k][j] for one batch entry (f32, k in order). A is
/// m × k (lda, column-major) or, transposed, k × m; B is k × n or, transposed, n × k.
inline void gemm_acc(bool ta, bool tb, int m, int n, int k, const void* a, Ty at, long long lda,
                     const void* b, Ty bt, long long ldb, float* acc) {
    // op(A) row-major (row i contiguous over k), op(B) column j contiguous over k.
    std::vector<float> A(static_cast<size_t>(m) * k), B(static_cast<size_t>(n) * k);
    for (int i = 0; i < m; i++)
        for (int kk = 0; kk < k; kk++)
            A[static_cast<size_t>(i) * k + kk] =
                load(a, ta ? static_cast<size_t>(i) * lda + kk : static_cast<size_t>(kk) * lda + i, at);
    for (int j = 0; j < n; j++)
        for (int kk = 0; kk < k; kk++)
            B[static_cast<size_t>(j) * k + kk] =
                load(b, tb ? static_cast<size_t>(kk) * ldb + j : static_cast<size_t>(j) * ldb + kk, bt);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const float* x = &A[static_cast<size_t>(i) * k];
            const float* y = &B[static_cast<size_t>(j) * k];
            float s = 0.0f;
            for (int kk = 0; kk < k; kk++) s += x[kk] * y[kk];
            acc[static_cast<size_t>(j) * m + i] = s;
        }
}

}  // namespace hoc
