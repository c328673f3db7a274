//! What only CUDA's FP8 paths have, on a GPU: CUDA graphs replaying the FP8 kernels, the fused
//! optimizer-to-codes toggle and its counter, cuBLASLt's packed and in-place scale reads, its
//! layout refusals, the gradient quantisation's accumulation and dbias model. The ops themselves
//! (codes, amaxes, transposes, every fused FP8 path against its composition, FP8 GEMMs against
//! the decoded reference) are checked for every backend by the conformance suite
//! (crates/conformance/src/cases/fp8.rs). Without a CUDA device (or on a GPU before sm_89 for the
//! GEMMs) the tests print why they skip.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{
    AdamWClippedFp8, Buffer, DType, Device, DeviceError, DeviceExt, Fp8Format, Fp8QuantJob,
    GemmDesc, GemmFp8, LayerNormForward, LayerNormForwardFp8, QuantizeFp8, QuantizeFp8Gelu,
    QuantizeFp8Grad, QuantizeFp8Many, Runtime,
};
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

/// One FP8 GEMM on both devices; returns (gpu, cpu) results as f32. The inverse scales sit
/// `inv_stride` elements apart (1: packed, which cuBLASLt reads from aligned copies; 64: in
/// place).
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
    inv_stride: usize,
) -> Result<(Vec<f32>, Vec<f32>), DeviceError> {
    fn run<D: Device>(
        dev: &D,
        desc: &GemmDesc,
        dt: (DType, DType, DType),
        a_vals: &[f32],
        b_vals: &[f32],
        c0: &[f32],
        inv_stride: usize,
    ) -> Result<Vec<f32>, DeviceError> {
        // Quantise through the device (scale slots 0 and 1), then multiply with 1/scale.
        let scales = [64.0f32, 0.25];
        let mut inv = vec![f32::NAN; 2 * inv_stride];
        (inv[0], inv[inv_stride]) = (1.0 / 64.0f32, 4.0);
        let scale = dev.upload_new(&scales)?;
        let scale_inv = dev.upload_new(&inv)?;
        let mut amax = dev.alloc(DType::F32, 2)?;
        let (ar, ac) = desc.a_stored();
        let (br, bc) = desc.b_stored();
        let a32 = dev.upload_new(a_vals)?;
        let b32 = dev.upload_new(b_vals)?;
        let mut a = dev.alloc(dt.0, a_vals.len())?;
        let mut b = dev.alloc(dt.1, b_vals.len())?;
        dev.exec(QuantizeFp8 {
            src: &a32,
            dst: &mut a,
            dst_t: None,
            rows: ar,
            cols: ac,
            scale: &scale,
            amax: &mut amax,
            slot: 0,
        })?;
        dev.exec(QuantizeFp8 {
            src: &b32,
            dst: &mut b,
            dst_t: None,
            rows: br,
            cols: bc,
            scale: &scale,
            amax: &mut amax,
            slot: 1,
        })?;
        let mut c = upload_as(dev, c0, dt.2);
        dev.exec(GemmFp8 {
            desc,
            a: &a,
            b: &b,
            c: &mut c,
            scale_inv: &scale_inv,
            a_slot: 0,
            b_slot: inv_stride,
        })?;
        dev.download_f32(&c)
    }
    let dt = (a_dtype, b_dtype, c_dtype);
    let gpu = run(g, desc, dt, a_vals, b_vals, c0, inv_stride)?;
    let cpu = run(cpu(), desc, dt, a_vals, b_vals, c0, inv_stride)?;
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
                let what = format!("{m}x{n}x{k} {ad}·{bd} -> {cd}");
                let (gv, cv) = fp8_gemm_both(g, &desc, ad, bd, cd, &a, &b, &zeros, 1).unwrap();
                let tol = match cd {
                    DType::F32 => 2e-3,
                    _ => 1e-2,
                };
                assert_close(&what, &gv, &cv, tol);
                // Scales read in place (256-byte aligned slots): the same kernel, the same bits.
                let (gs, cs) = fp8_gemm_both(g, &desc, ad, bd, cd, &a, &b, &zeros, 64).unwrap();
                assert_eq!(cs, cv, "{what}: the CPU with strided scales");
                let same = gs.iter().zip(&gv).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{what}: scales in place differ from the aligned copies"
                );
                // Fast accumulation: the same products summed in the tensor cores' reduced
                // precision, close to the exact sums.
                let fast = desc.fp8_fast_accum(true);
                let (gf, cf) = fp8_gemm_both(g, &fast, ad, bd, cd, &a, &b, &zeros, 64).unwrap();
                assert_eq!(cf, cv, "{what}: the CPU ignores fast accumulation");
                assert_close(&format!("{what} fast accumulation"), &gf, &cv, 2.0 * tol);
            }
        }
        // Accumulation into an f32 C (the weight gradient): beta = 1, alpha = 0.5.
        let c0 = values(m * n, 3, false);
        let d = desc.beta(1.0).alpha(0.5);
        for stride in [1, 64] {
            let (gv, cv) = fp8_gemm_both(
                g,
                &d,
                DType::F8E5M2,
                DType::F8E4M3,
                DType::F32,
                &a,
                &b,
                &c0,
                stride,
            )
            .unwrap();
            assert_close(
                &format!("{m}x{n}x{k} accumulate, stride {stride}"),
                &gv,
                &cv,
                2e-3,
            );
        }
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
        1,
    )
    .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidArgument(_)), "{err}");
    let tn = GemmDesc::new(false, true, 32, 32, 32);
    for (a, b) in [
        (DType::F8E4M3Fnuz, DType::F8E4M3Fnuz),
        (DType::F8E5M2, DType::F8E5M2),
    ] {
        let err = fp8_gemm_both(g, &tn, a, b, DType::BF16, &v, &v, &v, 1).unwrap_err();
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
        1,
    )
    .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidArgument(_)), "{err}");
}

// ------------------------------------------------------------------ vectorised kernels

/// The value `x` as the source dtype stores it (what the kernels see).
fn stored(x: f32, dtype: DType) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Asserts equal codes; on a difference names the first element, its input and both codes.
/// `src_index(i)` maps a position of the compared buffer to the source element.
fn assert_codes(
    what: &str,
    gpu: &[u8],
    cpu: &[u8],
    input: &[f32],
    src_index: impl Fn(usize) -> usize,
) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let bad: Vec<usize> = (0..gpu.len()).filter(|&i| gpu[i] != cpu[i]).collect();
    if let Some(&i) = bad.first() {
        let x = input[src_index(i)];
        panic!(
            "{what}: {} codes differ; first at {i}: input {x:e} ({:#010x}) gpu {:#04x} cpu {:#04x}",
            bad.len(),
            x.to_bits(),
            gpu[i],
            cpu[i]
        );
    }
}

// ------------------------------------------------------------------ quantize_fp8_grad

/// Calling twice accumulates dbias twice and records the amax once more (a max, unchanged).
#[test]
fn quantize_fp8_grad_accumulates() {
    let Some(g) = gpu("quantize_fp8_grad_accumulates") else {
        return;
    };
    let (rows, cols) = (136usize, 72usize); // partial tiles in both directions
    let dout: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.25)
        .collect();
    let d = g.upload_new(&dout).unwrap();
    let mut dst = g.alloc(DType::F8E5M2, rows * cols).unwrap();
    let mut dt = g.alloc(DType::F8E5M2, rows * cols).unwrap();
    let mut dbias = g.upload_new(&vec![1.0f32; cols]).unwrap();
    let scale = g.upload_new(&[1.0f32]).unwrap();
    let mut amax = g.upload_new(&[0.0f32]).unwrap();
    for _ in 0..2 {
        g.exec(QuantizeFp8Grad {
            dout: &d,
            gelu_pre: None,
            dst: &mut dst,
            dst_t: Some(&mut dt),
            dbias: &mut dbias,
            rows,
            cols,
            scale: &scale,
            amax: &mut amax,
            slot: 0,
        })
        .unwrap();
    }
    let db = g.download::<f32>(&dbias).unwrap();
    for (j, &v) in db.iter().enumerate() {
        // Exact in f32: multiples of 0.25 with small sums.
        let s: f32 = (0..rows).map(|r| dout[r * cols + j]).sum();
        assert_eq!(v, 1.0 + 2.0 * s, "dbias[{j}]");
    }
    assert_eq!(g.download::<f32>(&amax).unwrap()[0], 0.75);
}

// ------------------------------------------------------------------ quantize_fp8_gelu

/// One quantize_fp8_grad into a dbias of `dbias_dtype` starting at `dbias0`; returns dbias's bytes.
#[allow(clippy::too_many_arguments)]
fn grad_dbias_bytes(
    g: &CudaDevice,
    d: &<CudaDevice as Runtime>::Buffer,
    p: Option<&<CudaDevice as Runtime>::Buffer>,
    fmt: DType,
    rows: usize,
    cols: usize,
    transposed: bool,
    dbias_dtype: DType,
    dbias0: &[f32],
) -> Vec<u8> {
    let n = rows * cols;
    let mut dst = g.alloc(fmt, n).unwrap();
    let mut dt = g.alloc(fmt, n).unwrap();
    let mut dbias = upload_as(g, dbias0, dbias_dtype);
    let scale = g.upload_new(&[0.5f32]).unwrap();
    let mut amax = g.upload_new(&[0.0f32]).unwrap();
    g.exec(QuantizeFp8Grad {
        dout: d,
        gelu_pre: p,
        dst: &mut dst,
        dst_t: transposed.then_some(&mut dt),
        dbias: &mut dbias,
        rows,
        cols,
        scale: &scale,
        amax: &mut amax,
        slot: 0,
    })
    .unwrap();
    g.download_bytes(&dbias, 0, cols).unwrap()
}

/// The CUDA tile kernels' dbias summation replayed on the host, add for add (no GELU): per
/// 64 × 64 tile, thread (row group q of 16, pass p) adds rows q + 16p in order; lanes of the
/// same columns combine by butterfly ((a0 + a1) + (a2 + a3) for the 4 row groups of a warp), the
/// 4 warps add in order; then the finishing block adds tile row sums in 8 chains (tiles y,
/// y + 8, ...) and the chains in order onto 0, and that onto dbias.
fn host_dbias(g: &[f32], rows: usize, cols: usize, dbias0: &[f32]) -> Vec<f32> {
    let tiles = rows.div_ceil(64);
    let mut partial = vec![0.0f32; tiles * cols];
    for k in 0..tiles {
        for c in 0..cols {
            let acc = |rt: usize| {
                let mut a = 0.0f32;
                for p in 0..4 {
                    let r = k * 64 + rt + 16 * p;
                    if r < rows {
                        a += g[r * cols + c];
                    }
                }
                a
            };
            let warp = |w: usize| {
                let a: [f32; 4] = std::array::from_fn(|q| acc(4 * w + q));
                (a[0] + a[1]) + (a[2] + a[3])
            };
            let mut s = warp(0);
            for w in 1..4 {
                s += warp(w);
            }
            partial[k * cols + c] = s;
        }
    }
    (0..cols)
        .map(|c| {
            let mut total = 0.0f32;
            for y in 0..8 {
                let mut chain = 0.0f32;
                for k in (y..tiles).step_by(8) {
                    chain += partial[k * cols + c];
                }
                total += chain;
            }
            dbias0[c] + total
        })
        .collect()
}

/// dbias of quantize_fp8_grad is bit-identical run to run (one launch: the last block of each
/// column tile adds the tile sums in a fixed order), for every dbias dtype, with and without
/// GELU and the transposed copy; without GELU it equals the host replay of the summation order.
#[test]
fn quantize_fp8_grad_dbias_is_deterministic() {
    let test = "quantize_fp8_grad_dbias_is_deterministic";
    let Some(g) = gpu(test) else {
        return;
    };
    let shapes = [
        (64, 64),
        (136, 72),
        (1000, 200),
        (1001, 200),
        (8, 8),
        (8192, 3072),
    ];
    for (si, &(rows, cols)) in shapes.iter().enumerate() {
        let n = rows * cols;
        let dout: Vec<f32> = values(n, 500 + si as u64, false)
            .iter()
            .map(|x| x.clamp(-3.0e4, 3.0e4))
            .collect();
        let pre: Vec<f32> = values(n, 600 + si as u64, false)
            .iter()
            .map(|x| x.clamp(-6.0, 6.0))
            .collect();
        let dbias0: Vec<f32> = (0..cols).map(|i| (i as f32 - 5.0) * 0.375).collect();
        for act in [DType::BF16, DType::F32] {
            let d = upload_as(g, &dout, act);
            let p = upload_as(g, &pre, act);
            for gelu in [false, true] {
                // dst_t needs rows a multiple of 8 on the fused path; 1001 rows run without.
                for transposed in [false, true] {
                    if transposed && !rows.is_multiple_of(8) {
                        continue;
                    }
                    for dbias_dtype in [DType::F32, DType::BF16, DType::F16] {
                        let what = format!(
                            "{rows}x{cols} {act} gelu {gelu} transposed {transposed} dbias \
                             {dbias_dtype}"
                        );
                        let pre_buf = gelu.then_some(&p);
                        let run = || {
                            grad_dbias_bytes(
                                g,
                                &d,
                                pre_buf,
                                DType::F8E4M3,
                                rows,
                                cols,
                                transposed,
                                dbias_dtype,
                                &dbias0,
                            )
                        };
                        let first = run();
                        for _ in 0..2 {
                            assert_eq!(run(), first, "dbias differs between runs: {what}");
                        }
                        if !gelu && dbias_dtype == DType::F32 {
                            let ds: Vec<f32> = dout.iter().map(|&v| stored(v, act)).collect();
                            let want = host_dbias(&ds, rows, cols, &dbias0);
                            let got: Vec<f32> = first
                                .chunks_exact(4)
                                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                                .collect();
                            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{what}: dbias[{j}] {a:e}, host order gives {b:e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The fused FP8 ops recorded into a CUDA graph and replayed: the gradient kernels' column-tile
/// counters reset themselves, so every replay adds the same dbias increment as an eager call,
/// and the GELU quantisation gives the eager codes (the fused kernels run while recording: no
/// allocation). Own device, since recording must not see other tests' ops.
#[test]
fn fp8_fused_ops_replay_in_a_graph() {
    let test = "fp8_fused_ops_replay_in_a_graph";
    if gpu(test).is_none() {
        return;
    }
    let g = CudaDevice::new(0).expect("a second device on the same GPU");
    if !g.capabilities().graphs {
        skip!("SKIP {test}: no graph capture");
        return;
    }
    let (rows, cols) = (1024usize, 768usize);
    let n = rows * cols;
    let dout: Vec<f32> = values(n, 901, false)
        .iter()
        .map(|x| x.clamp(-100.0, 100.0))
        .collect();
    let pre: Vec<f32> = values(n, 902, false)
        .iter()
        .map(|x| x.clamp(-6.0, 6.0))
        .collect();
    let d = upload_as(&g, &dout, DType::BF16);
    let p = upload_as(&g, &pre, DType::BF16);
    type Buf = <CudaDevice as Runtime>::Buffer;
    let mut dst = g.alloc(DType::F8E5M2, n).unwrap();
    let mut dt = g.alloc(DType::F8E5M2, n).unwrap();
    let mut hq = g.alloc(DType::F8E4M3, n).unwrap();
    let mut hqt = g.alloc(DType::F8E4M3, n).unwrap();
    let mut dbias = g.alloc(DType::F32, cols).unwrap();
    let scale = g.upload_new(&[1.0f32, 8.0]).unwrap();
    let mut amax = g.upload_new(&[0.0f32, 0.0]).unwrap();
    // One "step": dgelu gradient with dst_t, GELU quantisation with dst_t, plain gradient.
    let step = |[dst, dt, hq, hqt, dbias, amax]: [&mut Buf; 6]| -> Result<(), DeviceError> {
        g.exec(QuantizeFp8Grad {
            dout: &d,
            gelu_pre: Some(&p),
            dst,
            dst_t: Some(dt),
            dbias,
            rows,
            cols,
            scale: &scale,
            amax,
            slot: 0,
        })?;
        g.exec(QuantizeFp8Gelu {
            pre: &p,
            dst: hq,
            dst_t: Some(hqt),
            rows,
            cols,
            scale: &scale,
            amax,
            slot: 1,
        })?;
        g.exec(QuantizeFp8Grad {
            dout: &d,
            gelu_pre: None,
            dst,
            dst_t: None,
            dbias,
            rows,
            cols,
            scale: &scale,
            amax,
            slot: 0,
        })
    };
    // Eager: one step's increment and codes (this also sizes the scratch), then `replays` steps.
    let replays = 3;
    g.fill(&mut dbias, 0.0).unwrap();
    step([&mut dst, &mut dt, &mut hq, &mut hqt, &mut dbias, &mut amax]).unwrap();
    let eager_db = g.download::<f32>(&dbias).unwrap();
    let eager_h = (
        g.download_bytes(&hq, 0, n).unwrap(),
        g.download_bytes(&hqt, 0, n).unwrap(),
    );
    g.fill(&mut dbias, 0.0).unwrap();
    for _ in 0..replays {
        step([&mut dst, &mut dt, &mut hq, &mut hqt, &mut dbias, &mut amax]).unwrap();
    }
    let want = g.download::<f32>(&dbias).unwrap();
    // Recorded.
    g.fill(&mut hq, 0.0).unwrap();
    g.fill(&mut hqt, 0.0).unwrap();
    g.fill(&mut dbias, 0.0).unwrap();
    g.synchronize().unwrap();
    g.capture_begin().unwrap();
    let recorded = step([&mut dst, &mut dt, &mut hq, &mut hqt, &mut dbias, &mut amax]);
    let graph = g.capture_end().unwrap();
    recorded.unwrap();
    for r in 0..replays {
        g.replay(&graph).unwrap();
        if r == 0 {
            let got = g.download::<f32>(&dbias).unwrap();
            let same = got
                .iter()
                .zip(&eager_db)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "one replay adds one eager step's dbias");
        }
    }
    let got = g.download::<f32>(&dbias).unwrap();
    for (j, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "dbias[{j}] after {replays} replays"
        );
    }
    assert!(
        (
            g.download_bytes(&hq, 0, n).unwrap(),
            g.download_bytes(&hqt, 0, n).unwrap()
        ) == eager_h,
        "replayed GELU codes differ from the eager ones"
    );
}

// ------------------------------------------------------------------ layernorm_forward_fp8

/// LayerNorm rows with different offsets and spreads and some exact zeros; with `specials`
/// (and enough rows) row 1 is constant (zero variance), row 2 holds a NaN, row 3 an infinity and
/// row 4 values near 1e4 (cancellation in x − μ).
fn ln_input(n: usize, c: usize, seed: u64, specials: bool) -> Vec<f32> {
    let u = values(n * c, seed, false);
    let mut x: Vec<f32> = (0..n * c)
        .map(|i| {
            let r = i / c;
            let offset = ((r * 37) % 11) as f32 * 0.7 - 3.5;
            let spread = 2f32.powi((r % 7) as i32 - 3);
            // `values` spans many binades; squash it into [-1, 1] keeping the sign.
            let v = u[i].signum() * (u[i].abs() * 4096.0).ln_1p() / 9.0;
            if i % 53 == 5 {
                0.0
            } else {
                offset + spread * v
            }
        })
        .collect();
    if specials {
        let row = |x: &mut Vec<f32>, r: usize, f: &dyn Fn(usize) -> f32| {
            if r < n {
                for j in 0..c {
                    x[r * c + j] = f(j);
                }
            }
        };
        row(&mut x, 1, &|_| 3.0);
        row(&mut x, 2, &|j| {
            if j == c / 2 {
                f32::NAN
            } else {
                0.25 * j as f32
            }
        });
        row(&mut x, 3, &|j| if j == 0 { f32::INFINITY } else { -1.0 });
        row(&mut x, 4, &|j| 1.0e4 + (j % 13) as f32 * 0.5);
    }
    x
}

/// γ around 1 with every 17th at 40 (normalised values past every FP8 maximum once scaled) and
/// β small with exact ±0.
fn ln_params(c: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let u = values(2 * c, seed, false);
    let gamma = (0..c)
        .map(|j| {
            if j % 17 == 3 {
                40.0
            } else {
                0.5 + (u[j].abs() * 1e3).fract()
            }
        })
        .collect();
    let beta = (0..c)
        .map(|j| match j % 23 {
            0 => 0.0,
            1 => -0.0,
            _ => (u[c + j].abs() * 1e3).fract() - 0.5,
        })
        .collect();
    (gamma, beta)
}

/// Outputs of one layernorm_forward_fp8 (or of layernorm_forward + quantize_fp8).
struct LnFp8Out {
    dst: Vec<u8>,
    dst_t: Vec<u8>,
    mean: Vec<u32>,
    rstd: Vec<u32>,
    amax: Vec<f32>,
}

/// layernorm_forward_fp8 on the GPU, or with `separate` layernorm_forward into a temporary and
/// quantize_fp8 of it. `x` rounded to `act`, γ and β to `param`; scale slot 1, amax slot 1
/// starting at 0.5 (slots 0 and 2 at 0).
#[allow(clippy::too_many_arguments)]
fn ln_fp8_on(
    g: &CudaDevice,
    (x, gamma, beta): (&[f32], &[f32], &[f32]),
    (act, param, fmt): (DType, DType, DType),
    n: usize,
    c: usize,
    transposed: bool,
    scale: f32,
    separate: bool,
) -> LnFp8Out {
    let len = n * c;
    let xb = upload_as(g, x, act);
    let gb = upload_as(g, gamma, param);
    let bb = upload_as(g, beta, param);
    let mut mean = g.alloc(DType::F32, n).unwrap();
    let mut rstd = g.alloc(DType::F32, n).unwrap();
    let mut dst = g.alloc(fmt, len).unwrap();
    let mut dt = g.alloc(fmt, len).unwrap();
    for b in [&mut mean, &mut rstd, &mut dst, &mut dt] {
        g.fill(b, 0.0).unwrap();
    }
    let scales = g.upload_new(&[0.5f32, scale, 3.0e-3]).unwrap();
    let mut amax = g.upload_new(&[0.0f32, 0.5, 0.0]).unwrap();
    let eps = 1e-5;
    if separate {
        let mut out = g.alloc(act, len).unwrap();
        g.exec(LayerNormForward {
            x: &xb,
            gamma: &gb,
            beta: &bb,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps,
        })
        .unwrap();
        g.exec(QuantizeFp8 {
            src: &out,
            dst: &mut dst,
            dst_t: transposed.then_some(&mut dt),
            rows: n,
            cols: c,
            scale: &scales,
            amax: &mut amax,
            slot: 1,
        })
        .unwrap();
    } else {
        g.exec(LayerNormForwardFp8 {
            x: &xb,
            gamma: &gb,
            beta: &bb,
            mean: &mut mean,
            rstd: &mut rstd,
            dst: &mut dst,
            dst_t: transposed.then_some(&mut dt),
            n,
            c,
            eps,
            scale: &scales,
            amax: &mut amax,
            slot: 1,
        })
        .unwrap();
    }
    let bits = |b: &<CudaDevice as Runtime>::Buffer| -> Vec<u32> {
        g.download::<f32>(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    LnFp8Out {
        dst: g.download_bytes(&dst, 0, len).unwrap(),
        dst_t: g.download_bytes(&dt, 0, len).unwrap(),
        mean: bits(&mean),
        rstd: bits(&rstd),
        amax: g.download::<f32>(&amax).unwrap(),
    }
}

/// Asserts the fused outputs `f` equal the separate ops' `s` bit for bit; `xs` is the stored
/// input (named in code mismatches).
fn assert_ln_same(
    what: &str,
    n: usize,
    c: usize,
    xs: &[f32],
    transposed: bool,
    f: &LnFp8Out,
    s: &LnFp8Out,
) {
    assert_codes(what, &f.dst, &s.dst, xs, |i| i);
    if transposed {
        assert_codes(&format!("{what} (dst_t)"), &f.dst_t, &s.dst_t, xs, |i| {
            (i % n) * c + i / n
        });
    } else {
        assert!(f.dst_t.iter().all(|&b| b == 0), "dst_t untouched: {what}");
    }
    for (name, a, b) in [("mean", &f.mean, &s.mean), ("rstd", &f.rstd, &s.rstd)] {
        if let Some(r) = (0..n).find(|&r| a[r] != b[r]) {
            let (x, y) = (f32::from_bits(a[r]), f32::from_bits(b[r]));
            panic!(
                "{what}: {name}[{r}] fused {x:e} ({:#010x}) separate {y:e} ({:#010x})",
                a[r], b[r]
            );
        }
    }
    assert_eq!(f.amax[1].to_bits(), s.amax[1].to_bits(), "amax: {what}");
    assert!(f.amax[1] >= 0.5, "amax only grows: {what}");
    assert_eq!((f.amax[0], f.amax[2]), (0.0, 0.0), "other slots: {what}");
}

/// The fused LayerNorm + FP8 quantisation against the GPU's own layernorm_forward +
/// quantize_fp8: codes, transposed codes, mean, rstd and amax bit for bit. Model shapes, every
/// fast LayerNorm layout (vectorised with 1, 2, 4 and 8 warps per row, single elements), rows
/// and columns not multiples of 8 or 32, rows too wide for the fast LayerNorm (the separate
/// ops inside), bf16/f16/f32 activations with parameters of the same type or f32, every FP8
/// format (FNUZ: the separate ops inside), special rows (NaN, inf, zero variance). The fused
/// call runs forced onto each kernel path (one pass; statistics + tile kernel) and by default.
#[test]
fn layernorm_forward_fp8_matches_the_separate_ops() {
    let test = "layernorm_forward_fp8_matches_the_separate_ops";
    let Some(g) = gpu(test) else {
        return;
    };
    let shapes = [
        (8192, 768),
        (256, 2048),
        (65, 130),
        (1, 64),
        (130, 1000),
        (37, 45),
        (33, 8),
        (8, 1),
        (70, 3072),
        (40, 6144),
        (9, 6152),
        (9, 1537),
    ];
    let mut checked = 0;
    for (si, &(n, c)) in shapes.iter().enumerate() {
        let big = n * c > 1 << 20;
        let (gamma, beta) = ln_params(c, 500 + si as u64);
        for specials in [false, true] {
            let x = ln_input(n, c, 400 + si as u64, specials);
            for (act, param) in [
                (DType::BF16, DType::BF16),
                (DType::BF16, DType::F32),
                (DType::F16, DType::F16),
                (DType::F16, DType::F32),
                (DType::F32, DType::F32),
            ] {
                let xs: Vec<f32> = x.iter().map(|&v| stored(v, act)).collect();
                for fmt in FP8 {
                    // The model shapes: bf16 and f16 (same-type parameters) into the OCP
                    // formats.
                    if big
                        && (param != act
                            || act == DType::F32
                            || matches!(fmt, DType::F8E4M3Fnuz | DType::F8E5M2Fnuz))
                    {
                        continue;
                    }
                    for transposed in [false, true] {
                        for scale in [1.0f32, 37.25] {
                            let what = format!(
                                "{n}x{c} {act}/{param} -> {fmt} specials {specials} scale \
                                 {scale} transposed {transposed}"
                            );
                            let run = |separate| {
                                ln_fp8_on(
                                    g,
                                    (&x, &gamma, &beta),
                                    (act, param, fmt),
                                    n,
                                    c,
                                    transposed,
                                    scale,
                                    separate,
                                )
                            };
                            let s = run(true);
                            // Both kernel paths (one pass; statistics + tile kernel) wherever
                            // they apply, then the default choice.
                            for split in [Some(false), Some(true), None] {
                                CudaDevice::layernorm_fp8_split_on_this_thread(split);
                                let f = run(false);
                                CudaDevice::layernorm_fp8_split_on_this_thread(None);
                                let what = format!("{what} split {split:?}");
                                assert_ln_same(&what, n, c, &xs, transposed, &f, &s);
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked >= 4500, "{checked} cases");
}

/// layernorm_forward_fp8 recorded into a CUDA graph and replayed gives the eager results (the
/// fused kernel allocates nothing; the wide shape needs more than 48 KiB of shared memory).
/// Own device, since recording must not see other tests' ops.
#[test]
fn layernorm_forward_fp8_replays_in_a_graph() {
    let test = "layernorm_forward_fp8_replays_in_a_graph";
    if gpu(test).is_none() {
        return;
    }
    let g = CudaDevice::new(0).expect("a second device on the same GPU");
    if !g.capabilities().graphs {
        skip!("SKIP {test}: no graph capture");
        return;
    }
    for (n, c) in [(1024usize, 768usize), (96, 6144)] {
        let x = upload_as(&g, &ln_input(n, c, 77, true), DType::BF16);
        let (gamma, beta) = ln_params(c, 78);
        let (gb, bb) = (
            upload_as(&g, &gamma, DType::BF16),
            upload_as(&g, &beta, DType::BF16),
        );
        let scale = g.upload_new(&[4.0f32]).unwrap();
        let mut amax = g.upload_new(&[0.0f32]).unwrap();
        let mut mean = g.alloc(DType::F32, n).unwrap();
        let mut rstd = g.alloc(DType::F32, n).unwrap();
        let mut dst = g.alloc(DType::F8E4M3, n * c).unwrap();
        let mut dt = g.alloc(DType::F8E4M3, n * c).unwrap();
        type Buf = <CudaDevice as Runtime>::Buffer;
        let step = |[mean, rstd, dst, dt, amax]: [&mut Buf; 5]| {
            g.exec(LayerNormForwardFp8 {
                x: &x,
                gamma: &gb,
                beta: &bb,
                mean,
                rstd,
                dst,
                dst_t: Some(dt),
                n,
                c,
                eps: 1e-5,
                scale: &scale,
                amax,
                slot: 0,
            })
        };
        let outs = |bufs: [&Buf; 5]| -> Vec<Vec<u8>> {
            bufs.iter()
                .map(|b| g.download_bytes(b, 0, b.len()).unwrap())
                .collect()
        };
        step([&mut mean, &mut rstd, &mut dst, &mut dt, &mut amax]).unwrap();
        let eager = outs([&mean, &rstd, &dst, &dt, &amax]);
        for b in [&mut mean, &mut rstd, &mut dst, &mut dt, &mut amax] {
            g.fill(b, 0.0).unwrap();
        }
        g.synchronize().unwrap();
        g.capture_begin().unwrap();
        let recorded = step([&mut mean, &mut rstd, &mut dst, &mut dt, &mut amax]);
        let graph = g.capture_end().unwrap();
        recorded.unwrap();
        for _ in 0..2 {
            g.replay(&graph).unwrap();
        }
        assert!(
            outs([&mean, &rstd, &dst, &dt, &amax]) == eager,
            "{n}x{c}: replayed outputs differ from the eager ones"
        );
    }
}

/// layernorm_forward_fp8's argument checks (the same errors as the separate ops give).
#[test]
fn layernorm_forward_fp8_checks_its_arguments() {
    let Some(g) = gpu("layernorm_forward_fp8_checks_its_arguments") else {
        return;
    };
    let (n, c) = (4usize, 64usize);
    let x = g.alloc(DType::BF16, n * c).unwrap();
    let gamma = g.alloc(DType::BF16, c).unwrap();
    let beta = g.alloc(DType::BF16, c).unwrap();
    let short = g.alloc(DType::BF16, c - 1).unwrap();
    let gamma_f16 = g.alloc(DType::F16, c).unwrap();
    let scale = g.upload_new(&[1.0f32]).unwrap();
    let mut amax = g.alloc(DType::F32, 1).unwrap();
    let mut mean = g.alloc(DType::F32, n).unwrap();
    let mut rstd = g.alloc(DType::F32, n).unwrap();
    let mut dst = g.alloc(DType::F8E4M3, n * c).unwrap();
    let mut dst_bf16 = g.alloc(DType::BF16, n * c).unwrap();
    let mut run = |gm: &<CudaDevice as Runtime>::Buffer,
                   dst: &mut <CudaDevice as Runtime>::Buffer,
                   slot: usize| {
        g.exec(LayerNormForwardFp8 {
            x: &x,
            gamma: gm,
            beta: &beta,
            mean: &mut mean,
            rstd: &mut rstd,
            dst,
            dst_t: None,
            n,
            c,
            eps: 1e-5,
            scale: &scale,
            amax: &mut amax,
            slot,
        })
    };
    assert!(matches!(
        run(&short, &mut dst, 0),
        Err(DeviceError::Shape { .. })
    ));
    assert!(matches!(
        run(&gamma_f16, &mut dst, 0),
        Err(DeviceError::Unsupported { .. })
    ));
    assert!(matches!(
        run(&gamma, &mut dst_bf16, 0),
        Err(DeviceError::Unsupported { .. })
    ));
    assert!(matches!(
        run(&gamma, &mut dst, 1),
        Err(DeviceError::Shape { .. })
    ));
    run(&gamma, &mut dst, 0).unwrap();
}

// ------------------------------------------------------------------ quantize_fp8_many

/// One job of the multi-matrix tests: rows, cols, source dtype, FP8 dtype, transposed copy, slot.
type Spec = (usize, usize, DType, DType, bool, usize);

/// The "seed" model's linear weights (one layer: qkv, attention projection, MLP up and down),
/// bf16 → E4M3 with transposed copies, each in its own slot from `slot0`.
fn seed_weights(slot0: usize) -> Vec<Spec> {
    [(2304, 768), (768, 768), (3072, 768), (768, 3072)]
        .iter()
        .enumerate()
        .map(|(i, &(r, c))| (r, c, DType::BF16, DType::F8E4M3, true, slot0 + i))
        .collect()
}

/// The jobs' sources on `g` (deterministic values with NaNs, zeros and overflowing values).
fn many_srcs(g: &CudaDevice, specs: &[Spec]) -> Vec<<CudaDevice as Runtime>::Buffer> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| upload_as(g, &values(s.0 * s.1, 500 + i as u64, true), s.2))
        .collect()
}

/// quantize_fp8_many recorded into a CUDA graph (after an eager call with the same jobs, which
/// uploads the job table) replays to the eager results. Own device, since recording must not see
/// other tests' ops.
#[test]
fn quantize_fp8_many_replays_in_a_graph() {
    let test = "quantize_fp8_many_replays_in_a_graph";
    if gpu(test).is_none() {
        return;
    }
    let g = CudaDevice::new(0).expect("a second device on the same GPU");
    if !g.capabilities().graphs {
        skip!("SKIP {test}: no graph capture");
        return;
    }
    type Buf = <CudaDevice as Runtime>::Buffer;
    let mut specs = seed_weights(0);
    specs.extend(seed_weights(4));
    specs.push((37, 45, DType::BF16, DType::F8E5M2, true, 8)); // per-job path
    specs.push((64, 64, DType::F32, DType::F8E5M2, false, 8)); // second tile group
    let srcs = many_srcs(&g, &specs);
    let scale = g
        .upload_new(&(0..9).map(|i| 0.5 + i as f32).collect::<Vec<_>>())
        .unwrap();
    let mut amax = g.alloc(DType::F32, 9).unwrap();
    let mut dsts: Vec<Buf> = specs
        .iter()
        .map(|s| g.alloc(s.3, s.0 * s.1).unwrap())
        .collect();
    let mut dts: Vec<Buf> = specs
        .iter()
        .map(|s| g.alloc(s.3, s.0 * s.1).unwrap())
        .collect();
    let step = |dsts: &mut [Buf], dts: &mut [Buf], amax: &mut Buf| {
        let mut jobs: Vec<Fp8QuantJob<'_, Buf>> = specs
            .iter()
            .zip(&srcs)
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
            .map(|((s, src), (dst, dt))| Fp8QuantJob {
                src,
                dst,
                dst_t: s.4.then_some(dt),
                rows: s.0,
                cols: s.1,
                slot: s.5,
            })
            .collect();
        g.exec(QuantizeFp8Many {
            jobs: &mut jobs,
            scale: &scale,
            amax,
        })
    };
    let outs = |dsts: &[Buf], dts: &[Buf], amax: &Buf| -> Vec<Vec<u8>> {
        dsts.iter()
            .chain(dts)
            .chain([amax])
            .map(|b| g.download_bytes(b, 0, b.len()).unwrap())
            .collect()
    };
    let clear = |dsts: &mut [Buf], dts: &mut [Buf], amax: &mut Buf| {
        for b in dsts.iter_mut().chain(dts.iter_mut()).chain([amax]) {
            g.fill(b, 0.0).unwrap();
        }
    };
    clear(&mut dsts, &mut dts, &mut amax);
    step(&mut dsts, &mut dts, &mut amax).unwrap();
    let eager = outs(&dsts, &dts, &amax);
    clear(&mut dsts, &mut dts, &mut amax);
    g.synchronize().unwrap();
    g.capture_begin().unwrap();
    let recorded = step(&mut dsts, &mut dts, &mut amax);
    let graph = g.capture_end().unwrap();
    recorded.unwrap();
    for _ in 0..2 {
        g.replay(&graph).unwrap();
    }
    assert!(
        outs(&dsts, &dts, &amax) == eager,
        "replayed outputs differ from the eager ones"
    );
}

/// One tensor of the adamw_clipped_fp8 test: shape, gradient dtype, codes (if any), whether
/// the codes are also wanted transposed, whether the tensor has a 16-bit working copy.
struct AdamWFp8Case {
    rows: usize,
    cols: usize,
    grad: DType,
    codes: Option<DType>,
    transposed: bool,
    copy: bool,
}

/// The buffers of one run of adamw_clipped_fp8 (param, grad, m, v, bf16 copy if any; codes and
/// transposed codes per case; scale, amax, scalars).
struct AdamWFp8Run {
    t: Vec<[<CudaDevice as Runtime>::Buffer; 4]>,
    copies: Vec<Option<<CudaDevice as Runtime>::Buffer>>,
    codes: Vec<Option<[<CudaDevice as Runtime>::Buffer; 2]>>,
    scale: <CudaDevice as Runtime>::Buffer,
    amax: <CudaDevice as Runtime>::Buffer,
    scalars: <CudaDevice as Runtime>::Buffer,
}

/// Fp8Ops::adamw_clipped_fp8 with its fused kernels (adamw_fp8_<D>, then transpose_codes_many)
/// against the separate ops (adamw_multi, then quantize_fp8_many of the updated weights), both
/// on the GPU: weights, moments, copies, codes, transposed codes and amaxes bit for bit, over
/// five steps (the moments build up) with clipping active. The cases: several chunks and tiles
/// with partial ones (200 × 136), one tile (64 × 64), a wide matrix, every FP8 format, f32,
/// bf16 and f16 gradients, codes without a transposed copy (two chunks; a 35-element tensor
/// that ends in single elements), a weight without codes (a bias), and outputs the kernel does
/// not take (transposed codes with cols not a multiple of 8, a weight with a bf16 working
/// copy), which must run the separate ops inside the same call. The fused kernel must have
/// taken exactly the seven weights it can.
#[test]
fn adamw_clipped_fp8_matches_the_separate_ops() {
    let test = "adamw_clipped_fp8_matches_the_separate_ops";
    let Some(g) = gpu(test) else { return };
    use duet_device::{AdamWClipStep, AdamWFp8Out, AdamWTensor};
    let case = |rows, cols, grad, codes, transposed, copy| AdamWFp8Case {
        rows,
        cols,
        grad,
        codes,
        transposed,
        copy,
    };
    let (bf, e4, e5) = (DType::BF16, Some(DType::F8E4M3), Some(DType::F8E5M2));
    let cases = [
        case(200, 136, bf, e4, true, false),
        case(64, 64, bf, Some(DType::F8E4M3Fnuz), true, false),
        case(1, 100, bf, None, false, false),
        case(48, 20, bf, e4, true, false),
        case(24, 1040, bf, e4, true, false),
        case(32, 64, DType::F32, e4, true, false),
        case(16, 8, bf, e5, true, false),
        case(3, 7000, bf, e4, false, false),
        case(5, 7, DType::F16, Some(DType::F8E5M2Fnuz), false, false),
        case(64, 64, bf, e4, true, true),
    ];
    let slots = 3 * cases.len();
    let setup = || {
        let mut t = Vec::new();
        let mut copies = Vec::new();
        let mut codes = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let n = c.rows * c.cols;
            let seed = 100 + 10 * i as u64;
            let small = |s: u64, k: f32| -> Vec<f32> {
                values(n, s, false)
                    .iter()
                    .map(|x| (x * k).clamp(-1.0, 1.0))
                    .collect()
            };
            let v: Vec<f32> = small(seed + 3, 1e-3).iter().map(|x| x.abs()).collect();
            t.push([
                upload_as(g, &small(seed, 0.5), DType::F32),
                upload_as(g, &small(seed + 1, 1.0), c.grad),
                upload_as(g, &small(seed + 2, 1e-2), DType::F32),
                upload_as(g, &v, DType::F32),
            ]);
            copies.push(c.copy.then(|| g.alloc(DType::BF16, n).unwrap()));
            codes.push(
                c.codes
                    .map(|d| [g.alloc(d, n).unwrap(), g.alloc(d, n).unwrap()]),
            );
        }
        let scale: Vec<f32> = (0..slots).map(|s| 0.5 + 37.0 * (s % 5) as f32).collect();
        let amax: Vec<f32> = (0..slots)
            .map(|s| if s % 2 == 0 { 0.0 } else { 0.3 })
            .collect();
        AdamWFp8Run {
            t,
            copies,
            codes,
            scale: g.upload_new(&scale).unwrap(),
            amax: g.upload_new(&amax).unwrap(),
            scalars: g.upload_new(&[0.0f32; duet_device::ADAMW_SCALARS]).unwrap(),
        }
    };
    let step = AdamWClipStep {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        max_norm: 1.0,
        loss_scale: 1.0,
    };
    let run = |r: &mut AdamWFp8Run, k: u64| {
        let (bc1, bc2) = (1.0 - 0.9f32.powi(k as i32), 1.0 - 0.95f32.powi(k as i32));
        g.upload(&[37.5f32, 3e-3, bc1, bc2], &mut r.scalars, 0)
            .unwrap();
        let mut tensors: Vec<AdamWTensor<'_, _>> =
            r.t.iter_mut()
                .zip(r.copies.iter_mut())
                .enumerate()
                .map(|(i, ([p, gr, m, v], c))| AdamWTensor {
                    param: p,
                    grad: &*gr,
                    m,
                    v,
                    copy: c.as_mut(),
                    weight_decay: if i % 2 == 0 { 0.1 } else { 0.0 },
                })
                .collect();
        let mut outs: Vec<AdamWFp8Out<'_, _>> = r
            .codes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| c.as_mut().map(|c| (i, c)))
            .map(|(i, [d, dt])| AdamWFp8Out {
                tensor: i,
                dst: d,
                dst_t: cases[i].transposed.then_some(dt),
                rows: cases[i].rows,
                cols: cases[i].cols,
                slot: 3 * i + 1,
            })
            .collect();
        g.exec(AdamWClippedFp8 {
            tensors: &mut tensors,
            step: &step,
            scalars: &r.scalars,
            outs: &mut outs,
            scale: &r.scale,
            amax: &mut r.amax,
        })
        .unwrap();
    };
    let bytes = |b: &<CudaDevice as Runtime>::Buffer| g.download_bytes(b, 0, b.len()).unwrap();
    let mut fused = setup();
    let mut separate = setup();
    let before = g.adamw_fp8_fused_count();
    for k in 1..=5u64 {
        CudaDevice::adamw_fp8_fused_on_this_thread(true);
        run(&mut fused, k);
        CudaDevice::adamw_fp8_fused_on_this_thread(false);
        run(&mut separate, k);
        CudaDevice::adamw_fp8_fused_on_this_thread(true);
        for (i, (a, b)) in fused.t.iter().zip(&separate.t).enumerate() {
            for (j, what) in ["param", "grad", "m", "v"].iter().enumerate() {
                assert!(
                    bytes(&a[j]) == bytes(&b[j]),
                    "step {k} case {i}: {what} differs"
                );
            }
        }
        for (i, (a, b)) in fused.copies.iter().zip(&separate.copies).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                assert!(bytes(a) == bytes(b), "step {k} case {i}: copy differs");
            }
        }
        for (i, (a, b)) in fused.codes.iter().zip(&separate.codes).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                assert_eq!(bytes(&a[0]), bytes(&b[0]), "step {k} case {i}: codes");
                if cases[i].transposed {
                    assert_eq!(
                        bytes(&a[1]),
                        bytes(&b[1]),
                        "step {k} case {i}: transposed codes"
                    );
                }
            }
        }
        let (aa, ab): (Vec<f32>, Vec<f32>) = (
            g.download(&fused.amax).unwrap(),
            g.download(&separate.amax).unwrap(),
        );
        assert_eq!(
            aa.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            ab.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "step {k}: amaxes"
        );
    }
    // Cases 0, 1, 4, 5, 6, 7 and 8 each step: the others have no codes, transposed codes with
    // cols not a multiple of 8, or a working copy.
    assert_eq!(
        g.adamw_fp8_fused_count() - before,
        7 * 5,
        "fused kernel use"
    );
    // The codes are the f32 weights' (times the slot's scale), their transpose the transposed
    // codes: decoded on the host.
    let (rows, cols) = (cases[0].rows, cases[0].cols);
    let w: Vec<f32> = g.download_f32(&fused.t[0][0]).unwrap();
    let [codes, codes_t] = fused.codes[0].as_ref().unwrap();
    let (codes, codes_t) = (bytes(codes), bytes(codes_t));
    let fmt = Fp8Format::of(DType::F8E4M3).unwrap();
    let scale = 37.5f32; // slot 1 (case 0's weight): 0.5 + 37 · (1 mod 5)
    for (i, (x, &q)) in w.iter().zip(&codes).enumerate() {
        assert_eq!(q, fmt.encode(x * scale), "{x}");
        let (r, c) = (i / cols, i % cols);
        assert_eq!(codes_t[c * rows + r], q, "transposed ({r}, {c})");
    }
}
