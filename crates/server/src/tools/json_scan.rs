//! Reading a call's JSON as it streams: the `name` header ([`call_header`]) and where its
//! arguments value ends ([`ValueScan`], strings and nesting aware).

pub(super) enum Header {
    More,
    No,
    Yes { name: String, used: usize },
}

/// Matches `{ "name" : "<name>" , "arguments"|"parameters" :` with free whitespace at the start
/// of `s` (a call whose name comes first, as models and our grammar write it).
pub(super) fn call_header(s: &str) -> Header {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // A JSON string at i: its decoded value and the index after it.
    let string = |i: usize| -> Result<Option<(String, usize)>, ()> {
        if i >= b.len() {
            return Ok(None);
        }
        if b[i] != b'"' {
            return Err(());
        }
        let mut j = i + 1;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => {
                    return serde_json::from_str::<String>(&s[i..=j]).map(|v| Some((v, j + 1))).map_err(|_| ());
                }
                _ => j += 1,
            }
        }
        Ok(None)
    };
    macro_rules! expect {
        ($c:expr) => {{
            ws(&mut i);
            if i >= b.len() {
                return Header::More;
            }
            if b[i] != $c {
                return Header::No;
            }
            i += 1;
        }};
    }
    macro_rules! string {
        () => {{
            ws(&mut i);
            match string(i) {
                Err(()) => return Header::No,
                Ok(None) => return Header::More,
                Ok(Some((v, j))) => {
                    i = j;
                    v
                }
            }
        }};
    }
    expect!(b'{');
    if string!() != "name" {
        return Header::No;
    }
    expect!(b':');
    let name = string!();
    expect!(b',');
    let key = string!();
    if key != "arguments" && key != "parameters" {
        return Header::No;
    }
    expect!(b':');
    ws(&mut i);
    if i >= b.len() {
        return Header::More;
    }
    Header::Yes { name, used: i }
}

/// Finds where one JSON value ends in text that arrives piece by piece (depth, strings and
/// escapes), so a call's arguments are streamed exactly as written.
#[derive(Debug, Default)]
pub(super) struct ValueScan {
    pub(super) started: bool,
    pub(super) depth: u32,
    pub(super) in_str: bool,
    pub(super) esc: bool,
    pub(super) prim: bool,
    pub(super) done: bool,
}

impl ValueScan {
    /// Feeds `s`; returns how many of its bytes belong to the value.
    pub(super) fn feed(&mut self, s: &str) -> usize {
        for (i, c) in s.char_indices() {
            if self.done {
                return i;
            }
            if !self.started {
                self.started = true;
                match c {
                    '{' | '[' => self.depth = 1,
                    '"' => self.in_str = true,
                    _ => self.prim = true,
                }
                continue;
            }
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == '\\' {
                    self.esc = true;
                } else if c == '"' {
                    self.in_str = false;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                continue;
            }
            if self.prim {
                if c.is_whitespace() || matches!(c, ',' | '}' | ']' | '<') {
                    self.done = true;
                    return i;
                }
                continue;
            }
            match c {
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                '"' => self.in_str = true,
                _ => {}
            }
        }
        s.len()
    }
}
