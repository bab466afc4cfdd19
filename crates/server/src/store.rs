//! The Responses API's stored responses (`store: true`): a bounded in-memory LRU keyed by
//! response id, read by `GET /v1/responses/{id}`, removed by `DELETE`, and continued by
//! `previous_response_id`. Bounded by count (`--responses-store-size`), so a client that never
//! deletes cannot grow the server without limit; the least recently used entry goes first.
//! Nothing survives a restart (OpenAI keeps responses 30 days; a local server keeps what fits).

use serde_json::Value;
use sparrow_tokenizer::ChatMessage;
use std::collections::HashMap;
use std::sync::Mutex;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The `response` object as it was returned.
    pub response: Value,
    /// The conversation after this turn (its input, earlier turns included, and its output;
    /// `instructions` excluded, as the API does not carry them forward).
    pub history: Vec<ChatMessage>,
}

/// The store.
#[derive(Debug)]
pub struct ResponseStore {
    cap: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    tick: u64,
    map: HashMap<String, (u64, Stored)>,
}

impl ResponseStore {
    /// A store of at most `cap` responses (0: nothing is stored).
    pub fn new(cap: usize) -> Self {
        ResponseStore { cap, inner: Mutex::new(Lru::default()) }
    }

    /// Whether anything can be stored.
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding the lock leaves a consistent map (every update is one insert or
        // remove): keep serving it.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores `s` under `id`, evicting the least recently used entry when full.
    pub fn put(&self, id: String, s: Stored) {
        if self.cap == 0 {
            return;
        }
        let mut l = self.lock();
        l.tick += 1;
        let t = l.tick;
        l.map.insert(id, (t, s));
        while l.map.len() > self.cap {
            let Some(oldest) = l.map.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone()) else { break };
            l.map.remove(&oldest);
        }
    }

    /// The response stored under `id`, now the most recently used.
    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut l = self.lock();
        l.tick += 1;
        let t = l.tick;
        l.map.get_mut(id).map(|e| {
            e.0 = t;
            e.1.clone()
        })
    }

    /// Removes `id`; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        self.lock().map.remove(id).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(n: u64) -> Stored {
        Stored { response: Value::from(n), history: Vec::new() }
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let s = ResponseStore::new(2);
        s.put("a".into(), stored(1));
        s.put("b".into(), stored(2));
        assert_eq!(s.get("a").map(|x| x.response), Some(Value::from(1)));
        s.put("c".into(), stored(3));
        assert!(s.get("b").is_none(), "b was the least recently used");
        assert!(s.get("a").is_some() && s.get("c").is_some());
        assert!(s.delete("a") && !s.delete("a"));
        let off = ResponseStore::new(0);
        off.put("a".into(), stored(1));
        assert!(off.get("a").is_none() && !off.enabled());
    }
}
