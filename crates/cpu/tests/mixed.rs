//! Half-precision storage: an op on f16/bf16 buffers must compute exactly what it computes on
//! f32 buffers holding the same (rounded) values, then round each output once. So the
//! half-precision result must equal the rounded f32 result bit for bit.

mod common;

use common::*;
use duet_cpu::{CpuBuffer, CpuDevice};
use duet_device::{
    BiasAdd, BiasBackward, CrossEntropy, DType, EmbeddingBackward, EmbeddingForward, GeluBackward,
    GeluForward, LayerNormBackward, LayerNormForward, Runtime, SoftmaxCausalBackward,
    SoftmaxCausalForward,
};

const HALF: [DType; 2] = [DType::BF16, DType::F16];

/// Data already representable in `dtype`.
fn data(rng: &mut Rng, n: usize, scale: f32, dtype: DType) -> Vec<f32> {
    round_to(
        &rng.vec(n).iter().map(|v| v * scale).collect::<Vec<_>>(),
        dtype,
    )
}

#[track_caller]
fn same_as_rounded(what: &str, d: &CpuDevice, half: &CpuBuffer, full: &CpuBuffer, dtype: DType) {
    let got = down(d, half);
    let want = round_to(&down(d, full), dtype);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "{what} {dtype}[{i}]: {g} vs rounded f32 result {w}"
        );
    }
}

#[test]
fn elementwise_and_attention_ops() {
    let d = dev();
    for dtype in HALF {
        let mut rng = Rng::new(1);
        let n = 5000;
        let x = data(&mut rng, n, 4.0, dtype);
        let g = data(&mut rng, n, 1.0, dtype);
        let (xh, xf) = (up_as(&d, &x, dtype), up(&d, &x));
        let (gh, gf) = (up_as(&d, &g, dtype), up(&d, &g));

        let (mut oh, mut of) = (zeros(&d, dtype, n), zeros(&d, DType::F32, n));
        d.exec(GeluForward {
            x: &xh,
            out: &mut oh,
        })
        .unwrap();
        d.exec(GeluForward {
            x: &xf,
            out: &mut of,
        })
        .unwrap();
        same_as_rounded("gelu_forward", &d, &oh, &of, dtype);
        d.exec(GeluBackward {
            x: &xh,
            dout: &gh,
            dx: &mut oh,
        })
        .unwrap();
        d.exec(GeluBackward {
            x: &xf,
            dout: &gf,
            dx: &mut of,
        })
        .unwrap();
        same_as_rounded("gelu_backward", &d, &oh, &of, dtype);

        let (rows, t) = (5, 10);
        let s = data(&mut rng, rows * t * t, 3.0, dtype);
        let (mut ph, mut pf) = (zeros(&d, dtype, s.len()), zeros(&d, DType::F32, s.len()));
        d.exec(SoftmaxCausalForward {
            scores: &up_as(&d, &s, dtype),
            probs: &mut ph,
            batch: rows,
            t,
            scale: 0.3,
        })
        .unwrap();
        d.exec(SoftmaxCausalForward {
            scores: &up(&d, &s),
            probs: &mut pf,
            batch: rows,
            t,
            scale: 0.3,
        })
        .unwrap();
        same_as_rounded("softmax_forward", &d, &ph, &pf, dtype);
        // Backward from the same (rounded) probabilities.
        let p = down(&d, &ph);
        let dp = data(&mut rng, s.len(), 1.0, dtype);
        let (mut dsh, mut dsf) = (zeros(&d, dtype, s.len()), zeros(&d, DType::F32, s.len()));
        d.exec(SoftmaxCausalBackward {
            probs: &ph,
            dprobs: &up_as(&d, &dp, dtype),
            dscores: &mut dsh,
            batch: rows,
            t,
            scale: 0.3,
        })
        .unwrap();
        d.exec(SoftmaxCausalBackward {
            probs: &up(&d, &p),
            dprobs: &up(&d, &dp),
            dscores: &mut dsf,
            batch: rows,
            t,
            scale: 0.3,
        })
        .unwrap();
        same_as_rounded("softmax_backward", &d, &dsh, &dsf, dtype);

        let (rows, c) = (50, 100);
        let bias = data(&mut rng, c, 1.0, dtype);
        let (mut bh, mut bf) = (up_as(&d, &x, dtype), up(&d, &x));
        d.exec(BiasAdd {
            x: &mut bh,
            bias: &up_as(&d, &bias, dtype),
            rows,
            c,
        })
        .unwrap();
        d.exec(BiasAdd {
            x: &mut bf,
            bias: &up(&d, &bias),
            rows,
            c,
        })
        .unwrap();
        same_as_rounded("bias_add", &d, &bh, &bf, dtype);
        let (mut dbh, mut dbf) = (up_as(&d, &bias, dtype), up(&d, &bias));
        d.exec(BiasBackward {
            dout: &xh,
            dbias: &mut dbh,
            rows,
            c,
        })
        .unwrap();
        d.exec(BiasBackward {
            dout: &xf,
            dbias: &mut dbf,
            rows,
            c,
        })
        .unwrap();
        same_as_rounded("bias_backward", &d, &dbh, &dbf, dtype);
    }
}

#[test]
fn layernorm_embedding_and_loss() {
    let d = dev();
    for dtype in HALF {
        let mut rng = Rng::new(2);
        let (n, c) = (40, 48);
        let x = data(&mut rng, n * c, 2.0, dtype);
        let gm = data(&mut rng, c, 1.0, dtype);
        let bt = data(&mut rng, c, 1.0, dtype);
        let (xh, xf) = (up_as(&d, &x, dtype), up(&d, &x));
        let (gh, gf) = (up_as(&d, &gm, dtype), up(&d, &gm));
        let (mut oh, mut of) = (zeros(&d, dtype, n * c), zeros(&d, DType::F32, n * c));
        let mut mean = zeros(&d, DType::F32, n);
        let mut rstd = zeros(&d, DType::F32, n);
        let mut mean2 = zeros(&d, DType::F32, n);
        let mut rstd2 = zeros(&d, DType::F32, n);
        d.exec(LayerNormForward {
            x: &xh,
            gamma: &gh,
            beta: &up_as(&d, &bt, dtype),
            out: &mut oh,
            mean: &mut mean,
            rstd: &mut rstd,
            n,
            c,
            eps: 1e-5,
        })
        .unwrap();
        d.exec(LayerNormForward {
            x: &xf,
            gamma: &gf,
            beta: &up(&d, &bt),
            out: &mut of,
            mean: &mut mean2,
            rstd: &mut rstd2,
            n,
            c,
            eps: 1e-5,
        })
        .unwrap();
        same_as_rounded("layernorm_forward", &d, &oh, &of, dtype);
        assert_eq!(down(&d, &mean), down(&d, &mean2));
        assert_eq!(down(&d, &rstd), down(&d, &rstd2));

        let dout = data(&mut rng, n * c, 1.0, dtype);
        let init = data(&mut rng, n * c, 1.0, dtype);
        let ginit = data(&mut rng, c, 1.0, dtype);
        let (mut dxh, mut dxf) = (up_as(&d, &init, dtype), up(&d, &init));
        let (mut dgh, mut dgf) = (up_as(&d, &ginit, dtype), up(&d, &ginit));
        let (mut dbh, mut dbf) = (up_as(&d, &ginit, dtype), up(&d, &ginit));
        d.exec(LayerNormBackward {
            dout: &up_as(&d, &dout, dtype),
            x: &xh,
            gamma: &gh,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dxh,
            dgamma: &mut dgh,
            dbeta: &mut dbh,
            n,
            c,
        })
        .unwrap();
        d.exec(LayerNormBackward {
            dout: &up(&d, &dout),
            x: &xf,
            gamma: &gf,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dxf,
            dgamma: &mut dgf,
            dbeta: &mut dbf,
            n,
            c,
        })
        .unwrap();
        same_as_rounded("layernorm dx", &d, &dxh, &dxf, dtype);
        same_as_rounded("layernorm dgamma", &d, &dgh, &dgf, dtype);
        same_as_rounded("layernorm dbeta", &d, &dbh, &dbf, dtype);

        // Embedding: b·t = 40 rows of c, vocab 7.
        let (b, t, vocab) = (4, 10, 7);
        let tokens: Vec<i32> = (0..b * t).map(|_| rng.below(vocab) as i32).collect();
        let tok = up_i32(&d, &tokens);
        let wte = data(&mut rng, vocab * c, 1.0, dtype);
        let wpe = data(&mut rng, t * c, 1.0, dtype);
        let (mut eh, mut ef) = (zeros(&d, dtype, n * c), zeros(&d, DType::F32, n * c));
        d.exec(EmbeddingForward {
            tokens: &tok,
            wte: &up_as(&d, &wte, dtype),
            wpe: &up_as(&d, &wpe, dtype),
            out: &mut eh,
            b,
            t,
            c,
        })
        .unwrap();
        d.exec(EmbeddingForward {
            tokens: &tok,
            wte: &up(&d, &wte),
            wpe: &up(&d, &wpe),
            out: &mut ef,
            b,
            t,
            c,
        })
        .unwrap();
        same_as_rounded("embedding_forward", &d, &eh, &ef, dtype);
        let (mut wh, mut wf) = (up_as(&d, &wte, dtype), up(&d, &wte));
        let (mut ph, mut pf) = (up_as(&d, &wpe, dtype), up(&d, &wpe));
        d.exec(EmbeddingBackward {
            tokens: &tok,
            dout: &up_as(&d, &dout, dtype),
            dwte: &mut wh,
            dwpe: &mut ph,
            b,
            t,
            c,
        })
        .unwrap();
        d.exec(EmbeddingBackward {
            tokens: &tok,
            dout: &up(&d, &dout),
            dwte: &mut wf,
            dwpe: &mut pf,
            b,
            t,
            c,
        })
        .unwrap();
        same_as_rounded("embedding dwte", &d, &wh, &wf, dtype);
        same_as_rounded("embedding dwpe", &d, &ph, &pf, dtype);

        // Cross-entropy: bf16/f16 logits and gradient, f32 losses.
        let (rows, v) = (n, c);
        let targets: Vec<i32> = (0..rows)
            .map(|i| if i == 3 { -1 } else { rng.below(v) as i32 })
            .collect();
        let tg = up_i32(&d, &targets);
        let (mut lh, mut lf) = (zeros(&d, DType::F32, rows), zeros(&d, DType::F32, rows));
        let (mut gh2, mut gf2) = (zeros(&d, dtype, rows * v), zeros(&d, DType::F32, rows * v));
        d.exec(CrossEntropy {
            logits: &xh,
            targets: &tg,
            losses: &mut lh,
            dlogits: Some(&mut gh2),
            n: rows,
            v,
            grad_scale: 0.5,
        })
        .unwrap();
        d.exec(CrossEntropy {
            logits: &xf,
            targets: &tg,
            losses: &mut lf,
            dlogits: Some(&mut gf2),
            n: rows,
            v,
            grad_scale: 0.5,
        })
        .unwrap();
        assert_eq!(down(&d, &lh), down(&d, &lf), "losses {dtype}");
        same_as_rounded("dlogits", &d, &gh2, &gf2, dtype);
    }
}
