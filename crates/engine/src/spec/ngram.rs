//! NGRAM proposals (prompt lookup decoding; SGLang's `--speculative-algorithm NGRAM`, vLLM's
//! `ngram` method, llama.cpp's `--spec-type ngram-*`): the next tokens are guessed by finding
//! the sequence's own suffix earlier in its prompt or output and copying what followed there.
//!
//! Each request keeps an [`NgramIndex`]: a hash map from every n-gram of its tokens
//! (`min_window ..= max_window` long) to the position right after its latest occurrence,
//! extended as tokens arrive (O(max_window) per token), so a proposal is `max_window` lookups
//! and never a rescan of the sequence. The longest suffix with an earlier occurrence wins; a
//! hash collision is caught by comparing the tokens, so a proposal is always a real match.

use std::collections::HashMap;

/// The n-gram index of one sequence.
#[derive(Debug, Clone)]
pub struct NgramIndex {
    min_window: usize,
    max_window: usize,
    /// `key(n-gram ending at e)` -> `e + 1`, the latest occurrence's continuation.
    map: HashMap<u64, u32>,
    /// N-grams ending before `indexed - 1` are in `map`; the one ending at the sequence's last
    /// token never is (its continuation is unknown), so a lookup finds only earlier matches.
    indexed: usize,
}

/// Mixes one more token into a suffix hash read backwards from the suffix's end.
fn fold(h: u64, t: u32) -> u64 {
    (h ^ t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29)
}

/// The key of an n-gram of length `n` with backward hash `h`.
fn key(h: u64, n: usize) -> u64 {
    h ^ (n as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

impl NgramIndex {
    /// An empty index matching suffixes of `min_window ..= max_window` tokens (both ≥ 1).
    pub fn new(min_window: usize, max_window: usize) -> Self {
        let min_window = min_window.max(1);
        NgramIndex { min_window, max_window: max_window.max(min_window), map: HashMap::new(), indexed: 0 }
    }

    /// Indexes the n-grams `tokens` gained since the last call (`tokens` only ever grows; a
    /// shorter slice, e.g. after a rebuild, restarts the index).
    pub fn extend(&mut self, tokens: &[u32]) {
        if tokens.len() < self.indexed {
            self.map.clear();
            self.indexed = 0;
        }
        // Every n-gram ending at `e < len - 1` gets its continuation `e + 1`.
        let from = self.indexed.saturating_sub(1);
        for e in from..tokens.len().saturating_sub(1) {
            let mut h = 0u64;
            for n in 1..=self.max_window.min(e + 1) {
                h = fold(h, tokens[e + 1 - n]);
                if n >= self.min_window {
                    self.map.insert(key(h, n), (e + 1) as u32);
                }
            }
        }
        self.indexed = tokens.len();
    }

    /// Up to `max` tokens that followed the longest earlier occurrence of the sequence's
    /// suffix (empty when no suffix of at least `min_window` tokens occurred before). Call
    /// [`NgramIndex::extend`] with the same `tokens` first.
    pub fn propose(&self, tokens: &[u32], max: usize) -> Vec<u32> {
        let len = tokens.len();
        if max == 0 || len < 2 {
            return Vec::new();
        }
        let mut hashes = Vec::with_capacity(self.max_window);
        let mut h = 0u64;
        for n in 1..=self.max_window.min(len - 1) {
            h = fold(h, tokens[len - n]);
            hashes.push(h);
        }
        for n in (self.min_window..=hashes.len()).rev() {
            let Some(&cont) = self.map.get(&key(hashes[n - 1], n)) else { continue };
            let cont = cont as usize;
            if cont < n || cont >= len || tokens[cont - n..cont] != tokens[len - n..] {
                continue; // a collision, or an index of a longer sequence
            }
            return tokens[cont..len.min(cont + max)].to_vec();
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest earlier occurrence by brute force: the reference the index must equal.
    fn brute(tokens: &[u32], min_w: usize, max_w: usize, max: usize) -> Vec<u32> {
        let len = tokens.len();
        for n in (min_w..=max_w.min(len - 1)).rev() {
            let suffix = &tokens[len - n..];
            // The latest earlier occurrence: its end `cont` before the sequence's end.
            if let Some(cont) = (n..len).rev().find(|&c| &tokens[c - n..c] == suffix) {
                return tokens[cont..len.min(cont + max)].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn proposals_equal_a_brute_force_search_as_tokens_arrive() {
        let mut seed = 12345u64;
        for vocab in [2u32, 3, 5, 40] {
            for (min_w, max_w) in [(1, 1), (1, 4), (2, 6), (3, 12)] {
                let mut idx = NgramIndex::new(min_w, max_w);
                let mut tokens = Vec::new();
                for _ in 0..300 {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    tokens.push(((seed >> 33) % vocab as u64) as u32);
                    idx.extend(&tokens);
                    if tokens.len() >= 2 {
                        assert_eq!(idx.propose(&tokens, 5), brute(&tokens, min_w, max_w, 5), "{tokens:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_copied_passage_is_proposed_in_full() {
        let file: Vec<u32> = (100..160).collect();
        let mut tokens: Vec<u32> = vec![1, 2, 3];
        tokens.extend(&file);
        tokens.extend([7, 8]);
        tokens.extend(&file[..10]);
        let mut idx = NgramIndex::new(1, 12);
        idx.extend(&tokens);
        assert_eq!(idx.propose(&tokens, 8), file[10..18].to_vec());
        // No earlier occurrence of the last token: nothing.
        tokens.push(999);
        idx.extend(&tokens);
        assert!(idx.propose(&tokens, 8).is_empty());
    }
}
