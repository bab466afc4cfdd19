//! The paged KV cache: token slots grouped into pages, a page allocator with free-page
//! accounting, and the per-layer storage, generic over what a model keeps per token.
//!
//! As in SGLang (`mem_cache/memory_pool.py`, `allocator.py`), a *slot* holds one token's cache
//! entry in every layer, a *page* is `page_size` consecutive slots (`slot = page · page_size +
//! offset`), and each request's `req_to_token` row maps its positions to slots. Page 0 is never
//! handed out, so a zeroed slot id is never a live entry.
//!
//! What a token stores per layer is a [`KvLayout`]: named components of fixed width, in one
//! element type ([`KvDtype`]: f32, f16, bf16, or fp8 E4M3/E5M2 as SGLang's `--kv-cache-dtype`
//! names them): GQA keys and values, or the MLA latent (`kv_lora_rank + qk_rope_head_dim`) and
//! the DSA indexer key.

pub mod hicache;
pub mod radix;
pub mod state;

pub use state::{StateCopy, StateLayout, StatePool};

/// One per-token, per-layer array of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvComponent {
    /// Name (for logs and capability checks), e.g. `"k"`, `"v"`, `"latent"`, `"index_k"`.
    pub name: &'static str,
    /// f32 values per token.
    pub width: usize,
}

/// Element type of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 32-bit float.
    F32,
    /// IEEE half (as llama.cpp's default KV cache): half the memory and bandwidth.
    F16,
    /// bfloat16 (SGLang's `bf16`).
    Bf16,
    /// OCP fp8 E4M3 (SGLang's `fp8_e4m3`; scale 1.0, saturating at ±448).
    Fp8E4m3,
    /// OCP fp8 E5M2 (SGLang's `fp8_e5m2`; scale 1.0).
    Fp8E5m2,
}

impl KvDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => 1,
        }
    }

    /// The name SGLang's `--kv-cache-dtype` gives it (`f32`, `f16` for ours that it has not).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8E4m3 => "fp8_e4m3",
            KvDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }
}

/// What a model caches per token and layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub layers: usize,
    /// Components stored for each layer.
    pub components: Vec<KvComponent>,
    /// Element type of every component.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Grouped-query attention: keys and values of `kv_heads × head_dim` each.
    pub fn gqa(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        KvLayout {
            layers,
            components: vec![
                KvComponent { name: "k", width: kv_heads * head_dim },
                KvComponent { name: "v", width: kv_heads * head_dim },
            ],
            dtype: KvDtype::F32,
        }
    }

    /// The same layout with another element type.
    pub fn with_dtype(mut self, dtype: KvDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// Bytes one token takes across all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.layers * self.components.iter().map(|c| c.width).sum::<usize>() * self.dtype.bytes()
    }
}

/// Free-page accounting. Pages `1 ..= num_pages` are allocatable.
#[derive(Debug, Clone)]
pub struct PageAllocator {
    page_size: usize,
    num_pages: usize,
    free: Vec<u32>,
}

impl PageAllocator {
    /// `num_pages` usable pages of `page_size` slots.
    pub fn new(num_pages: usize, page_size: usize) -> Self {
        // Reverse so that pages come out in ascending order (nicer logs, same behaviour).
        PageAllocator { page_size, num_pages, free: (1..=num_pages as u32).rev().collect() }
    }

    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Usable pages in all.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Slots in the pool including the reserved page 0 (the size of the storage).
    pub fn num_slots(&self) -> usize {
        (self.num_pages + 1) * self.page_size
    }

    /// Pages free now.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Takes one page, or `None` when none is free.
    pub fn alloc(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Returns a page. Freeing page 0 or a page twice is a bug the debug build catches.
    pub fn release(&mut self, page: u32) {
        debug_assert!(page != 0 && page as usize <= self.num_pages);
        debug_assert!(!self.free.contains(&page), "page {page} freed twice");
        self.free.push(page);
    }
}

/// Per-layer storage for a [`KvLayout`]: `[layer][component]` is `num_slots × width` values
/// of the layout's dtype (f16 and bf16 as raw 16-bit patterns, fp8 as bytes).
#[derive(Debug)]
pub struct KvStore {
    layout: KvLayout,
    num_slots: usize,
    f32: Vec<Vec<Vec<f32>>>,
    u16: Vec<Vec<Vec<u16>>>,
    u8: Vec<Vec<Vec<u8>>>,
    /// A hybrid model's recurrent states ([`state`]), beside the pages.
    states: Option<StatePool>,
}

fn wrong_dtype(want: &str, have: KvDtype) -> ! {
    // A model reading its cache with the wrong element type is a bug in that model, found by
    // its first test; the engine's panic containment keeps the server up meanwhile.
    panic!("KV store accessed as {want}, but it holds {}", have.name())
}

impl KvStore {
    /// Zeroed storage for `num_slots` slots. The allocation is lazy (the OS maps pages on first
    /// write), so a large budget costs memory only as it fills.
    pub fn new(layout: KvLayout, num_slots: usize) -> Self {
        let (mut f32s, mut u16s, mut u8s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..layout.layers {
            let widths = layout.components.iter().map(|c| c.width * num_slots);
            match layout.dtype {
                KvDtype::F32 => f32s.push(widths.map(|n| vec![0f32; n]).collect()),
                KvDtype::F16 | KvDtype::Bf16 => u16s.push(widths.map(|n| vec![0u16; n]).collect()),
                KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => u8s.push(widths.map(|n| vec![0u8; n]).collect()),
            }
        }
        KvStore { layout, num_slots, f32: f32s, u16: u16s, u8: u8s, states: None }
    }

    /// Writes `value` (rounded to the store's dtype) into every slot of every layer and
    /// component. Touching each element makes the whole store resident, which a measurement
    /// over the store needs (the zeroed allocation of [`KvStore::new`] is not backed by memory
    /// until written).
    pub fn fill(&mut self, value: f32) {
        let h = match self.layout.dtype {
            KvDtype::Bf16 => sparrow_cpu::half::f32_to_bf16(value),
            _ => sparrow_cpu::half::f32_to_f16(value),
        };
        let b = match self.layout.dtype {
            KvDtype::Fp8E5m2 => sparrow_cpu::half::Fp8::E5M2.encode(value),
            _ => sparrow_cpu::half::Fp8::E4M3.encode(value),
        };
        self.f32.iter_mut().flatten().for_each(|c| c.fill(value));
        self.u16.iter_mut().flatten().for_each(|c| c.fill(h));
        self.u8.iter_mut().flatten().for_each(|c| c.fill(b));
    }

    /// Adds the state pool of a hybrid model ([`state`]): `slots` states, one per request-pool
    /// index, and `checkpoints` saved ones for prefix hits.
    pub fn with_states(mut self, layout: StateLayout, slots: usize, checkpoints: usize) -> Self {
        self.states = Some(StatePool::new(layout, slots, checkpoints));
        self
    }

    /// The state pool, when the store has one.
    pub fn states(&self) -> Option<&StatePool> {
        self.states.as_ref()
    }

    /// The state pool, to change.
    pub fn states_mut(&mut self) -> Option<&mut StatePool> {
        self.states.as_mut()
    }

    /// The layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Slots held (including the reserved slot range of page 0).
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Component `c` of `layer` for all slots (an f32 store).
    pub fn component(&self, layer: usize, c: usize) -> &[f32] {
        match self.layout.dtype {
            KvDtype::F32 => &self.f32[layer][c],
            d => wrong_dtype("f32", d),
        }
    }

    /// Mutable component `c` of `layer` (an f32 store).
    pub fn component_mut(&mut self, layer: usize, c: usize) -> &mut [f32] {
        match self.layout.dtype {
            KvDtype::F32 => &mut self.f32[layer][c],
            d => wrong_dtype("f32", d),
        }
    }

    /// Component `c` of `layer` as f16 bits (an f16 store).
    pub fn component_f16(&self, layer: usize, c: usize) -> &[u16] {
        match self.layout.dtype {
            KvDtype::F16 => &self.u16[layer][c],
            d => wrong_dtype("f16", d),
        }
    }

    /// Component `c` of `layer` as 16-bit patterns (an f16 or bf16 store).
    pub fn component_u16(&self, layer: usize, c: usize) -> &[u16] {
        match self.layout.dtype {
            KvDtype::F16 | KvDtype::Bf16 => &self.u16[layer][c],
            d => wrong_dtype("16-bit", d),
        }
    }

    /// Component `c` of `layer` as bytes (an fp8 store).
    pub fn component_u8(&self, layer: usize, c: usize) -> &[u8] {
        match self.layout.dtype {
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => &self.u8[layer][c],
            d => wrong_dtype("fp8", d),
        }
    }

    /// Components 0 and 1 of one layer, mutably, as f16 bits (e.g. K and V).
    pub fn pair_mut_f16(&mut self, layer: usize) -> (&mut [u16], &mut [u16]) {
        if self.layout.dtype != KvDtype::F16 {
            wrong_dtype("f16", self.layout.dtype)
        }
        self.pair_mut_u16(layer)
    }

    /// Components 0 and 1 of one layer, mutably, as 16-bit patterns (an f16 or bf16 store).
    pub fn pair_mut_u16(&mut self, layer: usize) -> (&mut [u16], &mut [u16]) {
        if !matches!(self.layout.dtype, KvDtype::F16 | KvDtype::Bf16) {
            wrong_dtype("16-bit", self.layout.dtype)
        }
        let (a, b) = self.u16[layer].split_at_mut(1);
        (&mut a[0], &mut b[0])
    }

    /// Components 0 and 1 of one layer, mutably, as bytes (an fp8 store).
    pub fn pair_mut_u8(&mut self, layer: usize) -> (&mut [u8], &mut [u8]) {
        if !matches!(self.layout.dtype, KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2) {
            wrong_dtype("fp8", self.layout.dtype)
        }
        let (a, b) = self.u8[layer].split_at_mut(1);
        (&mut a[0], &mut b[0])
    }
}

impl KvStore {
    /// Appends the stored bytes of slots `first .. first + n` in every layer and component
    /// (layer by layer, component by component, slot by slot; little-endian elements): one
    /// page's block of the hierarchical cache, `n · bytes_per_token` bytes.
    pub fn read_slots(&self, first: usize, n: usize, out: &mut Vec<u8>) {
        for layer in 0..self.layout.layers {
            for (c, comp) in self.layout.components.iter().enumerate() {
                let r = first * comp.width..(first + n) * comp.width;
                match self.layout.dtype {
                    KvDtype::F32 => self.f32[layer][c][r].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
                    KvDtype::F16 | KvDtype::Bf16 => {
                        self.u16[layer][c][r].iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
                    }
                    KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => out.extend_from_slice(&self.u8[layer][c][r]),
                }
            }
        }
    }

    /// Writes a block [`KvStore::read_slots`] produced back into slots `first .. first + n`.
    ///
    /// # Errors
    /// `bytes` is not `n · bytes_per_token` long (nothing is written).
    pub fn write_slots(&mut self, first: usize, n: usize, bytes: &[u8]) -> Result<(), String> {
        let want = n * self.layout.bytes_per_token();
        if bytes.len() != want || (first + n) > self.num_slots {
            return Err(format!("a KV block of {} bytes for {n} slots at {first}; expected {want}", bytes.len()));
        }
        let mut at = 0;
        for layer in 0..self.layout.layers {
            for (c, comp) in self.layout.components.iter().enumerate() {
                let r = first * comp.width..(first + n) * comp.width;
                let len = r.len();
                match self.layout.dtype {
                    KvDtype::F32 => {
                        for (d, s) in self.f32[layer][c][r].iter_mut().zip(bytes[at..at + 4 * len].chunks_exact(4)) {
                            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                        }
                        at += 4 * len;
                    }
                    KvDtype::F16 | KvDtype::Bf16 => {
                        for (d, s) in self.u16[layer][c][r].iter_mut().zip(bytes[at..at + 2 * len].chunks_exact(2)) {
                            *d = u16::from_le_bytes([s[0], s[1]]);
                        }
                        at += 2 * len;
                    }
                    KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => {
                        self.u8[layer][c][r].copy_from_slice(&bytes[at..at + len]);
                        at += len;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block read from some slots and written to others reproduces them exactly, in every
    /// dtype; a block of the wrong length is refused.
    #[test]
    fn slots_round_trip_through_a_block() {
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16, KvDtype::Fp8E4m3] {
            let layout = KvLayout::gqa(2, 2, 3).with_dtype(dtype);
            let mut a = KvStore::new(layout.clone(), 16);
            a.fill(0.75);
            let mut block = Vec::new();
            a.read_slots(4, 4, &mut block);
            assert_eq!(block.len(), 4 * layout.bytes_per_token());
            let mut b = KvStore::new(layout, 16);
            b.write_slots(8, 4, &block).expect("right length");
            let mut again = Vec::new();
            b.read_slots(8, 4, &mut again);
            assert_eq!(again, block, "{dtype:?}");
            let mut zero = Vec::new();
            b.read_slots(0, 4, &mut zero);
            assert!(zero.iter().all(|&x| x == 0), "other slots untouched");
            assert!(b.write_slots(8, 3, &block).is_err());
        }
    }

    /// `fill` writes every slot of every layer and component, in the store's dtype.
    #[test]
    fn fill_writes_every_element() {
        let mut f16 = KvStore::new(KvLayout::gqa(2, 1, 3).with_dtype(KvDtype::F16), 5);
        f16.fill(0.5);
        for layer in 0..2 {
            let (k, v) = f16.pair_mut_f16(layer);
            assert!(k.iter().chain(v.iter()).all(|&h| sparrow_cpu::half::f16_to_f32(h) == 0.5));
            assert_eq!(k.len(), 15);
        }
        let mut f32 = KvStore::new(KvLayout::gqa(1, 2, 2), 4);
        f32.fill(-1.25);
        assert!((0..2).all(|c| f32.component(0, c).iter().all(|&x| x == -1.25)));
    }
}
