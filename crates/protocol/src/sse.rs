//! Server-Sent Events framing (WHATWG HTML, "Server-sent events", event stream interpretation).
//!
//! Only the `data` field matters to OpenAI-style APIs: an event is the `data:` lines up to a
//! blank line, joined by `\n`. Comments (`:` lines) and other fields are skipped. Lines end in
//! `\n`, `\r\n` or `\r`.

/// Incremental SSE decoder: feed it body bytes as they arrive, take complete events out.
///
/// Bytes are buffered until a line is complete, so a frame split across reads (or a UTF-8
/// character split across reads) is reassembled before it is decoded. Lines are found with
/// `memchr` and handled in place when a read holds them whole; the two buffers (a partial
/// line, the event's data) keep their capacity, so a steady stream allocates nothing.
///
/// What it holds is bounded: a line or an event longer than its limit ([`MAX_EVENT_BYTES`]
/// unless [`SseDecoder::with_limit`]) is an [`EventTooLarge`] error, and the decoder takes no
/// more bytes after one, so a server that never ends a line cannot fill the client's memory.
#[derive(Debug)]
pub struct SseDecoder {
    /// The start of a line whose end has not arrived.
    buf: Vec<u8>,
    /// The event's `data` so far (lines joined by `\n`).
    data: Vec<u8>,
    /// A `data` line has been seen since the last dispatch.
    has_data: bool,
    /// A `\r` ended the last line; a `\n` right after it belongs to the same line end.
    after_cr: bool,
    /// Most bytes of a pending line plus the event's data so far.
    limit: usize,
    /// The limit was passed: every later feed fails.
    overflowed: bool,
}

/// The default bound on one SSE line plus its event's data: 64 MiB, far above any frame of the
/// APIs read here (SGLang's `/generate` streams the cumulative text: ~4 bytes per token).
pub const MAX_EVENT_BYTES: usize = 64 << 20;

/// An SSE line or event past the decoder's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an SSE line or event longer than {limit} bytes")]
pub struct EventTooLarge {
    /// The limit passed, bytes.
    pub limit: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::with_limit(MAX_EVENT_BYTES)
    }
}

impl SseDecoder {
    /// An empty decoder bounded by [`MAX_EVENT_BYTES`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty decoder that holds at most `limit` bytes of a line and its event's data.
    pub fn with_limit(limit: usize) -> Self {
        Self { buf: Vec::new(), data: Vec::new(), has_data: false, after_cr: false, limit, overflowed: false }
    }

    /// Appends `bytes` and returns the `data` payload of every event they complete, in order.
    ///
    /// # Errors
    /// As [`SseDecoder::feed_with`].
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, EventTooLarge> {
        let mut out = Vec::new();
        self.feed_with(bytes, |d| out.push(d.to_owned()))?;
        Ok(out)
    }

    /// Appends `bytes` and calls `on_event` with the `data` payload of every event they
    /// complete, in order, without allocating. Invalid UTF-8 is replaced (U+FFFD).
    ///
    /// # Errors
    /// [`EventTooLarge`] once a line or an event passes the limit (events completed before
    /// it in `bytes` were delivered); from then on every call fails.
    pub fn feed_with(&mut self, mut bytes: &[u8], mut on_event: impl FnMut(&str)) -> Result<(), EventTooLarge> {
        let too_large = EventTooLarge { limit: self.limit };
        if self.overflowed {
            return Err(too_large);
        }
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            let Some(i) = memchr::memchr2(b'\n', b'\r', bytes) else {
                if self.buf.len() + self.data.len() + bytes.len() > self.limit {
                    self.overflow();
                    return Err(too_large);
                }
                self.buf.extend_from_slice(bytes);
                return Ok(());
            };
            if self.buf.len() + self.data.len() + i > self.limit {
                self.overflow();
                return Err(too_large);
            }
            self.after_cr = bytes[i] == b'\r';
            if self.buf.is_empty() {
                self.line(&bytes[..i], &mut on_event);
            } else {
                let mut line = std::mem::take(&mut self.buf);
                line.extend_from_slice(&bytes[..i]);
                self.line(&line, &mut on_event);
                line.clear();
                self.buf = line;
            }
            bytes = &bytes[i + 1..];
        }
        Ok(())
    }

    /// Drops what is held and refuses what comes.
    fn overflow(&mut self) {
        self.overflowed = true;
        self.buf = Vec::new();
        self.data = Vec::new();
        self.has_data = false;
    }

    /// Ends the stream: a pending event without its closing blank line is dropped, as the
    /// specification requires. Returns true if such an incomplete event (or a partial line)
    /// was pending, which tells a client the stream was cut mid-frame.
    pub fn finish(&mut self) -> bool {
        let pending = !self.buf.is_empty() || self.has_data;
        self.buf.clear();
        self.data.clear();
        self.has_data = false;
        pending
    }

    fn line(&mut self, line: &[u8], on_event: &mut impl FnMut(&str)) {
        if line.is_empty() {
            if self.has_data {
                self.has_data = false;
                match std::str::from_utf8(&self.data) {
                    Ok(d) => on_event(d),
                    Err(_) => on_event(&String::from_utf8_lossy(&self.data)),
                }
                self.data.clear();
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.has_data = true;
            self.data.extend_from_slice(value);
        }
    }
}

/// Frames `payload` as one SSE event: `data: <payload>\n\n`.
pub fn frame(payload: &str) -> String {
    let mut s = String::with_capacity(payload.len() + 8);
    for line in payload.split('\n') {
        s.push_str("data: ");
        s.push_str(line);
        s.push('\n');
    }
    s.push('\n');
    s
}

/// Appends `value` as one SSE event, `data: <compact JSON>\n\n`, serialized straight into
/// `out` with no intermediate string (compact JSON escapes newlines, so it is one `data:` line).
///
/// # Errors
/// `value` failed to serialize; `out` is then left as it was.
pub fn push_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), serde_json::Error> {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        out.truncate(start);
        return Err(e);
    }
    out.extend_from_slice(b"\n\n");
    Ok(())
}

/// The terminal frame OpenAI-compatible streams end with.
pub const DONE: &str = "[DONE]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_across_reads_and_line_endings() {
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: {\"a\"").expect("under the limit").is_empty());
        assert_eq!(d.feed(b":1}\n\ndata: x\r\n\r\n: comment\n\n").expect("under the limit"), vec!["{\"a\":1}", "x"]);
        assert_eq!(d.feed(b"data:y\rdata: z\r\r").expect("under the limit"), vec!["y\nz"]);
        assert_eq!(d.feed(b"event: foo\nid: 3\ndata: [DONE]\n\n").expect("under the limit"), vec!["[DONE]"]);
        assert!(!d.finish());
    }

    #[test]
    fn cut_mid_frame_is_reported() {
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: {\"partial\": ").expect("under the limit").is_empty());
        assert!(d.finish());
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: whole\n").expect("under the limit").is_empty());
        assert!(d.finish(), "an event without its blank line is incomplete");
    }

    #[test]
    fn utf8_split_across_reads() {
        let bytes = "data: é\n\n".as_bytes();
        let mut d = SseDecoder::new();
        assert!(d.feed(&bytes[..7]).expect("under the limit").is_empty());
        assert_eq!(d.feed(&bytes[7..]).expect("under the limit"), vec!["é"]);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let stream = b"data: {\"a\": 1}\r\n\r\n: c\ndata: x\ndata: y\n\ndata: \xc3\xa9\r\rdata: [DONE]\n\n";
        let whole = SseDecoder::new().feed(stream).expect("under the limit");
        assert_eq!(whole, vec!["{\"a\": 1}", "x\ny", "é", "[DONE]"]);
        for cut in 0..stream.len() {
            let mut d = SseDecoder::new();
            let mut got = d.feed(&stream[..cut]).expect("under the limit");
            got.extend(d.feed(&stream[cut..]).expect("under the limit"));
            assert_eq!(got, whole, "split at {cut}");
            assert!(!d.finish());
        }
    }

    #[test]
    fn json_frames_equal_framed_text() {
        let v = serde_json::json!({"text": "a\nb", "n": 1});
        let mut out = b"x".to_vec();
        push_json(&mut out, &v).expect("serializes");
        assert_eq!(out, [&b"x"[..], frame(&v.to_string()).as_bytes()].concat());
        let mut bad = std::collections::HashMap::new();
        bad.insert(vec![1u8], 1);
        assert!(push_json(&mut out, &bad).is_err(), "a map with non-string keys is not JSON");
        assert_eq!(out, [&b"x"[..], frame(&v.to_string()).as_bytes()].concat(), "left as it was");
    }

    #[test]
    fn lines_and_events_past_the_limit_fail() {
        // A line that never ends, in pieces: refused once the pieces pass the limit.
        let mut d = SseDecoder::with_limit(16);
        assert_eq!(d.feed(b"data: 0123456789").expect("16 bytes"), Vec::<String>::new());
        assert_eq!(d.feed(b"x"), Err(EventTooLarge { limit: 16 }));
        assert_eq!(d.feed(b"\n\ndata: ok\n\n"), Err(EventTooLarge { limit: 16 }), "stays refused");
        // An event of many short lines, and a long line whole in one read.
        let mut d = SseDecoder::with_limit(16);
        assert_eq!(d.feed(&b"data: abc\n".repeat(5)), Err(EventTooLarge { limit: 16 }));
        let mut d = SseDecoder::with_limit(16);
        let mut got = Vec::new();
        let r = d.feed_with(b"data: ok\n\ndata: 0123456789abcdef\n\n", |e| got.push(e.to_owned()));
        assert_eq!((r, got), (Err(EventTooLarge { limit: 16 }), vec!["ok".to_owned()]));
        // At the limit exactly: taken.
        let mut d = SseDecoder::with_limit(16);
        assert_eq!(d.feed(b"data: 0123456789\n\n").expect("16 bytes"), vec!["0123456789"]);
    }

    #[test]
    fn frame_round_trips() {
        let mut d = SseDecoder::new();
        assert_eq!(d.feed(frame("a\nb").as_bytes()).expect("under the limit"), vec!["a\nb"]);
    }
}
