//! The server-configuration grid: `--serve-params` (server configurations) × `--bench-params`
//! (workloads), each a JSON file of flag sets in the format of vLLM's `vllm bench sweep serve`
//! (`vllm/benchmarks/sweep/`, docs `benchmarking/sweeps.md`), and `--link-vars`.
//!
//! A file holds a list of flag dicts (`[{"max_running_requests": 64}, {}]`, each named after
//! its flags) or a dict of named flag dicts (`{"baseline": {}, "big": {...}}`, in file order).
//! A key is a flag name as the program spells it, with `_` read as `-` (`max_num_seqs` is
//! `--max-num-seqs`) unless it starts with `-` (`-np`, kept as written); `true` is the bare
//! flag, `false` and `null` leave it out (SGLang's and sparrow's switches have no `--no-`
//! form, which vLLM writes), a number or string is its value, a list its values, an object
//! its JSON text.

use std::path::Path;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// One flag of a flag set, as the command line gets it.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagValue {
    /// A bare flag (`true` in the file).
    Switch,
    /// One value.
    One(String),
    /// Several values (`--flag a b`).
    Many(Vec<String>),
}

/// A named set of flags: one server configuration or one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSet {
    /// The name in the report and the resume key (from the file, or made of the flags).
    pub name: String,
    /// `(flag as written on the command line, value)`, in file order; `false`/`null` dropped.
    pub flags: Vec<(String, FlagValue)>,
}

/// A JSON object with its keys in file order (serde_json's `Map` sorts them).
struct Ordered(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ordered, A::Error> {
                let mut v = vec![];
                while let Some((k, x)) = m.next_entry::<String, Value>()? {
                    v.push((k, x));
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// The file's top level: a list of flag dicts or a dict of named ones.
#[derive(Deserialize)]
#[serde(untagged)]
enum Top {
    List(Vec<Ordered>),
    Named(Ordered),
}

/// `max_num_seqs` -> `--max-num-seqs`; `--x_y` and `-np` as written.
pub fn flag_name(key: &str) -> String {
    if key.starts_with('-') {
        key.to_owned()
    } else {
        format!("--{}", key.replace('_', "-"))
    }
}

/// A key in its comparable form: `max_num_seqs`, `max-num-seqs` and `--max-num-seqs` are one.
pub fn norm_key(key: &str) -> String {
    key.trim_start_matches('-').replace('_', "-")
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn flag_set(what: &str, name: Option<String>, obj: Ordered) -> Result<ParamSet, String> {
    let mut flags = vec![];
    for (k, v) in obj.0 {
        let f = flag_name(&k);
        if k.trim_start_matches('-').is_empty() || k.contains(char::is_whitespace) {
            return Err(format!("{what}: {k:?} is not a flag name"));
        }
        let value = match &v {
            Value::Bool(true) => FlagValue::Switch,
            Value::Bool(false) | Value::Null => continue,
            Value::Array(xs) => FlagValue::Many(
                xs.iter()
                    .map(|x| scalar(x).ok_or_else(|| format!("{what}: {k}: list items must be numbers or strings")))
                    .collect::<Result<_, _>>()?,
            ),
            // As vLLM passes one: the JSON text (`--speculative-config '{"method": ...}'`).
            Value::Object(_) => FlagValue::One(v.to_string()),
            x => FlagValue::One(scalar(x).unwrap_or_default()),
        };
        if flags.iter().any(|(g, _): &(String, FlagValue)| norm_key(g) == norm_key(&f)) {
            return Err(format!("{what}: {k} is given twice"));
        }
        flags.push((f, value));
    }
    let name = name.unwrap_or_else(|| {
        let parts: Vec<String> = flags
            .iter()
            .map(|(f, v)| {
                let k = f.trim_start_matches('-');
                match v {
                    FlagValue::Switch => k.to_owned(),
                    FlagValue::One(x) => format!("{k}={x}"),
                    FlagValue::Many(xs) => format!("{k}={}", xs.join("+")),
                }
            })
            .collect();
        if parts.is_empty() {
            "default".into()
        } else {
            // A name is a file name and a label: no '/' or ':' from a path or URL value.
            parts.join(",").replace(['/', ':'], "_")
        }
    });
    Ok(ParamSet { name, flags })
}

/// Reads flag sets from JSON text; `what` names the source in errors (`--serve-params x.json`).
///
/// # Errors
/// A message naming `what` and the offending entry: not JSON, not a list of objects or a dict
/// of objects, a nested object, an empty list, a name holding `/` or `:`, two sets with one name.
pub fn parse(text: &str, what: &str) -> Result<Vec<ParamSet>, String> {
    let top: Top = serde_json::from_str(text)
        .map_err(|e| format!("{what}: not a list of flag dicts or a dict of named ones ({e})"))?;
    let sets = match top {
        Top::List(v) => v
            .into_iter()
            .enumerate()
            .map(|(i, o)| flag_set(&format!("{what} entry {i}"), None, o))
            .collect::<Result<Vec<_>, _>>()?,
        Top::Named(o) => {
            o.0.into_iter()
                .map(|(n, v)| {
                    let obj = Ordered::deserialize(v).map_err(|e| format!("{what}: {n}: not a flag dict ({e})"))?;
                    flag_set(&format!("{what} {n}"), Some(n), obj)
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    if sets.is_empty() {
        return Err(format!("{what}: no flag sets"));
    }
    for (i, s) in sets.iter().enumerate() {
        if s.name.is_empty() || s.name.contains(['/', ':', '\0']) {
            return Err(format!("{what}: the name {:?} must be non-empty and hold no '/' or ':'", s.name));
        }
        if sets[..i].iter().any(|t| t.name == s.name) {
            return Err(format!("{what}: two flag sets are named {:?}", s.name));
        }
    }
    Ok(sets)
}

/// Reads a flag-sets file (`flag` is the option that named it, for errors).
///
/// # Errors
/// A message naming the flag and file when it cannot be read or parsed ([`parse`]).
pub fn load(path: &Path, flag: &str) -> Result<Vec<ParamSet>, String> {
    let what = format!("{flag} {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| format!("{what}: {e}"))?;
    parse(&text, &what)
}

/// Quotes `s` for `sh -c` when it needs it.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_=./:,+@%".contains(c)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

impl ParamSet {
    /// The flags as arguments: `["--max-running-requests", "64", "--disable-radix-cache"]`.
    pub fn argv(&self) -> Vec<String> {
        let mut a = vec![];
        for (f, v) in &self.flags {
            a.push(f.clone());
            match v {
                FlagValue::Switch => {}
                FlagValue::One(x) => a.push(x.clone()),
                FlagValue::Many(xs) => a.extend(xs.iter().cloned()),
            }
        }
        a
    }

    /// `base` with the flags appended, quoted for `sh -c`.
    pub fn command(&self, base: &str) -> String {
        let tail: Vec<String> = self.argv().iter().map(|a| sh_quote(a)).collect();
        if tail.is_empty() {
            base.to_owned()
        } else {
            format!("{base} {}", tail.join(" "))
        }
    }

    /// The value of flag `key` (any spelling), as one string (`true` for a bare flag).
    pub fn get(&self, key: &str) -> Option<String> {
        let k = norm_key(key);
        self.flags.iter().find(|(f, _)| norm_key(f) == k).map(|(_, v)| match v {
            FlagValue::Switch => "true".to_owned(),
            FlagValue::One(x) => x.clone(),
            FlagValue::Many(xs) => xs.join(" "),
        })
    }
}

/// One `--link-vars` pair: a server flag and the bench flag it is tied to.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// The server flag (comparable form, [`norm_key`]).
    pub serve: String,
    /// The bench flag (comparable form).
    pub bench: String,
}

/// Parses `--link-vars` (`max_running_requests=max_concurrency,...`).
///
/// # Errors
/// A message naming the pair that is not `serve_key=bench_key`.
pub fn parse_links(items: &[String]) -> Result<Vec<Link>, String> {
    items
        .iter()
        .map(|it| match it.split_once('=') {
            Some((s, b)) if !norm_key(s).is_empty() && !norm_key(b).is_empty() => {
                Ok(Link { serve: norm_key(s), bench: norm_key(b) })
            }
            _ => Err(format!(
                "--link-vars {it:?}: expected serve_flag=bench_flag (max_running_requests=max_concurrency)"
            )),
        })
        .collect()
}

/// Two flag values are the same setting (`64` and `64.0`, `"64"` and `64`).
pub fn same_value(a: &str, b: &str) -> bool {
    a == b || matches!((a.parse::<f64>(), b.parse::<f64>()), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_named_dicts() {
        let s = parse(
            r#"[{"max_running_requests": 64, "disable_radix_cache": true, "x": false, "y": null},
                {"--chunked-prefill-size": "512", "-np": 4, "lens": [1, "b"]}, {}]"#,
            "t",
        )
        .expect("list");
        assert_eq!(s[0].name, "max-running-requests=64,disable-radix-cache");
        assert_eq!(s[0].argv(), ["--max-running-requests", "64", "--disable-radix-cache"]);
        assert_eq!(s[1].argv(), ["--chunked-prefill-size", "512", "-np", "4", "--lens", "1", "b"]);
        assert_eq!(s[2].name, "default");
        assert_eq!(s[0].command("sparrow serve"), "sparrow serve --max-running-requests 64 --disable-radix-cache");
        assert_eq!(s[0].get("max-running-requests").as_deref(), Some("64"));
        assert_eq!(s[0].get("--disable_radix_cache").as_deref(), Some("true"));
        // File order is kept (serde_json's Map would sort "b" before "a").
        let n = parse(r#"{"zeta": {"b": 1, "a": 2}, "alpha": {}}"#, "t").expect("named");
        assert_eq!((n[0].name.as_str(), n[1].name.as_str()), ("zeta", "alpha"));
        assert_eq!(n[0].argv(), ["--b", "1", "--a", "2"]);
        let q = parse(r#"[{"served-model-name": "a b's"}]"#, "t").expect("quote");
        assert_eq!(q[0].command("s"), r"s --served-model-name 'a b'\''s'");
        let j = parse(r#"[{"model_path": "Qwen/Qwen3-8B", "speculative_config": {"k": 2}}]"#, "t").expect("json");
        assert_eq!(j[0].name, r#"model-path=Qwen_Qwen3-8B,speculative-config={"k"_2}"#);
        assert_eq!(j[0].argv(), ["--model-path", "Qwen/Qwen3-8B", "--speculative-config", r#"{"k":2}"#]);
    }

    #[test]
    fn bad_files_are_refused_by_entry() {
        let e = |t: &str| parse(t, "--serve-params f.json").expect_err(t);
        assert!(e("{").contains("--serve-params f.json"));
        assert!(e("[]").contains("no flag sets"));
        assert!(e("[1]").contains("not a list"));
        assert!(e(r#"[{"a": [{"b": 1}]}]"#).contains("entry 0: a: list items must be numbers or strings"));
        assert!(e(r#"{"x/y": {}}"#).contains("'/'"));
        assert!(e(r#"[{"a": 1}, {"a": 1}]"#).contains("two flag sets"));
        assert!(e(r#"[{"a_b": 1, "a-b": 2}]"#).contains("twice"));
        assert!(e(r#"{"n": 3}"#).contains("n: not a flag dict"));
    }

    #[test]
    fn links_and_values() {
        let l = parse_links(&["max_running_requests=max-concurrency".into()]).expect("link");
        assert_eq!(l[0], Link { serve: "max-running-requests".into(), bench: "max-concurrency".into() });
        assert!(parse_links(&["nope".into()]).is_err());
        assert!(same_value("64", "64.0") && !same_value("64", "65") && same_value("a", "a"));
    }
}
