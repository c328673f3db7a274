//! duet's chat-template rendering (minijinja) against Jinja2 as transformers sets it up for
//! `apply_chat_template`: every prefix of two conversations through four templates, with and
//! without the generation prompt (fixtures/chat_templates.json, written once by
//! fixtures/make_chat_fixture.py). Then the assistant turns of each full conversation, marked by
//! duet, are checked to be exactly the text each assistant message adds.

use duet_tokenize::Tokenizer;
use duet_tokenize::chat::{ChatTemplate, Message, Record, encode_record};

fn fixture() -> serde_json::Value {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_templates.json"
    );
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn template(f: &serde_json::Value, name: &str) -> ChatTemplate {
    let src = f["templates"][name].as_str().unwrap();
    ChatTemplate::new(src, "<|begin_of_text|>", "</s>").unwrap()
}

fn messages(v: &serde_json::Value) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn renderings_match_jinja2() {
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 50);
    for c in cases {
        let name = c["template"].as_str().unwrap();
        let with_prompt = c["add_generation_prompt"].as_bool().unwrap();
        let got = template(&f, name)
            .render(&messages(&c["messages"]), with_prompt)
            .unwrap();
        assert_eq!(
            got,
            c["text"].as_str().unwrap(),
            "{name}, generation prompt {with_prompt}"
        );
    }
}

#[test]
fn marked_turns_are_what_each_assistant_message_adds() {
    let f = fixture();
    for name in f["templates"].as_object().unwrap().keys() {
        let t = template(&f, name);
        let conv = messages(
            &f["cases"]
                .as_array()
                .unwrap()
                .iter()
                .rev()
                .find(|c| c["template"] == name.as_str())
                .unwrap()["messages"],
        );
        let (text, turns) = t.render_marked(&conv).unwrap();
        let assistants: Vec<&Message> = conv.iter().filter(|m| m.role == "assistant").collect();
        assert_eq!(turns.len(), assistants.len(), "{name}");
        for (r, m) in turns.iter().zip(&assistants) {
            assert!(
                text[r.clone()].contains(m.content.trim()),
                "{name}: turn {:?} lacks {:?}",
                &text[r.clone()],
                m.content
            );
            // No user text inside an assistant turn.
            assert!(
                !text[r.clone()].contains("2+2"),
                "{name}: {:?}",
                &text[r.clone()]
            );
        }
        // Byte tokens: the learned bytes are exactly the turns.
        let ex = encode_record(&Tokenizer::bytes(), Some(&t), &Record::Messages(conv)).unwrap();
        let learned: Vec<u8> = ex
            .ids
            .iter()
            .zip(&ex.target)
            .filter(|(_, t)| **t)
            .map(|(&b, _)| b as u8)
            .collect();
        let want: Vec<u8> = turns
            .iter()
            .flat_map(|r| text.as_bytes()[r.clone()].to_vec())
            .collect();
        assert_eq!(learned, want, "{name}");
    }
}
