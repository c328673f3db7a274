//! Times FP8 quantisation on the CUDA backend with bf16 sources: `cargo run -p duet-cuda
//! --release --example fp8_bench`. For each shape and format (E4M3, E5M2):
//!
//! * `quantize`    — `quantize_fp8` without the transposed copy;
//! * `quantize_t`  — `quantize_fp8` with `dst_t`;
//! * `grad`        — `quantize_fp8_grad` (dbias + codes + transposed codes);
//! * `grad_gelu`   — `quantize_fp8_grad` with `gelu_pre`;
//! * `separate`    — what `grad_gelu` replaces: gelu_backward + bias_backward + quantize_fp8;
//! * `quantize_gelu` / `quantize_gelu_t` — `quantize_fp8_gelu` (codes of gelu(pre)) without /
//!   with `dst_t`;
//! * `separate_gelu` / `separate_gelu_t` — what they replace: gelu_forward + quantize_fp8
//!   (charged the fused op's bytes, like `separate`).
//!
//! Then, for the LayerNorm shapes (bf16 activations and parameters, E4M3; only these with
//! `-- ln`):
//!
//! * `layernorm`    — `layernorm_forward` alone (bf16 out; charged its own bytes);
//! * `ln_fp8` / `ln_fp8_t` — `layernorm_forward_fp8` (mean, rstd and the codes of the
//!   LayerNorm output) without / with `dst_t`, as chosen by row width, then forced onto the
//!   one-pass kernel (`_1pass`) and the split kernels (`_split`);
//! * `separate_ln` / `separate_ln_t` — what they replace: layernorm_forward + quantize_fp8
//!   (charged the fused op's bytes).
//!
//! Then the weights of the 4-layer "seed" model (per layer 2304×768, 768×768, 3072×768 and
//! 768×3072, bf16 → E4M3 with transposed copies, one amax slot each; only these with
//! `-- weights`), as an FP8 training step quantises them:
//!
//! * `weights_many` — one `quantize_fp8_many` over the 16 matrices;
//! * `weights_each` — 16 `quantize_fp8` calls.
//!
//! Each op is warmed up, then called `ITERS` times inside one [`Runtime::time_ms`] (device events
//! on CUDA). The table gives µs per call and the effective bandwidth: bytes the op must read and
//! write once (bf16 inputs, FP8 outputs, and for the gradient the f32 column-sum partials and
//! dbias), divided by the time. `separate` is charged the fused op's bytes, so its GB/s compare
//! directly. No pass/fail.

use duet_cuda::CudaDevice;
use duet_device::{
    BiasBackward, DType, DeviceError, DeviceExt, Fp8QuantJob, GeluBackward, GeluForward,
    LayerNormForward, LayerNormForwardFp8, QuantizeFp8, QuantizeFp8Gelu, QuantizeFp8Grad,
    QuantizeFp8Many, Runtime,
};
use half::bf16;

const ITERS: usize = 100;
const SHAPES: [(usize, usize); 7] = [
    (8192, 768),
    (8192, 2304),
    (8192, 3072),
    (3072, 768),
    (2048, 8192),
    (8192, 2048),
    (8192, 8192),
];
/// (rows, c) of the LayerNorm cases: the widths of the model configurations.
const LN_SHAPES: [(usize, usize); 4] = [(8192, 768), (8192, 1024), (8192, 2048), (4096, 4096)];

/// Mean µs per call of `f` over `ITERS` calls, timed on the device.
fn time<F: FnMut() -> Result<(), DeviceError>>(dev: &CudaDevice, mut f: F) -> f64 {
    for _ in 0..5 {
        f().unwrap();
    }
    let ms = dev
        .time_ms(|| -> Result<(), DeviceError> {
            for _ in 0..ITERS {
                f()?;
            }
            Ok(())
        })
        .unwrap();
    ms * 1e3 / ITERS as f64
}

fn main() {
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("fp8_bench: no usable CUDA device: {e}");
            return;
        }
    };
    println!(
        "{} ({}), timer: {}, {ITERS} calls per op",
        dev.info().name,
        dev.info().arch,
        dev.timer_kind()
    );
    println!(
        "{:>6} {:>6} {:>8} {:>15} {:>10} {:>8}",
        "rows", "cols", "fp8", "op", "µs", "GB/s"
    );
    let only = std::env::args().nth(1);
    let (only_ln, only_weights) = (
        only.as_deref() == Some("ln"),
        only.as_deref() == Some("weights"),
    );
    for (rows, cols) in SHAPES.into_iter().filter(|_| !only_ln && !only_weights) {
        let n = rows * cols;
        let host = |k: usize| -> Vec<bf16> {
            (0..n)
                .map(|i| bf16::from_f32((((i * k) % 977) as f32 * 0.013).sin() * 3.0))
                .collect()
        };
        let x = dev.upload_new(&host(1)).unwrap();
        let pre = dev.upload_new(&host(3)).unwrap();
        let mut tmp = dev.alloc(DType::BF16, n).unwrap();
        let mut dbias = dev.alloc(DType::F32, cols).unwrap();
        dev.fill(&mut dbias, 0.0).unwrap();
        let scale = dev.upload_new(&[16.0f32]).unwrap();
        let mut amax = dev.alloc(DType::F32, 1).unwrap();
        dev.fill(&mut amax, 0.0).unwrap();
        // bf16 in, one byte per code out; the gradient adds its f32 partials (written and read
        // once: one row per 64 rows) and dbias (read and written).
        let (b_in, b_code) = (2 * n, n);
        let b_sums = 2 * rows.div_ceil(64) * cols * 4 + 2 * cols * 4;
        for fmt in [DType::F8E4M3, DType::F8E5M2] {
            let mut dst = dev.alloc(fmt, n).unwrap();
            let mut dst_t = dev.alloc(fmt, n).unwrap();
            let row = |op: &str, us: f64, bytes: usize| {
                println!(
                    "{rows:>6} {cols:>6} {:>8} {op:>15} {us:>10.2} {:>8.0}",
                    format!("{fmt}"),
                    bytes as f64 / (us * 1e-6) / 1e9
                );
            };
            let us = time(&dev, || {
                dev.exec(QuantizeFp8 {
                    src: &x,
                    dst: &mut dst,
                    dst_t: None,
                    rows,
                    cols,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            row("quantize", us, b_in + b_code);
            let us = time(&dev, || {
                dev.exec(QuantizeFp8 {
                    src: &x,
                    dst: &mut dst,
                    dst_t: Some(&mut dst_t),
                    rows,
                    cols,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            row("quantize_t", us, b_in + 2 * b_code);
            let us = time(&dev, || {
                dev.exec(QuantizeFp8Grad {
                    dout: &x,
                    gelu_pre: None,
                    dst: &mut dst,
                    dst_t: Some(&mut dst_t),
                    dbias: &mut dbias,
                    rows,
                    cols,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            row("grad", us, b_in + 2 * b_code + b_sums);
            let us = time(&dev, || {
                dev.exec(QuantizeFp8Grad {
                    dout: &x,
                    gelu_pre: Some(&pre),
                    dst: &mut dst,
                    dst_t: Some(&mut dst_t),
                    dbias: &mut dbias,
                    rows,
                    cols,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            row("grad_gelu", us, 2 * b_in + 2 * b_code + b_sums);
            let us = time(&dev, || {
                dev.exec(GeluBackward {
                    x: &pre,
                    dout: &x,
                    dx: &mut tmp,
                })?;
                dev.exec(BiasBackward {
                    dout: &tmp,
                    dbias: &mut dbias,
                    rows,
                    c: cols,
                })?;
                dev.exec(QuantizeFp8 {
                    src: &tmp,
                    dst: &mut dst,
                    dst_t: Some(&mut dst_t),
                    rows,
                    cols,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            row("separate", us, 2 * b_in + 2 * b_code + b_sums);
            for transposed in [false, true] {
                let sfx = if transposed { "_t" } else { "" };
                let bytes = b_in + if transposed { 2 * b_code } else { b_code };
                let us = time(&dev, || {
                    dev.exec(QuantizeFp8Gelu {
                        pre: &pre,
                        dst: &mut dst,
                        dst_t: transposed.then_some(&mut dst_t),
                        rows,
                        cols,
                        scale: &scale,
                        amax: &mut amax,
                        slot: 0,
                    })
                });
                row(&format!("quantize_gelu{sfx}"), us, bytes);
                let us = time(&dev, || {
                    dev.exec(GeluForward {
                        x: &pre,
                        out: &mut tmp,
                    })?;
                    dev.exec(QuantizeFp8 {
                        src: &tmp,
                        dst: &mut dst,
                        dst_t: transposed.then_some(&mut dst_t),
                        rows,
                        cols,
                        scale: &scale,
                        amax: &mut amax,
                        slot: 0,
                    })
                });
                row(&format!("separate_gelu{sfx}"), us, bytes);
            }
        }
    }
    for (rows, c) in LN_SHAPES.into_iter().filter(|_| !only_weights) {
        layernorm_rows(&dev, rows, c);
    }
    if !only_ln {
        weight_rows(&dev);
    }
}

/// The weight rows of the table (see the module docs).
fn weight_rows(dev: &CudaDevice) {
    const LAYER: [(usize, usize); 4] = [(2304, 768), (768, 768), (3072, 768), (768, 3072)];
    let shapes: Vec<(usize, usize)> = (0..4).flat_map(|_| LAYER).collect();
    let fmt = DType::F8E4M3;
    let srcs: Vec<_> = shapes
        .iter()
        .enumerate()
        .map(|(k, &(r, c))| {
            let host: Vec<bf16> = (0..r * c)
                .map(|i| bf16::from_f32((((i * (k + 1)) % 977) as f32 * 0.013).sin() * 0.05))
                .collect();
            dev.upload_new(&host).unwrap()
        })
        .collect();
    let mut dsts: Vec<_> = shapes
        .iter()
        .map(|&(r, c)| dev.alloc(fmt, r * c).unwrap())
        .collect();
    let mut dts: Vec<_> = shapes
        .iter()
        .map(|&(r, c)| dev.alloc(fmt, r * c).unwrap())
        .collect();
    let scale = dev.upload_new(&vec![16.0f32; shapes.len()]).unwrap();
    let mut amax = dev.alloc(DType::F32, shapes.len()).unwrap();
    dev.fill(&mut amax, 0.0).unwrap();
    let n: usize = shapes.iter().map(|&(r, c)| r * c).sum();
    // bf16 in, codes and transposed codes out.
    let bytes = 2 * n + 2 * n;
    let row = |op: &str, us: f64| {
        println!(
            "{:>6} {:>6} {:>8} {op:>15} {us:>10.2} {:>8.0}",
            "seed",
            format!("x{}", shapes.len()),
            format!("{fmt}"),
            bytes as f64 / (us * 1e-6) / 1e9
        );
    };
    let us = time(dev, || {
        let mut jobs: Vec<_> = srcs
            .iter()
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
            .zip(&shapes)
            .enumerate()
            .map(|(slot, ((src, (dst, dt)), &(rows, cols)))| Fp8QuantJob {
                src,
                dst,
                dst_t: Some(dt),
                rows,
                cols,
                slot,
            })
            .collect();
        dev.exec(QuantizeFp8Many {
            jobs: &mut jobs,
            scale: &scale,
            amax: &mut amax,
        })
    });
    row("weights_many", us);
    let us = time(dev, || {
        for (slot, ((src, (dst, dt)), &(rows, cols))) in srcs
            .iter()
            .zip(dsts.iter_mut().zip(dts.iter_mut()))
            .zip(&shapes)
            .enumerate()
        {
            dev.exec(QuantizeFp8 {
                src,
                dst,
                dst_t: Some(dt),
                rows,
                cols,
                scale: &scale,
                amax: &mut amax,
                slot,
            })?;
        }
        Ok(())
    });
    row("weights_each", us);
}

/// The LayerNorm rows of the table for one shape (see the module docs).
fn layernorm_rows(dev: &CudaDevice, rows: usize, c: usize) {
    let n = rows * c;
    let host: Vec<bf16> = (0..n)
        .map(|i| bf16::from_f32(((i % 977) as f32 * 0.013).sin() * 3.0 + (i / c % 5) as f32))
        .collect();
    let par = |k: usize| -> Vec<bf16> {
        (0..c)
            .map(|j| bf16::from_f32(1.0 + ((j * k) % 89) as f32 * 0.01))
            .collect()
    };
    let x = dev.upload_new(&host).unwrap();
    let gamma = dev.upload_new(&par(3)).unwrap();
    let beta = dev.upload_new(&par(7)).unwrap();
    let mut out = dev.alloc(DType::BF16, n).unwrap();
    let mut mean = dev.alloc(DType::F32, rows).unwrap();
    let mut rstd = dev.alloc(DType::F32, rows).unwrap();
    let scale = dev.upload_new(&[16.0f32]).unwrap();
    let mut amax = dev.alloc(DType::F32, 1).unwrap();
    dev.fill(&mut amax, 0.0).unwrap();
    let fmt = DType::F8E4M3;
    let mut dst = dev.alloc(fmt, n).unwrap();
    let mut dst_t = dev.alloc(fmt, n).unwrap();
    let eps = 1e-5;
    // bf16 in; mean and rstd (f32 per row) out; one byte per code (twice with dst_t).
    let (b_in, b_stats) = (2 * n, 8 * rows);
    let row = |op: &str, us: f64, bytes: usize| {
        println!(
            "{rows:>6} {c:>6} {:>8} {op:>15} {us:>10.2} {:>8.0}",
            format!("{fmt}"),
            bytes as f64 / (us * 1e-6) / 1e9
        );
    };
    let us = time(dev, || {
        dev.exec(LayerNormForward {
            x: &x,
            gamma: &gamma,
            beta: &beta,
            out: &mut out,
            mean: &mut mean,
            rstd: &mut rstd,
            n: rows,
            c,
            eps,
        })
    });
    row("layernorm", us, 2 * b_in + b_stats);
    for transposed in [false, true] {
        let sfx = if transposed { "_t" } else { "" };
        let bytes = b_in + b_stats + if transposed { 2 * n } else { n };
        for (label, split) in [("", None), ("_1pass", Some(false)), ("_split", Some(true))] {
            CudaDevice::layernorm_fp8_split_on_this_thread(split);
            let us = time(dev, || {
                dev.exec(LayerNormForwardFp8 {
                    x: &x,
                    gamma: &gamma,
                    beta: &beta,
                    mean: &mut mean,
                    rstd: &mut rstd,
                    dst: &mut dst,
                    dst_t: transposed.then_some(&mut dst_t),
                    n: rows,
                    c,
                    eps,
                    scale: &scale,
                    amax: &mut amax,
                    slot: 0,
                })
            });
            CudaDevice::layernorm_fp8_split_on_this_thread(None);
            row(&format!("ln_fp8{sfx}{label}"), us, bytes);
        }
        let us = time(dev, || {
            dev.exec(LayerNormForward {
                x: &x,
                gamma: &gamma,
                beta: &beta,
                out: &mut out,
                mean: &mut mean,
                rstd: &mut rstd,
                n: rows,
                c,
                eps,
            })?;
            dev.exec(QuantizeFp8 {
                src: &out,
                dst: &mut dst,
                dst_t: transposed.then_some(&mut dst_t),
                rows,
                cols: c,
                scale: &scale,
                amax: &mut amax,
                slot: 0,
            })
        });
        row(&format!("separate_ln{sfx}"), us, bytes);
    }
}
