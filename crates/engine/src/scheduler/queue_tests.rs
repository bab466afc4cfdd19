//! Unit tests of who waits and who goes first: fair prefill, priority with preemption, the
//! queue deadline. Outputs are checked against the fake model's recurrence computed alone.

use super::tests::{cfg, req};
use super::*;
use crate::config::{FairPrefill, PriorityConfig, QueueConfig};
use crate::testing::{FakeModel, Predict};

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + seed) % 37).collect()
}

/// Tokens and finish reasons by request, in finish order.
#[derive(Default)]
struct Seen {
    tokens: std::collections::BTreeMap<u64, Vec<u32>>,
    finished: Vec<(u64, FinishReason)>,
}

impl Seen {
    /// Steps once; returns the batch's new tokens per sequence.
    fn step(&mut self, s: &mut Scheduler, m: &mut FakeModel, kv: &mut KvStore) -> Vec<u32> {
        for o in s.step(m, kv) {
            match o {
                Output::Token { id, token, .. } => self.tokens.entry(id).or_default().push(token),
                Output::Finished { id, reason, .. } => self.finished.push((id, reason)),
                _ => {}
            }
        }
        s.last_batch().map(|b| b.seqs.iter().map(|q| q.extend_len).collect()).unwrap_or_default()
    }

    fn drain(&mut self, s: &mut Scheduler, m: &mut FakeModel, kv: &mut KvStore) {
        for _ in 0..10_000 {
            if s.is_idle() {
                return;
            }
            self.step(s, m, kv);
        }
        panic!("no progress");
    }
}

/// A short request that arrives while a long prompt prefills is admitted at the next step,
/// beside the long prompt's chunk (which keeps the rest of the budget); without fair prefill
/// it waits for the whole long prefill. Outputs equal each request run alone.
#[test]
fn fair_prefill_admits_a_short_arrival_within_one_step() {
    for fair in [true, false] {
        let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 600);
        let queue = QueueConfig { fair_prefill: fair.then(FairPrefill::default), ..Default::default() };
        let mut s = Scheduler::new(SchedulerConfig { queue, ..cfg(600, 16) }, None);
        let mut seen = Seen::default();
        let (long, short, long2) = (prompt(200, 1), prompt(4, 2), prompt(100, 3));
        s.submit(req(1, long.clone(), 3)).expect("admissible");
        assert_eq!(seen.step(&mut s, &mut m, &mut kv), vec![16]);
        // A second long prompt waits (one long prefill at a time); the short one behind it
        // is admitted now, with a chunk of the long one after it.
        s.submit(req(2, long2.clone(), 3)).expect("admissible");
        s.submit(req(3, short.clone(), 3)).expect("admissible");
        let rows = seen.step(&mut s, &mut m, &mut kv);
        if fair {
            assert_eq!(rows, vec![12, 4], "the long chunk and the short prompt share the budget");
        } else {
            assert_eq!(rows, vec![16], "without fair prefill the long prompt holds the budget");
        }
        seen.drain(&mut s, &mut m, &mut kv);
        for (id, p) in [(1, &long), (2, &long2), (3, &short)] {
            assert_eq!(seen.tokens[&id], m.reference(p, 3, None, 4096).0, "fair {fair}");
        }
        let first = seen.finished.iter().position(|f| f.0 == 3);
        assert_eq!(first == Some(0), fair, "the short request finishes first only when fair");
        s.check_pages().expect("pages accounted for");
    }
}

fn priority(threshold: i64) -> QueueConfig {
    QueueConfig {
        priority: Some(PriorityConfig {
            low_values_first: true,
            preemption: true,
            preemption_threshold: threshold,
            default_priority: 0,
        }),
        ..Default::default()
    }
}

/// With `max_running_requests` 2 taken by priority-20 requests, a priority-0 arrival (smaller
/// first) retracts the newest of them and runs; every output is still exact. At a threshold
/// of 20 the difference is not enough and it waits; the queue is still ordered by priority.
#[test]
fn priority_preempts_a_less_urgent_running_request_with_exact_outputs() {
    for (threshold, preempted) in [(10, 1), (20, 0)] {
        let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 600);
        let c = SchedulerConfig { max_running_requests: 2, queue: priority(threshold), ..cfg(600, 512) };
        let mut s = Scheduler::new(c, None);
        let mut seen = Seen::default();
        let ps: Vec<Vec<u32>> = (0..4).map(|i| prompt(10 + i, i as u32)).collect();
        for (i, p) in ps.iter().take(2).enumerate() {
            s.submit(NewRequest { priority: Some(20), ..req(i as u64 + 1, p.clone(), 30) }).expect("admissible");
        }
        seen.step(&mut s, &mut m, &mut kv);
        seen.step(&mut s, &mut m, &mut kv);
        s.submit(NewRequest { priority: Some(30), ..req(3, ps[2].clone(), 5) }).expect("admissible");
        s.submit(NewRequest { priority: Some(0), ..req(4, ps[3].clone(), 5) }).expect("admissible");
        let rows = seen.step(&mut s, &mut m, &mut kv);
        assert_eq!(s.stats().num_preemptions, preempted, "threshold {threshold}");
        if preempted == 1 {
            // Request 1's decode row and request 4's prompt (request 2, the newest, went back).
            assert_eq!(rows, vec![1, 13]);
        }
        seen.drain(&mut s, &mut m, &mut kv);
        for (i, p) in ps.iter().enumerate() {
            let n = if i < 2 { 30 } else { 5 };
            assert_eq!(seen.tokens[&(i as u64 + 1)], m.reference(p, n, None, 4096).0, "request {}", i + 1);
        }
        let order: Vec<u64> = seen.finished.iter().map(|f| f.0).collect();
        // The priority-0 request overtook the priority-30 one queued before it.
        let pos = |id| order.iter().position(|&x| x == id);
        assert!(pos(4) < pos(3), "finish order {order:?}");
        s.check_pages().expect("pages accounted for");
    }
}

/// A request still waiting after `--queue-timeout` is answered `Overloaded` with nothing
/// computed; the running one finishes as usual.
#[test]
fn a_request_waiting_past_the_queue_timeout_is_answered() {
    let mut m = FakeModel::new(37, 4096, Predict::Recurrence);
    let mut kv = KvStore::new(m.attention_needs().kv_layout, 600);
    let queue = QueueConfig { queue_timeout: Some(std::time::Duration::from_millis(20)), ..Default::default() };
    let mut s = Scheduler::new(SchedulerConfig { max_running_requests: 1, queue, ..cfg(600, 512) }, None);
    let mut seen = Seen::default();
    let (a, b) = (prompt(8, 1), prompt(8, 2));
    s.submit(req(1, a.clone(), 4)).expect("admissible");
    s.submit(req(2, b, 4)).expect("admissible");
    seen.step(&mut s, &mut m, &mut kv);
    std::thread::sleep(std::time::Duration::from_millis(40));
    seen.drain(&mut s, &mut m, &mut kv);
    assert_eq!(seen.tokens[&1], m.reference(&a, 4, None, 4096).0);
    assert!(!seen.tokens.contains_key(&2), "nothing generated");
    let (id, reason) = &seen.finished[0];
    assert_eq!(*id, 2, "answered at the first step past its deadline");
    assert!(matches!(reason, FinishReason::Overloaded(e) if e.contains("--queue-timeout")), "{reason:?}");
    assert_eq!(s.stats().num_queue_timeouts, 1);
    s.check_pages().expect("pages accounted for");
}
