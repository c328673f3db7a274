#![no_main]
//! libFuzzer target: duet's shard parser and its invariants (duet_fuzz::Target::Shard).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    duet_fuzz::Target::Shard.run(data);
});
