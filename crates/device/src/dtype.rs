use crate::{DeviceError, Result};
use half::{bf16, f16};
use std::fmt;
use std::sync::OnceLock;

/// Element types a device buffer can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// OCP E4M3FN: max 448, no infinities, NaN = S.1111.111 (NVIDIA sm_89+, AMD gfx950).
    F8E4M3,
    /// OCP E5M2: max 57344, IEEE-style infinities and NaNs.
    F8E5M2,
    /// E4M3 FNUZ (AMD gfx942 / MI300X): bias 8, max 240, single NaN 0x80, no negative zero.
    F8E4M3Fnuz,
    /// E5M2 FNUZ (AMD gfx942): bias 16, max 57344, single NaN 0x80, no negative zero.
    F8E5M2Fnuz,
    /// Token ids and targets.
    I32,
    /// Raw bytes (host side of fp8 buffers).
    U8,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz | DType::U8 => 1,
        }
    }

    pub fn is_fp8(self) -> bool {
        matches!(
            self,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E4M3Fnuz | DType::F8E5M2Fnuz
        )
    }

    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::U8)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E4M3Fnuz => "f8e4m3fnuz",
            DType::F8E5M2Fnuz => "f8e5m2fnuz",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }

    /// Largest finite value of a float format.
    pub fn max_finite(self) -> Option<f32> {
        match self {
            DType::F32 => Some(f32::MAX),
            DType::F16 => Some(f16::MAX.to_f32()),
            DType::BF16 => Some(bf16::MAX.to_f32()),
            DType::F8E4M3 => Some(448.0),
            DType::F8E5M2 | DType::F8E5M2Fnuz => Some(57344.0),
            DType::F8E4M3Fnuz => Some(240.0),
            DType::I32 | DType::U8 => None,
        }
    }

    /// Decodes little-endian raw bytes of this dtype to f32.
    pub fn bytes_to_f32(self, bytes: &[u8]) -> Result<Vec<f32>> {
        if !bytes.len().is_multiple_of(self.size_bytes()) {
            return Err(DeviceError::InvalidArgument(format!(
                "{} bytes is not a whole number of {} elements",
                bytes.len(),
                self
            )));
        }
        Ok(match self {
            DType::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(bytes),
            DType::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(bytes)
                .into_iter()
                .map(f16::to_f32)
                .collect(),
            DType::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(bytes)
                .into_iter()
                .map(bf16::to_f32)
                .collect(),
            DType::I32 => bytemuck::pod_collect_to_vec::<u8, i32>(bytes)
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            DType::U8 => bytes.iter().map(|&b| b as f32).collect(),
            fp8 => {
                let f = Fp8Format::of(fp8).expect("fp8 dtype");
                bytes.iter().map(|&b| f.decode(b)).collect()
            }
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host element types that map one-to-one onto a [`DType`].
pub trait HostType: bytemuck::Pod + Send + Sync {
    const DTYPE: DType;
    fn as_bytes(s: &[Self]) -> &[u8] {
        bytemuck::cast_slice(s)
    }
    fn from_bytes(b: &[u8]) -> Vec<Self> {
        bytemuck::pod_collect_to_vec(b)
    }
}

impl HostType for f32 {
    const DTYPE: DType = DType::F32;
}
impl HostType for f16 {
    const DTYPE: DType = DType::F16;
}
impl HostType for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl HostType for i32 {
    const DTYPE: DType = DType::I32;
}
impl HostType for u8 {
    const DTYPE: DType = DType::U8;
}

/// A bit-exact FP8 codec (OCP E4M3FN/E5M2 and AMD's FNUZ variants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Format {
    pub exp_bits: u32,
    pub man_bits: u32,
    pub bias: i32,
    pub kind: Fp8Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8Kind {
    /// OCP E4M3FN: no infinities; S.1111.111 is NaN.
    Fn,
    /// OCP E5M2: IEEE-like, exponent all-ones is inf (mantissa 0) or NaN.
    Ieee,
    /// FNUZ: only 0x80 is NaN; no negative zero, no infinities.
    Fnuz,
}

impl Fp8Format {
    pub const E4M3: Self = Self {
        exp_bits: 4,
        man_bits: 3,
        bias: 7,
        kind: Fp8Kind::Fn,
    };
    pub const E5M2: Self = Self {
        exp_bits: 5,
        man_bits: 2,
        bias: 15,
        kind: Fp8Kind::Ieee,
    };
    pub const E4M3_FNUZ: Self = Self {
        exp_bits: 4,
        man_bits: 3,
        bias: 8,
        kind: Fp8Kind::Fnuz,
    };
    pub const E5M2_FNUZ: Self = Self {
        exp_bits: 5,
        man_bits: 2,
        bias: 16,
        kind: Fp8Kind::Fnuz,
    };

    pub fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::F8E4M3 => Some(Self::E4M3),
            DType::F8E5M2 => Some(Self::E5M2),
            DType::F8E4M3Fnuz => Some(Self::E4M3_FNUZ),
            DType::F8E5M2Fnuz => Some(Self::E5M2_FNUZ),
            _ => None,
        }
    }

    /// The code used for NaN when encoding.
    pub fn nan_code(self) -> u8 {
        match self.kind {
            Fp8Kind::Fn | Fp8Kind::Ieee => 0x7f,
            Fp8Kind::Fnuz => 0x80,
        }
    }

    pub fn decode(self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0f64 } else { 1.0 };
        let e = ((code >> self.man_bits) & ((1 << self.exp_bits) - 1)) as i32;
        let m = (code & ((1 << self.man_bits) - 1)) as i32;
        let e_max = (1 << self.exp_bits) - 1;
        match self.kind {
            Fp8Kind::Fnuz if code == 0x80 => return f32::NAN,
            Fp8Kind::Fn if e == e_max && m == (1 << self.man_bits) - 1 => return f32::NAN,
            Fp8Kind::Ieee if e == e_max => {
                return if m == 0 {
                    (sign * f64::INFINITY) as f32
                } else {
                    f32::NAN
                };
            }
            _ => {}
        }
        let frac = m as f64 / (1u32 << self.man_bits) as f64;
        let mag = if e == 0 {
            frac * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + frac) * 2f64.powi(e - self.bias)
        };
        (sign * mag) as f32
    }

    /// The positive finite values, indexed by code 0..=max_code (monotonic).
    fn positive_table(self) -> &'static [f64] {
        static TABLES: [OnceLock<Vec<f64>>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let idx = match (self.exp_bits, self.kind) {
            (4, Fp8Kind::Fn) => 0,
            (5, Fp8Kind::Ieee) => 1,
            (4, Fp8Kind::Fnuz) => 2,
            _ => 3,
        };
        TABLES[idx].get_or_init(|| {
            (0u8..=0x7f)
                .map(|c| self.decode(c) as f64)
                .take_while(|v| v.is_finite())
                .collect()
        })
    }

    pub fn max_finite(self) -> f32 {
        *self.positive_table().last().expect("non-empty") as f32
    }

    /// Encodes with round-to-nearest-even and saturation to ±max (infinities saturate too).
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let table = self.positive_table();
        let a = (x as f64).abs();
        let max_code = table.len() - 1;
        let code = if a >= table[max_code] {
            max_code
        } else {
            // First index whose value exceeds a; the answer is it or the one below.
            let hi = table.partition_point(|&v| v <= a);
            let lo = hi - 1;
            let (dl, dh) = (a - table[lo], table[hi] - a);
            if dl < dh || (dl == dh && lo % 2 == 0) {
                lo
            } else {
                hi
            }
        } as u8;
        let negative = x.is_sign_negative();
        if negative && !(code == 0 && self.kind == Fp8Kind::Fnuz) {
            code | 0x80
        } else {
            code
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_max_values() {
        assert_eq!(Fp8Format::E4M3.max_finite(), 448.0);
        assert_eq!(Fp8Format::E5M2.max_finite(), 57344.0);
        assert_eq!(Fp8Format::E4M3_FNUZ.max_finite(), 240.0);
        assert_eq!(Fp8Format::E5M2_FNUZ.max_finite(), 57344.0);
    }

    #[test]
    fn fp8_roundtrip_every_code() {
        for f in [
            Fp8Format::E4M3,
            Fp8Format::E5M2,
            Fp8Format::E4M3_FNUZ,
            Fp8Format::E5M2_FNUZ,
        ] {
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_nan() {
                    assert_eq!(f.encode(v), f.nan_code(), "{f:?} {c:#x}");
                } else if v.is_infinite() {
                    assert_eq!(f.decode(f.encode(v)).abs(), f.max_finite(), "saturates");
                } else if f.kind == Fp8Kind::Fnuz || v != 0.0 || c == 0 {
                    assert_eq!(f.encode(v), c, "{f:?} code {c:#x} value {v}");
                } else {
                    // OCP negative zero keeps its sign bit.
                    assert_eq!(f.encode(-0.0), 0x80);
                }
            }
        }
    }

    #[test]
    fn fp8_rounding_and_saturation() {
        let f = Fp8Format::E4M3;
        // 1.0 = 0x38, next is 1.125; 1.0625 is a tie → even mantissa (1.0).
        assert_eq!(f.encode(1.0625), 0x38);
        assert_eq!(f.encode(1.07), 0x39);
        assert_eq!(f.encode(1e9), 0x7e);
        assert_eq!(f.encode(-1e9), 0xfe);
        assert_eq!(f.encode(f32::INFINITY), 0x7e);
        assert_eq!(Fp8Format::E4M3_FNUZ.encode(-0.0), 0x00);
        assert!(Fp8Format::E4M3_FNUZ.decode(0x80).is_nan());
        // Smallest E4M3 subnormal is 2^-9; a quarter of it rounds to zero.
        assert_eq!(f.decode(1), 2f32.powi(-9));
        assert_eq!(f.encode(2f32.powi(-11)), 0);
    }
}
