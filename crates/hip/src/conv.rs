//! Every enum mapping of the backend in one place: dtypes to kernel-name suffixes (and the
//! checked activation / parameter suffixes), fill patterns and library type codes, and the row-major → column-major GEMM translation.

use crate::hipblaslt::sys as lt;
use crate::rocblas::result::ColMajorGemm;
use crate::rocblas::sys as rb;
use duet_device::{DType, DeviceError, GemmDesc, Result};

/// rocBLAS type of a GEMM operand (f32, f16, bf16).
pub fn rocblas_type(d: DType) -> Option<rb::rocblas_datatype> {
    match d {
        DType::F32 => Some(rb::rocblas_datatype_f32_r),
        DType::F16 => Some(rb::rocblas_datatype_f16_r),
        DType::BF16 => Some(rb::rocblas_datatype_bf16_r),
        _ => None,
    }
}

/// hipDataType of a hipBLASLt operand.
pub fn hip_data_type(d: DType) -> Option<lt::hipDataType> {
    match d {
        DType::F32 => Some(lt::HIP_R_32F),
        DType::F16 => Some(lt::HIP_R_16F),
        DType::BF16 => Some(lt::HIP_R_16BF),
        DType::F8E4M3 => Some(lt::HIP_R_8F_E4M3),
        DType::F8E5M2 => Some(lt::HIP_R_8F_E5M2),
        DType::F8E4M3Fnuz => Some(lt::HIP_R_8F_E4M3_FNUZ),
        DType::F8E5M2Fnuz => Some(lt::HIP_R_8F_E5M2_FNUZ),
        DType::I32 | DType::U8 => None,
    }
}

/// Whether the GPU's FP8 GEMMs take this format: FNUZ on gfx942 (MI300), OCP on gfx950 (MI350).
pub fn fp8_supported(arch_base: &str, d: DType) -> bool {
    match arch_base {
        "gfx942" => matches!(d, DType::F8E4M3Fnuz | DType::F8E5M2Fnuz),
        "gfx950" => matches!(d, DType::F8E4M3 | DType::F8E5M2),
        _ => false,
    }
}

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v)
        .map_err(|_| DeviceError::InvalidArgument(format!("gemm: {what} = {v} exceeds i32")))
}
fn to_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| DeviceError::InvalidArgument(format!("gemm: {what} = {v} exceeds i64")))
}

/// Row-major `C = op(A) op(B)` is column-major `Cᵀ = op(B)ᵀ op(A)ᵀ`: the BLAS call gets B as its
/// first operand and A as its second, m and n swapped, and each operand transposed iff it was
/// transposed in the row-major description (a row-major matrix read column-major is already its
/// transpose).
pub fn col_major(d: &GemmDesc) -> Result<ColMajorGemm> {
    Ok(ColMajorGemm {
        trans_a: d.trans_b,
        trans_b: d.trans_a,
        m: to_i32("n", d.n)?,
        n: to_i32("m", d.m)?,
        k: to_i32("k", d.k)?,
        lda: to_i32("ldb", d.ldb)?,
        ldb: to_i32("lda", d.lda)?,
        ldc: to_i32("ldc", d.ldc)?,
        stride_a: to_i64("stride_b", d.stride_b)?,
        stride_b: to_i64("stride_a", d.stride_a)?,
        stride_c: to_i64("stride_c", d.stride_c)?,
        batch: to_i32("batch", d.batch)?,
    })
}

/// `(kernel suffix, storage bits)` for `fill`: the element pattern of `value` in `d`, rounded
/// like the CPU reference.
pub fn fill_pattern(d: DType, value: f32) -> (u32, usize) {
    match d {
        DType::F32 => (value.to_bits(), 4),
        DType::I32 => (value as i32 as u32, 4),
        DType::F16 => (half::f16::from_f32(value).to_bits() as u32, 2),
        DType::BF16 => (half::bf16::from_f32(value).to_bits() as u32, 2),
        DType::U8 => (value as u8 as u32, 1),
        fp8 => {
            let f = duet_device::Fp8Format::of(fp8).map_or(0, |f| f.encode(value));
            (f as u32, 1)
        }
    }
}

/// The suffix kernel entry points use for a storage type (`add_bf16`, `cast_f32_f8e4m3`, ...):
/// every float type, FP8 included (the kernels' `DUET_FOR_FLOAT`).
pub fn kernel_suffix(d: DType) -> Option<&'static str> {
    d.is_float().then(|| d.name())
}

/// The f32/f16/bf16 suffix of an activation-type buffer (the kernels' `DUET_FOR_ACT`), and that
/// of a parameter or gradient buffer of the activations' dtype or f32 (`DUET_FOR_ACT_AND_WIDE`),
/// shared with the CUDA backend.
pub use duet_gpu::launch::{float_suffix, wide_suffix};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_swaps_operands_for_column_major() {
        // y = x·Wᵀ: x (m×k), W stored (n×k) → trans_b.
        let d = GemmDesc::new(false, true, 8, 5, 3);
        let g = col_major(&d).unwrap();
        assert_eq!((g.m, g.n, g.k), (5, 8, 3));
        assert!(g.trans_a && !g.trans_b);
        assert_eq!((g.lda, g.ldb, g.ldc), (3, 3, 5));
        let d = GemmDesc::batched(true, false, 4, 6, 2, 3);
        let g = col_major(&d).unwrap();
        assert!(!g.trans_a && g.trans_b);
        assert_eq!(
            (g.stride_a, g.stride_b, g.stride_c, g.batch),
            (12, 8, 24, 3)
        );
        assert!(col_major(&GemmDesc::new(false, false, 1 << 31, 1, 1)).is_err());
    }

    #[test]
    fn library_type_codes() {
        assert_eq!(rocblas_type(DType::BF16), Some(168));
        assert_eq!(rocblas_type(DType::F8E4M3), None);
        assert_eq!(hip_data_type(DType::F8E4M3Fnuz), Some(1000));
        assert_eq!(hip_data_type(DType::F8E5M2), Some(29));
        assert!(fp8_supported("gfx942", DType::F8E4M3Fnuz));
        assert!(!fp8_supported("gfx942", DType::F8E4M3));
        assert!(fp8_supported("gfx950", DType::F8E5M2));
        assert!(!fp8_supported("gfx90a", DType::F8E5M2Fnuz));
    }

    #[test]
    fn fill_patterns_round_like_the_cpu() {
        assert_eq!(fill_pattern(DType::F32, 1.5), (0x3fc0_0000, 4));
        assert_eq!(fill_pattern(DType::BF16, 1.0), (0x3f80, 2));
        assert_eq!(fill_pattern(DType::F16, -2.0), (0xc000, 2));
        assert_eq!(fill_pattern(DType::F8E4M3, 1e9), (0x7e, 1));
        assert_eq!(fill_pattern(DType::F8E4M3Fnuz, -0.0), (0x00, 1));
        assert_eq!(fill_pattern(DType::I32, -3.0), (-3i32 as u32, 4));
    }

    #[test]
    fn dtype_suffixes() {
        assert_eq!(
            wide_suffix("x", DType::BF16, "p", DType::F32).unwrap(),
            "f32"
        );
        assert_eq!(
            wide_suffix("x", DType::F16, "p", DType::F16).unwrap(),
            "f16"
        );
        assert!(wide_suffix("x", DType::F16, "p", DType::BF16).is_err());
        assert!(float_suffix("x", DType::F8E4M3).is_err());
        assert_eq!(float_suffix("x", DType::BF16).unwrap(), "bf16");
        assert_eq!(kernel_suffix(DType::F8E4M3Fnuz), Some("f8e4m3fnuz"));
        assert_eq!(kernel_suffix(DType::I32), None);
    }
}
