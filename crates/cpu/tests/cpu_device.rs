//! What only the CPU backend reports: its memory counters (exact byte counts, the host's
//! memory from /proc/meminfo) and its info (backend name, thread count). The ops' results are
//! the conformance suite's (tests/conformance.rs).

mod common;

use common::*;
use duet_device::{DType, Runtime};

#[test]
fn memory_stats_track_allocations() {
    let d = dev();
    let base = d.memory_stats();
    assert_eq!(base.current, 0);
    // The host's available and total memory (Linux), which the memory plan is checked against.
    if cfg!(target_os = "linux") {
        let (avail, total) = base.driver.expect("/proc/meminfo");
        assert!(avail > 0 && avail <= total, "{:?}", base.driver);
    }
    let a = zeros(&d, DType::F32, 1000);
    let b = zeros(&d, DType::BF16, 500);
    assert_eq!(d.memory_stats().current, 5000);
    drop(a);
    let s = d.memory_stats();
    assert_eq!((s.current, s.peak), (1000, 5000));
    d.reset_peak_memory();
    assert_eq!(d.memory_stats().peak, 1000);
    drop(b);
    assert_eq!(d.memory_stats().current, 0);
}

#[test]
fn info_reports_cpu() {
    let d = dev();
    let info = d.info();
    assert_eq!(info.backend, "cpu");
    assert!(info.supports_bf16 && info.supports_fp8);
    assert!(!info.name.is_empty());
    assert!(info.details.iter().any(|(k, v)| k == "threads" && v == "2"));
    if std::path::Path::new("/proc/meminfo").exists() {
        assert!(info.total_memory > 0);
    }
}
