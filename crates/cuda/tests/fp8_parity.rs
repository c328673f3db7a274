//! FP8 on CUDA against the CPU backend's emulation: the quantisation kernels must give the same
//! codes and the same amax bit for bit (both use round-to-nearest-even with saturation), and the
//! cuBLASLt FP8 GEMMs must match the CPU's f32 GEMM on the decoded values within accumulation
//! rounding. Without a CUDA device (or on a GPU before sm_89 for the GEMMs) the tests print why
//! they skip.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{DType, Device, DeviceError, DeviceExt, GemmDesc};
use half::{bf16, f16};
use std::sync::OnceLock;

macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn gpu(test: &str) -> Option<&'static CudaDevice> {
    static DEV: OnceLock<Result<CudaDevice, String>> = OnceLock::new();
    match DEV.get_or_init(|| CudaDevice::new(0).map_err(|e| e.to_string())) {
        Ok(d) => Some(d),
        Err(e) => {
            skip!("SKIP {test}: no usable CUDA device: {e}");
            None
        }
    }
}

fn fp8_gpu(test: &str) -> Option<&'static CudaDevice> {
    let g = gpu(test)?;
    if g.info().supports_fp8 {
        Some(g)
    } else {
        skip!(
            "SKIP {test}: {} ({}) has no FP8 tensor cores",
            g.info().name,
            g.info().arch
        );
        None
    }
}

fn cpu() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new(None).expect("cpu device"))
}

/// Deterministic values with a wide dynamic range, some beyond every FP8 maximum once scaled,
/// exact zeros and negative zeros, and (when `nan`) a few NaNs.
fn values(n: usize, seed: u64, nan: bool) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            match i % 97 {
                0 => 0.0,
                1 => -0.0,
                2 if nan => f32::NAN,
                3 => 1e5,
                4 => -7e4,
                _ => ((u - 0.5) * 2f64.powf(u * 24.0 - 12.0)) as f32,
            }
        })
        .collect()
}

fn upload_as<D: Device>(dev: &D, x: &[f32], dtype: DType) -> D::Buffer {
    match dtype {
        DType::F32 => dev.upload_new(x).unwrap(),
        DType::BF16 => {
            let v: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
            dev.upload_new(&v).unwrap()
        }
        DType::F16 => {
            let v: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
            dev.upload_new(&v).unwrap()
        }
        other => panic!("no host upload for {other}"),
    }
}

const FP8: [DType; 4] = [
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];

#[test]
fn quantize_matches_the_cpu_bit_for_bit() {
    let Some(g) = gpu("quantize_matches_the_cpu_bit_for_bit") else {
        return;
    };
    let c = cpu();
    for (rows, cols) in [(37, 70), (64, 128), (1, 1000), (130, 33)] {
        for src_t in [DType::F32, DType::BF16, DType::F16] {
            for dst_t in FP8 {
                for transposed in [false, true] {
                    let n = rows * cols;
                    let x = values(n, (rows * 131 + cols) as u64, true);
                    let scales = [0.5f32, 37.25, 3.0e-3];
                    let slot = 1;
                    let mut outs = Vec::new();
                    // GPU.
                    {
                        let src = upload_as(g, &x, src_t);
                        let mut dst = g.alloc(dst_t, n).unwrap();
                        let mut dt = g.alloc(dst_t, n).unwrap();
                        let scale = g.upload_new(&scales).unwrap();
                        let mut amax = g.upload_new(&[0.0f32, 2.0, 0.0]).unwrap();
                        g.quantize_fp8(
                            &src,
                            &mut dst,
                            transposed.then_some(&mut dt),
                            rows,
                            cols,
                            &scale,
                            &mut amax,
                            slot,
                        )
                        .unwrap();
                        outs.push((
                            g.download_bytes(&dst, 0, n).unwrap(),
                            g.download_bytes(&dt, 0, n).unwrap(),
                            g.download::<f32>(&amax).unwrap(),
                        ));
                    }
                    // CPU.
                    {
                        let src = upload_as(c, &x, src_t);
                        let mut dst = c.alloc(dst_t, n).unwrap();
                        let mut dt = c.alloc(dst_t, n).unwrap();
                        let scale = c.upload_new(&scales).unwrap();
                        let mut amax = c.upload_new(&[0.0f32, 2.0, 0.0]).unwrap();
                        c.quantize_fp8(
                            &src,
                            &mut dst,
                            transposed.then_some(&mut dt),
                            rows,
                            cols,
                            &scale,
                            &mut amax,
                            slot,
                        )
                        .unwrap();
                        outs.push((
                            c.download_bytes(&dst, 0, n).unwrap(),
                            c.download_bytes(&dt, 0, n).unwrap(),
                            c.download::<f32>(&amax).unwrap(),
                        ));
                    }
                    let what = format!("{rows}x{cols} {src_t} -> {dst_t} transposed {transposed}");
                    assert_eq!(outs[0].0, outs[1].0, "codes differ: {what}");
                    assert_eq!(outs[0].1, outs[1].1, "transposed codes differ: {what}");
                    let (ga, ca) = (&outs[0].2, &outs[1].2);
                    assert_eq!(ga[0], 0.0, "other slots untouched: {what}");
                    assert_eq!(ga[2], 0.0, "other slots untouched: {what}");
                    assert_eq!(ga[1].to_bits(), ca[1].to_bits(), "amax differs: {what}");
                    // 1e5 and -7e4 overflow f16 to ±inf, which the amax does not count; bf16
                    // rounds 1e5 to 99840.
                    if src_t != DType::F16 {
                        assert!(ca[1] >= 9.9e4, "amax includes the large values: {what}");
                    }
                }
            }
        }
    }
}

/// One FP8 GEMM on both devices; returns (gpu, cpu) results as f32.
#[allow(clippy::too_many_arguments)]
fn fp8_gemm_both(
    g: &CudaDevice,
    desc: &GemmDesc,
    a_dtype: DType,
    b_dtype: DType,
    c_dtype: DType,
    a_vals: &[f32],
    b_vals: &[f32],
    c0: &[f32],
) -> Result<(Vec<f32>, Vec<f32>), DeviceError> {
    fn run<D: Device>(
        dev: &D,
        desc: &GemmDesc,
        dt: (DType, DType, DType),
        a_vals: &[f32],
        b_vals: &[f32],
        c0: &[f32],
    ) -> Result<Vec<f32>, DeviceError> {
        // Quantise through the device (scale slots 0 and 1), then multiply with 1/scale.
        let scales = [64.0f32, 0.25];
        let inv = [1.0 / 64.0f32, 4.0];
        let scale = dev.upload_new(&scales)?;
        let scale_inv = dev.upload_new(&inv)?;
        let mut amax = dev.alloc(DType::F32, 2)?;
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let a32 = dev.upload_new(a_vals)?;
        let b32 = dev.upload_new(b_vals)?;
        let mut a = dev.alloc(dt.0, a_vals.len())?;
        let mut b = dev.alloc(dt.1, b_vals.len())?;
        dev.quantize_fp8(&a32, &mut a, None, ar, ac, &scale, &mut amax, 0)?;
        dev.quantize_fp8(&b32, &mut b, None, br, bc, &scale, &mut amax, 1)?;
        let mut c = upload_as(dev, c0, dt.2);
        dev.gemm_fp8(desc, &a, &b, &mut c, &scale_inv, 0, 1)?;
        dev.download_f32(&c)
    }
    let dt = (a_dtype, b_dtype, c_dtype);
    let gpu = run(g, desc, dt, a_vals, b_vals, c0)?;
    let cpu = run(cpu(), desc, dt, a_vals, b_vals, c0)?;
    Ok((gpu, cpu))
}

fn assert_close(what: &str, gpu: &[f32], cpu: &[f32], tol: f64) {
    assert_eq!(gpu.len(), cpu.len());
    let rms = (cpu.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / cpu.len() as f64).sqrt();
    for (i, (&a, &b)) in gpu.iter().zip(cpu).enumerate() {
        let err = (a as f64 - b as f64).abs();
        assert!(
            err <= tol * ((b as f64).abs() + rms),
            "{what}: element {i}: gpu {a} cpu {b} (rms {rms:.3e})"
        );
    }
}

#[test]
fn fp8_gemm_matches_the_cpu_emulation() {
    let Some(g) = fp8_gpu("fp8_gemm_matches_the_cpu_emulation") else {
        return;
    };
    // The model's three layouts: forward (x·Wᵀ), input gradient (dy·(Wᵀ)ᵀ), weight gradient.
    for (m, n, k) in [(64, 48, 96), (128, 384, 128), (32, 16, 512)] {
        let desc = GemmDesc::new(false, true, m, n, k);
        let a = values(m * k, 7 + m as u64, false);
        let b = values(n * k, 11 + n as u64, false);
        let a: Vec<f32> = a.iter().map(|x| x.clamp(-4.0, 4.0)).collect();
        let b: Vec<f32> = b.iter().map(|x| x.clamp(-100.0, 100.0)).collect();
        let zeros = vec![0.0f32; m * n];
        for (ad, bd) in [
            (DType::F8E4M3, DType::F8E4M3),
            (DType::F8E5M2, DType::F8E4M3),
            (DType::F8E4M3, DType::F8E5M2),
        ] {
            for cd in [DType::BF16, DType::F32, DType::F16] {
                let (gv, cv) = fp8_gemm_both(g, &desc, ad, bd, cd, &a, &b, &zeros).unwrap();
                let tol = match cd {
                    DType::F32 => 2e-3,
                    _ => 1e-2,
                };
                assert_close(&format!("{m}x{n}x{k} {ad}·{bd} -> {cd}"), &gv, &cv, tol);
            }
        }
        // Accumulation into an f32 C (the weight gradient): beta = 1, alpha = 0.5.
        let c0 = values(m * n, 3, false);
        let d = desc.beta(1.0).alpha(0.5);
        let (gv, cv) =
            fp8_gemm_both(g, &d, DType::F8E5M2, DType::F8E4M3, DType::F32, &a, &b, &c0).unwrap();
        assert_close(&format!("{m}x{n}x{k} accumulate"), &gv, &cv, 2e-3);
    }
}

#[test]
fn fp8_gemm_rejects_what_cublaslt_cannot_do() {
    let Some(g) = fp8_gpu("fp8_gemm_rejects_what_cublaslt_cannot_do") else {
        return;
    };
    let v = vec![0.5f32; 32 * 32];
    let nn = GemmDesc::new(false, false, 32, 32, 32);
    let err = fp8_gemm_both(
        g,
        &nn,
        DType::F8E4M3,
        DType::F8E4M3,
        DType::BF16,
        &v,
        &v,
        &v,
    )
    .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidArgument(_)), "{err}");
    let tn = GemmDesc::new(false, true, 32, 32, 32);
    for (a, b) in [
        (DType::F8E4M3Fnuz, DType::F8E4M3Fnuz),
        (DType::F8E5M2, DType::F8E5M2),
    ] {
        let err = fp8_gemm_both(g, &tn, a, b, DType::BF16, &v, &v, &v).unwrap_err();
        assert!(matches!(err, DeviceError::Unsupported { .. }), "{err}");
    }
    // A GEMM with an odd inner dimension is refused, not computed wrongly.
    let odd = GemmDesc::new(false, true, 32, 32, 24);
    let w = vec![0.5f32; 32 * 24];
    let err = fp8_gemm_both(
        g,
        &odd,
        DType::F8E4M3,
        DType::F8E4M3,
        DType::BF16,
        &w,
        &w,
        &v,
    )
    .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidArgument(_)), "{err}");
}
