#![no_main]
//! libFuzzer target: duet's checkpoint parser and its invariants (duet_fuzz::Target::Checkpoint).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    duet_fuzz::Target::Checkpoint.run(data);
});
