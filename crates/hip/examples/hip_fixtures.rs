//! Writes the inputs and the CPU backend's outputs for every kernel in `kernels-hip/`, for the
//! HIP-on-NVIDIA harness (scripts/hip-nvidia.sh kernels-vs-cpu, scripts/hip/harness.cpp).
//!
//! `cargo run -p duet-hip --example hip_fixtures -- OUT_FILE`
//!
//! Every case runs one `Device` op on the reference CPU backend with seeded random inputs. The file
//! holds, per case: the op, the kernel variant (dtype suffix), integer and float parameters, and
//! named tensors, each marked as input or as the CPU's expected output. Format (little-endian):
//! `b"DUETFIX1"`, u32 case count; per case: str op, str variant, u32 n + i64 ints, u32 n + f32
//! floats, u32 n + tensors (str name, u8 dtype code in `DType` order with i32 = 7, u8 role
//! 0 = input / 1 = expected, u64 byte count, bytes); a str is a u32 length and UTF-8 bytes.

use duet_cpu::CpuDevice;
use duet_device::{
    AdamWStep, AdamWUpdate, Add, AddAssign, BiasAdd, BiasBackward, Buffer, CrossEntropy, DType,
    DeviceExt, EmbeddingBackward, EmbeddingForward, GeluBackward, GeluForward, LayerNormBackward,
    LayerNormForward, MergeHeads, Result, Runtime, Scale, SoftmaxCausalBackward,
    SoftmaxCausalForward, SplitHeads, SplitHeadsBackward, SumSquares,
};
use std::io::Write;

const FLOATS: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
    DType::F8E4M3Fnuz,
    DType::F8E5M2Fnuz,
];
const ACTS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn code(d: DType) -> u8 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F8E4M3 => 3,
        DType::F8E5M2 => 4,
        DType::F8E4M3Fnuz => 5,
        DType::F8E5M2Fnuz => 6,
        DType::I32 => 7,
        DType::U8 => 8,
    }
}

/// Activation dtype with a parameter dtype that is the same or f32 (the kernels' variants).
fn act_and_wide() -> Vec<(DType, DType)> {
    let mut v = Vec::new();
    for a in ACTS {
        v.push((a, a));
        if a != DType::F32 {
            v.push((a, DType::F32));
        }
    }
    v
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (self.uniform().max(1e-7), self.uniform());
                (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos() * std
            })
            .collect()
    }
}

struct Case {
    op: String,
    variant: String,
    ints: Vec<i64>,
    floats: Vec<f32>,
    tensors: Vec<(String, DType, u8, Vec<u8>)>,
}

struct Gen {
    dev: CpuDevice,
    rng: Rng,
    cases: Vec<Case>,
}

type Buf = <CpuDevice as Runtime>::Buffer;

impl Gen {
    fn buf(&mut self, dtype: DType, n: usize, std: f32) -> Result<Buf> {
        let vals = self.rng.vec(n, std);
        self.upload_as(dtype, &vals)
    }
    fn upload_as(&self, dtype: DType, vals: &[f32]) -> Result<Buf> {
        let f = self.dev.upload_new(vals)?;
        let mut out = self.dev.alloc(dtype, vals.len())?;
        self.dev.cast(&f, &mut out, 1.0)?;
        Ok(out)
    }
    fn bytes(&self, b: &Buf) -> Result<Vec<u8>> {
        self.dev.download_bytes(b, 0, b.len())
    }
    fn case(&mut self, op: &str, variant: String, ints: Vec<i64>, floats: Vec<f32>) -> usize {
        self.cases.push(Case {
            op: op.into(),
            variant,
            ints,
            floats,
            tensors: Vec::new(),
        });
        self.cases.len() - 1
    }
    fn put(&mut self, case: usize, name: &str, role: u8, b: &Buf) -> Result<()> {
        let bytes = self.bytes(b)?;
        self.cases[case]
            .tensors
            .push((name.into(), b.dtype(), role, bytes));
        Ok(())
    }
}

fn main() -> Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "hip_fixtures.bin".into());
    let mut g = Gen {
        dev: CpuDevice::new(Some(2))?,
        rng: Rng(0x9e37_79b9_7f4a_7c15),
        cases: Vec::new(),
    };
    let (b, t, nh, hs) = (2usize, 33usize, 4usize, 24usize);
    let c = nh * hs;
    let n = b * t;

    // cast: every pair, on values that cover normals, subnormals, ties, saturation and specials.
    let mut special = g.rng.vec(2000, 4.0);
    special.extend((0..600).map(|i| (i as f32 - 300.0) * 1.5f32.powi(i % 40 - 20)));
    special.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        448.0,
        449.0,
        240.0,
        241.0,
        57344.0,
        61440.0,
        1e30,
        -1e30,
        1.0625,
        2f32.powi(-9),
        2f32.powi(-10),
        2f32.powi(-17),
        1e-40,
    ]);
    let src32 = g.dev.upload_new(&special)?;
    for s in FLOATS {
        let mut src = g.dev.alloc(s, special.len())?;
        g.dev.cast(&src32, &mut src, 1.0)?;
        for d in FLOATS {
            let scale = 0.75f32;
            let mut dst = g.dev.alloc(d, special.len())?;
            g.dev.cast(&src, &mut dst, scale)?;
            let k = g.case(
                "cast",
                format!("{}_{}", s.name(), d.name()),
                vec![special.len() as i64],
                vec![scale],
            );
            g.put(k, "src", 0, &src)?;
            g.put(k, "dst", 1, &dst)?;
        }
    }

    for a in ACTS {
        let len = 1000;
        // scale
        let x = g.buf(a, len, 1.0)?;
        let mut y = g.buf(a, len, 1.0)?;
        let mut x2 = g.buf(a, len, 1.0)?;
        let k = g.case("scale", a.name().into(), vec![len as i64], vec![-1.7]);
        g.put(k, "x", 0, &x2)?;
        g.dev.exec(Scale {
            x: &mut x2,
            alpha: -1.7,
        })?;
        g.put(k, "x", 1, &x2)?;
        // add
        let mut out = g.dev.alloc(a, len)?;
        g.dev.exec(Add {
            a: &x,
            b: &y,
            out: &mut out,
        })?;
        let k = g.case("add", a.name().into(), vec![len as i64], vec![]);
        g.put(k, "a", 0, &x)?;
        g.put(k, "b", 0, &y)?;
        g.put(k, "out", 1, &out)?;
        // add_assign
        let k = g.case("add_assign", a.name().into(), vec![len as i64], vec![]);
        g.put(k, "dst", 0, &y)?;
        g.put(k, "src", 0, &x)?;
        g.dev.exec(AddAssign {
            dst: &mut y,
            src: &x,
        })?;
        g.put(k, "dst", 1, &y)?;
        // gelu
        let xg = g.buf(a, len, 2.0)?;
        let mut o = g.dev.alloc(a, len)?;
        g.dev.exec(GeluForward {
            x: &xg,
            out: &mut o,
        })?;
        let k = g.case("gelu_forward", a.name().into(), vec![len as i64], vec![]);
        g.put(k, "x", 0, &xg)?;
        g.put(k, "out", 1, &o)?;
        let dout = g.buf(a, len, 1.0)?;
        let mut dx = g.dev.alloc(a, len)?;
        g.dev.exec(GeluBackward {
            x: &xg,
            dout: &dout,
            dx: &mut dx,
        })?;
        let k = g.case("gelu_backward", a.name().into(), vec![len as i64], vec![]);
        g.put(k, "x", 0, &xg)?;
        g.put(k, "dout", 0, &dout)?;
        g.put(k, "dx", 1, &dx)?;

        // attention permutations
        let qkv = g.buf(a, b * t * 3 * c, 1.0)?;
        let mut q = g.dev.alloc(a, b * t * c)?;
        let mut kk = g.dev.alloc(a, b * t * c)?;
        let mut v = g.dev.alloc(a, b * t * c)?;
        g.dev.exec(SplitHeads {
            qkv: &qkv,
            q: &mut q,
            k: &mut kk,
            v: &mut v,
            b,
            t,
            nh,
            hs,
        })?;
        let dims = vec![b as i64, t as i64, nh as i64, hs as i64];
        let k = g.case("split_heads", a.name().into(), dims.clone(), vec![]);
        g.put(k, "qkv", 0, &qkv)?;
        g.put(k, "q", 1, &q)?;
        g.put(k, "k", 1, &kk)?;
        g.put(k, "v", 1, &v)?;
        let mut dqkv = g.dev.alloc(a, b * t * 3 * c)?;
        g.dev.exec(SplitHeadsBackward {
            dq: &q,
            dk: &kk,
            dv: &v,
            dqkv: &mut dqkv,
            b,
            t,
            nh,
            hs,
        })?;
        let k = g.case(
            "split_heads_backward",
            a.name().into(),
            dims.clone(),
            vec![],
        );
        g.put(k, "dq", 0, &q)?;
        g.put(k, "dk", 0, &kk)?;
        g.put(k, "dv", 0, &v)?;
        g.put(k, "dqkv", 1, &dqkv)?;
        for backward in [false, true] {
            let mut o = g.dev.alloc(a, b * t * c)?;
            g.dev.exec(MergeHeads {
                y: &q,
                out: &mut o,
                b,
                t,
                nh,
                hs,
                backward,
            })?;
            let op = if backward {
                "merge_heads_backward"
            } else {
                "merge_heads"
            };
            let k = g.case(op, a.name().into(), dims.clone(), vec![]);
            g.put(k, "in", 0, &q)?;
            g.put(k, "out", 1, &o)?;
        }
        // causal softmax
        let rows = b * nh;
        let scale = 1.0 / (hs as f32).sqrt();
        let scores = g.buf(a, rows * t * t, 3.0)?;
        let mut probs = g.dev.alloc(a, rows * t * t)?;
        g.dev.exec(SoftmaxCausalForward {
            scores: &scores,
            probs: &mut probs,
            batch: rows,
            t,
            scale,
        })?;
        let k = g.case(
            "softmax_causal_forward",
            a.name().into(),
            vec![rows as i64, t as i64],
            vec![scale],
        );
        g.put(k, "scores", 0, &scores)?;
        g.put(k, "probs", 1, &probs)?;
        let dprobs = g.buf(a, rows * t * t, 1.0)?;
        let mut ds = g.dev.alloc(a, rows * t * t)?;
        g.dev.exec(SoftmaxCausalBackward {
            probs: &probs,
            dprobs: &dprobs,
            dscores: &mut ds,
            batch: rows,
            t,
            scale,
        })?;
        let k = g.case(
            "softmax_causal_backward",
            a.name().into(),
            vec![rows as i64, t as i64],
            vec![scale],
        );
        g.put(k, "probs", 0, &probs)?;
        g.put(k, "dprobs", 0, &dprobs)?;
        g.put(k, "dscores", 1, &ds)?;
        // cross-entropy (some ignored targets)
        let vocab = 1000;
        let logits = g.buf(a, n * vocab, 2.0)?;
        let targets: Vec<i32> = (0..n)
            .map(|i| {
                if i % 7 == 3 {
                    -1
                } else {
                    (g.rng.next() % vocab as u64) as i32
                }
            })
            .collect();
        let tg = g.dev.upload_new(&targets)?;
        let mut losses = g.dev.alloc(DType::F32, n)?;
        let mut dl = g.dev.alloc(a, n * vocab)?;
        g.dev.exec(CrossEntropy {
            logits: &logits,
            targets: &tg,
            losses: &mut losses,
            dlogits: Some(&mut dl),
            n,
            v: vocab,
            grad_scale: 0.5,
        })?;
        let k = g.case(
            "cross_entropy",
            a.name().into(),
            vec![n as i64, vocab as i64],
            vec![0.5],
        );
        g.put(k, "logits", 0, &logits)?;
        g.put(k, "targets", 0, &tg)?;
        g.put(k, "losses", 1, &losses)?;
        g.put(k, "dlogits", 1, &dl)?;
        // AdamW with every copy dtype (and none)
        let len = 777;
        for copy in std::iter::once(None).chain(FLOATS.iter().map(|&d| Some(d))) {
            let param0 = g.buf(DType::F32, len, 1.0)?;
            let grad = g.buf(a, len, 0.1)?;
            let m0 = g.buf(DType::F32, len, 0.01)?;
            let v0_raw = g.rng.vec(len, 0.01);
            let v0: Vec<f32> = v0_raw.iter().map(|x| x * x).collect();
            let v0 = g.dev.upload_new(&v0)?;
            let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, 3);
            let step = AdamWStep {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                bias_correction1: bc1,
                bias_correction2: bc2,
                grad_scale: 0.5,
            };
            let variant = format!("{}_{}", a.name(), copy.map_or("none", |d| d.name()));
            let k = g.case(
                "adamw",
                variant,
                vec![len as i64],
                vec![
                    step.lr,
                    step.beta1,
                    step.beta2,
                    step.eps,
                    step.weight_decay,
                    bc1,
                    bc2,
                    step.grad_scale,
                ],
            );
            g.put(k, "param", 0, &param0)?;
            g.put(k, "grad", 0, &grad)?;
            g.put(k, "m", 0, &m0)?;
            g.put(k, "v", 0, &v0)?;
            let (mut p, mut m, mut v) = (param0, m0, v0);
            let mut cbuf = match copy {
                Some(d) => Some(g.dev.alloc(d, len)?),
                None => None,
            };
            g.dev.exec(AdamWUpdate {
                param: &mut p,
                grad: &grad,
                m: &mut m,
                v: &mut v,
                step: &step,
                param_copy: cbuf.as_mut(),
            })?;
            g.put(k, "param", 1, &p)?;
            g.put(k, "m", 1, &m)?;
            g.put(k, "v", 1, &v)?;
            if let Some(cb) = &cbuf {
                g.put(k, "copy", 1, cb)?;
            }
        }
    }

    // sum_squares over every float dtype
    for d in FLOATS {
        let len = 100_000;
        let x = g.buf(d, len, 1.0)?;
        let mut out = g.dev.upload_new(&[0.5f32, 2.0, -1.0])?;
        let k = g.case("sum_squares", d.name().into(), vec![len as i64, 1], vec![]);
        g.put(k, "x", 0, &x)?;
        g.put(k, "out", 0, &out)?;
        g.dev.exec(SumSquares {
            x: &x,
            out: &mut out,
            slot: 1,
        })?;
        g.put(k, "out", 1, &out)?;
    }

    // Ops with an activation dtype and a parameter dtype.
    for (a, p) in act_and_wide() {
        let variant = format!("{}_{}", a.name(), p.name());
        let rows = n;
        // bias_add / bias_backward
        let mut x = g.buf(a, rows * c, 1.0)?;
        let bias = g.buf(p, c, 1.0)?;
        let k = g.case(
            "bias_add",
            variant.clone(),
            vec![rows as i64, c as i64],
            vec![],
        );
        g.put(k, "x", 0, &x)?;
        g.put(k, "bias", 0, &bias)?;
        g.dev.exec(BiasAdd {
            x: &mut x,
            bias: &bias,
            rows,
            c,
        })?;
        g.put(k, "x", 1, &x)?;
        let mut dbias = g.buf(p, c, 1.0)?;
        let k = g.case(
            "bias_backward",
            variant.clone(),
            vec![rows as i64, c as i64],
            vec![],
        );
        g.put(k, "dout", 0, &x)?;
        g.put(k, "dbias", 0, &dbias)?;
        g.dev.exec(BiasBackward {
            dout: &x,
            dbias: &mut dbias,
            rows,
            c,
        })?;
        g.put(k, "dbias", 1, &dbias)?;
        // layernorm
        let xl = g.buf(a, rows * c, 2.0)?;
        let gamma = g.buf(p, c, 1.0)?;
        let beta = g.buf(p, c, 1.0)?;
        let mut out = g.dev.alloc(a, rows * c)?;
        let mut mean = g.dev.alloc(DType::F32, rows)?;
        let mut rstd = g.dev.alloc(DType::F32, rows)?;
        g.dev.exec(LayerNormForward {
            x: &xl,
            gamma: &gamma,
            beta: &beta,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n: rows,
            c,
            eps: 1e-5,
        })?;
        let k = g.case(
            "layernorm_forward",
            variant.clone(),
            vec![rows as i64, c as i64],
            vec![1e-5],
        );
        g.put(k, "x", 0, &xl)?;
        g.put(k, "gamma", 0, &gamma)?;
        g.put(k, "beta", 0, &beta)?;
        g.put(k, "out", 1, &out)?;
        g.put(k, "mean", 1, &mean)?;
        g.put(k, "rstd", 1, &rstd)?;
        let dout = g.buf(a, rows * c, 1.0)?;
        let mut dx = g.buf(a, rows * c, 0.5)?;
        let mut dgamma = g.buf(p, c, 0.5)?;
        let mut dbeta = g.buf(p, c, 0.5)?;
        let k = g.case(
            "layernorm_backward",
            variant.clone(),
            vec![rows as i64, c as i64],
            vec![],
        );
        for (name, buf) in [
            ("dout", &dout),
            ("x", &xl),
            ("gamma", &gamma),
            ("mean", &mean),
            ("rstd", &rstd),
            ("dx", &dx),
            ("dgamma", &dgamma),
            ("dbeta", &dbeta),
        ] {
            g.put(k, name, 0, buf)?;
        }
        g.dev.exec(LayerNormBackward {
            dout: &dout,
            x: &xl,
            gamma: &gamma,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dgamma: &mut dgamma,
            dbeta: &mut dbeta,
            n: rows,
            c,
        })?;
        g.put(k, "dx", 1, &dx)?;
        g.put(k, "dgamma", 1, &dgamma)?;
        g.put(k, "dbeta", 1, &dbeta)?;
        // embedding (tokens repeat so the backward accumulates several rows per token)
        let vocab = 50;
        let tokens: Vec<i32> = (0..n)
            .map(|_| (g.rng.next() % vocab as u64) as i32)
            .collect();
        let tk = g.dev.upload_new(&tokens)?;
        let wte = g.buf(p, vocab * c, 1.0)?;
        let wpe = g.buf(p, t * c, 1.0)?;
        let mut eo = g.dev.alloc(a, n * c)?;
        g.dev.exec(EmbeddingForward {
            tokens: &tk,
            wte: &wte,
            wpe: &wpe,
            out: &mut eo,
            b,
            t,
            c,
        })?;
        let dims = vec![b as i64, t as i64, c as i64, vocab as i64];
        let k = g.case("embedding_forward", variant.clone(), dims.clone(), vec![]);
        g.put(k, "tokens", 0, &tk)?;
        g.put(k, "wte", 0, &wte)?;
        g.put(k, "wpe", 0, &wpe)?;
        g.put(k, "out", 1, &eo)?;
        let mut dwte = g.buf(p, vocab * c, 0.5)?;
        let mut dwpe = g.buf(p, t * c, 0.5)?;
        let k = g.case("embedding_backward", variant.clone(), dims, vec![]);
        g.put(k, "tokens", 0, &tk)?;
        g.put(k, "dout", 0, &eo)?;
        g.put(k, "dwte", 0, &dwte)?;
        g.put(k, "dwpe", 0, &dwpe)?;
        g.dev.exec(EmbeddingBackward {
            tokens: &tk,
            dout: &eo,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            b,
            t,
            c,
        })?;
        g.put(k, "dwte", 1, &dwte)?;
        g.put(k, "dwpe", 1, &dwpe)?;
    }

    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).map_err(io)?);
    let mut w = |bytes: &[u8]| f.write_all(bytes).map_err(io);
    w(b"DUETFIX1")?;
    w(&(g.cases.len() as u32).to_le_bytes())?;
    let s = |s: &str| {
        let mut v = (s.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    };
    for case in &g.cases {
        w(&s(&case.op))?;
        w(&s(&case.variant))?;
        w(&(case.ints.len() as u32).to_le_bytes())?;
        for i in &case.ints {
            w(&i.to_le_bytes())?;
        }
        w(&(case.floats.len() as u32).to_le_bytes())?;
        for x in &case.floats {
            w(&x.to_le_bytes())?;
        }
        w(&(case.tensors.len() as u32).to_le_bytes())?;
        for (name, dtype, role, bytes) in &case.tensors {
            w(&s(name))?;
            w(&[code(*dtype), *role])?;
            w(&(bytes.len() as u64).to_le_bytes())?;
            w(bytes)?;
        }
    }
    f.flush().map_err(io)?;
    println!("wrote {} cases to {path}", g.cases.len());
    Ok(())
}

fn io(e: std::io::Error) -> duet_device::DeviceError {
    duet_device::DeviceError::InvalidArgument(format!("writing fixtures: {e}"))
}
