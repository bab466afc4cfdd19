//! The paged KV cache: token slots grouped into pages, a page allocator with free-page
//! accounting, and the per-layer storage, generic over what a model keeps per token.
//!
//! As in SGLang (`mem_cache/memory_pool.py`, `allocator.py`), a *slot* holds one token's cache
//! entry in every layer, a *page* is `page_size` consecutive slots (`slot = page · page_size +
//! offset`), and each request's `req_to_token` row maps its positions to slots. Page 0 is never
//! handed out, so a zeroed slot id is never a live entry.
//!
//! What a token stores per layer is a [`KvLayout`]: named components of fixed width in f32
//! (GQA keys and values today; an MLA latent `kv_lora_rank + qk_rope_head_dim` and a sparse
//! indexer key next).

/// One per-token, per-layer array of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvComponent {
    /// Name (for logs and capability checks), e.g. `"k"`, `"v"`, `"latent"`, `"index_k"`.
    pub name: &'static str,
    /// f32 values per token.
    pub width: usize,
}

/// What a model caches per token and layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub layers: usize,
    /// Components stored for each layer.
    pub components: Vec<KvComponent>,
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
        }
    }

    /// Bytes one token takes across all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.layers * self.components.iter().map(|c| c.width).sum::<usize>() * 4
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

/// Per-layer storage for a [`KvLayout`]: `data[layer][component]` is `num_slots × width` f32.
#[derive(Debug)]
pub struct KvStore {
    layout: KvLayout,
    data: Vec<Vec<Vec<f32>>>,
}

impl KvStore {
    /// Zeroed storage for `num_slots` slots. The allocation is lazy (the OS maps pages on first
    /// write), so a large budget costs memory only as it fills.
    pub fn new(layout: KvLayout, num_slots: usize) -> Self {
        let data = (0..layout.layers)
            .map(|_| layout.components.iter().map(|c| vec![0f32; c.width * num_slots]).collect())
            .collect();
        KvStore { layout, data }
    }

    /// The layout.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Component `c` of `layer` for all slots.
    pub fn component(&self, layer: usize, c: usize) -> &[f32] {
        &self.data[layer][c]
    }

    /// Mutable component `c` of `layer`.
    pub fn component_mut(&mut self, layer: usize, c: usize) -> &mut [f32] {
        &mut self.data[layer][c]
    }

    /// Two components of one layer, mutably (e.g. K and V).
    pub fn pair_mut(&mut self, layer: usize) -> (&mut [f32], &mut [f32]) {
        let (a, b) = self.data[layer].split_at_mut(1);
        (&mut a[0], &mut b[0])
    }
}
