//! `duet train`, and the flag-to-config resolution that `duet bench` shares.

use crate::backends::{OnDevice, dispatch};
use crate::cli_dist::{RankTask, run_rank, spawn_ranks};
use crate::{CliResult, ExecutionFlags, ModelArgs};
use duet_device::{BackendKind, Fused, human_bytes};
use duet_engine::checkpoint::{Checkpoint, files};
use duet_engine::config::ExecutionConfig;
use duet_engine::run::{
    FP8_REPORT_ENTRIES, MetricsLog, RunPlan, RunSummary, StepLog, save_checkpoint,
};
use duet_engine::trace::{TraceHeader, TraceWriter};
use duet_engine::{Config, Precision, Preset, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

pub struct TrainOptions {
    pub model: ModelArgs,
    pub metrics: Option<PathBuf>,
    pub log_every: Option<u64>,
    pub trace: Option<PathBuf>,
    pub fp8_report: bool,
    pub out: Option<PathBuf>,
    pub save_every: u64,
    pub resume: Option<PathBuf>,
    pub stop_after: Option<u64>,
    pub val_every: u64,
    /// `--gpus N`: one process per GPU (data parallelism).
    pub gpus: Option<usize>,
    /// `--zero 1`: ZeRO-1 optimizer sharding.
    pub zero: u8,
    /// `--bucket-mb`: gradient bucket size.
    pub bucket_mb: f64,
    /// Reduce buckets during the backward pass (`--no-overlap` turns it off).
    pub overlap: bool,
    /// The flags given that a resumed run may not take ([`fixed_on_resume`]).
    pub fixed_flags: Vec<String>,
}

/// Resolves the configured precision against the device (fallback with a warning, or an error
/// with `--strict`) and writes the result back into `cfg`.
pub(crate) fn resolve_precision<D: Fused>(
    cfg: &mut Config,
    dev: &D,
    strict: bool,
) -> CliResult<()> {
    let (p, warning) =
        duet_engine::precision::resolve_precision_on(dev, cfg.train.recipe.precision, strict)?;
    if let Some(w) = warning {
        eprintln!("{w}");
    }
    cfg.train.recipe.precision = p;
    Ok(())
}

/// One line per FP8 operand: scale and the first amax-history entries.
fn print_fp8_report<D: Fused>(trainer: &Trainer<D>) {
    let report = match trainer.model().fp8_report(FP8_REPORT_ENTRIES) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warning: reading the fp8 scaling state back failed: {e}");
            None
        }
    };
    if let Some(ops) = report {
        eprintln!("fp8 delayed scaling (scale, amax history most recent first):");
        for o in ops {
            let hist: Vec<String> = o.amax_history.iter().map(|a| format!("{a:.4e}")).collect();
            eprintln!(
                "  {:<28} {:<10} scale {:>12.5e}  amax [{}]",
                o.name,
                o.dtype,
                o.scale,
                hist.join(", ")
            );
        }
    }
}

/// Preset, then config file, then flags; validated.
pub fn build_config(a: &ModelArgs) -> CliResult<Config> {
    let preset: Preset = a.base.preset.parse()?;
    let mut cfg = Config::preset(preset);
    if let Some(path) = &a.base.config {
        cfg = Config::from_toml_file(path, cfg)?;
    }
    let m = &mut cfg.model;
    macro_rules! set {
        ($dst:expr, $src:expr) => {
            if let Some(v) = $src {
                $dst = v;
            }
        };
    }
    set!(m.vocab, a.arch.vocab);
    set!(m.d_model, a.arch.d_model);
    set!(m.heads, a.arch.heads);
    set!(m.ffn, a.arch.ffn);
    set!(m.layers, a.arch.layers);
    set!(m.max_seq, a.arch.max_seq);
    let t = &mut cfg.train;
    set!(t.data.batch, a.data.batch);
    set!(t.data.seq, a.data.seq);
    set!(t.steps, a.steps);
    set!(t.optimizer.lr, a.optimizer.lr);
    set!(t.optimizer.warmup, a.optimizer.warmup);
    set!(t.optimizer.min_lr_ratio, a.optimizer.min_lr_ratio);
    set!(t.optimizer.weight_decay, a.optimizer.weight_decay);
    set!(t.optimizer.beta1, a.optimizer.beta1);
    set!(t.optimizer.beta2, a.optimizer.beta2);
    set!(t.optimizer.eps, a.optimizer.eps);
    set!(t.optimizer.grad_clip, a.optimizer.grad_clip);
    set!(t.data.seed, a.data.seed);
    set!(t.data.eval_sequences, a.data.eval_sequences);
    set!(t.data.max_stride, a.data.max_stride);
    if let Some(p) = &a.precision.precision {
        t.recipe.precision = p.parse()?;
    }
    set!(t.recipe.loss_scale, a.precision.loss_scale);
    if let Some(f) = &a.precision.fp8_format {
        t.recipe.fp8_format = f.parse()?;
    }
    set!(
        t.recipe.fp8_amax_history_len,
        a.precision.fp8_amax_history_len
    );
    if let Some(algo) = &a.precision.fp8_amax_compute_algo {
        t.recipe.fp8_amax_compute_algo = algo.parse()?;
    }
    set!(t.recipe.fp8_margin, a.precision.fp8_margin);
    if let Some(f) = &a.precision.fp8_fast_accum {
        t.recipe.fp8_fast_accum = f.parse()?;
    }
    if let Some(d) = &a.precision.weight_grad_dtype {
        t.recipe.weight_grad_dtype = d.parse()?;
    }
    apply_execution_settings(&mut t.execution, &a.execution);
    if let Some(d) = &a.data.data {
        // Absolute, so that a resumed run reads the same file from any folder.
        let abs = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
        t.data.data = abs.display().to_string();
        // The model's vocabulary must cover the file's tokens; pick it unless --vocab was given.
        let file = duet_engine::dataset::TokenFile::open(d, t.data.seq)?;
        if a.arch.vocab.is_none() && cfg.model.vocab < file.vocab_needed {
            eprintln!(
                "vocab set to {} to cover the tokens of {}",
                file.vocab_needed,
                d.display()
            );
            cfg.model.vocab = file.vocab_needed;
        }
        // The generation check belongs to the synthetic task.
        cfg.train.data.eval_sequences = 0;
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The flags of the settings that change how a step runs, not what it computes
/// (the execution group, [`ExecutionConfig`]): a resumed run may change them too.
fn apply_execution_settings(t: &mut ExecutionConfig, a: &ExecutionFlags) {
    if a.no_graphs {
        t.graphs = false;
    }
    if a.gemm_autotune {
        t.gemm_autotune = true;
    }
    if let Some(n) = a.loss_every {
        t.loss_every = n;
    }
    if a.keep_gelu {
        t.recompute_gelu = false;
    }
    match (a.checkpoint, a.checkpoint_every) {
        (_, Some(n)) => t.checkpoint_every = n,
        (true, None) => t.checkpoint_every = 4,
        (false, None) => {}
    }
}

/// Warns when FP8 recipe flags were given but none of the run's precisions is fp8.
pub(crate) fn warn_unused_fp8_flags(a: &ModelArgs, precisions: &[Precision]) {
    let given = fp8_flags_given(a);
    if !given.is_empty() && !precisions.contains(&Precision::Fp8) {
        let list: Vec<String> = precisions.iter().map(|p| p.to_string()).collect();
        eprintln!(
            "warning: FP8 recipe flags ({}) take effect only with --precision fp8; this run is {}",
            given.join(", "),
            list.join(", ")
        );
    }
}

/// The FP8 recipe flags given on the command line.
fn fp8_flags_given(a: &ModelArgs) -> Vec<&'static str> {
    [
        (a.precision.fp8_format.is_some(), "--fp8-format"),
        (
            a.precision.fp8_amax_history_len.is_some(),
            "--fp8-amax-history-len",
        ),
        (
            a.precision.fp8_amax_compute_algo.is_some(),
            "--fp8-amax-compute-algo",
        ),
        (a.precision.fp8_margin.is_some(), "--fp8-margin"),
        (a.precision.fp8_fast_accum.is_some(), "--fp8-fast-accum"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

pub(crate) fn backend_kind(a: &ModelArgs) -> CliResult<BackendKind> {
    Ok(a.device.backend.parse()?)
}

/// How a training run ended.
pub enum TrainOutcome {
    Finished,
    /// Ctrl-C: a checkpoint was saved and the run stopped.
    Interrupted,
}

/// Set by the Ctrl-C handler; the training loop checks it after every read-back of losses
/// (every `loss_every` steps at most).
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The flags given on the command line (`m`: the `train` subcommand's matches) that a resumed run
/// may not take: every flag of the configuration, model, data, optimizer and precision-recipe
/// groups. The group a flag is declared in ([`ModelArgs`]) decides, so a new flag follows its
/// group's rule; `--steps` and the device and execution groups may change.
pub fn fixed_on_resume(m: &clap::ArgMatches) -> Vec<String> {
    use crate::{ArchFlags, BaseFlags, DataFlags, OptimizerFlags, PrecisionFlags};
    fn given<T: clap::Args>(m: &clap::ArgMatches, v: &mut Vec<String>) {
        let group = T::augment_args(clap::Command::new("group"));
        for arg in group.get_arguments() {
            let id = arg.get_id().as_str();
            if m.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                v.push(format!("--{}", arg.get_long().unwrap_or(id)));
            }
        }
    }
    let mut v = Vec::new();
    given::<BaseFlags>(m, &mut v);
    given::<ArchFlags>(m, &mut v);
    given::<DataFlags>(m, &mut v);
    given::<OptimizerFlags>(m, &mut v);
    given::<PrecisionFlags>(m, &mut v);
    v
}

/// Whether two paths name the same file, the second of which need not exist yet (its folder is
/// resolved instead): compared after resolving `.`, `..` and links, not by spelling.
fn same_file(a: &Path, b: &Path) -> bool {
    let resolve = |p: &Path| -> Option<PathBuf> {
        if let Ok(c) = std::fs::canonicalize(p) {
            return Some(c);
        }
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
    };
    match (resolve(a), resolve(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Refuses a run whose output files (metrics, trace, and in `--out` the checkpoint, config and
/// loss plot) would overwrite one of its inputs (data, config, the checkpoint it resumes
/// from) or one another: it would destroy the input, or interleave two logs into one file.
fn check_no_overwrite(
    opts: &TrainOptions,
    cfg: &Config,
    metrics: Option<&Path>,
    trace: Option<&Path>,
) -> CliResult<()> {
    // (what, path, whether it is a checkpoint)
    let mut inputs: Vec<(String, PathBuf, bool)> = Vec::new();
    if !cfg.train.data.data.is_empty() {
        inputs.push(("--data".into(), PathBuf::from(&cfg.train.data.data), false));
    }
    if let Some(c) = &opts.model.base.config {
        inputs.push(("--config".into(), c.clone(), false));
    }
    if let Some(r) = &opts.resume {
        inputs.push((
            "the checkpoint resumed from".into(),
            checkpoint_path(r),
            true,
        ));
    }
    let mut outputs: Vec<(String, PathBuf, bool)> = Vec::new();
    if let Some(m) = metrics {
        outputs.push(("the metrics file".into(), m.to_path_buf(), false));
    }
    if let Some(t) = trace {
        outputs.push(("the trace".into(), t.to_path_buf(), false));
    }
    if let Some(dir) = &opts.out {
        for f in [files::CHECKPOINT, files::CONFIG, files::LOSS_PLOT] {
            outputs.push((format!("--out's {f}"), dir.join(f), f == files::CHECKPOINT));
        }
    }
    for (i, (what, p, p_ck)) in outputs.iter().enumerate() {
        for (other, q, q_ck) in inputs.iter().chain(&outputs[..i]) {
            // Resuming in place rewrites the checkpoint it started from, as intended.
            if same_file(p, q) && !(*p_ck && *q_ck) {
                return Err(format!(
                    "{what} ({}) is the same file as {other}: choose another path",
                    p.display()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Takes the `--out` folder's lock file, so that two runs never write into one folder.
fn lock_out(dir: &Path) -> CliResult<File> {
    let path = dir.join(".duet.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "another duet run is writing into {} (it holds {})",
            dir.display(),
            path.display()
        )
        .into()),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(format!("cannot lock {}: {e}", path.display()).into())
        }
    }
}

/// Where a run without `--out` saves its checkpoint when interrupted: duet-interrupted.safetensors,
/// or the first of duet-interrupted-2.safetensors, -3, ... that does not exist (another run's
/// checkpoint is never overwritten).
fn interrupted_path() -> PathBuf {
    (1..)
        .map(|i| match i {
            1 => PathBuf::from("duet-interrupted.safetensors"),
            i => PathBuf::from(format!("duet-interrupted-{i}.safetensors")),
        })
        .find(|p| !p.exists())
        .expect("an unused name")
}

/// A checkpoint path given as the file or the `--out` folder holding it.
pub(crate) fn checkpoint_path(p: &Path) -> PathBuf {
    if p.is_dir() {
        p.join(files::CHECKPOINT)
    } else {
        p.to_path_buf()
    }
}

/// Checks that a log file can be written without touching an existing one (a run that fails
/// before training must not destroy the previous run's logs).
fn check_writable(path: &Path, what: &str) -> CliResult<()> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("cannot create {what} file {}: {e}", path.display()).into())
}

fn open_log(path: &Path, append: bool, what: &str) -> CliResult<BufWriter<File>> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
        .map_err(|e| format!("cannot create {what} file {}: {e}", path.display()))?;
    Ok(BufWriter::new(f))
}

pub fn train(opts: &TrainOptions) -> CliResult<TrainOutcome> {
    let resume = match &opts.resume {
        Some(p) => {
            if !opts.fixed_flags.is_empty() {
                return Err(format!(
                    "cannot change {} when resuming: the checkpoint's config is used (only --steps \
                     and the device and execution flags may be given: --backend, --threads, \
                     --strict, --loss-every, --no-graphs, --gemm-autotune, \
                     --checkpoint/--checkpoint-every, --keep-gelu)",
                    opts.fixed_flags.join(", ")
                )
                .into());
            }
            Some(Checkpoint::load(&checkpoint_path(p))?)
        }
        None => None,
    };
    let cfg = match &resume {
        Some(ck) => {
            let mut cfg = ck.config.clone();
            if let Some(steps) = opts.model.steps {
                cfg.train.steps = steps;
            }
            // How a step runs changes no number: a resumed run may change it.
            apply_execution_settings(&mut cfg.train.execution, &opts.model.execution);
            cfg.validate()?;
            if cfg.train.steps <= ck.step {
                return Err(format!(
                    "the checkpoint is at step {} and the run has {} steps: nothing to do (raise --steps)",
                    ck.step, cfg.train.steps
                )
                .into());
            }
            cfg
        }
        None => {
            let cfg = build_config(&opts.model)?;
            warn_unused_fp8_flags(&opts.model, &[cfg.train.recipe.precision]);
            if cfg.train.steps == 0 {
                return Err("--steps is 0: nothing to train (give at least 1)".into());
            }
            cfg
        }
    };
    // Data parallelism: `--gpus N` starts one process per GPU running this same command line;
    // each of those (and each process of a torchrun-style multi-node launch) is one rank.
    let launch = duet_engine::dist::rendezvous::LaunchEnv::from_env()?;
    if opts.zero > 1 {
        return Err("--zero takes 0 or 1 (optimizer-state sharding)".into());
    }
    if opts.stop_after == Some(0) {
        return Err("--stop-after 0: nothing to train (give at least 1)".into());
    }
    if opts.out.is_none() {
        if opts.stop_after.is_some() {
            return Err(
                "--stop-after saves a checkpoint into --out to resume from: give --out".into(),
            );
        }
        if opts.save_every > 0 {
            return Err("--save-every saves checkpoints into --out: give --out".into());
        }
        if opts.resume.is_some() {
            eprintln!(
                "warning: no --out: this resumed run saves no checkpoint and no metrics (give \
                 --out, e.g. the folder it resumes from)"
            );
        }
    }
    let data = &cfg.train.data.data;
    if !data.is_empty() && Path::new(data).is_relative() {
        eprintln!(
            "warning: the checkpoint's data path {data} is relative (written before duet stored \
             it absolute): it is read from the current folder"
        );
    }
    if opts.zero == 1 && launch.is_none() && opts.gpus.is_none() {
        eprintln!(
            "warning: --zero 1 shards the optimizer state across data-parallel ranks; this run \
             has one (add --gpus N)"
        );
    }
    if launch.is_none()
        && let Some(n) = opts.gpus
    {
        let interrupted = spawn_ranks(n, cfg.train.data.batch, backend_kind(&opts.model)?)?;
        return Ok(if interrupted {
            TrainOutcome::Interrupted
        } else {
            TrainOutcome::Finished
        });
    }
    let dp = launch.as_ref().map(|_| duet_engine::dist::DpOptions {
        zero: opts.zero == 1,
        bucket_bytes: (opts.bucket_mb * 1048576.0).max(1.0) as usize,
        overlap: opts.overlap,
    });
    // Only rank 0 writes files and logs.
    let is_main = launch.as_ref().is_none_or(|l| l.rank == 0);
    let metrics_path = opts
        .metrics
        .clone()
        .or_else(|| opts.out.as_ref().map(|d| d.join(files::METRICS)))
        .filter(|_| is_main);
    let trace = opts.trace.clone().filter(|_| is_main);
    // Before anything is written.
    if is_main {
        check_no_overwrite(opts, &cfg, metrics_path.as_deref(), trace.as_deref())?;
    }
    let mut _out_lock = None;
    if let Some(dir) = opts.out.as_ref().filter(|_| is_main) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create output folder {}: {e}", dir.display()))?;
        // One run at a time per folder (released when this process exits, however it ends).
        _out_lock = Some(lock_out(dir)?);
        let ck = dir.join(files::CHECKPOINT);
        let resuming_here = opts
            .resume
            .as_deref()
            .map(checkpoint_path)
            .is_some_and(|p| same_file(&p, &ck));
        if ck.exists() && !resuming_here {
            return Err(format!(
                "{} already holds a checkpoint; resume it with --resume {} or choose another --out",
                dir.display(),
                dir.display()
            )
            .into());
        }
        std::fs::write(dir.join(files::CONFIG), cfg.to_toml())
            .map_err(|e| format!("cannot write {}: {e}", dir.join(files::CONFIG).display()))?;
    }
    // Open the logs before any work so a bad path fails fast. Resumed runs append.
    if let Some(p) = &metrics_path {
        check_writable(p, "metrics")?;
    }
    if let Some(p) = &trace {
        check_writable(p, "trace")?;
    }
    let kind = backend_kind(&opts.model)?;
    let task = TrainTask {
        cfg,
        resume,
        metrics: None,
        metrics_path,
        trace,
        out: opts.out.clone(),
        save_every: opts.save_every,
        stop_after: opts.stop_after,
        val_every: opts.val_every,
        log_every: opts.log_every,
        strict: opts.model.device.strict,
        fp8_report: opts.fp8_report,
        dp,
        is_main,
    };
    match &launch {
        Some(env) => run_rank(kind, env, task),
        None => dispatch(kind, opts.model.device.threads, task),
    }
}

struct TrainTask {
    cfg: Config,
    resume: Option<Checkpoint>,
    /// Opened (truncated, or appended to when resuming) once the model is built.
    metrics: Option<MetricsLog>,
    metrics_path: Option<PathBuf>,
    trace: Option<PathBuf>,
    out: Option<PathBuf>,
    save_every: u64,
    stop_after: Option<u64>,
    val_every: u64,
    log_every: Option<u64>,
    strict: bool,
    fp8_report: bool,
    /// Set when this process is one rank of a data-parallel run.
    dp: Option<duet_engine::dist::DpOptions>,
    /// Rank 0 (or a single-process run): the one that logs and writes files.
    is_main: bool,
}

impl RankTask for TrainTask {
    type Output = TrainOutcome;

    fn fingerprint(&self) -> String {
        format!(
            "{}\n{:?}\n{:?}",
            self.cfg.to_toml(),
            self.dp,
            self.resume.as_ref().map(|c| c.step)
        )
    }

    fn run_in_group<D: Fused>(
        self,
        dev: Arc<D>,
        comm: Arc<dyn duet_device::Collective<D>>,
    ) -> CliResult<TrainOutcome> {
        self.run_with(dev, Some(comm))
    }
}

impl OnDevice for TrainTask {
    type Output = TrainOutcome;

    fn run<D: Fused>(self, dev: Arc<D>) -> CliResult<TrainOutcome> {
        self.run_with(dev, None)
    }
}

impl TrainTask {
    /// The training run on `dev`; with `comm`, as one rank of a data-parallel group.
    fn run_with<D: Fused>(
        mut self,
        dev: Arc<D>,
        comm: Option<Arc<dyn duet_device::Collective<D>>>,
    ) -> CliResult<TrainOutcome> {
        let info = dev.info();
        resolve_precision(&mut self.cfg, &*dev, self.strict)?;
        let cfg = self.cfg.clone();
        let (m, t) = (&cfg.model, &cfg.train);
        let main = self.is_main;
        // Other ranks print nothing but errors.
        macro_rules! say {
            ($($arg:tt)*) => {
                if main {
                    eprintln!($($arg)*);
                }
            };
        }
        say!(
            "duet: {} on {} ({}) | {} | {} params: vocab {}, d_model {}, heads {}, ffn {}, layers {} | batch {} × seq {}, {} steps, lr {}{}",
            info.backend,
            info.name,
            info.arch,
            if t.recipe.precision == Precision::Fp8 {
                format!("fp8 ({})", t.recipe.delayed_scaling())
            } else {
                t.recipe.precision.to_string()
            },
            m.num_params(),
            m.vocab,
            m.d_model,
            m.heads,
            m.ffn,
            m.layers,
            t.data.batch,
            t.data.seq,
            t.steps,
            t.optimizer.lr,
            if t.data.data.is_empty() {
                String::new()
            } else {
                format!(" | data {}", t.data.data)
            }
        );
        let resuming = self.resume.is_some();
        let dp = match (&comm, self.dp) {
            (Some(c), Some(o)) => Some((c.clone(), o)),
            _ => None,
        };
        let mut trainer = match (self.resume.take(), dp) {
            (Some(mut ck), dp) => {
                ck.config.train.recipe.precision = cfg.train.recipe.precision;
                ck.config.train.steps = cfg.train.steps;
                ck.config.train.execution.loss_every = cfg.train.execution.loss_every;
                say!("resuming from step {}", ck.step);
                match dp {
                    Some((c, o)) => Trainer::from_checkpoint_data_parallel(dev.clone(), &ck, c, o)?,
                    None => Trainer::from_checkpoint(dev.clone(), &ck)?,
                }
            }
            (None, Some((c, o))) => Trainer::new_data_parallel(dev.clone(), cfg.clone(), c, o)?,
            (None, None) => Trainer::new(dev.clone(), cfg.clone())?,
        };
        if let Some(d) = trainer.dist() {
            let w = d.world_size();
            say!(
                "data parallel: {w} ranks over {}, global batch {} = {w} × {}, {} gradient buckets reduced {}{}",
                d.comm().describe(),
                t.data.batch,
                t.data.batch / w,
                d.buckets().len(),
                if d.overlaps() {
                    "during the backward pass"
                } else {
                    "after the backward pass"
                },
                match d.sharded_state_bytes() {
                    Some(b) => format!(
                        ", ZeRO-1: this rank holds {} of optimizer state",
                        human_bytes(b)
                    ),
                    None => String::new(),
                }
            );
        }
        let plan = trainer.model().memory_plan().clone();
        say!(
            "memory plan: params {}, grads {}, optimizer {}, activations {}, scratch {}",
            human_bytes(plan.params),
            human_bytes(plan.grads),
            human_bytes(plan.optimizer),
            human_bytes(plan.activations),
            human_bytes(plan.scratch)
        );
        if t.execution.checkpoint_every > 0 {
            say!(
                "activation checkpointing: every {} blocks (segments recomputed in the backward pass)",
                t.execution.checkpoint_every
            );
        }
        if let Some(p) = &self.metrics_path {
            let (log, dropped) = MetricsLog::open(p, resuming.then(|| trainer.step()))?;
            if dropped > 0 {
                say!(
                    "{}: dropped {dropped} line(s) past the checkpoint's step {} (or cut off by a \
                     kill)",
                    p.display(),
                    trainer.step()
                );
            }
            self.metrics = Some(log);
        }
        let first_step = trainer.step();
        let last_step = match self.stop_after {
            Some(n) => (first_step + n).min(t.steps),
            None => t.steps,
        };
        let bar = match self.log_every {
            None if main => {
                let bar = ProgressBar::new(t.steps);
                bar.set_position(first_step);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{bar:30} step {pos}/{len} | {msg} | {elapsed_precise} ETA {eta_precise}",
                    )
                    .expect("valid template"),
                );
                Some(bar)
            }
            _ => None,
        };
        let mut tracer = match self.trace.take() {
            Some(path) => {
                let w = open_log(&path, false, "trace")?;
                let header = TraceHeader {
                    kind: "header".into(),
                    duet_version: env!("CARGO_PKG_VERSION").into(),
                    git_rev: env!("DUET_GIT_REV").into(),
                    backend: info.backend.clone(),
                    device: info.name.clone(),
                    precision: t.recipe.precision.to_string(),
                    seed: t.data.seed,
                    config: cfg.clone(),
                };
                Some((path, TraceWriter::new(w, &header)?))
            }
            None => None,
        };
        // What would only fail after training, checked before it.
        let has_val = trainer.has_validation_data();
        if !has_val && self.val_every > 0 {
            return Err(format!(
                "--val-every: the synthetic task's held-out progressions do not fill one batch \
                 of {} (lower --batch, or raise --vocab / --max-stride)",
                t.data.batch
            )
            .into());
        }
        if !has_val {
            say!(
                "note: no validation loss at the end: the held-out progressions do not fill one \
                 batch of {}",
                t.data.batch
            );
        }
        let min_seq = duet_engine::train::PROMPT_LEN + duet_engine::train::GEN_LEN - 1;
        if main && t.data.eval_sequences > 0 && t.data.data.is_empty() && t.data.seq < min_seq {
            return Err(format!(
                "--eval-sequences: the generation check needs seq ≥ {min_seq} (prompt {} + {} \
                 generated), got {} (raise --seq, or --eval-sequences 0)",
                duet_engine::train::PROMPT_LEN,
                duet_engine::train::GEN_LEN,
                t.data.seq
            )
            .into());
        }
        let plan = RunPlan {
            last_step,
            val_every: self.val_every,
            save_every: self.save_every,
            checkpoint: self.out.as_ref().map(|d| d.join(files::CHECKPOINT)),
            log_every: self.log_every.unwrap_or(0),
            is_main: main,
        };
        let (fp8_report, log_every, steps) = (self.fp8_report, self.log_every, t.steps);
        let mut on_step = |trainer: &Trainer<D>, s: &StepLog| -> duet_engine::Result<()> {
            let r = &s.report;
            let val = s
                .val_loss
                .map(|v| format!(" | val {v:.4}"))
                .unwrap_or_default();
            let msg = format!("loss {:.4}{val} | {:.0} tok/s", r.loss, s.tokens_per_s);
            match (&bar, log_every) {
                (Some(bar), _) => {
                    bar.set_message(msg);
                    bar.inc(1);
                }
                (None, Some(n))
                    if main && ((n > 0 && r.step.is_multiple_of(n)) || s.val_loss.is_some()) =>
                {
                    let scale = match r.loss_scale {
                        Some(ls) => format!(
                            " | loss scale {ls}{}",
                            if r.skipped { " (step skipped)" } else { "" }
                        ),
                        None => String::new(),
                    };
                    eprintln!(
                        "step {}/{steps} | {msg} | lr {:.2e} | grad norm {:.3}{scale}",
                        r.step, r.lr, r.grad_norm
                    );
                    if fp8_report {
                        print_fp8_report(trainer);
                    }
                }
                _ => {}
            }
            Ok(())
        };
        let summary = duet_engine::run::run(
            &mut trainer,
            &plan,
            self.metrics.as_mut(),
            tracer.as_mut().map(|(_, tw)| tw),
            &INTERRUPTED,
            &mut on_step,
        )?;
        let RunSummary {
            ran,
            last_loss,
            skipped,
            last_scale,
            interrupted,
            seconds: train_secs,
        } = summary;
        if let Some(bar) = &bar {
            bar.finish();
        }
        self.metrics = None;
        if let Some((path, mut tw)) = tracer.take() {
            tw.flush()?;
            eprintln!("trace written to {}", path.display());
        }
        let mem = dev.memory_stats();
        // Rank 0 reports; every rank still takes part in the collectives below.
        macro_rules! report {
            ($($arg:tt)*) => {
                if main {
                    println!($($arg)*);
                }
            };
        }
        report!(
            "trained {} steps (to step {}) in {:.1}s ({:.0} tokens/s), final loss {:.4}, peak memory {}",
            ran,
            trainer.step(),
            train_secs,
            (ran as usize * t.data.batch * t.data.seq) as f64 / train_secs.max(1e-9),
            last_loss,
            human_bytes(mem.peak)
        );
        if let Some(ls) = last_scale {
            report!("loss scale {ls} at the end; {skipped} step(s) skipped for inf/NaN gradients");
        }
        if self.fp8_report && main {
            print_fp8_report(&trainer);
        }
        let ck_path = match &self.out {
            Some(dir) => Some(dir.join(files::CHECKPOINT)),
            None if interrupted => Some(interrupted_path()),
            None => None,
        };
        if let Some(p) = &ck_path {
            save_checkpoint(&trainer, p, main)?;
            report!(
                "checkpoint at step {} saved to {}",
                trainer.step(),
                p.display()
            );
        }
        if interrupted {
            let p = ck_path.expect("interrupted runs always save");
            let resume = match &self.out {
                Some(dir) => format!("--resume {0} --out {0}", dir.display()),
                None => format!("--resume {}", p.display()),
            };
            say!(
                "interrupted at step {}; resume with: duet train {resume}",
                trainer.step()
            );
            return Ok(TrainOutcome::Interrupted);
        }
        if ran > 0 && has_val {
            let v = trainer.validation_loss()?;
            match trainer.unigram_entropy() {
                Some(h) => report!(
                    "validation loss {v:.4} nats/token (the file's unigram entropy is {h:.4})"
                ),
                None => report!("validation loss {v:.4}"),
            }
        }
        if let (Some(dir), Some(mp)) = (&self.out, &self.metrics_path) {
            let svg = dir.join(files::LOSS_PLOT);
            crate::plot::write_loss_plot(mp, &svg)?;
            println!("loss curve written to {}", svg.display());
        }
        // Generation uses no collectives: rank 0 alone runs it.
        if main && t.data.eval_sequences > 0 && t.data.data.is_empty() && trainer.step() == t.steps
        {
            let eval_start = Instant::now();
            let e = trainer.evaluate_generation(t.data.eval_sequences)?;
            println!(
                "greedy generation on {} held-out progressions (prompt {}, generate {}): {:.1}% exact, {:.2}% of tokens keep the stride ({:.1}s)",
                e.sequences,
                duet_engine::train::PROMPT_LEN,
                duet_engine::train::GEN_LEN,
                100.0 * e.accuracy(),
                100.0 * e.token_accuracy,
                eval_start.elapsed().as_secs_f64()
            );
        }
        Ok(TrainOutcome::Finished)
    }
}

#[cfg(test)]
mod resume_rule_tests {
    use super::fixed_on_resume;
    use clap::CommandFactory;

    fn fixed(args: &[&str]) -> Vec<String> {
        let m = crate::Cli::command().get_matches_from(args);
        fixed_on_resume(m.subcommand_matches("train").expect("train"))
    }

    /// The group a flag is declared in decides: every flag of the configuration, model, data,
    /// optimizer and precision groups is refused on resume, none of --steps, the device or the
    /// execution group (defaults and the environment do not count as given).
    #[test]
    fn the_flag_groups_decide_what_a_resume_may_change() {
        let allowed = [
            "duet",
            "train",
            "--resume",
            "x",
            "--steps",
            "9",
            "--backend",
            "cpu",
            "--threads",
            "2",
            "--strict",
            "--loss-every",
            "3",
            "--no-graphs",
            "--gemm-autotune",
            "--checkpoint-every",
            "1",
            "--keep-gelu",
            "--log-every",
            "1",
        ];
        assert!(fixed(&allowed).is_empty(), "{:?}", fixed(&allowed));
        let refused = [
            "duet",
            "train",
            "--resume",
            "x",
            "--preset",
            "tiny",
            "--layers",
            "3",
            "--batch",
            "2",
            "--data",
            "f",
            "--lr",
            "0.1",
            "--beta2",
            "0.9",
            "--precision",
            "bf16",
            "--fp8-margin",
            "-1",
            "--steps",
            "4",
        ];
        assert_eq!(
            fixed(&refused),
            [
                "--preset",
                "--layers",
                "--batch",
                "--data",
                "--lr",
                "--beta2",
                "--precision",
                "--fp8-margin"
            ]
        );
    }
}
