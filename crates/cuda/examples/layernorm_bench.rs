//! Times LayerNorm forward and backward on the CUDA backend at 8192 × 768 and 8192 × 2048 with
//! bf16 activations and f32 parameters/gradients: `cargo run -p duet-cuda --release --example
//! layernorm_bench`. Each op is warmed up, then called 200 times between two synchronisations;
//! the table gives the mean host-clock time per call in µs. `bwd+cs` is the backward followed by
//! the column sum of the new dx (`bias_backward`, the residual-stream bias gradient), `bwd_cs`
//! the same in one op (`layernorm_backward_colsum`). No pass/fail.

use duet_cuda::CudaDevice;
use duet_device::{
    BiasBackward, DType, DeviceExt, LayerNormBackward, LayerNormBackwardColsum, LayerNormForward,
    Runtime,
};
use half::bf16;
use std::time::Instant;

const ITERS: usize = 200;

fn time<F: FnMut()>(dev: &CudaDevice, mut f: F) -> f64 {
    for _ in 0..10 {
        f();
    }
    dev.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..ITERS {
        f();
    }
    dev.synchronize().unwrap();
    t.elapsed().as_secs_f64() / ITERS as f64 * 1e6
}

fn main() {
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("layernorm_bench: no usable CUDA device: {e}");
            return;
        }
    };
    let act = DType::BF16;
    println!(
        "{:>6} {:>6} {:>6} {:>12} {:>12} {:>12} {:>12}",
        "n", "c", "dtype", "fwd µs", "bwd µs", "bwd+cs µs", "bwd_cs µs"
    );
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
        let mut dsum = a(DType::F32, c, 0.0);
        let fwd = time(&dev, || {
            dev.exec(LayerNormForward {
                x: &x,
                gamma: &gamma,
                beta: &beta,
                out: &mut out,
                mean: &mut mean,
                rstd: &mut rstd,
                n,
                c,
                eps: 1e-5,
            })
            .unwrap()
        });
        let bwd = time(&dev, || {
            dev.exec(LayerNormBackward {
                dout: &dout,
                x: &x,
                gamma: &gamma,
                mean: &mean,
                rstd: &rstd,
                dx: &mut dx,
                dgamma: &mut dgamma,
                dbeta: &mut dbeta,
                n,
                c,
            })
            .unwrap()
        });
        let separate = time(&dev, || {
            dev.exec(LayerNormBackward {
                dout: &dout,
                x: &x,
                gamma: &gamma,
                mean: &mean,
                rstd: &rstd,
                dx: &mut dx,
                dgamma: &mut dgamma,
                dbeta: &mut dbeta,
                n,
                c,
            })
            .unwrap();
            dev.exec(BiasBackward {
                dout: &dx,
                dbias: &mut dsum,
                rows: n,
                c,
            })
            .unwrap()
        });
        let fused = time(&dev, || {
            dev.exec(LayerNormBackwardColsum {
                dout: &dout,
                x: &x,
                gamma: &gamma,
                mean: &mean,
                rstd: &rstd,
                dx: &mut dx,
                dgamma: &mut dgamma,
                dbeta: &mut dbeta,
                dsum: &mut dsum,
                n,
                c,
            })
            .unwrap()
        });
        println!(
            "{n:>6} {c:>6} {:>6} {fwd:>12.2} {bwd:>12.2} {separate:>12.2} {fused:>12.2}",
            "bf16"
        );
    }
}
