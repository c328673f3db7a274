//! Data parallelism on the CPU's in-process collective: ranks × local batch must train like one
//! rank with the whole batch, replicated or with ZeRO-1, in every precision path.

use duet_cpu::{CpuDevice, CpuGroup};
use duet_device::Collective;
use duet_engine::dist::DpOptions;
use duet_engine::precision::WeightGradDtype;
use duet_engine::{Config, Precision, Preset, Trainer};
use std::sync::Arc;

const STEPS: usize = 5;

fn cfg(precision: Precision) -> Config {
    let mut c = Config::preset(Preset::Tiny);
    c.train.data.batch = 16;
    c.train.recipe.precision = precision;
    // Clipping engages, so the agreed global norm matters.
    c.train.optimizer.grad_clip = 0.5;
    // Data-parallel runs keep f32 weight gradients (summed over ranks in f32): so does the
    // single-device run they are compared with.
    c.train.recipe.weight_grad_dtype = WeightGradDtype::F32;
    c
}

type Fp8Scales = Option<Vec<f32>>;

/// Full-precision weights (masters), losses, grad norms and FP8 scales of a single-device run.
fn single(c: &Config) -> (Vec<Vec<f32>>, Vec<f32>, Vec<f32>, Fp8Scales) {
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let mut tr = Trainer::new(dev, c.clone()).unwrap();
    let (mut losses, mut norms) = (vec![], vec![]);
    for _ in 0..STEPS {
        let r = tr.train_step().unwrap();
        losses.push(r.loss);
        norms.push(r.grad_norm);
    }
    let scales = fp8_scales(&tr);
    (tr.checkpoint().unwrap().weights, losses, norms, scales)
}

fn fp8_scales(tr: &Trainer<CpuDevice>) -> Fp8Scales {
    tr.model()
        .fp8_state()
        .unwrap()
        .map(|ops| ops.iter().map(|o| o.scale).collect())
}

struct RankResult {
    weights: Vec<Vec<f32>>,
    working: Vec<Vec<f32>>,
    losses: Vec<f32>,
    norms: Vec<f32>,
    fp8: Fp8Scales,
}

/// Runs `f` on every rank of a `world`-rank in-process group (one thread each) and returns the
/// ranks' results in rank order.
fn on_ranks<T: Send + 'static>(
    world: usize,
    f: impl Fn(Arc<CpuDevice>, Arc<dyn Collective<CpuDevice>>) -> T + Clone + Send + 'static,
) -> Vec<T> {
    let devs: Vec<_> = (0..world)
        .map(|_| Arc::new(CpuDevice::new(Some(1)).unwrap()))
        .collect();
    let comms = CpuGroup::communicators(devs.clone()).unwrap();
    let handles: Vec<_> = comms
        .into_iter()
        .zip(devs)
        .map(|(comm, dev)| {
            let f = f.clone();
            std::thread::spawn(move || f(dev, Arc::new(comm)))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every rank's result of a `world`-rank run (threads sharing an in-process group).
fn parallel(c: &Config, world: usize, opts: DpOptions) -> Vec<RankResult> {
    let c = c.clone();
    on_ranks(world, move |dev, comm| {
        let mut tr = Trainer::new_data_parallel(dev, c.clone(), comm, opts).unwrap();
        let (mut losses, mut norms) = (vec![], vec![]);
        for _ in 0..STEPS {
            let r = tr.train_step().unwrap();
            losses.push(r.loss);
            norms.push(r.grad_norm);
        }
        RankResult {
            weights: tr.checkpoint().unwrap().weights,
            working: tr.model().weights().unwrap(),
            losses,
            norms,
            fp8: fp8_scales(&tr),
        }
    })
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn check(precision: Precision, zero: bool, tol: f32) {
    check_world(precision, zero, tol, 2, 16);
}

fn check_world(precision: Precision, zero: bool, tol: f32, world: usize, batch: usize) {
    let mut c = cfg(precision);
    c.train.data.batch = batch;
    let (w1, l1, n1, s1) = single(&c);
    // Small buckets: several per step, shards that cut across parameters.
    let opts = DpOptions {
        zero,
        bucket_bytes: 8 << 10,
        ..DpOptions::default()
    };
    let ranks = parallel(&c, world, opts);
    for r in &ranks[1..] {
        assert_eq!(r.working, ranks[0].working, "ranks hold identical weights");
        assert_eq!(r.losses, ranks[0].losses);
        assert_eq!(r.norms, ranks[0].norms);
        assert_eq!(r.fp8, ranks[0].fp8, "ranks keep the same FP8 scales");
    }
    let r = &ranks[0];
    let d = max_diff(&w1, &r.weights);
    eprintln!("{precision} zero={zero} world={world}: max |Δw| after {STEPS} steps = {d:e}");
    assert!(
        d <= tol,
        "{world} ranks × {} vs 1 × {batch}: max |Δw| {d:e} > {tol:e}",
        batch / world
    );
    // The weights moved (lr 1e-3, five steps): the comparison is not trivially met.
    let init = duet_engine::model::init_weights(&c.model, c.train.data.seed);
    assert!(max_diff(&init, &r.weights) > 1e-3);
    for (a, b) in l1.iter().zip(&r.losses) {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "losses {l1:?} vs {:?}",
            r.losses
        );
    }
    assert_eq!(s1.is_some(), precision == Precision::Fp8);
    if let (Some(a), Some(b)) = (&s1, &r.fp8) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "fp8 scales {a:?} vs {b:?}");
        }
    }
    // (bf16's flipped working copies, see two_ranks_match_one_rank_bf16_zero1, move the later
    // steps' norms by up to 3e-4 relative.)
    let norm_tol = if precision == Precision::Bf16 {
        1e-3
    } else {
        1e-4
    };
    for (a, b) in n1.iter().zip(&r.norms) {
        assert!(
            (a - b).abs() <= norm_tol * a.abs(),
            "norms {n1:?} vs {:?}",
            r.norms
        );
    }
}

#[test]
fn two_ranks_match_one_rank_fp32() {
    check(Precision::Fp32, false, 2e-6);
}

#[test]
fn two_ranks_match_one_rank_fp32_zero1() {
    check(Precision::Fp32, true, 2e-6);
}

/// bf16: the ranks sum their weight gradients in another order than one device's GEMM (f32,
/// last bits), so the global norm — and with clipping engaged (0.5 < the norm ≈ 0.7) the clip
/// factor of every weight — can differ in its last bit; a master weight that then lands on the
/// other side of a bf16 rounding boundary moves its working copy by a bf16 ulp (2^-8 relative),
/// which the next steps carry. Measured: 1.8e-7 without clipping, 5.3e-5 with it (since the
/// logits are bf16 and their gradient is written over them, the first step's norms differ in
/// the last bit); the bound 1e-4 is 1/50 of what five steps at lr 1e-3 could move a weight.
#[test]
fn two_ranks_match_one_rank_bf16_zero1() {
    check(Precision::Bf16, true, 1e-4);
}

#[test]
fn two_ranks_match_one_rank_fp16_loss_scaling() {
    check(Precision::Fp16, false, 2e-5);
}

/// FP8 delayed scaling: the amaxes are max-reduced over the ranks, so every rank's scales are
/// those of the single-device run (the max over the whole batch).
#[test]
fn two_ranks_match_one_rank_fp8_zero1() {
    check(Precision::Fp8, true, 2e-5);
}

/// A checkpoint of a ZeRO run holds the full gathered state: resuming it on two ranks is
/// exact, and it also resumes on a single device.
#[test]
fn zero1_checkpoint_resumes_exactly_and_on_any_world_size() {
    let c = cfg(Precision::Fp32);
    let opts = DpOptions {
        zero: true,
        bucket_bytes: 8 << 10,
        ..DpOptions::default()
    };
    let world = 2;
    let run = |resume: Option<duet_engine::checkpoint::Checkpoint>, steps: usize| {
        let c = c.clone();
        on_ranks(world, move |dev, comm| {
            let mut tr = match &resume {
                Some(ck) => Trainer::from_checkpoint_data_parallel(dev, ck, comm, opts).unwrap(),
                None => Trainer::new_data_parallel(dev, c.clone(), comm, opts).unwrap(),
            };
            for _ in 0..steps {
                tr.train_step().unwrap();
            }
            tr.checkpoint().unwrap()
        })
        .swap_remove(0)
    };
    let full = run(None, STEPS);
    let part = run(None, 3);
    assert_eq!(part.step, 3);
    let resumed = run(Some(part.clone()), STEPS - 3);
    assert_eq!(resumed.step, STEPS as u64);
    assert_eq!(resumed.weights, full.weights, "exact resume");
    assert_eq!(resumed.adam_m, full.adam_m);
    assert_eq!(resumed.adam_v, full.adam_v);
    let dev = Arc::new(CpuDevice::new(Some(1)).unwrap());
    let mut one = Trainer::from_checkpoint(dev, &part).unwrap();
    for _ in 3..STEPS {
        one.train_step().unwrap();
    }
    let d = max_diff(&one.checkpoint().unwrap().weights, &full.weights);
    assert!(d < 2e-6, "resumed on one device: {d:e}");
}

#[test]
fn an_uneven_batch_is_refused() {
    let mut c = cfg(Precision::Fp32);
    c.train.data.batch = 15;
    let r = parallel_err(&c, 2);
    assert!(r.contains("multiple of 2"), "{r}");
}

fn parallel_err(c: &Config, world: usize) -> String {
    let devs: Vec<_> = (0..world)
        .map(|_| Arc::new(CpuDevice::new(Some(1)).unwrap()))
        .collect();
    let comm = CpuGroup::communicators(devs.clone())
        .unwrap()
        .swap_remove(0);
    let comm: Arc<dyn Collective<CpuDevice>> = Arc::new(comm);
    match Trainer::new_data_parallel(devs[0].clone(), c.clone(), comm, DpOptions::default()) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

/// Reducing buckets during the backward pass or after it gives the same bits.
#[test]
fn overlap_does_not_change_the_result() {
    let c = cfg(Precision::Fp32);
    let run = |overlap| {
        parallel(
            &c,
            2,
            DpOptions {
                bucket_bytes: 8 << 10,
                overlap,
                ..DpOptions::default()
            },
        )
        .swap_remove(0)
    };
    let (a, b) = (run(true), run(false));
    assert_eq!(a.working, b.working);
    assert_eq!(a.losses, b.losses);
}

/// Three ranks: bucket lengths are padded to a multiple of 3 and the shards cut parameters at
/// other places than with two.
#[test]
fn three_ranks_match_one_rank_fp32_zero1() {
    check_world(Precision::Fp32, true, 2e-6, 3, 12);
}

/// Under ZeRO-1 a rank never allocates the replicated optimizer state: its memory plan counts
/// only its shard. (Its communication buffers are not in the plan, as with replicated data
/// parallelism; at these sizes they still outweigh the saving, see docs/data-parallelism.md.)
#[test]
fn zero1_ranks_plan_only_their_shard() {
    let mut c = Config::preset(Preset::Default);
    c.train.data.batch = 4;
    c.train.data.seq = 16;
    c.train.recipe.precision = Precision::Bf16;
    let optimizer_bytes = |zero: bool| -> u64 {
        let c = c.clone();
        on_ranks(2, move |dev, comm| {
            let opts = DpOptions {
                zero,
                ..DpOptions::default()
            };
            let mut tr = Trainer::new_data_parallel(dev, c.clone(), comm, opts).unwrap();
            tr.train_step().unwrap();
            tr.model().memory_plan().optimizer
        })[0]
    };
    assert_eq!(optimizer_bytes(true), optimizer_bytes(false).div_ceil(2));
}

/// One rank with the default weight-gradient dtype (`auto`): a data-parallel run keeps f32
/// weight gradients whatever its world size, since its buckets sum in f32 (a one-rank run used
/// to plan bf16 gradients, as a single-device run does, and failed at its first bucket copy),
/// and it trains exactly like a single-device run with f32 weight gradients.
#[test]
fn one_rank_with_auto_weight_grads_keeps_them_f32() {
    for precision in [Precision::Bf16, Precision::Fp8] {
        let mut c = cfg(precision);
        c.train.recipe.weight_grad_dtype = WeightGradDtype::Auto;
        let r = parallel(&c, 1, DpOptions::default());
        let (w, losses, norms, scales) = single(&cfg(precision));
        assert_eq!(max_diff(&r[0].weights, &w), 0.0, "{precision}: weights");
        for (a, b) in r[0].losses.iter().zip(&losses) {
            // The data-parallel loss is re-averaged over the ranks' target counts.
            assert!((a - b).abs() <= 1e-6 * b.abs(), "{precision}: losses");
        }
        assert_eq!(r[0].norms, norms, "{precision}: gradient norms");
        assert_eq!(r[0].fp8, scales, "{precision}: FP8 scales");
    }
}

#[test]
fn a_failed_log_write_on_rank_0_stops_every_rank_after_the_same_step() {
    use duet_engine::run::{LogKind, MetricsLog, RunPlan, run};
    use std::sync::atomic::AtomicBool;
    let mut c = cfg(Precision::Fp32);
    c.train.steps = 8;
    let dir = std::env::temp_dir().join(format!("duet-dp-logfail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.clone();
    let opts = DpOptions {
        zero: true,
        ..DpOptions::default()
    };
    let results = on_ranks(2, move |dev, comm| {
        let rank = comm.rank();
        let mut tr = Trainer::new_data_parallel(dev, c.clone(), comm, opts).unwrap();
        // Rank 0 logs to a full disk; the others log nothing (as duet train runs them).
        let mut metrics = (rank == 0).then(|| {
            MetricsLog::open(std::path::Path::new("/dev/full"), None)
                .unwrap()
                .0
        });
        let plan = RunPlan {
            last_step: 8,
            saves: Some(duet_engine::saves::CheckpointDir {
                dir: out.clone(),
                keep: 0,
                keep_best: false,
                stamp: Vec::new(),
            }),
            is_main: rank == 0,
            ..RunPlan::default()
        };
        let never = AtomicBool::new(false);
        let s = run::<_, Vec<u8>>(
            &mut tr,
            &plan,
            metrics.as_mut(),
            None,
            &never,
            &mut |_, _, _| Ok(()),
        )
        .unwrap();
        // What the CLI does next on every rank: save (ZeRO-1 gathers across the ranks).
        duet_engine::run::save_checkpoint(&tr, &out.join("checkpoint.safetensors"), rank == 0)
            .unwrap();
        (
            rank,
            tr.step(),
            s.interrupted,
            s.log_failure.map(|f| (f.log, f.step)),
        )
    });
    let (step0, step1) = (results[0].1, results[1].1);
    assert_eq!(step0, 1, "rank 0 stops after the step whose line failed");
    assert_eq!(step1, step0, "every rank stops after the same step");
    assert_eq!(results[0].3, Some((LogKind::Metrics, 1)));
    assert!(
        !results[0].2,
        "rank 0 reports the failure, not an interrupt"
    );
    assert!(
        results[1].2 && results[1].3.is_none(),
        "rank 1 stops as if interrupted"
    );
    let ck =
        duet_engine::checkpoint::Checkpoint::load(&dir.join("checkpoint.safetensors")).unwrap();
    assert_eq!(ck.step, 1);
    let _ = std::fs::remove_dir_all(&dir);
}
