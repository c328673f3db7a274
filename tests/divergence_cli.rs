//! Issue 51 item 16: a run whose gradient norm is not finite at every step (gradient clipping
//! turns each such gradient into an empty update, so the loss stays finite and huge) used to
//! train to the end and exit 0. It is divergence: the run stops, saves and fails, saying why.

mod common;
use common::*;
use safetensors::SafeTensors;
use safetensors::tensor::TensorView;

/// A checkpoint whose token table (tied to the classifier) is scaled by 1e20: the logits and
/// the loss are finite (about 1e15), every gradient's square overflows the norm to inf.
fn huge_logits_checkpoint(dir: &std::path::Path) -> std::path::PathBuf {
    let a = dir.join("a");
    assert_success(&duet(&[
        "train",
        "--steps",
        "1",
        "--eval-sequences",
        "0",
        "--out",
        a.to_str().unwrap(),
    ]));
    let bytes = std::fs::read(a.join("checkpoint.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>, Vec<usize>, safetensors::Dtype)> = Vec::new();
    for (name, t) in st.tensors() {
        let mut data = t.data().to_vec();
        if name == "transformer.wte.weight" || name == "lm_head.weight" {
            for c in data.chunks_mut(4) {
                let v = f32::from_le_bytes(c.try_into().unwrap()) * 1e20;
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        tensors.push((name, data, t.shape().to_vec(), t.dtype()));
    }
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, t)| (n.clone(), TensorView::new(*t, s.clone(), d).unwrap()))
        .collect();
    let out = dir.join("huge.safetensors");
    std::fs::write(
        &out,
        safetensors::serialize(views, meta.metadata().clone()).unwrap(),
    )
    .unwrap();
    out
}

#[test]
fn a_run_whose_gradient_norm_stays_infinite_stops_saves_and_fails() {
    let dir = tmp("divergence");
    let init = huge_logits_checkpoint(&dir);
    let out = dir.join("run");
    let r = duet(&[
        "train",
        "--init-from",
        init.to_str().unwrap(),
        "--steps",
        "30",
        "--eval-sequences",
        "0",
        "--val-every",
        "0",
        "--log-every",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&r.stderr);
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        stderr.contains("grad norm inf") || stdout.contains("grad norm inf"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(r.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "training diverged: the gradient norm was not finite for 5 consecutive steps (1–5"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("checkpoint at step 5 saved to"), "{stderr}");
    assert!(out.join("checkpoint.safetensors").exists());
}
