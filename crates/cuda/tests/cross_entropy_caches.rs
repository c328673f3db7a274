//! The cross-entropy kernels' three row caches (`CudaDevice::cross_entropy_cache_on_this_thread`:
//! none, the logits as stored, the row in f32 with each element's e^(x − max)) give the same
//! losses and gradients bit for bit, out of place and in place, over vocabularies below, at and
//! past a block's width, with padded and odd row strides. tests/conformance.rs checks the
//! default against the CPU. Without a usable CUDA device the test prints `SKIP <test>: <reason>`.

use duet_conformance::Harness;
use duet_conformance::harness::Rng;
use duet_conformance::harness::{get, put, put_i32, skip};
use duet_cuda::{CrossEntropyCache, CudaDevice};
use duet_device::{CrossEntropyInPlace, CrossEntropyPadded, DType, Runtime};

#[test]
fn cross_entropy_caches_give_the_same_bits() {
    let test = "cross_entropy_caches_give_the_same_bits";
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            skip(test, &format!("backend not available: {e}"));
            return;
        }
    };
    let h = Harness::new(dev, || CudaDevice::new(0).map_err(|e| e.to_string()));
    let d = &h.dev;
    let mut r: Rng = h.rng(test);
    let modes = [
        CrossEntropyCache::None,
        CrossEntropyCache::Logits,
        CrossEntropyCache::Exp,
    ];
    for dt in [DType::BF16, DType::F16, DType::F32] {
        // (rows, vocabulary, row stride): the seed's 96, a small and a mid vocabulary, GPT-2's
        // padded and unpadded (an odd stride: unaligned rows, the scalar path).
        for (n, v, ld) in [
            (9, 96, 96),
            (5, 1000, 1024),
            (3, 8191, 8199),
            (4, 50257, 50304),
            (3, 50257, 50257),
        ] {
            let logits: Vec<f32> = (0..n * ld)
                .map(|i| {
                    if i % ld < v {
                        r.uniform(-8.0, 8.0)
                    } else {
                        0.0
                    }
                })
                .collect();
            // One ignored row (−1); the others' targets spread over the vocabulary.
            let targets: Vec<i32> = (0..n)
                .map(|i| {
                    if i == 1 {
                        -1
                    } else {
                        ((i * 7919 + 13) % v) as i32
                    }
                })
                .collect();
            let tg = put_i32(d, &targets);
            let mut seen: Option<(Vec<u8>, Vec<u8>)> = None;
            for mode in modes {
                CudaDevice::cross_entropy_cache_on_this_thread(Some(mode));
                let x = put(d, dt, &logits);
                let mut losses = d.alloc(DType::F32, n).unwrap();
                let mut dl = d.alloc(dt, n * ld).unwrap();
                d.fill(&mut dl, f32::NAN).unwrap();
                d.exec(CrossEntropyPadded {
                    logits: &x,
                    targets: &tg,
                    losses: &mut losses,
                    dlogits: Some(&mut dl),
                    n,
                    v,
                    ld,
                    grad_scale: 0.25,
                })
                .unwrap();
                let out = (
                    get(d, "losses", &losses).bytes,
                    get(d, "dlogits", &dl).bytes,
                );
                // In place: the same bits as out of place.
                let mut xi = put(d, dt, &logits);
                let mut li = d.alloc(DType::F32, n).unwrap();
                d.exec(CrossEntropyInPlace {
                    logits: &mut xi,
                    targets: &tg,
                    losses: &mut li,
                    n,
                    v,
                    ld,
                    grad_scale: 0.25,
                })
                .unwrap();
                let inp = (get(d, "losses", &li).bytes, get(d, "dlogits", &xi).bytes);
                CudaDevice::cross_entropy_cache_on_this_thread(None);
                let what = format!("{test}: {dt} n{n} v{v} ld{ld} cache {mode:?}");
                assert!(out == inp, "{what}: in place differs from out of place");
                let lf = get(d, "losses", &losses).f32();
                assert!(
                    lf.iter().enumerate().all(|(i, l)| if i == 1 {
                        *l == 0.0
                    } else {
                        l.is_finite() && *l > 0.0
                    }),
                    "{what}: losses {lf:?}"
                );
                match &seen {
                    None => seen = Some(out),
                    Some(first) => {
                        assert!(
                            first.0 == out.0,
                            "{what}: the losses differ from no cache's"
                        );
                        let pos = first.1.iter().zip(&out.1).position(|(a, b)| a != b);
                        assert!(
                            pos.is_none(),
                            "{what}: the gradient's byte {} differs from no cache's",
                            pos.unwrap()
                        );
                    }
                }
            }
        }
    }
}
