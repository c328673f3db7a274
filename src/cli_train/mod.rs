//! `duet train`: the options, their checks, and the run (see [`task`]).

mod outputs;
mod progress;
mod report;
mod run_dir;
mod task;

use crate::backends::dispatch;
use crate::cli_dist::{run_rank, spawn_ranks};
use crate::settings::{
    apply_execution_settings, backend_kind, build_config, build_config_with, warn_unused_fp8_flags,
};
use crate::{CliResult, ModelArgs};
use duet_engine::checkpoint::{Checkpoint, files};
pub(crate) use outputs::checkpoint_path;
use outputs::{check_no_overwrite, lock_log, lock_out, same_file};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use task::TrainTask;

#[derive(Clone)]
pub struct TrainOptions {
    pub model: ModelArgs,
    pub metrics: Option<PathBuf>,
    pub log_every: Option<u64>,
    pub trace: Option<PathBuf>,
    /// `--overwrite`: --metrics/--trace may replace a file that is not duet's.
    pub overwrite: bool,
    /// `--accept-changed-data`: resume although the data file changed.
    pub accept_changed_data: bool,
    pub fp8_report: bool,
    /// `--record-batches FILE`.
    pub record_batches: Option<PathBuf>,
    /// `--sample-every N`: a sample of the model every N steps.
    pub sample_every: Option<u64>,
    pub out: Option<PathBuf>,
    /// `--save-every`, `--val-every`, `--keep`, `--keep-best`, `--val-batches` as given (None: not
    /// given; a resume restores the checkpoint's, a new run takes the defaults).
    pub save_every: Option<u64>,
    pub resume: Option<PathBuf>,
    /// `--init-from FILE`: a new run starting from a file's weights.
    pub init_from: Option<PathBuf>,
    pub stop_after: Option<u64>,
    pub val_every: Option<u64>,
    pub keep: Option<usize>,
    pub keep_best: bool,
    /// `--print-config`: print the resolved configuration and exit.
    pub print_config: bool,
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

/// The settings of a run that are not its model configuration but belong to the run: how
/// often it validates, saves and logs, and which checkpoints it keeps. Every checkpoint saved
/// into `--out` stores them (metadata [`RUN_SETTINGS_KEY`], JSON), so `duet train --resume DIR
/// --out DIR` continues the same run; a flag given on resume replaces the stored value.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSettings {
    /// Validation every N steps; None: the default for the run's data ([`default_val_every`]).
    pub val_every: Option<u64>,
    pub save_every: u64,
    /// Step-numbered checkpoints kept (0: all).
    pub keep: usize,
    pub keep_best: bool,
    /// Log lines every N steps; None: a progress bar on a terminal, else
    /// [`DEFAULT_LOG_EVERY`].
    pub log_every: Option<u64>,
}

/// Checkpoint metadata key of [`RunSettings`].
pub const RUN_SETTINGS_KEY: &str = "run_settings";

/// Step-numbered checkpoints a run keeps unless `--keep` says otherwise.
pub const DEFAULT_KEEP: usize = 3;

/// Log lines every N steps when stderr is not a terminal and `--log-every` is not given.
pub const DEFAULT_LOG_EVERY: u64 = 10;

/// Validation every ceil(steps / 10) steps by default (ten validations in a run).
pub fn default_val_every(steps: u64) -> u64 {
    steps.div_ceil(10).max(1)
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            val_every: None,
            save_every: 0,
            keep: DEFAULT_KEEP,
            keep_best: false,
            log_every: None,
        }
    }
}

impl RunSettings {
    /// The stored settings (a resume; the defaults for checkpoints from before they were
    /// stored), with the flags given on this command line over them.
    fn resolve(stored: Option<&str>, opts: &TrainOptions) -> CliResult<Self> {
        let mut s = match stored {
            Some(json) => serde_json::from_str(json)
                .map_err(|e| format!("the checkpoint's {RUN_SETTINGS_KEY} are unreadable: {e}"))?,
            None => Self::default(),
        };
        if let Some(n) = opts.val_every {
            s.val_every = Some(n);
        }
        if let Some(n) = opts.save_every {
            s.save_every = n;
        }
        if let Some(n) = opts.keep {
            s.keep = n;
        }
        if opts.keep_best {
            s.keep_best = true;
        }
        if let Some(n) = opts.log_every {
            s.log_every = Some(n);
        }
        Ok(s)
    }
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

/// How many training loops are running (one per rank thread; they alone check
/// [`INTERRUPTED`]): a signal while none is — the device opening, or after training, writing
/// the plot — ends the process at once instead of setting a flag nobody reads (one SIGTERM used
/// to be swallowed there).
pub static TRAINING_LOOPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `duet train`: checks the options, resolves the run's configuration (a resumed run's from its
/// checkpoint) and runs it here, as one rank of a launch, or over `--gpus` processes.
pub fn train(opts: &TrainOptions) -> CliResult<TrainOutcome> {
    if let (Some(init), Some(resume)) = (&opts.init_from, &opts.resume) {
        return Err(format!(
            "--init-from {} and --resume {} together: --resume continues a run exactly (its \
             optimizer state, step and data position), --init-from starts a new run from a \
             file's weights; give one of them",
            init.display(),
            resume.display()
        )
        .into());
    }
    let run = resolve_run(opts)?;
    if opts.print_config {
        print!("{}", run.cfg.to_toml());
        println!(
            "# run settings (not part of the model's configuration; stored in checkpoints)\n# {}",
            serde_json::to_string(&run.settings)?
        );
        return Ok(TrainOutcome::Finished);
    }
    // Data parallelism: `--gpus N` starts one process per GPU running this same command line;
    // each of those (and each process of a torchrun-style multi-node launch) is one rank.
    let launch = duet_engine::dist::rendezvous::LaunchEnv::from_env()?;
    // A new run on data files without --out saves into runs/<date>-<time>/ (the ranks of
    // --gpus are given the folder; of another launch, only rank 0 writes).
    let defaulted = default_out(opts, &run.cfg, launch.as_ref())?;
    let with_out;
    let opts = match &defaulted {
        Some(dir) => {
            with_out = TrainOptions {
                out: Some(dir.clone()),
                ..opts.clone()
            };
            &with_out
        }
        None => opts,
    };
    let result = start(opts, run, launch.as_ref(), defaulted.as_deref());
    // A run that failed before it wrote anything leaves no empty folder behind.
    if let (Err(_), Some(dir)) = (&result, &defaulted) {
        let _ = std::fs::remove_dir(dir);
    }
    result
}

/// Runs `run` (after [`train`] resolved it and its folder): here, as one rank of `launch`, or
/// over `--gpus` processes (given `default_out`, the folder chosen for them, as `--out`).
fn start(
    opts: &TrainOptions,
    run: ResolvedRun,
    launch: Option<&duet_engine::dist::rendezvous::LaunchEnv>,
    default_out: Option<&Path>,
) -> CliResult<TrainOutcome> {
    check_run_flags(opts)?;
    warn_about_run(opts, &run.cfg, launch.is_some());
    if launch.is_none()
        && let Some(n) = opts.gpus
    {
        // The ranks save where this process said it would.
        let out_args: Vec<std::ffi::OsString> = match default_out {
            Some(dir) => vec!["--out".into(), dir.into()],
            None => Vec::new(),
        };
        let batch = run.cfg.train.data.batch;
        let interrupted = spawn_ranks(n, batch, backend_kind(&opts.model)?, &out_args)?;
        return Ok(if interrupted {
            TrainOutcome::Interrupted
        } else {
            TrainOutcome::Finished
        });
    }
    run_here(opts, run, launch)
}

/// A run as the options (and the checkpoint it resumes) resolve it.
struct ResolvedRun {
    cfg: duet_engine::Config,
    resume: Option<Checkpoint>,
    /// `--init-from`: the initial weights.
    init: Option<Vec<Vec<f32>>>,
    settings: RunSettings,
}

/// The run's checkpoint (`--resume`), configuration, initial weights (`--init-from`) and
/// settings.
fn resolve_run(opts: &TrainOptions) -> CliResult<ResolvedRun> {
    let mut init = None;
    let resume = match &opts.resume {
        Some(p) => Some(load_resume(p, opts)?),
        None => None,
    };
    let cfg = match &resume {
        Some(ck) => resumed_config(ck, opts)?,
        None => new_config(opts, &mut init)?,
    };
    let settings = RunSettings::resolve(
        resume
            .as_ref()
            .and_then(|ck| ck.extra.get(RUN_SETTINGS_KEY))
            .map(String::as_str),
        opts,
    )?;
    Ok(ResolvedRun {
        cfg,
        resume,
        init,
        settings,
    })
}

/// Runs `run` in this process: alone, or as one rank of `launch`. Rank 0 checks and prepares
/// the files it writes first.
fn run_here(
    opts: &TrainOptions,
    run: ResolvedRun,
    launch: Option<&duet_engine::dist::rendezvous::LaunchEnv>,
) -> CliResult<TrainOutcome> {
    let ResolvedRun {
        cfg,
        resume,
        init,
        settings,
    } = run;
    let dp = launch.map(|_| duet_engine::dist::DpOptions {
        zero: opts.zero == 1,
        bucket_bytes: (opts.bucket_mb * 1048576.0).max(1.0) as usize,
        overlap: opts.overlap,
    });
    // Only rank 0 writes files and logs.
    let is_main = launch.is_none_or(|l| l.rank == 0);
    let metrics_path = opts
        .metrics
        .clone()
        .or_else(|| opts.out.as_ref().map(|d| d.join(files::METRICS)))
        .filter(|_| is_main);
    let trace = opts.trace.clone().filter(|_| is_main);
    let samples = crate::cli_generate::TrainingSamples::new(
        &cfg,
        opts.sample_every.unwrap_or(0),
        is_main,
        opts.out.as_deref(),
    )?;
    // Before anything is written.
    if is_main {
        check_no_overwrite(opts, &cfg, metrics_path.as_deref(), trace.as_deref())?;
    }
    // --out's lock, held until the run ends.
    let _out_lock = match opts.out.as_ref().filter(|_| is_main) {
        Some(dir) => Some(prepare_out(dir, opts, &cfg)?),
        None => None,
    };
    // Open the logs before any work so a bad path fails fast, and lock them until the run
    // ends (another run given the same file is refused). Resumed runs append.
    let mut _log_locks = Vec::new();
    for (p, what) in [(&metrics_path, "metrics"), (&trace, "trace")] {
        if let Some(p) = p {
            _log_locks.extend(lock_log(p, what)?);
        }
    }
    if let Some(p) = opts.record_batches.as_ref().filter(|_| is_main) {
        _log_locks.extend(lock_log(p, "batch record")?);
    }
    let kind = backend_kind(&opts.model)?;
    let task = TrainTask {
        samples,
        cfg,
        resume,
        init,
        metrics: None,
        metrics_path,
        trace,
        out: opts.out.clone(),
        settings,
        stop_after: opts.stop_after,
        strict: opts.model.device.strict,
        fp8_report: opts.fp8_report,
        record_batches: opts.record_batches.clone(),
        dp,
        is_main,
    };
    match launch {
        Some(env) => run_rank(kind, env, task),
        None => dispatch(kind, opts.model.device.threads, task),
    }
}

/// `--resume`: the checkpoint at `path`, the flags given checked against what a resume may
/// change, and its data files checked (or, with `--accept-changed-data`, accepted as they are
/// now; with `--data`/`--val-data`, found at their new place).
fn load_resume(path: &Path, opts: &TrainOptions) -> CliResult<Checkpoint> {
    let mut ck = Checkpoint::load(&checkpoint_path(path))?;
    // `--preset P` restating the checkpoint's own model is no change: accepted (and the
    // checkpoint's config used, as always); another preset's model is refused below.
    let mut fixed = opts.fixed_flags.clone();
    if let Some(i) = fixed.iter().position(|f| f == "--preset") {
        let preset: duet_engine::Preset = opts.model.base.preset.parse()?;
        if duet_engine::Config::preset(preset).model == ck.config.model {
            fixed.remove(i);
        } else {
            return Err(format!(
                "cannot resume with --preset {}: the checkpoint's model is not that \
                 preset's (the checkpoint's config is used; drop --preset)",
                opts.model.base.preset
            )
            .into());
        }
    }
    // The run's data at another place: checked against the run's hashes below.
    fixed.retain(|f| f != "--data" && f != "--val-data");
    if !fixed.is_empty() {
        return Err(format!(
            "cannot change {} when resuming: the checkpoint's config is used (a resume takes \
             --data/--val-data giving the run's shards at another place, and {})",
            fixed.join(", "),
            crate::settings::accepted_on_resume().join(", ")
        )
        .into());
    }
    let data = &opts.model.data;
    if !data.data.is_empty() || !data.val_data.is_empty() {
        relocate_data(&mut ck, opts)?;
    } else if opts.accept_changed_data {
        // The data file as the run read it: size, times and identity, hashed again only when
        // one of them changed; changed content is refused unless accepted.
        for change in duet_engine::train::forget_data_files(&mut ck)? {
            eprintln!(
                "warning: data file {change}; continuing on its new content \
                 (--accept-changed-data)"
            );
        }
    } else if let Some(note) = duet_engine::train::check_data_unchanged(&mut ck)? {
        eprintln!("note: {note}");
    }
    Ok(ck)
}

/// `--data`/`--val-data` on resume: the run's shards at another place (moved, renamed, another
/// machine). Each must hold what the run's shard at its place in the lists held (its recorded
/// hash); `ck` then names the new files. With `--accept-changed-data` the files given are taken
/// unchecked. The run's tokenizer is looked for beside the moved shards when its recorded path
/// no longer holds it.
fn relocate_data(ck: &mut Checkpoint, opts: &TrainOptions) -> CliResult<()> {
    let had = ck.config.train.data.clone();
    if had.data.is_empty() {
        return Err(
            "--data on resume: the checkpoint's run trained on the synthetic task, not on data \
             files"
                .into(),
        );
    }
    let a = &opts.model.data;
    // --data alone: the validation shards of its folders (as a new run takes them); --val-data
    // alone: the run's training shards where they were.
    let (data, val) = match (a.data.is_empty(), a.val_data.is_empty()) {
        (false, true) => (a.data.clone(), Vec::new()),
        (true, false) => (had.data.clone(), a.val_data.clone()),
        _ => (a.data.clone(), a.val_data.clone()),
    };
    let files = duet_engine::dataset::resolve_data(&data, &val, had.data_format)?;
    if opts.accept_changed_data {
        let name = |p: &PathBuf| p.display().to_string();
        ck.config.train.data.data = files.train.iter().map(name).collect();
        ck.config.train.data.val_data = files.val.iter().map(name).collect();
        ck.extra.remove(duet_engine::train::DATA_FILES_KEY);
        eprintln!(
            "warning: continuing on {} without checking it against the run's data \
             (--accept-changed-data)",
            ck.config.train.data.describe()
        );
    } else {
        let moved = duet_engine::train::relocate_data_files(ck, &files)?;
        eprintln!(
            "note: resuming on {} ({moved} of the run's {} shard(s) at a new path; their content \
             is the run's: hashes checked)",
            ck.config.train.data.describe(),
            files.train.len() + files.val.len()
        );
    }
    relink_tokenizer(ck);
    Ok(())
}

/// A resumed run whose tokenizer's recorded path no longer holds it (moved with its shards)
/// reads it from beside the shards, where `duet tokenize` wrote it, when that one has the
/// recorded hash.
fn relink_tokenizer(ck: &mut Checkpoint) {
    let d = &ck.config.train.data;
    if d.tokenizer.is_empty()
        || duet_tokenize::Tokenizer::from_path(Path::new(&d.tokenizer))
            .is_ok_and(|t| t.hash() == d.tokenizer_hash)
    {
        return;
    }
    if let Ok(Some((p, t))) = crate::settings::shards_tokenizer(d)
        && t.hash() == d.tokenizer_hash
    {
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        eprintln!(
            "note: the run's tokenizer is read from {} (beside the shards; {} no longer holds it)",
            p.display(),
            d.tokenizer
        );
        ck.config.train.data.tokenizer = p.display().to_string();
    }
}

/// A resumed run's configuration: the checkpoint's, with `--steps` and the execution flags
/// given over it (the learning-rate schedule keeps the length the run started with).
fn resumed_config(ck: &Checkpoint, opts: &TrainOptions) -> CliResult<duet_engine::Config> {
    let mut cfg = ck.config.clone();
    // The schedule's length is the one the run started with (checkpoints from before
    // duet stored it: their steps); more --steps continue at the final lr.
    cfg.train.optimizer.schedule_steps = cfg.schedule_steps();
    if let Some(steps) = opts.model.steps {
        cfg.train.steps = steps;
    }
    let sched = cfg.train.optimizer.schedule_steps;
    if sched == cfg.train.steps {
        // The schedule is the run's own length: the usual, unwritten case.
        cfg.train.optimizer.schedule_steps = 0;
    } else if cfg.train.steps > sched {
        eprintln!(
            "note: the run's learning-rate schedule spans {sched} steps; steps {}..{} \
             continue at its final rate {:.3e} (lr × min_lr_ratio)",
            sched + 1,
            cfg.train.steps,
            cfg.lr_at(sched)
        );
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
    Ok(cfg)
}

/// A new run's configuration from the flags; with `--init-from`, its model's shape from the
/// file and the file's weights put into `init`.
fn new_config(
    opts: &TrainOptions,
    init: &mut Option<Vec<Vec<f32>>>,
) -> CliResult<duet_engine::Config> {
    let cfg = match &opts.init_from {
        Some(path) => {
            let mut from_file = |cfg: &mut duet_engine::Config| -> CliResult<()> {
                *init = Some(init_weights_from(path, &opts.model, cfg)?);
                Ok(())
            };
            build_config_with(&opts.model, Some(&mut from_file))?
        }
        None => build_config(&opts.model)?,
    };
    warn_unused_fp8_flags(&opts.model, &[cfg.train.recipe.precision]);
    if cfg.train.steps == 0 {
        return Err("--steps is 0: nothing to train (give at least 1)".into());
    }
    Ok(cfg)
}

/// The folder a new run on data files saves into without `--out`: a new `runs/<date>-<time>/`
/// (rank 0 of a launch creates it; the other ranks write nothing there), announced. None with
/// `--out`, on resume and for the synthetic task (which saves nothing without `--out`).
fn default_out(
    opts: &TrainOptions,
    cfg: &duet_engine::Config,
    launch: Option<&duet_engine::dist::rendezvous::LaunchEnv>,
) -> CliResult<Option<PathBuf>> {
    if opts.out.is_some() || opts.resume.is_some() || cfg.train.data.data.is_empty() {
        return Ok(None);
    }
    if launch.is_some_and(|l| l.rank != 0) {
        // Only rank 0 writes; the others need a folder to agree that checkpoints are saved.
        return Ok(Some(PathBuf::from(run_dir::RUNS).join("rank-0-writes")));
    }
    let dir = run_dir::new_run_dir()?;
    eprintln!(
        "saving this run into {}/ (no --out given: checkpoints, metrics, config and loss plot; \
         --out DIR chooses the folder)",
        dir.display()
    );
    Ok(Some(dir))
}

/// Refuses `--zero` above 1 and the flags that need `--out` without it; warns that a resumed
/// run without `--out` saves nothing.
fn check_run_flags(opts: &TrainOptions) -> CliResult<()> {
    if opts.zero > 1 {
        return Err("--zero takes 0 or 1 (optimizer-state sharding)".into());
    }
    if opts.stop_after == Some(0) && opts.out.is_none() {
        return Err(
            "--stop-after 0 saves the initial state (step 0) into --out: give --out".into(),
        );
    }
    if opts.out.is_none() {
        if opts.stop_after.is_some() {
            return Err(
                "--stop-after saves a checkpoint into --out to resume from: give --out".into(),
            );
        }
        if opts.save_every.is_some_and(|n| n > 0) {
            return Err("--save-every saves checkpoints into --out: give --out".into());
        }
        if opts.keep.is_some() || opts.keep_best {
            return Err(
                "--keep and --keep-best choose the checkpoints kept in --out: give --out".into(),
            );
        }
        if opts.resume.is_some() {
            eprintln!(
                "warning: no --out: this resumed run saves no checkpoint and no metrics (give \
                 --out, e.g. the folder it resumes from)"
            );
        }
    }
    Ok(())
}

/// Warnings about the run's configuration: relative data paths (older checkpoints), a warmup
/// longer than the run, `--zero 1` on a single rank (`launched`: a rank of a multi-process
/// launch).
fn warn_about_run(opts: &TrainOptions, cfg: &duet_engine::Config, launched: bool) {
    let data = &cfg.train.data;
    for data in data.data.iter().chain(&data.val_data) {
        if !Path::new(data).is_relative() {
            continue;
        }
        eprintln!(
            "warning: the checkpoint's data path {data} is relative (written before duet stored \
             it absolute): it is read from the current folder"
        );
    }
    let (warmup, steps) = (cfg.train.optimizer.warmup, cfg.train.steps);
    if warmup > steps {
        eprintln!(
            "warning: the warmup ({warmup} steps) is longer than the run ({steps} steps): the \
             learning rate never reaches its peak (lower --warmup or raise --steps)"
        );
    }
    if opts.zero == 1 && !launched && opts.gpus.is_none() {
        eprintln!(
            "warning: --zero 1 shards the optimizer state across data-parallel ranks; this run \
             has one (add --gpus N)"
        );
    }
}

/// Takes `--out` (`dir`) for this run: creates and locks it (the lock returned: held until
/// the process exits), removes the temporaries of interrupted saves, refuses a checkpoint
/// there that this run does not resume, and writes the configuration and the tokenizer.
fn prepare_out(dir: &Path, opts: &TrainOptions, cfg: &duet_engine::Config) -> CliResult<File> {
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot create output folder {}",
            duet_engine::dataset::at_path(dir, &e)
        )
    })?;
    // One run at a time per folder (released when this process exits, however it ends).
    let lock = lock_out(dir)?;
    // Saves killed mid-write (SIGKILL, preemption) leave their temporary files behind; the
    // folder is ours now, so none of them belongs to a save in flight.
    match duet_engine::checkpoint::remove_stale_temporaries(dir) {
        Ok((removed, bytes)) if !removed.is_empty() => eprintln!(
            "note: removed {} temporary file(s) of interrupted saves from {} ({:.1} MB)",
            removed.len(),
            dir.display(),
            bytes as f64 / 1e6
        ),
        Ok(_) => {}
        Err(e) => eprintln!(
            "warning: could not look for temporary files of interrupted saves in {}: {e}",
            dir.display()
        ),
    }
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
    std::fs::write(dir.join(files::CONFIG), cfg.to_toml()).map_err(|e| {
        let p = dir.join(files::CONFIG);
        format!("cannot write {}", duet_engine::dataset::at_path(&p, &e))
    })?;
    crate::cli_tokenize::copy_run_tokenizer(cfg, dir)?;
    Ok(lock)
}

/// `--init-from`: the file's weights, and its model's shape put into `cfg` (the shape flags
/// given must agree with it; see [`duet_engine::init`]). The sequence length is `--seq` (at most
/// the file's context), else a config file's, else the file's context.
fn init_weights_from(
    path: &Path,
    a: &ModelArgs,
    cfg: &mut duet_engine::Config,
) -> CliResult<Vec<Vec<f32>>> {
    let given = duet_engine::init::ShapeRequest {
        vocab: a.arch.vocab,
        d_model: a.arch.d_model,
        heads: a.arch.heads,
        ffn: a.arch.ffn,
        layers: a.arch.layers,
        max_seq: a.arch.max_seq,
    };
    let init = duet_engine::init::load_init_weights(path, &given, Some(&cfg.model))?;
    for note in &init.notes {
        eprintln!("warning: {note}");
    }
    eprintln!(
        "initialising from {} ({}, heads from {}): a new run from step 0 with fresh optimizer state",
        init.path.display(),
        init.format,
        init.heads_from
    );
    cfg.model = init.model;
    let t = cfg.model.max_seq;
    let seq = &mut cfg.train.data.seq;
    match a.data.seq {
        Some(s) if s > t => {
            return Err(format!(
                "--seq {s} is longer than the context of {} ({t} positions, from the file): \
                 give --seq {t} or less",
                init.path.display()
            )
            .into());
        }
        Some(_) => {}
        // A config file's sequence length, where it fits the file's context.
        None if config_sets_seq(a) && *seq <= t => {}
        None => {
            if *seq != t {
                eprintln!(
                    "seq set to {t}, the context of {} (--seq gives a shorter one)",
                    init.path.display()
                );
            }
            *seq = t;
        }
    }
    cfg.validate().map_err(|e| {
        format!(
            "with the model of {}",
            duet_engine::dataset::at_path(&init.path, &e)
        )
    })?;
    Ok(init.weights)
}

/// Whether `--config`'s file sets the sequence length (`train.seq`).
fn config_sets_seq(a: &ModelArgs) -> bool {
    let (Some(path), Ok(preset)) = (&a.base.config, a.base.preset.parse()) else {
        return false;
    };
    let mut base = duet_engine::Config::preset(preset);
    base.train.data.seq = 0;
    duet_engine::Config::from_toml_file(path, base).is_ok_and(|c| c.train.data.seq != 0)
}
