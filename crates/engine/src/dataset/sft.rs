//! Supervised fine-tuning shards: whole examples (`duet tokenize` of JSONL prompt–completion or
//! conversation records), each token marked learned or not.
//!
//! The file: a header of 256 little-endian i32 as llm.c's — [`SFT_MAGIC`], [`SFT_VERSION`], the
//! example count `E`, the token count `N`, zeros — then `E + 1` little-endian u64 example
//! boundaries (token indices: 0, the start of each later example, `N`), then `N` little-endian
//! u32 tokens, bit 31 ([`SFT_LEARNED`]) set on the tokens that are targets, the id in the low
//! 31 bits.
//!
//! A training row holds one example (no packing): `inputs = ids[..n − 1]`, `targets[i] =
//! ids[i + 1]` where token `i + 1` is learned, else ignored (−1), the rest of the row padded
//! with input 0 and ignored targets. An example longer than `seq + 1` tokens is cut to its first
//! `seq + 1` (counted in [`SftSet::truncated`]); one with no learned target in its row is left
//! out ([`SftSet::skipped`]), so every row — and every batch — has a counted target.

use super::*;

/// The magic of an SFT shard (word 0 of the header).
pub const SFT_MAGIC: i32 = 20250701;
/// The version of the SFT shard format (word 1).
pub const SFT_VERSION: i32 = 1;
/// The bit of a token that marks it learned (a target).
pub const SFT_LEARNED: u32 = 1 << 31;

/// One example: `len` tokens of shard `shard` from token `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SftExample {
    /// Index into [`DataSet::shards`].
    pub shard: usize,
    pub start: usize,
    pub len: usize,
}

/// The examples of a data set of SFT shards, for rows of `seq` tokens.
#[derive(Clone, Debug, Default)]
pub struct SftSet {
    /// Training examples with a learned target in their row.
    pub train: Vec<SftExample>,
    /// Validation examples with a learned target in their row.
    pub val: Vec<SftExample>,
    /// Examples (training and validation) longer than `seq + 1` tokens: cut.
    pub truncated: usize,
    /// Examples without a learned target among their row's targets: left out.
    pub skipped: usize,
    /// The longest example: its shard's path and its tokens.
    pub longest: Option<(PathBuf, usize)>,
    /// The learned targets of the training rows (after truncation).
    pub learned: usize,
    /// The tokens of the training rows' inputs (after truncation, without padding).
    pub row_tokens: usize,
}

/// The layout of an SFT shard: the byte offset of its tokens and their count (the example
/// boundaries are checked by [`sft_boundaries`]).
pub(super) fn sft_layout(path: &Path, bytes: &[u8]) -> Result<(Encoding, usize, usize)> {
    let word = |i: usize| header_word(bytes, i).expect("within the header");
    let version = word(1);
    if version != SFT_VERSION {
        return Err(data_err(
            path,
            format!(
                "unsupported SFT shard version {version} (magic {SFT_MAGIC}; this duet reads \
                 version {SFT_VERSION})"
            ),
        ));
    }
    let (examples, tokens) = (word(2), word(3));
    let offset = LLMC_HEADER_BYTES as u64 + 8 * (examples.max(0) as u64 + 1);
    let expected = offset + 4 * tokens.max(0) as u64;
    if examples < 0 || tokens < 0 || bytes.len() as u64 != expected {
        return Err(data_err(
            path,
            format!(
                "SFT shard header says {examples} examples and {tokens} tokens, so the file \
                 should be {expected} bytes, but it is {} (truncated or corrupt)",
                bytes.len()
            ),
        ));
    }
    Ok((Encoding::Sft, offset as usize, tokens as usize))
}

/// The example boundaries of an SFT shard (`E + 1` token indices, from 0 to the token count,
/// non-decreasing).
pub(super) fn sft_boundaries(path: &Path, bytes: &[u8], tokens: usize) -> Result<Vec<usize>> {
    let examples = header_word(bytes, 2).expect("checked by the layout") as usize;
    let table = &bytes[LLMC_HEADER_BYTES..LLMC_HEADER_BYTES + 8 * (examples + 1)];
    let bounds: Vec<u64> = table
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let ordered = bounds.windows(2).all(|w| w[0] <= w[1]);
    if bounds[0] != 0 || bounds[examples] != tokens as u64 || !ordered {
        return Err(data_err(
            path,
            format!("the SFT shard's example boundaries are not 0, …, {tokens} in order (corrupt)"),
        ));
    }
    Ok(bounds.into_iter().map(|b| b as usize).collect())
}

/// The learned targets of an example's row of `seq` tokens: its learned tokens among tokens
/// `1..=seq` (raw tokens of the example in `raw`).
fn learned_targets(raw: &[u8], len: usize, seq: usize) -> usize {
    (1..len.min(seq + 1))
        .filter(|&i| token_word(raw, i) & SFT_LEARNED != 0)
        .count()
}

/// Token `i`'s u32 word (id and learned bit) of SFT token bytes.
fn token_word(bytes: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

impl SftSet {
    /// The examples of `shards` (every one an SFT shard; the first `n_train` training shards,
    /// the rest validation shards) for rows of `seq` tokens. Without validation shards the
    /// last [`VAL_FRACTION`] of each training shard's examples (at least one) are held out.
    pub(super) fn of(shards: &[Shard], n_train: usize, seq: usize) -> Result<SftSet> {
        let mut set = SftSet::default();
        let held_out = shards.len() == n_train;
        for (i, s) in shards.iter().enumerate() {
            let n = s.examples.len() - 1;
            let split = match (i < n_train, held_out) {
                (false, _) => 0,
                (true, false) => n,
                (true, true) => {
                    let n_val = ((n as f64 * VAL_FRACTION) as usize).max(1);
                    if n < n_val + 1 {
                        return Err(data_err(
                            &s.path,
                            format!(
                                "{n} examples is too few to hold some out for validation (give \
                                 validation shards: duet tokenize --val-fraction)"
                            ),
                        ));
                    }
                    n - n_val
                }
            };
            s.read_tokens(|raw| set.add_examples(s, i, raw, split, seq))?;
        }
        if set.train.is_empty() || set.val.is_empty() {
            let which = if set.train.is_empty() {
                "training"
            } else {
                "validation"
            };
            return Err(data_err(
                &shards[if set.train.is_empty() {
                    0
                } else {
                    shards.len() - 1
                }]
                .path,
                format!(
                    "no {which} example has a learned token among its first {seq} targets \
                     ({} left out)",
                    set.skipped
                ),
            ));
        }
        Ok(set)
    }

    /// Adds shard `i`'s examples (its token bytes `raw`): those before `split` train.
    fn add_examples(&mut self, s: &Shard, i: usize, raw: &[u8], split: usize, seq: usize) {
        for (k, w) in s.examples.windows(2).enumerate() {
            let (start, len) = (w[0], w[1] - w[0]);
            if self.longest.as_ref().is_none_or(|(_, l)| len > *l) {
                self.longest = Some((s.path.clone(), len));
            }
            self.truncated += usize::from(len > seq + 1);
            let learned = learned_targets(&raw[4 * start..], len, seq);
            if learned == 0 {
                self.skipped += 1;
                continue;
            }
            let e = SftExample {
                shard: i,
                start,
                len,
            };
            if k < split {
                self.learned += learned;
                self.row_tokens += len.min(seq + 1) - 1;
                self.train.push(e);
            } else {
                self.val.push(e);
            }
        }
    }
}

impl DataSet {
    /// Appends example `e`'s row of `t` tokens to `inputs` and `targets` (see the module's
    /// documentation).
    pub(super) fn sft_row(
        &self,
        e: &SftExample,
        t: usize,
        inputs: &mut Vec<i32>,
        targets: &mut Vec<i32>,
    ) -> Result<()> {
        let n = e.len.min(t + 1);
        self.shards[e.shard].read_tokens(|raw| {
            let raw = &raw[4 * e.start..];
            let id = |i: usize| (token_word(raw, i) & !SFT_LEARNED) as i32;
            inputs.extend((0..n - 1).map(id));
            targets.extend((1..n).map(|i| match token_word(raw, i) & SFT_LEARNED {
                0 => -1,
                _ => id(i),
            }));
        })?;
        inputs.resize(inputs.len() + t + 1 - n, 0);
        targets.resize(targets.len() + t + 1 - n, -1);
        Ok(())
    }

    /// `b` rows of random training examples, one `rng.below` each.
    pub(super) fn sft_rows(
        &self,
        sft: &SftSet,
        rng: &mut Rng,
        b: usize,
        t: usize,
    ) -> Result<(Vec<i32>, Vec<i32>)> {
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for _ in 0..b {
            let e = &sft.train[rng.below(sft.train.len() as u64) as usize];
            self.sft_row(e, t, &mut inputs, &mut targets)?;
        }
        Ok((inputs, targets))
    }

    /// Fixed validation batches of evenly spaced validation examples: `⌈examples / b⌉` batches
    /// (1 to `max_batches`), row `k` of all holding example `⌊k · examples / rows⌋` (an example
    /// recurs when there are fewer examples than rows).
    pub(super) fn sft_validation_batches(
        &self,
        sft: &SftSet,
        b: usize,
        t: usize,
        max_batches: usize,
    ) -> Result<Vec<(Vec<i32>, Vec<i32>)>> {
        let n = sft.val.len();
        let n_batches = n.div_ceil(b).clamp(1, max_batches.max(1));
        let rows = n_batches * b;
        (0..n_batches)
            .map(|i| {
                let mut x = Vec::with_capacity(b * t);
                let mut y = Vec::with_capacity(b * t);
                for r in 0..b {
                    let e = &sft.val[(i * b + r) * n / rows];
                    self.sft_row(e, t, &mut x, &mut y)?;
                }
                Ok((x, y))
            })
            .collect()
    }
}
