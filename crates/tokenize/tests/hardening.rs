//! A tokenizer file is input: what a crafted or careless `tokenizer.json` did before it was
//! checked (issue 51, items 1, 3, 6 and 7), and the bounds of BPE training.

use duet_tokenize::{MAX_TRAINING_WORD, Tokenizer, train_bpe};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-tokenize-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A small byte-level BPE trained here, as a `tokenizer.json` value to edit.
fn trained_json() -> serde_json::Value {
    let docs = ["the quick brown fox jumps over the lazy dog. ".repeat(40)];
    let tk = train_bpe(docs.iter(), 300).unwrap();
    serde_json::from_str(tk.to_json()).unwrap()
}

/// Removes the character `c` from a BPE's vocabulary (and the merges that use it).
fn drop_char(v: &mut serde_json::Value, c: char) {
    v["model"]["vocab"]
        .as_object_mut()
        .unwrap()
        .remove(&c.to_string());
    let merges: Vec<serde_json::Value> = v["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m.to_string().contains(c))
        .cloned()
        .collect();
    v["model"]["merges"] = merges.into();
}

fn load(v: &serde_json::Value) -> Result<Tokenizer, String> {
    Tokenizer::from_json(&v.to_string()).map_err(|e| e.to_string())
}

#[test]
fn settings_that_change_the_encoding_are_refused_for_data_naming_them() {
    let base = trained_json();
    let plain = load(&base).unwrap();
    plain.check_for_data().unwrap();
    Tokenizer::bytes().check_for_data().unwrap();
    let cases = [
        (
            "truncation",
            serde_json::json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst",
                               "stride": 0}),
            "\"truncation\" (max_length 8)",
        ),
        (
            "padding",
            serde_json::json!({"strategy": {"Fixed": 4096}, "direction": "Right",
                               "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0,
                               "pad_token": "<|endoftext|>"}),
            "\"padding\"",
        ),
    ];
    for (key, value, named) in cases {
        let mut v = base.clone();
        v[key] = value;
        let tok = load(&v).unwrap();
        // Truncation is what it did: a long text became 8 tokens.
        if key == "truncation" {
            assert_eq!(tok.encode(&"the lazy dog ".repeat(50)).unwrap().len(), 8);
        }
        let e = tok.check_for_data().unwrap_err().to_string();
        assert!(e.contains(named), "{e}");
    }
    let mut v = base.clone();
    v["model"]["dropout"] = serde_json::json!(0.5);
    let e = load(&v).unwrap().check_for_data().unwrap_err().to_string();
    assert!(e.contains("\"dropout\" (0.5)"), "{e}");
    // Dropout 0 is no dropout.
    v["model"]["dropout"] = serde_json::json!(0.0);
    load(&v).unwrap().check_for_data().unwrap();
}

#[test]
fn two_tokens_of_one_id_are_refused() {
    let mut v = trained_json();
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let (token, _) = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(120))
        .map(|(t, id)| (t.clone(), id.clone()))
        .unwrap();
    vocab.insert(token, serde_json::json!(121));
    let e = load(&v).unwrap_err();
    assert!(e.contains("share the id 121"), "{e}");

    // Two added tokens of one id.
    let mut v = trained_json();
    let added = v["added_tokens"].as_array_mut().unwrap();
    let mut other = added[0].clone();
    other["content"] = serde_json::json!("<|other|>");
    added.push(other);
    let e = load(&v).unwrap_err();
    assert!(e.contains("share the id 0"), "{e}");

    // The tokenizers crate numbers a new added token after the vocabulary's size: with a hole
    // in the vocabulary that is the id of its last token. Refused for data.
    let mut v = trained_json();
    drop_char(&mut v, 'q');
    let added = v["added_tokens"].as_array_mut().unwrap();
    let mut other = added[0].clone();
    other["content"] = serde_json::json!("<|pad|>");
    other["id"] = serde_json::json!(300);
    added.push(other);
    let e = load(&v).unwrap().check_for_data().unwrap_err().to_string();
    assert!(e.contains("the added token \"<|pad|>\" has the id"), "{e}");
}

#[test]
fn ids_spread_far_beyond_the_vocabulary_are_refused() {
    // One id of 4e9 made the tokenizers crate list four billion missing ids while serialising.
    let mut v = trained_json();
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let (token, _) = vocab
        .iter()
        .find(|(_, id)| id.as_u64() == Some(120))
        .map(|(t, id)| (t.clone(), id.clone()))
        .unwrap();
    vocab.insert(token, serde_json::json!(4_000_000_000u32));
    let start = std::time::Instant::now();
    let e = load(&v).unwrap_err();
    assert!(e.contains("has the id 4000000000"), "{e}");
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
    // A few missing ids load.
    let mut v = trained_json();
    drop_char(&mut v, 'z');
    load(&v).unwrap();
}

#[test]
fn a_panic_inside_the_tokenizers_crate_is_an_error_naming_the_file() {
    // An empty Precompiled character map: the crate indexes out of bounds on the first text.
    let mut v = trained_json();
    v["normalizer"] =
        serde_json::json!({"type": "Precompiled", "precompiled_charsmap": "AAAAAA=="});
    let path = tmp("precompiled.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let e = Tokenizer::from_path(&path).unwrap_err().to_string();
    assert!(e.contains("precompiled.json"), "{e}");
    assert!(e.contains("panicked"), "{e}");
}

#[test]
fn a_fifo_is_refused_not_waited_on() {
    let fifo = tmp("fifo.json");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("SKIP a_fifo_is_refused_not_waited_on: no mkfifo");
        return;
    }
    // A folder whose tokenizer.json is the FIFO, too.
    let dir = tmp("fifo-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let _ = std::fs::remove_file(dir.join("tokenizer.json"));
    std::fs::hard_link(&fifo, dir.join("tokenizer.json")).unwrap();
    for path in [fifo.clone(), dir] {
        let (tx, rx) = mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Tokenizer::from_path(&p).map_err(|e| e.to_string()));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{} hangs", path.display()));
        let e = r.unwrap_err();
        assert!(
            e.contains("FIFO") && e.contains("not a regular file"),
            "{e}"
        );
    }
}

#[test]
fn a_missing_file_says_so_in_words() {
    let e = Tokenizer::from_path(&tmp("nope.json"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.json: no such file or folder"), "{e}");
}

#[test]
fn the_round_trip_check_sees_dropped_characters_after_normalisation() {
    let base = trained_json();
    let text = "The quick brown fox — café, cafe\u{301}.\n\n  Tabs\tand 日本語 🙂";
    let plain = load(&base).unwrap();
    let rt = plain.round_trip(text).unwrap();
    assert_eq!(rt.difference, None);
    assert_eq!(rt.tokens, plain.encode(text).unwrap().len());
    // A normalising tokenizer (NFC, as Qwen2's) still round-trips: compared after it.
    let mut v = base.clone();
    v["normalizer"] = serde_json::json!({"type": "NFC"});
    assert_eq!(load(&v).unwrap().round_trip(text).unwrap().difference, None);
    // A post-processor that adds special tokens (encoding adds none: documents get <|endoftext|>).
    let mut v = base.clone();
    v["post_processor"] = serde_json::json!({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                              "tokens": ["<|endoftext|>"]}}});
    assert_eq!(load(&v).unwrap().round_trip(text).unwrap().difference, None);
    // A vocabulary without 'q' (and no unknown token): the character is dropped.
    let mut v = base.clone();
    drop_char(&mut v, 'q');
    let lossy = load(&v).unwrap();
    let d = lossy
        .round_trip(text)
        .unwrap()
        .difference
        .expect("a difference");
    assert!(d.contains("quick") && d.contains("uick"), "{d}");
    assert_eq!(
        Tokenizer::bytes().round_trip(text).unwrap().difference,
        None
    );
}

#[test]
fn no_pre_token_longer_than_the_cap_reaches_the_trainer() {
    // One 400 kB "word" (its merges were quadratic in its length: 59 s).
    let word: String = (0..400_000u32)
        .map(|i| (b'a' + (i * 7 % 11) as u8) as char)
        .collect();
    let text = format!(
        "short words {word} and a run of spaces{}x",
        " ".repeat(3000)
    );
    let words = duet_tokenize::training_words(&text).unwrap();
    assert!(
        words.iter().all(|w| w.chars().count() <= MAX_TRAINING_WORD),
        "a word of {} characters",
        words.iter().map(|w| w.chars().count()).max().unwrap()
    );
    // Nothing is lost: the pieces are the text's byte-level characters in order.
    let mapped: String = duet_tokenize::bytes_to_unicode().into_iter().collect();
    let joined: String = words.concat();
    assert_eq!(joined.chars().count(), text.len());
    assert!(joined.chars().all(|c| mapped.contains(c)));
}

#[test]
fn a_trained_token_is_at_most_the_cap_long() {
    // A long repetitive word merges into ever longer tokens; the cap bounds them.
    let docs = ["ab".repeat(200_000)];
    let tok = train_bpe(docs.iter(), 300).unwrap();
    let v: serde_json::Value = serde_json::from_str(tok.to_json()).unwrap();
    let longest = v["model"]["vocab"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.chars().count())
        .max()
        .unwrap();
    assert!(longest <= MAX_TRAINING_WORD, "a token of {longest} bytes");
    let ids = tok.encode(&docs[0]).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), docs[0]);
}

#[test]
fn an_impossible_vocabulary_is_an_error_not_an_abort() {
    let docs = ["some text to train on, some text to train on"];
    for v in [
        usize::MAX,
        1_000_000_000,
        duet_tokenize::MAX_TRAIN_VOCAB + 1,
    ] {
        let e = train_bpe(docs.iter(), v).unwrap_err().to_string();
        assert!(e.contains("at most 1048576"), "{e}");
    }
    assert!(train_bpe(docs.iter(), 256).is_err());
    // A vocabulary far above what the corpus can give trains (the trainer's tables are sized
    // by the corpus, not by the request).
    let tok = train_bpe(docs.iter(), duet_tokenize::MAX_TRAIN_VOCAB).unwrap();
    assert!(tok.vocab_size() < 400, "{}", tok.vocab_size());
}
