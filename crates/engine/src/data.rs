//! The synthetic arithmetic-progression task: x_i = (s + i·k) mod V, with a random start
//! s ∈ [0, V) and a random stride k ∈ [1, max_stride]. A fixed tenth of the (s, k) pairs is held
//! out from training and used to check greedy generation.

use crate::rng::Rng;

/// Generates training batches and held-out prompts for the progression task.
#[derive(Clone, Debug)]
pub struct Progressions {
    vocab: usize,
    max_stride: usize,
    rng: Rng,
}

/// Whether the pair (s, k) belongs to the held-out set (about 10% of pairs, fixed by a hash).
pub fn is_held_out(s: usize, k: usize) -> bool {
    let mut h = Rng::new(((s as u64) << 32) ^ k as u64 ^ 0x005E_ED0F_D0E7);
    h.next_u64().is_multiple_of(10)
}

/// The progression (s, k) of `len` tokens.
pub fn progression(vocab: usize, s: usize, k: usize, len: usize) -> Vec<i32> {
    (0..len).map(|i| ((s + i * k) % vocab) as i32).collect()
}

impl Progressions {
    /// Strides are drawn from `1..=max_stride` (clamped to `1..vocab`).
    pub fn new(vocab: usize, max_stride: usize, seed: u64) -> Self {
        let max_stride = max_stride.clamp(1, vocab.saturating_sub(1).max(1));
        Self {
            vocab,
            max_stride,
            rng: Rng::derive(seed, 1),
        }
    }

    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    pub fn set_rng_state(&mut self, state: u64) {
        self.rng = Rng::new(state);
    }

    fn train_pair(&mut self) -> (usize, usize) {
        loop {
            let s = self.rng.below(self.vocab as u64) as usize;
            let k = 1 + self.rng.below(self.max_stride as u64) as usize;
            if !is_held_out(s, k) {
                return (s, k);
            }
        }
    }

    /// A batch of `b` training sequences: inputs and next-token targets, each `b·t`.
    pub fn batch(&mut self, b: usize, t: usize) -> (Vec<i32>, Vec<i32>) {
        let pairs: Vec<(usize, usize)> = (0..b).map(|_| self.train_pair()).collect();
        batch_of(self.vocab, &pairs, t)
    }

    /// Up to `n` distinct held-out (s, k) pairs (k ∈ 1..=max_stride) chosen by `seed`.
    pub fn held_out_pairs(&self, n: usize, seed: u64) -> Vec<(usize, usize)> {
        let max_stride = self.max_stride;
        let mut all: Vec<(usize, usize)> = (0..self.vocab)
            .flat_map(|s| (1..=max_stride).map(move |k| (s, k)))
            .filter(|&(s, k)| is_held_out(s, k))
            .collect();
        let mut rng = Rng::derive(seed, 2);
        // Fisher–Yates, then take the first n.
        for i in (1..all.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            all.swap(i, j);
        }
        all.truncate(n);
        all
    }
}

/// Inputs and next-token targets (each `pairs.len()·t`) of the progressions `pairs`.
pub fn batch_of(vocab: usize, pairs: &[(usize, usize)], t: usize) -> (Vec<i32>, Vec<i32>) {
    let mut inputs = Vec::with_capacity(pairs.len() * t);
    let mut targets = Vec::with_capacity(pairs.len() * t);
    for &(s, k) in pairs {
        let seq = progression(vocab, s, k, t + 1);
        inputs.extend_from_slice(&seq[..t]);
        targets.extend_from_slice(&seq[1..]);
    }
    (inputs, targets)
}

/// Whether `generated` continues the progression of `prompt` with its stride at every step.
pub fn keeps_stride(vocab: usize, prompt: &[i32], generated: &[i32]) -> bool {
    if prompt.len() < 2 {
        return false;
    }
    let v = vocab as i32;
    let k = (prompt[1] - prompt[0]).rem_euclid(v);
    let mut prev = *prompt.last().unwrap();
    for &g in generated {
        if (g - prev).rem_euclid(v) != k {
            return false;
        }
        prev = g;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_progressions_outside_the_held_out_set() {
        let mut p = Progressions::new(96, 95, 3);
        let (x, y) = p.batch(8, 10);
        for r in 0..8 {
            let row = &x[r * 10..r * 10 + 10];
            let k = (row[1] - row[0]).rem_euclid(96) as usize;
            assert!(!is_held_out(row[0] as usize, k));
            assert_eq!(&y[r * 10..r * 10 + 9], &row[1..]);
            assert!(keeps_stride(96, &row[..2], &row[2..]));
        }
        let held = p.held_out_pairs(50, 1);
        assert_eq!(held.len(), 50);
        assert!(held.iter().all(|&(s, k)| is_held_out(s, k)));
        let frac = (0..96 * 96).filter(|i| is_held_out(i / 96, i % 96)).count() as f64 / 9216.0;
        assert!((0.07..0.13).contains(&frac), "held-out fraction {frac}");
        let mut small = Progressions::new(96, 4, 3);
        let (x, _) = small.batch(64, 3);
        assert!(
            x.chunks(3)
                .all(|r| (1..=4).contains(&(r[1] - r[0]).rem_euclid(96)))
        );
        assert!(
            small
                .held_out_pairs(1000, 1)
                .iter()
                .all(|&(_, k)| (1..=4).contains(&k))
        );
    }

    #[test]
    fn stride_check() {
        assert!(keeps_stride(96, &[90, 95], &[4, 9]));
        assert!(!keeps_stride(96, &[90, 95], &[4, 10]));
    }
}
