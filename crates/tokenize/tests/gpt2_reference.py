#!/usr/bin/env python3
"""Reference token ids for crates/tokenize/tests/gpt2.rs, from tiktoken's `gpt2` encoding.

tiktoken (pip install tiktoken; 0.14.0 was used) downloads GPT-2's files from OpenAI; this
script instead gives it the committed copies (tests/fixtures/gpt2/*.gz) and the SHA-256 that
tiktoken pins for OpenAI's files, so it also checks that the committed files are OpenAI's.
It prints one Rust `(text, &[ids])` line per string; paste them into gpt2.rs.
"""
import gzip, os, tempfile, json
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpt2")
tmp = tempfile.mkdtemp()
paths = {}
for name in ("encoder.json", "vocab.bpe"):
    paths[name] = os.path.join(tmp, name)
    with gzip.open(os.path.join(here, name + ".gz")) as f, open(paths[name], "wb") as g:
        g.write(f.read())
ranks = data_gym_to_mergeable_bpe_ranks(
    vocab_bpe_file=paths["vocab.bpe"],
    encoder_json_file=paths["encoder.json"],
    vocab_bpe_hash="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    encoder_json_hash="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
)
enc = tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                        special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
TEXTS = [
    "Hello world",
    " The quick brown fox jumps over the lazy dog.",
    "It's 2024: numbers 12345 and 3.14159, they're here!",
    "  leading spaces\n\n\ttabs  and trailing   ",
    "héllo wörld — naïve café 🙂",
    "日本語のテキスト",
    "line1\r\nline2\n\n\nend",
    "a <|endoftext|> b",
]
for t in TEXTS:
    print(f"    ({json.dumps(t, ensure_ascii=False)}, &{enc.encode_ordinary(t)}),")
