//! Server-Sent Events framing (WHATWG HTML, "Server-sent events", event stream interpretation).
//!
//! Only the `data` field matters to OpenAI-style APIs: an event is the `data:` lines up to a
//! blank line, joined by `\n`. Comments (`:` lines) and other fields are skipped. Lines end in
//! `\n`, `\r\n` or `\r`.

/// Incremental SSE decoder: feed it body bytes as they arrive, take complete events out.
///
/// Bytes are buffered until a line is complete, so a frame split across reads (or a UTF-8
/// character split across reads) is reassembled before it is decoded.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    data: Option<String>,
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
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.buf);
                    self.line(&line, &mut out);
                }
                _ => self.buf.push(b),
            }
        }
        out
    }

    /// Ends the stream: a pending event without its closing blank line is dropped, as the
    /// specification requires. Returns true if such an incomplete event (or a partial line)
    /// was pending, which tells a client the stream was cut mid-frame.
    pub fn finish(&mut self) -> bool {
        let pending = !self.buf.is_empty() || self.data.is_some();
        self.buf.clear();
        self.data = None;
        pending
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<String>) {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                out.push(d);
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match line.iter().position(|&c| c == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        if field == b"data" {
            let value = String::from_utf8_lossy(value);
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(&value);
                }
                None => self.data = Some(value.into_owned()),
            }
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
    fn frame_round_trips() {
        let mut d = SseDecoder::new();
        assert_eq!(d.feed(frame("a\nb").as_bytes()), vec!["a\nb"]);
    }
}
