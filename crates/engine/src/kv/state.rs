//! The state pool beside the KV pool: the fixed-size recurrent state a hybrid model's
//! linear-attention layers carry per request (GatedDeltaNet's convolution window and its
//! `d_v × d_k` matrix per value head), where an attention layer keeps KV pages.
//!
//! As SGLang's `MambaPool` (`mem_cache/memory_pool.py`, `HybridReqToTokenPool`), a request's
//! state lives in one slot for as long as it runs: the slot is its request-pool index
//! (`SeqMeta::req_pool_idx`), handed out at admission and returned on finish, abort or
//! retraction, so the pool has `max_running_requests` slots and admission, which already
//! counts request slots, counts states too. A sequence whose row starts at position 0 starts
//! from a zero state (the model clears its slot); every later chunk or decode row continues the
//! slot's state, which is why a hybrid model runs without prefix hits for now (a hit would need
//! the state at the matched position: see `ARCHITECTURE.md`).

/// What a hybrid model keeps per request and recurrent layer, in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StateLayout {
    /// Recurrent layers.
    pub layers: usize,
    /// Values of the convolution window per layer: `(kernel − 1) × channels`.
    pub conv: usize,
    /// Values of the recurrent state per layer (GatedDeltaNet: `heads_v × d_v × d_k`).
    pub ssm: usize,
}

impl StateLayout {
    /// Bytes one request's state takes across all layers.
    pub fn bytes_per_request(&self) -> usize {
        self.layers * (self.conv + self.ssm) * 4
    }
}

/// The pool: per recurrent layer, the windows and the states of every slot, each contiguous
/// (slot `s` at `s · conv` and `s · ssm`). Zeroed storage is allocated lazily by the OS, so
/// slots cost memory as requests use them.
#[derive(Debug, Clone)]
pub struct StatePool {
    layout: StateLayout,
    slots: usize,
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

impl StatePool {
    /// `slots` zeroed states of `layout`.
    pub fn new(layout: StateLayout, slots: usize) -> StatePool {
        StatePool {
            layout,
            slots,
            conv: (0..layout.layers).map(|_| vec![0f32; layout.conv * slots]).collect(),
            ssm: (0..layout.layers).map(|_| vec![0f32; layout.ssm * slots]).collect(),
        }
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
