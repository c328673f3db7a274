//! Times `embedding_backward` on the GPU:
//! `cargo run -p duet-cuda --release --example embedding_bench`.
//!
//! For each shape (n = b·t tokens, vocab, c; dout bf16 or f32, dwte and dwpe f32) and token
//! pattern (cyclic i·7 mod vocab, uniform random, log-uniform "zipf", one id) the op is warmed
//! up, then called 100 times between two synchronisations; the host clock over that loop gives
//! µs per call ("enqueue" is the host time before the final synchronize, i.e. the launch
//! overhead). The c = 8 rows show the sort and launch cost alone.

use duet_cuda::CudaDevice;
use duet_device::{DType, DeviceExt, EmbeddingBackward, Runtime};
use std::time::Instant;

const CALLS: usize = 100;

fn main() {
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("embedding_bench: no CUDA device: {e}");
            return;
        }
    };
    let info = dev.info();
    println!("{} {}", info.name, info.arch);
    println!(
        "{:>6} {:>6} {:>6} {:>6} {:>5} {:>9} {:>10} {:>10}",
        "b", "t", "vocab", "c", "dout", "tokens", "µs/call", "enqueue"
    );
    for &(b, t, vocab, c) in &[
        (32usize, 256usize, 96usize, 768usize),
        (32, 256, 50257, 768),
        (64, 256, 50257, 768),
        (32, 256, 96, 8),
        (32, 256, 50257, 8),
    ] {
        for act in [DType::BF16, DType::F32] {
            for pattern in ["cyclic", "random", "zipf", "one"] {
                let n = b * t;
                let mut s = 0x2545_f491_4f6c_dd1du64;
                let toks: Vec<i32> = (0..n)
                    .map(|i| match pattern {
                        "cyclic" => (i * 7 % vocab) as i32,
                        "one" => (vocab / 2) as i32,
                        _ => {
                            s ^= s << 13;
                            s ^= s >> 7;
                            s ^= s << 17;
                            if pattern == "zipf" {
                                // Log-uniform: a few very frequent ids, a long tail.
                                let u = (s >> 11) as f64 / (1u64 << 53) as f64;
                                ((vocab as f64).powf(u) as usize - 1).min(vocab - 1) as i32
                            } else {
                                (s % vocab as u64) as i32
                            }
                        }
                    })
                    .collect();
                let tokens = dev.upload_new(&toks).unwrap();
                let mut dout = dev.alloc(act, n * c).unwrap();
                dev.fill(&mut dout, 0.01).unwrap();
                let mut dwte = dev.alloc(DType::F32, vocab * c).unwrap();
                let mut dwpe = dev.alloc(DType::F32, t * c).unwrap();
                dev.fill(&mut dwte, 0.0).unwrap();
                dev.fill(&mut dwpe, 0.0).unwrap();
                let mut call = || {
                    dev.exec(EmbeddingBackward {
                        tokens: &tokens,
                        dout: &dout,
                        dwte: &mut dwte,
                        dwpe: &mut dwpe,
                        b,
                        t,
                        c,
                    })
                    .unwrap()
                };
                for _ in 0..3 {
                    call();
                }
                dev.synchronize().unwrap();
                let start = Instant::now();
                for _ in 0..CALLS {
                    call();
                }
                let enq = start.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
                dev.synchronize().unwrap();
                let us = start.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
                println!(
                    "{b:>6} {t:>6} {vocab:>6} {c:>6} {:>5} {pattern:>9} {us:>10.1} {enq:>10.1}",
                    act.to_string()
                );
            }
        }
    }
}
