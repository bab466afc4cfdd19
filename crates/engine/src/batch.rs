//! `ForwardBatch`: everything a model needs for one forward step, built by the scheduler,
//! complete for every batch kind.
//!
//! The layout follows SGLang's `ForwardBatch` / FlashInfer's ragged metadata: the new tokens of
//! all sequences are flattened into one token axis (`input_ids`, `positions`, `out_cache_loc`),
//! sequence `i` owns tokens `token_start[i] .. token_start[i] + extend_len[i]`, and its whole KV
//! history (cached prefix, earlier chunks and the new tokens) is the slot list
//! `kv_indices[kv_indptr[i] .. kv_indptr[i+1]]`, position by position (the request's
//! `req_to_token` row). A DECODE row is simply a sequence with `extend_len == 1`; a chunked
//! continuation is an EXTEND row whose prefix includes its earlier chunks. There is no field
//! that only some batch kinds fill: [`ForwardBatch::validate`] checks every invariant, and the
//! scheduler's property test calls it on every batch it builds.

/// What a batch contains (for logs and metrics; the model does not branch on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardMode {
    /// Only prompt (or recompute) tokens.
    Extend,
    /// Only one new token per sequence.
    Decode,
    /// EXTEND and DECODE rows together.
    Mixed,
}

/// Per-sequence metadata of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqMeta {
    /// Index of the request in the engine's request table (its `req_to_token` row).
    pub req_pool_idx: u32,
    /// Tokens whose KV is already in the cache (radix prefix + earlier chunks).
    pub prefix_len: u32,
    /// New tokens in this batch.
    pub extend_len: u32,
    /// Offset of the first new token on the flattened token axis.
    pub token_start: u32,
    /// How many of the last new tokens' logits are wanted: 1 for a row that samples, 0 for a
    /// non-final prefill chunk, more when the request asked for prompt logprobs (then every
    /// prompt row from its logprob start on). At most `extend_len`.
    pub num_logits: u32,
}

/// One forward step's inputs.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    /// Token ids, `[num_tokens]`.
    pub input_ids: Vec<u32>,
    /// Absolute position of each token, `[num_tokens]`.
    pub positions: Vec<u32>,
    /// KV slot each new token's keys/values are written to, `[num_tokens]`.
    pub out_cache_loc: Vec<u32>,
    /// Per-sequence metadata, `[num_seqs]`.
    pub seqs: Vec<SeqMeta>,
    /// Offsets into `kv_indices`, `[num_seqs + 1]`.
    pub kv_indptr: Vec<u32>,
    /// KV slots of positions `0 .. prefix_len + extend_len` of each sequence, concatenated.
    pub kv_indices: Vec<u32>,
    /// Token rows whose logits are returned, in sequence order: the last `num_logits` rows of
    /// each sequence, `[Σ num_logits]`.
    pub logits_rows: Vec<u32>,
}

/// A broken invariant found by [`ForwardBatch::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ForwardBatch: {0}")]
pub struct BatchError(pub String);

impl ForwardBatch {
    /// One sequence whose position `p` lives in slot `p + 1` (slot 0 is never used): the
    /// tokens `all[kv_len..]` are new, `all[..kv_len]` already cached; logits of the last token.
    /// For tools and tests that drive a model without the scheduler.
    ///
    /// # Panics
    /// When `kv_len >= all.len()`.
    pub fn single_sequence(all: &[u32], kv_len: usize) -> ForwardBatch {
        assert!(kv_len < all.len(), "no new token");
        let (n, len) = ((all.len() - kv_len) as u32, all.len() as u32);
        ForwardBatch {
            input_ids: all[kv_len..].to_vec(),
            positions: (kv_len as u32..len).collect(),
            out_cache_loc: (kv_len as u32 + 1..len + 1).collect(),
            seqs: vec![SeqMeta {
                req_pool_idx: 0,
                prefix_len: kv_len as u32,
                extend_len: n,
                token_start: 0,
                num_logits: 1,
            }],
            kv_indptr: vec![0, len],
            kv_indices: (1..len + 1).collect(),
            logits_rows: vec![n - 1],
        }
    }

    /// Appends one sequence: positions `prefix_len .. prefix_len + n` are new (token of
    /// position `p` is `token(p)`), its KV slot of position `p` is `slot(p)`, and the last
    /// `num_logits` new rows return logits. Start from `kv_indptr == [0]`.
    pub fn push_seq(
        &mut self,
        req_pool_idx: u32,
        prefix_len: usize,
        n: usize,
        num_logits: usize,
        slot: impl Fn(usize) -> u32,
        token: impl Fn(usize) -> u32,
    ) {
        let start = self.input_ids.len() as u32;
        self.kv_indices.extend((0..prefix_len + n).map(&slot));
        for p in prefix_len..prefix_len + n {
            self.input_ids.push(token(p));
            self.positions.push(p as u32);
            self.out_cache_loc.push(slot(p));
        }
        self.logits_rows.extend(start + (n - num_logits) as u32..start + n as u32);
        self.kv_indptr.push(self.kv_indices.len() as u32);
        self.seqs.push(SeqMeta {
            req_pool_idx,
            prefix_len: prefix_len as u32,
            extend_len: n as u32,
            token_start: start,
            num_logits: num_logits as u32,
        });
    }

    /// Tokens on the flattened axis.
    pub fn num_tokens(&self) -> usize {
        self.input_ids.len()
    }

    /// The batch kind.
    pub fn mode(&self) -> ForwardMode {
        let decode = self.seqs.iter().filter(|s| s.extend_len == 1 && s.prefix_len > 0).count();
        if decode == self.seqs.len() {
            ForwardMode::Decode
        } else if decode == 0 {
            ForwardMode::Extend
        } else {
            ForwardMode::Mixed
        }
    }

    /// KV slots of sequence `i`, positions `0 .. prefix_len + extend_len`.
    pub fn kv_slots(&self, i: usize) -> &[u32] {
        &self.kv_indices[self.kv_indptr[i] as usize..self.kv_indptr[i + 1] as usize]
    }

    /// Checks the state slots of a hybrid model's batch: a sequence's recurrent state lives at
    /// its `req_pool_idx` ([`crate::kv::state`]), which must be inside the pool of `slots`
    /// (distinct indices are checked by [`ForwardBatch::validate`]).
    ///
    /// # Errors
    /// The first sequence whose slot is out of range.
    pub fn validate_states(&self, slots: usize) -> Result<(), BatchError> {
        match self.seqs.iter().position(|s| s.req_pool_idx as usize >= slots) {
            Some(i) => Err(BatchError(format!(
                "seq {i}: state slot {} outside the pool of {slots}",
                self.seqs[i].req_pool_idx
            ))),
            None => Ok(()),
        }
    }

    /// Checks every invariant the model relies on, for any batch kind.
    ///
    /// # Errors
    /// The first broken invariant, described.
    pub fn validate(&self, num_slots: usize) -> Result<(), BatchError> {
        let err = |m: String| Err(BatchError(m));
        let n = self.num_tokens();
        if self.positions.len() != n || self.out_cache_loc.len() != n {
            return err(format!(
                "{n} input ids, {} positions, {} out_cache_loc",
                self.positions.len(),
                self.out_cache_loc.len()
            ));
        }
        if self.seqs.is_empty() {
            return err("no sequences".into());
        }
        if self.kv_indptr.len() != self.seqs.len() + 1 || self.kv_indptr[0] != 0 {
            return err("kv_indptr length or start".into());
        }
        if *self.kv_indptr.last().unwrap_or(&0) as usize != self.kv_indices.len() {
            return err("kv_indptr end != kv_indices length".into());
        }
        let mut next_token = 0u32;
        let mut logits = Vec::new();
        let mut seen_req = std::collections::HashSet::new();
        let mut seen_slot = std::collections::HashSet::new();
        for (i, s) in self.seqs.iter().enumerate() {
            if !seen_req.insert(s.req_pool_idx) {
                return err(format!("request {} appears twice", s.req_pool_idx));
            }
            if s.extend_len == 0 {
                return err(format!("seq {i}: extend_len 0"));
            }
            if s.token_start != next_token {
                return err(format!("seq {i}: token_start {} != {next_token}", s.token_start));
            }
            next_token += s.extend_len;
            let slots = self.kv_slots(i);
            if slots.len() != (s.prefix_len + s.extend_len) as usize {
                return err(format!(
                    "seq {i}: {} kv slots for {} + {} tokens",
                    slots.len(),
                    s.prefix_len,
                    s.extend_len
                ));
            }
            for j in 0..s.extend_len {
                let row = (s.token_start + j) as usize;
                if row >= n {
                    return err(format!("seq {i}: token row {row} out of range"));
                }
                if self.positions[row] != s.prefix_len + j {
                    return err(format!(
                        "seq {i}: position {} at row {row}, want {}",
                        self.positions[row],
                        s.prefix_len + j
                    ));
                }
                if self.out_cache_loc[row] != slots[(s.prefix_len + j) as usize] {
                    return err(format!(
                        "seq {i}: out_cache_loc disagrees with kv_indices at position {}",
                        s.prefix_len + j
                    ));
                }
                if !seen_slot.insert(self.out_cache_loc[row]) {
                    return err(format!("slot {} written twice", self.out_cache_loc[row]));
                }
            }
            if slots.iter().any(|&x| x as usize >= num_slots) {
                return err(format!("seq {i}: slot out of range"));
            }
            if s.num_logits > s.extend_len {
                return err(format!("seq {i}: {} logits rows for {} new tokens", s.num_logits, s.extend_len));
            }
            let end = s.token_start + s.extend_len;
            logits.extend(end - s.num_logits..end);
        }
        if next_token as usize != n {
            return err(format!("sequences cover {next_token} of {n} tokens"));
        }
        if logits != self.logits_rows {
            return err(format!("logits_rows {:?}, want {logits:?}", self.logits_rows));
        }
        Ok(())
    }
}
