//! The loader never unloads a library it opened (issue 27: after a failed `hipInit` an unloaded
//! ROCm 6.4 runtime crashes the process at exit). Runs without an AMD GPU, with a fake library
//! built by the C compiler.

use std::path::PathBuf;
use std::process::Command;

/// Builds a shared library exporting one no-op function, under a folder unique to `tag`.
fn fake_library(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-hip-loader-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("fake.c");
    std::fs::write(&src, "int duet_fake_symbol(void) { return 7; }\n").expect("write source");
    let lib = dir.join(format!("libduetfake{tag}.so"));
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "needs a C compiler (cc) to build the fake library");
    lib
}

/// Whether `path` is mapped into this process now (Linux: /proc/self/maps).
fn mapped(path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let want = std::fs::canonicalize(path).expect("canonical path");
    maps.lines()
        .any(|l| l.split_whitespace().nth(5).map(PathBuf::from) == Some(want.clone()))
}

#[test]
fn libraries_opened_by_the_loader_are_never_unloaded() {
    // Control: a library opened and dropped without the loader is unmapped, so the check below
    // can see an unload.
    let control = fake_library("control");
    {
        // SAFETY: a test library with no initialisers; nothing is called.
        let lib = unsafe { libloading::Library::new(&control) }.expect("open control");
        assert!(mapped(&control));
        drop(lib);
    }
    assert!(
        !mapped(&control),
        "dlclose did not unmap the control library; the test cannot detect an unload here"
    );

    let pinned = fake_library("pinned");
    let name = pinned.to_string_lossy().into_owned();
    let lib = duet_hip::loader::open_pinned(&name).expect("open through the loader");
    // SAFETY: `int duet_fake_symbol(void)` from the fake library.
    let f = unsafe {
        *lib.get::<unsafe extern "C" fn() -> i32>(b"duet_fake_symbol\0")
            .expect("symbol")
    };
    drop(lib);
    assert!(mapped(&pinned), "the loader's library was unloaded");
    // SAFETY: the library is still mapped (checked above), so the function is callable.
    assert_eq!(unsafe { f() }, 7);
    assert!(duet_hip::loader::pinned_libraries().contains(&name));
    // Opening it again (another device) does not add a second pin.
    drop(duet_hip::loader::open_pinned(&name).expect("reopen"));
    let count = duet_hip::loader::pinned_libraries()
        .iter()
        .filter(|n| **n == name)
        .count();
    assert_eq!(count, 1);
    assert!(mapped(&pinned));
}
