//! Panics inside the tokenizers crate, turned into errors. A `tokenizer.json` is input like any
//! other file, but parts of it are trusted by the crate: a bad `Precompiled` normalizer's
//! character map indexes out of bounds when the first text is normalized (exit 101, "index out
//! of bounds" from spm_precompiled). [`catch`] runs such a call, returns the panic's message as
//! an error, and keeps the panic hook quiet for it (the caller's error names the file instead).

use std::cell::Cell;
use std::panic::AssertUnwindSafe;

thread_local! {
    /// Set while [`catch`] runs a call on this thread: its panics are reported as errors.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once, a panic hook that passes every panic to the previous hook except those of a
/// thread inside [`catch`].
fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info)
            }
        }));
    });
}

/// Runs `f`; a panic becomes `Err(message)`.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}
