//! `duet train --init-from` and `duet export` on the command line, with the Hugging Face fixture
//! of `crates/engine/tests/fixtures/hf/` (a tiny model transformers loaded and checked; see
//! `tests/reference/make_hf_fixture.py`).

mod common;

use common::{assert_success, duet, tmp};
use duet_engine::checkpoint::Checkpoint;
use duet_engine::init::{ShapeRequest, load_init_weights};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/engine/tests/fixtures/hf")
}

fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// Fails with exit code 1 and an `error:` line naming every needle.
fn assert_error(args: &[&str], needles: &[&str]) {
    let out = duet(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    for n in needles {
        assert!(line.contains(n), "'{n}' not in: {line}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A new run from the HF model: its shape, its weights (the loss starts where the trained
/// model is, far below a fresh model's ln 96 ≈ 4.56), step 0 and fresh optimizer state; it
/// resumes as any run; and `duet export` writes it back out in both formats.
#[test]
fn init_from_hugging_face_then_export() {
    let fx = fixture();
    let run = tmp("init-hf");
    let out = duet(&[
        "train",
        "--init-from",
        s(&fx),
        "--preset",
        "tiny",
        "--steps",
        "4",
        "--lr",
        "1e-12",
        "--log-every",
        "0",
        "--out",
        s(&run),
    ]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("initialising from") && stderr.contains("Hugging Face GPT-2 model"),
        "{stderr}"
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(first["step"], 1);
    let loss = first["loss"].as_f64().unwrap();
    assert!(
        loss < 2.5,
        "first loss {loss}: not the fixture's trained weights?"
    );
    let ck = Checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    let hf = load_init_weights(&fx, &ShapeRequest::default(), None).unwrap();
    assert_eq!(ck.step, 4);
    assert_eq!(ck.config.model, hf.model);
    // lr 1e-12: the weights stay the file's (to far below f32 resolution of these values).
    for (a, b) in ck.weights.iter().zip(&hf.weights) {
        let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(d < 1e-7, "{d}");
    }

    // Resuming an init-from run is a plain resume.
    assert_success(&duet(&[
        "train",
        "--resume",
        s(&run),
        "--out",
        s(&run),
        "--steps",
        "6",
        "--log-every",
        "0",
    ]));
    assert_eq!(
        Checkpoint::load(&run.join("checkpoint.safetensors"))
            .unwrap()
            .step,
        6
    );

    // Export with the run's tokenizer file; then again without --overwrite is refused.
    std::fs::write(run.join("tokenizer.json"), b"{\"version\": \"1.0\"}").unwrap();
    let hf_dir = tmp("export-hf");
    assert_success(&duet(&[
        "export",
        "--format",
        "hf",
        s(&hf_dir),
        "--checkpoint",
        s(&run),
    ]));
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(hf_dir.join(f).is_file(), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(hf_dir.join("config.json")).unwrap(),
        std::fs::read_to_string(fx.join("config.json")).unwrap()
    );
    assert_error(
        &[
            "export",
            s(&hf_dir),
            "--checkpoint",
            s(&run.join("checkpoint.safetensors")),
        ],
        &["already exists", "--overwrite"],
    );
    let back = load_init_weights(&hf_dir, &ShapeRequest::default(), None).unwrap();
    let last = Checkpoint::load(&run.join("checkpoint.safetensors")).unwrap();
    assert_eq!(back.weights, last.weights);

    // nanoGPT: the state dict and its model args; it loads back with the same weights.
    let nano = tmp("export-nano");
    assert_success(&duet(&[
        "export",
        "--format",
        "nanogpt",
        s(&nano),
        "--checkpoint",
        s(&run),
    ]));
    let n = load_init_weights(&nano, &ShapeRequest::default(), None).unwrap();
    assert_eq!(n.format, duet_engine::init::SourceFormat::NanoGpt);
    assert_eq!(n.weights, last.weights);
    let args: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(nano.join("config.json")).unwrap()).unwrap();
    assert_eq!(args["n_head"], 4);
    assert_eq!(args["block_size"], 16);
    // And a run starts from it.
    assert_success(&duet(&[
        "train",
        "--init-from",
        s(&nano.join("model.safetensors")),
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--log-every",
        "0",
    ]));
}

/// Exporting the fixture itself (an HF folder) writes its bytes again.
#[test]
fn export_of_the_fixture_is_the_fixture() {
    let dir = tmp("export-fixture");
    assert_success(&duet(&["export", s(&dir), "--checkpoint", s(&fixture())]));
    for f in ["config.json", "model.safetensors"] {
        assert!(
            std::fs::read(dir.join(f)).unwrap() == std::fs::read(fixture().join(f)).unwrap(),
            "{f} differs"
        );
    }
}

#[test]
fn init_from_errors_are_clear() {
    let fx = fixture();
    let fxs = s(&fx);
    // The default preset's seq (48) passes the file's context (16): lowered, with a note.
    let out = duet(&[
        "train",
        "--init-from",
        fxs,
        "--steps",
        "1",
        "--eval-sequences",
        "0",
        "--log-every",
        "0",
    ]);
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("seq set to 16"));
    assert_error(
        &["train", "--init-from", fxs, "--seq", "32", "--steps", "1"],
        &["--seq 32", "context of", "16 positions"],
    );
    assert_error(
        &["train", "--init-from", fxs, "--resume", fxs],
        &["--init-from", "--resume", "give one of them"],
    );
    assert_error(
        &["train", "--init-from", fxs, "--layers", "3", "--steps", "1"],
        &["--layers 3 (the file's is 2)"],
    );
    assert_error(
        &["train", "--init-from", fxs, "--heads", "8", "--steps", "1"],
        &["--heads 8", "n_head"],
    );
    let missing = tmp("no-such-model.safetensors");
    assert_error(
        &["train", "--init-from", s(&missing), "--steps", "1"],
        &["no-such-model.safetensors"],
    );
    let junk = tmp("junk.safetensors");
    std::fs::write(&junk, b"PK\x03\x04 a torch.save zip").unwrap();
    assert_error(
        &["train", "--init-from", s(&junk), "--steps", "1"],
        &["not a safetensors file", "torch.save"],
    );
    assert_error(
        &[
            "export",
            "--format",
            "onnx",
            s(&tmp("x")),
            "--checkpoint",
            fxs,
        ],
        &["unknown export format 'onnx'"],
    );
}
