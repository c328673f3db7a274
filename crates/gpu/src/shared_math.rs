//! The math both vendors' kernels share (kernels-shared/duet_math.h: e^x, ln x, GELU, the
//! AdamW update), and how each backend pastes it into its own header (kernels-cuda/common.cuh,
//! kernels-hip/duet_hip.h), so NVRTC and hiprtc each get one self-contained header and the
//! kernel caches' keys cover the shared math.

/// The shared math header's text.
pub const MATH_HEADER: &str = include_str!("../../../kernels-shared/duet_math.h");

/// The line by which a backend header includes it.
pub const MATH_INCLUDE_LINE: &str = "#include \"duet_math.h\"";

/// `header` with the shared math pasted in for its include line.
pub fn with_shared_math(header: &str) -> String {
    header
        .lines()
        .map(|l| {
            if l.trim() == MATH_INCLUDE_LINE {
                MATH_HEADER
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}
