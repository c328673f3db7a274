//! Times one linear-layer-sized GEMM: `cargo run -p duet-cpu --release --example gemm_bench`.
//! Optional arguments: M N K [threads].

use duet_cpu::CpuDevice;
use duet_device::{DType, Gemm, GemmDesc, Runtime};
use std::time::Instant;

fn main() -> duet_device::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric argument"))
        .collect();
    let (m, n, k) = match args[..] {
        [m, n, k, ..] => (m, n, k),
        _ => (2048, 768, 3072),
    };
    let d = CpuDevice::new(args.get(3).copied())?;
    let a = d.alloc(DType::F32, m * k)?;
    let b = d.alloc(DType::F32, k * n)?;
    let mut c = d.alloc(DType::F32, m * n)?;
    let desc = GemmDesc::new(false, false, m, n, k);
    d.exec(Gemm {
        desc: &desc,
        a: &a,
        b: &b,
        c: &mut c,
    })?; // warm-up
    let reps = 5;
    let start = Instant::now();
    for _ in 0..reps {
        d.exec(Gemm {
            desc: &desc,
            a: &a,
            b: &b,
            c: &mut c,
        })?;
    }
    let secs = start.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{m}x{n}x{k} f32 on {} threads: {:.1} ms, {:.1} GFLOP/s",
        d.threads(),
        secs * 1e3,
        2.0 * (m * n * k) as f64 / secs / 1e9
    );
    Ok(())
}
