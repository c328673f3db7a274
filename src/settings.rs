//! From flags to a run's [`Config`]: the preset, the config file and the flag groups of
//! [`ModelArgs`] (shared by `duet train` and `duet bench`), and the rule of what a resumed run may
//! change.

use crate::{CliResult, ExecutionFlags, ModelArgs};
use duet_device::{BackendKind, Device};
use duet_engine::config::ExecutionConfig;
use duet_engine::{Config, Precision, Preset};

/// Resolves the configured precision against the device (fallback with a warning, or an error
/// with `--strict`) and writes the result back into `cfg`.
pub(crate) fn resolve_precision<D: Device>(
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

/// Preset, then config file, then flags; validated.
pub fn build_config(a: &ModelArgs) -> CliResult<Config> {
    build_config_with(a, None)
}

/// What `--init-from` does to a configuration: puts the file's model (and the sequence length
/// it allows) into it.
pub type ModelFromFile<'a> = &'a mut dyn FnMut(&mut Config) -> CliResult<()>;

/// [`build_config`]; with `from_file` (`--init-from`), the model's shape comes from a file:
/// applied after the preset, config file and flags and before the data is scanned, so the
/// data's windows are checked at the run's own sequence length, and the vocabulary is the
/// file's (data or a tokenizer needing more is refused, not met by a larger vocabulary).
pub fn build_config_with(a: &ModelArgs, from_file: Option<ModelFromFile>) -> CliResult<Config> {
    let preset: Preset = a.base.preset.parse()?;
    let mut cfg = Config::preset(preset);
    if let Some(path) = &a.base.config {
        cfg = Config::from_toml_file(path, cfg)?;
    }
    apply_flags(a, &mut cfg)?;
    let fixed_model = from_file.is_some();
    if let Some(apply) = from_file {
        apply(&mut cfg)?;
    }
    resolve_data_files(a, &mut cfg, fixed_model)?;
    resolve_tokenizer(a, &mut cfg, fixed_model)?;
    // A new run's learning-rate schedule spans its steps (a config.toml of an extended run
    // may carry that run's; a resume keeps the checkpoint's).
    cfg.train.optimizer.schedule_steps = 0;
    cfg.validate()?;
    Ok(cfg)
}

/// The model, data, optimizer, precision and execution flags given, over `cfg`.
fn apply_flags(a: &ModelArgs, cfg: &mut Config) -> CliResult<()> {
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
    set!(t.data.grad_accum, a.data.grad_accum);
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
    if let Some(f) = &a.precision.fp8_family {
        t.recipe.fp8_family = f.parse()?;
    }
    if let Some(d) = &a.precision.weight_grad_dtype {
        t.recipe.weight_grad_dtype = d.parse()?;
    }
    apply_execution_settings(&mut t.execution, &a.execution);
    // The data: --data, else a config file's `train.data` (the same rules for both: it used
    // to be stored as written, relative, and the vocabulary not grown to cover it).
    if !a.data.data.is_empty() {
        t.data.data = a.data.data.clone();
    }
    if !a.data.val_data.is_empty() {
        t.data.val_data = a.data.val_data.clone();
    }
    if let Some(f) = &a.data.data_format {
        t.data.data_format = f.parse()?;
    }
    set!(t.data.val_batches, a.data.val_batches);
    Ok(())
}

/// The data of `cfg` resolved to the shards themselves, absolute (a resumed run reads the same
/// files from any folder, and new files in a folder do not join it; a hard link of a shard is
/// left out, with a note), and the vocabulary raised to cover their tokens unless `--vocab` or
/// `fixed_model` (`--init-from`) fixes it.
fn resolve_data_files(a: &ModelArgs, cfg: &mut Config, fixed_model: bool) -> CliResult<()> {
    let t = &mut cfg.train;
    if t.data.data.is_empty() {
        return Ok(());
    }
    let files =
        duet_engine::dataset::resolve_data(&t.data.data, &t.data.val_data, t.data.data_format)?;
    for (dropped, kept) in &files.hard_links {
        eprintln!(
            "note: {} is {} under another name (a hard link): it is read once",
            dropped.display(),
            kept.display()
        );
    }
    let name = |p: &std::path::PathBuf| p.display().to_string();
    t.data.data = files.train.iter().map(name).collect();
    t.data.val_data = files.val.iter().map(name).collect();
    // The model's vocabulary must cover the tokens; pick it unless --vocab was given.
    let set = duet_engine::dataset::DataSet::scan(&files, t.data.seq)?;
    sft_data_note(&set, t.data.seq, a.data.no_truncate)?;
    if cfg.model.vocab < set.vocab_needed {
        if fixed_model {
            return Err(format!(
                "data file {}: holds token ids up to {} but the model of --init-from has a \
                 vocabulary of {} (the data was tokenized with another tokenizer than the \
                 model's)",
                set.largest_token_shard().path.display(),
                set.vocab_needed - 1,
                cfg.model.vocab
            )
            .into());
        }
        if a.arch.vocab.is_none() {
            eprintln!(
                "vocab set to {} to cover the tokens of {}",
                set.vocab_needed,
                cfg.train.data.describe()
            );
            cfg.model.vocab = set.vocab_needed;
        }
    }
    // The generation check belongs to the synthetic task.
    cfg.train.data.eval_sequences = 0;
    Ok(())
}

/// The tokenizer of the run's shards: `--tokenizer`, else a config file's `train.tokenizer`,
/// else the `tokenizer.json` that `duet tokenize` wrote beside the shards; one given that is
/// not the shards' own (another hash) is refused, naming both. Recorded in `cfg` (path and
/// hash), the vocabulary raised to cover it unless `--vocab` or `fixed_model` fixes it.
fn resolve_tokenizer(a: &ModelArgs, cfg: &mut Config, fixed_model: bool) -> CliResult<()> {
    use duet_tokenize::Tokenizer;
    let from_toml = (a.data.tokenizer.is_none() && !cfg.train.data.tokenizer.is_empty())
        .then(|| std::path::PathBuf::from(&cfg.train.data.tokenizer));
    let given = a.data.tokenizer.clone().or(from_toml);
    let beside = shards_tokenizer(&cfg.train.data)?;
    let (p, tok) = match (given, beside) {
        (Some(p), beside) => {
            let tok = Tokenizer::from_path(&p)?;
            if let Some((bp, bt)) = beside
                && bt.hash() != tok.hash()
            {
                let flag = match a.data.tokenizer {
                    Some(_) => "--tokenizer",
                    None => "the config's train.tokenizer",
                };
                return Err(format!(
                    "{flag} {} (blake3 {}) is not the tokenizer the shards were written with: \
                     {} (blake3 {}) beside them; drop {flag} to use theirs, or tokenize the \
                     text again with this one",
                    p.display(),
                    &tok.hash()[..16],
                    bp.display(),
                    &bt.hash()[..16]
                )
                .into());
            }
            (p, tok)
        }
        (None, Some((bp, bt))) => {
            eprintln!(
                "tokenizer: {} (written beside the shards by duet tokenize)",
                bp.display()
            );
            (bp, bt)
        }
        (None, None) => return Ok(()),
    };
    let data = &cfg.train.data.data;
    if data.is_empty() {
        return Err("--tokenizer names the tokenizer of --data's shards: give --data".into());
    }
    // Text files are read as bytes (not with the tokenizer): only token shards fit it.
    let text = data.iter().find(|d| {
        duet_engine::dataset::is_text(std::path::Path::new(d), cfg.train.data.data_format)
    });
    if let (Some(data), false) = (text, tok.is_bytes()) {
        return Err(format!(
            "--data {data} is read as text (byte tokens), not with the tokenizer {}: \
             tokenize it first (duet tokenize {data} --tokenizer {} --out DIR) and train on \
             the shards",
            p.display(),
            p.display()
        )
        .into());
    }
    let abs = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
    cfg.train.data.tokenizer = abs.display().to_string();
    cfg.train.data.tokenizer_hash = tok.hash().to_string();
    if cfg.model.vocab < tok.vocab_size() {
        if a.arch.vocab.is_some() || fixed_model {
            return Err(format!(
                "{} {} does not cover the tokenizer's {} tokens",
                if fixed_model {
                    "the vocabulary of --init-from's model,"
                } else {
                    "--vocab"
                },
                cfg.model.vocab,
                tok.vocab_size()
            )
            .into());
        }
        eprintln!(
            "vocab set to {} to cover the tokenizer {}",
            tok.vocab_size(),
            p.display()
        );
        cfg.model.vocab = tok.vocab_size();
    }
    Ok(())
}

/// The `tokenizer.json` beside the run's token shards (`duet tokenize` writes it there), read,
/// when their folders hold one; shards of folders with two different tokenizers are refused
/// (two tokenisations of text in one run).
pub(crate) fn shards_tokenizer(
    d: &duet_engine::config::DataConfig,
) -> CliResult<Option<(std::path::PathBuf, duet_tokenize::Tokenizer)>> {
    use std::path::Path;
    let mut dirs: Vec<&Path> = Vec::new();
    for shard in d.data.iter().chain(&d.val_data).map(Path::new) {
        if duet_engine::dataset::is_text(shard, d.data_format) {
            continue;
        }
        if let Some(dir) = shard.parent()
            && !dirs.contains(&dir)
        {
            dirs.push(dir);
        }
    }
    let mut found: Option<(std::path::PathBuf, duet_tokenize::Tokenizer)> = None;
    for dir in dirs {
        let p = dir.join(duet_tokenize::TOKENIZER_FILE);
        if !p.is_file() {
            continue;
        }
        let tok = duet_tokenize::Tokenizer::from_path(&p)?;
        match &found {
            Some((q, first)) if first.hash() != tok.hash() => {
                return Err(format!(
                    "the shards come from two tokenizers: {} (blake3 {}) and {} (blake3 {}); \
                     a run's shards are tokenized with one",
                    q.display(),
                    &first.hash()[..16],
                    p.display(),
                    &tok.hash()[..16]
                )
                .into());
            }
            Some(_) => {}
            None => found = Some((p, tok)),
        }
    }
    Ok(found)
}

/// Adds `[default: V with --preset default]` to the help line of every flag whose default comes
/// from the preset (the model, data, optimizer and precision-recipe groups and `--steps`), read
/// off the default preset itself, so the help never disagrees with it; `--print-config` shows
/// the values any other preset and flags resolve to.
pub fn with_preset_defaults(cmd: clap::Command) -> clap::Command {
    let cfg = serde_json::to_value(Config::preset(Preset::Default)).unwrap_or_default();
    let lookup = |id: &str| -> Option<String> {
        let m = &cfg["model"];
        let t = &cfg["train"];
        let v = [
            &m[id],
            &t[id],
            &t["data"][id],
            &t["optimizer"][id],
            &t["recipe"][id],
        ]
        .into_iter()
        .find(|v| !v.is_null())?
        .clone();
        Some(match v {
            serde_json::Value::String(s) => s,
            // The config's floats are f32: shown as f32 (0.002, not 0.0020000000949949026).
            serde_json::Value::Number(n) if n.is_f64() => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if x != 0.0 && x.abs() < 1e-3 {
                    format!("{x:e}")
                } else {
                    x.to_string()
                }
            }
            other => other.to_string(),
        })
    };
    let add = |sub: clap::Command| -> clap::Command {
        // Flags whose help states its default already, and switches (a value of true or
        // false says nothing a switch's help does not), get none added.
        let ids: Vec<String> = sub
            .get_arguments()
            .filter(|a| a.get_default_values().is_empty() && !a.is_positional())
            .filter(|a| a.get_action().takes_values())
            .filter(|a| {
                !a.get_help()
                    .is_some_and(|h| h.to_string().to_lowercase().contains("default"))
            })
            .map(|a| a.get_id().to_string())
            .collect();
        ids.into_iter().fold(sub, |sub, id| {
            // The data path is empty in the preset (the synthetic task), not a default to show;
            // so are the empty lists.
            let Some(v) = lookup(&id).filter(|v| !v.is_empty() && v != "[]" && id != "data") else {
                return sub;
            };
            sub.mut_arg(id.as_str(), |a| {
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                a.help(format!("{help} [default: {v} with --preset default]"))
            })
        })
    };
    cmd.mut_subcommand("train", add)
        .mut_subcommand("bench", |bench| {
            BENCH_REFUSES
                .iter()
                .fold(add(bench), |c, (id, _)| c.mut_arg(*id, |a| a.hide(true)))
        })
}

/// The train flags `duet bench` shares through [`ModelArgs`] but has no use for (it times steps
/// on synthetic batches of the model's shape): hidden from `bench --help` and refused when given.
pub const BENCH_REFUSES: [(&str, &str); 7] = [
    ("data", "--data"),
    ("val_data", "--val-data"),
    ("data_format", "--data-format"),
    ("val_batches", "--val-batches"),
    ("tokenizer", "--tokenizer"),
    ("eval_sequences", "--eval-sequences"),
    ("max_stride", "--max-stride"),
];

/// The first of [`BENCH_REFUSES`] given in `a`.
pub fn bench_refused_flag(a: &ModelArgs) -> Option<&'static str> {
    let d = &a.data;
    let given = [
        !d.data.is_empty(),
        !d.val_data.is_empty(),
        d.data_format.is_some(),
        d.val_batches.is_some(),
        d.tokenizer.is_some(),
        d.eval_sequences.is_some(),
        d.max_stride.is_some(),
    ];
    BENCH_REFUSES
        .iter()
        .zip(given)
        .find_map(|((_, flag), g)| g.then_some(*flag))
}

/// The flags of the settings that change how a step runs, not what it computes
/// (the execution group, [`ExecutionConfig`]): a resumed run may change them too.
pub(crate) fn apply_execution_settings(t: &mut ExecutionConfig, a: &ExecutionFlags) {
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
    if a.recompute_gelu {
        t.recompute_gelu = true;
    }
    if let Some(n) = a.logits_chunk_rows {
        t.logits_chunk_rows = n;
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
pub(crate) fn fp8_flags_given(a: &ModelArgs) -> Vec<&'static str> {
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
        (a.precision.fp8_family.is_some(), "--fp8-family"),
    ]
    .into_iter()
    .filter_map(|(given, name)| given.then_some(name))
    .collect()
}

pub(crate) fn backend_kind(a: &ModelArgs) -> CliResult<BackendKind> {
    Ok(a.device.backend.parse()?)
}

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

/// Every `duet train` flag a resume accepts, as `--flag` (the flags outside the configuration,
/// model, data, optimizer and precision groups that [`fixed_on_resume`] refuses, `--resume`
/// itself left out), read off the command's definition so the refusal never lists a stale set.
pub fn accepted_on_resume() -> Vec<String> {
    use crate::{ArchFlags, BaseFlags, DataFlags, OptimizerFlags, PrecisionFlags};
    use clap::{Args, CommandFactory};
    let mut fixed: Vec<String> = Vec::new();
    for group in [
        BaseFlags::augment_args(clap::Command::new("g")),
        ArchFlags::augment_args(clap::Command::new("g")),
        DataFlags::augment_args(clap::Command::new("g")),
        OptimizerFlags::augment_args(clap::Command::new("g")),
        PrecisionFlags::augment_args(clap::Command::new("g")),
    ] {
        fixed.extend(
            group
                .get_arguments()
                .filter_map(|a| a.get_long().map(str::to_string)),
        );
    }
    let cmd = crate::Cli::command();
    let Some(train) = cmd.find_subcommand("train") else {
        return vec![];
    };
    train
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !["resume", "init-from", "help"].contains(l) && !fixed.iter().any(|f| f == l))
        .map(|l| format!("--{l}"))
        .collect()
}

/// What a run of SFT shards trains on (printed once, when its data is scanned): its examples,
/// learned targets and the examples cut to `seq + 1` tokens or left out; with `no_truncate`
/// (`--no-truncate`), an example longer than that is refused, naming the longest.
fn sft_data_note(
    set: &duet_engine::dataset::DataSet,
    seq: usize,
    no_truncate: bool,
) -> CliResult<()> {
    let Some(s) = &set.sft else {
        if no_truncate {
            return Err("--no-truncate is for SFT shards (duet tokenize --sft)".into());
        }
        return Ok(());
    };
    if no_truncate && s.truncated > 0 {
        let (path, len) = s.longest.clone().unwrap_or_default();
        return Err(format!(
            "--no-truncate: {} examples are longer than --seq {seq} + 1 tokens, the longest \
             {len} tokens (in {}): raise --seq (and --max-seq) to {} or more, or drop \
             --no-truncate to cut them",
            s.truncated,
            path.display(),
            len.saturating_sub(1)
        )
        .into());
    }
    eprintln!(
        "SFT data: {} training examples ({} learned targets in {} row tokens; a row holds one \
         example, padded), {} validation examples",
        s.train.len(),
        s.learned,
        s.row_tokens,
        s.val.len()
    );
    if s.truncated > 0 {
        eprintln!(
            "note: {} examples are longer than --seq {seq} + 1 tokens (the longest {} tokens): \
             cut to their first {} (--no-truncate refuses them)",
            s.truncated,
            s.longest.as_ref().map_or(0, |l| l.1),
            seq + 1
        );
    }
    if s.skipped > 0 {
        eprintln!(
            "note: {} examples have no learned target among their first {seq}: left out",
            s.skipped
        );
    }
    Ok(())
}

#[cfg(test)]
mod resume_rule_tests {
    use super::{accepted_on_resume, fixed_on_resume};
    use clap::CommandFactory;

    /// Issue 50 item 11: the resume refusal lists every flag a resume accepts.
    #[test]
    fn the_accepted_list_has_every_run_and_execution_flag() {
        let a = accepted_on_resume();
        for f in [
            "--steps",
            "--backend",
            "--threads",
            "--loss-every",
            "--recompute-gelu",
            "--logits-chunk-rows",
            "--out",
            "--metrics",
            "--trace",
            "--stop-after",
            "--keep-best",
        ] {
            assert!(a.iter().any(|x| x == f), "{f} missing from {a:?}");
        }
        for f in [
            "--lr",
            "--layers",
            "--precision",
            "--data",
            "--resume",
            "--preset",
        ] {
            assert!(!a.iter().any(|x| x == f), "{f} listed: {a:?}");
        }
    }

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
