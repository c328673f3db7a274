//! The suite's harness: one seeded RNG, one tolerance type, NaN-prefilled outputs, host-side
//! encodings, the `SKIP <test>: <reason>` convention and the comparison against the oracle.

use duet_cpu::CpuDevice;
use duet_device::{Buffer, DType, Device, Fp8Format};
use half::{bf16, f16};
use std::sync::OnceLock;

/// Prints `SKIP <test>: <reason>` straight to stderr, past the test harness's capture, so a
/// skipped case is never a silent pass.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {reason}");
}

/// The run's base seed: `DUET_TEST_SEED` when set (to replay a failure), else the clock.
/// Printed once; every failure message repeats it.
pub fn base_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let s = std::env::var("DUET_TEST_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("conformance: DUET_TEST_SEED={s}");
        s
    })
}

/// SplitMix64 random numbers. Each case takes its own stream from [`Harness::rng`], derived
/// from the base seed and the case's name, so a case draws the same inputs whatever ran before.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// How closely a result must follow its oracle.
///
/// `Rel` compares element-wise `|got − want| ≤ tol(dtype) · (|want| + rms(want))`, where
/// `dtype` is the result's storage type: the rms term keeps entries near zero (cancellation)
/// from demanding more than the tensor's scale allows. NaN must meet NaN and an infinity the
/// same infinity. `Bits` demands the same bytes (permutations, casts, FP8 codes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tol {
    Bits,
    Rel {
        f32: f64,
        f16: f64,
        bf16: f64,
        /// FP8 results compared as values (one code step is 2⁻³ relative for E4M3).
        fp8: f64,
    },
}

impl Tol {
    /// Element-wise ops: a few f32 roundings; the 16-bit results one storage rounding
    /// (bf16 ulp 2⁻⁸, f16 2⁻¹¹) plus the arithmetic.
    pub const ELEMENTWISE: Tol = Tol::Rel {
        f32: 1e-5,
        f16: 5e-3,
        bf16: 1e-2,
        fp8: 0.13,
    };
    /// Reductions and GEMMs: summation order differs between backends.
    pub const REDUCTION: Tol = Tol::Rel {
        f32: 1e-4,
        f16: 5e-3,
        bf16: 1e-2,
        fp8: 0.13,
    };
    /// GEMMs with 16-bit operands accumulated into a 16-bit C.
    pub const GEMM16: Tol = Tol::Rel {
        f32: 1e-3,
        f16: 5e-3,
        bf16: 2e-2,
        fp8: 0.13,
    };
    /// A uniform relative tolerance for every dtype.
    pub const fn rel(t: f64) -> Tol {
        Tol::Rel {
            f32: t,
            f16: t,
            bf16: t,
            fp8: t,
        }
    }
    fn of(self, dtype: DType) -> Option<f64> {
        match self {
            Tol::Bits => None,
            Tol::Rel {
                f32,
                f16,
                bf16,
                fp8,
            } => Some(match dtype {
                DType::F16 => f16,
                DType::BF16 => bf16,
                d if d.is_fp8() => fp8,
                _ => f32,
            }),
        }
    }
}

/// A result brought back to the host: its dtype and raw little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: DType,
    pub bytes: Vec<u8>,
}

impl Tensor {
    /// The tensor `values` give once stored as `dtype` (encoded on the host).
    pub fn encoded(name: &str, dtype: DType, values: &[f32]) -> Tensor {
        Tensor {
            name: name.to_string(),
            dtype,
            bytes: encode(dtype, values),
        }
    }
    /// The values as f32 (i32 converted, FP8 decoded).
    pub fn f32(&self) -> Vec<f32> {
        match self.dtype {
            DType::I32 => self
                .bytes
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
                .collect(),
            DType::U8 => self.bytes.iter().map(|&b| b as f32).collect(),
            d => d.bytes_to_f32(&self.bytes).expect("decodable dtype"),
        }
    }
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_bytes()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Host bytes of `data` in `dtype`, rounded on the host so every device gets the same bits.
pub fn encode(dtype: DType, data: &[f32]) -> Vec<u8> {
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
            let f = Fp8Format::of(fp8).expect("an fp8 dtype");
            data.iter().map(|&x| f.encode(x)).collect()
        }
    }
}

/// The values `data` takes once stored as `dtype` (what a device sees after [`put`]).
pub fn rounded(dtype: DType, data: &[f32]) -> Vec<f32> {
    match dtype {
        DType::F32 => data.to_vec(),
        DType::I32 => data.iter().map(|&x| x as i32 as f32).collect(),
        d => d.bytes_to_f32(&encode(d, data)).expect("decodable dtype"),
    }
}

/// `data` rounded to `dtype`, widened to f64: the inputs of an f64 reference.
pub fn rounded64(dtype: DType, data: &[f32]) -> Vec<f64> {
    rounded(dtype, data).iter().map(|&x| x as f64).collect()
}

/// A buffer of `dtype` holding `data` (rounded on the host).
pub fn put<E: Device>(e: &E, dtype: DType, data: &[f32]) -> E::Buffer {
    let mut b = e.alloc(dtype, data.len()).expect("alloc");
    if !data.is_empty() {
        e.upload_bytes(&encode(dtype, data), &mut b, 0)
            .expect("upload");
    }
    b
}

/// An i32 buffer (token ids, targets).
pub fn put_i32<E: Device>(e: &E, data: &[i32]) -> E::Buffer {
    let mut b = e.alloc(DType::I32, data.len()).expect("alloc");
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    if !bytes.is_empty() {
        e.upload_bytes(&bytes, &mut b, 0).expect("upload");
    }
    b
}

/// An output buffer prefilled with NaN, so an element the op never writes cannot pass.
pub fn nan<E: Device>(e: &E, dtype: DType, n: usize) -> E::Buffer {
    let mut b = e.alloc(dtype, n).expect("alloc");
    e.fill(&mut b, f32::NAN).expect("fill NaN");
    b
}

/// Brings `buf` back to the host under `name`.
pub fn get<E: Device>(e: &E, name: &str, buf: &E::Buffer) -> Tensor {
    Tensor {
        name: name.to_string(),
        dtype: buf.dtype(),
        bytes: e.download_bytes(buf, 0, buf.len()).expect("download"),
    }
}

/// An f64 reference result for an output of `dtype`.
#[derive(Clone, Debug)]
pub struct Want {
    pub name: String,
    pub dtype: DType,
    pub values: Vec<f64>,
}

/// Shorthand for a [`Want`].
pub fn want(name: &str, dtype: DType, values: Vec<f64>) -> Want {
    Want {
        name: name.to_string(),
        dtype,
        values,
    }
}

/// The device a suite instance tests, with what its cases share.
pub struct Harness<D: Device> {
    pub dev: D,
    backend: String,
    open: fn() -> Result<D, String>,
}

impl<D: Device> Harness<D> {
    /// The harness of `dev`, which `open` opened (and opens again for [`Harness::fresh`]).
    pub fn new(dev: D, open: fn() -> Result<D, String>) -> Self {
        let backend = dev.info().backend;
        Harness { dev, backend, open }
    }

    /// A device of the case's own, for cases that disturb device-wide state (memory
    /// counters, a deferred error) which cases running in parallel on the shared one would see.
    pub fn fresh(&self) -> D {
        (self.open)().expect("the backend opened once, so it opens again")
    }

    /// The backend's name (`cpu`, `cuda`, `hip`).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether this instance tests the CPU backend, whose oracle is the f64 reference (a GPU
    /// backend's is the CPU backend).
    pub fn is_reference(&self) -> bool {
        self.backend == "cpu"
    }

    /// The CPU backend the GPU backends are compared with (two threads, as CI has).
    pub fn cpu() -> &'static CpuDevice {
        static CPU: OnceLock<CpuDevice> = OnceLock::new();
        CPU.get_or_init(|| CpuDevice::new(Some(2)).expect("the CPU backend"))
    }

    /// The random stream of case `case` (the same inputs whatever ran before it).
    pub fn rng(&self, case: &str) -> Rng {
        let h = case.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Rng::new(base_seed() ^ h)
    }

    /// Checks the device's results `got` against the oracle: on a GPU backend the same op on
    /// the CPU backend (`on_cpu`), on the CPU backend the f64 reference (`reference`). Only
    /// the oracle that applies is computed. `tols[i]` belongs to output `i`.
    #[track_caller]
    pub fn verify(
        &self,
        case: &str,
        got: &[Tensor],
        on_cpu: impl FnOnce(&CpuDevice) -> Vec<Tensor>,
        reference: impl FnOnce() -> Vec<Want>,
        tols: &[Tol],
    ) {
        assert_eq!(got.len(), tols.len(), "{case}: one tolerance per output");
        if self.is_reference() {
            let wants = reference();
            assert_eq!(wants.len(), got.len(), "{case}: reference outputs");
            for ((g, w), &t) in got.iter().zip(&wants).zip(tols) {
                assert_eq!(g.name, w.name, "{case}: outputs in the same order");
                assert_eq!(g.dtype, w.dtype, "{case} {}: dtype", g.name);
                match t {
                    Tol::Bits => {
                        let w32: Vec<f32> = w.values.iter().map(|&x| x as f32).collect();
                        compare_bits(
                            &format!("{case} {} vs the f64 reference", g.name),
                            g,
                            &Tensor::encoded(&w.name, w.dtype, &w32),
                        )
                    }
                    // The exact value rounded once to the output's storage dtype, as an op
                    // stores it (so a result that underflows to 0 in f16 is not an error).
                    _ => compare_values(
                        &format!("{case} {} vs the f64 reference", g.name),
                        &g.f32().iter().map(|&x| x as f64).collect::<Vec<_>>(),
                        &stored(w.dtype, &w.values),
                        t.of(g.dtype).unwrap(),
                    ),
                }
            }
        } else {
            let wants = on_cpu(Self::cpu());
            assert_eq!(wants.len(), got.len(), "{case}: CPU outputs");
            for ((g, w), &t) in got.iter().zip(&wants).zip(tols) {
                record_digest(&self.backend, case, g, w);
                let what = format!("{case} {} ({} vs cpu)", g.name, self.backend);
                compare(&what, g, w, t);
            }
        }
    }

    /// [`Harness::same`] for one output of each side, read back from the device under test.
    #[track_caller]
    pub fn same_buf(&self, case: &str, name: &str, fused: &D::Buffer, plain: &D::Buffer, tol: Tol) {
        let d = &self.dev;
        self.same(case, &[get(d, name, fused)], &[get(d, name, plain)], &[tol]);
    }

    /// Checks a fused path against its plain composition on the same device.
    #[track_caller]
    pub fn same(&self, case: &str, fused: &[Tensor], plain: &[Tensor], tols: &[Tol]) {
        assert_eq!(fused.len(), plain.len(), "{case}: outputs");
        assert_eq!(fused.len(), tols.len(), "{case}: one tolerance per output");
        for ((f, p), &t) in fused.iter().zip(plain).zip(tols) {
            let what = format!("{case} {} (fused vs composed, {})", f.name, self.backend);
            compare(&what, f, p, t);
        }
    }
}

/// FNV-1a 64 of `bytes`.
fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// With `DUET_CONFORMANCE_DIGESTS=FILE`, appends one line per output a GPU backend's case checks
/// against the CPU: `case, output, CPU digest, occurrence, backend, dtype, length, device digest,
/// bits equal to the CPU's`, tab-separated. Two backends run with the same `DUET_TEST_SEED` see
/// the same inputs, so the same CPU digest: `scripts/hip/compare_digests.py` joins two such files
/// on (case, output, CPU digest, occurrence) and tells which outputs are bit-identical between
/// the backends (a sub-case one backend skips has no partner and is listed as such).
fn record_digest(backend: &str, case: &str, got: &Tensor, cpu: &Tensor) {
    if let Some(path) = std::env::var_os("DUET_CONFORMANCE_DIGESTS").filter(|p| !p.is_empty()) {
        append_digest(std::path::Path::new(&path), backend, case, got, cpu);
    }
}

fn append_digest(path: &std::path::Path, backend: &str, case: &str, got: &Tensor, cpu: &Tensor) {
    use std::collections::HashMap;
    use std::io::Write;
    use std::sync::Mutex;
    /// Outputs recorded so far per (case, output, CPU digest).
    type Seen = Mutex<HashMap<(String, String, u64), u32>>;
    static SEEN: OnceLock<Seen> = OnceLock::new();
    let cpu_digest = fnv64(&cpu.bytes);
    let occurrence = {
        let mut seen = SEEN
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let n = seen
            .entry((case.to_string(), got.name.clone(), cpu_digest))
            .or_insert(0);
        *n += 1;
        *n
    };
    let line = format!(
        "{case}\t{}\t{cpu_digest:016x}\t{occurrence}\t{backend}\t{}\t{}\t{:016x}\t{}\n",
        got.name,
        got.dtype,
        got.bytes.len(),
        fnv64(&got.bytes),
        got.bytes == cpu.bytes
    );
    // One write per line on an O_APPEND file: lines of cases running in parallel do not mix.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!("DUET_CONFORMANCE_DIGESTS={}: {e}", path.display());
    }
}

/// `values` as an op stores them in `dtype`: f32 and wider kept, 16-bit and FP8 rounded once.
fn stored(dtype: DType, values: &[f64]) -> Vec<f64> {
    if matches!(dtype, DType::F16 | DType::BF16) || dtype.is_fp8() {
        let v32: Vec<f32> = values.iter().map(|&x| x as f32).collect();
        rounded64(dtype, &v32)
    } else {
        values.to_vec()
    }
}

/// Compares two tensors under `tol`.
#[track_caller]
pub fn compare(what: &str, got: &Tensor, want: &Tensor, tol: Tol) {
    assert_eq!(got.dtype, want.dtype, "{what}: dtypes differ");
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    match tol.of(got.dtype) {
        None => compare_bits(what, got, want),
        Some(t) => {
            let g: Vec<f64> = got.f32().iter().map(|&x| x as f64).collect();
            let w: Vec<f64> = want.f32().iter().map(|&x| x as f64).collect();
            compare_values(what, &g, &w, t)
        }
    }
}

#[track_caller]
fn compare_bits(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.bytes.len(), want.bytes.len(), "{what}: lengths differ");
    if got.bytes != want.bytes {
        let es = got.dtype.size_bytes();
        let differ: Vec<usize> = got
            .bytes
            .chunks(es)
            .zip(want.bytes.chunks(es))
            .enumerate()
            .filter_map(|(i, (a, b))| (a != b).then_some(i))
            .collect();
        let (i, bad) = (differ[0], differ.len());
        let (g, w) = (got.f32(), want.f32());
        panic!(
            "{what}: {bad} of {} elements differ in their bits; first at {i}: {:?} ({}) vs {:?} ({}) (seed {})",
            got.len(),
            &got.bytes[i * es..(i + 1) * es],
            g[i],
            &want.bytes[i * es..(i + 1) * es],
            w[i],
            base_seed()
        );
    }
}

/// `|got − want| ≤ tol · (|want| + rms(want))` element-wise, NaN to NaN, ∞ to the same ∞.
#[track_caller]
pub fn compare_values(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let finite: Vec<f64> = want.iter().copied().filter(|x| x.is_finite()).collect();
    let rms = (finite.iter().map(|x| x * x).sum::<f64>() / finite.len().max(1) as f64).sqrt();
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() || w.is_infinite() || g.is_nan() || g.is_infinite() {
            let same = (g.is_nan() && w.is_nan()) || g == w;
            assert!(
                same,
                "{what}: element {i} is {g}, the oracle's {w} (seed {})",
                base_seed()
            );
            continue;
        }
        let err = (g - w).abs() / (w.abs() + rms).max(f64::MIN_POSITIVE);
        if err > worst.0 {
            worst = (err, i);
        }
    }
    let (err, i) = worst;
    assert!(
        err <= tol,
        "{what}: relative error {err:.3e} > {tol:.1e} at element {i}: got {} vs {} (rms {rms:.3e}, seed {})",
        got[i],
        want[i],
        base_seed()
    );
}

/// The float dtypes an activation may be stored in.
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
/// The 16-bit activation dtypes (bf16 and fp8 recipes use bf16, fp16 recipes f16).
pub const HALVES: [DType; 2] = [DType::F16, DType::BF16];
/// The FP8 dtypes of both families (OCP on sm_89+/gfx950, FNUZ on gfx942).
pub const FP8S: [DType; 4] = [
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];
/// Every float dtype: the activation dtypes and the FP8 ones (what `cast` converts between).
pub const FLOATS_AND_FP8: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];

#[cfg(test)]
mod digest_tests {
    use super::*;

    #[test]
    fn digests_key_outputs_by_the_cpu_result_and_count_repeats() {
        let path = std::env::temp_dir().join(format!("duet-digests-{}.tsv", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let t = |b: &[u8]| Tensor {
            name: "y".into(),
            dtype: DType::F32,
            bytes: b.to_vec(),
        };
        append_digest(&path, "hip", "case_a", &t(&[1, 2, 3, 4]), &t(&[1, 2, 3, 4]));
        append_digest(&path, "hip", "case_a", &t(&[1, 2, 3, 5]), &t(&[1, 2, 3, 4]));
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
        assert_eq!(rows.len(), 2, "{text}");
        let cpu = format!("{:016x}", fnv64(&[1, 2, 3, 4]));
        assert_eq!(rows[0][..4], ["case_a", "y", cpu.as_str(), "1"]);
        assert_eq!(
            rows[1][3], "2",
            "the second output with the same CPU result counts on"
        );
        assert_eq!((rows[0][8], rows[1][8]), ("true", "false"));
        assert_ne!(rows[0][7], rows[1][7]);
    }
}
