//! The hierarchical cache's file tier (SGLang's HiCache with `--hicache-storage-backend file`,
//! `mem_cache/hiradix_cache.py` and `hicache_storage.py`'s `HiCacheFile`).
//!
//! Radix-cache pages are kept beyond the KV pool as one file per page, a *block*, named by
//! the page's chain hash: `h(page i) = xxh3(tokens of page i, seed = h(page i − 1))`, with the
//! root seeded by the [`fingerprint`] of the model and KV layout, so a block is found only by
//! a prompt that has the same tokens in every page before it, on the same model and layout.
//! A block holds a header (magic, version, fingerprint, its hash and its parent's, the page's
//! tokens, the payload's length and xxh3, the header's own xxh3) and the page's KV as stored
//! ([`KvStore::read_slots`](super::KvStore::read_slots): every layer and component, the
//! cache's dtype). Files are written to a temporary name and renamed, so a reader never sees a
//! partial block.
//!
//! The tier has its own byte budget and LRU order. On start-up the directory is scanned: a
//! block of another model or layout, a truncated or corrupt header is skipped (counted,
//! logged), never served; a payload is checked again when it is loaded. All file I/O runs on
//! one helper thread: the engine thread queues writes and reads, and picks finished reads up
//! between steps (a prompt's blocks are read as soon as it is queued, overlapped with the
//! steps before its admission).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::io::Read;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

mod block;

#[cfg(test)]
use block::first_hash;
use block::{block_path, check_block, BadHeader, Header, SUFFIX};
pub use block::{chain_hash, fingerprint};

/// When a radix page is written to the file tier (SGLang's `--hicache-write-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritePolicy {
    /// As soon as the page enters the radix cache (SGLang's default): the tier survives a
    /// restart with everything the server computed.
    WriteThrough,
    /// Only when the radix cache evicts the page.
    WriteBack,
}

/// `--enable-hierarchical-cache` and its flags.
#[derive(Debug, Clone, PartialEq)]
pub struct HiCacheArgs {
    /// Directory of the tier's block files.
    pub dir: PathBuf,
    /// Byte budget (`--hicache-size` GB); `None`: `ratio` times the KV pool's bytes.
    pub size_bytes: Option<u64>,
    /// `--hicache-ratio` (the tier's size over the KV pool's).
    pub ratio: f64,
    /// `--hicache-write-policy`.
    pub write_policy: WritePolicy,
}

/// The tier's byte budget: `--hicache-size`, else `--hicache-ratio` times the pool's bytes.
fn budget(args: &HiCacheArgs, pool_bytes: u64) -> u64 {
    args.size_bytes.unwrap_or((args.ratio * pool_bytes as f64) as u64).max(1)
}

/// Work for the I/O thread.
enum Job {
    Write { hash: u64, block: Vec<u8> },
    Delete { hash: u64 },
    Read { hash: u64 },
}

/// What the I/O thread reports.
enum Done {
    Read { hash: u64, result: Result<Vec<u8>, String> },
    Written,
    WriteFailed { hash: u64, why: String },
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    last: u64,
}

/// Counters of the tier (reported in [`crate::scheduler::SchedulerStats`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct TierStats {
    /// Pages written (on disk, renamed into place).
    pub writes: u64,
    /// Pages loaded back into the KV pool.
    pub loads: u64,
    /// Blocks skipped (corrupt, truncated, another model or layout, unreadable) or not
    /// written (a full disk).
    pub bad: u64,
    /// Bytes held, writes still queued included (what the budget counts).
    pub bytes: u64,
}

/// The tier: the index of its blocks, the loads waiting to be copied in, the I/O thread.
pub struct DiskTier {
    dir: PathBuf,
    fingerprint: u64,
    page_size: usize,
    page_bytes: usize,
    budget: u64,
    policy: WritePolicy,
    index: HashMap<u64, Entry>,
    /// `(last access, hash)` of every block in `index`: the LRU order, oldest first.
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
    /// Reads finished and checked, not yet copied into the pool, with the clock they came in at.
    loaded: HashMap<u64, (Arc<Vec<u8>>, u64)>,
    inflight: HashSet<u64>,
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Done>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Counters.
    pub stats: TierStats,
    logged: u64,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.dir)
            .field("blocks", &self.index.len())
            .field("budget", &self.budget)
            .finish()
    }
}

/// What [`DiskTier::open`] found in the directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScanReport {
    /// Blocks of this model and layout, now hits again.
    pub reopened: usize,
    /// Blocks of another model, KV layout or page size: ignored (left in place).
    pub foreign: usize,
    /// Blocks whose header is truncated or corrupt: ignored and removed.
    pub corrupt: usize,
}

impl DiskTier {
    /// Opens (creating) the tier's directory, scans the blocks already there and starts the
    /// I/O thread. `page_bytes` is one page's KV; `pool_bytes` the KV pool's (the budget is
    /// `args.size_bytes` or `args.ratio × pool_bytes`).
    ///
    /// # Errors
    /// The directory cannot be created or listed, or the thread cannot start.
    pub fn open(
        args: &HiCacheArgs,
        fingerprint: u64,
        page_size: usize,
        page_bytes: usize,
        pool_bytes: u64,
    ) -> Result<(DiskTier, ScanReport), String> {
        let dir = std::path::absolute(&args.dir).unwrap_or_else(|_| args.dir.clone());
        if dir.exists() && !dir.is_dir() {
            return Err(format!("hicache directory {}: exists and is not a directory", dir.display()));
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("hicache directory {}: {e}", dir.display()))?;
        // A directory that cannot be written would fail every write later, silently to the
        // client: say so at start-up.
        let probe = dir.join(format!(".probe-{}.tmp", std::process::id()));
        std::fs::write(&probe, b"sparrow")
            .and_then(|()| std::fs::remove_file(&probe))
            .map_err(|e| format!("hicache directory {} is not writable: {e}", dir.display()))?;
        let budget = budget(args, pool_bytes);
        let block = (Header::len(page_size) + page_bytes) as u64;
        if budget < block {
            return Err(format!(
                "the tier's budget of {budget} bytes holds no page ({block} bytes each); raise --hicache-size or \
                 --hicache-ratio"
            ));
        }
        let mut report = ScanReport::default();
        let mut found: Vec<(u64, u64, std::time::SystemTime)> = Vec::new();
        let listing = std::fs::read_dir(&dir).map_err(|e| format!("hicache directory {}: {e}", dir.display()))?;
        let hlen = Header::len(page_size);
        for e in listing.flatten() {
            let path = e.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.ends_with(".tmp") {
                // A write cut short by a crash.
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(&format!(".{SUFFIX}")) else { continue };
            let Ok(hash) = u64::from_str_radix(stem, 16) else { continue };
            let mut head = vec![0u8; hlen];
            let read = std::fs::File::open(&path).and_then(|mut f| {
                let n = f.read(&mut head)?;
                Ok((n, f.metadata()?))
            });
            let (n, meta) = match read {
                Ok(r) => r,
                Err(_) => {
                    report.corrupt += 1;
                    continue;
                }
            };
            match Header::decode(&head[..n], page_size) {
                Ok(h) if h.fingerprint != fingerprint => report.foreign += 1,
                Ok(h) if h.hash != hash || h.payload_len != page_bytes as u64 => {
                    report.corrupt += 1;
                    let _ = std::fs::remove_file(&path);
                }
                Ok(_) => found.push((hash, meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH))),
                Err(BadHeader::Foreign(_)) => report.foreign += 1,
                Err(BadHeader::Corrupt(_)) => {
                    report.corrupt += 1;
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        // Oldest first: the LRU order of the last run, as far as file times tell.
        found.sort_by_key(|f| f.2);
        report.reopened = found.len();
        let (jtx, jrx) = mpsc::channel::<Job>();
        let (dtx, drx) = mpsc::channel::<Done>();
        let io_dir = dir.clone();
        let thread = std::thread::Builder::new()
            .name("sparrow-hicache".into())
            .spawn(move || io_loop(io_dir, fingerprint, page_size, page_bytes, jrx, dtx))
            .map_err(|e| format!("cannot spawn the hicache I/O thread: {e}"))?;
        let mut t = DiskTier {
            dir,
            fingerprint,
            page_size,
            page_bytes,
            budget,
            policy: args.write_policy,
            index: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
            loaded: HashMap::new(),
            inflight: HashSet::new(),
            jobs: Some(jtx),
            done: drx,
            thread: Some(thread),
            stats: TierStats { bad: report.corrupt as u64, ..Default::default() },
            logged: 0,
        };
        for (hash, bytes, _) in found {
            t.add_entry(hash, bytes);
        }
        t.fit_budget(0);
        Ok((t, report))
    }

    /// The byte budget (`--hicache-size`, else `--hicache-ratio` times the pool's bytes).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The write policy.
    pub fn policy(&self) -> WritePolicy {
        self.policy
    }

    /// The root seed of the chain hashes ([`fingerprint`]).
    pub fn seed(&self) -> u64 {
        self.fingerprint
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when the tier holds no block.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// True when the block `hash` is held (written or being written).
    pub fn contains(&self, hash: u64) -> bool {
        self.index.contains_key(&hash)
    }

    /// The chain hashes of the pages of `tokens` (whole pages, after the page hashed `parent`)
    /// the tier holds, from the first, up to the first it does not.
    pub fn continuation(&mut self, mut parent: u64, tokens: &[u32]) -> Vec<u64> {
        self.clock += 1;
        let mut out = Vec::new();
        for page in tokens.chunks_exact(self.page_size) {
            let h = chain_hash(parent, page);
            let Some(e) = self.index.get_mut(&h) else { break };
            self.lru.remove(&(e.last, h));
            e.last = self.clock;
            self.lru.insert((e.last, h));
            out.push(h);
            parent = h;
        }
        out
    }

    /// Queues the reads of `hashes` not loaded or in flight yet.
    pub fn prefetch(&mut self, hashes: &[u64]) {
        for &h in hashes {
            if self.loaded.contains_key(&h) || self.inflight.contains(&h) || !self.index.contains_key(&h) {
                continue;
            }
            if let Some(j) = &self.jobs {
                if j.send(Job::Read { hash: h }).is_ok() {
                    self.inflight.insert(h);
                }
            }
        }
    }

    /// The payloads of the longest loaded prefix of `hashes`, once none of that prefix is in
    /// flight (`None` while some still is: the caller tries again later). With `wait`, blocks
    /// until the reads are done. Reads are queued for the blocks not asked for yet.
    pub fn take(&mut self, hashes: &[u64], wait: bool) -> Option<Vec<Arc<Vec<u8>>>> {
        self.prefetch(hashes);
        loop {
            let waiting = wait && hashes.iter().any(|h| self.inflight.contains(h));
            if !self.poll(waiting) && waiting {
                // The I/O thread stopped answering: what is in flight is given up.
                hashes.iter().for_each(|h| {
                    self.inflight.remove(h);
                });
            }
            let mut out = Vec::new();
            for h in hashes {
                if self.inflight.contains(h) {
                    if wait {
                        break;
                    }
                    return None;
                }
                match self.loaded.get(h) {
                    Some((p, _)) => out.push(p.clone()),
                    None => return Some(out),
                }
            }
            if out.len() == hashes.len() || !wait {
                return Some(out);
            }
        }
    }

    /// Forgets loaded payloads once copied into the pool.
    pub fn consumed(&mut self, hashes: &[u64]) {
        for h in hashes {
            self.loaded.remove(h);
        }
        self.stats.loads += hashes.len() as u64;
    }

    /// Picks up finished I/O (blocking for one report when `block`): checked reads become
    /// loadable, failed ones and failed writes leave the index (counted, logged). Loaded
    /// payloads nobody took within 10,000 polls are dropped. Returns false when `block` waited
    /// 10 s for nothing.
    pub fn poll(&mut self, block: bool) -> bool {
        let mut first = block;
        let mut got = !block;
        loop {
            let d = if first {
                first = false;
                match self.done.recv_timeout(std::time::Duration::from_secs(10)) {
                    Ok(d) => {
                        got = true;
                        d
                    }
                    Err(_) => break,
                }
            } else {
                match self.done.try_recv() {
                    Ok(d) => d,
                    Err(_) => break,
                }
            };
            match d {
                Done::Read { hash, result } => {
                    self.inflight.remove(&hash);
                    match result {
                        Ok(p) => {
                            self.loaded.insert(hash, (Arc::new(p), self.clock));
                        }
                        Err(why) => {
                            self.stats.bad += 1;
                            self.log(format!("block {hash:016x} skipped: {why}"));
                            self.drop_entry(hash, true);
                        }
                    }
                }
                Done::Written => self.stats.writes += 1,
                Done::WriteFailed { hash, why } => {
                    self.stats.bad += 1;
                    self.log(format!("block {hash:016x} not written: {why}"));
                    // Nothing was left on disk (the temporary file is removed).
                    self.drop_entry(hash, false);
                }
            }
        }
        self.clock += 1;
        let now = self.clock;
        self.loaded.retain(|_, (_, t)| now - *t < 10_000);
        got
    }

    /// Queues the write of one page: its tokens, its chain hash and its parent's, and its KV
    /// (`page_bytes` long). Makes room under the budget by dropping the least recently used
    /// blocks first.
    pub fn write(&mut self, hash: u64, parent: u64, tokens: &[u32], payload: Vec<u8>) {
        if self.index.contains_key(&hash) || payload.len() != self.page_bytes {
            return;
        }
        let header = Header {
            fingerprint: self.fingerprint,
            hash,
            parent,
            tokens: tokens.to_vec(),
            payload_len: payload.len() as u64,
            payload_sum: xxh3_64(&payload),
        };
        let mut block = header.encode();
        block.extend_from_slice(&payload);
        let bytes = block.len() as u64;
        if bytes > self.budget {
            return;
        }
        self.fit_budget(bytes);
        let Some(j) = &self.jobs else { return };
        if j.send(Job::Write { hash, block }).is_ok() {
            self.add_entry(hash, bytes);
        }
    }

    /// Indexes a block of `bytes` as the most recently used.
    fn add_entry(&mut self, hash: u64, bytes: u64) {
        self.clock += 1;
        self.index.insert(hash, Entry { bytes, last: self.clock });
        self.lru.insert((self.clock, hash));
        self.stats.bytes += bytes;
    }

    /// Drops least recently used blocks until `extra` more bytes fit the budget.
    fn fit_budget(&mut self, extra: u64) {
        if self.stats.bytes + extra <= self.budget {
            return;
        }
        while self.stats.bytes + extra > self.budget {
            let Some(&(_, h)) = self.lru.first() else { break };
            self.drop_entry(h, true);
        }
    }

    fn drop_entry(&mut self, hash: u64, delete: bool) {
        if let Some(e) = self.index.remove(&hash) {
            self.lru.remove(&(e.last, hash));
            self.stats.bytes -= e.bytes;
            if delete {
                if let Some(j) = &self.jobs {
                    let _ = j.send(Job::Delete { hash });
                }
            }
        }
        self.loaded.remove(&hash);
    }

    /// One log line per problem for the first 20, then every 1000th (a full disk repeats).
    fn log(&mut self, line: String) {
        self.logged += 1;
        if self.logged <= 20 || self.logged.is_multiple_of(1000) {
            eprintln!("hicache: {line} ({} problems so far)", self.logged);
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // Closing the queue lets the thread finish the writes already queued, then end.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn io_loop(
    dir: PathBuf,
    fingerprint: u64,
    page_size: usize,
    page_bytes: usize,
    jobs: mpsc::Receiver<Job>,
    done: mpsc::Sender<Done>,
) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        // Reads first: a request waits on them, nobody waits on a write.
        while let Ok(j) = jobs.try_recv() {
            match j {
                Job::Read { .. } => pending.push_front(j),
                _ => pending.push_back(j),
            }
        }
        let job = match pending.pop_front() {
            Some(j) => j,
            None => match jobs.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
        };
        match job {
            Job::Write { hash, block } => {
                let path = block_path(&dir, hash);
                let tmp = path.with_extension("tmp");
                let r = std::fs::write(&tmp, &block).and_then(|()| std::fs::rename(&tmp, &path));
                let report = match r {
                    Ok(()) => Done::Written,
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        Done::WriteFailed { hash, why: e.to_string() }
                    }
                };
                let _ = done.send(report);
            }
            Job::Delete { hash } => {
                let _ = std::fs::remove_file(block_path(&dir, hash));
            }
            Job::Read { hash } => {
                // A read may overtake the write of its own block: it is answered from the
                // queued write then.
                let queued = pending.iter().find_map(|j| match j {
                    Job::Write { hash: h, block } if *h == hash => Some(block),
                    _ => None,
                });
                let result = match queued {
                    Some(b) => check_block(b, hash, fingerprint, page_size, page_bytes),
                    None => std::fs::read(block_path(&dir, hash))
                        .map_err(|e| e.to_string())
                        .and_then(|b| check_block(&b, hash, fingerprint, page_size, page_bytes)),
                };
                if done.send(Done::Read { hash, result }).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use xxhash_rust::xxh3::xxh3_64_with_seed;

    fn args(dir: &Path) -> HiCacheArgs {
        HiCacheArgs {
            dir: dir.to_path_buf(),
            size_bytes: Some(1 << 20),
            ratio: 2.0,
            write_policy: WritePolicy::WriteThrough,
        }
    }

    /// The chain hash is xxh3 of the little-endian tokens seeded by the parent: the same
    /// value as hashing the bytes at once.
    #[test]
    fn chain_hash_is_xxh3_of_the_tokens_after_the_parent() {
        let toks: Vec<u32> = (0..100u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(chain_hash(7, &toks), xxh3_64_with_seed(&bytes, 7));
        assert_ne!(first_hash(7, &toks), first_hash(8, &toks));
    }

    /// Written blocks are found again by a reopened tier and load back byte for byte; a
    /// flipped payload byte, a truncated file and a tier of another fingerprint are skipped.
    #[test]
    fn blocks_survive_a_reopen_and_bad_ones_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ps, pb) = (4, 64);
        let toks: Vec<u32> = (0..12).collect();
        let payload = |i: u8| vec![i; pb];
        let hashes = {
            let (mut t, rep) = DiskTier::open(&args(dir.path()), 11, ps, pb, 1 << 20).expect("open");
            assert_eq!(rep, ScanReport::default());
            let mut parent = t.seed();
            let mut hs = Vec::new();
            for (i, page) in toks.chunks(ps).enumerate() {
                let h = chain_hash(parent, page);
                t.write(h, parent, page, payload(i as u8));
                hs.push(h);
                parent = h;
            }
            hs
        };
        let (mut t, rep) = DiskTier::open(&args(dir.path()), 11, ps, pb, 1 << 20).expect("reopen");
        assert_eq!(rep.reopened, 3);
        let seed = t.seed();
        let found = t.continuation(seed, &toks);
        assert_eq!(found, hashes);
        let got = t.take(&found, true).expect("waited");
        assert_eq!(got.iter().map(|p| p[0]).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(got.iter().all(|p| p.len() == pb));
        drop(t);
        // Flip a payload byte of the second block, truncate the third.
        let p1 = block_path(dir.path(), hashes[1]);
        let mut b = std::fs::read(&p1).expect("read");
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(&p1, b).expect("write");
        let p2 = block_path(dir.path(), hashes[2]);
        let b = std::fs::read(&p2).expect("read");
        std::fs::write(&p2, &b[..b.len() - 10]).expect("write");
        let (mut t, _) = DiskTier::open(&args(dir.path()), 11, ps, pb, 1 << 20).expect("reopen");
        let found = t.continuation(seed, &toks);
        let got = t.take(&found, true).expect("waited");
        assert_eq!(got.len(), 1, "only the first block is good");
        assert_eq!(t.stats.bad, 2);
        drop(t);
        // A file with a block's name and no block in it is removed at start-up.
        let junk = block_path(dir.path(), 0xdead_beef);
        std::fs::write(&junk, vec![7u8; 5000]).expect("write");
        let (_, rep) = DiskTier::open(&args(dir.path()), 11, ps, pb, 1 << 20).expect("reopen");
        assert_eq!((rep.corrupt, rep.foreign), (1, 0));
        assert!(!junk.exists());
        // Another model: nothing matches, every block is foreign.
        let (mut t, rep) = DiskTier::open(&args(dir.path()), 12, ps, pb, 1 << 20).expect("reopen");
        assert_eq!((rep.reopened, rep.foreign), (0, 1));
        let s = t.seed();
        assert!(t.continuation(s, &toks).is_empty());
    }

    /// The fingerprint follows the weights, not the path: a renamed copy keeps it, one changed
    /// byte (in the first or last MiB) or another KV layout or page size changes it.
    #[test]
    fn the_fingerprint_follows_weights_layout_and_page_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let (a, b, c) = (dir.path().join("a.gguf"), dir.path().join("copy.gguf"), dir.path().join("c.gguf"));
        std::fs::write(&a, &bytes).expect("write");
        std::fs::write(&b, &bytes).expect("write");
        let mut changed = bytes.clone();
        changed[2_999_000] ^= 1;
        std::fs::write(&c, &changed).expect("write");
        let l = super::super::KvLayout::gqa(2, 2, 4);
        let fp = |p: &Path, l: &crate::kv::KvLayout, ps| fingerprint(p, l, ps);
        assert_eq!(fp(&a, &l, 16), fp(&b, &l, 16));
        assert_ne!(fp(&a, &l, 16), fp(&c, &l, 16));
        assert_ne!(fp(&a, &l, 16), fp(&a, &l, 1));
        assert_ne!(fp(&a, &l, 16), fp(&a, &l.clone().with_dtype(super::super::KvDtype::F16), 16));
    }

    /// The byte budget drops the least recently used blocks.
    #[test]
    fn the_budget_keeps_the_most_recent_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ps, pb) = (2, 100);
        let one = (Header::len(ps) + pb) as u64;
        let a = HiCacheArgs { size_bytes: Some(3 * one), ..args(dir.path()) };
        let (mut t, _) = DiskTier::open(&a, 1, ps, pb, 0).expect("open");
        for i in 0..5u32 {
            t.write(chain_hash(1, &[i, i]), 1, &[i, i], vec![i as u8; pb]);
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.stats.bytes, 3 * one);
        assert!(t.contains(chain_hash(1, &[4, 4])) && !t.contains(chain_hash(1, &[0, 0])));
    }
}
