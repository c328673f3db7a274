//! Data parallelism through NCCL on one GPU (world size 1): the collectives themselves, and the
//! whole data-parallel training path (bucketed all-reduce on the communication stream, ZeRO-1
//! reduce-scatter / all-gather, agreed norms and FP8 amaxes) against the plain single-GPU run.
//! Without a CUDA device or NCCL the tests print why they skip.

use duet_cuda::{CudaDevice, NcclComm};
use duet_device::{Collective, DType, DeviceExt, ReduceOp, Runtime};
use duet_engine::dist::DpOptions;
use duet_engine::precision::WeightGradDtype;
use duet_engine::{Config, Precision, Preset, Trainer};
use half::bf16;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

fn gpu(test: &str) -> Option<Arc<CudaDevice>> {
    static DEV: OnceLock<Result<Arc<CudaDevice>, String>> = OnceLock::new();
    let dev = match DEV.get_or_init(|| CudaDevice::new(0).map(Arc::new).map_err(|e| e.to_string()))
    {
        Ok(d) => d.clone(),
        Err(e) => {
            eprintln!("SKIP {test}: no usable CUDA device: {e}");
            return None;
        }
    };
    match duet_cuda::nccl::nccl_version() {
        Ok(v) => {
            eprintln!(
                "{test}: {} | NCCL {v} from {}",
                dev.info().name,
                NcclComm::library_location().unwrap_or_default()
            );
            Some(dev)
        }
        Err(e) => {
            eprintln!("SKIP {test}: NCCL is not available: {e}");
            None
        }
    }
}

fn world1(dev: &Arc<CudaDevice>) -> Arc<dyn Collective<CudaDevice>> {
    let id = NcclComm::unique_id().expect("unique id");
    Arc::new(NcclComm::new(dev.clone(), 0, 1, &id).expect("ncclCommInitRank"))
}

#[test]
fn nccl_collectives_on_one_rank() {
    let Some(dev) = gpu("nccl_collectives_on_one_rank") else {
        return;
    };
    let comm = world1(&dev);
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    assert!(
        comm.describe().starts_with("nccl 2."),
        "{}",
        comm.describe()
    );
    let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.25).collect();
    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
        let mut b = dev.upload_new(&x).unwrap();
        comm.all_reduce(&mut b, op).unwrap();
        comm.wait().unwrap();
        assert_eq!(dev.download::<f32>(&b).unwrap(), x, "{op:?}");
    }
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let src = dev.upload_new(&xb).unwrap();
    let mut dst = dev.alloc(DType::BF16, xb.len()).unwrap();
    comm.reduce_scatter(&src, &mut dst, ReduceOp::Sum).unwrap();
    let mut gathered = dev.alloc(DType::BF16, xb.len()).unwrap();
    comm.all_gather(&dst, &mut gathered).unwrap();
    comm.wait().unwrap();
    assert_eq!(dev.download::<bf16>(&gathered).unwrap(), xb);
    // FP8 all-gathers go through as bytes; reductions of FP8 are refused.
    let codes: Vec<u8> = (0..=255).collect();
    let mut f8 = dev.alloc(DType::F8E4M3, 256).unwrap();
    dev.upload(&codes, &mut f8, 0).unwrap();
    let mut f8_all = dev.alloc(DType::F8E4M3, 256).unwrap();
    comm.all_gather(&f8, &mut f8_all).unwrap();
    comm.wait().unwrap();
    assert_eq!(dev.download::<u8>(&f8_all).unwrap(), codes);
    assert!(comm.all_reduce(&mut f8, ReduceOp::Sum).is_err());
    let mut short = dev.alloc(DType::BF16, 3).unwrap();
    assert!(comm.all_gather(&dst, &mut short).is_err());
}

type RunResult = (Vec<Vec<f32>>, Vec<f32>, f64);

fn run(
    dev: &Arc<CudaDevice>,
    cfg: &Config,
    dp: Option<DpOptions>,
    steps: usize,
) -> duet_engine::Result<RunResult> {
    let mut tr = match dp {
        None => Trainer::new(dev.clone(), cfg.clone())?,
        Some(o) => Trainer::new_data_parallel(dev.clone(), cfg.clone(), world1(dev), o)?,
    };
    tr.train_step()?;
    dev.synchronize()?;
    let start = Instant::now();
    let mut losses = Vec::new();
    for _ in 1..steps {
        losses.push(tr.train_step()?.loss);
    }
    dev.synchronize()?;
    let ms = start.elapsed().as_secs_f64() * 1e3 / (steps - 1) as f64;
    Ok((tr.checkpoint()?.weights, losses, ms))
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

/// NCCL with world size 1 runs the whole data-parallel path and matches the plain run: bit for
/// bit when replicated (a one-rank sum is exact, every op is the same), within the rounding of
/// the gradient norm's summation order under ZeRO-1.
#[test]
fn nccl_world1_matches_the_plain_run() {
    let Some(dev) = gpu("nccl_world1_matches_the_plain_run") else {
        return;
    };
    let steps = 10;
    for precision in [
        Precision::Fp32,
        Precision::Bf16,
        Precision::Fp16,
        Precision::Fp8,
    ] {
        let mut cfg = Config::preset(Preset::Seed);
        cfg.train.data.batch = 8;
        cfg.train.recipe.precision = precision;
        // Data-parallel runs keep f32 weight gradients (summed over ranks in f32), whatever
        // their world size: so does the plain run they are compared with.
        cfg.train.recipe.weight_grad_dtype = WeightGradDtype::F32;
        let (w0, l0, ms0) = match run(&dev, &cfg, None, steps) {
            Ok(r) => r,
            // FP8 GEMM support depends on the GPU and cuBLASLt: when the plain run cannot train
            // in FP8 there is nothing to compare against.
            Err(e) if precision == Precision::Fp8 => {
                eprintln!("SKIP fp8: the plain single-GPU run fails here: {e}");
                continue;
            }
            Err(e) => panic!("{precision}: plain run: {e}"),
        };
        for zero in [false, true] {
            // 1 MiB buckets: several per step, so reductions start during the backward pass.
            let o = DpOptions {
                zero,
                bucket_bytes: 1 << 20,
                ..DpOptions::default()
            };
            let (w1, l1, ms1) = run(&dev, &cfg, Some(o), steps).expect("data-parallel run");
            let d = max_diff(&w0, &w1);
            eprintln!(
                "{precision} zero={zero}: max |Δw| vs plain after {steps} steps = {d:e}; \
                 {ms0:.2} ms/step plain, {ms1:.2} ms/step through NCCL; losses {:?} vs {:?}",
                &l0[l0.len() - 2..],
                &l1[l1.len() - 2..]
            );
            if zero {
                // ZeRO sums the gradient norm over shards in another order: the clipping factor
                // differs in the last bits, and in bf16/fp8 a master weight sitting on a rounding
                // boundary of its working copy can then round the other way. In bf16/fp16 that
                // stays well under one step's update (lr ≤ 1e-4 during these warm-up steps). In
                // fp8 one weight code flipping (3 mantissa bits) changes the forward pass, and
                // from then on the two runs' updates differ: each AdamW step moves a weight by
                // about lr at most, so the bound is the sum of the learning rates of the steps.
                let lr_sum: f32 = (0..steps as u64).map(|s| cfg.lr_at(s)).sum();
                let tol = match precision {
                    Precision::Fp32 => 1e-6,
                    Precision::Fp8 => lr_sum,
                    _ => 1e-4,
                };
                assert!(d < tol, "{precision} ZeRO-1: {d:e}");
            } else {
                assert_eq!(d, 0.0, "{precision}: replicated world-1 run is exact");
                for (a, b) in l0.iter().zip(&l1) {
                    // The data-parallel loss is re-averaged over the ranks' target counts.
                    assert!((a - b).abs() <= 1e-6 * a.abs(), "losses {l0:?} vs {l1:?}");
                }
            }
        }
    }
}
