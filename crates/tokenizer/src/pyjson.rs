//! Python's `json.dumps`, byte for byte, for the places where what Python writes is the
//! contract: a chat template's `tojson` filter (HF's, which is `json.dumps`), the tools a model
//! card puts in the prompt with `json.dumps(tools)`, and `sparrow bench`'s JSONL line (SGLang's
//! `bench_serving` writes it with `json.dumps`).
//!
//! [`dumps`] takes the keyword arguments of `json.dumps` that change its bytes
//! ([`DumpsOptions`]: `ensure_ascii`, `indent`, `separators`, `sort_keys`); [`dumps_float`]
//! writes one float as `json.dumps` does, `Infinity` and `NaN` included, which a
//! [`serde_json::Value`] cannot hold.

use serde::Serialize as _;
use serde_json::Value;

/// The keyword arguments of Python's `json.dumps` that change the bytes it writes.
///
/// [`DumpsOptions::PYTHON`] (also the [`Default`]) is plain `json.dumps(v)`:
/// `ensure_ascii=True`, no `indent`, the default `separators`, keys in their given order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpsOptions {
    /// `ensure_ascii`: every non-ASCII character of a string (keys included) is written as a
    /// `\uXXXX` escape, one above U+FFFF as its UTF-16 surrogate pair (`🙂` ->
    /// `\ud83d\ude42`). Off, strings are written as UTF-8. The separators are written as
    /// given either way.
    pub ensure_ascii: bool,
    /// `indent`: with `Some(n)`, every item of an array or object on its own line, indented
    /// by `n` spaces per level (`Some(0)`: newlines only), and an empty container kept as `[]`
    /// or `{}`; `None` writes one line. The output grows with `n` times the depth: bound `n`
    /// where it comes from a stranger.
    pub indent: Option<usize>,
    /// `separators`: the (item separator, key separator) pair. `None` is Python's default:
    /// `(", ", ": ")`, or `(",", ": ")` with an `indent` (no space at the end of a line).
    pub separators: Option<(String, String)>,
    /// `sort_keys`: every object's keys in sorted order (by code point, as Python's `sorted`
    /// orders `str`s), at every depth.
    pub sort_keys: bool,
}

impl DumpsOptions {
    /// `json.dumps(v)` with Python's defaults.
    pub const PYTHON: DumpsOptions =
        DumpsOptions { ensure_ascii: true, indent: None, separators: None, sort_keys: false };
}

impl Default for DumpsOptions {
    fn default() -> Self {
        Self::PYTHON
    }
}

/// `v` as Python's `json.dumps(v, **options)` writes it, for the options of [`DumpsOptions`].
///
/// Strings are escaped as Python escapes them (`\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other
/// control characters as `\u00XX`), then, under `ensure_ascii`, non-ASCII as `\uXXXX`. Keys
/// come in the map's order unless `sort_keys` (Python's dict order is insertion order: the
/// workspace builds `serde_json` with `preserve_order`). Numbers are written as `serde_json`
/// writes them, the same as Python's for integers and for most floats; [`dumps_float`] writes
/// a float exactly as Python does.
pub fn dumps(v: &Value, options: &DumpsOptions) -> String {
    let sorted;
    let v = if options.sort_keys {
        sorted = sort_keys(v.clone());
        &sorted
    } else {
        v
    };
    let (item, key) = match &options.separators {
        Some((item, key)) => (item.as_str(), key.as_str()),
        None if options.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let f = PyFormatter {
        item,
        key,
        indent: options.indent.map(|n| " ".repeat(n)),
        ensure_ascii: options.ensure_ascii,
        depth: 0,
        empty: false,
    };
    let mut out = Vec::new();
    // Writing a `Value` into memory cannot fail: its keys are strings, a `Vec` takes every write.
    let _ = v.serialize(&mut serde_json::Serializer::with_formatter(&mut out, f));
    // `serde_json` writes the strings of a `Value` as the UTF-8 they are, the separators are
    // `str`s and escapes are ASCII: the bytes are UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// One float as Python's `json.dumps(x)` writes it: `repr(x)` (the shortest digits that read
/// back as `x`, `16.0` for a whole number, exponents from 1e16 and below 1e-4 written `1e+16`,
/// `2.5e-05`), and `Infinity`, `-Infinity` and `NaN` for the non-finite values (`allow_nan`,
/// the default). With `strict` a non-finite value is written `null` instead, which every JSON
/// reader takes (under `allow_nan=False` Python raises `ValueError`).
pub fn dumps_float(x: f64, strict: bool) -> String {
    if x.is_finite() {
        let s = format!("{x:?}");
        // Rust's Debug for f64 is the shortest round-trip form, like Python's repr, except
        // that Rust writes `1e-7` where Python writes `1e-07`.
        match s.split_once('e') {
            Some((m, e)) => {
                let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
                format!("{m}e{sign}{digits:0>2}")
            }
            None => s,
        }
    } else if strict {
        "null".into()
    } else if x.is_nan() {
        "NaN".into()
    } else if x > 0.0 {
        "Infinity".into()
    } else {
        "-Infinity".into()
    }
}

/// `v` with every object's keys sorted, at every depth.
fn sort_keys(v: Value) -> Value {
    match v {
        Value::Object(o) => {
            let mut entries: Vec<(String, Value)> = o.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, x)| (k, sort_keys(x))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sort_keys).collect()),
        v => v,
    }
}

/// `json.dumps`' layout for `serde_json`: its separators, its `indent` (a newline and the
/// indent per level before each item and before a closing bracket; none inside an empty
/// container) and `ensure_ascii`.
struct PyFormatter<'a> {
    item: &'a str,
    key: &'a str,
    indent: Option<String>,
    ensure_ascii: bool,
    depth: usize,
    /// The container just opened has no item yet.
    empty: bool,
}

impl PyFormatter<'_> {
    fn open<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.depth += 1;
        w.write_all(c)
    }
    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8], empty: bool) -> std::io::Result<()> {
        self.depth -= 1;
        if let (Some(ind), false) = (&self.indent, empty) {
            w.write_all(b"\n")?;
            w.write_all(ind.repeat(self.depth).as_bytes())?;
        }
        w.write_all(c)
    }
    fn item<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(self.item.as_bytes())?;
        }
        if let Some(ind) = &self.indent {
            w.write_all(b"\n")?;
            w.write_all(ind.repeat(self.depth).as_bytes())?;
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for PyFormatter<'_> {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.empty = true;
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        // serde_json calls begin_array_value before any item; an empty array has none.
        let empty = self.empty;
        self.empty = false;
        self.close(w, b"]", empty)
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.empty = false;
        self.item(w, first)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.empty = true;
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        let empty = self.empty;
        self.empty = false;
        self.close(w, b"}", empty)
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        self.empty = false;
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(self.key.as_bytes())
    }
    /// The unescaped runs of a string (serde_json writes `"`, `\` and control characters as
    /// escapes apart): under `ensure_ascii`, each non-ASCII character as its UTF-16 units.
    fn write_string_fragment<W: ?Sized + std::io::Write>(&mut self, w: &mut W, fragment: &str) -> std::io::Result<()> {
        if !self.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// With Python's defaults, `dumps` writes what the server's `py_json` writes, which is
    /// what Python's `json.dumps` writes (strings checked against CPython 3.11:
    /// `json.dumps({"a": [1, 2.5, None], "b": "Zürich 🙂", "c": {"d": True}})`).
    #[test]
    fn py_json_is_json_dumps() {
        let py_json = |v: &Value| dumps(v, &DumpsOptions::PYTHON);
        let v: Value =
            serde_json::from_str(r#"{"a": [1, 2.5, null], "b": "Zürich 🙂", "c": {"d": true}}"#).unwrap_or_default();
        assert_eq!(py_json(&v), r#"{"a": [1, 2.5, null], "b": "Z\u00fcrich \ud83d\ude42", "c": {"d": true}}"#);
        // The tools string of the template golden's Phi-4-mini conversation, made by
        // `json.dumps` in chat_template_golden.py: what the server puts on the system message.
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template_golden.json");
        let g: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
        let case = g["cases"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["conversation"] == "tools on the system message"))
            .expect("case");
        let sent = case["messages"][0]["tools"].as_str().expect("tools string");
        assert_eq!(py_json(&serde_json::from_str(sent).expect("tools JSON")), sent);
    }

    /// `indent`, `separators`, `sort_keys` and `ensure_ascii` as CPython 3.11 writes them:
    /// `json.dumps({"a": [], "b": {}, "c": [1, {"d": "é"}]}, indent=2)`, `indent=0`, and
    /// `json.dumps({"b": "é", "a": 1}, separators=(",", "："), sort_keys=True)` (a separator
    /// is written as given, even under `ensure_ascii`).
    #[test]
    fn keyword_arguments_are_json_dumps() {
        let v = json!({"a": [], "b": {}, "c": [1, {"d": "é"}]});
        let indented = DumpsOptions { indent: Some(2), ..DumpsOptions::PYTHON };
        assert_eq!(
            dumps(&v, &indented),
            "{\n  \"a\": [],\n  \"b\": {},\n  \"c\": [\n    1,\n    {\n      \"d\": \"\\u00e9\"\n    }\n  ]\n}"
        );
        let flat = DumpsOptions { indent: Some(0), ensure_ascii: false, ..DumpsOptions::PYTHON };
        assert_eq!(dumps(&json!({"a": [1, 2]}), &flat), "{\n\"a\": [\n1,\n2\n]\n}");
        let sorted =
            DumpsOptions { separators: Some((",".into(), "：".into())), sort_keys: true, ..DumpsOptions::default() };
        assert_eq!(dumps(&json!({"b": "é", "a": 1}), &sorted), "{\"a\"：1,\"b\"：\"\\u00e9\"}");
    }

    /// Floats as `json.dumps([float("-inf"), float("nan"), 0.1, 1e16, 123456789.0, 2.5e-5])`
    /// writes them, and `null` for the non-finite ones when strict.
    #[test]
    fn floats_are_json_dumps() {
        let got: Vec<String> = [f64::NEG_INFINITY, f64::NAN, 0.1, 1e16, 123456789.0, 2.5e-5]
            .into_iter()
            .map(|x| dumps_float(x, false))
            .collect();
        assert_eq!(got, ["-Infinity", "NaN", "0.1", "1e+16", "123456789.0", "2.5e-05"]);
        assert_eq!(dumps_float(f64::NAN, true), "null");
        assert_eq!(dumps_float(-0.5, true), "-0.5");
    }
}
