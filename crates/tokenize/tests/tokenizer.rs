//! Byte tokens, BPE training and the shard writer.

use duet_tokenize::shard::{TokenWidth, parse_shard, shard_bytes, write_shard};
use duet_tokenize::{Tokenizer, train_bpe};

const SAMPLES: &[&str] = &[
    "Hello world",
    "héllo wörld — naïve café 🙂 日本語",
    "  spaces\n\n\ttabs \r\n",
    "",
];

#[test]
fn byte_tokens_are_the_utf8_bytes() {
    let tk = Tokenizer::bytes();
    assert!(tk.is_bytes());
    assert_eq!(tk.vocab_size(), 256);
    assert_eq!(tk.eot(), None);
    for s in SAMPLES {
        let ids = tk.encode(s).unwrap();
        let bytes: Vec<u32> = s.bytes().map(u32::from).collect();
        assert_eq!(ids, bytes);
        assert_eq!(tk.decode(&ids).unwrap(), *s);
    }
    assert!(tk.decode(&[256]).is_err());
    // Invalid UTF-8 decodes with a replacement character, as the engine always printed it.
    assert_eq!(tk.decode(&[0xff, b'a' as u32]).unwrap(), "\u{fffd}a");
}

/// The byte tokenizer's tokenizer.json, run by the tokenizers crate (not the fast path), gives
/// the same ids: the saved file means byte tokens to any reader.
#[test]
fn the_byte_tokenizers_json_encodes_bytes() {
    let tk = Tokenizer::bytes();
    let hf: tokenizers::Tokenizer = tk.to_json().parse().unwrap();
    for s in SAMPLES {
        let ids = hf.encode(*s, false).unwrap().get_ids().to_vec();
        assert_eq!(ids, tk.encode(s).unwrap(), "{s:?}");
        assert_eq!(hf.decode(&ids, false).unwrap(), *s);
    }
    let back = Tokenizer::from_json(tk.to_json()).unwrap();
    assert!(back.is_bytes());
    assert_eq!(back.hash(), tk.hash());
    assert!(
        Tokenizer::from_path(std::path::Path::new("bytes"))
            .unwrap()
            .is_bytes()
    );
}

fn corpus() -> Vec<String> {
    // The workspace README and user guide: tens of KB of English, committed.
    concat!(
        include_str!("../../../README.md"),
        "\n\n",
        include_str!("../../../docs/user-guide.md")
    )
    .split("\n\n")
    .map(str::to_string)
    .collect()
}

#[test]
fn bpe_training_stays_within_the_vocabulary_and_round_trips() {
    let docs = corpus();
    let tk = train_bpe(docs.iter(), 600).unwrap();
    assert!(tk.vocab_size() <= 600, "{}", tk.vocab_size());
    // Merges were learnt: well beyond the 257 bytes + <|endoftext|>, and text compresses.
    assert!(tk.vocab_size() > 500, "{}", tk.vocab_size());
    assert_eq!(tk.eot(), Some(0));
    let text = docs.join("\n\n");
    let ids = tk.encode(&text).unwrap();
    assert!(
        ids.len() * 2 < text.len(),
        "{} tokens for {} bytes",
        ids.len(),
        text.len()
    );
    assert_eq!(tk.decode(&ids).unwrap(), text);
    for s in SAMPLES {
        assert_eq!(tk.decode(&tk.encode(s).unwrap()).unwrap(), *s);
    }
    // The same corpus trains the same tokenizer.
    assert_eq!(train_bpe(docs.iter(), 600).unwrap().hash(), tk.hash());
    assert!(train_bpe(docs.iter(), 100).is_err());
}

#[test]
fn uint16_shards_have_llmcs_layout_and_the_engine_reads_them() {
    let tokens: Vec<u32> = vec![50256, 0, 1, 65535, 15496, 995];
    let bytes = shard_bytes(&tokens, TokenWidth::U16).unwrap();
    assert_eq!(bytes.len(), 1024 + 2 * tokens.len());
    let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!(
        (word(0), word(1), word(2)),
        (20240520, 1, tokens.len() as i32)
    );
    assert!((3..256).all(|i| word(i) == 0));
    assert_eq!(&bytes[1024..1028], &[0x50, 0xc4, 0, 0]); // 50256 = 0xc450 LE, then 0
    let path = std::path::Path::new("shard.bin");
    assert_eq!(
        duet_engine::dataset::parse_llmc_shard(path, &bytes).unwrap(),
        tokens
    );
    assert_eq!(
        parse_shard(&bytes).unwrap(),
        (TokenWidth::U16, tokens.clone())
    );
    assert!(shard_bytes(&[65536], TokenWidth::U16).is_err());
}

#[test]
fn uint32_shards_have_llmcs_layout() {
    let tokens: Vec<u32> = vec![128000, 0, 65536, u32::MAX, 7];
    let bytes = shard_bytes(&tokens, TokenWidth::U32).unwrap();
    assert_eq!(bytes.len(), 1024 + 4 * tokens.len());
    let word = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!(
        (word(0), word(1), word(2)),
        (20240801, 7, tokens.len() as i32)
    );
    assert!((3..256).all(|i| word(i) == 0));
    assert_eq!(&bytes[1024..1028], &128000u32.to_le_bytes());
    assert_eq!(
        parse_shard(&bytes).unwrap(),
        (TokenWidth::U32, tokens.clone())
    );
    let dir = std::env::temp_dir().join(format!("duet-tok-shard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x_train_000001.bin");
    write_shard(&path, &tokens, TokenWidth::U32).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(TokenWidth::for_vocab(65536), TokenWidth::U16);
    assert_eq!(TokenWidth::for_vocab(65537), TokenWidth::U32);
    assert_eq!(TokenWidth::for_vocab(50257), TokenWidth::U16);
}
