//! Scalar math kernels written so that loops over slices auto-vectorise (no libm calls).

/// `e^x` in f32 with about 1 ulp of error (Cephes `expf` polynomial).
///
/// `x = n·ln2 + r` with `n` rounded to nearest (Cody–Waite split of ln2) and `|r| ≤ ln2/2`;
/// `e^r` is a degree-7 polynomial and `2^n` is built from the exponent bits. Results below
/// f32's normal range flush to 0, above it are +∞; NaN propagates.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to an integer held in the low mantissa bits; subtracting it
    // again gives n as a float, and the bit difference gives n as an integer (no float→int
    // conversion, so the loops calling this vectorise well).
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits());
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // Wrapping ops: no overflow-check branches (n + 127 is in 1..=254 after the clamp).
    let scale = f32::from_bits(n_int.wrapping_add(127).wrapping_shl(23));
    let v = y * scale;
    if x > 88.72 {
        f32::INFINITY
    } else if x < -87.33 {
        0.0
    } else {
        v
    }
}

/// Logistic sigmoid `1 / (1 + e^−x)`.
#[inline(always)]
pub(crate) fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_f64_within_two_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp_f32(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).abs() as f64 * f32::EPSILON as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.0137;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
