//! Times LayerNorm forward and backward on the CUDA backend at 8192 × 768 (seed model) and
//! 8192 × 2048 (large model) with bf16 activations and f32 parameters/gradients:
//! `cargo run -p duet-cuda --release --example layernorm_bench`.
//!
//! Each op is warmed up, then called 200 times between two device events (`Device::time_ms`):
//! "µs" is the device time per call (the backward includes its dgamma/dbeta finish kernel) and
//! "GB/s" the bytes the op must move over that time (forward: x read, out written, mean/rstd;
//! backward: dout, x and dx read, dx written, mean/rstd). "host µs" is the host clock over the
//! same loop.
//!
//! The run times the current kernels ("new"), then runs itself again with `DUET_LN_LEGACY=1`,
//! which routes these shapes to the previous kernels ("old"), so one run shows both. Pass
//! `--only` to time just the kernels the environment selects. No pass/fail.

use duet_cuda::CudaDevice;
use duet_device::{DType, Device, DeviceError, DeviceExt};
use half::bf16;
use std::time::Instant;

const WARMUP: usize = 10;
const ITERS: usize = 200;
const LEGACY_ENV: &str = "DUET_LN_LEGACY";

/// (device µs per call, host µs per call) of `ITERS` calls of `f` after `WARMUP` calls.
fn time(dev: &CudaDevice, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..WARMUP {
        f();
    }
    dev.synchronize().unwrap();
    let start = Instant::now();
    let ms = dev
        .time_ms(|| -> Result<(), DeviceError> {
            for _ in 0..ITERS {
                f();
            }
            Ok(())
        })
        .unwrap();
    let host = start.elapsed().as_secs_f64() * 1e6 / ITERS as f64;
    (ms * 1e3 / ITERS as f64, host)
}

fn run(dev: &CudaDevice, label: &str) {
    let act = DType::BF16;
    for (n, c) in [(8192usize, 768usize), (8192, 2048)] {
        let a = |dtype: DType, len: usize, v: f32| {
            let mut b = dev.alloc(dtype, len).unwrap();
            dev.fill(&mut b, v).unwrap();
            b
        };
        // Non-constant rows so the statistics are not trivial.
        let host: Vec<bf16> = (0..n * c)
            .map(|i| bf16::from_f32(((i % 977) as f32 * 0.013).sin()))
            .collect();
        let x = dev.upload_new(&host).unwrap();
        let gamma = a(DType::F32, c, 1.0);
        let beta = a(DType::F32, c, 0.0);
        let mut out = a(act, n * c, 0.0);
        let mut mean = a(DType::F32, n, 0.0);
        let mut rstd = a(DType::F32, n, 0.0);
        let dout = a(act, n * c, 0.01);
        let mut dx = a(act, n * c, 0.0);
        let mut dgamma = a(DType::F32, c, 0.0);
        let mut dbeta = a(DType::F32, c, 0.0);
        let (fwd, fwd_host) = time(dev, || {
            dev.layernorm_forward(
                &x, &gamma, &beta, &mut out, &mut mean, &mut rstd, n, c, 1e-5,
            )
            .unwrap()
        });
        let (bwd, bwd_host) = time(dev, || {
            dev.layernorm_backward(
                &dout,
                &x,
                &gamma,
                &mean,
                &rstd,
                &mut dx,
                &mut dgamma,
                &mut dbeta,
                n,
                c,
            )
            .unwrap()
        });
        let elem = (n * c * act.size_bytes()) as f64;
        let stats = (2 * n * 4) as f64;
        let gbs = |bytes: f64, us: f64| bytes / (us * 1e-6) / 1e9;
        println!(
            "{label:>4} {n:>6} {c:>6} {:>6} {fwd:>9.2} {:>8.0} {fwd_host:>9.2} {bwd:>9.2} {:>8.0} \
             {bwd_host:>9.2}",
            "bf16",
            gbs(2.0 * elem + stats, fwd),
            gbs(4.0 * elem + stats, bwd),
        );
    }
}

fn main() {
    let only = std::env::args().any(|a| a == "--only");
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("layernorm_bench: no usable CUDA device: {e}");
            return;
        }
    };
    let legacy = std::env::var(LEGACY_ENV).is_ok_and(|v| v == "1");
    if !only {
        println!("timer: {}, {ITERS} calls per row", dev.timer_kind());
        println!(
            "{:>4} {:>6} {:>6} {:>6} {:>9} {:>8} {:>9} {:>9} {:>8} {:>9}",
            "", "n", "c", "dtype", "fwd µs", "GB/s", "host µs", "bwd µs", "GB/s", "host µs"
        );
    }
    run(&dev, if legacy { "old" } else { "new" });
    if only || legacy {
        return;
    }
    drop(dev);
    // The previous kernels, in a child process (the switch is read once per process).
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--only")
        .env(LEGACY_ENV, "1")
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => eprintln!("layernorm_bench: the {LEGACY_ENV}=1 run failed: {other:?}"),
    }
}
