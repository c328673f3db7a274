//! From flags to a run's [`Config`]: the preset, the config file and the flag groups of
//! [`ModelArgs`] (shared by `duet train` and `duet bench`), and the rule of what a resumed run may
//! change.

use crate::{CliResult, ExecutionFlags, ModelArgs};
use duet_device::{BackendKind, Fused};
use duet_engine::config::ExecutionConfig;
use duet_engine::{Config, Precision, Preset};

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
    // The data file: --data, else a config file's `train.data` (the same rules for both: it
    // used to be stored as written, relative, and the vocabulary not grown to cover it).
    let from_toml = (a.data.data.is_none() && !t.data.data.is_empty())
        .then(|| std::path::PathBuf::from(&t.data.data));
    if let Some(d) = a.data.data.as_ref().or(from_toml.as_ref()) {
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
    // The tokenizer: --tokenizer, else a config file's `train.tokenizer`.
    let from_toml = (a.data.tokenizer.is_none() && !cfg.train.data.tokenizer.is_empty())
        .then(|| std::path::PathBuf::from(&cfg.train.data.tokenizer));
    if let Some(p) = a.data.tokenizer.as_ref().or(from_toml.as_ref()) {
        let tok = duet_tokenize::Tokenizer::from_path(p)?;
        let data = &cfg.train.data.data;
        if data.is_empty() {
            return Err("--tokenizer names the tokenizer of --data's shards: give --data".into());
        }
        let shard = std::path::Path::new(data)
            .extension()
            .is_some_and(|e| e == "bin");
        if !shard && !tok.is_bytes() {
            return Err(format!(
                "--data {data} is read as text (byte tokens), not with the tokenizer {}:                  tokenize it first (duet tokenize {data} --tokenizer {} --out DIR) and train on                  the shards",
                p.display(),
                p.display()
            )
            .into());
        }
        let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
        cfg.train.data.tokenizer = abs.display().to_string();
        cfg.train.data.tokenizer_hash = tok.hash().to_string();
        if cfg.model.vocab < tok.vocab_size() {
            if a.arch.vocab.is_some() {
                return Err(format!(
                    "--vocab {} does not cover the tokenizer's {} tokens",
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
    }
    cfg.validate()?;
    Ok(cfg)
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
