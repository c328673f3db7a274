//! The `duet` command line: train, info, bench.
#![forbid(unsafe_code)]

mod backends;
mod cli_bench;
mod cli_dist;
mod cli_eval;
mod cli_export;
mod cli_generate;
mod cli_tokenize;
mod cli_train;
mod parity;
mod plot;
mod settings;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Errors at the CLI layer are reported as one line and a non-zero exit code.
pub type CliResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
#[command(name = "duet", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DUET_GIT_REV"), ")"),
    about = "Train transformer language models identically on CPUs, NVIDIA and AMD GPUs",
    arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Train a GPT model (defaults: a small model on the arithmetic task, on the CPU).
    Train(TrainArgs),
    /// Time training steps of a configuration.
    Bench(BenchArgs),
    /// List the compiled-in backends, which ones load here, and their devices.
    Info,
    /// Generate text or tokens from a checkpoint or a Hugging Face GPT-2 folder (sampling or
    /// greedy) with a KV cache.
    Generate(cli_generate::GenerateArgs),
    /// Loss and perplexity of a model (a checkpoint or a Hugging Face GPT-2 folder) over a data
    /// set, computed as a run's validation loss is.
    Eval(cli_eval::EvalArgs),
    /// Write a checkpoint's model for other tools: Hugging Face GPT-2 (config.json,
    /// model.safetensors, the run's tokenizer files) or a nanoGPT state dict.
    Export(cli_export::ExportArgs),
    /// Tokenize text files or folders into llm.c token shards (uint16, or uint32 for
    /// vocabularies over 65,536), with a given or a newly trained BPE tokenizer.
    Tokenize(cli_tokenize::TokenizeArgs),
    /// Compare two training traces (from `duet train --trace`): exit 0 on match, 1 on
    /// divergence, 2 when a trace is unreadable or the two are not comparable.
    Parity { a: PathBuf, b: PathBuf },
}

/// Model and run settings shared by `train` and `bench`, in the groups `--help` shows; each flag
/// overrides the preset and the config file. A resumed run may change `--steps` and the device
/// and execution groups; a flag of any other group is refused (the group decides, see
/// [`settings::fixed_on_resume`]).
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    #[command(flatten, next_help_heading = "Configuration")]
    pub base: BaseFlags,
    #[command(flatten, next_help_heading = "Device")]
    pub device: DeviceFlags,
    /// Steps of the whole run (a resumed run may raise it).
    #[arg(long, help_heading = "Run length")]
    pub steps: Option<u64>,
    #[command(flatten, next_help_heading = "Model")]
    pub arch: ArchFlags,
    #[command(flatten, next_help_heading = "Data")]
    pub data: DataFlags,
    #[command(flatten, next_help_heading = "Optimizer")]
    pub optimizer: OptimizerFlags,
    #[command(flatten, next_help_heading = "Precision recipe")]
    pub precision: PrecisionFlags,
    #[command(flatten, next_help_heading = "Execution")]
    pub execution: ExecutionFlags,
}

/// What a run starts from: a preset, then a config file; the flags of the other groups override
/// both.
#[derive(Args, Clone, Debug)]
pub struct BaseFlags {
    /// Starting configuration: default, seed (the benchmark model), large, tiny, gpt2 (124M),
    /// gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.56B; GPT-2's sizes, vocab 50257,
    /// context 1024, nanoGPT's optimizer settings).
    #[arg(long, default_value = "default")]
    pub preset: String,
    /// A TOML file with [model] and [train] tables overriding the preset.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Where a run executes.
#[derive(Args, Clone, Debug)]
pub struct DeviceFlags {
    /// cpu, cuda, hip or auto.
    #[arg(long, env = "DUET_BACKEND", default_value = "cpu")]
    pub backend: String,
    /// CPU worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Fail instead of falling back when the hardware lacks the requested precision.
    #[arg(long)]
    pub strict: bool,
}

/// The model's shape.
#[derive(Args, Clone, Debug)]
pub struct ArchFlags {
    /// Transformer blocks.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Width of the residual stream.
    #[arg(long)]
    pub d_model: Option<usize>,
    /// Attention heads (must divide --d-model).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Width of the MLP's hidden layer.
    #[arg(long)]
    pub ffn: Option<usize>,
    /// Vocabulary size (a data file raises it to cover its tokens).
    #[arg(long)]
    pub vocab: Option<usize>,
    /// Longest sequence the model takes (position embeddings).
    #[arg(long)]
    pub max_seq: Option<usize>,
}

/// What a run trains on, in which order, and how it is evaluated.
#[derive(Args, Clone, Debug)]
pub struct DataFlags {
    /// Sequences per step.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Gradient accumulation: run each step's batch as K micro-batches of batch / K sequences
    /// (per process), their gradients summed in f32 before one optimizer step (the same step
    /// as the whole batch up to rounding, in less activation memory; one process only).
    #[arg(long, value_name = "K")]
    pub grad_accum: Option<usize>,
    /// Tokens per training sequence (at most --max-seq).
    #[arg(long)]
    pub seq: Option<usize>,
    /// Seed of the initial weights and the data order.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Train on files, folders or globs (repeat --data, separate them by commas, or list
    /// several after one --data, as a shell-expanded glob gives them): UTF-8 text (byte
    /// tokens) or token shards (llm.c `.bin`, uint16 or uint32; nanoGPT's with --data-format
    /// nanogpt). A folder's `*train*.bin` files, sorted by name, are its training shards and
    /// its `*val*.bin` files the validation shards; a quoted glob is expanded by duet, sorted.
    /// Without validation shards the last 10% of every shard is held out.
    #[arg(long, value_name = "PATH", num_args = 1.., value_delimiter = ',')]
    pub data: Vec<String>,
    /// Validation shards (the same syntax as --data; a folder gives its `*val*.bin` files).
    /// Default: the --data folders' `*val*.bin` shards, else the last 10% of every training
    /// shard.
    #[arg(long, value_name = "PATH", num_args = 1.., value_delimiter = ',')]
    pub val_data: Vec<String>,
    /// How data files are read: auto (a `.bin` is an llm.c shard, whose header tells uint16 from
    /// uint32; anything else UTF-8 text), text, llmc, or nanogpt (headerless uint16, as
    /// nanoGPT's prepare.py writes train.bin and val.bin). [default: auto]
    #[arg(long, value_name = "FORMAT")]
    pub data_format: Option<String>,
    /// SFT shards (duet tokenize --sft): refuse an example longer than --seq + 1 tokens
    /// instead of cutting it (the count of cut examples is reported either way).
    #[arg(long)]
    pub no_truncate: bool,
    /// Most validation batches (of --batch windows, evenly spaced over the validation data)
    /// each validation evaluates. [default: 8]
    #[arg(long, value_name = "N")]
    pub val_batches: Option<usize>,
    /// The tokenizer of --data's shards (a tokenizer.json, or a folder holding one or GPT-2's
    /// encoder.json + vocab.bpe): copied into --out as tokenizer.json, its hash recorded in the
    /// checkpoint, the vocabulary raised to cover it [default: the tokenizer.json `duet tokenize`
    /// wrote beside the shards, if any; one whose hash differs from it is refused].
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// Held-out progressions checked by greedy generation at the end (0 skips the check).
    #[arg(long)]
    pub eval_sequences: Option<usize>,
    /// Strides of the arithmetic task are drawn from 1..=N (up to vocab − 1).
    #[arg(long, value_name = "N")]
    pub max_stride: Option<usize>,
}

/// AdamW and its learning-rate schedule.
#[derive(Args, Clone, Debug)]
pub struct OptimizerFlags {
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f32>,
    /// Linear warm-up steps before the cosine decay.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// The cosine decay ends at lr × this.
    #[arg(long)]
    pub min_lr_ratio: Option<f32>,
    /// AdamW weight decay (matrices and embeddings only).
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// AdamW β1.
    #[arg(long)]
    pub beta1: Option<f32>,
    /// AdamW β2.
    #[arg(long)]
    pub beta2: Option<f32>,
    /// AdamW ε.
    #[arg(long)]
    pub eps: Option<f32>,
    /// Global gradient-norm clipping threshold (0 disables).
    #[arg(long)]
    pub grad_clip: Option<f32>,
}

/// How the numbers are stored and scaled.
#[derive(Args, Clone, Debug)]
pub struct PrecisionFlags {
    /// fp32, bf16, fp16 or fp8 (FP32 master weights in every mode). Unsupported by the
    /// hardware: falls back (fp8 → bf16 → fp16 → fp32) with a warning, or fails with --strict.
    /// `bench` also takes a comma list or `all` and measures each in one run.
    #[arg(long)]
    pub precision: Option<String>,
    /// Static loss scale (e.g. 1024); 0 = dynamic (the fp16 default: 2^16, halve and skip on
    /// inf/NaN, double after 2000 clean steps).
    #[arg(long, value_name = "SCALE")]
    pub loss_scale: Option<f32>,
    /// FP8 recipe: hybrid (E4M3 forward, E5M2 gradients) or e4m3.
    #[arg(long, value_name = "FORMAT")]
    pub fp8_format: Option<String>,
    /// Entries in each FP8 operand's amax history (1..=1024, default 16).
    #[arg(long, value_name = "N")]
    pub fp8_amax_history_len: Option<usize>,
    /// max or most_recent.
    #[arg(long, value_name = "ALGO")]
    pub fp8_amax_compute_algo: Option<String>,
    /// FP8 scale = fp8_max / amax / 2^margin.
    #[arg(long, value_name = "M", allow_hyphen_values = true)]
    pub fp8_margin: Option<i32>,
    /// FP8 GEMMs in the tensor cores' fast accumulation: none, forward (default, as Transformer
    /// Engine and torchao do) or all (CUDA; other backends always accumulate exactly).
    #[arg(long, value_name = "WHICH")]
    pub fp8_fast_accum: Option<String>,
    /// FP8 encodings: device (the device's own: FNUZ on gfx942, OCP elsewhere and on the CPU),
    /// ocp or fnuz. The CPU computes both, so `--fp8-family fnuz` there is the reference for an
    /// MI300X run; a GPU refuses a family its hardware does not have.
    #[arg(long, value_name = "FAMILY")]
    pub fp8_family: Option<String>,
    /// Storage of the linear layers' weight gradients: auto (bf16 in bf16/fp8 runs on one
    /// device: the f32-accumulated GEMM result rounded once, as PyTorch autocast does; f32
    /// otherwise) or f32.
    #[arg(long, value_name = "auto|f32")]
    pub weight_grad_dtype: Option<String>,
}

/// How a step runs; none of these changes a number.
#[derive(Args, Clone, Debug)]
pub struct ExecutionFlags {
    /// Activation checkpointing with the default interval (every 4 blocks).
    #[arg(long)]
    pub checkpoint: bool,
    /// Activation checkpointing: keep only the input of every segment of N blocks and recompute
    /// each segment in the backward pass (about a third more compute, far less memory).
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<usize>,
    /// Run every step unrecorded (by default a GPU records the step once as a CUDA graph and
    /// replays it, where nothing in the step needs the host: no fp16 loss scaler, one GPU).
    #[arg(long)]
    pub no_graphs: bool,
    /// Time the GEMM algorithms once per shape and keep the fastest (CUDA; like PyTorch's
    /// max-autotune). Faster, but two runs may then differ in the last bits.
    #[arg(long)]
    pub gemm_autotune: bool,
    /// Read the loss back every N steps (default 10; 1: after every step): the steps in between
    /// are queued without waiting for the device, their losses reported together, the same
    /// numbers. Log lines, validation and checkpoints still see their own step.
    #[arg(long, value_name = "N")]
    pub loss_every: Option<u64>,
    /// Keep the MLP's GELU output for the backward pass instead of recomputing it (batch ×
    /// seq × ffn activations per block more memory, a little faster; no effect in fp8; the
    /// default with `--preset gpt2`).
    #[arg(long, conflicts_with = "recompute_gelu")]
    pub keep_gelu: bool,
    /// Recompute the MLP's GELU output in the backward pass instead of keeping it (the
    /// default but for `--preset gpt2`, which keeps it): less memory, a little slower.
    #[arg(long)]
    pub recompute_gelu: bool,
    /// Rows of logits the LM head and the loss handle at once (a divisor of batch × seq; 0,
    /// the default: the logits whole up to 1 GiB, 512 MiB where the GELU outputs are kept, else
    /// the fewest equal chunks that fit).
    /// Smaller chunks hold less memory; the tied embedding's gradient then sums the chunks one
    /// after another (the same values up to the last bits).
    #[arg(long, value_name = "N")]
    pub logits_chunk_rows: Option<usize>,
}

#[derive(Args)]
struct TrainArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Write one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, elapsed_s).
    #[arg(long, value_name = "FILE", help_heading = "Logs and checkpoints")]
    metrics: Option<PathBuf>,
    /// No progress bar; print a line every N steps instead (step, loss, lr, grad norm, ms/step,
    /// tokens/s, MFU on a GPU, ETA) and one per validation and save (0: only the summary).
    /// [default: a progress bar on a terminal, a line every 10 steps when stderr is a file or
    /// pipe (tee, nohup, Slurm, CI)]
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    log_every: Option<u64>,
    /// Gather the run in this folder: config.toml, metrics.jsonl and metrics.csv,
    /// checkpoint-<step>.safetensors (checkpoint.safetensors: the latest) and loss.svg [default:
    /// a new run on --data saves into runs/<date>-<time>/ (UTC); the synthetic task saves
    /// nothing].
    #[arg(long, value_name = "DIR", help_heading = "Logs and checkpoints")]
    out: Option<PathBuf>,
    /// Save a checkpoint into --out every N steps (0: only at the end) [default: 0; a resume
    /// keeps the run's]
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    save_every: Option<u64>,
    /// Step-numbered checkpoints kept in --out: the newest N (0: all) [default: 3; a resume
    /// keeps the run's]
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    keep: Option<usize>,
    /// Also keep the checkpoint with the lowest validation loss as
    /// checkpoint-best.safetensors in --out (a resume keeps the run's choice).
    #[arg(long, help_heading = "Logs and checkpoints")]
    keep_best: bool,
    /// Print the resolved configuration (preset, config file and flags; TOML, as --config
    /// reads it) and the run settings, and exit without training.
    #[arg(long, help_heading = "Configuration")]
    print_config: bool,
    /// Continue a run from a checkpoint (the file, or the --out folder holding it): the next
    /// losses are those the run would have had. Only --steps, the Device and Execution flags and
    /// --data/--val-data giving the run's shards at a new place (their hashes are checked) may
    /// be given with it; the checkpoint's configuration is used.
    #[arg(long, value_name = "PATH", help_heading = "Logs and checkpoints")]
    resume: Option<PathBuf>,
    /// Start a new run from the weights of FILE (or a folder holding checkpoint.safetensors or
    /// model.safetensors): a duet checkpoint, a nanoGPT state dict or a Hugging Face GPT-2
    /// model.safetensors, in f32, f16 or bf16. The model's shape comes from the file, its context
    /// too (the sequence length unless --seq; the head count from a duet checkpoint, a
    /// config.json beside the file, or --heads); step 0, fresh
    /// optimizer state, and the data, schedule and steps of the flags. Not with --resume.
    #[arg(long, value_name = "FILE", help_heading = "Logs and checkpoints")]
    init_from: Option<PathBuf>,
    /// Stop after N steps of this invocation (saving a checkpoint into --out; 0 saves the
    /// initial state, step 0, and trains nothing).
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    stop_after: Option<u64>,
    /// Compute the validation loss every N steps (0: only at the end) [default: ten times a
    /// run, every ceil(steps / 10) steps, where the run has validation data; a resume keeps the
    /// run's]
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    val_every: Option<u64>,
    /// Write a deterministic per-step trace (loss, grad norm, lr, per-tensor norms and samples)
    /// for `duet parity`.
    #[arg(long, value_name = "FILE", help_heading = "Logs and checkpoints")]
    trace: Option<PathBuf>,
    /// Every N steps, print a sample of the model: 64 tokens after the end-of-text token (after
    /// a newline for byte tokens), temperature 0.8, top-k 200 (0: none) [default: 0].
    #[arg(long, value_name = "N", help_heading = "Logs and checkpoints")]
    sample_every: Option<u64>,
    /// Let --metrics and --trace replace an existing file that is not a duet metrics log or
    /// trace (without it such a file — a checkpoint, a corpus — is refused, never truncated).
    #[arg(long, help_heading = "Logs and checkpoints")]
    overwrite: bool,
    /// With --resume: continue although the data file changed since the checkpoint's run read
    /// it (without it such a resume is refused: the run would go on with other data).
    #[arg(long, requires = "resume", help_heading = "Logs and checkpoints")]
    accept_changed_data: bool,
    /// FP8: print, per layer and operand, the scale and the first amax-history entries at the
    /// end (and every --log-every steps); the metrics log carries them at every step.
    #[arg(long, help_heading = "Logs and checkpoints")]
    fp8_report: bool,
    /// Record every batch this invocation trains on into FILE (inputs and targets, i32), to
    /// replay the same steps elsewhere (scripts/bench/torch_train_ref.py; format in
    /// duet_engine::train::Trainer::record_batches).
    #[arg(long, value_name = "FILE", help_heading = "Logs and checkpoints")]
    record_batches: Option<PathBuf>,
    /// Data parallelism on N GPUs of this machine: one process per GPU, --batch is the global
    /// batch (split evenly). Multi-node runs are started by a launcher that sets RANK,
    /// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (as torchrun does) instead.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..), help_heading = "Data parallelism")]
    gpus: Option<u16>,
    /// ZeRO stage: 1 shards the optimizer state (FP32 master weights, AdamW moments) over the
    /// ranks of a data-parallel run; 0 replicates it.
    #[arg(
        long,
        value_name = "STAGE",
        default_value_t = 0,
        help_heading = "Data parallelism"
    )]
    zero: u8,
    /// Gradient bucket size in MiB for data parallelism (buckets are reduced while the backward
    /// pass continues).
    #[arg(
        long,
        value_name = "MIB",
        default_value_t = 25.0,
        help_heading = "Data parallelism"
    )]
    bucket_mb: f64,
    /// Data parallelism: start the gradient reductions only after the backward pass (same
    /// results; for measuring what the overlap hides).
    #[arg(long, help_heading = "Data parallelism")]
    no_overlap: bool,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Untimed warm-up steps.
    #[arg(long, default_value_t = 3, help_heading = "Benchmark")]
    warmup_steps: u64,
    /// Timed steps.
    #[arg(long, default_value_t = 10, help_heading = "Benchmark")]
    iters: u64,
    /// Also write the result as JSON.
    #[arg(long, value_name = "FILE", help_heading = "Benchmark")]
    json: Option<PathBuf>,
}

/// A closed pipe on stdout or stderr (`duet train | head`) ends the process quietly with exit
/// status 141 (128 + SIGPIPE, what a shell reports for a program killed by the closed pipe)
/// instead of a panic message and status 101. Rust ignores SIGPIPE, so the write fails with
/// EPIPE and the print macros panic with "failed printing to stdout: Broken pipe"; nothing
/// else is caught. A run's last saved checkpoint is untouched.
fn quiet_broken_pipes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

/// A file-size limit (`ulimit -f`) kills a process that writes past it with SIGXFSZ, losing the
/// save in progress without a word. With the signal caught, the write fails with EFBIG ("File
/// too large") instead and the error paths that name the file run.
fn write_errors_instead_of_sigxfsz() {
    let caught = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGXFSZ, caught);
}

fn main() -> ExitCode {
    quiet_broken_pipes();
    write_errors_instead_of_sigxfsz();
    let matches = settings::with_preset_defaults(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // A malformed DUET_* variable fails every command at once, naming it (duet_device::knobs).
    if let Err(e) = duet_device::knobs::knobs() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Train(a) => {
            // Ctrl-C (or SIGTERM, SIGHUP: a scheduler's notice) stops after the steps already
            // queued and saves a checkpoint; a second one aborts. `timeout` and signals sent to
            // a process group deliver one interrupt twice within microseconds: a repeat within
            // REPEAT_WINDOW of the first is the same interrupt, not a second one.
            const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);
            static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            let _ = ctrlc::set_handler(|| {
                use std::sync::atomic::Ordering::SeqCst;
                // The handler runs on one thread, one signal after another: FIRST is set before
                // a repeat is handled, also when the loop has ended and the checkpoint is being
                // written.
                if FIRST.get().is_some_and(|t| t.elapsed() < REPEAT_WINDOW) {
                    return;
                }
                if cli_train::TRAINING_LOOPS.load(SeqCst) == 0 {
                    eprintln!("\ninterrupted outside the training loop: exiting");
                    std::process::exit(130);
                }
                if cli_train::INTERRUPTED.swap(true, SeqCst) {
                    std::process::exit(130);
                }
                let _ = FIRST.set(std::time::Instant::now());
                eprintln!(
                    "\ninterrupt: finishing the steps already queued and saving a checkpoint (Ctrl-C \
                     again aborts)"
                );
            });
            match cli_train::train(&cli_train::TrainOptions {
                model: a.model,
                metrics: a.metrics,
                log_every: a.log_every,
                trace: a.trace,
                overwrite: a.overwrite,
                accept_changed_data: a.accept_changed_data,
                fp8_report: a.fp8_report,
                record_batches: a.record_batches,
                sample_every: a.sample_every,
                out: a.out,
                save_every: a.save_every,
                resume: a.resume,
                init_from: a.init_from,
                stop_after: a.stop_after,
                val_every: a.val_every,
                keep: a.keep,
                keep_best: a.keep_best,
                print_config: a.print_config,
                gpus: a.gpus.map(usize::from),
                zero: a.zero,
                bucket_mb: a.bucket_mb,
                overlap: !a.no_overlap,
                fixed_flags: matches
                    .subcommand_matches("train")
                    .map(settings::fixed_on_resume)
                    .unwrap_or_default(),
            }) {
                Ok(cli_train::TrainOutcome::Interrupted) => return ExitCode::from(130),
                Ok(cli_train::TrainOutcome::Finished) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Command::Generate(a) => cli_generate::run(&a),
        Command::Tokenize(a) => cli_tokenize::run(&a),
        Command::Bench(a) => cli_bench::bench(&a.model, a.warmup_steps, a.iters, a.json.as_deref()),
        Command::Export(a) => cli_export::run(&a),
        Command::Eval(a) => cli_eval::run(&a),
        Command::Info => backends::info(),
        Command::Parity { a, b } => return parity::run(&a, &b),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
