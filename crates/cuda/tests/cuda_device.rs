//! What only the CUDA backend has, on a GPU: NVML telemetry, the device's info and memory
//! counters, the pinned staging ring of uploads, the dtypes its kernels refuse, and GEMM
//! autotuning. Every op itself is checked against the CPU by the conformance suite
//! (crates/conformance, `tests/conformance.rs`), which this file shares its harness with.
//! Without a usable CUDA device every test prints `SKIP <test>: <reason>`.

use duet_conformance::Harness;
use duet_conformance::harness::{Rng, Tensor, Tol, base_seed, compare, get, nan, put, skip};
use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{
    BiasAdd, BiasBackward, DType, DeviceError, DeviceExt, GeluForward, Gemm, GemmDesc,
    GemmEpilogue, GemmOps, Runtime, SumSquares,
};
use half::bf16;
use std::sync::OnceLock;

/// The GPU shared by the tests, or why there is none (printed as a SKIP line).
fn gpu(test: &str) -> Option<&'static CudaDevice> {
    static DEV: OnceLock<Result<CudaDevice, String>> = OnceLock::new();
    match DEV.get_or_init(|| CudaDevice::new(0).map_err(|e| e.to_string())) {
        Ok(d) => Some(d),
        Err(e) => {
            skip(test, &format!("no usable CUDA device: {e}"));
            None
        }
    }
}

/// A device of the test's own (the shared one is used by tests running in parallel, which would
/// disturb memory counters and the deferred-error word).
fn own_gpu(test: &str) -> Option<CudaDevice> {
    gpu(test)?;
    Some(CudaDevice::new(0).expect("a second device on the same GPU"))
}

fn cpu() -> &'static CpuDevice {
    Harness::<CpuDevice>::cpu()
}

fn rng(test: &str) -> Rng {
    Rng::new(base_seed() ^ test.len() as u64 ^ 0x5eed)
}

/// The same data on the CPU and the GPU.
fn both(
    dtype: DType,
    data: &[f32],
    g: &CudaDevice,
) -> (duet_cpu::CpuBuffer, duet_cuda::CudaBuffer) {
    (put(cpu(), dtype, data), put(g, dtype, data))
}

/// GPU result against the CPU's under `tol`.
fn check(
    what: &str,
    c: &duet_cpu::CpuBuffer,
    g: &duet_cuda::CudaBuffer,
    dev: &CudaDevice,
    tol: Tol,
) {
    let want: Tensor = get(cpu(), what, c);
    compare(what, &get(dev, what, g), &want, tol);
}

/// NVML telemetry of the GPU (libnvidia-ml comes with the driver, so a machine that runs CUDA
/// has it): readings in plausible ranges, and the clock rises under load.
#[test]
fn telemetry_reads_the_gpu() {
    let Some(g) = gpu("telemetry_reads_the_gpu") else {
        return;
    };
    let t = g
        .telemetry()
        .expect("NVML telemetry (libnvidia-ml.so.1 ships with the NVIDIA driver)");
    eprintln!("telemetry_reads_the_gpu: idle {t:?}");
    assert!((50..=4000).contains(&t.sm_clock_mhz), "{t:?}");
    assert!(t.power_w > 1.0 && t.power_w < 2000.0, "{t:?}");
    assert!(t.power_limit_w >= 50.0 && t.power_limit_w < 2000.0, "{t:?}");
    assert!((1..=120).contains(&t.temperature_c), "{t:?}");
    // Whether the driver answers the instantaneous power (NVML_FI_DEV_POWER_INSTANT), which the
    // loader prefers over its one-second average: a property of the driver, reported only.
    eprintln!(
        "telemetry_reads_the_gpu: power is {}",
        if t.power_instant {
            "instantaneous"
        } else {
            "the driver's trailing average"
        }
    );
    // Keep the GPU busy for a while (back-to-back 4096² bf16 GEMMs), then read again.
    let n = 4096;
    let a = g.upload_new(&vec![bf16::from_f32(0.01); n * n]).unwrap();
    let mut c = g.alloc(DType::BF16, n * n).unwrap();
    let desc = GemmDesc::new(false, false, n, n, n);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(300) {
        for _ in 0..20 {
            g.exec(Gemm {
                desc: &desc,
                a: &a,
                b: &a,
                c: &mut c,
            })
            .unwrap();
        }
        let busy = g.telemetry().expect("a reading under load");
        if busy.sm_clock_mhz > t.sm_clock_mhz.max(600) {
            eprintln!("telemetry_reads_the_gpu: busy {busy:?}");
            g.synchronize().unwrap();
            return;
        }
    }
    g.synchronize().unwrap();
    let busy = g.telemetry().unwrap();
    assert!(
        busy.sm_clock_mhz >= 600,
        "the SM clock stayed low under load: idle {t:?}, busy {busy:?}"
    );
}

#[test]
fn device_info_and_memory_stats() {
    let Some(g) = own_gpu("device_info_and_memory_stats") else {
        return;
    };
    let g = &g;
    let info = g.info();
    eprintln!(
        "device: {} {} ({} bytes)",
        info.name, info.arch, info.total_memory
    );
    for (k, v) in &info.details {
        eprintln!("  {k}: {v}");
    }
    assert_eq!(info.backend, "cuda");
    assert!(info.arch.starts_with("sm_"), "arch {}", info.arch);
    let cc: u32 = info.arch[3..].parse().unwrap();
    assert_eq!(info.supports_bf16, cc >= 80);
    assert_eq!(info.supports_fp8, cc >= 89);
    assert!(info.total_memory > 0);
    assert!(CudaDevice::is_available());
    let count = CudaDevice::device_count().unwrap();
    assert!(count >= 1);
    match CudaDevice::new(count) {
        Err(DeviceError::Unavailable { reason, .. }) => {
            assert!(reason.contains("requested"), "{reason}")
        }
        other => panic!("ordinal {count} of {count} devices should be unavailable: {other:?}"),
    }

    let before = g.memory_stats();
    let (free, total) = before.driver.expect("driver view");
    assert!(free <= total && total > 0);
    let buf = g.alloc(DType::F32, 1 << 20).unwrap();
    let during = g.memory_stats();
    assert!(during.current >= before.current + (4 << 20));
    assert!(during.peak >= during.current);
    drop(buf);
    g.synchronize().unwrap();
    let after = g.memory_stats();
    assert!(after.current + (4 << 20) <= during.current);
    g.reset_peak_memory();
    assert_eq!(g.memory_stats().peak, g.memory_stats().current);
}

#[test]
fn upload_download_copy_fill() {
    const TEST: &str = "upload_download_copy_fill";
    let Some(g) = gpu(TEST) else {
        return;
    };
    let mut r = rng(TEST);
    // Large enough to cross the 4 MiB staging chunks several times.
    let n = 3 * (1 << 20) + 12345;
    let data = r.vec(n, -5.0, 5.0);
    let mut b = g.alloc(DType::F32, n + 7).unwrap();
    g.upload(&data, &mut b, 7).unwrap();
    let back: Vec<f32> = g.download_range(&b, 7, n).unwrap();
    assert_eq!(back, data, "round trip through pinned staging");
    let head: Vec<f32> = g.download_range(&b, 0, 7).unwrap();
    assert_eq!(head, vec![0.0; 7], "alloc zero-initialises");
    // Many small uploads back to back reuse the staging ring.
    let mut small = g.alloc(DType::I32, 1000).unwrap();
    for i in 0..1000 {
        g.upload(&[i as i32 * 3], &mut small, i).unwrap();
    }
    let s: Vec<i32> = g.download(&small).unwrap();
    assert!(s.iter().enumerate().all(|(i, &x)| x == i as i32 * 3));

    // copy with offsets, against the CPU.
    for dtype in duet_conformance::harness::FLOATS {
        let src = r.vec(1000, -3.0, 3.0);
        let (cs, gs) = both(dtype, &src, g);
        let (mut cd, mut gd) = both(dtype, &r.vec(900, -1.0, 1.0), g);
        cpu().copy(&cs, 13, &mut cd, 101, 777).unwrap();
        g.copy(&gs, 13, &mut gd, 101, 777).unwrap();
        check(&format!("copy {dtype}"), &cd, &gd, g, Tol::Bits);
    }
    // fill, every dtype.
    for (dtype, value) in [
        (DType::F32, -1.25f32),
        (DType::F16, 3.3),
        (DType::BF16, -7.7),
        (DType::I32, -42.0),
        (DType::U8, 200.0),
        (DType::F8E4M3, 1000.0),
        (DType::F8E5M2, -0.3),
        (DType::F8E4M3Fnuz, 0.1),
        (DType::F8E5M2Fnuz, 3.0),
    ] {
        let mut c = cpu().alloc(dtype, 1001).unwrap();
        let mut gb = g.alloc(dtype, 1001).unwrap();
        cpu().fill(&mut c, value).unwrap();
        g.fill(&mut gb, value).unwrap();
        check(&format!("fill {dtype}"), &c, &gb, g, Tol::Bits);
    }
    let mut ib = g.alloc(DType::I32, 4).unwrap();
    assert!(matches!(
        g.fill(&mut ib, 0.5),
        Err(DeviceError::InvalidArgument(_))
    ));
    // Range errors are typed, not panics.
    assert!(matches!(
        g.upload(&[1.0f32; 4], &mut b, n + 5),
        Err(DeviceError::Shape { .. })
    ));
    assert!(g.download_range::<f32>(&b, n, 100).is_err());
}

#[test]
fn unsupported_dtypes_are_typed_errors() {
    let Some(g) = gpu("unsupported_dtypes_are_typed_errors") else {
        return;
    };
    let x8 = g.alloc(DType::F8E4M3, 16).unwrap();
    let mut o8 = g.alloc(DType::F8E4M3, 16).unwrap();
    assert!(matches!(
        g.exec(GeluForward {
            x: &x8,
            out: &mut o8
        }),
        Err(DeviceError::Unsupported { .. })
    ));
    let xi = g.alloc(DType::I32, 16).unwrap();
    let mut o = g.alloc(DType::F32, 16).unwrap();
    assert!(
        g.exec(SumSquares {
            x: &xi,
            out: &mut o,
            slot: 0
        })
        .is_err()
    );
    // Parameters must be the activation dtype or f32.
    let mut x = g.alloc(DType::BF16, 16).unwrap();
    let bias = g.alloc(DType::F16, 4).unwrap();
    assert!(matches!(
        g.exec(BiasAdd {
            x: &mut x,
            bias: &bias,
            rows: 4,
            c: 4
        }),
        Err(DeviceError::Unsupported { .. })
    ));
}

/// GEMM autotuning times the candidates on the real operands: the trial runs must leave no
/// trace (accumulating GEMMs add once, the bias gradient is written once), and the cached
/// choice gives the same results on the next call.
#[test]
fn gemm_autotune_leaves_no_trace() {
    const TEST: &str = "gemm_autotune_leaves_no_trace";
    let test = TEST;
    let Some(dev) = own_gpu(test) else { return };
    let g = &dev;
    use duet_device::Epilogue;
    assert!(g.set_gemm_autotune(true), "CUDA autotunes");
    let mut r = rng(TEST);
    let dt = DType::BF16;
    if !g.capabilities().gemm_epilogue(dt) {
        skip(test, "no bf16 cuBLASLt epilogues on this GPU");
        return;
    }
    let (n, k, m) = (160, 96, 208);
    let (cx, gx) = both(dt, &r.vec(n * k, -1.0, 1.0), g);
    let (cw, gw) = both(dt, &r.vec(m * k, -0.2, 0.2), g);
    let (cdy, gdy) = both(dt, &r.vec(n * m, -1.0, 1.0), g);
    let (cb, gb) = both(dt, &r.vec(m, -0.5, 0.5), g);
    for round in 0..2 {
        // A plain accumulating 16-bit GEMM (routed through cuBLASLt while autotuning).
        let desc = GemmDesc::new(false, true, n, m, k).beta(1.0);
        let init = r.vec(n * m, -1.0, 1.0);
        let (mut cc, mut gc) = both(dt, &init, g);
        cpu()
            .exec(Gemm {
                desc: &desc,
                a: &cx,
                b: &cw,
                c: &mut cc,
            })
            .unwrap();
        g.exec(Gemm {
            desc: &desc,
            a: &gx,
            b: &gw,
            c: &mut gc,
        })
        .unwrap();
        check(
            &format!("round {round}: gemm beta 1"),
            &cc,
            &gc,
            g,
            Tol::rel(2e-2),
        );
        // Bias epilogue accumulating.
        let (mut cc, mut gc) = both(dt, &init, g);
        cpu()
            .exec(Gemm {
                desc: &desc,
                a: &cx,
                b: &cw,
                c: &mut cc,
            })
            .unwrap();
        cpu()
            .exec(BiasAdd {
                x: &mut cc,
                bias: &cb,
                rows: n,
                c: m,
            })
            .unwrap();
        g.exec(GemmEpilogue {
            desc: &desc,
            a: &gx,
            b: &gw,
            c: &mut gc,
            epilogue: Epilogue::Bias(&gb),
        })
        .unwrap();
        check(
            &format!("round {round}: bias beta 1"),
            &cc,
            &gc,
            g,
            Tol::rel(2e-2),
        );
        // Weight gradient accumulated into f32 with the bias gradient.
        let dw0 = r.vec(m * k, -1.0, 1.0);
        let (mut cdw, mut gdw) = both(DType::F32, &dw0, g);
        let (mut cdb, _) = both(DType::F32, &vec![0.0; m], g);
        let mut gdb = nan(g, DType::F32, m);
        let wdesc = GemmDesc::new(true, false, m, k, n).beta(1.0);
        cpu()
            .exec(Gemm {
                desc: &wdesc,
                a: &cdy,
                b: &cx,
                c: &mut cdw,
            })
            .unwrap();
        cpu()
            .exec(BiasBackward {
                dout: &cdy,
                dbias: &mut cdb,
                rows: n,
                c: m,
            })
            .unwrap();
        g.exec(GemmEpilogue {
            desc: &wdesc,
            a: &gdy,
            b: &gx,
            c: &mut gdw,
            epilogue: Epilogue::BiasGradA { dbias: &mut gdb },
        })
        .unwrap();
        check(
            &format!("round {round}: weight gradient"),
            &cdw,
            &gdw,
            g,
            Tol::rel(1e-3),
        );
        check(
            &format!("round {round}: bias gradient"),
            &cdb,
            &gdb,
            g,
            Tol::rel(1e-3),
        );
    }
}
