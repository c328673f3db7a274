//! The CUDA LayerNorm (register-cached row kernels, fused backward with one finish kernel)
//! against the CPU reference backend over many shapes and dtypes: the forward outputs and saved
//! statistics, the accumulating backward (dx, dgamma and dbeta start non-zero, and a second call
//! adds again), and bit-identical results between repeated runs.
//!
//! Shapes cover the vectorised fast path (c a multiple of 8), the single-element fast path (c = 1,
//! 7, 100) and the wide-row fallback kernels (c = 1537, 3080 backward, 16392). When no CUDA
//! device is usable the test prints `SKIP <name>: <reason>` to stderr and returns. Inputs come from a fixed seed
//! (`DUET_TEST_SEED` overrides it).

use duet_device::Fused;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_cuda::{CudaBuffer, CudaDevice};
use duet_device::{Buffer, DType, Device, DeviceExt};
use half::{bf16, f16};
use std::io::Write;

fn gpu(test: &str) -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "SKIP {test}: no usable CUDA device: {e}");
            None
        }
    }
}

fn seed() -> u64 {
    std::env::var("DUET_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1a7e)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

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
        d => panic!("unexpected dtype {d}"),
    }
}

fn put<D: Fused>(dev: &D, dtype: DType, data: &[f32]) -> D::Buffer {
    let mut b = dev.alloc(dtype, data.len()).unwrap();
    dev.upload_bytes(&encode(dtype, data), &mut b, 0).unwrap();
    b
}

fn tol(dtype: DType, f32_tol: f32) -> f32 {
    match dtype {
        DType::F32 => f32_tol,
        DType::F16 => 5e-3,
        _ => 1e-2,
    }
}

/// `|gpu − cpu| ≤ tol · (|cpu| + rms(cpu))` element-wise; NaN must match.
fn compare(what: &str, cpu: &CpuDevice, c: &CpuBuffer, dev: &CudaDevice, g: &CudaBuffer, tol: f32) {
    let want = cpu.download_f32(c).unwrap();
    let got = dev.download_f32(g).unwrap();
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let rms = (want.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / want.len().max(1) as f64)
        .sqrt() as f32;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let err = (g - w).abs() / (w.abs() + rms).max(f32::MIN_POSITIVE);
        assert!(
            err <= tol && !g.is_nan(),
            "{what}: element {i}: gpu {g} vs cpu {w} (relative error {err:.3e} > {tol:.1e}, \
             seed {})",
            seed()
        );
    }
}

fn bytes(dev: &CudaDevice, b: &CudaBuffer) -> Vec<u8> {
    dev.download_bytes(b, 0, b.len()).unwrap()
}

/// A GPU output buffer filled with NaN, so an element never written fails the comparison.
fn poisoned(dev: &CudaDevice, dtype: DType, len: usize) -> CudaBuffer {
    let mut b = dev.alloc(dtype, len).unwrap();
    dev.fill(&mut b, f32::NAN).unwrap();
    b
}

const DTYPES: [(DType, DType); 5] = [
    (DType::F32, DType::F32),
    (DType::BF16, DType::BF16),
    (DType::BF16, DType::F32),
    (DType::F16, DType::F16),
    (DType::F16, DType::F32),
];

#[allow(clippy::too_many_arguments)]
fn check_case(
    g: &CudaDevice,
    cpu: &CpuDevice,
    rng: &mut Rng,
    act: DType,
    pdt: DType,
    n: usize,
    c: usize,
) {
    let what = format!("layernorm {act}/{pdt} {n}x{c}");
    let eps = 1e-5;
    // Rows with different offsets and scales.
    let mut x = Vec::with_capacity(n * c);
    for _ in 0..n {
        let (off, sc) = (rng.uniform(-3.0, 3.0), rng.uniform(0.1, 4.0));
        x.extend((0..c).map(|_| off + sc * rng.uniform(-1.0, 1.0)));
    }
    let gamma = rng.vec(c, 0.5, 1.5);
    let beta = rng.vec(c, -0.5, 0.5);
    let (cx, gx) = (put(cpu, act, &x), put(g, act, &x));
    let (cg, gg) = (put(cpu, pdt, &gamma), put(g, pdt, &gamma));
    let (cb, gb) = (put(cpu, pdt, &beta), put(g, pdt, &beta));

    // Forward.
    let mut co = cpu.alloc(act, n * c).unwrap();
    let mut cm = cpu.alloc(DType::F32, n).unwrap();
    let mut cr = cpu.alloc(DType::F32, n).unwrap();
    cpu.layernorm_forward(&cx, &cg, &cb, &mut co, &mut cm, &mut cr, n, c, eps)
        .unwrap();
    let mut go = poisoned(g, act, n * c);
    let mut gm = poisoned(g, DType::F32, n);
    let mut gr = poisoned(g, DType::F32, n);
    g.layernorm_forward(&gx, &gg, &gb, &mut go, &mut gm, &mut gr, n, c, eps)
        .unwrap();
    compare(&format!("{what} out"), cpu, &co, g, &go, tol(act, 1e-4));
    compare(&format!("{what} mean"), cpu, &cm, g, &gm, 1e-5);
    compare(&format!("{what} rstd"), cpu, &cr, g, &gr, 1e-4);
    // A second forward gives the same bits.
    let mut go2 = poisoned(g, act, n * c);
    let mut gm2 = poisoned(g, DType::F32, n);
    let mut gr2 = poisoned(g, DType::F32, n);
    g.layernorm_forward(&gx, &gg, &gb, &mut go2, &mut gm2, &mut gr2, n, c, eps)
        .unwrap();
    assert!(
        bytes(g, &go) == bytes(g, &go2),
        "{what}: out not deterministic"
    );
    assert!(
        bytes(g, &gm) == bytes(g, &gm2),
        "{what}: mean not deterministic"
    );
    assert!(
        bytes(g, &gr) == bytes(g, &gr2),
        "{what}: rstd not deterministic"
    );

    // Backward, accumulating into non-zero gradients; the GPU uses its own saved statistics.
    let dout = rng.vec(n * c, -1.0, 1.0);
    let dx0 = rng.vec(n * c, -0.5, 0.5);
    let dg0 = rng.vec(c, -0.5, 0.5);
    let db0 = rng.vec(c, -0.5, 0.5);
    let (cd, gd) = (put(cpu, act, &dout), put(g, act, &dout));
    let mut cdx = put(cpu, act, &dx0);
    let mut cdg = put(cpu, pdt, &dg0);
    let mut cdb = put(cpu, pdt, &db0);
    cpu.layernorm_backward(&cd, &cx, &cg, &cm, &cr, &mut cdx, &mut cdg, &mut cdb, n, c)
        .unwrap();
    let run = |times: usize| {
        let mut dx = put(g, act, &dx0);
        let mut dg = put(g, pdt, &dg0);
        let mut db = put(g, pdt, &db0);
        for _ in 0..times {
            g.layernorm_backward(&gd, &gx, &gg, &gm, &gr, &mut dx, &mut dg, &mut db, n, c)
                .unwrap();
        }
        (dx, dg, db)
    };
    let (gdx, gdg, gdb) = run(1);
    compare(&format!("{what} dx"), cpu, &cdx, g, &gdx, tol(act, 2e-4));
    compare(
        &format!("{what} dgamma"),
        cpu,
        &cdg,
        g,
        &gdg,
        tol(pdt, 2e-4),
    );
    compare(&format!("{what} dbeta"), cpu, &cdb, g, &gdb, tol(pdt, 1e-4));
    // Bit-identical between two runs from the same starting gradients.
    let (gdx2, gdg2, gdb2) = run(1);
    assert!(
        bytes(g, &gdx) == bytes(g, &gdx2),
        "{what}: dx not deterministic"
    );
    assert!(
        bytes(g, &gdg) == bytes(g, &gdg2),
        "{what}: dgamma not deterministic"
    );
    assert!(
        bytes(g, &gdb) == bytes(g, &gdb2),
        "{what}: dbeta not deterministic"
    );
    // A second call accumulates again.
    cpu.layernorm_backward(&cd, &cx, &cg, &cm, &cr, &mut cdx, &mut cdg, &mut cdb, n, c)
        .unwrap();
    let (gdx3, gdg3, gdb3) = run(2);
    compare(
        &format!("{what} dx (2 calls)"),
        cpu,
        &cdx,
        g,
        &gdx3,
        tol(act, 2e-4),
    );
    compare(
        &format!("{what} dgamma (2 calls)"),
        cpu,
        &cdg,
        g,
        &gdg3,
        tol(pdt, 2e-4),
    );
    compare(
        &format!("{what} dbeta (2 calls)"),
        cpu,
        &cdb,
        g,
        &gdb3,
        tol(pdt, 1e-4),
    );
}

#[test]
fn layernorm_fused_matches_cpu_and_is_deterministic() {
    let Some(g) = gpu("layernorm_fused_matches_cpu_and_is_deterministic") else {
        return;
    };
    let cpu = CpuDevice::new(None).expect("cpu device");
    let mut rng = Rng(seed());
    let mut cases = Vec::new();
    for n in [1usize, 3, 8192] {
        for c in [1usize, 7, 100, 768, 2048] {
            cases.push((n, c));
        }
    }
    // Fallback kernels: rows too wide for the fast path (single elements, then vectors).
    cases.extend([
        (5, 1537),
        (4, 3080),
        (9, 8200),
        (3, 16392),
        (300, 1000),
        (67, 768),
    ]);
    for (act, pdt) in DTYPES {
        for &(n, c) in &cases {
            check_case(&g, &cpu, &mut rng, act, pdt, n, c);
        }
    }
    g.synchronize().unwrap();
}

#[test]
fn layernorm_rejects_bad_shapes() {
    let Some(g) = gpu("layernorm_rejects_bad_shapes") else {
        return;
    };
    let x = g.alloc(DType::BF16, 8).unwrap();
    let p = g.alloc(DType::F32, 8).unwrap();
    let mut o = g.alloc(DType::BF16, 8).unwrap();
    let mut m = g.alloc(DType::F32, 1).unwrap();
    let mut r = g.alloc(DType::F32, 1).unwrap();
    // c = 0 with rows, and a gamma of the wrong length.
    assert!(
        g.layernorm_forward(&x, &p, &p, &mut o, &mut m, &mut r, 1, 0, 1e-5)
            .is_err()
    );
    let short = g.alloc(DType::F32, 4).unwrap();
    assert!(
        g.layernorm_forward(&x, &short, &p, &mut o, &mut m, &mut r, 1, 8, 1e-5)
            .is_err()
    );
    // n = 0 is a no-op (empty row buffers).
    let x0 = g.alloc(DType::BF16, 0).unwrap();
    let mut o0 = g.alloc(DType::BF16, 0).unwrap();
    let mut m0 = g.alloc(DType::F32, 0).unwrap();
    let mut r0 = g.alloc(DType::F32, 0).unwrap();
    g.layernorm_forward(&x0, &p, &p, &mut o0, &mut m0, &mut r0, 0, 8, 1e-5)
        .unwrap();
}

/// `Σ_rows b[row, col]` in f64 of a downloaded `n × c` buffer.
fn col_sums(v: &[f32], n: usize, c: usize) -> Vec<f64> {
    let mut s = vec![0.0f64; c];
    for r in 0..n {
        for (acc, &x) in s.iter_mut().zip(&v[r * c..(r + 1) * c]) {
            *acc += x as f64;
        }
    }
    s
}

/// `|got − want| ≤ tol · (|want| + rms(want))` element-wise.
fn close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len().max(1) as f64).sqrt();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / (w.abs() + rms).max(f64::MIN_POSITIVE);
        assert!(
            err <= tol && !g.is_nan(),
            "{what}: element {i}: {g} vs {w} (relative error {err:.3e} > {tol:.1e}, seed {})",
            seed()
        );
    }
}

/// `layernorm_backward_colsum` against `layernorm_backward` + `bias_backward` on the same GPU
/// (dx, dgamma, dbeta bit-identical; dsum, summed in another order, within a tolerance), against
/// the column sums of its own dx and the CPU's default op, and bit-identical between two runs.
/// Every gradient starts non-zero (all accumulate). `sdt` is dsum's dtype.
#[allow(clippy::too_many_arguments)]
fn check_colsum_case(
    g: &CudaDevice,
    cpu: &CpuDevice,
    rng: &mut Rng,
    act: DType,
    pdt: DType,
    sdt: DType,
    n: usize,
    c: usize,
) {
    let what = format!("layernorm_backward_colsum {act}/{pdt}/dsum {sdt} {n}x{c}");
    let mut x = Vec::with_capacity(n * c);
    for _ in 0..n {
        let (off, sc) = (rng.uniform(-3.0, 3.0), rng.uniform(0.1, 4.0));
        x.extend((0..c).map(|_| off + sc * rng.uniform(-1.0, 1.0)));
    }
    let gamma = rng.vec(c, 0.5, 1.5);
    let beta = rng.vec(c, -0.5, 0.5);
    let dout = rng.vec(n * c, -1.0, 1.0);
    // The residual-stream gradient coming down (dx before the call), biased per column so the
    // column sums are not all near zero.
    let col_bias = rng.vec(c, -0.3, 0.3);
    let dx0: Vec<f32> = (0..n * c)
        .map(|i| col_bias[i % c] + rng.uniform(-0.5, 0.5))
        .collect();
    let dg0 = rng.vec(c, -0.5, 0.5);
    let db0 = rng.vec(c, -0.5, 0.5);
    let ds0 = rng.vec(c, -0.5, 0.5);

    // Statistics from the GPU forward, used by every backward below (CPU included).
    let (gx, gg, gb) = (put(g, act, &x), put(g, pdt, &gamma), put(g, pdt, &beta));
    let mut go = g.alloc(act, n * c).unwrap();
    let mut gm = g.alloc(DType::F32, n).unwrap();
    let mut gr = g.alloc(DType::F32, n).unwrap();
    g.layernorm_forward(&gx, &gg, &gb, &mut go, &mut gm, &mut gr, n, c, 1e-5)
        .unwrap();
    let (mean, rstd) = (g.download_f32(&gm).unwrap(), g.download_f32(&gr).unwrap());
    let gd = put(g, act, &dout);

    // Separate ops.
    let mut rdx = put(g, act, &dx0);
    let mut rdg = put(g, pdt, &dg0);
    let mut rdb = put(g, pdt, &db0);
    let mut rds = put(g, sdt, &ds0);
    g.layernorm_backward(&gd, &gx, &gg, &gm, &gr, &mut rdx, &mut rdg, &mut rdb, n, c)
        .unwrap();
    g.bias_backward(&rdx, &mut rds, n, c).unwrap();
    // Fused, twice from the same start.
    let run = || {
        let mut dx = put(g, act, &dx0);
        let mut dg = put(g, pdt, &dg0);
        let mut db = put(g, pdt, &db0);
        let mut ds = put(g, sdt, &ds0);
        g.layernorm_backward_colsum(
            &gd, &gx, &gg, &gm, &gr, &mut dx, &mut dg, &mut db, &mut ds, n, c,
        )
        .unwrap();
        (dx, dg, db, ds)
    };
    let (fdx, fdg, fdb, fds) = run();
    let (fdx2, fdg2, fdb2, fds2) = run();
    for (name, a, b) in [
        ("dx", &fdx, &rdx),
        ("dgamma", &fdg, &rdg),
        ("dbeta", &fdb, &rdb),
    ] {
        assert!(
            bytes(g, a) == bytes(g, b),
            "{what}: {name} differs from layernorm_backward's"
        );
    }
    for (name, a, b) in [
        ("dx", &fdx, &fdx2),
        ("dgamma", &fdg, &fdg2),
        ("dbeta", &fdb, &fdb2),
        ("dsum", &fds, &fds2),
    ] {
        assert!(
            bytes(g, a) == bytes(g, b),
            "{what}: {name} not deterministic"
        );
    }
    // dsum: ds0 + the column sums of the stored dx (f64), the separate column sum, the CPU.
    let ds_tol = tol(sdt, 1e-5) as f64;
    let dxv = g.download_f32(&fdx).unwrap();
    let ds0r = cpu_round(cpu, sdt, &ds0);
    let want: Vec<f64> = col_sums(&dxv, n, c)
        .iter()
        .zip(&ds0r)
        .map(|(s, &d)| s + d as f64)
        .collect();
    let got = g.download_f32(&fds).unwrap();
    close(&format!("{what} dsum vs Σ dx"), &got, &want, ds_tol);
    let sep: Vec<f64> = g
        .download_f32(&rds)
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    close(&format!("{what} dsum vs bias_backward"), &got, &sep, ds_tol);
    let (cx, cg, cd) = (
        put(cpu, act, &x),
        put(cpu, pdt, &gamma),
        put(cpu, act, &dout),
    );
    let (cm, cr) = (put(cpu, DType::F32, &mean), put(cpu, DType::F32, &rstd));
    let mut cdx = put(cpu, act, &dx0);
    let mut cdg = put(cpu, pdt, &dg0);
    let mut cdb = put(cpu, pdt, &db0);
    let mut cds = put(cpu, sdt, &ds0);
    cpu.layernorm_backward_colsum(
        &cd, &cx, &cg, &cm, &cr, &mut cdx, &mut cdg, &mut cdb, &mut cds, n, c,
    )
    .unwrap();
    let cpu_ds: Vec<f64> = cpu
        .download_f32(&cds)
        .unwrap()
        .iter()
        .map(|&v| v as f64)
        .collect();
    // The CPU's dx rounds differently from the GPU's in the last bit of `act`.
    let cpu_tol = ds_tol.max(tol(act, 1e-5) as f64);
    close(&format!("{what} dsum vs cpu"), &got, &cpu_ds, cpu_tol);
}

/// `v` rounded to `dtype` and back.
fn cpu_round(cpu: &CpuDevice, dtype: DType, v: &[f32]) -> Vec<f32> {
    cpu.download_f32(&put(cpu, dtype, v)).unwrap()
}

#[test]
fn layernorm_backward_colsum_matches_separate_ops() {
    let Some(g) = gpu("layernorm_backward_colsum_matches_separate_ops") else {
        return;
    };
    let cpu = CpuDevice::new(None).expect("cpu device");
    let mut rng = Rng(seed());
    // The fused kernels (vectorised fast path: c a multiple of 16 bytes; 65 × 136 with a partial
    // last chunk), the composed paths: single elements (65 × 130), rows too wide for the fast
    // path (37 × 3000 for f32 activations, 37 × 3080 for every dtype).
    let shapes = [
        (8192usize, 768usize),
        (8192, 2048),
        (65, 136),
        (65, 130),
        (1, 64),
        (37, 3000),
        (37, 3080),
    ];
    for (act, pdt) in DTYPES {
        for &(n, c) in &shapes {
            check_colsum_case(&g, &cpu, &mut rng, act, pdt, DType::F32, n, c);
            if pdt != DType::F32 {
                check_colsum_case(&g, &cpu, &mut rng, act, pdt, pdt, n, c);
            }
        }
    }
    // dsum of a dtype other than dgamma's and the activations'.
    check_colsum_case(
        &g,
        &cpu,
        &mut rng,
        DType::BF16,
        DType::F32,
        DType::F16,
        65,
        130,
    );
    check_colsum_case(
        &g,
        &cpu,
        &mut rng,
        DType::F32,
        DType::F32,
        DType::BF16,
        8192,
        768,
    );
    g.synchronize().unwrap();
}

#[test]
fn layernorm_backward_colsum_rejects_bad_dsum() {
    let Some(g) = gpu("layernorm_backward_colsum_rejects_bad_dsum") else {
        return;
    };
    let a = |dtype, len| g.alloc(dtype, len).unwrap();
    let (d, x) = (a(DType::BF16, 16), a(DType::BF16, 16));
    let (gm, m, r) = (a(DType::F32, 8), a(DType::F32, 2), a(DType::F32, 2));
    let (mut dx, mut dg, mut db) = (a(DType::BF16, 16), a(DType::F32, 8), a(DType::F32, 8));
    let mut short = a(DType::F32, 4);
    assert!(
        g.layernorm_backward_colsum(
            &d, &x, &gm, &m, &r, &mut dx, &mut dg, &mut db, &mut short, 2, 8
        )
        .is_err()
    );
    let mut ints = a(DType::I32, 8);
    assert!(
        g.layernorm_backward_colsum(
            &d, &x, &gm, &m, &r, &mut dx, &mut dg, &mut db, &mut ints, 2, 8
        )
        .is_err()
    );
}
