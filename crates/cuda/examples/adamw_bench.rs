//! Times the optimizer's two multi-tensor ops on the CUDA backend over the seed model's
//! parameters (vocab 96, d_model 768, 4 layers, FFN 3072, 256 positions: wte, wpe, 12 tensors
//! per layer, ln_f; 28.4 M parameters in 52 tensors):
//! `cargo run -p duet-cuda --release --example adamw_bench`.
//!
//! `sum_squares_many` reads the gradients; `adamw_clipped` updates f32 masters and moments from
//! them and writes bf16 working copies of the matrices and linear biases (weight decay 0.1 on the
//! matrices), as a training step does. Rows with f32 gradients (the seed model's) and bf16
//! gradients. Each op is warmed up, then called 100 times between two device events
//! (`Runtime::time_ms`): "µs" is the device time per call and "GB/s" the bytes the op must move
//! (every element read and written once) over that time; "host µs" is the host clock over the
//! same loop including the final wait: much above "µs" means the host, not the GPU, set the
//! pace. No pass/fail.

use duet_cuda::CudaDevice;
use duet_device::{
    ADAMW_SCALARS, AdamWClipStep, AdamWClipped, AdamWClippedFp8, AdamWStep, AdamWTensor, Buffer,
    DType, DeviceError, DeviceExt, Runtime, SumSquaresMany,
};
use half::bf16;
use std::time::Instant;

const WARMUP: usize = 10;
const ITERS: usize = 100;

/// One parameter tensor: f32 master, gradient, moments and the optional bf16 copy.
struct Param {
    param: duet_cuda::CudaBuffer,
    grad: duet_cuda::CudaBuffer,
    m: duet_cuda::CudaBuffer,
    v: duet_cuda::CudaBuffer,
    copy: Option<duet_cuda::CudaBuffer>,
    weight_decay: f32,
}

/// (elements, matrix?, bf16 copy?) of every tensor of the seed model, in storage order.
fn seed_model() -> Vec<(usize, bool, bool)> {
    let (vocab, c, layers, ffn, seq) = (96, 768, 4, 3072, 256);
    let mut t = vec![(vocab * c, true, true), (seq * c, true, true)];
    for _ in 0..layers {
        t.extend([
            (c, false, false),       // ln1 weight
            (c, false, false),       // ln1 bias
            (3 * c * c, true, true), // qkv
            (3 * c, false, true),
            (c * c, true, true), // attention projection
            (c, false, true),
            (c, false, false),     // ln2 weight
            (c, false, false),     // ln2 bias
            (ffn * c, true, true), // fc
            (ffn, false, true),
            (c * ffn, true, true), // fc projection
            (c, false, true),
        ]);
    }
    t.extend([(c, false, false), (c, false, false)]); // ln_f
    t
}

/// Deterministic values in [lo, hi) (none zero for lo > 0).
fn values(n: usize, seed: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n)
        .map(|i| lo + (hi - lo) * ((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0)
        .collect()
}

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
    dev.synchronize().unwrap();
    let host = start.elapsed().as_secs_f64() * 1e6 / ITERS as f64;
    (ms * 1e3 / ITERS as f64, host)
}

fn main() {
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("adamw_bench: no usable CUDA device: {e}");
            return;
        }
    };
    let info = dev.info();
    let shapes = seed_model();
    let total: usize = shapes.iter().map(|s| s.0).sum();
    println!(
        "{} {}: {} tensors, {total} parameters",
        info.name,
        info.arch,
        shapes.len()
    );
    println!(
        "{:<18} {:>5} {:>10} {:>10} {:>10} {:>10}",
        "op", "grad", "MB", "µs", "GB/s", "host µs"
    );
    for gdt in [DType::F32, DType::BF16] {
        let mut params: Vec<Param> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(n, matrix, copy))| {
                param(&dev, i, n, gdt, copy, if matrix { 0.1 } else { 0.0 })
            })
            .collect();
        let gsize = gdt.size_bytes();

        // sum_squares_many over every gradient, accumulating into a scratch slot.
        let mut norm = dev.alloc(DType::F32, 1).unwrap();
        dev.fill(&mut norm, 0.0).unwrap();
        let grads: Vec<&_> = params.iter().map(|p| &p.grad).collect();
        let (us, host) = time(&dev, || {
            dev.exec(SumSquaresMany {
                xs: &grads,
                out: &mut norm,
                slot: 0,
            })
            .unwrap()
        });
        let bytes = (total * gsize) as f64;
        row("sum_squares_many", gdt, bytes, us, host);
        drop(grads);

        // adamw_clipped with a fixed sum of squares (clipping active), lr and bias corrections.
        let (scalars, step) = clipped_step(&dev);
        let (us, host) = time(&dev, || {
            let mut ts = tensors(&mut params);
            dev.exec(AdamWClipped {
                tensors: &mut ts,
                step: &step,
                scalars: &scalars,
            })
            .unwrap()
        });
        // Read param, grad, m, v; write param, m, v and the copies.
        let copies: usize = params
            .iter()
            .filter_map(|p| p.copy.as_ref().map(|c| c.len() * 2))
            .sum();
        let bytes = (total * (4 * 3 * 2 + gsize) + copies) as f64;
        row("adamw_clipped", gdt, bytes, us, host);
    }
    fp8_weights(&dev);
}

/// The FP8 weight update of two layers of the large preset (d_model 2048, FFN 8192: the qkv,
/// projection, fc and fc-projection matrices, bf16 gradients, E4M3 codes and their transposes),
/// with bf16 working copies (`copy`: the update, then the quantisation of the copies) and
/// without (`f32`: the weights themselves are f32, as FP8 models hold them): `adamw_clipped_fp8`
/// with its fused kernels (`adamw_fp8_<D>`, then `transpose_codes_many`) against the separate
/// ops (`adamw_clipped`, then `quantize_fp8_many`). Bytes per element: the update reads param,
/// m, v (f32) and the gradient (bf16) and writes param, m, v (26), plus 2 for a copy; the
/// quantisation reads the copy or the weight (2 or 4) and writes both codes (2); the fused
/// update writes the codes (1) and the transpose reads and writes them (2).
fn fp8_weights(dev: &CudaDevice) {
    use duet_device::AdamWFp8Out;
    let (c, f) = (2048usize, 8192usize);
    let shapes: Vec<(usize, usize)> = (0..2)
        .flat_map(|_| [(3 * c, c), (c, c), (f, c), (c, f)])
        .collect();
    let total: usize = shapes.iter().map(|(r, k)| r * k).sum();
    println!("fp8 weights: {} matrices, {total} parameters", shapes.len());
    let setup = |copies: bool| -> Vec<Param> {
        shapes
            .iter()
            .enumerate()
            .map(|(i, &(r, k))| param(dev, i, r * k, DType::BF16, copies, 0.1))
            .collect()
    };
    let mut codes: Vec<[duet_cuda::CudaBuffer; 2]> = shapes
        .iter()
        .map(|(r, k)| {
            [
                dev.alloc(DType::F8E4M3, r * k).unwrap(),
                dev.alloc(DType::F8E4M3, r * k).unwrap(),
            ]
        })
        .collect();
    let scale = dev.upload_new(&vec![200.0f32; 3 * shapes.len()]).unwrap();
    let mut amax = dev.alloc(DType::F32, 3 * shapes.len()).unwrap();
    dev.fill(&mut amax, 0.0).unwrap();
    let (scalars, step) = clipped_step(dev);
    let mut run = |params: &mut Vec<Param>, fused: Option<bool>| {
        let mut ts = tensors(params);
        let mut outs: Vec<AdamWFp8Out<'_, _>> = codes
            .iter_mut()
            .zip(&shapes)
            .enumerate()
            .map(|(i, ([d, dt], &(r, k)))| AdamWFp8Out {
                tensor: i,
                dst: d,
                dst_t: Some(dt),
                rows: r,
                cols: k,
                slot: 3 * i + 1,
            })
            .collect();
        match fused {
            Some(on) => {
                CudaDevice::adamw_fp8_fused_on_this_thread(on);
                dev.exec(AdamWClippedFp8 {
                    tensors: &mut ts,
                    step: &step,
                    scalars: &scalars,
                    outs: &mut outs,
                    scale: &scale,
                    amax: &mut amax,
                })
                .unwrap();
                CudaDevice::adamw_fp8_fused_on_this_thread(true);
            }
            None => dev
                .exec(AdamWClipped {
                    tensors: &mut ts,
                    step: &step,
                    scalars: &scalars,
                })
                .unwrap(),
        }
    };
    let t = total as f64;
    let mut with_copies = setup(true);
    let (us, host) = time(dev, || run(&mut with_copies, None));
    row("copy: update", DType::BF16, 28.0 * t, us, host);
    let (us, host) = time(dev, || run(&mut with_copies, Some(false)));
    row("copy: +quantise", DType::BF16, 32.0 * t, us, host);
    drop(with_copies);
    let mut f32_weights = setup(false);
    let (us, host) = time(dev, || run(&mut f32_weights, None));
    row("f32: update", DType::BF16, 26.0 * t, us, host);
    let (us, host) = time(dev, || run(&mut f32_weights, Some(false)));
    row("f32: +quantise", DType::BF16, 32.0 * t, us, host);
    let (us, host) = time(dev, || run(&mut f32_weights, Some(true)));
    row("f32: fused", DType::BF16, 29.0 * t, us, host);
}

/// Tensor `i` of `n` elements: f32 weights and moments, a gradient of dtype `gdt` (values
/// seeded by `i`), a bf16 working copy if `copy`.
fn param(dev: &CudaDevice, i: usize, n: usize, gdt: DType, copy: bool, weight_decay: f32) -> Param {
    let put = |dtype: DType, data: &[f32]| {
        let mut b = dev.alloc(dtype, n).unwrap();
        if dtype == DType::BF16 {
            let h: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            dev.upload(&h, &mut b, 0).unwrap();
        } else {
            dev.upload(data, &mut b, 0).unwrap();
        }
        b
    };
    Param {
        param: put(DType::F32, &values(n, 4 * i, -0.05, 0.05)),
        grad: put(gdt, &values(n, 4 * i + 1, -1e-3, 1e-3)),
        m: put(DType::F32, &values(n, 4 * i + 2, -1e-4, 1e-4)),
        v: put(DType::F32, &values(n, 4 * i + 3, 1e-9, 1e-7)),
        copy: copy.then(|| dev.alloc(DType::BF16, n).unwrap()),
        weight_decay,
    }
}

/// The device scalars of a step with a fixed sum of squares (clipping active), lr and bias
/// corrections (step 10), and the step's constants.
/// The optimizer's view of the benchmark's parameters.
fn tensors(params: &mut [Param]) -> Vec<AdamWTensor<'_, duet_cuda::CudaBuffer>> {
    params
        .iter_mut()
        .map(|p| AdamWTensor {
            param: &mut p.param,
            grad: &p.grad,
            m: &mut p.m,
            v: &mut p.v,
            copy: p.copy.as_mut(),
            weight_decay: p.weight_decay,
        })
        .collect()
}

fn clipped_step(dev: &CudaDevice) -> (duet_cuda::CudaBuffer, AdamWClipStep) {
    let mut scalars = dev.alloc(DType::F32, ADAMW_SCALARS).unwrap();
    let (bc1, bc2) = AdamWStep::bias_corrections(0.9, 0.95, 10);
    dev.upload(&[4.0f32, 3e-4, bc1, bc2], &mut scalars, 0)
        .unwrap();
    let step = AdamWClipStep {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        max_norm: 1.0,
        loss_scale: 1.0,
    };
    (scalars, step)
}

fn row(op: &str, gdt: DType, bytes: f64, us: f64, host: f64) {
    println!(
        "{op:<18} {:>5} {:>10.1} {us:>10.1} {:>10.0} {host:>10.1}",
        gdt.to_string(),
        bytes / 1e6,
        bytes / (us * 1e-6) / 1e9
    );
}
