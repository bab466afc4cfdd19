//! Unit tests of the hierarchical cache's file tier in the scheduler's cycle: pages written
//! through (or back) leave the pool, come back at admission, and survive a restart; the fake
//! model's recurrence lives in the KV, so a page loaded wrong or not at all changes the output.

use super::tests::{cfg, req};
use super::*;
use crate::kv::hicache::{fingerprint, DiskTier, HiCacheArgs};
use crate::testing::{FakeModel, Predict};

const PS: usize = 4;

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 11 + seed * 5) % 37).collect()
}

/// A scheduler of `pages` pages of [`PS`] tokens with a file tier in `dir`.
fn with_tier(dir: &std::path::Path, pages: usize, policy: WritePolicy, m: &FakeModel) -> (Scheduler, KvStore) {
    let c = SchedulerConfig { page_size: PS, ..cfg(pages, 512) };
    let layout = m.attention_needs().kv_layout;
    let args = HiCacheArgs { dir: dir.to_path_buf(), size_bytes: Some(1 << 24), ratio: 2.0, write_policy: policy };
    let fp = fingerprint(std::path::Path::new("fake-model"), &layout, PS);
    let (tier, _) = DiskTier::open(&args, fp, PS, PS * layout.bytes_per_token(), 0).expect("open");
    let mut s = Scheduler::new(c, None);
    s.attach_tier(tier);
    let kv = KvStore::new(layout, s.num_slots());
    (s, kv)
}

/// Runs one request to the end; returns its tokens and cached tokens, then lets the engine
/// thread's idle-time sync write its pages.
fn run(s: &mut Scheduler, m: &mut FakeModel, kv: &mut KvStore, id: u64, p: &[u32], n: usize) -> (Vec<u32>, usize) {
    s.submit(req(id, p.to_vec(), n)).expect("admissible");
    let (mut toks, mut cached) = (Vec::new(), 0);
    for _ in 0..10_000 {
        if s.is_idle() {
            break;
        }
        for o in s.step(m, kv) {
            match o {
                Output::Token { token, .. } => toks.push(token),
                Output::Finished { usage, .. } => cached = usage.cached_tokens,
                _ => {}
            }
        }
    }
    s.sync_tier(kv);
    (toks, cached)
}

/// Write-through: a prompt's pages reach the tier; after the radix cache is flushed, and
/// again after a restart on the same directory, the same prompt is a hit of every whole page
/// before its last token, loaded from the tier, with the output unchanged. A block with a
/// flipped byte is skipped there: the hit stops before it, the output is still right.
#[test]
fn write_through_pages_come_back_after_a_flush_and_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let p = prompt(41, 1);
    let want = m.reference(&p, 6, None, 4096).0;
    {
        let (mut s, mut kv) = with_tier(dir.path(), 200, WritePolicy::WriteThrough, &m);
        assert_eq!(run(&mut s, &mut m, &mut kv, 1, &p, 6), (want.clone(), 0));
        s.flush_cache();
        assert_eq!(s.cached_pages(), 0);
        assert_eq!(run(&mut s, &mut m, &mut kv, 2, &p, 6), (want.clone(), 40));
        assert_eq!(s.stats().storage_hit_tokens_total, 40);
        assert_eq!(s.stats().storage_load_pages_total, 10);
        s.check_pages().expect("pages accounted for");
    }
    let (mut s, mut kv) = with_tier(dir.path(), 200, WritePolicy::WriteThrough, &m);
    assert_eq!(run(&mut s, &mut m, &mut kv, 1, &p, 6), (want.clone(), 40), "a hit after the restart");
    drop(s);
    // Flip one byte of the payload of the block of tokens 20..24 (page 5).
    let target = {
        let mut parent = fingerprint(std::path::Path::new("fake-model"), &m.attention_needs().kv_layout, PS);
        for page in p.chunks_exact(PS).take(6) {
            parent = crate::kv::hicache::chain_hash(parent, page);
        }
        dir.path().join(format!("{parent:016x}.kvb"))
    };
    let mut b = std::fs::read(&target).expect("block written");
    let at = b.len() - 3;
    b[at] ^= 0x40;
    std::fs::write(&target, b).expect("write");
    let (mut s, mut kv) = with_tier(dir.path(), 200, WritePolicy::WriteThrough, &m);
    assert_eq!(run(&mut s, &mut m, &mut kv, 1, &p, 6), (want, 20), "the hit stops before the bad block");
    assert_eq!(s.stats().storage_bad_blocks_total, 1);
}

/// Write-back under a pool too small for the working set: pages go to the tier only as they
/// are evicted, and coming back from it, every request's output equals the run without a
/// tier, while the tier turns misses into hits.
#[test]
fn write_back_under_pressure_keeps_outputs_and_adds_hits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(30 + 3 * i, i as u32)).collect();
    let (mut s, mut kv) = with_tier(dir.path(), 24, WritePolicy::WriteBack, &m);
    let mut plain = Scheduler::new(SchedulerConfig { page_size: PS, ..cfg(24, 512) }, None);
    let mut pkv = KvStore::new(m.attention_needs().kv_layout, plain.num_slots());
    let (mut hits, mut plain_hits) = (0, 0);
    for round in 0..3 {
        for (i, p) in prompts.iter().enumerate() {
            let id = (round * 10 + i) as u64;
            let want = m.reference(p, 4, None, 4096).0;
            let (got, c) = run(&mut s, &mut m, &mut kv, id, p, 4);
            let (pgot, pc) = run(&mut plain, &mut m, &mut pkv, id, p, 4);
            assert_eq!((&got, &pgot), (&want, &want), "round {round} prompt {i}");
            hits += c;
            plain_hits += pc;
        }
    }
    assert!(s.stats().storage_write_pages_total > 0, "evicted pages were written");
    assert!(hits > plain_hits + 100, "the tier adds hits: {hits} vs {plain_hits}");
    s.check_pages().expect("pages accounted for");
}

/// Write-back writes nothing while the pool holds the pages; closing the tier at shutdown
/// writes every radix page, and a restarted scheduler's first request is a hit from them.
#[test]
fn write_back_pages_are_written_at_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let p = prompt(33, 3);
    let want = m.reference(&p, 5, None, 4096).0;
    let (mut s, mut kv) = with_tier(dir.path(), 200, WritePolicy::WriteBack, &m);
    assert_eq!(run(&mut s, &mut m, &mut kv, 1, &p, 5), (want.clone(), 0));
    assert_eq!(s.stats().storage_write_pages_total, 0, "nothing evicted, nothing written");
    assert_eq!(s.close_tier(&mut kv), 9, "33 + 5 - 1 computed positions: 9 whole pages");
    let (mut s, mut kv) = with_tier(dir.path(), 200, WritePolicy::WriteBack, &m);
    assert_eq!(run(&mut s, &mut m, &mut kv, 1, &p, 5), (want, 32));
}
