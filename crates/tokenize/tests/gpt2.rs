//! GPT-2's tokenizer from its own files (OpenAI's `encoder.json` and `vocab.bpe`, committed
//! gzip-compressed) against reference ids from tiktoken's `gpt2` encoding
//! (`tests/gpt2_reference.py` printed them).

use duet_tokenize::Tokenizer;
use std::io::Read;
use std::path::Path;

fn gunzip(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpt2")
        .join(name);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("fixture"))
        .read_to_string(&mut s)
        .expect("gzip");
    s
}

fn gpt2() -> Tokenizer {
    Tokenizer::from_vocab_merges_str(&gunzip("encoder.json.gz"), &gunzip("vocab.bpe.gz"))
        .expect("GPT-2's tokenizer")
}

/// tiktoken 0.14.0, `gpt2` encoding, `encode_ordinary`.
const REFERENCE: &[(&str, &[u32])] = &[
    ("Hello world", &[15496, 995]),
    (
        " The quick brown fox jumps over the lazy dog.",
        &[383, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13],
    ),
    (
        "It's 2024: numbers 12345 and 3.14159, they're here!",
        &[
            1026, 338, 48609, 25, 3146, 17031, 2231, 290, 513, 13, 1415, 19707, 11, 484, 821, 994,
            0,
        ],
    ),
    (
        "  leading spaces\n\n\ttabs  and trailing   ",
        &[
            220, 3756, 9029, 628, 197, 8658, 82, 220, 290, 25462, 220, 220, 220,
        ],
    ),
    (
        "héllo wörld — naïve café 🙂",
        &[71, 2634, 18798, 266, 30570, 335, 851, 41492, 40304, 32485],
    ),
    (
        "日本語のテキスト",
        &[33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302],
    ),
    (
        "line1\r\nline2\n\n\nend",
        &[1370, 16, 201, 198, 1370, 17, 628, 198, 437],
    ),
    (
        "a <|endoftext|> b",
        &[64, 1279, 91, 437, 1659, 5239, 91, 29, 275],
    ),
];

#[test]
fn gpt2_encodes_as_tiktoken_and_round_trips() {
    let tk = gpt2();
    assert_eq!(tk.vocab_size(), 50257);
    assert_eq!(tk.eot(), Some(50256));
    for (text, ids) in REFERENCE {
        assert_eq!(tk.encode(text).unwrap(), *ids, "{text:?}");
        assert_eq!(tk.decode(ids).unwrap(), *text, "{text:?}");
    }
    assert_eq!(tk.decode(&[50256]).unwrap(), "<|endoftext|>");
    assert!(tk.decode(&[50257]).is_err());
}

/// The saved tokenizer.json loads to the same tokenizer (ids and hash); the hash does not depend
/// on how the file is laid out, and differs from another tokenizer's.
#[test]
fn gpt2_saved_as_tokenizer_json_is_the_same_tokenizer() {
    let tk = gpt2();
    let dir = std::env::temp_dir().join(format!("duet-tok-gpt2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    tk.save(&path).unwrap();
    let back = Tokenizer::from_path(&path).unwrap();
    assert_eq!(back.hash(), tk.hash());
    assert_eq!(back.hash().len(), 64);
    let pretty: serde_json::Value = serde_json::from_str(tk.to_json()).unwrap();
    let pretty = serde_json::to_string_pretty(&pretty).unwrap();
    assert_eq!(Tokenizer::from_json(&pretty).unwrap().hash(), tk.hash());
    // A folder with GPT-2's files loads too.
    std::fs::write(dir.join("encoder.json"), gunzip("encoder.json.gz")).unwrap();
    std::fs::write(dir.join("vocab.bpe"), gunzip("vocab.bpe.gz")).unwrap();
    std::fs::remove_file(&path).unwrap();
    let folder = Tokenizer::from_path(&dir).unwrap();
    assert_eq!(folder.hash(), tk.hash());
    for (text, ids) in REFERENCE {
        assert_eq!(back.encode(text).unwrap(), *ids);
        assert_eq!(folder.encode(text).unwrap(), *ids);
    }
    assert_ne!(Tokenizer::bytes().hash(), tk.hash());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A conversation through a template with GPT-2's BPE: the tokens marked as targets decode to
/// the assistant turns, and the ids are those of the whole rendering (encoded once, so a token
/// spanning a turn's boundary is not split).
#[test]
fn chat_examples_mark_the_assistant_tokens() {
    use duet_tokenize::chat::{ChatTemplate, Record, encode_record};
    let tok = gpt2();
    let tpl = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\
               {% if add_generation_prompt %}assistant:{% endif %}";
    let t = ChatTemplate::new(tpl, "", "").unwrap();
    let line = r#"{"messages": [{"role": "user", "content": "Name a colour."},
                  {"role": "assistant", "content": "Blue, like the sea."}]}"#;
    let ex = encode_record(&tok, Some(&t), &Record::parse(line, "x:1").unwrap()).unwrap();
    let (text, _) = t
        .render_marked(match &Record::parse(line, "x:1").unwrap() {
            Record::Messages(m) => m,
            _ => unreachable!(),
        })
        .unwrap();
    assert_eq!(ex.ids, tok.encode(&text).unwrap());
    let learned: Vec<u32> = ex
        .ids
        .iter()
        .zip(&ex.target)
        .filter(|(_, t)| **t)
        .map(|(&i, _)| i)
        .collect();
    assert_eq!(tok.decode(&learned).unwrap(), " Blue, like the sea.\n");
}
