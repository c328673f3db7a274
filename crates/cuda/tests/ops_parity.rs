//! Every op of the CUDA backend against the CPU reference backend, on fresh random inputs.
//!
//! Each test opens the GPU once (shared) and, when no CUDA device is usable, prints why it
//! skips (`SKIP <test>: ...`) instead of passing silently. Inputs are drawn from a seed that
//! changes every run (set `DUET_TEST_SEED` to replay one; failures print it). Outputs that an
//! op overwrites are poisoned with NaN on the GPU first, so an element the GPU never writes
//! cannot pass.
//!
//! Tolerances compare `|gpu − cpu| ≤ tol · (|cpu| + rms(cpu))` element-wise: f32 1e-5 for
//! element-wise ops and 1e-4 for reductions and GEMMs; bf16 1e-2 (the bf16 ulp is 2⁻⁸); f16
//! 5e-3. Permutations, casts and fills must match bit for bit.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{AdamWStep, Buffer, DType, Device, DeviceError, DeviceExt, Fp8Format, GemmDesc};
use half::{bf16, f16};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

// ---------------------------------------------------------------------- harness

/// Prints a skip notice straight to stderr, past the test harness's output capture, so a
/// skipped test is never a silent pass.
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

fn cpu() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new(None).expect("cpu device"))
}

fn base_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let s = std::env::var("DUET_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("ops_parity: DUET_TEST_SEED={s}");
        s
    })
}

/// splitmix64 random numbers; each call of `rng()` gets its own stream.
struct Rng(u64);

fn rng() -> Rng {
    static N: AtomicU64 = AtomicU64::new(0);
    Rng(base_seed()
        ^ N.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e3779b97f4a7c15))
}

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Host bytes of `data` in `dtype` (rounded on the host, so both devices get the same bits).
fn encode(dtype: DType, data: &[f32]) -> Vec<u8> {
    match dtype {
        DType::F32 => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => data
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        DType::BF16 => data
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        DType::I32 => data
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect(),
        DType::U8 => data.iter().map(|&x| x as u8).collect(),
        fp8 => {
            let f = Fp8Format::of(fp8).unwrap();
            data.iter().map(|&x| f.encode(x)).collect()
        }
    }
}

fn put<D: Device>(dev: &D, dtype: DType, data: &[f32]) -> D::Buffer {
    let mut b = dev.alloc(dtype, data.len()).unwrap();
    dev.upload_bytes(&encode(dtype, data), &mut b, 0).unwrap();
    b
}

/// The same data on both devices.
fn both(
    dtype: DType,
    data: &[f32],
    g: &CudaDevice,
) -> (duet_cpu::CpuBuffer, duet_cuda::CudaBuffer) {
    (put(cpu(), dtype, data), put(g, dtype, data))
}

fn both_i32(data: &[i32], g: &CudaDevice) -> (duet_cpu::CpuBuffer, duet_cuda::CudaBuffer) {
    (cpu().upload_new(data).unwrap(), g.upload_new(data).unwrap())
}

/// An output buffer: zeros on the CPU, NaN on the GPU (so unwritten elements fail).
fn out(dtype: DType, n: usize, g: &CudaDevice) -> (duet_cpu::CpuBuffer, duet_cuda::CudaBuffer) {
    let c = cpu().alloc(dtype, n).unwrap();
    let mut gb = g.alloc(dtype, n).unwrap();
    g.fill(&mut gb, f32::NAN).unwrap();
    (c, gb)
}

fn tol(dtype: DType, f32_tol: f32) -> f32 {
    match dtype {
        DType::F32 => f32_tol,
        DType::F16 => 5e-3,
        _ => 1e-2,
    }
}

fn compare_f32(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let rms = (want.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64)
        .sqrt() as f32;
    let mut worst = (0.0f32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() != w.is_nan() {
            panic!(
                "{what}: element {i} is {g} on the GPU and {w} on the CPU (seed {})",
                base_seed()
            );
        }
        if w.is_nan() || (g.is_infinite() && g == w) {
            continue;
        }
        let err = (g - w).abs() / (w.abs() + rms).max(f32::MIN_POSITIVE);
        if err > worst.0 || err.is_nan() {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    assert!(
        err <= tol,
        "{what}: relative error {err:.3e} > {tol:.1e} at element {i}: gpu {} vs cpu {} (rms {rms:.3e}, seed {})",
        got[i],
        want[i],
        base_seed()
    );
}

fn compare(
    what: &str,
    c: &duet_cpu::CpuBuffer,
    g: &duet_cuda::CudaBuffer,
    dev: &CudaDevice,
    tol: f32,
) {
    assert_eq!(c.dtype(), g.dtype(), "{what}: dtypes differ");
    let want = cpu().download_f32(c).unwrap();
    let got = dev.download_f32(g).unwrap();
    compare_f32(what, &got, &want, tol);
}

fn compare_bits(what: &str, c: &duet_cpu::CpuBuffer, g: &duet_cuda::CudaBuffer, dev: &CudaDevice) {
    let want = cpu().download_bytes(c, 0, c.len()).unwrap();
    let got = dev.download_bytes(g, 0, g.len()).unwrap();
    if want != got {
        let es = c.dtype().size_bytes();
        let i = want.iter().zip(&got).position(|(a, b)| a != b).unwrap() / es;
        panic!(
            "{what}: {} element {i} differs: gpu {:?} vs cpu {:?} (seed {})",
            c.dtype(),
            &got[i * es..(i + 1) * es],
            &want[i * es..(i + 1) * es],
            base_seed()
        );
    }
}

const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
const ACTS: [DType; 2] = [DType::F32, DType::BF16];

// ---------------------------------------------------------------------- device basics

/// A device of the test's own (the shared one is used by tests running in parallel, which would
/// disturb memory counters and the deferred-error word).
fn own_gpu(test: &str) -> Option<CudaDevice> {
    gpu(test)?;
    Some(CudaDevice::new(0).expect("a second device on the same GPU"))
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
            g.gemm(&desc, &a, &a, &mut c).unwrap();
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
    let Some(g) = gpu("upload_download_copy_fill") else {
        return;
    };
    let mut r = rng();
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
    for dtype in FLOATS {
        let src = r.vec(1000, -3.0, 3.0);
        let (cs, gs) = both(dtype, &src, g);
        let (mut cd, mut gd) = both(dtype, &r.vec(900, -1.0, 1.0), g);
        cpu().copy(&cs, 13, &mut cd, 101, 777).unwrap();
        g.copy(&gs, 13, &mut gd, 101, 777).unwrap();
        compare_bits(&format!("copy {dtype}"), &cd, &gd, g);
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
        compare_bits(&format!("fill {dtype}"), &c, &gb, g);
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

// ---------------------------------------------------------------------- GEMM

#[test]
fn gemm_all_transposes_dtypes_strides() {
    let Some(g) = gpu("gemm_all_transposes_dtypes_strides") else {
        return;
    };
    let mut r = rng();
    let combos = [
        (DType::F32, DType::F32, 1e-4),
        (DType::F16, DType::F16, 5e-3),
        (DType::F16, DType::F32, 1e-3),
        (DType::BF16, DType::BF16, 1e-2),
        (DType::BF16, DType::F32, 1e-3),
    ];
    for (ab, cdt, tolerance) in combos {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for &(m, n, k, batch, padded) in &[
                (33usize, 17usize, 29usize, 1usize, false),
                (64, 96, 128, 1, false),
                (7, 5, 3, 3, true),
                (40, 24, 64, 4, true),
            ] {
                let mut d = GemmDesc::batched(ta, tb, m, n, k, batch)
                    .alpha(r.uniform(0.5, 1.5))
                    .beta(if padded { 0.5 } else { 0.0 });
                if padded {
                    d.lda += 3;
                    d.ldb += 1;
                    d.ldc += 2;
                    let (ar, _) = d.a_stored();
                    let (br, _) = d.b_stored();
                    d.stride_a = ar * d.lda + 5;
                    d.stride_b = br * d.ldb + 2;
                    d.stride_c = m * d.ldc + 3;
                    d.a_offset = 11;
                    d.b_offset = 4;
                    d.c_offset = 9;
                }
                let a = r.vec(d.a_offset + batch * d.stride_a, -1.0, 1.0);
                let b = r.vec(d.b_offset + batch * d.stride_b, -1.0, 1.0);
                let c0 = r.vec(d.c_offset + batch * d.stride_c, -1.0, 1.0);
                let (ca, ga) = both(ab, &a, g);
                let (cb, gb) = both(ab, &b, g);
                let (mut cc, mut gc) = both(cdt, &c0, g);
                cpu().gemm(&d, &ca, &cb, &mut cc).unwrap();
                g.gemm(&d, &ga, &gb, &mut gc).unwrap();
                compare(
                    &format!(
                        "gemm {ab}->{cdt} ta={ta} tb={tb} {m}x{n}x{k} batch {batch} padded {padded}"
                    ),
                    &cc,
                    &gc,
                    g,
                    tolerance,
                );
            }
        }
    }
    // Mismatched dtypes and short buffers are errors.
    let d = GemmDesc::new(false, false, 4, 4, 4);
    let a = g.alloc(DType::F32, 16).unwrap();
    let bh = g.alloc(DType::F16, 16).unwrap();
    let mut c = g.alloc(DType::F32, 16).unwrap();
    assert!(g.gemm(&d, &a, &bh, &mut c).is_err());
    let short = g.alloc(DType::F32, 15).unwrap();
    assert!(matches!(
        g.gemm(&d, &a, &short, &mut c),
        Err(DeviceError::Shape { .. })
    ));
}

// ---------------------------------------------------------------------- element-wise and casts

/// Values that exercise every corner of the fp8 and bf16 codecs: saturation, subnormals, ties,
/// signs.
fn cast_inputs(r: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        1.0625,
        -1.0625,
        448.0,
        464.0,
        1e9,
        -1e9,
        57344.0,
        61440.0,
        240.0,
        2f32.powi(-9),
        2f32.powi(-10),
        3.0 * 2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        65504.0,
        70000.0,
        1e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        // bf16 rounding (the hardware conversion on sm_80+ against the CPU's): ties to even
        // down and up, a tie and the largest finite value rounding to infinity, f32
        // subnormals (a tie among them too).
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0xbf81_8000),
        f32::from_bits(0x7f7f_8000),
        f32::MAX,
        -f32::MAX,
        f32::from_bits(0x0000_0001),
        f32::from_bits(0x0000_8000),
        f32::from_bits(0x0001_8000),
        f32::from_bits(0x807f_ffff),
    ];
    while v.len() < n {
        let mag = 2f32.powf(r.uniform(-20.0, 17.0));
        let s = if r.next() & 1 == 0 { 1.0 } else { -1.0 };
        v.push(s * mag);
    }
    v
}

#[test]
fn cast_every_pair_bit_exact() {
    let Some(g) = gpu("cast_every_pair_bit_exact") else {
        return;
    };
    let mut r = rng();
    let all = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
    ];
    let data = cast_inputs(&mut r, 4099);
    for src in all {
        let (cs, gs) = both(src, &data, g);
        for dst in all {
            for scale in [1.0f32, 0.37] {
                let (mut cd, mut gd) = out(dst, data.len(), g);
                cpu().cast(&cs, &mut cd, scale).unwrap();
                g.cast(&gs, &mut gd, scale).unwrap();
                compare_bits(&format!("cast {src}->{dst} scale {scale}"), &cd, &gd, g);
            }
        }
    }
    let ints = g.alloc(DType::I32, 4).unwrap();
    let mut f = g.alloc(DType::F32, 4).unwrap();
    assert!(matches!(
        g.cast(&ints, &mut f, 1.0),
        Err(DeviceError::Unsupported { .. })
    ));
}

#[test]
fn scale_add_add_assign_gelu() {
    let Some(g) = gpu("scale_add_add_assign_gelu") else {
        return;
    };
    let mut r = rng();
    for dtype in FLOATS {
        for n in [1usize, 7, 8, 1000, 65536 + 3] {
            let a = r.vec(n, -4.0, 4.0);
            let b = r.vec(n, -4.0, 4.0);
            let (mut ca, mut ga) = both(dtype, &a, g);
            let (cb, gb) = both(dtype, &b, g);
            let t = tol(dtype, 1e-5);
            cpu().scale(&mut ca, -0.7).unwrap();
            g.scale(&mut ga, -0.7).unwrap();
            compare(&format!("scale {dtype} n={n}"), &ca, &ga, g, t);

            let (mut co, mut go) = out(dtype, n, g);
            cpu().add(&ca, &cb, &mut co).unwrap();
            g.add(&ga, &gb, &mut go).unwrap();
            compare(&format!("add {dtype} n={n}"), &co, &go, g, t);

            for src_dtype in FLOATS {
                let (cs, gs) = both(src_dtype, &b, g);
                let (mut cd, mut gd) = both(dtype, &a, g);
                cpu().add_assign(&mut cd, &cs).unwrap();
                g.add_assign(&mut gd, &gs).unwrap();
                compare(
                    &format!("add_assign {dtype} += {src_dtype} n={n}"),
                    &cd,
                    &gd,
                    g,
                    t,
                );
            }

            let (mut cg, mut gg) = out(dtype, n, g);
            cpu().gelu_forward(&ca, &mut cg).unwrap();
            g.gelu_forward(&ga, &mut gg).unwrap();
            compare(
                &format!("gelu_forward {dtype} n={n}"),
                &cg,
                &gg,
                g,
                tol(dtype, 2e-5),
            );

            let (mut cdx, mut gdx) = out(dtype, n, g);
            cpu().gelu_backward(&ca, &cb, &mut cdx).unwrap();
            g.gelu_backward(&ga, &gb, &mut gdx).unwrap();
            compare(
                &format!("gelu_backward {dtype} n={n}"),
                &cdx,
                &gdx,
                g,
                tol(dtype, 2e-5),
            );
        }
    }
    let a = g.alloc(DType::F32, 8).unwrap();
    let b = g.alloc(DType::BF16, 8).unwrap();
    let mut o = g.alloc(DType::F32, 8).unwrap();
    assert!(matches!(
        g.add(&a, &b, &mut o),
        Err(DeviceError::DTypeMismatch { .. })
    ));
    let short = g.alloc(DType::F32, 7).unwrap();
    assert!(matches!(
        g.add(&a, &short, &mut o),
        Err(DeviceError::Shape { .. })
    ));
}

#[test]
fn bias_add_and_backward() {
    let Some(g) = gpu("bias_add_and_backward") else {
        return;
    };
    let mut r = rng();
    for act in FLOATS {
        for pdt in [act, DType::F32] {
            for &(rows, c) in &[
                (1usize, 1usize),
                (37, 13),
                (256, 768),
                (1000, 96),
                (8192, 64),
            ] {
                let x = r.vec(rows * c, -2.0, 2.0);
                let bias = r.vec(c, -1.0, 1.0);
                let (mut cx, mut gx) = both(act, &x, g);
                let (cb, gb) = both(pdt, &bias, g);
                cpu().bias_add(&mut cx, &cb, rows, c).unwrap();
                g.bias_add(&mut gx, &gb, rows, c).unwrap();
                compare(
                    &format!("bias_add {act}+{pdt} {rows}x{c}"),
                    &cx,
                    &gx,
                    g,
                    tol(act, 1e-5),
                );

                let d0 = r.vec(c, -1.0, 1.0);
                let (mut cdb, mut gdb) = both(pdt, &d0, g);
                cpu().bias_backward(&cx, &mut cdb, rows, c).unwrap();
                g.bias_backward(&gx, &mut gdb, rows, c).unwrap();
                compare(
                    &format!("bias_backward {act}->{pdt} {rows}x{c}"),
                    &cdb,
                    &gdb,
                    g,
                    tol(pdt, 1e-4),
                );
                let (_, mut gdb2) = both(pdt, &d0, g);
                g.bias_backward(&gx, &mut gdb2, rows, c).unwrap();
                assert_eq!(
                    g.download_bytes(&gdb, 0, c).unwrap(),
                    g.download_bytes(&gdb2, 0, c).unwrap(),
                    "bias_backward {act}->{pdt} {rows}x{c}: not deterministic"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------- model kernels

#[test]
fn embedding_forward_backward() {
    let Some(g) = gpu("embedding_forward_backward") else {
        return;
    };
    let mut r = rng();
    for act in ACTS {
        for pdt in [act, DType::F32] {
            for &(b, t, c, vocab, max_t) in &[
                (2usize, 5usize, 3usize, 7usize, 8usize),
                (4, 64, 128, 96, 64),
                (8, 256, 96, 96, 300),
                (3, 33, 40, 1000, 40),
            ] {
                // Few distinct tokens, so many positions share a row of dwte.
                let distinct = 1 + r.below(vocab.min(12));
                let toks: Vec<i32> = (0..b * t)
                    .map(|_| r.below(distinct) as i32 * (vocab / distinct) as i32)
                    .collect();
                let (ct, gt) = both_i32(&toks, g);
                let (cwte, gwte) = both(pdt, &r.vec(vocab * c, -1.0, 1.0), g);
                let (cwpe, gwpe) = both(pdt, &r.vec(max_t * c, -1.0, 1.0), g);
                let (mut co, mut go) = out(act, b * t * c, g);
                cpu()
                    .embedding_forward(&ct, &cwte, &cwpe, &mut co, b, t, c)
                    .unwrap();
                g.embedding_forward(&gt, &gwte, &gwpe, &mut go, b, t, c)
                    .unwrap();
                let what = format!("embedding {act}/{pdt} b{b} t{t} c{c} v{vocab}");
                compare(&format!("{what} forward"), &co, &go, g, tol(act, 1e-5));

                let dout = r.vec(b * t * c, -1.0, 1.0);
                let (cd, gd) = both(act, &dout, g);
                let wte0 = r.vec(vocab * c, -0.1, 0.1);
                let wpe0 = r.vec(max_t * c, -0.1, 0.1);
                let (mut cdw, mut gdw) = both(pdt, &wte0, g);
                let (mut cdp, mut gdp) = both(pdt, &wpe0, g);
                cpu()
                    .embedding_backward(&ct, &cd, &mut cdw, &mut cdp, b, t, c)
                    .unwrap();
                g.embedding_backward(&gt, &gd, &mut gdw, &mut gdp, b, t, c)
                    .unwrap();
                compare(&format!("{what} dwte"), &cdw, &gdw, g, tol(pdt, 1e-4));
                compare(&format!("{what} dwpe"), &cdp, &gdp, g, tol(pdt, 1e-4));

                // Deterministic: the same call again from the same start gives the same bits.
                let (_, mut gdw2) = both(pdt, &wte0, g);
                let (_, mut gdp2) = both(pdt, &wpe0, g);
                g.embedding_backward(&gt, &gd, &mut gdw2, &mut gdp2, b, t, c)
                    .unwrap();
                assert_eq!(
                    g.download_bytes(&gdw, 0, gdw.len()).unwrap(),
                    g.download_bytes(&gdw2, 0, gdw2.len()).unwrap(),
                    "{what}: dwte not deterministic"
                );
                assert_eq!(
                    g.download_bytes(&gdp, 0, gdp.len()).unwrap(),
                    g.download_bytes(&gdp2, 0, gdp2.len()).unwrap(),
                    "{what}: dwpe not deterministic"
                );
            }
        }
    }
}

#[test]
fn embedding_bad_token_is_reported() {
    let Some(g) = own_gpu("embedding_bad_token_is_reported") else {
        return;
    };
    let g = &g;
    let toks = g.upload_new(&[0i32, 1, 9, 2]).unwrap();
    let wte = g.alloc(DType::F32, 4 * 8).unwrap();
    let wpe = g.alloc(DType::F32, 4 * 8).unwrap();
    let mut o = g.alloc(DType::F32, 4 * 8).unwrap();
    g.embedding_forward(&toks, &wte, &wpe, &mut o, 1, 4, 8)
        .unwrap();
    match g.synchronize() {
        Err(DeviceError::InvalidArgument(msg)) => assert!(msg.contains("token"), "{msg}"),
        other => panic!("expected a deferred InvalidArgument, got {other:?}"),
    }
    // Reported once, then cleared.
    g.synchronize().unwrap();
    // Cross-entropy targets beyond the vocabulary too.
    let logits = g.alloc(DType::F32, 2 * 5).unwrap();
    let targets = g.upload_new(&[1i32, 5]).unwrap();
    let mut losses = g.alloc(DType::F32, 2).unwrap();
    g.cross_entropy(&logits, &targets, &mut losses, None, 2, 5, 1.0)
        .unwrap();
    assert!(matches!(
        g.synchronize(),
        Err(DeviceError::InvalidArgument(_))
    ));
    g.synchronize().unwrap();
}

#[test]
fn layernorm_forward_backward() {
    let Some(g) = gpu("layernorm_forward_backward") else {
        return;
    };
    let mut r = rng();
    for act in ACTS {
        for pdt in [act, DType::F32] {
            for &(n, c) in &[(1usize, 1usize), (5, 3), (67, 768), (1024, 96), (300, 1000)] {
                let what = format!("layernorm {act}/{pdt} {n}x{c}");
                let x: Vec<f32> = {
                    // Rows with different offsets and scales.
                    let mut v = Vec::with_capacity(n * c);
                    for _ in 0..n {
                        let (off, sc) = (r.uniform(-3.0, 3.0), r.uniform(0.1, 4.0));
                        v.extend((0..c).map(|_| off + sc * r.uniform(-1.0, 1.0)));
                    }
                    v
                };
                let (cx, gx) = both(act, &x, g);
                let (cg, gg) = both(pdt, &r.vec(c, 0.5, 1.5), g);
                let (cb, gb) = both(pdt, &r.vec(c, -0.5, 0.5), g);
                let (mut co, mut go) = out(act, n * c, g);
                let (mut cm, mut gm) = out(DType::F32, n, g);
                let (mut cr, mut gr) = out(DType::F32, n, g);
                cpu()
                    .layernorm_forward(&cx, &cg, &cb, &mut co, &mut cm, &mut cr, n, c, 1e-5)
                    .unwrap();
                g.layernorm_forward(&gx, &gg, &gb, &mut go, &mut gm, &mut gr, n, c, 1e-5)
                    .unwrap();
                compare(&format!("{what} out"), &co, &go, g, tol(act, 1e-4));
                compare(&format!("{what} mean"), &cm, &gm, g, 1e-5);
                compare(&format!("{what} rstd"), &cr, &gr, g, 1e-4);

                let dout = r.vec(n * c, -1.0, 1.0);
                let (cd, gd) = both(act, &dout, g);
                let dx0 = r.vec(n * c, -0.5, 0.5);
                let (mut cdx, mut gdx) = both(act, &dx0, g);
                let dg0 = r.vec(c, -0.5, 0.5);
                let db0 = r.vec(c, -0.5, 0.5);
                let (mut cdg, mut gdg) = both(pdt, &dg0, g);
                let (mut cdb, mut gdb) = both(pdt, &db0, g);
                cpu()
                    .layernorm_backward(&cd, &cx, &cg, &cm, &cr, &mut cdx, &mut cdg, &mut cdb, n, c)
                    .unwrap();
                // The GPU uses its own saved statistics, as the engine does.
                g.layernorm_backward(&gd, &gx, &gg, &gm, &gr, &mut gdx, &mut gdg, &mut gdb, n, c)
                    .unwrap();
                compare(&format!("{what} dx"), &cdx, &gdx, g, tol(act, 2e-4));
                compare(&format!("{what} dgamma"), &cdg, &gdg, g, tol(pdt, 2e-4));
                compare(&format!("{what} dbeta"), &cdb, &gdb, g, tol(pdt, 1e-4));

                // dgamma/dbeta are deterministic.
                let (_, mut gdx2) = both(act, &dx0, g);
                let (_, mut gdg2) = both(pdt, &dg0, g);
                let (_, mut gdb2) = both(pdt, &db0, g);
                g.layernorm_backward(
                    &gd, &gx, &gg, &gm, &gr, &mut gdx2, &mut gdg2, &mut gdb2, n, c,
                )
                .unwrap();
                for (a, b, name) in [
                    (&gdg, &gdg2, "dgamma"),
                    (&gdb, &gdb2, "dbeta"),
                    (&gdx, &gdx2, "dx"),
                ] {
                    assert_eq!(
                        g.download_bytes(a, 0, a.len()).unwrap(),
                        g.download_bytes(b, 0, b.len()).unwrap(),
                        "{what}: {name} not deterministic"
                    );
                }
            }
        }
    }
}

#[test]
fn attention_head_permutations_exact() {
    let Some(g) = gpu("attention_head_permutations_exact") else {
        return;
    };
    let mut r = rng();
    for dtype in FLOATS {
        for &(b, t, nh, hs) in &[
            (1usize, 1usize, 1usize, 1usize),
            (2, 5, 3, 7),
            (4, 64, 12, 64),
            (2, 33, 4, 8),
        ] {
            let n = b * t * nh * hs;
            let what = format!("{dtype} b{b} t{t} nh{nh} hs{hs}");
            let (cqkv, gqkv) = both(dtype, &r.vec(3 * n, -2.0, 2.0), g);
            let (mut cq, mut gq) = out(dtype, n, g);
            let (mut ck, mut gk) = out(dtype, n, g);
            let (mut cv, mut gv) = out(dtype, n, g);
            cpu()
                .split_heads(&cqkv, &mut cq, &mut ck, &mut cv, b, t, nh, hs)
                .unwrap();
            g.split_heads(&gqkv, &mut gq, &mut gk, &mut gv, b, t, nh, hs)
                .unwrap();
            compare_bits(&format!("split_heads q {what}"), &cq, &gq, g);
            compare_bits(&format!("split_heads k {what}"), &ck, &gk, g);
            compare_bits(&format!("split_heads v {what}"), &cv, &gv, g);

            let (cdq, gdq) = both(dtype, &r.vec(n, -1.0, 1.0), g);
            let (cdk, gdk) = both(dtype, &r.vec(n, -1.0, 1.0), g);
            let (cdv, gdv) = both(dtype, &r.vec(n, -1.0, 1.0), g);
            let (mut cdqkv, mut gdqkv) = out(dtype, 3 * n, g);
            cpu()
                .split_heads_backward(&cdq, &cdk, &cdv, &mut cdqkv, b, t, nh, hs)
                .unwrap();
            g.split_heads_backward(&gdq, &gdk, &gdv, &mut gdqkv, b, t, nh, hs)
                .unwrap();
            compare_bits(&format!("split_heads_backward {what}"), &cdqkv, &gdqkv, g);

            for backward in [false, true] {
                let (cy, gy) = both(dtype, &r.vec(n, -1.0, 1.0), g);
                let (mut co, mut go) = out(dtype, n, g);
                cpu()
                    .merge_heads(&cy, &mut co, b, t, nh, hs, backward)
                    .unwrap();
                g.merge_heads(&gy, &mut go, b, t, nh, hs, backward).unwrap();
                compare_bits(
                    &format!("merge_heads backward={backward} {what}"),
                    &co,
                    &go,
                    g,
                );
            }
        }
    }
}

#[test]
fn softmax_causal_forward_backward() {
    let Some(g) = gpu("softmax_causal_forward_backward") else {
        return;
    };
    let mut r = rng();
    for dtype in FLOATS {
        for &(rows, t) in &[(1usize, 1usize), (3, 5), (24, 64), (4, 256), (2, 1030)] {
            let scale = 1.0 / (64f32).sqrt();
            let what = format!("softmax {dtype} rows{rows} t{t}");
            let (cs, gs) = both(dtype, &r.vec(rows * t * t, -8.0, 8.0), g);
            let (mut cp, mut gp) = out(dtype, rows * t * t, g);
            cpu()
                .softmax_causal_forward(&cs, &mut cp, rows, t, scale)
                .unwrap();
            g.softmax_causal_forward(&gs, &mut gp, rows, t, scale)
                .unwrap();
            compare(&format!("{what} forward"), &cp, &gp, g, tol(dtype, 1e-5));

            let (cdp, gdp) = both(dtype, &r.vec(rows * t * t, -1.0, 1.0), g);
            let (mut cds, mut gds) = out(dtype, rows * t * t, g);
            // Both backward passes read the CPU's probabilities, so only the backward differs.
            let gp_same = put(g, dtype, &cpu().download_f32(&cp).unwrap());
            cpu()
                .softmax_causal_backward(&cp, &cdp, &mut cds, rows, t, scale)
                .unwrap();
            g.softmax_causal_backward(&gp_same, &gdp, &mut gds, rows, t, scale)
                .unwrap();
            compare(&format!("{what} backward"), &cds, &gds, g, tol(dtype, 1e-4));
        }
    }
}

#[test]
fn cross_entropy_losses_and_gradients() {
    let Some(g) = gpu("cross_entropy_losses_and_gradients") else {
        return;
    };
    let mut r = rng();
    for dtype in FLOATS {
        for &(n, v) in &[(1usize, 1usize), (7, 96), (512, 96), (33, 1000), (4, 50257)] {
            let what = format!("cross_entropy {dtype} n{n} v{v}");
            let (cl, gl) = both(dtype, &r.vec(n * v, -6.0, 6.0), g);
            let targets: Vec<i32> = (0..n)
                .map(|i| if i % 5 == 3 { -1 } else { r.below(v) as i32 })
                .collect();
            let (ct, gt) = both_i32(&targets, g);
            for with_grad in [false, true] {
                let (mut closs, mut gloss) = out(DType::F32, n, g);
                let gs = r.uniform(0.1, 2.0);
                if with_grad {
                    let (mut cd, mut gd) = out(dtype, n * v, g);
                    cpu()
                        .cross_entropy(&cl, &ct, &mut closs, Some(&mut cd), n, v, gs)
                        .unwrap();
                    g.cross_entropy(&gl, &gt, &mut gloss, Some(&mut gd), n, v, gs)
                        .unwrap();
                    compare(&format!("{what} dlogits"), &cd, &gd, g, tol(dtype, 1e-5));
                } else {
                    cpu()
                        .cross_entropy(&cl, &ct, &mut closs, None, n, v, gs)
                        .unwrap();
                    g.cross_entropy(&gl, &gt, &mut gloss, None, n, v, gs)
                        .unwrap();
                }
                compare(
                    &format!("{what} losses (grad {with_grad})"),
                    &closs,
                    &gloss,
                    g,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn adamw_all_grad_and_copy_dtypes() {
    let Some(g) = gpu("adamw_all_grad_and_copy_dtypes") else {
        return;
    };
    let mut r = rng();
    let n = 100_003;
    let copies = [
        None,
        Some(DType::F32),
        Some(DType::BF16),
        Some(DType::F16),
        Some(DType::F8E4M3),
        Some(DType::F8E5M2),
    ];
    for gdt in FLOATS {
        for copy in copies {
            let what = format!("adamw grad {gdt} copy {copy:?}");
            let (mut cp, mut gp) = both(DType::F32, &r.vec(n, -1.0, 1.0), g);
            let (cgr, ggr) = both(gdt, &r.vec(n, -0.1, 0.1), g);
            let (mut cm, mut gm) = both(DType::F32, &r.vec(n, -0.01, 0.01), g);
            let (mut cv, mut gv) = both(DType::F32, &r.vec(n, 0.0, 0.001), g);
            for t in 1..=3u64 {
                let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, t);
                let step = AdamWStep {
                    lr: 3e-4,
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.1,
                    bias_correction1: bc1,
                    bias_correction2: bc2,
                    grad_scale: 0.5,
                };
                match copy {
                    None => {
                        cpu()
                            .adamw(&mut cp, &cgr, &mut cm, &mut cv, &step, None)
                            .unwrap();
                        g.adamw(&mut gp, &ggr, &mut gm, &mut gv, &step, None)
                            .unwrap();
                    }
                    Some(cdt) => {
                        let (mut cc, mut gc) = out(cdt, n, g);
                        cpu()
                            .adamw(&mut cp, &cgr, &mut cm, &mut cv, &step, Some(&mut cc))
                            .unwrap();
                        g.adamw(&mut gp, &ggr, &mut gm, &mut gv, &step, Some(&mut gc))
                            .unwrap();
                        // The copy is the rounded new parameter: compare it with the GPU's own
                        // parameters rounded on the host (the rounding must be exact), and with
                        // the CPU's within the f32 tolerance scaled to the copy's precision.
                        let gpu_params = g.download_f32(&gp).unwrap();
                        let expect = put(cpu(), cdt, &gpu_params);
                        let got = g.download_bytes(&gc, 0, n).unwrap();
                        assert_eq!(
                            cpu().download_bytes(&expect, 0, n).unwrap(),
                            got,
                            "{what}: param_copy is not the rounded parameter"
                        );
                        if !cdt.is_fp8() {
                            compare(
                                &format!("{what} copy step {t}"),
                                &cc,
                                &gc,
                                g,
                                tol(cdt, 1e-5),
                            );
                        }
                    }
                }
                compare(&format!("{what} param step {t}"), &cp, &gp, g, 1e-5);
                compare(&format!("{what} m step {t}"), &cm, &gm, g, 1e-5);
                compare(&format!("{what} v step {t}"), &cv, &gv, g, 1e-5);
            }
        }
    }
    let mut p16 = g.alloc(DType::BF16, 4).unwrap();
    let gr = g.alloc(DType::F32, 4).unwrap();
    let mut m = g.alloc(DType::F32, 4).unwrap();
    let mut v = g.alloc(DType::F32, 4).unwrap();
    let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, 1);
    let step = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        bias_correction1: bc1,
        bias_correction2: bc2,
        grad_scale: 1.0,
    };
    assert!(matches!(
        g.adamw(&mut p16, &gr, &mut m, &mut v, &step, None),
        Err(DeviceError::DTypeMismatch { .. })
    ));
}

#[test]
fn sum_squares_matches_and_is_deterministic() {
    let Some(g) = gpu("sum_squares_matches_and_is_deterministic") else {
        return;
    };
    let mut r = rng();
    for dtype in FLOATS {
        for n in [1usize, 3, 4096, 100_000, 5_000_017] {
            let what = format!("sum_squares {dtype} n{n}");
            let (cx, gx) = both(dtype, &r.vec(n, -2.0, 2.0), g);
            let init = [0.5f32, -1.0, 2.0];
            let (mut co, mut go) = both(DType::F32, &init, g);
            for slot in [0usize, 2] {
                cpu().sum_squares(&cx, &mut co, slot).unwrap();
                g.sum_squares(&gx, &mut go, slot).unwrap();
            }
            compare(&what, &co, &go, g, 1e-5);
            let (_, mut go2) = both(DType::F32, &init, g);
            for slot in [0usize, 2] {
                g.sum_squares(&gx, &mut go2, slot).unwrap();
            }
            assert_eq!(
                g.download::<f32>(&go).unwrap(),
                g.download::<f32>(&go2).unwrap(),
                "{what}: not deterministic"
            );
        }
    }
    let x = g.alloc(DType::F32, 4).unwrap();
    let mut o = g.alloc(DType::F32, 2).unwrap();
    assert!(matches!(
        g.sum_squares(&x, &mut o, 2),
        Err(DeviceError::Shape { .. })
    ));
}

#[test]
fn unsupported_dtypes_are_typed_errors() {
    let Some(g) = gpu("unsupported_dtypes_are_typed_errors") else {
        return;
    };
    let x8 = g.alloc(DType::F8E4M3, 16).unwrap();
    let mut o8 = g.alloc(DType::F8E4M3, 16).unwrap();
    assert!(matches!(
        g.gelu_forward(&x8, &mut o8),
        Err(DeviceError::Unsupported { .. })
    ));
    let xi = g.alloc(DType::I32, 16).unwrap();
    let mut o = g.alloc(DType::F32, 16).unwrap();
    assert!(g.sum_squares(&xi, &mut o, 0).is_err());
    // Parameters must be the activation dtype or f32.
    let mut x = g.alloc(DType::BF16, 16).unwrap();
    let bias = g.alloc(DType::F16, 4).unwrap();
    assert!(matches!(
        g.bias_add(&mut x, &bias, 4, 4),
        Err(DeviceError::Unsupported { .. })
    ));
}

/// The multi-tensor pair (sum_squares_many, adamw_clipped) against the CPU backend (whose
/// defaults loop over the single-tensor ops): every gradient dtype with every kind of copy, on
/// tensors of lengths that are and are not multiples of 4 and 8 and that span several chunks,
/// clipping active and inactive, a loss scale. Two checks are bit for bit: the sum of squares
/// against a host model of the kernels' fixed reduction order, and adamw_clipped against the
/// GPU's own single-tensor `adamw` called per tensor (what the trait's default does).
#[test]
fn multi_tensor_adamw_clipped() {
    let Some(g) = gpu("multi_tensor_adamw_clipped") else {
        return;
    };
    use duet_device::AdamWClipStep;
    let mut r = rng();
    let sizes = [
        3usize, 70_000, 1, 200_001, 4096, 7, 16_385, 100_003, 5, 16_384, 32_771, 2, 8_191, 65_537,
        12,
    ];
    let copies = [
        None,
        Some(DType::BF16),
        Some(DType::F16),
        Some(DType::F8E4M3),
        Some(DType::F32),
    ];
    // Tensor i: grad dtype FLOATS[i / 5], copy copies[i % 5].
    let kinds: Vec<(DType, Option<DType>)> = FLOATS
        .iter()
        .flat_map(|&gdt| copies.iter().map(move |&c| (gdt, c)))
        .collect();
    assert_eq!(kinds.len(), sizes.len());
    for (max_norm, loss_scale) in [(1.0f32, 1.0f32), (1e6, 1.0), (0.5, 1024.0), (0.0, 1.0)] {
        let what = format!("max_norm {max_norm} loss_scale {loss_scale}");
        let mut c_side = Vec::new();
        let mut g_side = Vec::new();
        // The same start on the GPU, updated by the single-tensor op.
        let mut h_side = Vec::new();
        for (&n, &(gdt, copy)) in sizes.iter().zip(&kinds) {
            let three = |dtype: DType, data: Vec<f32>| {
                let (c, gb) = both(dtype, &data, g);
                (c, gb, put(g, dtype, &data))
            };
            let (cp, gp, hp) = three(DType::F32, r.vec(n, -1.0, 1.0));
            let (cg, gg, hg) = three(gdt, r.vec(n, -0.5, 0.5));
            let (cm, gm, hm) = three(DType::F32, r.vec(n, -0.01, 0.01));
            let (cv, gv, hv) = three(DType::F32, r.vec(n, 0.0, 0.001));
            let (cc, gc, hc) = match copy {
                Some(d) => {
                    let (a, b) = out(d, n, g);
                    let mut h = g.alloc(d, n).unwrap();
                    g.fill(&mut h, f32::NAN).unwrap();
                    (Some(a), Some(b), Some(h))
                }
                None => (None, None, None),
            };
            c_side.push((cp, cg, cm, cv, cc));
            g_side.push((gp, gg, gm, gv, gc));
            h_side.push((hp, hg, hm, hv, hc));
        }
        let (mut cn, mut gn) = both(DType::F32, &[0.0; duet_device::ADAMW_SCALARS], g);
        let crefs: Vec<&_> = c_side.iter().map(|t| &t.1).collect();
        cpu().sum_squares_many(&crefs, &mut cn, 0).unwrap();
        let grefs: Vec<&_> = g_side.iter().map(|t| &t.1).collect();
        g.sum_squares_many(&grefs, &mut gn, 0).unwrap();
        compare(&format!("{what} norm"), &cn, &gn, g, 1e-5);
        let grads: Vec<Vec<f32>> = g_side
            .iter()
            .map(|t| g.download_f32(&t.1).unwrap())
            .collect();
        let norm_sq = g.download::<f32>(&gn).unwrap()[0];
        let model = sum_squares_many_model(&grads, 0.0);
        assert_eq!(
            norm_sq.to_bits(),
            model.to_bits(),
            "{what}: sum_squares_many gives {norm_sq}, its reduction order gives {model} (seed {})",
            base_seed()
        );
        for t in 1..=2u64 {
            let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, t);
            let step = AdamWClipStep {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                max_norm,
                loss_scale,
            };
            cpu().upload(&[1e-3, bc1, bc2], &mut cn, 1).unwrap();
            g.upload(&[1e-3, bc1, bc2], &mut gn, 1).unwrap();
            cpu()
                .adamw_clipped(&mut tensors(&mut c_side), &step, &cn)
                .unwrap();
            g.adamw_clipped(&mut tensors(&mut g_side), &step, &gn)
                .unwrap();
            let grad_scale = duet_device::clip_grad_scale(norm_sq, max_norm, loss_scale);
            for ht in tensors(&mut h_side) {
                let s = AdamWStep {
                    lr: 1e-3,
                    beta1: step.beta1,
                    beta2: step.beta2,
                    eps: step.eps,
                    weight_decay: ht.weight_decay,
                    bias_correction1: bc1,
                    bias_correction2: bc2,
                    grad_scale,
                };
                g.adamw(ht.param, ht.grad, ht.m, ht.v, &s, ht.copy).unwrap();
            }
            for (i, ((c, gg), h)) in c_side.iter().zip(&g_side).zip(&h_side).enumerate() {
                let w = format!(
                    "{what} tensor {i} ({:?}, n {}) step {t}",
                    kinds[i], sizes[i]
                );
                compare(&format!("{w} param"), &c.0, &gg.0, g, 1e-5);
                compare(&format!("{w} m"), &c.2, &gg.2, g, 1e-5);
                compare(&format!("{w} v"), &c.3, &gg.3, g, 1e-5);
                if let (Some(cc), Some(gc)) = (&c.4, &gg.4) {
                    let gpu_params = g.download_f32(&gg.0).unwrap();
                    let expect = put(cpu(), cc.dtype(), &gpu_params);
                    assert_eq!(
                        cpu().download_bytes(&expect, 0, cc.len()).unwrap(),
                        g.download_bytes(gc, 0, gc.len()).unwrap(),
                        "{w}: the copy is not the rounded parameter"
                    );
                }
                let pairs = [(&gg.0, &h.0), (&gg.2, &h.2), (&gg.3, &h.3)];
                let copy = gg.4.as_ref().zip(h.4.as_ref());
                for (k, (a, b)) in pairs.into_iter().chain(copy).enumerate() {
                    assert!(
                        g.download_bytes(a, 0, a.len()).unwrap()
                            == g.download_bytes(b, 0, b.len()).unwrap(),
                        "{w}: adamw_clipped and per-tensor adamw differ in {} (seed {})",
                        ["param", "m", "v", "copy"][k],
                        base_seed()
                    );
                }
            }
        }
    }
}

/// The CUDA backend's sum_squares_many reduction replayed on the host, operation for operation:
/// chunks of 16384 elements per tensor; in each, thread t of 256 adds x² of elements t, t + 256,
/// ... by f64 FMAs; the block adds its 256 sums by warp butterflies, then the 8 warp sums by
/// another; sum_squares_finish adds the chunk sums the same way (thread t: chunks t, t + 256, ...)
/// and rounds `init + sum` to f32 once.
fn sum_squares_many_model(xs: &[Vec<f32>], init: f32) -> f32 {
    const CHUNK: usize = 1 << 14;
    const THREADS: usize = 256;
    fn butterfly(v: &mut [f64]) {
        for o in [16, 8, 4, 2, 1] {
            let prev = v.to_vec();
            for (l, x) in v.iter_mut().enumerate() {
                *x = prev[l] + prev[l ^ o];
            }
        }
    }
    fn block_sum(mut acc: Vec<f64>) -> f64 {
        for warp in acc.chunks_mut(32) {
            butterfly(warp);
        }
        let mut lanes = vec![0.0f64; 32];
        for (w, lane) in lanes.iter_mut().take(THREADS / 32).enumerate() {
            *lane = acc[w * 32];
        }
        butterfly(&mut lanes);
        lanes[0]
    }
    let mut partials = Vec::new();
    for x in xs {
        for chunk in x.chunks(CHUNK) {
            let mut acc = vec![0.0f64; THREADS];
            for (j, &e) in chunk.iter().enumerate() {
                let v = e as f64;
                acc[j % THREADS] = v.mul_add(v, acc[j % THREADS]);
            }
            partials.push(block_sum(acc));
        }
    }
    let mut acc = vec![0.0f64; THREADS];
    for (i, &p) in partials.iter().enumerate() {
        acc[i % THREADS] += p;
    }
    (init as f64 + block_sum(acc)) as f32
}

type Side<B> = Vec<(B, B, B, B, Option<B>)>;

/// AdamW tensors over (param, grad, m, v, copy) tuples; weight decay on every other one.
fn tensors<B>(side: &mut Side<B>) -> Vec<duet_device::AdamWTensor<'_, B>> {
    side.iter_mut()
        .enumerate()
        .map(|(i, (p, gr, m, v, c))| duet_device::AdamWTensor {
            param: p,
            grad: &*gr,
            m,
            v,
            copy: c.as_mut(),
            weight_decay: if i % 2 == 0 { 0.1 } else { 0.0 },
        })
        .collect()
}

/// GEMMs with fused epilogues against the CPU's unfused sequence (gemm, bias_add, gelu),
/// in bf16 and f16, with f32 and 16-bit biases, plain and accumulating (beta 1) bias GEMMs.
#[test]
fn gemm_epilogues_match_the_unfused_ops() {
    let Some(g) = gpu("gemm_epilogues_match_the_unfused_ops") else {
        return;
    };
    use duet_device::Epilogue;
    let mut r = rng();
    for dt in [DType::BF16, DType::F16] {
        if !g.supports_gemm_epilogue(dt) {
            skip!("SKIP gemm_epilogues_match_the_unfused_ops: no {dt} epilogues on this GPU");
            continue;
        }
        let t = if dt == DType::BF16 { 2e-2 } else { 1e-2 };
        // x (n × k) · Wᵀ (W m × k), the linear layers' layout; and dy (n × m) · W (m × k).
        let (n, k, m) = (96, 64, 136);
        let (cx, gx) = both(dt, &r.vec(n * k, -1.0, 1.0), g);
        let (cw, gw) = both(dt, &r.vec(m * k, -0.2, 0.2), g);
        for bias_dt in [DType::F32, dt] {
            let what = format!("{dt} bias {bias_dt}");
            let (cb, gb) = both(bias_dt, &r.vec(m, -0.5, 0.5), g);
            // Bias, overwrite and accumulate.
            for beta in [0.0f32, 1.0] {
                let desc = GemmDesc::new(false, true, n, m, k).beta(beta);
                let init = r.vec(n * m, -1.0, 1.0);
                let (mut cc, mut gc) = both(dt, &init, g);
                cpu().gemm(&desc, &cx, &cw, &mut cc).unwrap();
                cpu().bias_add(&mut cc, &cb, n, m).unwrap();
                g.gemm_epilogue(&desc, &gx, &gw, &mut gc, Epilogue::Bias(&gb))
                    .unwrap();
                compare(&format!("{what} bias beta {beta}"), &cc, &gc, g, t);
            }
            // Bias + residual: C is only written, the residual read from its own buffer.
            if bias_dt == dt {
                let desc = GemmDesc::new(false, true, n, m, k);
                let res = r.vec(n * m, -1.0, 1.0);
                let (cres, gres) = both(dt, &res, g);
                let (mut cc, _) = both(dt, &res, g);
                let (_, mut gc) = both(dt, &r.vec(n * m, 5.0, 9.0), g);
                cpu().gemm(&desc.beta(1.0), &cx, &cw, &mut cc).unwrap();
                cpu().bias_add(&mut cc, &cb, n, m).unwrap();
                g.gemm_epilogue(
                    &desc,
                    &gx,
                    &gw,
                    &mut gc,
                    Epilogue::BiasResidual {
                        bias: &gb,
                        residual: &gres,
                    },
                )
                .unwrap();
                compare(&format!("{what} bias + residual"), &cc, &gc, g, t);
                compare_bits(&format!("{what} residual untouched"), &cres, &gres, g);
            }
            // Bias + GELU, keeping the pre-activation.
            let desc = GemmDesc::new(false, true, n, m, k);
            let (mut cpre, mut gpre) = out(dt, n * m, g);
            let (mut cy, mut gy) = out(dt, n * m, g);
            cpu().gemm(&desc, &cx, &cw, &mut cpre).unwrap();
            cpu().bias_add(&mut cpre, &cb, n, m).unwrap();
            cpu().gelu_forward(&cpre, &mut cy).unwrap();
            g.gemm_epilogue(
                &desc,
                &gx,
                &gw,
                &mut gy,
                Epilogue::BiasGelu {
                    bias: &gb,
                    pre: &mut gpre,
                },
            )
            .unwrap();
            compare(&format!("{what} gelu pre-activation"), &cpre, &gpre, g, t);
            compare(&format!("{what} gelu output"), &cy, &gy, g, t);
        }
        // GELU backward: dpre = (dy · W) ⊙ gelu'(pre).
        let (cdy, gdy) = both(dt, &r.vec(n * m, -1.0, 1.0), g);
        let (cpre, gpre) = both(dt, &r.vec(n * k, -3.0, 3.0), g);
        let desc = GemmDesc::new(false, false, n, k, m);
        let (mut cd, _) = out(dt, n * k, g);
        let (mut cdx, mut gdx) = out(dt, n * k, g);
        cpu().gemm(&desc, &cdy, &cw, &mut cd).unwrap();
        cpu().gelu_backward(&cpre, &cd, &mut cdx).unwrap();
        g.gemm_epilogue(&desc, &gdy, &gw, &mut gdx, Epilogue::DGelu { pre: &gpre })
            .unwrap();
        compare(&format!("{dt} dgelu"), &cdx, &gdx, g, t);
        // Weight gradient (accumulated into f32) with the bias gradient from the same GEMM.
        let cdw0 = r.vec(m * k, -1.0, 1.0);
        let (mut cdw, mut gdw) = both(DType::F32, &cdw0, g);
        let (mut cdb, _) = both(DType::F32, &vec![0.0; m], g);
        let (_, mut gdb) = out(DType::F32, m, g);
        let wdesc = GemmDesc::new(true, false, m, k, n).beta(1.0);
        cpu().gemm(&wdesc, &cdy, &cx, &mut cdw).unwrap();
        cpu().bias_backward(&cdy, &mut cdb, n, m).unwrap();
        g.gemm_epilogue(
            &wdesc,
            &gdy,
            &gx,
            &mut gdw,
            Epilogue::BiasGradA { dbias: &mut gdb },
        )
        .unwrap();
        compare(&format!("{dt} weight gradient"), &cdw, &gdw, g, 1e-3);
        compare(&format!("{dt} bias gradient"), &cdb, &gdb, g, 1e-3);
        // Misuse is an error, not a wrong answer.
        let bad = GemmDesc::new(false, false, n, k, m).beta(1.0);
        assert!(
            g.gemm_epilogue(&bad, &gdy, &gw, &mut gdx, Epilogue::DGelu { pre: &gpre })
                .is_err()
        );
    }
    let (_, x32) = both(DType::F32, &[1.0; 4], g);
    let (_, mut y32) = both(DType::F32, &[0.0; 4], g);
    let (_, b32) = both(DType::F32, &[0.0; 2], g);
    assert!(
        g.gemm_epilogue(
            &GemmDesc::new(false, true, 2, 2, 2),
            &x32,
            &x32,
            &mut y32,
            Epilogue::Bias(&b32)
        )
        .is_err(),
        "f32 epilogues are not offered"
    );
}

/// zero_many clears buffers of every size and dtype completely (odd byte counts, several
/// chunks) and nothing else.
#[test]
fn zero_many_clears_whole_buffers() {
    let Some(g) = gpu("zero_many_clears_whole_buffers") else {
        return;
    };
    let specs = [
        (DType::F32, 300_001usize),
        (DType::BF16, 7),
        (DType::U8, 3),
        (DType::F16, 65_537),
    ];
    let mut bufs: Vec<_> = specs
        .iter()
        .map(|&(d, n)| put(g, d, &vec![1.0; n]))
        .collect();
    let keep = put(g, DType::F32, &[1.0; 5]);
    let mut refs: Vec<&mut _> = bufs.iter_mut().collect();
    g.zero_many(&mut refs).unwrap();
    for (b, &(d, n)) in bufs.iter().zip(&specs) {
        let bytes = g.download_bytes(b, 0, n).unwrap();
        assert!(bytes.iter().all(|&x| x == 0), "{d} × {n} not cleared");
    }
    assert_eq!(g.download_f32(&keep).unwrap(), vec![1.0; 5]);
}

/// GEMM autotuning times the candidates on the real operands: the trial runs must leave no
/// trace (accumulating GEMMs add once, the bias gradient is written once), and the cached
/// choice gives the same results on the next call.
#[test]
fn gemm_autotune_leaves_no_trace() {
    let test = "gemm_autotune_leaves_no_trace";
    let Some(dev) = own_gpu(test) else { return };
    let g = &dev;
    use duet_device::Epilogue;
    assert!(g.set_gemm_autotune(true), "CUDA autotunes");
    let mut r = rng();
    let dt = DType::BF16;
    if !g.supports_gemm_epilogue(dt) {
        skip!("SKIP {test}: no bf16 cuBLASLt epilogues on this GPU");
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
        cpu().gemm(&desc, &cx, &cw, &mut cc).unwrap();
        g.gemm(&desc, &gx, &gw, &mut gc).unwrap();
        compare(&format!("round {round}: gemm beta 1"), &cc, &gc, g, 2e-2);
        // Bias epilogue accumulating.
        let (mut cc, mut gc) = both(dt, &init, g);
        cpu().gemm(&desc, &cx, &cw, &mut cc).unwrap();
        cpu().bias_add(&mut cc, &cb, n, m).unwrap();
        g.gemm_epilogue(&desc, &gx, &gw, &mut gc, Epilogue::Bias(&gb))
            .unwrap();
        compare(&format!("round {round}: bias beta 1"), &cc, &gc, g, 2e-2);
        // Weight gradient accumulated into f32 with the bias gradient.
        let dw0 = r.vec(m * k, -1.0, 1.0);
        let (mut cdw, mut gdw) = both(DType::F32, &dw0, g);
        let (mut cdb, _) = both(DType::F32, &vec![0.0; m], g);
        let (_, mut gdb) = out(DType::F32, m, g);
        let wdesc = GemmDesc::new(true, false, m, k, n).beta(1.0);
        cpu().gemm(&wdesc, &cdy, &cx, &mut cdw).unwrap();
        cpu().bias_backward(&cdy, &mut cdb, n, m).unwrap();
        g.gemm_epilogue(
            &wdesc,
            &gdy,
            &gx,
            &mut gdw,
            Epilogue::BiasGradA { dbias: &mut gdb },
        )
        .unwrap();
        compare(
            &format!("round {round}: weight gradient"),
            &cdw,
            &gdw,
            g,
            1e-3,
        );
        compare(
            &format!("round {round}: bias gradient"),
            &cdb,
            &gdb,
            g,
            1e-3,
        );
    }
}

/// The FP8 GEMM's fused epilogues equal the FP8 GEMM followed by the separate ops (on the GPU,
/// same codes and scales), and misuse is refused.
#[test]
fn fp8_gemm_epilogues_match_the_separate_ops() {
    let test = "fp8_gemm_epilogues_match_the_separate_ops";
    let Some(g) = gpu(test) else { return };
    use duet_device::Epilogue;
    if !g.supports_fp8_epilogue(DType::BF16) {
        skip!("SKIP {test}: {} has no FP8 epilogues", g.info().name);
        return;
    }
    let mut r = rng();
    let dt = DType::BF16;
    let (n, k, m) = (64, 96, 128);
    let scale = g.upload_new(&[1.0f32, 1.0]).unwrap();
    let mut amax = g.upload_new(&[0.0f32, 0.0]).unwrap();
    let q = |data: &[f32], rows: usize, cols: usize, amax: &mut duet_cuda::CudaBuffer| {
        let src = put(g, dt, data);
        let mut dst = g.alloc(DType::F8E4M3, rows * cols).unwrap();
        g.quantize_fp8(&src, &mut dst, None, rows, cols, &scale, amax, 0)
            .unwrap();
        dst
    };
    let x8 = q(&r.vec(n * k, -2.0, 2.0), n, k, &mut amax);
    let w8 = q(&r.vec(m * k, -0.5, 0.5), m, k, &mut amax);
    let bias = put(g, dt, &r.vec(m, -0.5, 0.5));
    let desc = GemmDesc::new(false, true, n, m, k);
    let get = |b: &duet_cuda::CudaBuffer| g.download_f32(b).unwrap();
    // Bias.
    let mut want = g.alloc(dt, n * m).unwrap();
    g.gemm_fp8(&desc, &x8, &w8, &mut want, &scale, 0, 1)
        .unwrap();
    g.bias_add(&mut want, &bias, n, m).unwrap();
    let mut got = g.alloc(dt, n * m).unwrap();
    g.gemm_fp8_epilogue(
        &desc,
        &x8,
        &w8,
        &mut got,
        &scale,
        0,
        1,
        Epilogue::Bias(&bias),
    )
    .unwrap();
    compare_f32("fp8 bias", &get(&got), &get(&want), 2e-2);
    // Bias + residual.
    let res = put(g, dt, &r.vec(n * m, -1.0, 1.0));
    let mut want = g.alloc(dt, n * m).unwrap();
    g.copy(&res, 0, &mut want, 0, n * m).unwrap();
    g.gemm_fp8(&desc.beta(1.0), &x8, &w8, &mut want, &scale, 0, 1)
        .unwrap();
    g.bias_add(&mut want, &bias, n, m).unwrap();
    let mut got = put(g, dt, &vec![7.0; n * m]);
    g.gemm_fp8_epilogue(
        &desc,
        &x8,
        &w8,
        &mut got,
        &scale,
        0,
        1,
        Epilogue::BiasResidual {
            bias: &bias,
            residual: &res,
        },
    )
    .unwrap();
    compare_f32("fp8 bias + residual", &get(&got), &get(&want), 2e-2);
    // Bias + GELU with the pre-activation.
    let mut want_pre = g.alloc(dt, n * m).unwrap();
    let mut want = g.alloc(dt, n * m).unwrap();
    g.gemm_fp8(&desc, &x8, &w8, &mut want_pre, &scale, 0, 1)
        .unwrap();
    g.bias_add(&mut want_pre, &bias, n, m).unwrap();
    g.gelu_forward(&want_pre, &mut want).unwrap();
    let mut pre = g.alloc(dt, n * m).unwrap();
    let mut got = g.alloc(dt, n * m).unwrap();
    g.gemm_fp8_epilogue(
        &desc,
        &x8,
        &w8,
        &mut got,
        &scale,
        0,
        1,
        Epilogue::BiasGelu {
            bias: &bias,
            pre: &mut pre,
        },
    )
    .unwrap();
    compare_f32("fp8 gelu pre-activation", &get(&pre), &get(&want_pre), 2e-2);
    compare_f32("fp8 gelu output", &get(&got), &get(&want), 2e-2);
    // Misuse: an epilogue FP8 GEMMs do not take, and a wrong bias dtype.
    let mut dgelu_out = g.alloc(dt, n * m).unwrap();
    assert!(
        g.gemm_fp8_epilogue(
            &desc,
            &x8,
            &w8,
            &mut dgelu_out,
            &scale,
            0,
            1,
            Epilogue::DGelu { pre: &pre }
        )
        .is_err()
    );
    let bias32 = put(g, DType::F32, &vec![0.0; m]);
    assert!(
        g.gemm_fp8_epilogue(
            &desc,
            &x8,
            &w8,
            &mut got,
            &scale,
            0,
            1,
            Epilogue::Bias(&bias32)
        )
        .is_err()
    );
}

/// FP8 delayed scaling on the device equals the host computation (the CPU backend runs the
/// trait's host default) bit for bit: history roll, max with NaN entries, amaxes of 0, ∞ and
/// NaN that keep the scale, saturation, margins, most-recent mode, several steps; inverse
/// scales packed and `inv_stride` apart (the elements in between untouched).
#[test]
fn fp8_scaling_update_matches_the_host() {
    let test = "fp8_scaling_update_matches_the_host";
    let Some(g) = gpu(test) else { return };
    let mut r = rng();
    assert_eq!(
        g.fp8_scale_inv_stride(),
        64,
        "cuBLASLt reads 256-byte aligned scales in place"
    );
    for (len, most_recent, margin, inv_stride) in [
        (1, false, 0, 1),
        (16, false, 0, 64),
        (5, true, 2, 3),
        (7, false, -3, 1),
    ] {
        let ops = 11;
        let maxes: Vec<f32> = (0..ops)
            .map(|i| if i % 3 == 2 { 57344.0 } else { 448.0 })
            .collect();
        let mut hist0 = vec![0.0f32; ops * len];
        for (i, h) in hist0.iter_mut().enumerate() {
            if i % len < len / 2 {
                *h = r.uniform(0.0, 8.0);
            }
        }
        if len > 3 {
            hist0[2] = f32::NAN; // operand 0: a NaN in its history keeps its scale
        }
        let scale0: Vec<f32> = (0..ops).map(|_| r.uniform(0.5, 300.0)).collect();
        let (mut ch, mut gh) = both(DType::F32, &hist0, g);
        let (mut cs, mut gs) = both(DType::F32, &scale0, g);
        let inv0: Vec<f32> = (0..ops * inv_stride).map(|i| i as f32 + 0.5).collect();
        let (mut ci, mut gi) = both(DType::F32, &inv0, g);
        let (cm, gm) = both(DType::F32, &maxes, g);
        for step in 0..4 {
            let amax: Vec<f32> = (0..ops)
                .map(|i| match (i + step) % 6 {
                    0 => 0.0,
                    1 => f32::INFINITY,
                    2 => f32::NAN,
                    3 => 1e-37, // saturates the scale at f32::MAX
                    _ => r.uniform(0.0, 20.0),
                })
                .collect();
            let (mut ca, mut ga) = both(DType::F32, &amax, g);
            cpu()
                .fp8_scaling_update(
                    &mut ca,
                    &mut ch,
                    &mut cs,
                    &mut ci,
                    inv_stride,
                    &cm,
                    len,
                    most_recent,
                    margin,
                )
                .unwrap();
            g.fp8_scaling_update(
                &mut ga,
                &mut gh,
                &mut gs,
                &mut gi,
                inv_stride,
                &gm,
                len,
                most_recent,
                margin,
            )
            .unwrap();
            let what = format!(
                "len {len} most_recent {most_recent} margin {margin} inv_stride {inv_stride} \
                 step {step}"
            );
            compare_bits(&format!("{what}: history"), &ch, &gh, g);
            compare_bits(&format!("{what}: scale"), &cs, &gs, g);
            compare_bits(&format!("{what}: scale_inv"), &ci, &gi, g);
            compare_bits(&format!("{what}: amax cleared"), &ca, &ga, g);
        }
    }
}
