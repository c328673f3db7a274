//! Chat and instruction data for supervised fine-tuning: a model's chat template (the Jinja text
//! of `tokenizer_config.json`'s `chat_template`, rendered with minijinja as Hugging Face's
//! `apply_chat_template` renders it with Jinja2), and examples as token ids with the tokens that
//! are targets marked: only what the assistant says (a conversation) or the completion (a
//! prompt–completion pair) is learned.
//!
//! Which tokens are the assistant's is found by rendering: for each assistant message, the
//! conversation before it with the generation prompt, and the conversation through it; the text
//! the second adds to the first is the assistant's turn (its content, its end-of-turn token and
//! whatever the template writes after it). A template whose rendering of a shorter conversation is
//! not a prefix of a longer one's cannot be split this way: a clear error. The whole rendering is
//! encoded once, and a token is a target when its first byte lies in an assistant turn, so the
//! tokens are the ones the whole text has (no boundary effects of encoding pieces apart).

use crate::{Error, Result, Tokenizer};
use duet_engine::dataset::{io_message, read_regular};
use serde::Deserialize;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The file a model's chat template comes from.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

/// One line of an SFT JSONL file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// `{"prompt": …, "completion": …}`: the completion is learned.
    PromptCompletion { prompt: String, completion: String },
    /// `{"messages": [{"role": …, "content": …}, …]}`: the assistant's turns are learned.
    Messages(Vec<Message>),
}

impl Record {
    /// Parses one JSONL line; `what` names it in errors (`FILE:LINE`).
    pub fn parse(line: &str, what: &str) -> Result<Record> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Pc {
            prompt: String,
            completion: String,
        }
        #[derive(Deserialize)]
        struct Msgs {
            messages: Vec<Message>,
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::Tokenizer(format!("{what}: not a JSON object: {e}")))?;
        let bad = |m: String| Error::Tokenizer(format!("{what}: {m}"));
        let obj = v
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        if obj.contains_key("messages") {
            let m: Msgs = serde_json::from_value(v).map_err(|e| {
                bad(format!(
                    "`messages` must be a list of {{role, content}}: {e}"
                ))
            })?;
            if !m.messages.iter().any(|m| m.role == "assistant") {
                return Err(bad(
                    "the conversation has no assistant message: nothing to learn".into(),
                ));
            }
            return Ok(Record::Messages(m.messages));
        }
        if obj.contains_key("prompt") || obj.contains_key("completion") {
            let pc: Pc = serde_json::from_value(v).map_err(|e| {
                bad(format!(
                    "a prompt–completion record has exactly `prompt` and `completion` (strings): {e}"
                ))
            })?;
            return Ok(Record::PromptCompletion {
                prompt: pc.prompt,
                completion: pc.completion,
            });
        }
        Err(bad(
            "neither {\"prompt\", \"completion\"} nor {\"messages\": [...]}".into(),
        ))
    }
}

/// A training example: token ids, and for each whether it is a target (learned).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub ids: Vec<u32>,
    pub target: Vec<bool>,
}

impl Example {
    /// Tokens that are targets.
    pub fn targets(&self) -> usize {
        self.target.iter().filter(|&&t| t).count()
    }
}

/// A model's chat template with the special tokens it refers to.
#[derive(Debug)]
pub struct ChatTemplate {
    source: String,
    bos: String,
    eos: String,
    /// What errors name.
    origin: String,
}

/// A special token in tokenizer_config.json: a string or `{"content": …}`.
fn token_text(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// A template from its Jinja text, with the `bos_token` and `eos_token` it may use.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<ChatTemplate> {
        let t = ChatTemplate {
            source: source.to_string(),
            bos: bos.to_string(),
            eos: eos.to_string(),
            origin: "chat template".into(),
        };
        // Compiled once here, so a syntax error names the template before any data is read.
        t.env()?;
        Ok(t)
    }

    /// The template of `path`: a `tokenizer_config.json`, or a folder holding one.
    pub fn load(path: &Path) -> Result<ChatTemplate> {
        let file: PathBuf = if path.is_dir() {
            path.join(TOKENIZER_CONFIG_FILE)
        } else {
            path.to_path_buf()
        };
        let load = |msg: String| Error::Load {
            path: file.display().to_string(),
            msg,
        };
        let bytes = read_regular(&file).map_err(|e| load(io_message(&e)))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| load(format!("not JSON: {e}")))?;
        let source = match v.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            // A list of named templates: the one named "default".
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .ok_or_else(|| load("`chat_template` is a list without a \"default\" one".into()))?
                .to_string(),
            _ => {
                return Err(load(
                    "no `chat_template`: the model has no chat format (use prompt–completion \
                     records, or a tokenizer_config.json with a template)"
                        .into(),
                ));
            }
        };
        let mut t = ChatTemplate::new(
            &source,
            &token_text(v.get("bos_token")),
            &token_text(v.get("eos_token")),
        )
        .map_err(|e| load(e.to_string()))?;
        t.origin = format!("the chat template of {}", file.display());
        Ok(t)
    }

    /// minijinja set up as transformers sets up Jinja2 for chat templates: blocks trimmed and
    /// left-stripped, `raise_exception`, Python's string methods (`.strip()`, `.startswith()`).
    fn env(&self) -> Result<minijinja::Environment<'_>> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_template("chat", &self.source)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", self.origin)))?;
        Ok(env)
    }

    /// The text of `messages`, with the assistant's generation prompt after them when
    /// `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let env = self.env()?;
        let tpl = env.get_template("chat").expect("added in env()");
        tpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
        })
        .map_err(|e| {
            let mut m = format!("{}: {e}", self.origin);
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                m.push_str(&format!(": {s}"));
                src = s.source();
            }
            Error::Tokenizer(m)
        })
    }

    /// The rendered conversation and the byte ranges of its assistant turns.
    pub fn render_marked(&self, messages: &[Message]) -> Result<(String, Vec<Range<usize>>)> {
        let full = self.render(messages, false)?;
        let mut turns = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if m.role != "assistant" {
                continue;
            }
            let before = self.render(&messages[..i], true)?;
            let through = self.render(&messages[..=i], false)?;
            let prefix_of = |a: &str, b: &str| b.starts_with(a);
            if !prefix_of(&before, &through) || !prefix_of(&through, &full) {
                return Err(Error::Tokenizer(format!(
                    "{}: the rendering of the conversation up to message {} is not a prefix of \
                     the longer one's, so its assistant turns cannot be told apart",
                    self.origin,
                    i + 1
                )));
            }
            if through.len() > before.len() {
                turns.push(before.len()..through.len());
            }
        }
        Ok((full, turns))
    }
}

/// The example of `record`: a conversation through `template` (required for one), a
/// prompt–completion pair as the prompt's tokens then the completion's and the end-of-text token
/// (the template is not used for it, as TRL's prompt–completion format).
pub fn encode_record(
    tok: &Tokenizer,
    template: Option<&ChatTemplate>,
    record: &Record,
) -> Result<Example> {
    match record {
        Record::PromptCompletion { prompt, completion } => {
            let p = tok.encode(prompt)?;
            let mut c = tok.encode(completion)?;
            c.extend(tok.eot());
            let target = std::iter::repeat_n(false, p.len())
                .chain(std::iter::repeat_n(true, c.len()))
                .collect();
            let mut ids = p;
            ids.extend(c);
            Ok(Example { ids, target })
        }
        Record::Messages(messages) => {
            let t = template.ok_or_else(|| {
                Error::Tokenizer(
                    "a conversation needs a chat template (tokenizer_config.json's \
                     `chat_template` beside the tokenizer)"
                        .into(),
                )
            })?;
            let (text, turns) = t.render_marked(messages)?;
            let tokens = tok.encode_with_offsets(&text)?;
            let target = tokens
                .iter()
                .map(|&(_, start)| turns.iter().any(|r| r.contains(&start)))
                .collect();
            Ok(Example {
                ids: tokens.into_iter().map(|(id, _)| id).collect(),
                target,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2's and Qwen's ChatML template (without Qwen's default system prompt).
    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn msgs(v: &[(&str, &str)]) -> Vec<Message> {
        v.iter()
            .map(|(r, c)| Message {
                role: r.to_string(),
                content: c.to_string(),
            })
            .collect()
    }

    #[test]
    fn assistant_turns_are_the_marked_bytes() {
        let t = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let m = msgs(&[
            ("user", "Hi"),
            ("assistant", "Hello!"),
            ("user", "2+2?"),
            ("assistant", "4"),
        ]);
        let (text, turns) = t.render_marked(&m).unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n\
             <|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        );
        let marked: Vec<&str> = turns.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(marked, ["Hello!<|im_end|>\n", "4<|im_end|>\n"]);
    }

    #[test]
    fn byte_tokens_mark_exactly_the_assistant_bytes() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let m = msgs(&[("system", "Be brief."), ("user", "Hi"), ("assistant", "Yo")]);
        let ex = encode_record(&Tokenizer::bytes(), Some(&t), &Record::Messages(m)).unwrap();
        let learned: Vec<u8> = ex
            .ids
            .iter()
            .zip(&ex.target)
            .filter(|(_, t)| **t)
            .map(|(&i, _)| i as u8)
            .collect();
        assert_eq!(String::from_utf8(learned).unwrap(), "Yo<|im_end|>\n");
        assert_eq!(ex.ids.len(), ex.target.len());
    }

    #[test]
    fn prompt_completion_learns_the_completion_only() {
        let r = Record::parse(r#"{"prompt": "Q: ", "completion": "A"}"#, "x:1").unwrap();
        let ex = encode_record(&Tokenizer::bytes(), None, &r).unwrap();
        assert_eq!(ex.ids, b"Q: A".map(u32::from).to_vec());
        assert_eq!(ex.target, [false, false, false, true]);
    }

    #[test]
    fn bad_records_and_templates_are_clear_errors() {
        for (line, needle) in [
            ("[1]", "not a JSON object"),
            ("{\"text\": \"x\"}", "neither"),
            ("{\"prompt\": \"x\"}", "exactly `prompt` and `completion`"),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                "no assistant",
            ),
            ("{\"messages\": [{\"role\": \"user\"}]}", "role, content"),
        ] {
            let e = Record::parse(line, "f.jsonl:3").unwrap_err().to_string();
            assert!(e.contains("f.jsonl:3") && e.contains(needle), "{line}: {e}");
        }
        let e = ChatTemplate::new("{% for %}", "", "")
            .unwrap_err()
            .to_string();
        assert!(e.contains("chat template"), "{e}");
        let raising = "{{ raise_exception('only user/assistant roles') }}";
        let t = ChatTemplate::new(raising, "", "").unwrap();
        let e = t
            .render(&msgs(&[("user", "x")]), false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("only user/assistant roles"), "{e}");
        // A template that writes something only at the end (not prefix-stable).
        let unstable = "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages|length }}";
        let t = ChatTemplate::new(unstable, "", "").unwrap();
        let e = t
            .render_marked(&msgs(&[("user", "a"), ("assistant", "b")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a prefix"), "{e}");
    }
}
