//! Implements [`Fp8Ops`] for the CPU: FP8 quantisation with a device-resident scale and amax
//! recording (delayed scaling), and the FP8 GEMM on decoded values.

use super::gemm::{extent, gemm_widened, span};
use super::{ELEM_CHUNK, max_f32, read};
use crate::CpuDevice;
use crate::buffer::{Storage, unsupported};
use duet_device::{Buffer, Checked, Fp8Format, Fp8Ops, GemmDesc, GemmFp8, QuantizeFp8, Result};
use rayon::prelude::*;

/// Rows per task of the transposed store.
const T_ROWS: usize = 64;

/// A branch-light FP8 encoder that gives exactly [`Fp8Format::encode`]'s codes (round to
/// nearest even, saturation to ±max, the format's NaN code, FNUZ's unsigned zero) without the
/// table search: the binade comes from the f32 exponent bits and the mantissa is rounded with
/// one exact power-of-two multiply and `round_ties_even` (the same algorithm as the CUDA
/// kernels' `fp8_encode`). Checked against the reference codec in the tests below.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastEncoder {
    man: i32,
    bias: i32,
    max_code: u8,
    max_value: f32,
    nan: u8,
    fnuz: bool,
}

impl FastEncoder {
    pub(crate) fn new(f: Fp8Format) -> Self {
        let max_code = f.encode(f32::INFINITY);
        Self {
            man: f.man_bits as i32,
            bias: f.bias,
            max_code,
            max_value: f.decode(max_code),
            nan: f.nan_code(),
            fnuz: f.kind == duet_device::Fp8Kind::Fnuz,
        }
    }

    #[inline]
    pub(crate) fn encode(&self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan;
        }
        let a = x.abs();
        let code = if a >= self.max_value {
            self.max_code
        } else if a == 0.0 {
            0
        } else {
            // floor(log2 a) for normal f32; f32 subnormals are far below every FP8 binade and
            // are clamped with them into the FP8 subnormal range.
            let e = (((a.to_bits() >> 23) & 0xff) as i32 - 127).max(1 - self.bias);
            let q = e - self.man;
            // a · 2^-q is exact (q ≥ -(bias + man) keeps it a normal f32).
            let scaled = a * f32::from_bits(((127 - q) as u32) << 23);
            let r = scaled.round_ties_even() as i32;
            ((e + self.bias - 1) * (1 << self.man) + r).min(self.max_code as i32) as u8
        };
        if x.is_sign_negative() && !(self.fnuz && code == 0) {
            code | 0x80
        } else {
            code
        }
    }
}

impl Fp8Ops for CpuDevice {
    fn quantize_fp8(&self, args: Checked<QuantizeFp8<'_, Self::Buffer>>) -> Result<()> {
        let QuantizeFp8 {
            src,
            dst,
            dst_t,
            rows,
            cols,
            scale,
            amax,
            slot,
        } = args.into_inner();
        self.run(|| {
            const OP: &str = "quantize_fp8";
            let sv = src.act(OP)?;
            let fmt = Fp8Format::of(dst.dtype()).ok_or_else(|| unsupported(OP, dst.dtype()))?;
            let s = scale.f32s(OP)?[slot];
            let codes = match &mut dst.storage {
                Storage::Bytes(v) => v,
                _ => return Err(unsupported(OP, dst.dtype())),
            };
            let enc = FastEncoder::new(fmt);
            // Encode in fixed chunks; each chunk also reports its max |x| (NaN ignored by
            // f32::max).
            let maxes: Vec<f32> = codes
                .par_chunks_mut(ELEM_CHUNK)
                .enumerate()
                .map(|(i, out)| {
                    let mut scratch = Vec::new();
                    let xs = read(sv, i * ELEM_CHUNK, out.len(), &mut scratch);
                    let mut abs = Vec::with_capacity(xs.len());
                    for (o, &x) in out.iter_mut().zip(xs) {
                        *o = enc.encode(x * s);
                        abs.push(x.abs());
                    }
                    max_f32(&abs)
                })
                .collect();
            let m = maxes.into_iter().fold(0.0f32, f32::max);
            if let Some(t) = dst_t {
                let codes: &[u8] = codes;
                let tc = match &mut t.storage {
                    Storage::Bytes(v) => v,
                    _ => return Err(unsupported(OP, t.dtype())),
                };
                // dst_t[c, r] = dst[r, c]: tasks own blocks of output rows (source columns).
                tc.par_chunks_mut(T_ROWS * rows.max(1))
                    .enumerate()
                    .for_each(|(bi, out)| {
                        for (j, orow) in out.chunks_mut(rows.max(1)).enumerate() {
                            let c = bi * T_ROWS + j;
                            for (r, o) in orow.iter_mut().enumerate() {
                                *o = codes[r * cols + c];
                            }
                        }
                    });
            }
            let a = &mut amax.f32s_mut(OP)?[slot];
            *a = a.max(m);
            Ok(())
        })
    }

    /// FP8 GEMM emulation: the codes are decoded exactly to f32 with the format's codec, the
    /// product accumulates in f32 like any other GEMM, and the two inverse scales are folded into
    /// alpha — `C = (alpha·sa·sb)·op(A)·op(B) + beta·C`, which is what
    /// cuBLASLt's scale pointers compute.
    fn gemm_fp8(&self, args: Checked<GemmFp8<'_, Self::Buffer>>) -> Result<()> {
        let GemmFp8 {
            desc,
            a,
            b,
            c,
            scale_inv,
            a_slot,
            b_slot,
        } = args.into_inner();
        let threads = self.threads;
        self.run(|| {
            const OP: &str = "gemm_fp8";
            let s = scale_inv.f32s(OP)?;
            let d = GemmDesc {
                alpha: desc.alpha * s[a_slot] * s[b_slot],
                ..*desc
            };
            if d.batch == 0 || d.m == 0 || d.n == 0 {
                return Ok(());
            }
            let (ar, ac) = d.a_stored();
            let (br, bc) = d.b_stored();
            let a32 = a
                .any_float(OP)?
                .slice(d.a_offset, span(d.batch, d.stride_a, extent(ar, ac, d.lda)))
                .to_f32();
            let b32 = b
                .any_float(OP)?
                .slice(d.b_offset, span(d.batch, d.stride_b, extent(br, bc, d.ldb)))
                .to_f32();
            gemm_widened(OP, &d, &a32, &b32, c, threads)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [Fp8Format; 4] = [
        Fp8Format::E4M3,
        Fp8Format::E5M2,
        Fp8Format::E4M3_FNUZ,
        Fp8Format::E5M2_FNUZ,
    ];

    fn check(f: Fp8Format, enc: &FastEncoder, x: f32) {
        assert_eq!(
            enc.encode(x),
            f.encode(x),
            "{f:?} x = {x:e} ({:#010x})",
            x.to_bits()
        );
    }

    #[test]
    fn fast_encoder_matches_the_reference_codec() {
        for f in FORMATS {
            let enc = FastEncoder::new(f);
            // Every code's value, the midpoints between neighbours (the ties) and one f32 ulp
            // either side of them, with both signs.
            let mut vals: Vec<f32> = (0..=0x7fu8)
                .map(|c| f.decode(c))
                .filter(|v| v.is_finite())
                .collect();
            vals.sort_by(f32::total_cmp);
            vals.dedup();
            let mut probes = vals.clone();
            for w in vals.windows(2) {
                let mid = ((w[0] as f64 + w[1] as f64) / 2.0) as f32;
                probes.extend([mid, f32::from_bits(mid.to_bits() + 1)]);
                if mid > 0.0 {
                    probes.push(f32::from_bits(mid.to_bits() - 1));
                }
            }
            let top = *vals.last().unwrap();
            probes.extend([top * 1.01, top * 2.0, f32::MAX, f32::INFINITY, f32::NAN]);
            probes.extend([f32::MIN_POSITIVE, 1e-45, 1e-30, 0.0]);
            for &p in &probes {
                check(f, &enc, p);
                check(f, &enc, -p);
            }
            // Every bf16 bit pattern, and a spread of f32 patterns.
            for hi in 0..=u16::MAX {
                check(f, &enc, f32::from_bits((hi as u32) << 16));
            }
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..200_000 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                check(f, &enc, f32::from_bits(state as u32));
            }
        }
    }
}
