//! The math both vendors' kernels share (e^x, ln x, GELU, the AdamW update) is one file,
//! kernels-shared/duet_math.h, which kernels-cuda/common.cuh and kernels-hip/duet_hip.h include
//! after defining the rounded primitives it is written with (each backend pastes it into its own
//! header: NVRTC gets common.cuh, hiprtc duet_hip.h). This test checks that both headers include
//! it once and define every primitive it uses first, that the header hiprtc gets carries it, that
//! the kernels call no vendor math library where the results would differ, and, where a C++
//! compiler is installed, that the block's e^x is the CPU reference's exp_f32 bit for bit.

const CUDA: &str = include_str!("../../../kernels-cuda/common.cuh");
const HIP: &str = include_str!("../../../kernels-hip/duet_hip.h");
const MATH: &str = include_str!("../../../kernels-shared/duet_math.h");
const INCLUDE: &str = "#include \"duet_math.h\"";

#[test]
fn both_headers_include_the_one_shared_math() {
    for (side, src) in [("common.cuh", CUDA), ("duet_hip.h", HIP)] {
        let at: Vec<usize> = src
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim() == INCLUDE)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            at.len(),
            1,
            "{side} includes duet_math.h {} times",
            at.len()
        );
        let before = src.lines().take(at[0]).collect::<Vec<_>>().join("\n");
        // Every primitive the block uses is defined before it, and DUET_SFN.
        for p in [
            "duet_fadd",
            "duet_fsub",
            "duet_fmul",
            "duet_fdiv",
            "duet_fma",
            "duet_fsqrt",
            "duet_dadd",
            "duet_dsub",
            "duet_dmul",
            "duet_ddiv",
            "duet_d2u",
            "duet_u2d",
            "duet_f2u",
            "duet_u2f",
        ] {
            assert!(
                before.contains(&format!(" {p}(")),
                "{p} is not defined before the shared math in {side}"
            );
        }
        assert!(before.contains("#define DUET_SFN"), "{side}: DUET_SFN");
        // The block defines its functions once, in the shared file only.
        assert!(
            !src.contains("float duet_exp_f32("),
            "{side} defines duet_exp_f32 itself"
        );
    }
    // hiprtc gets one self-contained header with the block pasted in.
    let h = duet_hip::kernels::header();
    assert!(h.contains(MATH.trim_end()) && !h.lines().any(|l| l.trim() == INCLUDE));
}

/// Code with `//` comments removed.
fn code(src: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_vendor_math_where_the_vendors_differ() {
    let banned = [
        "expf(",
        "logf(",
        "tanhf(",
        "__expf(",
        "__logf(",
        "__fdividef(",
        "__fsqrt_rn(",
    ];
    let hip: Vec<(&str, &str)> = duet_hip::kernels::KernelModule::ALL
        .iter()
        .map(|m| (m.file(), m.source()))
        .collect();
    for (name, src) in hip {
        let c = code(src);
        for b in banned {
            let hits = c.matches(b).count() - c.matches(&format!("_{b}")).count();
            assert_eq!(hits, 0, "{name} calls {b}");
        }
    }
    // The CUDA kernels that have HIP counterparts.
    for (name, src) in [
        (
            "softmax.cu",
            include_str!("../../../kernels-cuda/softmax.cu"),
        ),
        (
            "cross_entropy.cu",
            include_str!("../../../kernels-cuda/cross_entropy.cu"),
        ),
        (
            "elementwise.cu",
            include_str!("../../../kernels-cuda/elementwise.cu"),
        ),
        (
            "layernorm.cu",
            include_str!("../../../kernels-cuda/layernorm.cu"),
        ),
        ("common.cuh", CUDA),
        ("duet_math.h", MATH),
    ] {
        // The hardware-approximation GELU of CUDA's fused FP8 kernels (which have no HIP
        // counterpart) is the one allowed use; only fp8.cu may call it.
        let src = match src.find("DUET_SFN float gelu_sigma_hw") {
            Some(a) => {
                let e = a + src[a..].find("DUET_SFN float gelu_grad_f_hw").unwrap();
                let e = e + src[e..].find("\n}\n").unwrap();
                format!("{}{}", &src[..a], &src[e..])
            }
            None => src.to_string(),
        };
        if name != "common.cuh" {
            assert!(
                !src.contains("_hw("),
                "{name} uses the hardware-approximation GELU"
            );
        }
        let c = code(&src);
        for b in ["expf(", "logf(", "tanhf(", "__expf(", "__fdividef("] {
            let hits = c.matches(b).count() - c.matches(&format!("_{b}")).count();
            assert_eq!(hits, 0, "{name} calls {b}");
        }
    }
}

use duet_cpu::exp_f32 as cpu_exp_f32;

/// Builds the shared block for the host with the system C++ compiler (contraction off, as the
/// AMD build) and runs `main_body`; None when no compiler is installed.
fn run_host(main_body: &str, tag: &str) -> Option<String> {
    let dir = std::env::temp_dir().join(format!("duet-shared-math-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = format!(
        "#include <cstdio>\n#include <cstring>\n#define DUET_SFN static inline\n\
         static unsigned duet_f2u(float x) {{ unsigned u; memcpy(&u, &x, 4); return u; }}\n\
         static float duet_u2f(unsigned u) {{ float x; memcpy(&x, &u, 4); return x; }}\n\
         static unsigned long long duet_d2u(double x) {{ unsigned long long u; memcpy(&u, &x, 8); return u; }}\n\
         static double duet_u2d(unsigned long long u) {{ double x; memcpy(&x, &u, 8); return x; }}\n\
         static float duet_fadd(float a, float b) {{ return a + b; }}\n\
         static float duet_fsub(float a, float b) {{ return a - b; }}\n\
         static float duet_fmul(float a, float b) {{ return a * b; }}\n\
         static float duet_fdiv(float a, float b) {{ return a / b; }}\n\
         static float duet_fma(float a, float b, float c) {{ return __builtin_fmaf(a, b, c); }}\n\
         static float duet_fsqrt(float a) {{ return __builtin_sqrtf(a); }}\n\
         static double duet_dadd(double a, double b) {{ return a + b; }}\n\
         static double duet_dsub(double a, double b) {{ return a - b; }}\n\
         static double duet_dmul(double a, double b) {{ return a * b; }}\n\
         static double duet_ddiv(double a, double b) {{ return a / b; }}\n\
         {}\nint main() {{\n{main_body}\nreturn 0;\n}}\n",
        MATH
    );
    let cpp = dir.join("m.cpp");
    let exe = dir.join("m");
    std::fs::write(&cpp, src).ok()?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let ok = std::process::Command::new(&cxx)
        .args(["-O2", "-ffp-contract=off", "-std=c++17", "-o"])
        .arg(&exe)
        .arg(&cpp)
        .status()
        .ok()?
        .success();
    assert!(ok, "{cxx} failed on the shared math block");
    let out = std::process::Command::new(&exe).output().ok()?;
    let _ = std::fs::remove_dir_all(&dir);
    String::from_utf8(out.stdout).ok()
}

/// A C++ loop running `stmt` with `x` (the bits of an f32) over `xs`.
fn over(xs: &[f32], stmt: &str) -> String {
    let list: Vec<String> = xs
        .iter()
        .map(|x| format!("0x{:08x}u", x.to_bits()))
        .collect();
    format!(
        "static const unsigned xs[] = {{{}}};\nfor (unsigned x : xs) {{ {stmt} }}",
        list.join(",")
    )
}

fn sweep() -> Vec<f32> {
    let mut xs = vec![
        0.0, -0.0, 1.0, -1.0, 88.0, 88.5, 88.72, 88.73, -87.0, -87.33, -87.34, 100.0, -100.0,
    ];
    let mut x = -90.0f32;
    while x < 90.0 {
        xs.push(x);
        x += 0.00731;
    }
    xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    xs
}

#[test]
fn shared_exp_is_the_cpu_exp_bit_for_bit() {
    let xs = sweep();
    let lines = over(
        &xs,
        "printf(\"%08x\\n\", duet_f2u(duet_exp_f32(duet_u2f(x))));",
    );
    let Some(out) = run_host(&lines, "exp") else {
        eprintln!("no C++ compiler: skipped");
        return;
    };
    for (x, l) in xs.iter().zip(out.lines()) {
        let got = u32::from_str_radix(l, 16).unwrap();
        let want = cpu_exp_f32(*x);
        assert!(
            got == want.to_bits() || (want.is_nan() && f32::from_bits(got).is_nan()),
            "exp({x}): shared {:e} cpu {want:e}",
            f32::from_bits(got)
        );
    }
}

#[test]
fn shared_log_is_within_one_ulp_and_follows_logf_at_the_edges() {
    let mut xs: Vec<f32> = vec![
        1.0,
        2.0,
        0.5,
        1e-45,
        1e-40,
        f32::MIN_POSITIVE,
        3.4e38,
        f32::MAX,
    ];
    let mut x = 1e-6f32;
    while x < 1e7 {
        xs.push(x);
        x *= 1.0137;
    }
    let specials = [0.0f32, -0.0, -1.0, f32::INFINITY, f32::NAN];
    xs.extend(specials);
    let lines = over(
        &xs,
        "printf(\"%08x\\n\", duet_f2u(duet_log_f32(duet_u2f(x))));",
    );
    let Some(out) = run_host(&lines, "log") else {
        eprintln!("no C++ compiler: skipped");
        return;
    };
    let mut exact = 0usize;
    let mut total = 0usize;
    for (x, l) in xs.iter().zip(out.lines()) {
        let got = f32::from_bits(u32::from_str_radix(l, 16).unwrap());
        let want = (*x as f64).ln();
        if !x.is_finite() || *x <= 0.0 {
            let w = x.ln();
            assert!(
                got == w || (got.is_nan() && w.is_nan()),
                "ln({x}) = {got}, want {w}"
            );
            continue;
        }
        total += 1;
        let w32 = want as f32;
        if got == w32 {
            exact += 1;
        }
        let ulp = (w32.abs().max(f32::MIN_POSITIVE) as f64) * f32::EPSILON as f64;
        assert!(
            (got as f64 - want).abs() <= ulp,
            "ln({x}) = {got}, want {want}"
        );
    }
    assert!(
        exact * 1000 >= total * 999,
        "{exact} of {total} correctly rounded"
    );
}

#[test]
fn shared_gelu_is_close_to_the_cpu_formula() {
    // The CPU evaluates x·σ(2u) with the same e^x in its own order: agreement to a few ulp.
    let xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.005).collect();
    let lines = over(
        &xs,
        "printf(\"%08x %08x\\n\", duet_f2u(gelu_f(duet_u2f(x))), duet_f2u(gelu_grad_f(duet_u2f(x))));",
    );
    let Some(out) = run_host(&lines, "gelu") else {
        eprintln!("no C++ compiler: skipped");
        return;
    };
    let sigmoid = |x: f32| 1.0 / (1.0 + cpu_exp_f32(-x));
    for (x, l) in xs.iter().zip(out.lines()) {
        let mut it = l
            .split(' ')
            .map(|w| f32::from_bits(u32::from_str_radix(w, 16).unwrap()));
        let (g, d) = (it.next().unwrap(), it.next().unwrap());
        let u = 0.797_884_6f32 * (x + 0.044_715 * x * x * x);
        let s = sigmoid(2.0 * u);
        let want_g = x * s;
        let want_d = s + 2.0 * x * s * (1.0 - s) * 0.797_884_6 * (1.0 + 3.0 * 0.044_715 * x * x);
        assert!(
            (g - want_g).abs() <= 1e-6 + 1e-5 * want_g.abs(),
            "gelu({x}) = {g}, cpu {want_g}"
        );
        assert!(
            (d - want_d).abs() <= 1e-5 + 1e-4 * want_d.abs(),
            "gelu'({x}) = {d}, cpu {want_d}"
        );
    }
}

/// GELU's σ(−z) = 1/(1 + e^z) (FMA e^z, Newton reciprocal) against f64 over z from −100 to
/// 100: within 4 ulp wherever the result is a normal f32, 0 past z = 80, never NaN.
#[test]
fn shared_gelu_sigmoid_is_within_4_ulp_of_f64() {
    let zs: Vec<f32> = (-20000..=20000).map(|i| i as f32 * 0.005).collect();
    let lines = over(
        &zs,
        "printf(\"%08x\\n\", duet_f2u(duet_sigmoid_neg(duet_u2f(x))));",
    );
    let Some(out) = run_host(&lines, "sigmoid") else {
        eprintln!("no C++ compiler: skipped");
        return;
    };
    for (z, l) in zs.iter().zip(out.lines()) {
        let got = f32::from_bits(u32::from_str_radix(l.trim(), 16).unwrap());
        assert!(!got.is_nan(), "sigma(-{z}) is NaN");
        let want = if *z > 80.0 {
            0.0
        } else {
            1.0 / (1.0 + (*z as f64).exp())
        };
        if *z > 80.0 {
            assert_eq!(got, 0.0, "sigma(-{z})");
        } else if want >= f32::MIN_POSITIVE as f64 {
            let ulp = want * f32::EPSILON as f64;
            assert!(
                (got as f64 - want).abs() <= 4.0 * ulp,
                "sigma(-{z}) = {got:e}, f64 {want:e}"
            );
        }
    }
}

/// The FMA form of e^x (the cross-entropy kernels' softmax) against f64: within 2 ulp over
/// −87..88 (the range duet_exp_f32 and the CPU's exp_f32 evaluate; like them it clamps its
/// argument there, so 88..88.72 gives e^88 and −87.33..−87 gives e^−87), 0 below −87.33, +inf
/// above 88.72, NaN for NaN.
#[test]
fn shared_exp_fma_is_within_2_ulp_of_f64() {
    let xs = sweep();
    let lines = over(
        &xs,
        "printf(\"%08x\\n\", duet_f2u(duet_exp_fma_f32(duet_u2f(x))));",
    );
    let Some(out) = run_host(&lines, "expfma") else {
        eprintln!("no C++ compiler: skipped");
        return;
    };
    let mut checked = 0usize;
    for (x, l) in xs.iter().zip(out.lines()) {
        let got = f32::from_bits(u32::from_str_radix(l.trim(), 16).unwrap());
        if x.is_nan() {
            assert!(got.is_nan(), "exp_fma(NaN) = {got}");
            continue;
        }
        if *x > 88.72 {
            assert_eq!(got, f32::INFINITY, "exp_fma({x})");
            continue;
        }
        if *x < -87.33 {
            assert_eq!(got, 0.0, "exp_fma({x})");
            continue;
        }
        let want = (x.clamp(-87.0, 88.0) as f64).exp();
        if (-87.0..=88.0).contains(x) {
            let ulp = want * f32::EPSILON as f64;
            assert!(
                (got as f64 - want).abs() <= 2.0 * ulp,
                "exp_fma({x}) = {got:e}, f64 {want:e}"
            );
            checked += 1;
        }
    }
    assert!(checked > 20_000, "only {checked} points checked");
}
