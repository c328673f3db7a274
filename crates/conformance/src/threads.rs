//! One device driven from several threads at once, as a user's data loader, validation pass or
//! second model does, and as the conformance suite's parallel cases do (issue 49: 2 of 17 full
//! CUDA runs failed one case each, `cross_entropy_padded` returning an error and a graph
//! recording failing). Every op must either succeed with the bits it computes alone or fail with
//! an error that names the conflict; here every op is legal, so every op must succeed.
//!
//! Generic over the backend: `crates/cuda/tests/threads.rs` and `crates/hip/tests/threads.rs`
//! call these bodies with their device. Each counts every failure by its message and prints the
//! counts before failing, so one run tells which conflicts happen and how often. Without a
//! usable device every test prints `SKIP <test>: <reason>`.

use crate::harness::{Rng, skip};
use duet_device::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Barrier, Mutex};

fn opened<D>(test: &str, open: &impl Fn() -> std::result::Result<D, String>) -> Option<D> {
    match open() {
        Ok(d) => Some(d),
        Err(e) => {
            skip(test, &format!("no usable device: {e}"));
            None
        }
    }
}

/// Failures seen, by message (the message's first 160 characters), with their counts.
type Failures = Arc<Mutex<BTreeMap<String, usize>>>;

fn note(failures: &Failures, what: &str, e: impl std::fmt::Display) {
    let msg: String = format!("{what}: {e}").chars().take(160).collect();
    *failures.lock().unwrap().entry(msg).or_insert(0) += 1;
}

fn report(test: &str, failures: &Failures, ops: usize) {
    let f = failures.lock().unwrap();
    let total: usize = f.values().sum();
    println!("{test}: {ops} ops, {total} failed");
    for (msg, n) in f.iter() {
        println!("  {n:6} × {msg}");
    }
    assert_eq!(
        total, 0,
        "{test}: {total} of {ops} ops failed (counts above)"
    );
}

/// Deterministic logits in [−4, 4) and targets in the vocabulary for `n` rows of `v`.
fn problem(n: usize, v: usize, seed: u64) -> (Vec<f32>, Vec<i32>) {
    let mut rng = Rng::new(seed);
    let logits = rng.vec(n * v, -4.0, 4.0);
    let targets = (0..n).map(|_| rng.below(v) as i32).collect();
    (logits, targets)
}

/// The classifier on `d` (bf16 logits): the losses and the logits' gradient as f32.
fn classify<D: Device>(d: &D, logits: &[f32], targets: &[i32], v: usize) -> Result<Vec<f32>> {
    let n = targets.len();
    let l32 = d.upload_new(logits)?;
    let mut l = d.alloc(DType::BF16, n * v)?;
    d.cast(&l32, &mut l, 1.0)?;
    let t = d.upload_new(targets)?;
    let mut losses = d.alloc(DType::F32, n)?;
    let mut dl = d.alloc(DType::BF16, n * v)?;
    d.exec(CrossEntropyPadded {
        logits: &l,
        targets: &t,
        losses: &mut losses,
        dlogits: Some(&mut dl),
        n,
        v,
        ld: v,
        grad_scale: 1.0 / n as f32,
    })?;
    let mut out = d.download_f32(&losses)?;
    out.extend(d.download_f32(&dl)?);
    Ok(out)
}

/// Vocabularies whose bf16 rows take from 4 KB to the whole of a block's shared memory in the
/// classifier's f32 row cache (GPT-2's 50257 takes 201 KB), and one past it.
const VOCABS: [usize; 5] = [1000, 5000, 20000, 50257, 60000];

/// Threads sharing one device run the classifier on vocabularies whose rows take different
/// amounts of dynamic shared memory (on CUDA the function's shared-memory allowance is state
/// every thread shares). Every result must be the bits the classifier computes alone.
pub fn cross_entropy_from_many_threads<D: Device>(
    open: impl Fn() -> std::result::Result<D, String>,
) {
    let test = "cross_entropy_from_many_threads";
    let Some(dev) = opened(test, &open) else {
        return;
    };
    let dev = Arc::new(dev);
    const N: usize = 8;
    const THREADS: usize = 8;
    const ROUNDS: usize = 60;
    // What each vocabulary computes alone, before any thread starts.
    let expected: Vec<(Vec<f32>, Vec<i32>, Vec<f32>)> = VOCABS
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (l, t) = problem(N, v, i as u64 + 1);
            let want = classify(&*dev, &l, &t, v).expect("the classifier alone");
            (l, t, want)
        })
        .collect();
    let expected = Arc::new(expected);
    let failures: Failures = Arc::default();
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|th| {
            let (dev, expected, failures, start) = (
                dev.clone(),
                expected.clone(),
                failures.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                for r in 0..ROUNDS {
                    let i = (th + r) % VOCABS.len();
                    let (l, t, want) = &expected[i];
                    match classify(&*dev, l, t, VOCABS[i]) {
                        Ok(got) if got == *want => {}
                        Ok(_) => note(&failures, "different bits", format!("v {}", VOCABS[i])),
                        Err(e) => note(&failures, "cross_entropy_padded", e),
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a thread panicked");
    }
    report(test, &failures, THREADS * ROUNDS);
}

/// A small step to record: `y = x·w` (bf16 GEMM), `y *= 0.5`, `z = y + y`.
struct Step<B> {
    x: B,
    w: B,
    y: B,
    z: B,
}

const M: usize = 64;

impl<B: Buffer> Step<B> {
    fn new<D: Device<Buffer = B>>(d: &D, seed: u64) -> Result<Self> {
        let (a, _) = problem(M, M, seed);
        let (b, _) = problem(M, M, seed + 100);
        let (xa, wa) = (d.upload_new(&a)?, d.upload_new(&b)?);
        let mut x = d.alloc(DType::BF16, M * M)?;
        let mut w = d.alloc(DType::BF16, M * M)?;
        d.cast(&xa, &mut x, 1.0)?;
        d.cast(&wa, &mut w, 1.0)?;
        Ok(Self {
            x,
            w,
            y: d.alloc(DType::BF16, M * M)?,
            z: d.alloc(DType::BF16, M * M)?,
        })
    }

    fn queue<D: Device<Buffer = B>>(&mut self, d: &D) -> Result<()> {
        let desc = GemmDesc::new(false, false, M, M, M);
        d.exec(Gemm {
            desc: &desc,
            a: &self.x,
            b: &self.w,
            c: &mut self.y,
        })?;
        d.exec(Scale {
            x: &mut self.y,
            alpha: 0.5,
        })?;
        d.exec(Add {
            a: &self.y,
            b: &self.y,
            out: &mut self.z,
        })
    }
}

/// One thread records and replays graphs on a device of its own while others open devices
/// (module loads), look up kernels for the first time, allocate, launch and synchronise on the
/// same GPU. Skipped (with its reason) where the backend cannot record graphs.
pub fn recording_while_other_threads_open_load_and_launch<D: Device>(
    open: impl Fn() -> std::result::Result<D, String> + Send + Sync + 'static,
) {
    let test = "recording_while_other_threads_open_load_and_launch";
    let Some(shared) = opened(test, &open) else {
        return;
    };
    if !shared.capabilities().graphs {
        skip(test, "the backend does not record graphs");
        return;
    }
    let open = Arc::new(open);
    let shared = Arc::new(shared);
    const OTHERS: usize = 4;
    const ROUNDS: usize = 12;
    let failures: Failures = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(OTHERS + 1));
    let others: Vec<_> = (0..OTHERS)
        .map(|th| {
            let (open, shared, failures, done, ops, start) = (
                open.clone(),
                shared.clone(),
                failures.clone(),
                done.clone(),
                ops.clone(),
                start.clone(),
            );
            std::thread::spawn(move || {
                start.wait();
                let mut r = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // A device of its own: the modules load and every kernel below is looked
                    // up for the first time on it.
                    if th % 2 == 0 {
                        match open() {
                            Ok(own) => {
                                let v = VOCABS[(th + r) % VOCABS.len()];
                                let (l, t) = problem(4, v, r as u64);
                                if let Err(e) = classify(&own, &l, &t, v) {
                                    note(&failures, "another thread's new device", e);
                                }
                                if let Err(e) = own.synchronize() {
                                    note(&failures, "another thread's synchronize", e);
                                }
                            }
                            Err(e) => note(&failures, "opening a device", e),
                        }
                    } else {
                        // The shared device: allocations, launches, synchronisations.
                        let v = VOCABS[(th + r) % VOCABS.len()];
                        let (l, t) = problem(4, v, r as u64);
                        if let Err(e) = classify(&*shared, &l, &t, v) {
                            note(&failures, "the shared device", e);
                        }
                    }
                    r += 1;
                }
            })
        })
        .collect();
    let recorder = open().expect("a second device on the same GPU");
    start.wait();
    let mut direct = Step::new(&recorder, 1).expect("buffers");
    let mut recorded = Step::new(&recorder, 1).expect("buffers");
    direct.queue(&recorder).expect("the step, not recorded");
    let want = recorder.download_f32(&direct.z).expect("download");
    for _ in 0..ROUNDS {
        ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = recorder.capture_begin() {
            note(&failures, "capture_begin", e);
            continue;
        }
        let queued = recorded.queue(&recorder);
        let graph = recorder.capture_end();
        if let Err(e) = queued {
            note(&failures, "an op while recording", e);
        }
        match graph {
            Ok(g) => {
                for _ in 0..3 {
                    if let Err(e) = recorder.replay(&g) {
                        note(&failures, "replay", e);
                    }
                }
                match recorder.download_f32(&recorded.z) {
                    Ok(got) if got == want => {}
                    Ok(_) => note(&failures, "replayed graph", "different bits"),
                    Err(e) => note(&failures, "download after replay", e),
                }
            }
            Err(e) => note(&failures, "capture_end", e),
        }
        // Let the others open, load and launch between recordings too.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in others {
        h.join().expect("a thread panicked");
    }
    report(
        test,
        &failures,
        ops.load(std::sync::atomic::Ordering::Relaxed),
    );
}
