#![no_main]
//! libFuzzer target: duet's config parser and its invariants (duet_fuzz::Target::Config).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    duet_fuzz::Target::Config.run(data);
});
