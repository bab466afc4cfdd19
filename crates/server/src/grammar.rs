//! Structured output: request constraints (`response_format` `json_object` / `json_schema`,
//! vLLM's `structured_outputs` / `guided_*` (JSON, regex, choice, grammar), SGLang's
//! `json_schema`, `regex` and `ebnf`; GBNF is rewritten by [`crate::gbnf`]) compiled by
//! llguidance (the Rust crate mistral.rs uses; `llguidance::Matcher`, `toktrie::TokTrie`) into
//! per-request [`TokenConstraint`]s the engine applies before sampling.
//!
//! The token trie is built once from the vocabulary's bytes; special tokens are marked with
//! toktrie's `0xFF` prefix so that no grammar can spell them, and the tokenizer's EOS is the
//! token a grammar may end with. JSON is compiled compactly (`,` and `:` separators, no free
//! whitespace), so a small `max_tokens` suffices.

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use sparrow_engine::scheduler::TokenConstraint;
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// The bounds every request grammar compiles and runs under (llguidance's `ParserLimits`,
/// `src/api.rs`, at its defaults but `verbose_errors`, off so that errors do not quote the
/// grammar and the tokens so far): lexer construction fuel 1,000,000 (~20 ms), grammar size
/// 500,000 symbols, 250,000 lexer states (~1–2 kB each), per-token mask fuel 200,000 and
/// 50,000 Earley items, 2,000 items in a row.
pub const GRAMMAR_LIMITS: ParserLimits = ParserLimits {
    max_items_in_row: 2000,
    initial_lexer_fuel: 1_000_000,
    step_lexer_fuel: 200_000,
    max_lexer_states: 250_000,
    max_grammar_size: 500_000,
    step_max_items: 50_000,
    precompute_large_lexemes: true,
    verbose_errors: false,
};

/// A compiled grammar source, shared by the choices of a request.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammars")
    }
}

impl Grammars {
    /// The factory over a vocabulary: `bytes_all[t]` spells token `t`, `special[t]` marks
    /// control tokens, `eos` ends a grammar.
    ///
    /// # Errors
    /// llguidance's, in words.
    pub fn new(bytes_all: &[Vec<u8>], special: &[bool], eos: u32) -> Result<Grammars, String> {
        let words: Vec<Vec<u8>> = bytes_all
            .iter()
            .zip(special)
            .map(|(b, &sp)| if sp { [&[TokTrie::SPECIAL_TOKEN_MARKER][..], b].concat() } else { b.clone() })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.set_stderr_log_level(0);
        let limits = factory.limits_mut();
        // llguidance's own defaults (`ParserLimits`), stated here because requests are
        // untrusted: a schema, regex or grammar past them fails to compile, a 400 naming the
        // field. Errors leave out the grammar and the tokens so far, which a request can make
        // megabytes long.
        *limits = GRAMMAR_LIMITS;
        Ok(Grammars { factory })
    }

    /// A fresh constraint for one choice.
    ///
    /// # Errors
    /// The grammar does not compile (an invalid schema or regex), in llguidance's words.
    pub fn constraint(&self, g: &Constraint) -> Result<Box<dyn TokenConstraint>, String> {
        Ok(Box::new(Llg(self.matcher(g)?)))
    }

    /// A grammar the server wrote around request `schemas` (a lazy tool-call grammar: Lark
    /// with `%json` blocks, which request grammars may not use) compiled once, to start any
    /// number of fresh constraints from ([`Compiled::instance`]). Each schema's depth is checked
    /// as a request schema's is.
    ///
    /// # Errors
    /// A schema past the depth limit, or the compiler's error.
    pub fn compiled(&self, lark: &str, schemas: &[&Value]) -> Result<Compiled, String> {
        for s in schemas {
            let depth = schema_depth(s)?;
            if depth > MAX_GRAMMAR_DEPTH {
                return Err(format!("a schema nests {depth} levels deep; at most {MAX_GRAMMAR_DEPTH} are compiled"));
            }
        }
        self.compile_deep(&Constraint::Lark(lark.to_owned())).map(Compiled)
    }

    /// `n` independent constraints for the `n` choices of one request (`n` ≥ 1; 0 gives none):
    /// the grammar compiles once and the others are deep copies (parser state and lexer caches
    /// of their own, llguidance's `Matcher::deep_clone`), so a request's compile time does not
    /// grow with `n`.
    ///
    /// # Errors
    /// As [`Grammars::constraint`].
    pub fn constraints(&self, g: &Constraint, n: usize) -> Result<Vec<Box<dyn TokenConstraint>>, String> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let first = self.matcher(g)?;
        let mut out: Vec<Box<dyn TokenConstraint>> = Vec::with_capacity(n);
        for _ in 1..n {
            out.push(Box::new(Llg(first.deep_clone())));
        }
        out.push(Box::new(Llg(first)));
        Ok(out)
    }

    fn matcher(&self, g: &Constraint) -> Result<Matcher, String> {
        let depth = match g {
            Constraint::Json(schema) => schema_depth(schema)?,
            Constraint::Lark(src) => lark_depth(src)?,
            // Regex nesting is bounded by the regex parser (`regex-syntax`'s nest limit).
            Constraint::Regex(_) => 0,
        };
        if depth > MAX_GRAMMAR_DEPTH {
            return Err(format!(
                "nests {depth} levels deep (schema levels and $ref chains, or grammar rules referring to rules); at \
                 most {MAX_GRAMMAR_DEPTH} are compiled"
            ));
        }
        self.compile_deep(g)
    }

    /// [`Grammars::compile`] on a thread with a deep stack.
    fn compile_deep(&self, g: &Constraint) -> Result<Matcher, String> {
        // llguidance compiles recursively, about one frame per level: a thread of its own with
        // a stack far past what MAX_GRAMMAR_DEPTH needs (a 2 MiB stack holds ~150 levels).
        let compiled = std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("grammar-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || self.compile(g))
                .map_err(|e| format!("cannot start the grammar compiler: {e}"))?
                .join()
                .map_err(|_| "the grammar compiler failed".to_string())?
        });
        // Errors quote the input (a regex, a grammar line): a request can make them megabytes.
        compiled.map_err(|e| truncate(e, 2000))
    }

    fn compile(&self, g: &Constraint) -> Result<Matcher, String> {
        let grammar = match g {
            Constraint::Json(schema) => {
                let mut schema = schema.clone();
                if let Value::Object(o) = &mut schema {
                    o.entry("x-guidance").or_insert_with(
                        || json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":"}),
                    );
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Constraint::Regex(r) => TopLevelGrammar::from_regex(r),
            Constraint::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self.factory.create_parser(grammar).map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(m)
    }
}

/// Deepest a request grammar may nest ([`schema_depth`], [`lark_depth`]): real schemas and
/// grammars stay under 20.
pub const MAX_GRAMMAR_DEPTH: usize = 256;

/// Stack of the thread a grammar compiles on: 64 MiB of address space, touched only as deep
/// as the grammar goes.
const COMPILE_STACK: usize = 64 << 20;

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// An upper bound on how deep a compiler recursing along `edges` can go from any node: the
/// graph's strongly connected components (Tarjan's algorithm, iteratively) each count their
/// size (a recursion inside one visits each member at most once), and the longest path of the
/// condensed graph sums them. Iterative, so depth costs no stack here.
fn longest_chain(edges: &[Vec<usize>]) -> usize {
    const UNSEEN: usize = usize::MAX;
    let n = edges.len();
    let (mut index, mut low, mut comp) = (vec![UNSEEN; n], vec![0usize; n], vec![UNSEEN; n]);
    let mut on_stack = vec![false; n];
    let mut members: Vec<usize> = Vec::new();
    // Height of each component, in the order Tarjan emits them (successors first).
    let mut height: Vec<usize> = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        members.push(root);
        on_stack[root] = true;
        let mut call: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some(&mut (v, ref mut i)) = call.last_mut() {
            if let Some(&w) = edges[v].get(*i) {
                *i += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    members.push(w);
                    on_stack[w] = true;
                    call.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            call.pop();
            if let Some(&(u, _)) = call.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let c = height.len();
                let mut size = 0;
                let mut below = 0;
                let start = members.iter().rposition(|&m| m == v).unwrap_or(0);
                for &m in &members[start..] {
                    on_stack[m] = false;
                    comp[m] = c;
                    size += 1;
                }
                for &m in &members[start..] {
                    for &w in &edges[m] {
                        if comp[w] != c && comp[w] != UNSEEN {
                            below = below.max(height[comp[w]]);
                        }
                    }
                }
                members.truncate(start);
                height.push(size + below);
            }
        }
    }
    height.into_iter().max().unwrap_or(0)
}

/// Schema keywords that give a schema another base or name to be referred by: their `$ref`s
/// would resolve differently from the root-relative JSON pointers [`schema_depth`] follows.
const SCHEMA_SCOPES: &[&str] =
    &["$id", "$anchor", "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor"];

/// RFC 3986 percent-decoding of a URI fragment (`#/%24defs/a` is `#/$defs/a`).
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A JSON schema's depth: its JSON nesting with every `$ref` followed as a JSON pointer from
/// the root (`#`, `#/$defs/...`, percent-encoded or not), the way llguidance's compiler
/// descends; `longest_chain` of that graph.
///
/// # Errors
/// A `$ref` that is not such a pointer to a part of the schema, or a keyword that changes how
/// refs resolve (`SCHEMA_SCOPES`): llguidance would follow them where this count cannot.
pub fn schema_depth(schema: &Value) -> Result<usize, String> {
    /// Each JSON container once, numbered as first met.
    struct Nodes<'a> {
        ids: std::collections::HashMap<*const Value, usize>,
        nodes: Vec<&'a Value>,
    }
    impl<'a> Nodes<'a> {
        fn id(&mut self, v: &'a Value) -> usize {
            let next = self.nodes.len();
            let i = *self.ids.entry(v as *const Value).or_insert(next);
            if i == next {
                self.nodes.push(v);
            }
            i
        }
    }
    let mut g = Nodes { ids: std::collections::HashMap::new(), nodes: Vec::new() };
    let mut edges: Vec<Vec<usize>> = Vec::new();
    // Every node once, with its children and its `$ref` target as edges.
    g.id(schema);
    let mut i = 0;
    while i < g.nodes.len() {
        let v: &Value = g.nodes[i];
        let mut out = Vec::new();
        let children: Vec<&Value> = match v {
            Value::Object(o) => o.values().collect(),
            Value::Array(a) => a.iter().collect(),
            _ => Vec::new(),
        };
        for c in children.into_iter().filter(|c| c.is_object() || c.is_array()) {
            out.push(g.id(c));
        }
        if let Value::Object(o) = v {
            if let Some(k) = SCHEMA_SCOPES.iter().find(|k| o.get(**k).is_some_and(|x| x.is_string() || x.is_boolean()))
            {
                return Err(format!("the schema keyword {k} is not taken (refs are JSON pointers from the root)"));
            }
            if let Some(r) = o.get("$ref").and_then(Value::as_str) {
                let target =
                    r.strip_prefix('#').and_then(percent_decode).and_then(|p| schema.pointer(&p)).ok_or_else(|| {
                        format!(
                            "$ref {:?} is not a JSON pointer into the schema (#/$defs/...)",
                            truncate(r.to_owned(), 100)
                        )
                    })?;
                out.push(g.id(target));
            }
        }
        edges.push(out);
        i += 1;
    }
    Ok(longest_chain(&edges))
}

/// Removes `//` and `#` comments from Lark source, keeping quoted strings and `/regex/`
/// literals whole (a quote inside a comment opens nothing).
fn strip_lark_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '\n') => quote = None,
                (false, c) if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        let comment = c == '#' || (c == '/' && chars.peek() == Some(&'/'));
        if comment {
            for d in chars.by_ref() {
                if d == '\n' {
                    out.push('\n');
                    break;
                }
            }
            continue;
        }
        if c == '"' || c == '/' {
            quote = Some(c);
        }
        out.push(c);
    }
    out
}

/// The names (rule and terminal) in Lark source outside strings and regexes, as llguidance's
/// lexer reads them (`[_?!]?[A-Za-z][_A-Za-z0-9-]*`), with whether a `%` directive starts them.
fn lark_words(src: &str) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut directive = false;
    for c in src.chars().chain(std::iter::once(' ')) {
        if let Some(q) = quote {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, c) if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || (c == '-' && !word.is_empty()) {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push((directive, std::mem::take(&mut word)));
        }
        directive = c == '%';
        if c == '"' || c == '/' {
            quote = Some(c);
        }
    }
    out
}

/// A Lark grammar's depth: `longest_chain` of its rules (and terminals) by the names their
/// definitions use. A definition starts at a line `name:` (`?name`, `!name`, `_name`,
/// `name[attributes]`, `name.2` too); every other line belongs to the definition above it
/// (over-counting references is safe, missing one is not).
///
/// # Errors
/// `%json` and `%lark` blocks: a schema or grammar inside, which the count does not enter.
pub fn lark_depth(src: &str) -> Result<usize, String> {
    let src = strip_lark_comments(src);
    let mut names: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut bodies: Vec<String> = Vec::new();
    for line in src.lines() {
        let t = line.trim_start();
        let head = t.split_once(':').and_then(|(h, body)| {
            let h = h.trim();
            let h = h.split('[').next().unwrap_or(h).trim();
            let h = h.trim_start_matches(['?', '!']);
            let h = h.split('.').next().unwrap_or(h);
            let ok = h.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && h.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            ok.then(|| (h.to_owned(), body))
        });
        match head {
            Some((name, body)) => {
                let next = bodies.len();
                let i = *names.entry(name).or_insert(next);
                if i == next {
                    bodies.push(String::new());
                }
                bodies[i].push(' ');
                bodies[i].push_str(body);
            }
            None => match bodies.last_mut() {
                Some(b) => {
                    b.push(' ');
                    b.push_str(t);
                }
                None => bodies.push(t.to_owned()),
            },
        }
    }
    let mut edges: Vec<Vec<usize>> = Vec::with_capacity(bodies.len());
    for b in &bodies {
        let mut out = Vec::new();
        for (directive, w) in lark_words(b) {
            if directive && (w == "json" || w == "lark") {
                return Err(format!("%{w} blocks are not taken in request grammars"));
            }
            if let Some(&j) = names.get(w.trim_start_matches(['?', '!'])) {
                out.push(j);
            }
        }
        edges.push(out);
    }
    Ok(longest_chain(&edges))
}

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON schema (`{"type": "object"}` for `json_object`).
    Json(Value),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark dialect (GBNF is rewritten into it by [`crate::gbnf`]).
    Lark(String),
}

impl Constraint {
    /// One of `choices`, exactly (vLLM's `choice` / `guided_choice`).
    pub fn choice(choices: &[String]) -> Constraint {
        let alts: Vec<String> = choices.iter().map(|c| Value::from(c.as_str()).to_string()).collect();
        Constraint::Lark(format!("start: {}\n", alts.join(" | ")))
    }

    /// A grammar field's text: GBNF when it has a `::=` rule (llama.cpp's notation, which
    /// SGLang's `ebnf` and vLLM's `grammar` take), llguidance Lark otherwise.
    ///
    /// # Errors
    /// The GBNF does not parse, in [`crate::gbnf::to_lark`]'s words.
    pub fn grammar(text: &str) -> Result<Constraint, String> {
        if text.contains("::=") {
            crate::gbnf::to_lark(text).map(Constraint::Lark)
        } else {
            Ok(Constraint::Lark(text.to_owned()))
        }
    }
}

/// A compiled grammar that hands out fresh constraints ([`Grammars::compiled`]).
pub struct Compiled(Matcher);

impl Compiled {
    /// A constraint at the grammar's start (a deep copy: parser state and caches of its own).
    pub fn instance(&self) -> Box<dyn TokenConstraint> {
        Box::new(Llg(self.0.deep_clone()))
    }
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("compiled grammar")
    }
}

struct Llg(Matcher);

impl std::fmt::Debug for Llg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("llguidance matcher")
    }
}

impl TokenConstraint for Llg {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), String> {
        let mask = self.0.compute_mask().map_err(|e| e.to_string())?;
        mask.iter_set_entries(|t| {
            if let Some(a) = allowed.get_mut(t) {
                *a = true;
            }
        });
        Ok(())
    }

    fn advance(&mut self, token: u32) -> Result<bool, String> {
        self.0.consume_token(token).map_err(|e| e.to_string())?;
        Ok(self.0.is_stopped())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 256 byte tokens and an EOS.
    fn grammars() -> Grammars {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"<eos>".to_vec());
        let special: Vec<bool> = (0..words.len()).map(|i| i == 256).collect();
        Grammars::new(&words, &special, 256).expect("grammars")
    }

    /// The bytes a constraint allows next.
    fn allowed(c: &mut Box<dyn TokenConstraint>) -> Vec<u8> {
        let mut a = vec![false; 257];
        c.allowed(&mut a).expect("mask");
        (0..=255u8).filter(|&b| a[b as usize]).collect()
    }

    /// The copies made for a request's choices advance independently: each follows its own
    /// tokens, none sees another's, and each ends where its own text completes the grammar.
    #[test]
    fn choice_copies_advance_independently() {
        let g = grammars();
        let re = Constraint::Regex("(ab|cd)e".into());
        assert!(g.constraints(&re, 0).expect("compiles").is_empty());
        let mut cs = g.constraints(&re, 3).expect("compiles");
        assert_eq!(cs.len(), 3);
        assert!(!cs[0].advance(u32::from(b'a')).expect("a"));
        assert!(!cs[1].advance(u32::from(b'c')).expect("c"));
        assert_eq!(allowed(&mut cs[0]), b"b");
        assert_eq!(allowed(&mut cs[1]), b"d");
        assert_eq!(allowed(&mut cs[2]), b"ac");
        assert!(cs[1].advance(u32::from(b'b')).is_err(), "the copy at 'c' refuses 'b'");
        assert!(!cs[0].advance(u32::from(b'b')).expect("b"));
        assert_eq!(allowed(&mut cs[0]), b"e");
        assert_eq!(allowed(&mut cs[2]), b"ac", "the untouched copy is still at the start");
        // A compile error is the same as for one constraint.
        let bad = Constraint::Regex("(".into());
        assert_eq!(g.constraints(&bad, 2).map(|_| ()), g.constraint(&bad).map(|_| ()));
    }

    /// Inputs past each limit fail to compile with the limit named; the same shapes a size
    /// smaller compile.
    #[test]
    fn grammars_past_the_limits_fail_with_the_limit_named() {
        let g = grammars();
        let too_big = |c: Constraint| g.constraint(&c).map(|_| ()).expect_err("past the limit");
        // llguidance's lexer fuel: an enum of 100,000 strings.
        let values: Vec<String> = (0..100_000).map(|i| format!("v{i}")).collect();
        let e = too_big(Constraint::Json(json!({"enum": values})));
        assert!(e.contains("too big (limit for this grammar: 1000000)"), "{e}");
        let values: Vec<String> = (0..300).map(|i| format!("v{i}")).collect();
        assert!(g.constraint(&Constraint::Json(json!({"enum": values}))).is_ok());
        // Chains that overflowed the compiler's stack (and aborted the server) at ~1,000 levels.
        let chain = |n: usize| {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                defs.insert(
                    format!("d{i}"),
                    json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
                );
            }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            Constraint::Json(json!({"$defs": defs, "$ref": "#/$defs/d0"}))
        };
        let e = too_big(chain(2000));
        assert!(e.contains("nests 6003 levels deep") && e.contains("at most 256"), "{e}");
        assert!(g.constraint(&chain(60)).is_ok(), "60 levels compile");
        let rules = |n: usize| {
            let mut src = String::from("start: r0\n");
            for i in 0..n {
                src.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
            }
            src.push_str(&format!("r{n}: \"b\"\n"));
            Constraint::Lark(src)
        };
        let e = too_big(rules(2000));
        assert!(e.contains("nests 2002 levels deep"), "{e}");
        assert!(g.constraint(&rules(250)).is_ok(), "250 rules in a chain compile");
        // A recursive schema (a tree) is not deep: its recursion ends each chain.
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array",
            "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}}}, "$ref": "#/$defs/node"});
        assert_eq!(schema_depth(&tree), Ok(6));
        assert!(g.constraint(&Constraint::Json(tree)).is_ok());
        // An error that quotes a megabyte of input is cut.
        let e = too_big(Constraint::Regex(format!("({}", "a".repeat(1 << 20))));
        assert!(e.len() <= 2003 && e.ends_with('…'), "{} bytes: {}", e.len(), &e[..100]);
    }

    #[test]
    fn depths_count_levels() {
        assert_eq!(schema_depth(&json!({"type": "object", "properties": {"a": {"type": "string"}}})), Ok(3));
        assert_eq!(schema_depth(&json!({"type": "string"})), Ok(1));
        assert_eq!(lark_depth("start: a | b\na: b \"a:b\"\nb: /[a-z]b/\n"), Ok(3));
        // A recursion counts its members once: start and x.
        assert_eq!(lark_depth("?start.2: x\n    | \"y\" x\nx: \"z\" start\n"), Ok(2));
    }

    /// The forms a depth count could miss, each built into a chain of 2,000 that would overflow
    /// the compiler: every one is counted (or refused) before it compiles.
    #[test]
    fn deep_grammars_cannot_hide_their_depth() {
        let g = grammars();
        let refused = |c: Constraint| g.constraint(&c).map(|_| ()).expect_err("refused");
        let chain = |f: &dyn Fn(usize) -> String| -> String {
            let mut src = String::from("start: r0\n");
            for i in 0..2000 {
                src.push_str(&f(i));
            }
            src.push_str("r2000: \"b\"\n");
            src
        };
        // Dashes in names (llguidance's lexer takes them).
        let e = refused(Constraint::Lark(chain(&|i| format!("r{i}: \"a\" r-{}\nr-{}: r{}\n", i + 1, i + 1, i + 1))));
        assert!(e.contains("levels deep"), "{e}");
        // A quote in a comment, then the reference on a continuation line.
        let e = refused(Constraint::Lark(chain(&|i| format!("r{i}: \"a\" // say \"hi\n    | r{}\n", i + 1))));
        assert!(e.contains("levels deep"), "{e}");
        // Rule attributes and a reference on a line without `|`.
        let e = refused(Constraint::Lark(chain(&|i| format!("r{i}[lazy]: \"a\"\n  r{}\n", i + 1))));
        assert!(e.contains("levels deep"), "{e}");
        // A cycle of 300 rules: one component of 300.
        let mut ring = String::from("start: r0\n");
        for i in 0..300 {
            ring.push_str(&format!("r{i}: \"a\" | r{}\n", (i + 1) % 300));
        }
        assert!(refused(Constraint::Lark(ring)).contains("nests 301 levels deep"));
        // Embedded schemas and grammars.
        let e = refused(Constraint::Lark("start: %json { \"type\": \"string\" }\n".into()));
        assert!(e.contains("%json blocks are not taken"), "{e}");
        // Percent-encoded pointers are followed.
        let mut defs = serde_json::Map::new();
        for i in 0..2000 {
            defs.insert(format!("d{i}"), json!({"type": "array", "items": {"$ref": format!("#/%24defs/d{}", i + 1)}}));
        }
        defs.insert("d2000".into(), json!({"type": "string"}));
        let e = refused(Constraint::Json(json!({"$defs": defs, "$ref": "#/$defs/d0"})));
        assert!(e.contains("levels deep"), "{e}");
        // Refs that resolve some other way are refused.
        for (schema, what) in [
            (json!({"$defs": {"a": {"$anchor": "x", "type": "string"}}, "type": "object"}), "$anchor"),
            (json!({"$defs": {"a": {"type": "string"}}, "$ref": "#x"}), "is not a JSON pointer"),
            (json!({"$id": "urn:a", "type": "string"}), "$id"),
            (json!({"$ref": "other.json#/a"}), "is not a JSON pointer"),
            (json!({"$ref": "#/$defs/missing"}), "is not a JSON pointer"),
        ] {
            let e = refused(Constraint::Json(schema));
            assert!(e.contains(what), "{what}: {e}");
        }
        // A property named like a keyword is a property.
        let named = json!({"type": "object", "properties": {"$id": {"type": "string"}}});
        assert!(g.constraint(&Constraint::Json(named)).is_ok());
    }
}
