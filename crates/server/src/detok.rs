//! Incremental detokenization and stop-string matching.
//!
//! [`Utf8Stream`] turns token bytes into text as they arrive. Byte-level BPE tokens can split a
//! character, so the decoder holds back at most one incomplete character (≤ 3 bytes that are a
//! valid UTF-8 prefix); bytes that can never become valid UTF-8 are emitted at once as U+FFFD,
//! with the same substitutions as `String::from_utf8_lossy` over the whole output. Work per
//! token is bounded by the token's length: no re-decoding of a growing window (the
//! `prefix_offset / read_offset` scheme re-decodes and can stall forever on invalid bytes).
//!
//! [`StopMatcher`] cuts the text where the first stop string begins, holding back any tail that
//! could still be the start of a stop string, so the concatenated stream equals the
//! non-streamed text.

/// Streaming UTF-8 decoder.
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds bytes; returns the text that is now certain.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // SAFETY-free: `good` was just validated.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        None => {
                            // An incomplete character at the end: keep it for the next token.
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Ends the stream: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Finds stop strings in streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopResult {
    /// Text safe to emit; no stop string yet.
    Continue(String),
    /// A stop string matched: emit this text (everything before the match) and stop.
    Stopped {
        /// Text before the stop string.
        text: String,
        /// The stop string that matched.
        matched: String,
    },
}

impl StopMatcher {
    /// A matcher for `stops` (non-empty strings).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops, held: String::new() }
    }

    /// Adds text; returns what can be emitted.
    pub fn push(&mut self, text: &str) -> StopResult {
        if self.stops.is_empty() {
            return StopResult::Continue(text.to_owned());
        }
        self.held.push_str(text);
        // The earliest match wins; among matches at the same place, the longest stop string.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i, std::cmp::Reverse(s.len()), s)))
            .min();
        if let Some((i, _, s)) = hit {
            let text = self.held[..i].to_owned();
            let matched = s.clone();
            self.held.clear();
            return StopResult::Stopped { text, matched };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (k, _) in s.char_indices().skip(1) {
                if k > keep && self.held.ends_with(&s[..k]) {
                    keep = k;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        StopResult::Continue(out)
    }

    /// Ends the stream (EOS or length): the held-back tail is plain text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_and_invalid_bytes() {
        let mut d = Utf8Stream::default();
        // "é" = C3 A9 split across tokens; then an invalid byte FF; then "€" = E2 82 AC in 3.
        let mut s = d.push(b"a\xC3");
        assert_eq!(s, "a");
        s += &d.push(b"\xA9\xFF");
        s += &d.push(b"\xE2");
        s += &d.push(b"\x82");
        s += &d.push(b"\xAC");
        s += &d.finish();
        assert_eq!(s, "aé\u{FFFD}€");
        assert_eq!(s, String::from_utf8_lossy(b"a\xC3\xA9\xFF\xE2\x82\xAC"));
    }

    /// Bytes that never become valid UTF-8 flow out at once (at most 3 bytes ever held).
    #[test]
    fn invalid_bytes_never_stall() {
        let mut d = Utf8Stream::default();
        let mut held_max = 0;
        let mut all = Vec::new();
        let mut out = String::new();
        for i in 0..1000u32 {
            let b = [0x80 + (i % 0x40) as u8, 0xF0];
            all.extend_from_slice(&b);
            out += &d.push(&b);
            held_max = held_max.max(d.pending.len());
        }
        out += &d.finish();
        assert!(held_max <= 3);
        assert_eq!(out, String::from_utf8_lossy(&all));
    }

    #[test]
    fn stop_inside_and_across_pieces() {
        // A stop string inside one piece ("DEF" with stop "DE").
        let mut m = StopMatcher::new(vec!["DE".into()]);
        assert_eq!(m.push("abc"), StopResult::Continue("abc".into()));
        assert_eq!(m.push("DEF"), StopResult::Stopped { text: "".into(), matched: "DE".into() });
        // Spanning three pieces, with a held-back prefix.
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("xS"), StopResult::Continue("x".into()));
        assert_eq!(m.push("T"), StopResult::Continue("".into()));
        assert_eq!(m.push("OPy"), StopResult::Stopped { text: "".into(), matched: "STOP".into() });
        // A false start is released.
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("ST"), StopResult::Continue("".into()));
        assert_eq!(m.push("AR"), StopResult::Continue("STAR".into()));
        assert_eq!(m.push("S"), StopResult::Continue("".into()));
        assert_eq!(m.finish(), "S");
    }
}
