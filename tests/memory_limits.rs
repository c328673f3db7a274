//! A run too large for its address-space limit (`ulimit -v`) or its cgroup's memory limit stops
//! before allocating, with the sizes and the limit named (it used to abort with SIGABRT on the
//! initial weights, or be killed by the OOM killer).

use std::path::PathBuf;
use std::process::{Command, Output};

/// `duet train` of a tiny model whose vocabulary makes it ~2 GiB on the CPU backend.
const BIG: &str = "train --preset tiny --vocab 2000000 --steps 1 --log-every 0";

fn sh(script: &str) -> Output {
    Command::new("sh")
        .args(["-c", script])
        .env_remove("DUET_BACKEND")
        .output()
        .expect("runs sh")
}

fn assert_refused_naming(out: &Output, bound: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("memory allocation of"), "{err}");
    assert!(err.contains("needs about"), "{err}");
    assert!(err.contains(bound), "{err}");
}

#[test]
fn an_address_space_limit_is_honoured_before_anything_is_allocated() {
    let duet = env!("CARGO_BIN_EXE_duet");
    // 1 GiB of address space: the binary runs, the model's 2 GiB would not fit.
    let out = sh(&format!("ulimit -v 1048576 && exec {duet} {BIG}"));
    assert_refused_naming(&out, "ulimit -v");
    // A small run fits under the same limit.
    let out = sh(&format!(
        "ulimit -v 1048576 && exec {duet} train --preset tiny --steps 2 --log-every 0"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child of this process's memory cgroup (v1 or v2) with `limit` bytes; removed when dropped.
struct Cgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl Cgroup {
    fn create(limit: u64) -> Result<Self, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let name = format!("duet-test-{}", std::process::id());
        for line in own.lines() {
            let mut p = line.splitn(3, ':');
            let (id, ctl, path) = (p.next(), p.next(), p.next());
            let (base, file) = match (id, ctl) {
                (Some("0"), Some("")) => ("/sys/fs/cgroup".to_string(), "memory.max"),
                (_, Some(c)) if c.split(',').any(|c| c == "memory") => {
                    ("/sys/fs/cgroup/memory".to_string(), "memory.limit_in_bytes")
                }
                _ => continue,
            };
            let dir = PathBuf::from(base)
                .join(path.unwrap_or("/").trim_start_matches('/'))
                .join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let cg = Self {
                procs: dir.join("cgroup.procs"),
                dir: dir.clone(),
            };
            if std::fs::write(dir.join(file), limit.to_string()).is_ok() {
                return Ok(cg);
            }
        }
        Err("no writable memory cgroup (needs root and a writable cgroup filesystem)".into())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_cgroup_memory_limit_is_honoured_before_anything_is_allocated() {
    let test = "a_cgroup_memory_limit_is_honoured_before_anything_is_allocated";
    let cg = match Cgroup::create(400 << 20) {
        Ok(cg) => cg,
        Err(why) => {
            eprintln!("SKIP {test}: {why}");
            return;
        }
    };
    let duet = env!("CARGO_BIN_EXE_duet");
    let out = sh(&format!(
        "echo $$ > {} && exec {duet} {BIG}",
        cg.procs.display()
    ));
    assert_refused_naming(&out, "cgroup's memory limit");
}
