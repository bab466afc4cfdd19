//! Radix prefix cache over KV pages.
//!
//! Follows the contract of SGLang's `RadixCache` (`mem_cache/radix_cache.py`) and
//! mini-sglang's `kvcache/base.py`: `match_prefix` finds the longest cached prefix and changes
//! nothing but access times; the caller `lock`s the returned node before using its slots (a
//! lock pins the whole path to the root) and `unlock`s it when done; `insert` adopts a finished
//! request's pages, returning the ones already cached so the caller frees them; `evict(n)` frees
//! least-recently-used unlocked leaves until `n` pages are free (it may free more than asked
//! once a whole leaf goes). Sizes are split into evictable and protected pages.
//!
//! Edges are whole pages (`page_size` tokens), as in SGLang with `page_size > 1`: a page is
//! shared only when all of its tokens match, so a prefix match is always page-aligned.
//!
//! With a tier attached ([`RadixCache::attach_tier`]), every node carries the chain hash of
//! its path ([`super::hicache::chain_hash`]), the key of its page in the hierarchical cache's
//! file tier, and the cache records the pages it adopts (write-through) or evicts (write-back)
//! as [`Spill`]s for the scheduler to write out before the next forward overwrites a freed
//! page.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::kv::PageAllocator;

const ROOT: usize = 0;

#[derive(Debug)]
struct Node {
    parent: usize,
    key: Box<[u32]>,
    page: u32,
    children: HashMap<Box<[u32]>, usize>,
    lock_ref: u32,
    last_access: u64,
    hash: u64,
    /// A hybrid model's saved state after this node's last token (a checkpoint index of the
    /// state pool, [`crate::kv::state`]).
    state: Option<u32>,
}

/// A page to write to the file tier: its chain hash, its parent's, its tokens and where its
/// KV is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spill {
    /// Chain hash of the page's path.
    pub hash: u64,
    /// Chain hash of the parent's path (the tier's seed for a first page).
    pub parent: u64,
    /// The page's tokens.
    pub tokens: Box<[u32]>,
    /// The KV page holding it (valid until the next forward).
    pub page: u32,
}

/// A prefix match: the deepest node reached and the pages of the matched tokens in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Node to lock while the pages are in use.
    pub node: usize,
    /// Pages covering positions `0 .. pages.len() · page_size`.
    pub pages: Vec<u32>,
    /// With saved states ([`RadixCache::with_states`]): the checkpoint holding the state after
    /// the match's last token (the match ends at the deepest node that has one); `None`
    /// otherwise.
    pub state: Option<u32>,
}

/// The cache. Node 0 is the root (no page).
#[derive(Debug)]
pub struct RadixCache {
    page_size: usize,
    nodes: Vec<Option<Node>>,
    free_ids: Vec<usize>,
    clock: u64,
    evictable: usize,
    protected: usize,
    record_inserts: bool,
    record_evictions: bool,
    spills: Vec<Spill>,
    /// Saved-state checkpoints not in use (with states).
    free_states: Vec<u32>,
    /// Checkpoints in all (0: a cache without states).
    num_states: usize,
}

impl RadixCache {
    /// An empty cache for pages of `page_size` tokens.
    pub fn new(page_size: usize) -> Self {
        let root = Node {
            parent: ROOT,
            key: Box::new([]),
            page: 0,
            children: HashMap::new(),
            lock_ref: 1,
            last_access: 0,
            hash: 0,
            state: None,
        };
        RadixCache {
            page_size,
            nodes: vec![Some(root)],
            free_ids: Vec::new(),
            clock: 0,
            evictable: 0,
            protected: 0,
            record_inserts: false,
            record_evictions: false,
            spills: Vec::new(),
            free_states: Vec::new(),
            num_states: 0,
        }
    }

    /// A cache that also keeps a hybrid model's saved states, `checkpoints` of them: a match
    /// goes only as far as the deepest node with a saved state (a prefix of a recurrent model
    /// is only a hit with its state), as SGLang's `MambaRadixCache` matches.
    pub fn with_states(page_size: usize, checkpoints: usize) -> Self {
        let mut c = Self::new(page_size);
        c.free_states = (0..checkpoints as u32).rev().collect();
        c.num_states = checkpoints;
        c
    }

    /// Saved states held by nodes (not free, not reserved by a request).
    pub fn states_held(&self) -> usize {
        self.nodes.iter().flatten().filter(|n| n.state.is_some()).count()
    }

    /// Checkpoints free.
    pub fn states_free(&self) -> usize {
        self.free_states.len()
    }

    /// A free checkpoint for a state to be saved: a free one, or the least recently used saved
    /// state of a node no running request holds (its pages stay); `None` when every checkpoint
    /// is in use.
    pub fn reserve_state(&mut self) -> Option<u32> {
        if let Some(c) = self.free_states.pop() {
            return Some(c);
        }
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
            .filter(|(_, n)| n.state.is_some() && n.lock_ref == 0)
            .min_by_key(|(_, n)| n.last_access)
            .map(|(id, _)| id)?;
        self.node_mut(victim).state.take()
    }

    /// Gives checkpoint `c` back.
    pub fn release_state(&mut self, c: u32) {
        debug_assert!(!self.free_states.contains(&c), "checkpoint {c} freed twice");
        self.free_states.push(c);
    }

    /// Attaches checkpoint `c` as the state after `tokens` (a cached, page-aligned prefix).
    /// Returns false, keeping nothing, when no node ends there or it already has a state (the
    /// caller gives `c` back).
    pub fn attach_state(&mut self, tokens: &[u32], c: u32) -> bool {
        if tokens.is_empty() || !tokens.len().is_multiple_of(self.page_size) {
            return false;
        }
        let Some(node) = self.node_at(tokens) else { return false };
        let n = self.node_mut(node);
        if n.state.is_some() {
            return false;
        }
        n.state = Some(c);
        true
    }

    /// Whether a state is saved after `tokens`.
    pub fn has_state(&self, tokens: &[u32]) -> bool {
        self.node_at(tokens).is_some_and(|n| n != ROOT && self.node(n).state.is_some())
    }

    /// The node that ends after `tokens` (whole pages), when the tree has that path.
    fn node_at(&self, tokens: &[u32]) -> Option<usize> {
        tokens.chunks_exact(self.page_size).try_fold(ROOT, |node, key| self.node(node).children.get(key).copied())
    }

    /// Seeds the chain hashes with the tier's `seed` and starts recording the pages adopted
    /// (`write_through`) or evicted (otherwise) as [`Spill`]s. Call on an empty cache.
    pub fn attach_tier(&mut self, seed: u64, write_through: bool) {
        debug_assert!(self.total_pages() == 0, "attach the tier before any page is cached");
        self.node_mut(ROOT).hash = seed;
        self.record_inserts = write_through;
        self.record_evictions = !write_through;
    }

    /// The pages recorded since the last call.
    pub fn take_spills(&mut self) -> Vec<Spill> {
        std::mem::take(&mut self.spills)
    }

    /// Every cached page as a [`Spill`], parents before children (a write-back tier's pages at
    /// shutdown).
    pub fn all_spills(&self) -> Vec<Spill> {
        let mut out = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let n = self.node(id);
            for &c in n.children.values() {
                let child = self.node(c);
                out.push(Spill { hash: child.hash, parent: n.hash, tokens: child.key.clone(), page: child.page });
                stack.push(c);
            }
        }
        out
    }

    /// The chain hash of `node`'s path (the tier's seed for the root).
    pub fn hash_of(&self, node: usize) -> u64 {
        self.node(node).hash
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("live radix node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("live radix node")
    }

    /// Pages held by unlocked nodes (freeable by [`RadixCache::evict`]).
    pub fn evictable_pages(&self) -> usize {
        self.evictable
    }

    /// Pages held by locked nodes.
    pub fn protected_pages(&self) -> usize {
        self.protected
    }

    /// Pages held in all.
    pub fn total_pages(&self) -> usize {
        self.evictable + self.protected
    }

    /// Longest cached prefix of `tokens` made of whole pages, at most `max_pages` pages.
    pub fn match_prefix(&mut self, tokens: &[u32], max_pages: usize) -> PrefixMatch {
        self.clock += 1;
        let now = self.clock;
        let mut node = ROOT;
        let mut pages = Vec::new();
        // With states: the deepest node on the path that has one, and its depth.
        let mut saved = (ROOT, 0, None);
        for key in tokens.chunks_exact(self.page_size).take(max_pages) {
            let Some(&child) = self.node(node).children.get(key) else { break };
            node = child;
            let n = self.node_mut(node);
            n.last_access = now;
            pages.push(n.page);
            if n.state.is_some() {
                saved = (node, pages.len(), n.state);
            }
        }
        if self.num_states > 0 {
            pages.truncate(saved.1);
            return PrefixMatch { node: saved.0, pages, state: saved.2 };
        }
        PrefixMatch { node, pages, state: None }
    }

    /// Pins `node` and its ancestors.
    pub fn lock(&mut self, mut node: usize) {
        while node != ROOT {
            let n = self.node_mut(node);
            n.lock_ref += 1;
            let parent = n.parent;
            if n.lock_ref == 1 {
                self.evictable -= 1;
                self.protected += 1;
            }
            node = parent;
        }
    }

    /// Releases a [`RadixCache::lock`].
    pub fn unlock(&mut self, mut node: usize) {
        while node != ROOT {
            let n = self.node_mut(node);
            debug_assert!(n.lock_ref > 0, "unlock of an unlocked radix node");
            n.lock_ref -= 1;
            let parent = n.parent;
            if n.lock_ref == 0 {
                self.evictable += 1;
                self.protected -= 1;
            }
            node = parent;
        }
    }

    /// Adopts the pages of `tokens` (`pages.len() · page_size` tokens, page `i` holding
    /// positions `i·page_size ..`). Returns the pages the caller must free: those whose contents
    /// were already cached under another page.
    pub fn insert(&mut self, tokens: &[u32], pages: &[u32]) -> Vec<u32> {
        debug_assert_eq!(tokens.len(), pages.len() * self.page_size);
        self.clock += 1;
        let now = self.clock;
        let mut dup = Vec::new();
        let mut node = ROOT;
        for (key, &page) in tokens.chunks_exact(self.page_size).zip(pages) {
            if let Some(&child) = self.node(node).children.get(key) {
                let c = self.node_mut(child);
                c.last_access = now;
                if c.page != page {
                    dup.push(page);
                }
                node = child;
                continue;
            }
            let id = self.free_ids.pop().unwrap_or(self.nodes.len());
            let parent_hash = self.node(node).hash;
            // Only a tier reads the chain hashes: without one, inserting hashes nothing.
            let tiered = self.record_inserts || self.record_evictions;
            let hash = if tiered { super::hicache::chain_hash(parent_hash, key) } else { 0 };
            if self.record_inserts {
                self.spills.push(Spill { hash, parent: parent_hash, tokens: key.into(), page });
            }
            let new = Node {
                parent: node,
                key: key.into(),
                page,
                children: HashMap::new(),
                lock_ref: 0,
                last_access: now,
                hash,
                state: None,
            };
            if id == self.nodes.len() {
                self.nodes.push(Some(new));
            } else {
                self.nodes[id] = Some(new);
            }
            self.node_mut(node).children.insert(key.into(), id);
            self.evictable += 1;
            node = id;
        }
        dup
    }

    /// Frees least-recently-used unlocked leaves into `alloc` until it has `want_free` free
    /// pages or nothing is evictable. Returns the pages freed.
    pub fn evict(&mut self, want_free: usize, alloc: &mut PageAllocator) -> usize {
        if alloc.free_pages() >= want_free || self.evictable == 0 {
            return 0;
        }
        let mut heap: BinaryHeap<Reverse<(u64, usize)>> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, n)| n.as_ref().map(|n| (id, n)))
            .filter(|(id, n)| *id != ROOT && n.lock_ref == 0 && n.children.is_empty())
            .map(|(id, n)| Reverse((n.last_access, id)))
            .collect();
        let mut freed = 0;
        while alloc.free_pages() < want_free {
            let Some(Reverse((_, id))) = heap.pop() else { break };
            let Some(n) = self.nodes[id].take() else { continue };
            if self.record_evictions {
                let parent = self.node(n.parent).hash;
                self.spills.push(Spill { hash: n.hash, parent, tokens: n.key.clone(), page: n.page });
            }
            alloc.release(n.page);
            if let Some(c) = n.state {
                self.free_states.push(c);
            }
            self.free_ids.push(id);
            self.evictable -= 1;
            freed += 1;
            let parent = self.node_mut(n.parent);
            parent.children.remove(&n.key);
            if n.parent != ROOT && parent.lock_ref == 0 && parent.children.is_empty() {
                heap.push(Reverse((parent.last_access, n.parent)));
            }
        }
        freed
    }

    /// Drops every unlocked page (SGLang's `/flush_cache`). Returns pages freed.
    pub fn flush(&mut self, alloc: &mut PageAllocator) -> usize {
        self.evict(usize::MAX, alloc)
    }

    /// Checks the size accounting against the tree (for tests and idle-time checks).
    ///
    /// # Errors
    /// A description of the first inconsistency.
    pub fn check(&self) -> Result<(), String> {
        let (mut ev, mut pr) = (0, 0);
        for (id, n) in self.nodes.iter().enumerate() {
            let Some(n) = n else { continue };
            if id == ROOT {
                continue;
            }
            if n.lock_ref == 0 {
                ev += 1;
            } else {
                pr += 1;
            }
            if self.node(n.parent).children.get(&n.key) != Some(&id) {
                return Err(format!("node {id} not linked from its parent"));
            }
            if n.children.values().any(|&c| self.node(c).lock_ref > n.lock_ref) {
                return Err(format!("node {id} has a child locked more than itself"));
            }
        }
        let mut states: Vec<u32> = self.nodes.iter().flatten().filter_map(|n| n.state).collect();
        states.extend(&self.free_states);
        let total = states.len();
        states.sort_unstable();
        states.dedup();
        if states.len() != total || states.iter().any(|&c| c as usize >= self.num_states.max(1)) && total > 0 {
            return Err(format!(
                "saved states: {total} held or free, {} distinct, of {}",
                states.len(),
                self.num_states
            ));
        }
        if (ev, pr) != (self.evictable, self.protected) {
            return Err(format!(
                "counted {ev}/{pr} evictable/protected, tracked {}/{}",
                self.evictable, self.protected
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_lock_insert_evict() {
        let mut alloc = PageAllocator::new(8, 2);
        let mut rc = RadixCache::new(2);
        let a: Vec<u32> = vec![1, 2, 3, 4, 5, 6];
        let pa: Vec<u32> = (0..3).map(|_| alloc.alloc().expect("page")).collect();
        assert!(rc.insert(&a, &pa).is_empty());
        assert_eq!(rc.evictable_pages(), 3);
        // A prompt sharing two pages and a half.
        let m = rc.match_prefix(&[1, 2, 3, 4, 5, 9, 9], usize::MAX);
        assert_eq!(m.pages, pa[..2]);
        rc.lock(m.node);
        assert_eq!((rc.evictable_pages(), rc.protected_pages()), (1, 2));
        // Eviction can take only the unlocked leaf.
        assert_eq!(rc.evict(usize::MAX, &mut alloc), 1);
        assert_eq!(alloc.free_pages(), 8 - 2);
        rc.unlock(m.node);
        rc.check().expect("consistent");
        // Re-inserting the same contents under new pages hands the new pages back.
        let pb: Vec<u32> = (0..2).map(|_| alloc.alloc().expect("page")).collect();
        assert_eq!(rc.insert(&[1, 2, 3, 4], &pb), pb);
        pb.iter().for_each(|&p| alloc.release(p));
        assert_eq!(rc.flush(&mut alloc), 2);
        assert_eq!(alloc.free_pages(), 8);
        rc.check().expect("consistent");
    }

    /// Seeded randomized invariant test (after TGI's radix allocator test): a tiny vocabulary
    /// forces sharing; pages are never lost or double-freed and accounting always matches.
    #[test]
    fn random_rounds_keep_accounting() {
        let mut seed = 99u64;
        let mut rnd = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            (seed >> 33) % m
        };
        for page_size in [1usize, 2, 4] {
            let mut alloc = PageAllocator::new(64, page_size);
            let mut rc = RadixCache::new(page_size);
            let mut held: Vec<(usize, Vec<u32>)> = Vec::new();
            for _ in 0..3000 {
                if rnd(3) == 0 && !held.is_empty() {
                    let (node, _) = held.swap_remove(rnd(held.len() as u64) as usize);
                    rc.unlock(node);
                } else {
                    let len = 1 + rnd(12) as usize;
                    let toks: Vec<u32> = (0..len * page_size).map(|_| rnd(2) as u32).collect();
                    let m = rc.match_prefix(&toks, usize::MAX);
                    rc.lock(m.node);
                    let need = len - m.pages.len();
                    rc.evict(need, &mut alloc);
                    if alloc.free_pages() < need {
                        rc.unlock(m.node);
                        continue;
                    }
                    let mut pages = m.pages.clone();
                    pages.extend((0..need).map(|_| alloc.alloc().expect("checked free")));
                    for p in rc.insert(&toks, &pages) {
                        alloc.release(p);
                    }
                    let m2 = rc.match_prefix(&toks, usize::MAX);
                    assert_eq!(m2.pages.len(), len);
                    rc.lock(m2.node);
                    rc.unlock(m.node);
                    held.push((m2.node, m2.pages));
                }
                rc.check().expect("consistent");
                assert_eq!(alloc.free_pages() + rc.total_pages(), 64);
            }
            for (node, _) in held.drain(..) {
                rc.unlock(node);
            }
            rc.flush(&mut alloc);
            assert_eq!(alloc.free_pages(), 64);
        }
    }
}
