//! Memory: uploads, downloads, copies, fills, zeroing.

use super::*;
use duet_device::{
    AdamWClipStep, AdamWClipped, AdamWTensor, CrossEntropyInPlace, DType, Device, DeviceExt,
    SumSquaresMany,
};

/// Every dtype a buffer holds data in: the floats, FP8 included, and i32.
fn all_dtypes() -> impl Iterator<Item = DType> {
    FLOATS_AND_FP8.into_iter().chain([DType::I32])
}

/// Every dtype goes up and comes back bit for bit; `copy` moves exactly the range asked for
/// (offsets on both sides) and nothing else; `fill` writes every element as the host encodes
/// the value. The expectations are host models, the same for every backend.
pub fn upload_download_copy_fill<D: Device>(h: &Harness<D>) {
    let case = "upload_download_copy_fill";
    let d = &h.dev;
    let mut r = h.rng(case);
    for dt in all_dtypes() {
        let fresh = d.alloc(dt, 4099).unwrap();
        assert!(
            d.download_bytes(&fresh, 0, 4099)
                .unwrap()
                .iter()
                .all(|&b| b == 0),
            "{case}: {dt} alloc zero-initialises"
        );
        for n in [1usize, 7, 4099] {
            let data: Vec<f32> = if dt == DType::I32 {
                (0..n).map(|_| r.below(100_000) as f32 - 50_000.0).collect()
            } else {
                r.vec(n, -3.0, 3.0)
            };
            let bytes = encode(dt, &data);
            let b = put(d, dt, &data);
            assert_eq!(
                d.download_bytes(&b, 0, n).unwrap(),
                bytes,
                "{case}: {dt} n={n} round trip"
            );
            // A partial download.
            if n > 3 {
                let es = dt.size_bytes();
                assert_eq!(
                    d.download_bytes(&b, 2, n - 3).unwrap(),
                    bytes[2 * es..(n - 1) * es].to_vec(),
                    "{case}: {dt} n={n} partial download"
                );
            }
            // copy src[so .. so+len] → dst[do .. do+len] into a dst of its own values.
            let so = n / 3;
            let doff = n / 5;
            let len = (n - so).min(n - doff);
            let init: Vec<f32> = if dt == DType::I32 {
                vec![7.0; n]
            } else {
                r.vec(n, -1.0, 1.0)
            };
            let mut dst = put(d, dt, &init);
            d.copy(&b, so, &mut dst, doff, len).unwrap();
            let mut want = encode(dt, &init);
            let es = dt.size_bytes();
            want[doff * es..(doff + len) * es].copy_from_slice(&bytes[so * es..(so + len) * es]);
            assert_eq!(
                d.download_bytes(&dst, 0, n).unwrap(),
                want,
                "{case}: {dt} n={n} copy"
            );
            // fill (an i32 buffer with whole numbers)
            let values: &[f32] = if dt == DType::I32 {
                &[0.0, -7.0, 123_456.0]
            } else {
                &[0.0, -1.5, 300.0, f32::NAN]
            };
            for &v in values {
                let mut f = put(d, dt, &init);
                d.fill(&mut f, v).unwrap();
                let got = d.download_bytes(&f, 0, n).unwrap();
                assert_eq!(got, encode(dt, &vec![v; n]), "{case}: {dt} n={n} fill {v}");
            }
        }
        // Out-of-range copies and downloads are errors.
        let b = d.alloc(dt, 8).unwrap();
        let mut c = d.alloc(dt, 8).unwrap();
        assert!(
            d.copy(&b, 4, &mut c, 0, 5).is_err(),
            "{case}: {dt} copy past the end"
        );
        assert!(
            d.download_bytes(&b, 5, 4).is_err(),
            "{case}: {dt} download past the end"
        );
    }
    typed_host_copies(h);
}

/// The typed helpers of `DeviceExt` over the byte copies: an f32 upload at an offset and a
/// ranged download, raw FP8 codes up and down as u8 (decoding to the format's values), i32
/// round trips, and a host type that does not match the buffer refused.
fn typed_host_copies<D: Device>(h: &Harness<D>) {
    let case = "upload_download_copy_fill";
    let d = &h.dev;
    let mut dst = d.upload_new(&[0.0f32; 6]).unwrap();
    d.upload(&[9.0f32, 8.0], &mut dst, 4).unwrap();
    assert_eq!(
        d.download_range::<f32>(&dst, 3, 3).unwrap(),
        vec![0.0, 9.0, 8.0],
        "{case}: typed upload at an offset"
    );
    let codes = [0x38u8, 0x40, 0xb8, 0x7e];
    let mut f8 = d.alloc(DType::F8E4M3, 4).unwrap();
    d.upload(&codes, &mut f8, 0).unwrap();
    assert_eq!(
        d.download::<u8>(&f8).unwrap(),
        codes,
        "{case}: FP8 codes as u8"
    );
    assert_eq!(
        d.download_f32(&f8).unwrap(),
        vec![1.0, 2.0, -1.0, 448.0],
        "{case}: E4M3 codes decode"
    );
    let ints = d.upload_new(&[-7i32, 0, i32::MAX]).unwrap();
    assert_eq!(d.download::<i32>(&ints).unwrap(), vec![-7, 0, i32::MAX]);
    assert!(
        d.upload(&[1i32; 2], &mut dst, 0).is_err() && d.download::<i32>(&dst).is_err(),
        "{case}: i32 host data for an f32 buffer"
    );
}

/// `zero_many` clears buffers of every size and dtype completely, as `fill(0)` per buffer does.
pub fn zero_many_matches_composition<D: Device>(h: &Harness<D>) {
    let case = "zero_many_matches_composition";
    let d = &h.dev;
    let mut r = h.rng(case);
    let shapes: Vec<(DType, usize)> = all_dtypes()
        .flat_map(|dt| [1usize, 3, 4099, 70_001].map(move |n| (dt, n)))
        .collect();
    let mut fused: Vec<D::Buffer> = shapes
        .iter()
        .map(|&(dt, n)| put(d, dt, &r.vec(n, 1.0, 2.0)))
        .collect();
    let mut plain: Vec<D::Buffer> = shapes
        .iter()
        .map(|&(dt, n)| put(d, dt, &r.vec(n, 1.0, 2.0)))
        .collect();
    let untouched = put(d, DType::F32, &[5.0; 9]);
    {
        let mut refs: Vec<&mut D::Buffer> = fused.iter_mut().collect();
        d.zero_many(&mut refs).unwrap();
    }
    for p in plain.iter_mut() {
        d.fill(p, 0.0).unwrap();
    }
    for (i, &(dt, n)) in shapes.iter().enumerate() {
        let f = get(d, "zeroed", &fused[i]);
        let p = get(d, "zeroed", &plain[i]);
        h.same(
            &format!("{case} {dt} n={n}"),
            std::slice::from_ref(&f),
            &[p],
            &[Tol::Bits],
        );
        assert!(
            f.bytes.iter().all(|&b| b == 0),
            "{case}: {dt} n={n} not all zero bits"
        );
    }
    assert_eq!(
        get(d, "other", &untouched).f32(),
        vec![5.0; 9],
        "{case}: a buffer not passed was changed"
    );
}

/// The buffers of [`graph_replay_matches_unrecorded`]'s step.
struct GraphState<B> {
    params: Vec<B>,
    grads: Vec<B>,
    ms: Vec<B>,
    vs: Vec<B>,
    copies: Vec<B>,
    norm: B,
    scalars: B,
    logits: B,
    targets: B,
    losses: B,
}

impl<B> GraphState<B> {
    fn new<E: Device<Buffer = B>>(e: &E, seed: &mut Rng, sizes: &[usize], copy: DType) -> Self {
        // Two states from the same draws: the caller resets `seed` between them.
        let f32s = |r: &mut Rng, n: usize, lo: f32, hi: f32| put(e, DType::F32, &r.vec(n, lo, hi));
        let params = sizes.iter().map(|&n| f32s(seed, n, -1.0, 1.0)).collect();
        let grads = sizes.iter().map(|&n| f32s(seed, n, -0.5, 0.5)).collect();
        let ms = sizes.iter().map(|&n| f32s(seed, n, -0.1, 0.1)).collect();
        let vs = sizes.iter().map(|&n| f32s(seed, n, 0.0, 0.01)).collect();
        let copies = sizes.iter().map(|&n| put(e, copy, &vec![0.0; n])).collect();
        let (rows, v) = (37, 301);
        let logits = put(e, copy, &seed.vec(rows * v, -4.0, 4.0));
        let tg: Vec<i32> = (0..rows)
            .map(|i| if i % 7 == 3 { -1 } else { seed.below(v) as i32 })
            .collect();
        Self {
            params,
            grads,
            ms,
            vs,
            copies,
            norm: put(e, DType::F32, &[123.0]),
            scalars: put(e, DType::F32, &[0.0, 1e-3, 0.1, 0.001]),
            logits,
            targets: put_i32(e, &tg),
            losses: put(e, DType::F32, &vec![0.0; rows]),
        }
    }

    /// One step as the trainer queues it: zero the norm, the global sum of squares, the clipped
    /// AdamW reading it from the device, the in-place classifier. Nothing through the host.
    fn queue<E: Device<Buffer = B>>(&mut self, e: &E) -> duet_device::Result<()> {
        e.zero_many(&mut [&mut self.norm])?;
        let grads: Vec<&B> = self.grads.iter().collect();
        e.exec(SumSquaresMany {
            xs: &grads,
            out: &mut self.norm,
            slot: 0,
        })?;
        e.copy(&self.norm, 0, &mut self.scalars, 0, 1)?;
        let mut tensors: Vec<AdamWTensor<'_, B>> = self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(self.ms.iter_mut().zip(self.vs.iter_mut()))
            .zip(self.copies.iter_mut())
            .map(|(((param, grad), (m, v)), copy)| AdamWTensor {
                param,
                grad,
                m,
                v,
                copy: Some(copy),
                weight_decay: 0.1,
            })
            .collect();
        let step = AdamWClipStep {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            max_norm: 1.0,
            loss_scale: 1.0,
        };
        e.exec(AdamWClipped {
            tensors: &mut tensors,
            step: &step,
            scalars: &self.scalars,
        })?;
        e.exec(CrossEntropyInPlace {
            logits: &mut self.logits,
            targets: &self.targets,
            losses: &mut self.losses,
            n: 37,
            v: 301,
            ld: 301,
            grad_scale: 1.0 / 37.0,
        })
    }

    fn tensors<E: Device<Buffer = B>>(&self, e: &E) -> Vec<Tensor> {
        let mut out = Vec::new();
        for (i, b) in self.params.iter().enumerate() {
            out.push(get(e, &format!("param {i}"), b));
            out.push(get(e, &format!("m {i}"), &self.ms[i]));
            out.push(get(e, &format!("v {i}"), &self.vs[i]));
            out.push(get(e, &format!("copy {i}"), &self.copies[i]));
        }
        out.push(get(e, "norm", &self.norm));
        out.push(get(e, "scalars", &self.scalars));
        out.push(get(e, "logits", &self.logits));
        out.push(get(e, "losses", &self.losses));
        out
    }
}

/// A recorded step replays exactly what the same ops queued unrecorded do: two steps queued
/// directly against one queued step, then recorded and replayed once (the trainer's cold, warm
/// and recorded steps), bit for bit; recording runs nothing; allocating, uploading, downloading
/// and synchronising while recording are refused with an error and leave the recording usable.
/// A backend without graphs must refuse `capture_begin` with an error instead.
pub fn graph_replay_matches_unrecorded<D: Device>(h: &Harness<D>) {
    let case = "graph_replay_matches_unrecorded";
    // A device (and stream) of the case's own: a recording takes in whatever is queued on its
    // stream, so the cases running in parallel on the shared device would land in it.
    let fresh = h.fresh();
    let d = &fresh;
    if !d.capabilities().graphs {
        let e = d
            .capture_begin()
            .expect_err("capture_begin on a backend that says it records no graphs");
        assert!(!e.to_string().is_empty(), "{case}: an empty error");
        return;
    }
    let sizes = [1usize, 1000, 3 * (1 << 14) + 5];
    for copy in [DType::BF16, DType::F16, DType::F32] {
        // h.rng(case) gives the same draws each time: two identical states.
        let mut direct = GraphState::new(d, &mut h.rng(case), &sizes, copy);
        let mut recorded = GraphState::new(d, &mut h.rng(case), &sizes, copy);
        direct.queue(d).unwrap();
        direct.queue(d).unwrap();
        recorded.queue(d).unwrap();
        let before = recorded.tensors(d);
        d.capture_begin().unwrap();
        let queued = recorded.queue(d);
        let refused = [
            d.alloc(DType::F32, 4).err().map(|e| e.to_string()),
            d.upload_bytes(&[0u8; 4], &mut recorded.norm, 0)
                .err()
                .map(|e| e.to_string()),
            d.download_bytes(&recorded.norm, 0, 1)
                .err()
                .map(|e| e.to_string()),
            d.synchronize().err().map(|e| e.to_string()),
        ];
        let graph = d.capture_end();
        queued.unwrap();
        let graph = graph.unwrap();
        for (what, r) in ["alloc", "upload", "download", "synchronize"]
            .iter()
            .zip(&refused)
        {
            assert!(
                r.is_some(),
                "{case}: {what} while recording was not refused"
            );
        }
        let after = recorded.tensors(d);
        h.same(
            &format!("{case} {copy} recording runs nothing"),
            &after,
            &before,
            &vec![Tol::Bits; after.len()],
        );
        d.replay(&graph).unwrap();
        d.synchronize().unwrap();
        let got = recorded.tensors(d);
        let want = direct.tensors(d);
        h.same(
            &format!("{case} {copy} replay vs unrecorded"),
            &got,
            &want,
            &vec![Tol::Bits; got.len()],
        );
    }
}
