//! `embedding_backward` on the GPU, bit for bit.
//!
//! The token gradient must follow one summation order: for every token, its `dout` rows added in
//! ascending position order to a zeroed f32 accumulator, which is then added to `dwte` once.
//! Checked two ways: against the CPU backend (which sums in position order too, straight into
//! the row, so the bits agree when `dwte` starts at zero) and against a host model of that
//! order with a nonzero start. Shapes cover one radix pass (vocab 96, 300 with two passes),
//! two passes (vocab 50257), one and several sort tiles (n = 8192, 16384, 20000), even and odd
//! `c`, hot tokens with long runs, and out-of-range ids (no contribution, error bit set).
//!
//! Without a usable CUDA device every test prints `SKIP <test>: <reason>` and passes.

use duet_cpu::CpuDevice;
use duet_cuda::CudaDevice;
use duet_device::{DType, Device, DeviceError, DeviceExt};
use half::bf16;
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

/// A device of its own, for tests that read the deferred error word.
fn own_gpu(test: &str) -> Option<CudaDevice> {
    gpu(test)?;
    Some(CudaDevice::new(0).expect("a second device on the same GPU"))
}

fn cpu() -> &'static CpuDevice {
    static DEV: OnceLock<CpuDevice> = OnceLock::new();
    DEV.get_or_init(|| CpuDevice::new(None).expect("cpu device"))
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
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Tokens with repeats: a quarter from 5 hot ids, the rest uniform over the vocabulary.
fn tokens(r: &mut Rng, n: usize, vocab: usize) -> Vec<i32> {
    let hot: Vec<usize> = (0..5).map(|_| r.below(vocab)).collect();
    (0..n)
        .map(|_| {
            if r.below(4) == 0 {
                hot[r.below(hot.len())] as i32
            } else {
                r.below(vocab) as i32
            }
        })
        .collect()
}

/// The reference order: dwte[tok] += (0 + dout[p0] + dout[p1] + ...) over the token's
/// positions p0 < p1 < ... in f32; out-of-range ids are skipped.
fn reference(toks: &[i32], dout: &[f32], dwte: &mut [f32], c: usize) {
    let vocab = dwte.len() / c;
    let mut acc: Vec<Option<Vec<f32>>> = vec![None; vocab];
    for (p, &tok) in toks.iter().enumerate() {
        if tok < 0 || tok as usize >= vocab {
            continue;
        }
        let a = acc[tok as usize].get_or_insert_with(|| vec![0.0; c]);
        for (a, &g) in a.iter_mut().zip(&dout[p * c..(p + 1) * c]) {
            *a += g;
        }
    }
    for (v, a) in acc.iter().enumerate() {
        if let Some(a) = a {
            for (w, &a) in dwte[v * c..(v + 1) * c].iter_mut().zip(a) {
                *w += a;
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Index and values of the first differing element, for failure messages.
fn first_diff(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x.to_bits() != y.to_bits())
        .map(|(i, (&x, &y))| (i, x, y))
}

fn assert_bits(what: &str, want: &[f32], got: &[f32]) {
    assert_eq!(want.len(), got.len(), "{what}: length");
    if bits(want) != bits(got) {
        let (i, x, y) = first_diff(want, got).unwrap();
        panic!(
            "{what}: element {i}: want {x:e} ({:#x}), got {y:e} ({:#x})",
            x.to_bits(),
            y.to_bits()
        );
    }
}

fn close(what: &str, want: &[f32], got: &[f32], tol: f32) {
    assert_eq!(want.len(), got.len(), "{what}: length");
    for (i, (&x, &y)) in want.iter().zip(got).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + x.abs()),
            "{what}: element {i}: want {x}, got {y}"
        );
    }
}

/// (b, t, vocab) shapes: n = b·t keys.
const SHAPES: &[(usize, usize, usize)] = &[
    (32, 256, 96),
    (32, 256, 50257),
    (16, 1024, 50257),
    (8, 2500, 96),
    (8, 2500, 300),
    (4, 5000, 50257),
    (2, 7, 3),
];

#[test]
fn f32_matches_cpu_bit_for_bit() {
    let Some(g) = gpu("f32_matches_cpu_bit_for_bit") else {
        return;
    };
    let mut r = Rng(0x5eed_0001);
    for &(b, t, vocab) in SHAPES {
        let n = b * t;
        for c in [768usize, 129, 64, 1] {
            if vocab * c > 50257 * 129 && n != 8192 {
                continue; // keep the big tables to the benchmark shape
            }
            let what = format!("f32 b{b} t{t} v{vocab} c{c}");
            let toks = tokens(&mut r, n, vocab);
            let dout = r.vec(n * c, -1.0, 1.0);
            let zeros = vec![0.0f32; vocab * c];
            let wpe0 = r.vec(t * c, -0.1, 0.1);

            let ct = cpu().upload_new(&toks).unwrap();
            let cd = cpu().upload_new(&dout).unwrap();
            let mut cw = cpu().upload_new(&zeros).unwrap();
            let mut cp = cpu().upload_new(&wpe0).unwrap();
            cpu()
                .embedding_backward(&ct, &cd, &mut cw, &mut cp, b, t, c)
                .unwrap();

            let gt = g.upload_new(&toks).unwrap();
            let gd = g.upload_new(&dout).unwrap();
            let mut gw = g.upload_new(&zeros).unwrap();
            let mut gp = g.upload_new(&wpe0).unwrap();
            g.embedding_backward(&gt, &gd, &mut gw, &mut gp, b, t, c)
                .unwrap();
            let got: Vec<f32> = g.download(&gw).unwrap();
            let want: Vec<f32> = cpu().download(&cw).unwrap();
            assert_bits(&format!("{what} dwte vs cpu"), &want, &got);
            close(
                &format!("{what} dwpe vs cpu"),
                &cpu().download::<f32>(&cp).unwrap(),
                &g.download::<f32>(&gp).unwrap(),
                1e-5,
            );

            // A nonzero start: the host model of the order (sum, then one update).
            let w0 = r.vec(vocab * c, -0.1, 0.1);
            let mut want = w0.clone();
            reference(&toks, &dout, &mut want, c);
            let mut gw = g.upload_new(&w0).unwrap();
            g.embedding_backward(&gt, &gd, &mut gw, &mut gp, b, t, c)
                .unwrap();
            let got: Vec<f32> = g.download(&gw).unwrap();
            assert_bits(&format!("{what} dwte vs reference order"), &want, &got);

            // Deterministic: again from the same start, the same bits.
            let mut gw2 = g.upload_new(&w0).unwrap();
            g.embedding_backward(&gt, &gd, &mut gw2, &mut gp, b, t, c)
                .unwrap();
            assert_bits(
                &format!("{what} repeat"),
                &got,
                &g.download::<f32>(&gw2).unwrap(),
            );
        }
    }
    g.synchronize().unwrap();
}

#[test]
fn bf16_dout_matches_reference_order() {
    let Some(g) = gpu("bf16_dout_matches_reference_order") else {
        return;
    };
    let mut r = Rng(0x5eed_0002);
    for &(b, t, vocab, c) in &[
        (32usize, 256usize, 96usize, 768usize),
        (32, 256, 50257, 768),
        (8, 2500, 300, 130),
        (4, 5000, 50257, 63),
    ] {
        let n = b * t;
        let toks = tokens(&mut r, n, vocab);
        let dout: Vec<f32> = r
            .vec(n * c, -1.0, 1.0)
            .into_iter()
            .map(|x| bf16::from_f32(x).to_f32())
            .collect();
        let dout_h: Vec<bf16> = dout.iter().map(|&x| bf16::from_f32(x)).collect();
        let gt = g.upload_new(&toks).unwrap();
        let gd = g.upload_new(&dout_h).unwrap();
        let mut gp = g.alloc(DType::F32, t * c).unwrap();
        g.fill(&mut gp, 0.0).unwrap();

        // f32 table.
        let w0 = r.vec(vocab * c, -0.1, 0.1);
        let mut want = w0.clone();
        reference(&toks, &dout, &mut want, c);
        let mut gw = g.upload_new(&w0).unwrap();
        g.embedding_backward(&gt, &gd, &mut gw, &mut gp, b, t, c)
            .unwrap();
        let what = format!("bf16/f32 b{b} t{t} v{vocab} c{c}");
        assert_bits(&what, &want, &g.download::<f32>(&gw).unwrap());

        // bf16 table: the same f32 sum, one rounding at the end.
        let w0h: Vec<bf16> = w0.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut want: Vec<f32> = w0h.iter().map(|x| x.to_f32()).collect();
        reference(&toks, &dout, &mut want, c);
        let want: Vec<f32> = want.iter().map(|&w| bf16::from_f32(w).to_f32()).collect();
        let mut gp16 = g.alloc(DType::BF16, t * c).unwrap();
        g.fill(&mut gp16, 0.0).unwrap();
        let mut gw = g.upload_new(&w0h).unwrap();
        g.embedding_backward(&gt, &gd, &mut gw, &mut gp16, b, t, c)
            .unwrap();
        let got: Vec<f32> = g
            .download::<bf16>(&gw)
            .unwrap()
            .iter()
            .map(|x| x.to_f32())
            .collect();
        assert_bits(&format!("bf16/bf16 b{b} t{t} v{vocab} c{c}"), &want, &got);
    }
    g.synchronize().unwrap();
}

#[test]
fn one_hot_token_long_run() {
    let Some(g) = gpu("one_hot_token_long_run") else {
        return;
    };
    let mut r = Rng(0x5eed_0003);
    for &(n, vocab, c) in &[(8192usize, 96usize, 768usize), (20000, 50257, 96)] {
        let toks = vec![(vocab / 2) as i32; n];
        let dout = r.vec(n * c, -1.0, 1.0);
        let w0 = r.vec(vocab * c, -0.1, 0.1);
        let mut want = w0.clone();
        reference(&toks, &dout, &mut want, c);
        let gt = g.upload_new(&toks).unwrap();
        let gd = g.upload_new(&dout).unwrap();
        let mut gw = g.upload_new(&w0).unwrap();
        let mut gp = g.alloc(DType::F32, n * c).unwrap();
        g.fill(&mut gp, 0.0).unwrap();
        g.embedding_backward(&gt, &gd, &mut gw, &mut gp, 1, n, c)
            .unwrap();
        assert_bits(
            &format!("one token n{n} v{vocab} c{c}"),
            &want,
            &g.download::<f32>(&gw).unwrap(),
        );
    }
    g.synchronize().unwrap();
}

#[test]
fn out_of_range_tokens_are_skipped_and_reported() {
    let Some(g) = own_gpu("out_of_range_tokens_are_skipped_and_reported") else {
        return;
    };
    let mut r = Rng(0x5eed_0004);
    for &(b, t, vocab, c) in &[
        (32usize, 256usize, 96usize, 768usize),
        (32, 256, 50257, 64),
        (4, 5000, 96, 33),
        (4, 5000, 50257, 32),
        (1, 4, 8, 8),
    ] {
        let n = b * t;
        let mut toks = tokens(&mut r, n, vocab);
        let bad = [-1, vocab as i32, vocab as i32 + 1000, i32::MIN, i32::MAX];
        for (k, &x) in bad.iter().enumerate() {
            toks[(k * 7919 + 3) % n] = x;
        }
        let dout = r.vec(n * c, -1.0, 1.0);
        let w0 = r.vec(vocab * c, -0.1, 0.1);
        let mut want = w0.clone();
        reference(&toks, &dout, &mut want, c);
        let gt = g.upload_new(&toks).unwrap();
        let gd = g.upload_new(&dout).unwrap();
        let mut gw = g.upload_new(&w0).unwrap();
        let mut gp = g.alloc(DType::F32, t * c).unwrap();
        g.fill(&mut gp, 0.0).unwrap();
        g.embedding_backward(&gt, &gd, &mut gw, &mut gp, b, t, c)
            .unwrap();
        match g.synchronize() {
            Err(DeviceError::InvalidArgument(msg)) => assert!(msg.contains("token"), "{msg}"),
            other => panic!("expected a deferred InvalidArgument, got {other:?}"),
        }
        g.synchronize().unwrap();
        let got: Vec<f32> = g.download(&gw).unwrap();
        assert_bits(&format!("bad ids b{b} t{t} v{vocab} c{c}"), &want, &got);
    }
    // Every id out of range: nothing changes, the error is reported.
    let (n, vocab, c) = (9000usize, 96usize, 16usize);
    let toks: Vec<i32> = (0..n).map(|i| if i % 2 == 0 { -5 } else { 96 }).collect();
    let w0 = r.vec(vocab * c, -0.1, 0.1);
    let gt = g.upload_new(&toks).unwrap();
    let gd = g.upload_new(&r.vec(n * c, -1.0, 1.0)).unwrap();
    let mut gw = g.upload_new(&w0).unwrap();
    let mut gp = g.alloc(DType::F32, n * c).unwrap();
    g.fill(&mut gp, 0.0).unwrap();
    g.embedding_backward(&gt, &gd, &mut gw, &mut gp, 1, n, c)
        .unwrap();
    assert!(matches!(
        g.synchronize(),
        Err(DeviceError::InvalidArgument(_))
    ));
    assert_bits("all ids bad", &w0, &g.download::<f32>(&gw).unwrap());
    g.synchronize().unwrap();
}
