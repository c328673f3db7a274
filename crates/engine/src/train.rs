//! The training loop on the arithmetic-progression task, and greedy-generation evaluation.

use crate::checkpoint::Checkpoint;
use crate::config::Config;
use crate::data::{Progressions, batch_of, keeps_stride, progression};
use crate::dataset::{Batch, DataSet, Prefetcher, Source};
use crate::dist::zero::ShardedAdamW;
use crate::dist::{Dist, DpOptions, local_batch, plan_buckets, ready_groups};
use crate::model::{Fp8Codes, Gpt, init_weights};
use crate::optim::AdamWConfig;
use crate::optim::{AdamW, StepStats};
use crate::precision::{LossScaler, Precision, PrecisionPlan};
use crate::rng::Rng;
use crate::{EngineError, Result};
use duet_device::{AddAssign, Buffer, Collective, DType, Device, DeviceExt, ReduceOp};
use std::sync::Arc;
use std::time::Instant;

/// Checkpoint metadata key of the FP8 scaling state (JSON).
pub const FP8_STATE_KEY: &str = "fp8_state";
/// Checkpoint metadata key of AdamW's step count (when it differs from the run's step count
/// because a loss scaler skipped steps).
pub const ADAM_STEPS_KEY: &str = "adam_steps";
/// Checkpoint metadata key of the data files the run read (JSON list of
/// [`crate::dataset::DataFingerprint`]).
pub const DATA_FILES_KEY: &str = "data_files";

/// Prompt and continuation lengths of the generation check.
pub const PROMPT_LEN: usize = 16;
pub const GEN_LEN: usize = 32;

/// Most steps [`Trainer::train_steps`] keeps queued before reading their losses back (longer
/// calls read back every this many steps): bounds its ring of per-step losses on the device.
pub const MAX_QUEUED_STEPS: usize = 64;

/// What one training step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// 1-based step number.
    pub step: u64,
    pub loss: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens: usize,
    /// Wall time of the step (from [`Trainer::train_steps`]: of its read-back group, divided
    /// evenly over the group's steps).
    pub seconds: f64,
    /// The loss scale this step's gradients carried (None without loss scaling).
    pub loss_scale: Option<f32>,
    /// The optimizer step was skipped (inf/NaN gradients under loss scaling).
    pub skipped: bool,
}

/// Result of the greedy-generation check on held-out progressions.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationEval {
    pub sequences: usize,
    /// Sequences whose every generated token kept the stride.
    pub exact: usize,
    /// Generated tokens that kept the stride from their predecessor.
    pub token_accuracy: f64,
}

impl GenerationEval {
    pub fn accuracy(&self) -> f64 {
        if self.sequences == 0 {
            0.0
        } else {
            self.exact as f64 / self.sequences as f64
        }
    }
}

/// Owns the model, the optimizer and the data stream of one run.
pub struct Trainer<D: Device> {
    cfg: Config,
    model: Gpt<D>,
    opt: AdamW<D>,
    /// The sampler as of the last consumed batch (the prefetcher runs ahead on a copy).
    data: Source,
    prefetch: Option<Prefetcher>,
    /// The data set of a file source (its validation parts).
    val_tokens: Option<Arc<DataSet>>,
    step: u64,
    scaler: Option<LossScaler>,
    /// Data parallelism: this rank's communicator, gradient buckets and (ZeRO) optimizer shard.
    dist: Option<Dist<D>>,
    /// The recorded step (see [`Trainer::train_step_on`]).
    graph: StepGraph<D>,
    /// [`Trainer::train_steps`]' ring of per-step slots on the device (f32): each queued step's
    /// per-row losses followed by its gradients' sum of squares.
    readback: Option<D::Buffer>,
    /// A non-finite loss that [`Trainer::train_steps`] found after returning the steps before it
    /// (step, loss): every later step and checkpoint fails with it.
    diverged: Option<(u64, f32)>,
    /// FP8 without a loss scaler or other ranks: the optimizer writes the next step's weight
    /// codes ([`Trainer::set_fp8_codes_from_optimizer`]).
    fp8_codes_from_optimizer: bool,
    /// FP8 whose scaling state starts fresh (a new run, or a checkpoint without FP8 state):
    /// the next step is calibrated first ([`Trainer::calibrate_fp8`]).
    fp8_calibrate: bool,
    /// `--record-batches`: every batch the run trains on, written as it is taken
    /// ([`Trainer::record_batches`]).
    batch_log: Option<(std::path::PathBuf, std::io::BufWriter<std::fs::File>)>,
    /// Gradient accumulation (`grad_accum` > 1): the f32 sums of the micro-batches' gradients
    /// before the last one (one buffer per parameter, as the device holds it); empty otherwise.
    accum: Vec<D::Buffer>,
}

/// The magic of a batch record file ([`Trainer::record_batches`]).
pub const BATCH_RECORD_MAGIC: &[u8; 8] = b"DUETBAT1";

/// Set to 0 (or another false value) to have the forward pass quantise the FP8 weights instead
/// of the optimizer ([`Trainer::set_fp8_codes_from_optimizer`]; for comparisons, the bits are
/// the same; [`duet_device::knobs::Knobs::fp8_codes_from_optimizer`]).
pub use duet_device::knobs::FP8_CODES_FROM_OPTIMIZER as FP8_CODES_FROM_OPTIMIZER_ENV;

/// Where the recording of the training step stands.
enum StepGraph<D: Device> {
    /// Not recorded yet, and no step run: the first step runs unrecorded, warming every
    /// buffer, table and library plan up so that the recording allocates nothing.
    Cold,
    /// One step has run: the next is recorded.
    Warm,
    /// The recorded step, for batches with this many counted targets (the loss gradient's
    /// scale is part of the recording).
    Recorded { graph: D::Graph, count: usize },
    /// Graphs are off (config), impossible for this run, or recording failed.
    Off,
}

/// Before anything is allocated: the run's host allocations — the initial weights, made on the
/// host in f32, and on the CPU backend (whose device memory is host memory) the whole memory
/// plan besides — against what this process may allocate (its cgroup's and address-space limits
/// included), and on a GPU the plan against the device's free memory. A run too large for its
/// machine, container or `ulimit -v` stops here with the sizes, not with an aborted
/// allocation. ([`Gpt::with_precision`] checks the exact plan again before allocating it.)
fn check_memory_first<D: Device>(dev: &D, cfg: &Config, world: usize, zero: bool) -> Result<()> {
    let weights = (cfg.model.num_params() as u64).saturating_mul(4);
    let batch = micro_batch(cfg, world)?;
    let mut plan = crate::model::estimate_memory(
        dev,
        &cfg.model,
        batch,
        cfg.train.data.seq,
        &precision_plan(cfg, world > 1, if zero { world } else { 1 }),
    )?;
    add_accum_buffers(&mut plan, cfg);
    let info = dev.info();
    if info.backend == "cpu" {
        crate::check_host_memory(weights.saturating_add(plan.total()), || {
            format!(
                "the model ({} parameters: initial weights {} and a memory plan of {}, the CPU \
                 backend's memory being the host's; lower the model or --batch, or turn on \
                 --checkpoint)",
                cfg.model.num_params(),
                duet_device::human_bytes(weights),
                duet_device::human_bytes(plan.total())
            )
        })
    } else {
        crate::check_host_memory(weights, || {
            format!(
                "the model's {} initial weights (made on the host before they are uploaded)",
                cfg.model.num_params()
            )
        })?;
        match dev.memory_stats().driver {
            Some((free, _)) if plan.total() > free => Err(crate::model::out_of_memory_error(
                plan.total(),
                free,
                cfg.train.execution.checkpoint_every,
            )),
            _ => Ok(()),
        }
    }
}

impl<D: Device> Trainer<D> {
    /// A fresh run: weights initialised from the config's seed.
    pub fn new(dev: Arc<D>, cfg: Config) -> Result<Self> {
        cfg.validate()?;
        check_memory_first(&*dev, &cfg, 1, false)?;
        let weights = init_weights(&cfg.model, cfg.train.data.seed);
        Self::with_weights(dev, cfg, &weights)
    }

    pub fn with_weights(dev: Arc<D>, cfg: Config, weights: &[Vec<f32>]) -> Result<Self> {
        Self::build(dev, cfg, weights, None, None)
    }

    /// A fresh run (step 0, zero AdamW moments, the config's data and schedule) starting from
    /// given weights (host f32, [`crate::model::param_specs`] order, real sizes) instead of the
    /// seed's: `duet train --init-from` ([`crate::init::load_init_weights`]). With `dp`, as one
    /// rank of a data-parallel run (every rank passes the same weights).
    pub fn from_init_weights(
        dev: Arc<D>,
        cfg: Config,
        weights: &[Vec<f32>],
        dp: Option<(Arc<dyn Collective<D>>, DpOptions)>,
    ) -> Result<Self> {
        cfg.validate()?;
        crate::model::check_weights(&crate::model::param_specs(&cfg.model), weights)?;
        let (world, zero) = match &dp {
            Some((c, o)) => (c.world_size(), o.zero),
            None => (1, false),
        };
        check_memory_first(&*dev, &cfg, world, zero)?;
        Self::build(dev, cfg, weights, dp, None)
    }

    /// One rank of a data-parallel run over `comm`'s group: `cfg.train.data.batch` is the global
    /// batch, of which this rank trains on its `1/world` slice (see [`crate::dist`]). Every rank
    /// must be created with the same config; the weights start from the config's seed.
    pub fn new_data_parallel(
        dev: Arc<D>,
        cfg: Config,
        comm: Arc<dyn Collective<D>>,
        opts: DpOptions,
    ) -> Result<Self> {
        cfg.validate()?;
        check_memory_first(&*dev, &cfg, comm.world_size(), opts.zero)?;
        let weights = init_weights(&cfg.model, cfg.train.data.seed);
        Self::build(dev, cfg, &weights, Some((comm, opts)), None)
    }

    fn build(
        dev: Arc<D>,
        cfg: Config,
        weights: &[Vec<f32>],
        dp: Option<(Arc<dyn Collective<D>>, DpOptions)>,
        known_data: Option<&[crate::dataset::DataFingerprint]>,
    ) -> Result<Self> {
        cfg.validate()?;
        if cfg.train.execution.gemm_autotune && !dev.set_gemm_autotune(true) {
            eprintln!(
                "warning: gemm_autotune: the {} backend has no GEMM autotuning; using its defaults",
                dev.info().backend
            );
        }
        // The model is planned for this rank's slice of the batch, and of that one micro-batch.
        let mut local = cfg.clone();
        let world = dp.as_ref().map_or(1, |(comm, _)| comm.world_size());
        local.train.data.batch = micro_batch(&cfg, world)?;
        let accumulating = cfg.train.data.grad_accum > 1;
        // Under ZeRO-1 the replicated optimizer state is never allocated: each rank holds only
        // its shard, and the model's memory plan counts only that.
        let zero_shards = match &dp {
            Some((comm, o)) if o.zero => comm.world_size(),
            _ => 1,
        };
        // Accumulated gradients are summed in f32 (as data-parallel ones are reduced).
        let model = build_model(
            dev.clone(),
            &local,
            weights,
            dp.is_some() || accumulating,
            zero_shards,
        )?;
        let accum = if accumulating {
            model
                .grads()
                .iter()
                .map(|g| dev.alloc(DType::F32, g.len()))
                .collect::<std::result::Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        let scaler = build_scaler(&local);
        let opt = if matches!(&dp, Some((_, o)) if o.zero) {
            AdamW::new(&*dev, adamw_config(&local), &[])?
        } else {
            build_optimizer(&*dev, &local, &model, weights)?
        };
        let dist = match dp {
            None => None,
            Some((comm, o)) => {
                // Buckets and shards cover the buffers as the device holds them (padded rows
                // included).
                let numels: Vec<usize> = model.specs().iter().map(|s| s.device_numel()).collect();
                let dtypes: Vec<_> = model.params().iter().map(|p| p.dtype()).collect();
                let groups = ready_groups(cfg.model.layers, numels.len());
                let buckets =
                    plan_buckets(&groups, &numels, &dtypes, o.bucket_bytes, comm.world_size());
                let zero = if o.zero {
                    let ocfg = *opt.config();
                    let decay: Vec<bool> = model.specs().iter().map(|s| s.decay).collect();
                    let padded: Vec<Vec<f32>> = crate::model::pad(model.specs(), weights)
                        .into_iter()
                        .map(|w| w.into_owned())
                        .collect();
                    Some(ShardedAdamW::new(
                        &*dev,
                        ocfg,
                        comm.clone(),
                        buckets.clone(),
                        decay,
                        &padded,
                    )?)
                } else {
                    None
                };
                Some(Dist::new(&*dev, comm, buckets, zero, o.overlap)?)
            }
        };
        let t = &cfg.train;
        let (data, val_tokens) = if t.data.data.is_empty() {
            (
                Source::Progressions(Progressions::new(
                    cfg.model.vocab,
                    t.data.max_stride,
                    t.data.seed,
                )),
                None,
            )
        } else {
            let files =
                crate::dataset::resolve_data(&t.data.data, &t.data.val_data, t.data.data_format)?;
            let set = Arc::new(DataSet::open_known(&files, t.data.seq, known_data)?);
            if set.vocab_needed > cfg.model.vocab {
                return Err(EngineError::Data {
                    path: set.largest_token_shard().path.display().to_string(),
                    message: format!(
                        "holds token ids up to {} but the model's vocab is {} (use --vocab {} or more)",
                        set.vocab_needed - 1,
                        cfg.model.vocab,
                        set.vocab_needed
                    ),
                });
            }
            let src = Source::File {
                data: set.clone(),
                rng: Rng::derive(t.data.seed, 3),
            };
            (src, Some(set))
        };
        let fp8_calibrate = model.fp8_enabled();
        Ok(Self {
            cfg,
            model,
            opt,
            data,
            prefetch: None,
            val_tokens,
            step: 0,
            scaler,
            dist,
            graph: StepGraph::Cold,
            readback: None,
            batch_log: None,
            diverged: None,
            fp8_codes_from_optimizer: duet_device::knobs::device_knobs()?.fp8_codes_from_optimizer,
            fp8_calibrate,
            accum,
        })
    }

    /// The data-parallel state, when this trainer is one rank of several.
    pub fn dist(&self) -> Option<&Dist<D>> {
        self.dist.as_ref()
    }

    /// Whether `flag` is set on any rank (e.g. an interrupt that must stop every rank after
    /// the same step); `flag` itself on a single device. Collective: every rank must call it.
    pub fn any_rank(&mut self, flag: bool) -> Result<bool> {
        match self.dist.as_mut() {
            None => Ok(flag),
            Some(d) => {
                let dev = self.model.device().clone();
                Ok(d.sum2(&*dev, flag as u8 as f32, 0.0)?.0 > 0.0)
            }
        }
    }

    /// AdamW's own step count (the run's step count minus loss-scaler skips).
    pub fn optimizer_steps(&self) -> u64 {
        match self.dist.as_ref().and_then(|d| d.zero.as_ref()) {
            Some(z) => z.steps_taken(),
            None => self.opt.steps_taken(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn model(&self) -> &Gpt<D> {
        &self.model
    }

    /// The run's device memory plan: the model's, plus the f32 sums of gradient accumulation.
    pub fn memory_plan(&self) -> crate::model::MemoryPlan {
        let mut plan = self.model.memory_plan().clone();
        add_accum_buffers(&mut plan, &self.cfg);
        plan
    }

    pub fn model_mut(&mut self) -> &mut Gpt<D> {
        &mut self.model
    }

    /// The loss scaler, when the run uses one (fp16, or a static `loss_scale`).
    pub fn loss_scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Replaces the loss scaler (e.g. a dynamic one with another initial scale).
    pub fn set_loss_scaler(&mut self, scaler: Option<LossScaler>) {
        self.scaler = scaler;
        self.graph = StepGraph::Cold;
    }

    /// FP8: whether the optimizer writes the weight codes of the next step
    /// ([`Gpt::update_params_with_fp8_codes`], one pass over the weights instead of the update
    /// and a quantisation at the start of the next forward pass; on by default) or the forward
    /// pass quantises the weights. Both give the same bits. Applies to steps without a loss
    /// scaler on one device.
    pub fn set_fp8_codes_from_optimizer(&mut self, on: bool) {
        self.fp8_codes_from_optimizer = on;
        self.graph = match self.graph {
            StepGraph::Off => StepGraph::Off,
            _ => StepGraph::Cold,
        };
    }

    /// Whether this step's update writes the FP8 weight codes (FP8, switched on, no loss
    /// scaler, one device).
    fn fp8_codes_in_update(&self) -> bool {
        self.fp8_codes_from_optimizer
            && self.model.fp8_enabled()
            && self.scaler.is_none()
            && self.dist.is_none()
    }

    /// Where the FP8 weight codes stand after a queued step ([`Trainer::queue_step`]).
    fn fp8_codes_after_step(&self) -> Fp8Codes {
        if self.fp8_codes_in_update() {
            Fp8Codes::WRITTEN
        } else {
            Fp8Codes::default()
        }
    }

    /// The update of a step without a loss scaler, and FP8's delayed-scaling update, queued on
    /// the device. With [`Trainer::fp8_codes_in_update`] the scaling update runs first and
    /// the optimizer writes the next step's weight codes with the scales it set; otherwise the
    /// scaling update runs after the optimizer. The same bits either way.
    fn queue_update(&mut self) -> Result<()> {
        let dev = self.model.device().clone();
        if self.fp8_codes_in_update() {
            self.model.fp8_update()?;
            let opt = &mut self.opt;
            self.model
                .update_params_with_fp8_codes(|params, grads, codes| {
                    opt.queue_device_step_fp8(&*dev, params, grads, codes)
                })
        } else {
            let (params, grads) = self.model.params_and_grads();
            self.opt.queue_device_step(&*dev, params, grads, None)?;
            self.model.fp8_update()
        }
    }

    pub fn optimizer(&self) -> &AdamW<D> {
        &self.opt
    }

    /// Steps completed so far.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// One step on the next batch of the run's data (prefetched on a background thread).
    pub fn train_step(&mut self) -> Result<StepReport> {
        let batch = self.next_batch()?;
        let report = self.train_step_on(&batch.inputs, &batch.targets)?;
        self.data.set_state(batch.state_after);
        Ok(report)
    }

    /// The next batch of the run's data, from the prefetcher (started on first use).
    fn next_batch(&mut self) -> Result<Batch> {
        let (b, t) = (self.cfg.train.data.batch, self.cfg.train.data.seq);
        let data = &self.data;
        let batch = self
            .prefetch
            .get_or_insert_with(|| Prefetcher::start(data.clone(), b, t, 2))
            .next_batch()?;
        if let Some((path, w)) = &mut self.batch_log {
            use std::io::Write;
            let mut bytes = Vec::with_capacity(8 * batch.inputs.len());
            for x in batch.inputs.iter().chain(&batch.targets) {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            w.write_all(&bytes)
                .and_then(|()| w.flush())
                .map_err(|e| EngineError::Io {
                    path: path.display().to_string(),
                    message: format!("cannot record the batch: {e}"),
                })?;
        }
        Ok(batch)
    }

    /// Writes every batch the run trains on from now on to `path` (created or truncated), for
    /// replaying the same steps in another framework (scripts/bench/torch_train_ref.py): the
    /// 8 bytes [`BATCH_RECORD_MAGIC`], the batch size and the sequence length (u32 LE each),
    /// then per step the batch's inputs and its targets (batch × seq i32 LE each; a negative
    /// target is ignored by the loss). One process only: a data-parallel rank sees its share.
    pub fn record_batches(&mut self, path: &std::path::Path) -> Result<()> {
        if self.dist.is_some() {
            return Err(EngineError::Config(
                "--record-batches records one process's batches: not with data parallelism".into(),
            ));
        }
        let io = |e: std::io::Error| EngineError::Io {
            path: path.display().to_string(),
            message: format!("cannot create the batch record: {e}"),
        };
        let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        use std::io::Write;
        let (b, t) = (
            self.cfg.train.data.batch as u32,
            self.cfg.train.data.seq as u32,
        );
        w.write_all(BATCH_RECORD_MAGIC).map_err(io)?;
        w.write_all(&b.to_le_bytes()).map_err(io)?;
        w.write_all(&t.to_le_bytes()).map_err(io)?;
        w.flush().map_err(io)?;
        self.batch_log = Some((path.to_path_buf(), w));
        Ok(())
    }

    /// `n` steps on the next batches of the run's data (like `n` calls of
    /// [`Trainer::train_step`]) with one host synchronisation: where no step needs the host (no
    /// loss scaler, one device) every step is queued without reading anything back — its
    /// per-row losses and gradient norm are copied on the device, in stream order, into a slot
    /// of a ring buffer — and one download after the last step brings every loss and norm back.
    /// The device runs the same work as for single steps, so the reports and the weights are
    /// the same bits. Runs with a loss scaler (it decides skips on the host) or several ranks
    /// run `n` ordinary steps. Calls longer than [`MAX_QUEUED_STEPS`] read back every that
    /// many steps.
    ///
    /// Each report's `seconds` is the wall time of its read-back group divided evenly over its
    /// steps (the steps overlap on the device, so there is no per-step time to measure).
    ///
    /// The losses are checked in order, as [`Trainer::train_step`] checks each. A non-finite
    /// loss is found only at the read-back, after the later steps of the group have run too:
    /// when steps before it were finite their reports are returned (so none is lost), and the
    /// [`EngineError::Diverged`] a single step would have returned (same step, same loss) comes
    /// back from the next call of [`Trainer::train_steps`], [`Trainer::train_step`],
    /// [`Trainer::train_step_on`] or [`Trainer::checkpoint`] — the device state is past the
    /// diverged step, so it can no longer be saved; the last checkpoint on disk is untouched.
    ///
    /// A batch that cannot be read ([`EngineError::DataChanged`]: a shard truncated while the
    /// run read it) ends the call before its step, the trainer at the step before it (which
    /// may be saved): the steps before it are returned, and the error comes back from the next
    /// call (the prefetcher gives it again).
    pub fn train_steps(&mut self, n: usize) -> Result<Vec<StepReport>> {
        self.check_diverged()?;
        let mut reports = Vec::with_capacity(n);
        match self.run_steps(n, &mut reports) {
            Ok(()) => Ok(reports),
            Err(EngineError::Diverged { step, loss }) if !reports.is_empty() => {
                self.diverged = Some((step, loss));
                Ok(reports)
            }
            Err(EngineError::DataChanged { .. }) if !reports.is_empty() => Ok(reports),
            Err(e) => Err(e),
        }
    }

    /// [`Trainer::train_steps`]' steps, appended to `out` as they are read back.
    fn run_steps(&mut self, n: usize, out: &mut Vec<StepReport>) -> Result<()> {
        if n == 1 || !self.defers_readback() {
            for _ in 0..n {
                out.push(self.train_step()?);
            }
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            let m = left.min(MAX_QUEUED_STEPS);
            self.queued_steps(m, out)?;
            left -= m;
        }
        Ok(())
    }

    /// Whether a step's loss and gradient norm may stay on the device until later: nothing in
    /// the step needs them on the host (no loss scaler deciding skips, no other ranks).
    fn defers_readback(&self) -> bool {
        self.scaler.is_none() && self.dist.is_none() && self.accum.is_empty()
    }

    /// `m` steps (1 ≤ m ≤ [`MAX_QUEUED_STEPS`]) queued back to back, each followed by
    /// device-to-device copies of its per-row losses and its gradients' sum of squares into
    /// its slot of the read-back ring; then one download of the `m` slots.
    ///
    /// Host memory and queued work: uploading step i+1's batch ([`Gpt::load_batch`]) and
    /// scalars ([`AdamW::prepare_device_step`]) while step i is still queued overwrites device
    /// buffers step i reads, but the upload is ordered after step i on the same stream, so step
    /// i has read them by then. The host side of an upload is free as soon as the call returns:
    /// CUDA copies the source bytes into a pinned staging chunk before queueing the DMA (the
    /// source slice is read synchronously), and reuses a chunk only after waiting for the event
    /// of its previous copy, so a deep queue makes the host wait there, never overwrites the
    /// source of a pending DMA; HIP uploads from the pageable source and synchronises the
    /// stream before returning (synchronous with respect to the host); the CPU copies at once.
    /// The ring slots are only written by the queued copies and read after the download's
    /// synchronisation. The ring is allocated before anything is queued, never while a step is
    /// being recorded.
    fn queued_steps(&mut self, m: usize, out: &mut Vec<StepReport>) -> Result<()> {
        let start = Instant::now();
        let dev = self.model.device().clone();
        let rows = self.model.row_losses().len();
        let slot = rows + 1;
        if self.readback.as_ref().is_none_or(|r| r.len() < m * slot) {
            // Sized for the configured read-back interval, so a run allocates it once.
            let every = self
                .cfg
                .train
                .execution
                .loss_every
                .min(MAX_QUEUED_STEPS as u64) as usize;
            let slots = every.max(m);
            self.readback = None;
            self.readback = Some(dev.alloc(DType::F32, slots * slot)?);
        }
        // (lr, tokens, counted targets) of each queued step.
        let mut queued = Vec::with_capacity(m);
        // A batch that cannot be read after steps were queued: those steps are read back (the
        // trainer stays at a step boundary), then the error is returned.
        let mut unread = None;
        for i in 0..m {
            let batch = match self.next_batch() {
                Ok(b) => b,
                Err(e) if i > 0 => {
                    unread = Some(e);
                    break;
                }
                Err(e) => return Err(e),
            };
            let lr = self.cfg.lr_at(self.step + i as u64);
            let count = self.queue_loaded_step(&batch.inputs, &batch.targets, lr)?;
            let ring = self.readback.as_mut().expect("allocated above");
            dev.copy(self.model.row_losses(), 0, ring, i * slot, rows)?;
            dev.copy(self.opt.step_scalars(), 0, ring, i * slot + rows, 1)?;
            self.data.set_state(batch.state_after);
            queued.push((lr, batch.inputs.len(), count));
        }
        let ring = self.readback.as_ref().expect("allocated above");
        let n = queued.len();
        let back: Vec<f32> = dev.download_range(ring, 0, n * slot)?;
        let seconds = start.elapsed().as_secs_f64() / n as f64;
        for (s, (lr, tokens, count)) in back.chunks_exact(slot).zip(queued) {
            // What Gpt::read_loss and AdamW::device_step_stats compute from the same values.
            let loss = mean_loss(&s[..rows], count);
            check_finite(self.step, loss)?;
            let stats = self.opt.config().plan(s[rows].sqrt(), None).stats;
            out.push(self.finish_step(loss, lr, &stats, tokens, seconds)?);
        }
        unread.map_or(Ok(()), Err)
    }

    /// The error of a divergence [`Trainer::train_steps`] found after returning the steps
    /// before it.
    fn check_diverged(&self) -> Result<()> {
        match self.diverged {
            Some((step, loss)) => Err(EngineError::Diverged { step, loss }),
            None => Ok(()),
        }
    }

    /// Whether [`Trainer::validation_loss`] has a batch to evaluate: a file's held-out tail
    /// always gives one; the synthetic task's held-out progressions must fill one batch.
    pub fn has_validation_data(&self) -> bool {
        match (&self.val_tokens, &self.data) {
            (Some(_), _) => true,
            (None, Source::Progressions(p)) => {
                let b = self.cfg.train.data.batch;
                p.held_out_pairs(4 * b, self.cfg.train.data.seed ^ 0x5a11)
                    .len()
                    >= b
            }
            (None, _) => false,
        }
    }

    /// Mean loss over the validation set: at most `val_batches` batches of fixed windows of the
    /// validation shards (or the training shards' held-out tails), or the
    /// held-out progressions (teacher-forced) for the synthetic task.
    pub fn validation_loss(&mut self) -> Result<f32> {
        // The forward passes record their amaxes into the FP8 scaling state, which would move
        // the next training steps' scales: a run's numbers would depend on how often it
        // validates. The state is put back as it was.
        let fp8 = self.model.fp8_state()?;
        let v = self.validation_loss_inner();
        if let Some(state) = fp8 {
            self.model.set_fp8_state(&state)?;
        }
        v
    }

    fn validation_loss_inner(&mut self) -> Result<f32> {
        let (b, t) = (self.cfg.train.data.batch, self.cfg.train.data.seq);
        let batches = match &self.val_tokens {
            Some(f) => f.validation_batches(b, t, self.cfg.train.data.val_batches)?,
            None => {
                let Source::Progressions(p) = &self.data else {
                    unreachable!("no file, synthetic data")
                };
                let pairs = p.held_out_pairs(4 * b, self.cfg.train.data.seed ^ 0x5a11);
                pairs
                    .chunks(b)
                    .filter(|c| c.len() == b)
                    .map(|c| batch_of(self.cfg.model.vocab, c, t))
                    .collect()
            }
        };
        if batches.is_empty() {
            return Err(EngineError::Config(
                "no validation data for this batch size".into(),
            ));
        }
        if let Some(dist) = self.dist.as_mut() {
            // Each rank evaluates its rows of every batch; the sums of losses and the target
            // counts are added over the ranks.
            // (With gradient accumulation, each rank's rows in micro-batches.)
            let m = self.model.batch_size() * t;
            let (rank, n) = (dist.rank(), m * self.cfg.train.data.grad_accum);
            let (mut sum, mut count) = (0f64, 0f64);
            for (x, y) in &batches {
                let (xr, yr) = (&x[rank * n..(rank + 1) * n], &y[rank * n..(rank + 1) * n]);
                for (xs, ys) in xr.chunks(m).zip(yr.chunks(m)) {
                    let c = ys.iter().filter(|&&v| v >= 0).count();
                    if c > 0 {
                        self.model.forward(xs)?;
                        sum += self.model.loss(ys, false)? as f64 * c as f64;
                        count += c as f64;
                    }
                }
            }
            let dev = self.model.device().clone();
            let (s, c) = dist.sum2(&*dev, sum as f32, count as f32)?;
            return Ok(s / c.max(1.0));
        }
        let mut total = 0f64;
        let n = self.model.batch_size() * t;
        for (x, y) in &batches {
            if n == x.len() {
                self.model.forward(x)?;
                total += self.model.loss(y, false)? as f64;
                continue;
            }
            // Accumulating: the batch in micro-batches, its mean from theirs by their counts.
            let (mut sum, mut count) = (0f64, 0usize);
            for (xs, ys) in x.chunks(n).zip(y.chunks(n)) {
                let c = ys.iter().filter(|&&v| v >= 0).count();
                if c > 0 {
                    self.model.forward(xs)?;
                    sum += self.model.loss(ys, false)? as f64 * c as f64;
                    count += c;
                }
            }
            total += sum / count.max(1) as f64;
        }
        Ok((total / batches.len() as f64) as f32)
    }

    /// Unigram entropy (nats/token) of a file source's training tokens.
    pub fn unigram_entropy(&self) -> Result<Option<f64>> {
        self.val_tokens
            .as_ref()
            .map(|f| f.unigram_entropy())
            .transpose()
    }

    /// The complete resumable state of the run. Under ZeRO the optimizer state is gathered from
    /// every rank, so every rank must call this (only one needs to save the result).
    pub fn checkpoint(&self) -> Result<Checkpoint> {
        self.check_diverged()?;
        let dev = self.model.device().clone();
        let download = |bufs: &[D::Buffer]| -> Result<Vec<Vec<f32>>> {
            bufs.iter().map(|b| Ok(dev.download_f32(b)?)).collect()
        };
        let (weights, adam_m, adam_v) = match self.dist.as_ref().and_then(|d| d.zero.as_ref()) {
            Some(z) => {
                let numels: Vec<usize> = self
                    .model
                    .specs()
                    .iter()
                    .map(|s| s.device_numel())
                    .collect();
                z.gather_state(&*dev, &numels)?
            }
            None => {
                let (m, v) = self.opt.moments();
                (
                    self.opt.master_weights(&*dev, self.model.params())?,
                    download(m)?,
                    download(v)?,
                )
            }
        };
        // The checkpoint holds the real sizes (the padded rows are zero: nothing is lost).
        let specs = self.model.specs();
        let (weights, adam_m, adam_v) = (
            crate::model::unpad(specs, weights),
            crate::model::unpad(specs, adam_m),
            crate::model::unpad(specs, adam_v),
        );
        Ok(Checkpoint {
            config: self.cfg.clone(),
            step: self.step,
            weights,
            adam_m,
            adam_v,
            data_state: self.data.state(),
            loss_scaler: self.scaler.as_ref().map(|s| s.checkpoint_state()),
            extra: {
                let mut extra = std::collections::HashMap::new();
                if let Some(ops) = self.model.fp8_state()? {
                    let json = serde_json::to_string(&ops).expect("fp8 state serialises");
                    extra.insert(FP8_STATE_KEY.to_string(), json);
                }
                // AdamW's own count (bias corrections) trails the step count by the steps a
                // loss scaler skipped.
                extra.insert(
                    ADAM_STEPS_KEY.to_string(),
                    self.optimizer_steps().to_string(),
                );
                if let Source::File { data, .. } = &self.data {
                    let files = data.fingerprints();
                    let json = serde_json::to_string(&files).expect("fingerprints serialise");
                    extra.insert(DATA_FILES_KEY.to_string(), json);
                }
                extra
            },
        })
    }

    /// Continues a run from a checkpoint; the next steps are the ones it would have taken.
    pub fn from_checkpoint(dev: Arc<D>, ck: &Checkpoint) -> Result<Self> {
        Self::resume(dev, ck, None)
    }

    /// [`Trainer::from_checkpoint`] as one rank of a data-parallel run (any world size: the
    /// checkpoint holds the full state).
    pub fn from_checkpoint_data_parallel(
        dev: Arc<D>,
        ck: &Checkpoint,
        comm: Arc<dyn Collective<D>>,
        opts: DpOptions,
    ) -> Result<Self> {
        Self::resume(dev, ck, Some((comm, opts)))
    }

    fn resume(
        dev: Arc<D>,
        ck: &Checkpoint,
        dp: Option<(Arc<dyn Collective<D>>, DpOptions)>,
    ) -> Result<Self> {
        let loaded = check_loaded_state(ck)?;
        let mut tr = Self::build(
            dev.clone(),
            ck.config.clone(),
            &ck.weights,
            dp,
            loaded.data.as_deref(),
        )?;
        match tr.dist.as_mut().and_then(|d| d.zero.as_mut()) {
            Some(z) => {
                let specs = tr.model.specs();
                let owned = |t: &[Vec<f32>]| -> Vec<Vec<f32>> {
                    crate::model::pad(specs, t)
                        .into_iter()
                        .map(|w| w.into_owned())
                        .collect()
                };
                let (w, m, v) = (owned(&ck.weights), owned(&ck.adam_m), owned(&ck.adam_v));
                z.load_state(&*dev, &w, &m, &v)?
            }
            None => {
                tr.opt.set_master_weights(&*dev, &ck.weights)?;
                let (m, v) = tr.opt.moments_mut();
                for (buf, host) in m
                    .iter_mut()
                    .zip(&ck.adam_m)
                    .chain(v.iter_mut().zip(&ck.adam_v))
                {
                    dev.upload(host, buf, 0)?;
                }
            }
        }
        let adam_steps = loaded.adam_steps;
        match tr.dist.as_mut().and_then(|d| d.zero.as_mut()) {
            Some(z) => z.set_steps_taken(adam_steps),
            None => tr.opt.set_steps_taken(adam_steps),
        }
        tr.step = ck.step;
        tr.data.set_state(ck.data_state);
        if let (Some(s), Some((scale, clean))) = (tr.scaler.as_mut(), ck.loss_scaler) {
            s.restore_state(scale, clean);
        }
        // FP8 delayed scaling resumes with its scales and amax histories (ignored when the run
        // continues in another precision).
        if let (true, Some(ops)) = (tr.model.fp8_enabled(), &loaded.fp8) {
            tr.model.set_fp8_state(ops)?;
            // A state saved before any step (`--stop-after 0`) is still the fresh one: the
            // resumed run calibrates as the uninterrupted one does.
            tr.fp8_calibrate = ck.step == 0;
        }
        Ok(tr)
    }

    /// One step (forward, backward, AdamW) on a given batch (the global batch of a
    /// data-parallel run: every rank passes the same one and trains on its slice).
    pub fn train_step_on(&mut self, inputs: &[i32], targets: &[i32]) -> Result<StepReport> {
        self.check_diverged()?;
        self.calibrate_fp8(inputs, targets)?;
        if self.dist.is_some() {
            return self.train_step_dp(inputs, targets);
        }
        if !self.accum.is_empty() {
            return self.train_step_accumulated(inputs, targets);
        }
        if self.graphable() {
            return self.train_step_graphed(inputs, targets);
        }
        let start = Instant::now();
        let lr = self.cfg.lr_at(self.step);
        if let Some(s) = &self.scaler {
            self.model.set_loss_scale(s.scale());
        }
        // The whole step is queued before anything is read back: the loss and the gradient
        // norm come back together at its end (one synchronisation per step).
        self.model.forward(inputs)?;
        self.model.queue_loss(targets, true)?;
        self.model.zero_grads()?;
        self.model.backward()?;
        let stats = self.update(lr)?;
        let loss = self.model.read_loss()?;
        // The update already ran on non-finite gradients: the run cannot continue (its last
        // checkpoint on disk is untouched).
        check_finite(self.step, loss)?;
        let seconds = start.elapsed().as_secs_f64();
        self.finish_step(loss, lr, &stats, inputs.len(), seconds)
    }

    /// A step of `grad_accum` micro-batches (one device): each micro-batch's forward, loss and
    /// backward pass, its gradient scaled by its share of the batch's counted targets (so the
    /// sum is the gradient of the batch's mean loss, as data parallelism scales each rank's),
    /// the sums kept in f32 in `accum` and added onto the last micro-batch's gradients, then one
    /// update. The loss is the batch's mean (each micro-batch's mean weighted by its count).
    fn train_step_accumulated(&mut self, inputs: &[i32], targets: &[i32]) -> Result<StepReport> {
        let start = Instant::now();
        let lr = self.cfg.lr_at(self.step);
        let k = self.cfg.train.data.grad_accum;
        let n = inputs.len() / k;
        let (counts, total) = micro_batch_counts(targets, n, |i| format!("micro-batch {i}"))?;
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        let dev = self.model.device().clone();
        let mut loss_sum = 0f64;
        for (i, &count) in counts.iter().enumerate() {
            self.model.set_loss_scale(share_scale(scale, count, total));
            self.model.forward(&inputs[i * n..(i + 1) * n])?;
            let loss = self.model.loss(&targets[i * n..(i + 1) * n], true)?;
            loss_sum += loss as f64 * count as f64;
            self.model.zero_grads()?;
            self.model.backward()?;
            accumulate(&*dev, &mut self.accum, self.model.grads_mut(), i, k)?;
        }
        self.model.set_loss_scale(scale);
        let stats = self.update(lr)?;
        let loss = (loss_sum / total as f64) as f32;
        check_finite(self.step, loss)?;
        let seconds = start.elapsed().as_secs_f64();
        self.finish_step(loss, lr, &stats, inputs.len(), seconds)
    }

    /// The update after a step's backward pass(es) on one device: on the device where no loss
    /// scaler decides skips, else through the host.
    fn update(&mut self, lr: f32) -> Result<StepStats> {
        let dev = self.model.device().clone();
        let stats = if self.scaler.is_none() {
            self.opt.prepare_device_step(&*dev, lr)?;
            self.queue_update()?;
            self.opt.device_step_stats(&*dev)?
        } else {
            let (params, grads) = self.model.params_and_grads();
            let stats = self
                .opt
                .step_scaled(&*dev, params, grads, lr, self.scaler.as_mut())?;
            self.model.fp8_update()?;
            stats
        };
        Ok(stats)
    }

    /// Whether the steps now replay a recorded graph.
    pub fn step_recorded(&self) -> bool {
        matches!(self.graph, StepGraph::Recorded { .. })
    }

    /// Whether this step may be recorded and replayed: the backend records graphs, the config
    /// allows it, and nothing in the step needs the host (no loss scaler deciding skips, no other
    /// ranks). FP8's delayed-scaling update is part of the recorded step (device buffers only).
    fn graphable(&self) -> bool {
        if matches!(self.graph, StepGraph::Off) {
            return false;
        }
        self.cfg.train.execution.graphs
            && self.scaler.is_none()
            && self.dist.is_none()
            && self.accum.is_empty()
            && self.model.device().capabilities().graphs
    }

    /// The queued part of a step on an uploaded batch: forward, loss, backward and the
    /// device-side update (the part a graph records).
    fn queue_step(&mut self) -> Result<()> {
        self.model.forward_loaded()?;
        self.model.queue_loss_loaded(true)?;
        self.model.zero_grads()?;
        self.model.backward()?;
        // FP8 delayed scaling runs on the device too: the step records it.
        self.queue_update()
    }

    /// A step through the recorded graph: upload the batch and the step's scalars, replay (or
    /// record on the second step), read the loss and the norm back. The same device work as an
    /// unrecorded step, so the same bits.
    fn train_step_graphed(&mut self, inputs: &[i32], targets: &[i32]) -> Result<StepReport> {
        let start = Instant::now();
        let lr = self.cfg.lr_at(self.step);
        self.queue_loaded_step(inputs, targets, lr)?;
        let dev = self.model.device().clone();
        let stats = self.opt.device_step_stats(&*dev)?;
        let loss = self.model.read_loss()?;
        check_finite(self.step, loss)?;
        let seconds = start.elapsed().as_secs_f64();
        self.finish_step(loss, lr, &stats, inputs.len(), seconds)
    }

    /// Queues a whole step without a loss scaler and reads nothing back: uploads the batch and
    /// the step's scalars, then replays the recorded step (recording it on the second step)
    /// where [`Trainer::graphable`], else queues it unrecorded. Returns the batch's number of
    /// counted targets.
    fn queue_loaded_step(&mut self, inputs: &[i32], targets: &[i32], lr: f32) -> Result<usize> {
        self.calibrate_fp8(inputs, targets)?;
        let dev = self.model.device().clone();
        let count = self.model.load_batch(inputs, targets)?;
        self.opt.prepare_device_step(&*dev, lr)?;
        if !self.graphable() {
            self.queue_step()?;
            return Ok(count);
        }
        match &self.graph {
            StepGraph::Recorded { graph, count: c } if *c == count => {
                // The recording skipped the weight quantisation when the optimizer had written
                // the codes; if something changed the weights or the scales since, quantise
                // them now.
                self.model.ensure_fp8_codes()?;
                dev.in_range("training step (graph replay)", || dev.replay(graph))?;
                // The step's FP8 scaling update ran on the device only.
                self.model.fp8_note_replayed_update();
                self.model.set_fp8_codes(self.fp8_codes_after_step());
            }
            StepGraph::Cold => {
                self.queue_step()?;
                self.graph = StepGraph::Warm;
            }
            _ => {
                // Quantised outside the recording if they must be (no upload inside it), and,
                // since recording runs nothing, put back as they were after it.
                self.model.ensure_fp8_codes()?;
                let codes = self.model.fp8_codes();
                let pending = self.model.fp8_pending_updates();
                dev.capture_begin()?;
                let queued = self.queue_step();
                let recorded = dev.capture_end();
                self.model.set_fp8_codes(codes);
                match (queued, recorded) {
                    (Ok(()), Ok(graph)) => {
                        dev.replay(&graph)?;
                        self.model.set_fp8_codes(self.fp8_codes_after_step());
                        self.graph = StepGraph::Recorded { graph, count };
                    }
                    (q, r) => {
                        // Nothing ran: do the step unrecorded, and stop trying.
                        let why = q
                            .err()
                            .map(|e| e.to_string())
                            .or(r.err().map(|e| e.to_string()));
                        eprintln!(
                            "warning: recording the training step failed ({}); running it unrecorded",
                            why.unwrap_or_default()
                        );
                        self.graph = StepGraph::Off;
                        // The recording's FP8 scaling update never ran.
                        self.model.set_fp8_pending_updates(pending);
                        self.queue_step()?;
                    }
                }
            }
        }
        Ok(count)
    }

    /// The end of every step (after its FP8 scaling update): the step count, the report.
    fn finish_step(
        &mut self,
        loss: f32,
        lr: f32,
        stats: &StepStats,
        tokens: usize,
        seconds: f64,
    ) -> Result<StepReport> {
        self.step += 1;
        Ok(StepReport {
            step: self.step,
            loss,
            lr,
            grad_norm: stats.grad_norm,
            tokens,
            seconds,
            loss_scale: self.scaler.as_ref().map(|_| stats.loss_scale),
            skipped: stats.skipped,
        })
    }

    /// The data-parallel step: forward and backward on this rank's rows, gradient buckets
    /// reduced while the backward pass runs, then the replicated or ZeRO update.
    /// FP8's calibration step, before the first step of a fresh scaling state: every scale
    /// starts at 1, where the backward pass would quantise gradients of order 1e-5 into
    /// E5M2's subnormals (mostly zeros, and which ones depends on each backend's rounding
    /// upstream). The step's forward and backward passes run once on its batch (each
    /// micro-batch with its loss-gradient share, this rank's rows; the amaxes taken over the
    /// ranks) without an update, and every scale is set from the amax it recorded; the amax
    /// histories stay as they were, so delayed scaling afterwards sees only trained steps.
    /// The gradients are discarded (the step's own backward pass zeroes them first).
    fn calibrate_fp8(&mut self, inputs: &[i32], targets: &[i32]) -> Result<()> {
        if !std::mem::take(&mut self.fp8_calibrate) {
            return Ok(());
        }
        let Some(before) = self.model.fp8_state()? else {
            return Ok(());
        };
        let m = self.model.batch_size() * self.cfg.train.data.seq;
        let k = self.cfg.train.data.grad_accum;
        let rank = self.dist.as_ref().map_or(0, |d| d.rank());
        let (counts, global) = micro_batch_counts(targets, m, |j| format!("micro-batch {j}"))?;
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        for (j, &count) in counts.iter().enumerate().skip(rank * k).take(k) {
            let rows = j * m..(j + 1) * m;
            self.model.set_loss_scale(share_scale(scale, count, global));
            self.model.forward(&inputs[rows.clone()])?;
            self.model.queue_loss(&targets[rows], true)?;
            self.model.zero_grads()?;
            self.model.backward()?;
        }
        self.model.set_loss_scale(scale);
        if let Some(comm) = self.dist.as_ref().map(|d| d.comm().clone())
            && let Some(amax) = self.model.fp8_amax_mut()
        {
            comm.all_reduce(amax, ReduceOp::Max)?;
            comm.wait()?;
        }
        self.model.fp8_update()?;
        let mut calibrated = self.model.fp8_state()?.expect("an FP8 model");
        for (c, b) in calibrated.iter_mut().zip(before) {
            c.history = b.history;
        }
        self.model.set_fp8_state(&calibrated)
    }

    fn train_step_dp(&mut self, inputs: &[i32], targets: &[i32]) -> Result<StepReport> {
        let start = Instant::now();
        let lr = self.cfg.lr_at(self.step);
        let dev = self.model.device().clone();
        let dist = self.dist.as_mut().expect("data-parallel trainer");
        let (rank, world) = (dist.rank(), dist.world_size());
        // This rank's rows: `k` micro-batches of `m` (gradient accumulation), n = k·m.
        let k = self.cfg.train.data.grad_accum;
        let m = self.model.batch_size() * self.cfg.train.data.seq;
        let n = m * k;
        if inputs.len() != n * world || targets.len() != n * world {
            return Err(EngineError::Config(format!(
                "data-parallel step: got {} tokens and {} targets, the global batch is {} × {}",
                inputs.len(),
                targets.len(),
                self.cfg.train.data.batch,
                self.cfg.train.data.seq
            )));
        }
        // Every rank sees the global batch, so all take the same decisions here: the counted
        // targets of every rank's every micro-batch (rank r's micro-batch i is chunk r·k + i).
        let (counts, global) = micro_batch_counts(targets, m, |j| {
            if k == 1 {
                format!("rank {j}'s slice")
            } else {
                format!("rank {}'s micro-batch {}", j / k, j % k)
            }
        })?;
        // Scaling each micro-batch's loss gradient by its share of the targets makes the sum
        // over the micro-batches and the ranks the gradient of the global mean loss.
        let scale = self.scaler.as_ref().map_or(1.0, |s| s.scale());
        let mut local = 0f64;
        let mut loss = None;
        for i in 0..k {
            let c = counts[rank * k + i];
            let rows = (rank * k + i) * m..(rank * k + i + 1) * m;
            self.model.set_loss_scale(share_scale(scale, c, global));
            self.model.forward(&inputs[rows.clone()])?;
            local += self.model.loss(&targets[rows], true)? as f64 * c as f64;
            if i + 1 == k {
                // The loss is checked before the last backward pass starts reducing.
                let (sum, _) = dist.sum2(&*dev, local as f32, 0.0)?;
                let l = sum / global as f32;
                check_finite(self.step, l)?;
                loss = Some(l);
            }
            self.model.zero_grads()?;
            let sync = &mut dist.sync;
            if dist.overlap && k == 1 {
                self.model
                    .backward_hooked(&mut |g, grads| sync.group_ready(&*dev, g, grads))?;
            } else {
                self.model.backward()?;
            }
            // Accumulating: communication only after the last micro-batch, onto whose
            // gradients the f32 sums of the others are added.
            accumulate(&*dev, &mut self.accum, self.model.grads_mut(), i, k)?;
        }
        self.model.set_loss_scale(scale);
        let loss = loss.expect("k ≥ 1 micro-batches");
        let sync = &mut dist.sync;
        sync.finish(&*dev, self.model.grads_mut())?;
        let comm = dist.comm().clone();
        let stats = match dist.zero.as_mut() {
            Some(z) => {
                let (params, _) = self.model.params_and_grads();
                z.step(&*dev, params, &mut dist.sync, lr, self.scaler.as_mut())?
            }
            None => {
                let (params, grads) = self.model.params_and_grads();
                self.opt.step_reduced(
                    &*dev,
                    params,
                    grads,
                    lr,
                    self.scaler.as_mut(),
                    Some(&*comm),
                )?
            }
        };
        // Every rank's FP8 scales follow the largest amax any rank saw.
        if let Some(amax) = self.model.fp8_amax_mut() {
            comm.all_reduce(amax, ReduceOp::Max)?;
            comm.wait()?;
        }
        self.model.fp8_update()?;
        let seconds = start.elapsed().as_secs_f64();
        self.finish_step(loss, lr, &stats, inputs.len(), seconds)
    }

    /// Greedy generation on `n` held-out progressions: prompt [`PROMPT_LEN`] tokens, generate
    /// [`GEN_LEN`], exact when every generated token keeps the stride. In a data-parallel run
    /// it uses only this rank's model (no collectives): one rank may run it alone.
    pub fn evaluate_generation(&mut self, n: usize) -> Result<GenerationEval> {
        let (b, t, v) = (
            self.model.batch_size(),
            self.cfg.train.data.seq,
            self.cfg.model.vocab,
        );
        if t < PROMPT_LEN + GEN_LEN - 1 {
            return Err(EngineError::Config(format!(
                "the generation check needs seq ≥ {} (prompt {PROMPT_LEN} + {GEN_LEN} generated), got {t}",
                PROMPT_LEN + GEN_LEN - 1
            )));
        }
        let Source::Progressions(p) = &self.data else {
            return Err(EngineError::Config(
                "the generation check needs the synthetic progression task (no --data file)".into(),
            ));
        };
        let pairs = p.held_out_pairs(n, self.cfg.train.data.seed);
        let mut exact = 0;
        let mut good_tokens = 0usize;
        for chunk in pairs.chunks(b) {
            let mut tokens = vec![0i32; b * t];
            for (r, &(s, k)) in chunk.iter().enumerate() {
                tokens[r * t..r * t + PROMPT_LEN]
                    .copy_from_slice(&progression(v, s, k, PROMPT_LEN));
            }
            for pos in PROMPT_LEN - 1..PROMPT_LEN + GEN_LEN - 1 {
                self.model.forward(&tokens)?;
                let logits = self.model.logits()?;
                for r in 0..chunk.len() {
                    let row = &logits[(r * t + pos) * v..(r * t + pos + 1) * v];
                    tokens[r * t + pos + 1] = argmax(row) as i32;
                }
            }
            for r in 0..chunk.len() {
                let row = &tokens[r * t..r * t + PROMPT_LEN + GEN_LEN];
                let (prompt, generated) = row.split_at(PROMPT_LEN);
                if keeps_stride(v, prompt, generated) {
                    exact += 1;
                }
                let k = (prompt[1] - prompt[0]).rem_euclid(v as i32);
                good_tokens += row[PROMPT_LEN - 1..]
                    .windows(2)
                    .filter(|w| (w[1] - w[0]).rem_euclid(v as i32) == k)
                    .count();
            }
        }
        Ok(GenerationEval {
            sequences: pairs.len(),
            exact,
            token_accuracy: good_tokens as f64 / (pairs.len() * GEN_LEN).max(1) as f64,
        })
    }
}

/// [`EngineError::Diverged`] for a non-finite loss of the step after `steps_done`.
fn check_finite(steps_done: u64, loss: f32) -> Result<()> {
    if loss.is_finite() {
        Ok(())
    } else {
        Err(EngineError::Diverged {
            step: steps_done + 1,
            loss,
        })
    }
}

/// The mean loss of a step from its per-row losses and its number of counted targets: the
/// arithmetic of [`Gpt::read_loss`] (f64 sum, one rounding), so the same bits.
fn mean_loss(rows: &[f32], count: usize) -> f32 {
    let sum: f64 = rows.iter().map(|&x| x as f64).sum();
    (sum / count.max(1) as f64) as f32
}

/// Index of the largest value (the first one on ties).
pub fn argmax(xs: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best
}
/// The counted targets (those ≥ 0) of each `m`-token micro-batch of `targets`, and their sum;
/// an error naming the micro-batch (`name(j)`) when every target of one is ignored.
fn micro_batch_counts(
    targets: &[i32],
    m: usize,
    name: impl Fn(usize) -> String,
) -> Result<(Vec<usize>, usize)> {
    let counts: Vec<usize> = targets
        .chunks(m)
        .map(|c| c.iter().filter(|&&y| y >= 0).count())
        .collect();
    if let Some(j) = counts.iter().position(|&c| c == 0) {
        return Err(EngineError::Config(format!(
            "every target of {} of the batch is ignored",
            name(j)
        )));
    }
    let total = counts.iter().sum();
    Ok((counts, total))
}

/// The loss-gradient scale of a micro-batch holding `count` of the step's `total` counted
/// targets: its share of `scale`, so the micro-batches' gradients sum to the gradient of the
/// step's mean loss.
fn share_scale(scale: f32, count: usize, total: usize) -> f32 {
    (scale as f64 * count as f64 / total as f64) as f32
}

/// Gradient accumulation after micro-batch `i` of `k`: the first one's gradients are copied
/// into the f32 sums `acc`, the next ones' added to them, and the sums added onto the last
/// one's (which the update then reads). Nothing for `k` = 1.
fn accumulate<D: Device>(
    dev: &D,
    acc: &mut [D::Buffer],
    grads: &mut [D::Buffer],
    i: usize,
    k: usize,
) -> Result<()> {
    if k <= 1 {
        return Ok(());
    }
    for (a, g) in acc.iter_mut().zip(grads.iter_mut()) {
        match i {
            0 => dev.copy(g, 0, a, 0, g.len())?,
            _ if i + 1 < k => dev.exec(AddAssign { dst: a, src: g })?,
            _ => dev.exec(AddAssign { dst: g, src: a })?,
        }
    }
    Ok(())
}

/// Rows of one micro-batch on one rank: the batch over `world` ranks and `grad_accum`
/// micro-batches (each must divide evenly).
fn micro_batch(cfg: &Config, world: usize) -> Result<usize> {
    let local = local_batch(cfg.train.data.batch, world)?;
    let k = cfg.train.data.grad_accum.max(1);
    if !local.is_multiple_of(k) {
        return Err(EngineError::Config(format!(
            "each rank's batch ({local}) must split evenly into grad_accum ({k}) micro-batches"
        )));
    }
    Ok(local / k)
}

/// Counts the f32 gradient sums of gradient accumulation (one per parameter, padded as on the
/// device) in `plan`'s gradients, where `cfg` accumulates.
fn add_accum_buffers(plan: &mut crate::model::MemoryPlan, cfg: &Config) {
    if cfg.train.data.grad_accum > 1 {
        plan.grads += crate::model::param_specs(&cfg.model)
            .iter()
            .map(|s| 4 * s.device_numel() as u64)
            .sum::<u64>();
    }
}

/// The model alone, for one rank of a data-parallel run if `data_parallel`, planned with the
/// optimizer state split over `optimizer_shards` ranks (ZeRO-1; 1 otherwise).
fn build_model<D: Device>(
    dev: Arc<D>,
    cfg: &Config,
    weights: &[Vec<f32>],
    data_parallel: bool,
    optimizer_shards: usize,
) -> Result<Gpt<D>> {
    let t = &cfg.train;
    if t.recipe.precision == crate::Precision::Fp8 {
        // A family the device cannot compute is refused here, naming both.
        t.recipe.fp8_family.resolve(&dev.info())?;
    }
    let plan = precision_plan(cfg, data_parallel, optimizer_shards);
    Gpt::with_precision(dev, &cfg.model, t.data.batch, t.data.seq, weights, plan)
}

/// How the model is held and computed, from the config.
fn precision_plan(cfg: &Config, data_parallel: bool, optimizer_shards: usize) -> PrecisionPlan {
    let t = &cfg.train;
    PrecisionPlan {
        precision: t.recipe.precision,
        low_precision_weight_grads: t
            .recipe
            .weight_grad_dtype
            .low_precision(t.recipe.precision, data_parallel),
        keep_gelu_output: !t.execution.recompute_gelu,
        fp8: t.recipe.delayed_scaling(),
        fp8_family: t.recipe.fp8_family.named(),
        checkpoint_every: t.execution.checkpoint_every,
        optimizer_shards,
        logits_chunk_rows: t.execution.logits_chunk_rows,
    }
}

/// AdamW's hyper-parameters from the config.
fn adamw_config(cfg: &Config) -> AdamWConfig {
    let t = &cfg.train;
    AdamWConfig {
        beta1: t.optimizer.beta1,
        beta2: t.optimizer.beta2,
        eps: t.optimizer.eps,
        weight_decay: t.optimizer.weight_decay,
        grad_clip: t.optimizer.grad_clip,
    }
}

/// The replicated optimizer for `model`: FP32 moments, and FP32 masters for every weight whose
/// working copy is not f32.
fn build_optimizer<D: Device>(
    dev: &D,
    cfg: &Config,
    model: &Gpt<D>,
    weights: &[Vec<f32>],
) -> Result<AdamW<D>> {
    let ocfg = adamw_config(cfg);
    if cfg.train.recipe.precision == Precision::Fp32 {
        AdamW::new(dev, ocfg, model.specs())
    } else {
        AdamW::with_masters(dev, ocfg, model.specs(), model.params(), weights)
    }
}

/// The loss scaler: FP16, or any precision given a static `loss_scale`.
fn build_scaler(cfg: &Config) -> Option<LossScaler> {
    let t = &cfg.train;
    (t.recipe.precision == Precision::Fp16 || t.recipe.loss_scale > 0.0)
        .then(|| LossScaler::for_precision(t.recipe.precision, t.recipe.loss_scale))
}

/// Refuses a checkpoint whose training state makes no sense, before anything is allocated: a
/// loss scale that is not a positive finite number (inf skipped every resumed step; NaN or −1
/// poisoned the gradients), AdamW second moments below zero (their square root is NaN two steps
/// later), an AdamW step count above the run's step (or 0 after steps no loss scaler could have
/// skipped), an FP8 run's checkpoint without its FP8 scaling state (the scales would silently
/// restart) or with a scale that is not a positive finite number or a negative amax.
fn check_loaded_state(ck: &Checkpoint) -> Result<LoadedState> {
    let bad = |m: String| Err(EngineError::Config(format!("checkpoint: {m}")));
    if let Some((scale, _)) = ck.loss_scaler
        && !(scale.is_finite() && scale > 0.0)
    {
        return bad(format!(
            "the loss scale {scale} is not a positive finite number"
        ));
    }
    let specs = crate::model::param_specs(&ck.config.model);
    for (spec, v) in specs.iter().zip(&ck.adam_v) {
        if let Some(x) = v.iter().find(|x| **x < 0.0) {
            return bad(format!(
                "optim.v.{} holds {x}: AdamW's second moments are never negative",
                spec.name
            ));
        }
    }
    let adam_steps = match ck.extra.get(ADAM_STEPS_KEY) {
        Some(v) => v.parse().map_err(|_| {
            EngineError::Config(format!("checkpoint {ADAM_STEPS_KEY} '{v}' is not a count"))
        })?,
        None => ck.step,
    };
    // (Without the key the count is the step, which passes both checks.)
    let n = adam_steps;
    if n > ck.step {
        return bad(format!(
            "{ADAM_STEPS_KEY} {n} is above the step {}: AdamW cannot have taken more steps \
             than the run",
            ck.step
        ));
    }
    if n == 0 && ck.step > 0 && ck.loss_scaler.is_none() {
        return bad(format!(
            "{ADAM_STEPS_KEY} is 0 at step {}, but only a loss scaler skips steps and this run \
             has none",
            ck.step
        ));
    }
    let fp8 = ck.config.train.recipe.precision == crate::Precision::Fp8;
    let fp8_state = match ck.extra.get(FP8_STATE_KEY) {
        None if fp8 && ck.step > 0 => {
            return bad(
                "an FP8 run's checkpoint without its FP8 scaling state (the scales and amax \
                 histories would restart from nothing)"
                    .into(),
            );
        }
        Some(json) => {
            let ops: Vec<crate::fp8::OperandScaling> = serde_json::from_str(json)
                .map_err(|e| EngineError::Config(format!("checkpoint FP8 state: {e}")))?;
            for (i, o) in ops.iter().enumerate() {
                if !(o.scale.is_finite() && o.scale > 0.0) {
                    return bad(format!(
                        "FP8 operand {i}'s scale {} is not a positive finite number",
                        o.scale
                    ));
                }
                if let Some(a) = o.history.iter().find(|a| **a < 0.0) {
                    return bad(format!("FP8 operand {i}'s amax history holds {a} (< 0)"));
                }
            }
            Some(ops)
        }
        None => None,
    };
    let data = stored_data_files(ck)?;
    Ok(LoadedState {
        adam_steps,
        fp8: fp8_state,
        data,
    })
}

/// The checks a resume makes of a loaded checkpoint's state (see [`Trainer::from_checkpoint`]):
/// loss scale, AdamW moments and step count, FP8 scaling state, data fingerprints' syntax.
pub fn check_checkpoint_state(ck: &Checkpoint) -> Result<()> {
    check_loaded_state(ck).map(drop)
}

/// What [`check_loaded_state`] read from a checkpoint's metadata, checked, for the resume.
struct LoadedState {
    /// AdamW's own step count (the run's step when the checkpoint predates the key).
    adam_steps: u64,
    /// The FP8 scaling state, when the checkpoint has one.
    fp8: Option<Vec<crate::fp8::OperandScaling>>,
    /// The data files the run read (absent in checkpoints before duet stored them).
    data: Option<Vec<crate::dataset::DataFingerprint>>,
}

/// What resuming from `ck` will find of the data files its run read: `Ok(None)` when each is
/// as the run read it (size and time unchanged: nothing hashed) or only its time changed (its
/// stored time is brought up to date, so the resume does not hash it again); `Ok(Some(note))`
/// when the checkpoint predates stored fingerprints; an error naming the file, and what changed,
/// when its content did.
pub fn check_data_unchanged(ck: &mut Checkpoint) -> Result<Option<String>> {
    let Some(files) = stored_data_files(ck)? else {
        return Ok((!ck.config.train.data.data.is_empty()).then(|| {
            format!(
                "the checkpoint records no fingerprint of {} (saved by an older duet): whether \
                 it changed since is not checked",
                ck.config.train.data.describe()
            )
        }));
    };
    let mut now = Vec::with_capacity(files.len());
    for then in &files {
        let cur = then.current()?;
        cur.ensure_unchanged_from(then)?;
        now.push(cur);
    }
    if now != files {
        let json = serde_json::to_string(&now).expect("fingerprints serialise");
        ck.extra.insert(DATA_FILES_KEY.to_string(), json);
    }
    Ok(None)
}

/// For a resume that accepts changed data (`--accept-changed-data`): what changed in each data
/// file of `ck`'s run (`path: why`), and `ck` no longer holds their fingerprints (the resumed
/// run reads the files afresh and its checkpoints store them as they are now).
pub fn forget_data_files(ck: &mut Checkpoint) -> Result<Vec<String>> {
    let mut changes = Vec::new();
    for then in stored_data_files(ck)?.unwrap_or_default() {
        match then.current() {
            Ok(cur) => changes.extend(
                cur.changed_from(&then)
                    .map(|w| format!("{}: {w}", then.path)),
            ),
            Err(EngineError::Data { path, message }) => changes.push(format!("{path}: {message}")),
            Err(e) => changes.push(e.to_string()),
        }
    }
    ck.extra.remove(DATA_FILES_KEY);
    Ok(changes)
}

/// Resuming `ck`'s run on its data at another place (`files`: `--data`/`--val-data` given on
/// resume, resolved): each shard of `files` must hold what the run's shard at the same place of
/// its lists held (the hash its checkpoint recorded), so the run goes on with the same data in
/// the same order. `ck`'s configuration and fingerprints then name the new files (whose hashes
/// were just computed: the resume does not hash them again). Returns how many shards are at
/// another path; an error names a shard whose content differs, or lists of other lengths.
pub fn relocate_data_files(
    ck: &mut Checkpoint,
    files: &crate::dataset::DataFiles,
) -> Result<usize> {
    use rayon::prelude::*;
    let Some(then) = stored_data_files(ck)? else {
        return Err(EngineError::Config(
            "the checkpoint records no hashes of its data files (saved by an older duet): its \
             data cannot be given at another place (resume where the data is, or add \
             --accept-changed-data to continue on the files given without a check)"
                .into(),
        ));
    };
    let d = &ck.config.train.data;
    for (role, had, given) in [
        ("training", d.data.len(), files.train.len()),
        ("validation", d.val_data.len(), files.val.len()),
    ] {
        if had != given {
            return Err(EngineError::Config(format!(
                "the run read {had} {role} shard(s) and the data given on resume has {given}: \
                 give all of the run's shards at their new place, in its order (--data, and \
                 --val-data for validation shards outside its folders)"
            )));
        }
    }
    if then.len() != files.train.len() + files.val.len() {
        return Err(EngineError::Config(format!(
            "checkpoint {DATA_FILES_KEY}: {} fingerprints for {} shards",
            then.len(),
            files.train.len() + files.val.len()
        )));
    }
    let paths: Vec<&std::path::PathBuf> = files.train.iter().chain(&files.val).collect();
    let now = then
        .par_iter()
        .zip(paths.par_iter())
        .map(|(t, p)| {
            let cur = t.at(p)?;
            if cur.hash != t.hash {
                return Err(EngineError::Data {
                    path: cur.path.clone(),
                    message: format!(
                        "is not the shard the run read as {} (content {} ≠ {}): give the run's \
                         shards, in its order (or add --accept-changed-data to continue on \
                         other data)",
                        t.path,
                        short(&t.hash),
                        short(&cur.hash)
                    ),
                });
            }
            Ok(cur)
        })
        .collect::<Vec<Result<_>>>()
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let moved = now
        .iter()
        .zip(&then)
        .filter(|(n, t)| n.path != t.path)
        .count();
    let name = |p: &std::path::PathBuf| p.display().to_string();
    let d = &mut ck.config.train.data;
    d.data = files.train.iter().map(name).collect();
    d.val_data = files.val.iter().map(name).collect();
    let json = serde_json::to_string(&now).expect("fingerprints serialise");
    ck.extra.insert(DATA_FILES_KEY.to_string(), json);
    Ok(moved)
}

/// The start of a `blake3:<hex>` hash, for messages.
fn short(h: &str) -> &str {
    &h[..h.len().min("blake3:".len() + 16)]
}

fn stored_data_files(ck: &Checkpoint) -> Result<Option<Vec<crate::dataset::DataFingerprint>>> {
    ck.extra
        .get(DATA_FILES_KEY)
        .map(|json| {
            serde_json::from_str(json)
                .map_err(|e| EngineError::Config(format!("checkpoint {DATA_FILES_KEY}: {e}")))
        })
        .transpose()
}
