use super::memory::{Dims, Scratch};
use crate::Result;
use duet_device::{Device, Gemm, GemmDesc, SoftmaxCausalBackward, SoftmaxCausalForward};

/// Causal attention `y = softmax(scale · q·kᵀ) · v` over the `b·nh` heads in `s.q`, `s.k`,
/// `s.v`, `d.ab` heads at a time (no `t × t` matrix beyond one chunk is ever written); `y`
/// (head layout) goes to `s.d_c2`, which the backward pass only uses later for its own gradient.
pub(super) fn attention_forward<D: Device>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    for j in (0..d.b * d.nh).step_by(ab) {
        attention_probs(dev, s, j, d, scale)?;
        let mut pv = GemmDesc::batched(false, false, t, hs, t, ab);
        (pv.b_offset, pv.c_offset) = (j * t * hs, j * t * hs);
        dev.exec(Gemm {
            desc: &pv,
            a: &s.probs,
            b: &s.v,
            c: &mut s.d_c2,
        })?;
    }
    Ok(())
}

/// Backward of [`attention_forward`]: from `dy` in `s.d_c2` and `s.q`, `s.k`, `s.v`, writes
/// `s.dq`, `s.dk`, `s.dv`. Each chunk's probabilities are recomputed exactly as the forward
/// pass computed them (same ops, same shapes, so the same bits).
pub(super) fn attention_backward<D: Device>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    for j in (0..d.b * d.nh).step_by(ab) {
        let off = j * t * hs;
        attention_probs(dev, s, j, d, scale)?;
        // dP = dy · vᵀ, dv = Pᵀ · dy.
        let mut dp = GemmDesc::batched(false, true, t, t, hs, ab);
        (dp.a_offset, dp.b_offset) = (off, off);
        dev.exec(Gemm {
            desc: &dp,
            a: &s.d_c2,
            b: &s.v,
            c: &mut s.dprobs,
        })?;
        let mut dv = GemmDesc::batched(true, false, t, hs, t, ab);
        (dv.b_offset, dv.c_offset) = (off, off);
        dev.exec(Gemm {
            desc: &dv,
            a: &s.probs,
            b: &s.d_c2,
            c: &mut s.dv,
        })?;
        // dS (into the scores buffer, free again), then dq = dS · k, dk = dSᵀ · q.
        dev.exec(SoftmaxCausalBackward {
            probs: &s.probs,
            dprobs: &s.dprobs,
            dscores: &mut s.scores,
            batch: ab,
            t,
            scale,
        })?;
        let mut dq = GemmDesc::batched(false, false, t, hs, t, ab);
        (dq.b_offset, dq.c_offset) = (off, off);
        dev.exec(Gemm {
            desc: &dq,
            a: &s.scores,
            b: &s.k,
            c: &mut s.dq,
        })?;
        let mut dk = GemmDesc::batched(true, false, t, hs, t, ab);
        (dk.b_offset, dk.c_offset) = (off, off);
        dev.exec(Gemm {
            desc: &dk,
            a: &s.scores,
            b: &s.q,
            c: &mut s.dk,
        })?;
    }
    Ok(())
}

/// The causal attention probabilities of the chunk of `d.ab` heads starting at head `j`
/// (of the `b·nh` in `s.q`, `s.k`): `s.probs = softmax(scale · q·kᵀ)`, via `s.scores`.
pub(super) fn attention_probs<D: Device>(
    dev: &D,
    s: &mut Scratch<D::Buffer>,
    j: usize,
    d: Dims,
    scale: f32,
) -> Result<()> {
    let (t, hs, ab) = (d.t, d.hs, d.ab);
    let mut qk = GemmDesc::batched(false, true, t, t, hs, ab);
    (qk.a_offset, qk.b_offset) = (j * t * hs, j * t * hs);
    dev.exec(Gemm {
        desc: &qk,
        a: &s.q,
        b: &s.k,
        c: &mut s.scores,
    })?;
    dev.exec(SoftmaxCausalForward {
        scores: &s.scores,
        probs: &mut s.probs,
        batch: ab,
        t,
        scale,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Preset};

    use super::super::memory::{ATTENTION_CHUNK_ELEMS, Buffers, attention_chunk};
    use crate::config::ModelConfig;
    use crate::precision::PrecisionPlan;
    use crate::rng::Rng;
    use duet_device::{DeviceExt, Runtime};

    #[test]
    fn attention_chunk_divides_and_fits() {
        assert_eq!(attention_chunk(384, 256), 192); // the seed model: 2 chunks
        assert_eq!(attention_chunk(512, 256), 256); // the large model: 2 chunks
        assert_eq!(attention_chunk(128, 48), 128); // small models: one chunk
        assert_eq!(attention_chunk(7, 8192), 1);
        assert_eq!(attention_chunk(1, 1), 1);
        for (bh, t) in [(384, 256), (100, 300), (97, 512), (12, 2048)] {
            let ab = attention_chunk(bh, t);
            assert!(bh.is_multiple_of(ab) && (ab == 1 || ab * t * t <= ATTENTION_CHUNK_ELEMS));
        }
    }

    /// The chunked attention computes what one pass over all heads computes (forward and
    /// backward), for chunks of 1, 2 and 3 of 6 heads.
    #[test]
    fn chunked_attention_matches_one_pass() {
        use duet_cpu::CpuDevice;
        let dev = CpuDevice::new(Some(2)).unwrap();
        let (b, nh, t, hs) = (2, 3, 7, 4);
        let (c, n) = (nh * hs, b * t);
        let mut rng = Rng::new(7);
        let mut rand = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.normal() as f32).collect::<Vec<f32>>()
        };
        let (q, k, v, dy) = (rand(n * c), rand(n * c), rand(n * c), rand(n * c));
        let run = |ab: usize| -> Vec<Vec<f32>> {
            let d = Dims {
                b,
                t,
                c,
                nh,
                hs,
                f: 8,
                n,
                ab,
                flash: false,
            };
            let cfg = ModelConfig {
                d_model: c,
                heads: nh,
                ffn: 8,
                max_seq: t,
                ..Config::preset(Preset::Tiny).model
            };
            let mut plan = Buffers::plan(&dev, &cfg, b, t, &PrecisionPlan::default())
                .unwrap()
                .scratch;
            for x in [&mut plan.scores, &mut plan.probs, &mut plan.dprobs] {
                x.len = ab * t * t;
            }
            for x in [
                &mut plan.q,
                &mut plan.k,
                &mut plan.v,
                &mut plan.d_c2,
                &mut plan.dq,
                &mut plan.dk,
                &mut plan.dv,
            ] {
                x.len = n * c;
            }
            let mut s = plan.try_map(&mut |s| dev.alloc(s.dtype, s.len)).unwrap();
            dev.upload(&q, &mut s.q, 0).unwrap();
            dev.upload(&k, &mut s.k, 0).unwrap();
            dev.upload(&v, &mut s.v, 0).unwrap();
            let scale = 0.5;
            attention_forward(&dev, &mut s, d, scale).unwrap();
            let y = dev.download_f32(&s.d_c2).unwrap();
            dev.upload(&dy, &mut s.d_c2, 0).unwrap();
            attention_backward(&dev, &mut s, d, scale).unwrap();
            let out = [&s.dq, &s.dk, &s.dv].map(|x| dev.download_f32(x).unwrap());
            let mut all = vec![y];
            all.extend(out);
            all
        };
        let whole = run(b * nh);
        assert!(whole[0].iter().all(|x| x.is_finite()) && whole[0].iter().any(|&x| x != 0.0));
        for ab in [1, 2, 3] {
            let chunked = run(ab);
            for (w, c) in whole.iter().zip(&chunked) {
                for (x, y) in w.iter().zip(c) {
                    assert!(
                        (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                        "ab {ab}: {x} vs {y}"
                    );
                }
            }
        }
    }
}
