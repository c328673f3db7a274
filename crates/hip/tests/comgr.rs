//! Which comgr the kernel cache key names: only the one this process's HIP libraries use
//! (its own test process: nothing else here maps a ROCm library).

use duet_hip::toolchain::Comgr;

fn comgr_mapped() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("libamd_comgr"))
        .map(|l| l.split_whitespace().last().unwrap_or("").to_string())
        .collect()
}

/// Without a loaded hiprtc or runtime, no comgr is loaded for the cache key even when the
/// system has one (Debian's libamd-comgr2 here): opening it would map a second LLVM next to the
/// runtime's. With a runtime that links comgr (Debian 12's ROCm 5 libamdhip64, when installed),
/// the comgr reported is the one it mapped.
#[test]
fn comgr_is_the_runtime_s_own_and_never_loaded_beside_it() {
    let system = ["libamd_comgr.so.2", "libamd_comgr.so.3"]
        .iter()
        .any(|n| std::path::Path::new(&format!("/usr/lib/x86_64-linux-gnu/{n}")).exists());
    assert!(
        comgr_mapped().is_empty(),
        "a comgr is mapped before the test"
    );
    let c = Comgr::load();
    assert!(
        c.is_none(),
        "a comgr was loaded though no HIP library uses one: {c:?}"
    );
    assert!(
        comgr_mapped().is_empty(),
        "Comgr::load mapped {:?} (a system comgr: {system})",
        comgr_mapped()
    );
    let hip5 = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";
    if !std::path::Path::new(hip5).exists() {
        eprintln!(
            "SKIP comgr_is_the_runtime_s_own_and_never_loaded_beside_it (second half): {hip5} not installed"
        );
        return;
    }
    let _rt = duet_hip::loader::open_pinned(hip5).expect("open the ROCm 5 runtime");
    let mapped = comgr_mapped();
    if mapped.is_empty() {
        eprintln!(
            "SKIP comgr_is_the_runtime_s_own_and_never_loaded_beside_it (second half): {hip5} maps no comgr"
        );
        return;
    }
    let c = Comgr::load().expect("the runtime's comgr is found");
    assert!(c.version.0 >= 2, "{c:?}");
    assert!(
        mapped.contains(&c.path),
        "{c:?} is not the mapped {mapped:?}"
    );
    assert_eq!(
        comgr_mapped().len(),
        mapped.len(),
        "a second comgr was mapped"
    );
}
