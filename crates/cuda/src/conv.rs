//! Every mapping between duet's types and CUDA's, in one place: dtype → kernel-name suffix (and
//! the checked activation / parameter suffixes), run-time dtype code, fill pattern and cuBLAS
//! data type, compute capability → NVRTC architecture, and the row-major [`GemmDesc`] →
//! column-major cuBLAS argument translation.

use cudarc::cublas::sys::{cublasOperation_t, cudaDataType};
use duet_device::{DType, DeviceError, GemmDesc, Result};

/// The suffix kernel entry points use for a storage type (`add_bf16`, `cast_f32_f8e4m3`, ...).
pub(crate) fn kernel_suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        DType::F8E4M3 => Some("f8e4m3"),
        DType::F8E5M2 => Some("f8e5m2"),
        DType::F8E4M3Fnuz => Some("f8e4m3fnuz"),
        DType::F8E5M2Fnuz => Some("f8e5m2fnuz"),
        DType::I32 | DType::U8 => None,
    }
}

/// The f32/f16/bf16 suffix of an activation-type buffer, and that of a parameter or gradient
/// buffer of the activations' dtype or f32 (shared with the HIP backend).
/// `float_code`: the run-time dtype code of the kernels' `load_dt` / `store_dt` (common.cuh) and
/// of the multi-tensor chunk tables (`grad_dt`, `copy_dt`), shared with the HIP backend.
pub(crate) use duet_gpu::launch::{float_code, float_suffix, wide_suffix};

/// `(bits, width in bytes)` of one element of `d` holding `value`, for `fill` (a memset of that
/// width). Floats round like the CPU reference (FP8 saturates); `value` must be an integer in
/// range for i32 and u8.
pub(crate) fn fill_pattern(d: DType, value: f32) -> Result<(u32, usize)> {
    Ok(match d {
        DType::F32 => (value.to_bits(), 4),
        DType::F16 => (half::f16::from_f32(value).to_bits() as u32, 2),
        DType::BF16 => (half::bf16::from_f32(value).to_bits() as u32, 2),
        DType::I32 => (duet_device::args::fill_i32(value)? as u32, 4),
        DType::U8 => (duet_device::args::fill_u8(value)? as u32, 1),
        fp8 => (
            duet_device::Fp8Format::of(fp8)
                .expect("fp8 dtype")
                .encode(value) as u32,
            1,
        ),
    })
}

/// cuBLAS data type of a GEMM operand.
pub(crate) fn blas_dtype(dtype: DType) -> Option<cudaDataType> {
    match dtype {
        DType::F32 => Some(cudaDataType::CUDA_R_32F),
        DType::F16 => Some(cudaDataType::CUDA_R_16F),
        DType::BF16 => Some(cudaDataType::CUDA_R_16BF),
        _ => None,
    }
}

/// NVRTC's `--gpu-architecture` value for a compute capability, e.g. (9, 0) → "sm_90".
pub(crate) fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// One strided-batched GEMM in cuBLAS's column-major terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ColMajorGemm {
    pub transa: cublasOperation_t,
    pub transb: cublasOperation_t,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    /// Leading dimension and batch stride of cuBLAS's first operand (duet's B).
    pub lda: i32,
    pub stride_a: i64,
    /// Leading dimension and batch stride of cuBLAS's second operand (duet's A).
    pub ldb: i32,
    pub stride_b: i64,
    pub ldc: i32,
    pub stride_c: i64,
    pub batch: i32,
}

fn to_i32(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        DeviceError::InvalidArgument(format!("gemm: {what} = {v} exceeds cuBLAS's 32-bit limit"))
    })
}

fn to_i64(what: &str, v: usize) -> Result<i64> {
    i64::try_from(v)
        .map_err(|_| DeviceError::InvalidArgument(format!("gemm: {what} = {v} is too large")))
}

/// The one place where duet's row-major GEMM becomes a column-major cuBLAS call.
///
/// A row-major matrix stored with leading dimension `ld` is, read column-major, its transpose
/// with the same `ld`. So `C = op(A)·op(B)` (row-major) is `Cᵀ = op(B)ᵀ·op(A)ᵀ` (column-major):
/// cuBLAS computes an `n × m` product whose first operand is duet's B (transposed iff
/// `trans_b`) and whose second is duet's A (transposed iff `trans_a`). Leading dimensions and
/// strides carry over unchanged; `alpha`, `beta` and the element offsets are applied by the
/// caller. The caller must pass duet's B pointer as cuBLAS's A and duet's A as cuBLAS's B.
pub(crate) fn col_major_gemm(desc: &GemmDesc) -> Result<ColMajorGemm> {
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    // cuBLAS rejects leading dimensions below 1 even when nothing is read (k = 0).
    let ld = |v: usize| v.max(1);
    Ok(ColMajorGemm {
        transa: op(desc.trans_b),
        transb: op(desc.trans_a),
        m: to_i32("n", desc.n)?,
        n: to_i32("m", desc.m)?,
        k: to_i32("k", desc.k)?,
        lda: to_i32("ldb", ld(desc.ldb))?,
        stride_a: to_i64("stride_b", desc.stride_b)?,
        ldb: to_i32("lda", ld(desc.lda))?,
        stride_b: to_i64("stride_a", desc.stride_a)?,
        ldc: to_i32("ldc", ld(desc.ldc))?,
        stride_c: to_i64("stride_c", desc.stride_c)?,
        batch: to_i32("batch", desc.batch)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates a column-major GEMM the way cuBLAS defines it, on plain slices.
    fn col_major_reference(
        g: &ColMajorGemm,
        a: &[f32],
        b: &[f32],
        c: &mut [f32],
        alpha: f32,
        beta: f32,
        offs: (usize, usize, usize),
    ) {
        let at = g.transa == cublasOperation_t::CUBLAS_OP_T;
        let bt = g.transb == cublasOperation_t::CUBLAS_OP_T;
        for bi in 0..g.batch as usize {
            let (ao, bo, co) = (
                offs.0 + bi * g.stride_a as usize,
                offs.1 + bi * g.stride_b as usize,
                offs.2 + bi * g.stride_c as usize,
            );
            for j in 0..g.n as usize {
                for i in 0..g.m as usize {
                    let mut acc = 0.0f32;
                    for p in 0..g.k as usize {
                        // op(A)[i, p] and op(B)[p, j], column-major storage.
                        let av = if at {
                            a[ao + p + i * g.lda as usize]
                        } else {
                            a[ao + i + p * g.lda as usize]
                        };
                        let bv = if bt {
                            b[bo + j + p * g.ldb as usize]
                        } else {
                            b[bo + p + j * g.ldb as usize]
                        };
                        acc += av * bv;
                    }
                    let cc = &mut c[co + i + j * g.ldc as usize];
                    *cc = alpha * acc + beta * *cc;
                }
            }
        }
    }

    /// Row-major definition straight from GemmDesc's documentation.
    fn row_major_reference(d: &GemmDesc, a: &[f32], b: &[f32], c: &mut [f32]) {
        for bi in 0..d.batch {
            for i in 0..d.m {
                for j in 0..d.n {
                    let mut acc = 0.0f32;
                    for p in 0..d.k {
                        let av = if d.trans_a {
                            a[d.a_offset + bi * d.stride_a + p * d.lda + i]
                        } else {
                            a[d.a_offset + bi * d.stride_a + i * d.lda + p]
                        };
                        let bv = if d.trans_b {
                            b[d.b_offset + bi * d.stride_b + j * d.ldb + p]
                        } else {
                            b[d.b_offset + bi * d.stride_b + p * d.ldb + j]
                        };
                        acc += av * bv;
                    }
                    let cc = &mut c[d.c_offset + bi * d.stride_c + i * d.ldc + j];
                    *cc = d.alpha * acc + d.beta * *cc;
                }
            }
        }
    }

    #[test]
    fn col_major_translation_matches_row_major_definition() {
        let mut seed = 0x9e3779b97f4a7c15u64;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let (m, n, k, batch) = (5, 7, 3, 2);
            let mut d = GemmDesc::batched(ta, tb, m, n, k, batch)
                .alpha(0.75)
                .beta(0.5);
            // Padded leading dimensions, offsets and gaps between batches.
            d.lda += 2;
            d.ldb += 1;
            d.ldc += 3;
            let (ar, _) = d.a_stored();
            let (br, _) = d.b_stored();
            d.stride_a = ar * d.lda + 4;
            d.stride_b = br * d.ldb + 1;
            d.stride_c = m * d.ldc + 2;
            d.a_offset = 3;
            d.b_offset = 5;
            d.c_offset = 1;
            let a: Vec<f32> = (0..d.a_offset + batch * d.stride_a)
                .map(|_| rnd())
                .collect();
            let b: Vec<f32> = (0..d.b_offset + batch * d.stride_b)
                .map(|_| rnd())
                .collect();
            let c0: Vec<f32> = (0..d.c_offset + batch * d.stride_c)
                .map(|_| rnd())
                .collect();
            d.validate(a.len(), b.len(), c0.len()).unwrap();
            let mut want = c0.clone();
            row_major_reference(&d, &a, &b, &mut want);
            let g = col_major_gemm(&d).unwrap();
            let mut got = c0.clone();
            // cuBLAS's A is duet's B and vice versa.
            col_major_reference(
                &g,
                &b,
                &a,
                &mut got,
                d.alpha,
                d.beta,
                (d.b_offset, d.a_offset, d.c_offset),
            );
            for (x, y) in got.iter().zip(&want) {
                assert!((x - y).abs() < 1e-5, "trans ({ta},{tb}): {x} vs {y}");
            }
        }
    }

    #[test]
    fn oversized_dimensions_are_errors() {
        let d = GemmDesc::new(false, false, 1 << 31, 1, 1);
        assert!(matches!(
            col_major_gemm(&d),
            Err(DeviceError::InvalidArgument(_))
        ));
    }
}
