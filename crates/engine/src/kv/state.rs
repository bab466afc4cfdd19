//! The state pool beside the KV pool: the fixed-size recurrent state a hybrid model's
//! linear-attention layers carry per request (GatedDeltaNet's convolution window and its
//! `d_k × d_v` matrix per value head), where an attention layer keeps KV pages.
//!
//! As SGLang's `MambaPool` (`mem_cache/memory_pool.py`, `HybridReqToTokenPool`), a request's
//! state lives in one slot for as long as it runs: the slot is its request-pool index
//! (`SeqMeta::req_pool_idx`), handed out at admission and returned on finish, abort or
//! retraction, so the pool has `max_running_requests` slots and admission, which already
//! counts request slots, counts states too. A sequence whose row starts at position 0 starts
//! from a zero state (the model clears its slot); every later chunk or decode row continues the
//! slot's state. A prefix hit needs the state at the matched position: the pool also holds
//! saved states, which the radix cache attaches to the nodes where they were saved and the
//! scheduler copies in and out before a forward ([`StateCopy`]; see `ARCHITECTURE.md`).

/// What a hybrid model keeps per request and recurrent layer, in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StateLayout {
    /// Recurrent layers.
    pub layers: usize,
    /// Values of the convolution window per layer: `(kernel − 1) × channels`.
    pub conv: usize,
    /// Values of the recurrent state per layer (GatedDeltaNet: `heads_v × d_k × d_v`).
    pub ssm: usize,
}

impl StateLayout {
    /// Bytes one request's state takes across all layers.
    pub fn bytes_per_request(&self) -> usize {
        self.layers * (self.conv + self.ssm) * 4
    }
}

/// The pool: per recurrent layer, the windows and the states of every slot, each contiguous
/// (slot `s` at `s · conv` and `s · ssm`): `slots` live states (one per request-pool index),
/// then `checkpoints` saved ones (checkpoint `c` at slot `slots + c`), which the radix cache
/// hands out for prefix hits ([`crate::kv::radix`]). Zeroed storage is allocated lazily by the
/// OS, so slots cost memory as they are used.
#[derive(Debug, Clone)]
pub struct StatePool {
    layout: StateLayout,
    slots: usize,
    checkpoints: usize,
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

/// A copy between a live state and a checkpoint, queued by the scheduler and done before the
/// next forward ([`StatePool::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateCopy {
    /// Save request slot `slot`'s state as checkpoint `ckpt`.
    Save {
        /// The request-pool index.
        slot: u32,
        /// The checkpoint.
        ckpt: u32,
    },
    /// Start request slot `slot` from checkpoint `ckpt` (a prefix hit).
    Restore {
        /// The checkpoint.
        ckpt: u32,
        /// The request-pool index.
        slot: u32,
    },
}

impl StatePool {
    /// `slots` live states and `checkpoints` saved ones of `layout`, zeroed.
    pub fn new(layout: StateLayout, slots: usize, checkpoints: usize) -> StatePool {
        let n = slots + checkpoints;
        StatePool {
            layout,
            slots,
            checkpoints,
            conv: (0..layout.layers).map(|_| vec![0f32; layout.conv * n]).collect(),
            ssm: (0..layout.layers).map(|_| vec![0f32; layout.ssm * n]).collect(),
        }
    }

    /// Checkpoints the pool holds beside the live states.
    pub fn checkpoints(&self) -> usize {
        self.checkpoints
    }

    /// Does the queued copies in order.
    ///
    /// # Errors
    /// A slot or checkpoint outside the pool (a scheduler bug), naming it; the copies before it
    /// are done.
    pub fn apply(&mut self, ops: &[StateCopy]) -> Result<(), String> {
        for op in ops {
            let (from, to) = match *op {
                StateCopy::Save { slot, ckpt } => (slot as usize, self.slots + ckpt as usize),
                StateCopy::Restore { ckpt, slot } => (self.slots + ckpt as usize, slot as usize),
            };
            let n = self.slots + self.checkpoints;
            let live = |i: usize, ckpt: bool| if ckpt { i >= self.slots && i < n } else { i < self.slots };
            let ok = match op {
                StateCopy::Save { .. } => live(from, false) && live(to, true),
                StateCopy::Restore { .. } => live(from, true) && live(to, false),
            };
            if !ok {
                return Err(format!(
                    "state copy {op:?} outside a pool of {} slots and {} checkpoints",
                    self.slots, self.checkpoints
                ));
            }
            let (c, s) = (self.layout.conv, self.layout.ssm);
            for layer in 0..self.layout.layers {
                self.conv[layer].copy_within(from * c..(from + 1) * c, to * c);
                self.ssm[layer].copy_within(from * s..(from + 1) * s, to * s);
            }
        }
        Ok(())
    }

    /// The layout.
    pub fn layout(&self) -> StateLayout {
        self.layout
    }

    /// Slots (request-pool indices) the pool holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Recurrent layer `layer`'s windows and states of every slot, both mutable.
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.conv[layer], &mut self.ssm[layer])
    }
}
