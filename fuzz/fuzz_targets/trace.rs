#![no_main]
//! libFuzzer target: duet's trace parser and its invariants (duet_fuzz::Target::Trace).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    duet_fuzz::Target::Trace.run(data);
});
