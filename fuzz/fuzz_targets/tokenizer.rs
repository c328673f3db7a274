#![no_main]
//! libFuzzer target: duet's tokenizer.json reader and its invariants (duet_fuzz::Target::Tokenizer).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    duet_fuzz::Target::Tokenizer.run(data);
});
