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
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// The start of a line whose end has not arrived.
    buf: Vec<u8>,
    /// The event's `data` so far (lines joined by `\n`).
    data: Vec<u8>,
    /// A `data` line has been seen since the last dispatch.
    has_data: bool,
    /// A `\r` ended the last line; a `\n` right after it belongs to the same line end.
    after_cr: bool,
}

impl SseDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `bytes` and returns the `data` payload of every event they complete, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        self.feed_with(bytes, |d| out.push(d.to_owned()));
        out
    }

    /// Appends `bytes` and calls `on_event` with the `data` payload of every event they
    /// complete, in order, without allocating. Invalid UTF-8 is replaced (U+FFFD).
    pub fn feed_with(&mut self, mut bytes: &[u8], mut on_event: impl FnMut(&str)) {
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            let Some(i) = memchr::memchr2(b'\n', b'\r', bytes) else {
                self.buf.extend_from_slice(bytes);
                return;
            };
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
        assert!(d.feed(b"data: {\"a\"").is_empty());
        assert_eq!(d.feed(b":1}\n\ndata: x\r\n\r\n: comment\n\n"), vec!["{\"a\":1}", "x"]);
        assert_eq!(d.feed(b"data:y\rdata: z\r\r"), vec!["y\nz"]);
        assert_eq!(d.feed(b"event: foo\nid: 3\ndata: [DONE]\n\n"), vec!["[DONE]"]);
        assert!(!d.finish());
    }

    #[test]
    fn cut_mid_frame_is_reported() {
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: {\"partial\": ").is_empty());
        assert!(d.finish());
        let mut d = SseDecoder::new();
        assert!(d.feed(b"data: whole\n").is_empty());
        assert!(d.finish(), "an event without its blank line is incomplete");
    }

    #[test]
    fn utf8_split_across_reads() {
        let bytes = "data: é\n\n".as_bytes();
        let mut d = SseDecoder::new();
        assert!(d.feed(&bytes[..7]).is_empty());
        assert_eq!(d.feed(&bytes[7..]), vec!["é"]);
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let stream = b"data: {\"a\": 1}\r\n\r\n: c\ndata: x\ndata: y\n\ndata: \xc3\xa9\r\rdata: [DONE]\n\n";
        let whole = SseDecoder::new().feed(stream);
        assert_eq!(whole, vec!["{\"a\": 1}", "x\ny", "é", "[DONE]"]);
        for cut in 0..stream.len() {
            let mut d = SseDecoder::new();
            let mut got = d.feed(&stream[..cut]);
            got.extend(d.feed(&stream[cut..]));
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
    fn frame_round_trips() {
        let mut d = SseDecoder::new();
        assert_eq!(d.feed(frame("a\nb").as_bytes()), vec!["a\nb"]);
    }
}
