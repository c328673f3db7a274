//! Times the in-place fused classifier (`cross_entropy_in_place`: softmax, loss and gradient over
//! the logits) with each of its row caches (`CudaDevice::cross_entropy_cache_on_this_thread`: none,
//! the logits as stored, the row in f32 with e^(x − max)) at GPT-2's shapes (8192- and 4096-row
//! chunks of the padded 50304-wide logits, vocabulary 50257) and the seed's (32768 rows of 96):
//! `cargo run -p duet-cuda --release --example ce_bench [bf16|f16]`. Each is warmed up, then run
//! 20 times inside one `Runtime::time_ms` (device events); the table gives the mean time per call
//! and the logits' bytes read and written per second. No pass/fail.

use duet_cuda::{CrossEntropyCache, CudaDevice};
use duet_device::{CrossEntropyInPlace, DType, DeviceError, DeviceExt, Runtime};

const ITERS: usize = 20;

fn main() {
    let dtype = match std::env::args().nth(1).as_deref() {
        None | Some("bf16") => DType::BF16,
        Some("f16") => DType::F16,
        Some(other) => {
            eprintln!("ce_bench: dtype {other:?} (bf16 or f16)");
            std::process::exit(2);
        }
    };
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("ce_bench: no CUDA device: {e}");
            std::process::exit(1);
        }
    };
    for (name, n, v, ld) in [
        ("gpt2/8192", 8192, 50257, 50304),
        ("gpt2/4096", 4096, 50257, 50304),
        ("seed", 32768, 96, 96),
    ] {
        let mut logits = dev.alloc(dtype, n * ld).unwrap();
        // Varied logits (a ramp folded per row); they turn into gradients after the first call,
        // which costs the kernel the same.
        let row: Vec<f32> = (0..ld)
            .map(|j| ((j * 37) % 101) as f32 * 0.05 - 2.5)
            .collect();
        let all: Vec<f32> = (0..n).flat_map(|_| row.iter().copied()).collect();
        let src = dev.upload_new(&all).unwrap();
        dev.cast(&src, &mut logits, 1.0).unwrap();
        drop(src);
        let tg: Vec<i32> = (0..n).map(|i| ((i * 7919) % v) as i32).collect();
        let mut targets = dev.alloc(DType::I32, n).unwrap();
        let bytes: Vec<u8> = tg.iter().flat_map(|x| x.to_le_bytes()).collect();
        dev.upload_bytes(&bytes, &mut targets, 0).unwrap();
        let mut losses = dev.alloc(DType::F32, n).unwrap();
        let mut first = None;
        for mode in [
            CrossEntropyCache::None,
            CrossEntropyCache::Logits,
            CrossEntropyCache::Exp,
        ] {
            CudaDevice::cross_entropy_cache_on_this_thread(Some(mode));
            let mut call = || {
                dev.exec(CrossEntropyInPlace {
                    logits: &mut logits,
                    targets: &targets,
                    losses: &mut losses,
                    n,
                    v,
                    ld,
                    grad_scale: 1.0,
                })
                .unwrap()
            };
            for _ in 0..3 {
                call();
            }
            dev.synchronize().unwrap();
            let ms = dev
                .time_ms(|| {
                    for _ in 0..ITERS {
                        call();
                    }
                    Ok::<(), DeviceError>(())
                })
                .unwrap();
            let us = ms * 1e3 / ITERS as f64;
            let base = *first.get_or_insert(us);
            let gbs = 2.0 * (n * ld * dtype.size_bytes()) as f64 / (us * 1e-6) / 1e9;
            println!(
                "{name:<10} {dtype:<5} n={n} v={v} ld={ld} cache {mode:<7?} {us:9.1} µs  {gbs:7.0} GB/s  {:4.2}x no cache's speed",
                base / us
            );
        }
        CudaDevice::cross_entropy_cache_on_this_thread(None);
    }
}
