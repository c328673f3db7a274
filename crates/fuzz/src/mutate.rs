//! A small byte-level mutator (as libFuzzer's default mutations, without coverage feedback):
//! bit flips, byte sets to edge values, insertions and deletions, duplicated ranges, splices
//! from another seed, dictionary tokens, ASCII numbers rewritten. Stacked 1–8 deep.

/// xorshift64*: deterministic, and enough for choosing mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Inputs are kept below this size (the seeds are smaller).
pub const MAX_LEN: usize = 1 << 16;

/// A mutation of one of `seeds` (each mutation applied to the result of the last).
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], dict: &[&[u8]]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    let depth = 1 + rng.below(8);
    for _ in 0..depth {
        mutate_once(rng, &mut v, seeds, dict);
    }
    v.truncate(MAX_LEN);
    v
}

/// For safetensors files: most mutations keep the framing valid, so that they reach the
/// checkpoint's own checks — the JSON header alone mutated (its length prefix fixed after), or
/// the tensor data alone (bit flips make NaNs, infinities, negative second moments) — and the
/// rest are [`mutate`]'s of the whole file.
pub fn mutate_safetensors(rng: &mut Rng, seeds: &[Vec<u8>], dict: &[&[u8]]) -> Vec<u8> {
    let seed = &seeds[rng.below(seeds.len())];
    let framed = seed.len() >= 8 && {
        let n = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) as usize;
        n <= seed.len() - 8
    };
    let choice = rng.below(4);
    if !framed || choice == 3 {
        return mutate(rng, seeds, dict);
    }
    let n = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) as usize;
    let (mut header, mut data) = (seed[8..8 + n].to_vec(), seed[8 + n..].to_vec());
    let depth = 1 + rng.below(4);
    for _ in 0..depth {
        if choice < 2 {
            mutate_once(rng, &mut header, seeds, dict);
        } else if !data.is_empty() {
            let i = rng.below(data.len());
            data[i] ^= 1 << rng.below(8);
        }
    }
    header.truncate(MAX_LEN);
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend(header);
    v.extend(data);
    v
}

fn mutate_once(rng: &mut Rng, v: &mut Vec<u8>, seeds: &[Vec<u8>], dict: &[&[u8]]) {
    const EDGE: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'0', b'9', b'"'];
    let pos = |rng: &mut Rng, v: &Vec<u8>| if v.is_empty() { 0 } else { rng.below(v.len()) };
    match rng.below(10) {
        0 if !v.is_empty() => {
            let i = pos(rng, v);
            v[i] ^= 1 << rng.below(8);
        }
        1 if !v.is_empty() => {
            let i = pos(rng, v);
            v[i] = EDGE[rng.below(EDGE.len())];
        }
        2 if !v.is_empty() => {
            let i = pos(rng, v);
            v[i] = rng.next_u64() as u8;
        }
        3 => {
            let i = pos(rng, v);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            v.splice(i..i, bytes);
        }
        4 if !v.is_empty() => {
            let i = pos(rng, v);
            let n = (1 + rng.below(64)).min(v.len() - i);
            v.drain(i..i + n);
        }
        5 if !v.is_empty() => {
            let i = pos(rng, v);
            let n = (1 + rng.below(64)).min(v.len() - i);
            let chunk = v[i..i + n].to_vec();
            let j = pos(rng, v);
            v.splice(j..j, chunk);
        }
        6 if !dict.is_empty() => {
            let tok = dict[rng.below(dict.len())];
            let i = pos(rng, v);
            if rng.below(2) == 0 || v.len() < i + tok.len() {
                v.splice(i..i, tok.iter().copied());
            } else {
                v[i..i + tok.len()].copy_from_slice(tok);
            }
        }
        7 => {
            // Splice: this input up to a point, another seed from a point.
            let other = &seeds[rng.below(seeds.len())];
            let i = pos(rng, v);
            let j = if other.is_empty() {
                0
            } else {
                rng.below(other.len())
            };
            v.truncate(i);
            v.extend_from_slice(&other[j..]);
        }
        8 => {
            // An ASCII number somewhere rewritten as another one.
            let digits: Vec<usize> = (0..v.len()).filter(|&i| v[i].is_ascii_digit()).collect();
            if !digits.is_empty() {
                let i = digits[rng.below(digits.len())];
                let mut j = i;
                while j < v.len() && v[j].is_ascii_digit() {
                    j += 1;
                }
                let n: &[u8] = match rng.below(6) {
                    0 => b"0",
                    1 => b"4294967296",
                    2 => b"18446744073709551616",
                    3 => b"1",
                    4 => b"65535",
                    _ => b"999999999999",
                };
                v.splice(i..j, n.iter().copied());
            }
        }
        _ => {
            let i = pos(rng, v);
            v.truncate(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_deterministic_bounded_and_vary() {
        let seeds = vec![b"[model]\nvocab = 96\n".to_vec(), vec![0u8; 100]];
        let run = |seed| {
            let mut rng = Rng::new(seed);
            (0..200)
                .map(|_| mutate(&mut rng, &seeds, &[b"[train]\n"]))
                .collect::<Vec<_>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert!(a.iter().all(|v| v.len() <= MAX_LEN));
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(distinct.len() > 150, "{} distinct of 200", distinct.len());
    }
}
