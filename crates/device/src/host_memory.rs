//! How much host memory this process may still allocate: the machine's `MemAvailable`, bounded
//! by the process's cgroup memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`, less
//! what the cgroup uses) and by its address-space limit (`RLIMIT_AS`, `ulimit -v`, less the
//! address space it holds). A run's host allocations are checked against this before they are
//! made, so that a run too large for its container or limit stops with the sizes instead of an
//! aborted allocation (SIGABRT) or the OOM killer. Device memory is the device's own check (GPU
//! runtimes reserve large virtual ranges that an address-space reading would count).

use std::path::{Path, PathBuf};

/// The host's memory as this process can use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMemory {
    /// Bytes this process may still allocate.
    pub available: u64,
    /// The machine's RAM, or the cgroup's limit when lower.
    pub total: u64,
    /// What bounds `available`: the machine's free memory, or a limit (said in words, for
    /// error messages).
    pub bound: &'static str,
}

/// Limits at or above this are "no limit" (cgroup v1 writes 2^63 − 4096 for unlimited).
const UNLIMITED: u64 = 1 << 62;

/// The host's (available, total) memory in bytes ([`host_memory_report`]); None where
/// /proc/meminfo cannot be read (not Linux).
pub fn host_memory() -> Option<(u64, u64)> {
    host_memory_report().map(|h| (h.available, h.total))
}

/// This process's host memory, limits included (see the module documentation).
pub fn host_memory_report() -> Option<HostMemory> {
    let (avail, total) = parse_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_memory(Path::new("/sys/fs/cgroup"), &c));
    let address_space = match (
        std::fs::read_to_string("/proc/self/limits"),
        std::fs::read_to_string("/proc/self/status"),
    ) {
        (Ok(l), Ok(s)) => address_space_headroom(&l, &s),
        _ => None,
    };
    Some(combine(avail, total, cgroup, address_space))
}

/// The machine's reading bounded by a cgroup's (limit, usage) and an address-space headroom.
fn combine(
    avail: u64,
    total: u64,
    cgroup: Option<(u64, u64)>,
    address_space: Option<u64>,
) -> HostMemory {
    let mut h = HostMemory {
        available: avail,
        total,
        bound: "the machine's available memory, MemAvailable",
    };
    if let Some((limit, usage)) = cgroup {
        h.total = h.total.min(limit);
        let left = limit.saturating_sub(usage);
        if left < h.available {
            h.available = left;
            h.bound = "the cgroup's memory limit, memory.max / memory.limit_in_bytes";
        }
    }
    if let Some(left) = address_space
        && left < h.available
    {
        h.available = left;
        h.bound = "the process's address-space limit, RLIMIT_AS / ulimit -v";
    }
    h
}

/// `MemAvailable` and `MemTotal` (kB in the file) in bytes.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kb: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        kb.checked_mul(1024)
    };
    Some((field("MemAvailable:")?, field("MemTotal:")?))
}

/// The tightest memory limit over this process's cgroup and its ancestors, and the cgroup's
/// usage less its inactive file cache (reclaimable, as container runtimes count it), from the
/// cgroup filesystem at `root` and the contents of /proc/self/cgroup. v2 (`0::/path`) reads
/// `memory.max`/`memory.current`/`memory.stat`; v1 (`N:memory:/path` or a combined controller
/// list) reads the `memory.*_in_bytes` files under `root/memory`. Inside a container the path
/// may not exist in its view of the filesystem: the root's own files count then. None without a
/// finite limit.
fn cgroup_memory(root: &Path, self_cgroup: &str) -> Option<(u64, u64)> {
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            let found = tightest(root, rel, "memory.max", "memory.current", "inactive_file");
            if found.is_some() {
                return found;
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let found = tightest(
                &root.join("memory"),
                rel,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            );
            if found.is_some() {
                return found;
            }
        }
    }
    None
}

/// The lowest finite `limit_file` from `base/rel` up to `base`, and the usage of the deepest
/// folder that has `usage_file`.
fn tightest(
    base: &Path,
    rel: &str,
    limit_file: &str,
    usage_file: &str,
    inactive_key: &str,
) -> Option<(u64, u64)> {
    let read = |d: &Path, f: &str| -> Option<u64> {
        let t = std::fs::read_to_string(d.join(f)).ok()?;
        t.trim().parse().ok() // "max" (v2, no limit) does not parse
    };
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut d = base.join(rel);
    while d.starts_with(base) {
        dirs.push(d.clone());
        if !d.pop() {
            break;
        }
    }
    let limit = dirs
        .iter()
        .filter_map(|d| read(d, limit_file))
        .filter(|&l| l < UNLIMITED)
        .min()?;
    let usage = dirs.iter().find_map(|d| {
        let used = read(d, usage_file)?;
        let inactive = std::fs::read_to_string(d.join("memory.stat"))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == inactive_key).then(|| v.trim().parse::<u64>().ok())?
                })
            })
            .unwrap_or(0);
        Some(used.saturating_sub(inactive))
    });
    Some((limit, usage.unwrap_or(0)))
}

/// Address space left under `RLIMIT_AS` (the soft limit of "Max address space" in
/// /proc/self/limits) less `VmSize` (/proc/self/status); None when unlimited.
fn address_space_headroom(limits: &str, status: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line["Max address space".len()..]
        .split_whitespace()
        .next()?;
    let limit: u64 = soft.parse().ok()?; // "unlimited" does not parse
    let vm_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(limit.saturating_sub(vm_kb.saturating_mul(1024)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       24678400 kB\nMemFree:         1000000 kB\nMemAvailable:   20375040 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((20375040 * 1024, 24678400 * 1024))
        );
        // A kernel without MemAvailable (before 3.14): no reading.
        assert_eq!(parse_meminfo("MemTotal: 100 kB\n"), None);
    }

    #[test]
    fn the_address_space_limit_less_what_the_process_holds() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max address space         2048000000           unlimited            bytes     \n";
        let status = "Name:\tduet\nVmPeak:\t  600000 kB\nVmSize:\t  500000 kB\n";
        assert_eq!(
            address_space_headroom(limits, status),
            Some(2048000000 - 500000 * 1024)
        );
        let none = limits.replace("2048000000", "unlimited ");
        assert_eq!(address_space_headroom(&none, status), None);
    }

    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("duet-cg-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (f, text) in files {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    #[test]
    fn cgroup_v2_takes_the_tightest_ancestor_and_the_leafs_usage() {
        let root = tree(
            "v2",
            &[
                ("memory.max", "max\n"),
                ("user.slice/memory.max", "8000000000\n"),
                ("user.slice/job/memory.max", "max\n"),
                ("user.slice/job/memory.current", "3000000000\n"),
                (
                    "user.slice/job/memory.stat",
                    "anon 100\nfile 900\ninactive_file 1000000000\n",
                ),
            ],
        );
        assert_eq!(
            cgroup_memory(&root, "0::/user.slice/job\n"),
            Some((8000000000, 2000000000))
        );
        // No finite limit anywhere: no reading.
        assert_eq!(cgroup_memory(&root, "0::/\n"), None);
        // A container's view: its path is not in its filesystem; the root's files count.
        let inner = tree(
            "v2-container",
            &[
                ("memory.max", "1073741824\n"),
                ("memory.current", "73741824\n"),
            ],
        );
        assert_eq!(
            cgroup_memory(&inner, "0::/docker/abc\n"),
            Some((1073741824, 73741824))
        );
    }

    #[test]
    fn cgroup_v1_reads_the_memory_controller() {
        let root = tree(
            "v1",
            &[
                ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory/batch/memory.limit_in_bytes", "4294967296\n"),
                ("memory/batch/memory.usage_in_bytes", "1294967296\n"),
                (
                    "memory/batch/memory.stat",
                    "cache 5\ntotal_inactive_file 294967296\n",
                ),
            ],
        );
        let cg = "9:name=systemd:/\n4:memory:/batch\n0::/\n";
        assert_eq!(cgroup_memory(&root, cg), Some((4294967296, 1000000000)));
        // Unlimited (2^63 − 4096): no reading.
        assert_eq!(cgroup_memory(&root, "4:cpu,memory:/\n"), None);
    }

    #[test]
    fn the_tightest_bound_is_named() {
        let g = 1u64 << 30;
        let h = combine(20 * g, 24 * g, None, None);
        assert_eq!((h.available, h.total), (20 * g, 24 * g));
        assert!(h.bound.contains("MemAvailable"));
        let h = combine(20 * g, 24 * g, Some((8 * g, 3 * g)), None);
        assert_eq!((h.available, h.total), (5 * g, 8 * g));
        assert!(h.bound.contains("cgroup"));
        let h = combine(20 * g, 24 * g, Some((8 * g, 3 * g)), Some(2 * g));
        assert_eq!(h.available, 2 * g);
        assert!(h.bound.contains("ulimit -v"));
    }

    #[test]
    fn this_process_has_a_reading_on_linux() {
        if cfg!(target_os = "linux") {
            let h = host_memory_report().expect("/proc/meminfo");
            assert!(h.available > 0 && h.available <= h.total.max(h.available));
        }
    }
}
