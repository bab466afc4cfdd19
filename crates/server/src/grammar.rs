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
/// `src/api.rs`, at its defaults): lexer construction fuel 1,000,000 (~20 ms), grammar size
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
        let depth = match g {
            Constraint::Json(schema) => schema_depth(schema),
            Constraint::Lark(src) => lark_depth(src),
            // Regex nesting is bounded by the regex parser (`regex-syntax`'s nest limit).
            Constraint::Regex(_) => 0,
        };
        if depth > MAX_GRAMMAR_DEPTH {
            return Err(format!(
                "nests {depth} levels deep (schema levels and $ref chains, or grammar rules referring to rules); at \
                 most {MAX_GRAMMAR_DEPTH} are compiled"
            ));
        }
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

    fn compile(&self, g: &Constraint) -> Result<Box<dyn TokenConstraint>, String> {
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
        Ok(Box::new(Llg(m)))
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

/// The longest chain of `edges` from any node, each node counted once per chain: a node
/// reached again on its own chain (a recursive definition) ends that chain. Iterative, so
/// depth costs no stack here.
fn longest_chain(edges: &[Vec<usize>]) -> usize {
    let n = edges.len();
    // 0: unseen, 1: on the current chain, 2: done (height known).
    let mut state = vec![0u8; n];
    let mut height = vec![0usize; n];
    let mut best = 0;
    for root in 0..n {
        if state[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&child) = edges[node].get(*next) {
                *next += 1;
                if state[child] == 0 {
                    state[child] = 1;
                    stack.push((child, 0));
                }
                continue;
            }
            let h = 1 + edges[node].iter().filter(|&&c| state[c] == 2).map(|&c| height[c]).max().unwrap_or(0);
            height[node] = h;
            state[node] = 2;
            best = best.max(h);
            stack.pop();
        }
    }
    best
}

/// A JSON schema's depth: its JSON nesting with every local `$ref` (`#`, `#/...` JSON
/// pointers) followed, as llguidance's compiler descends.
pub fn schema_depth(schema: &Value) -> usize {
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
        if let Some(target) =
            v.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|p| schema.pointer(p))
        {
            out.push(g.id(target));
        }
        edges.push(out);
        i += 1;
    }
    longest_chain(&edges)
}

/// A Lark grammar's depth: the longest chain of rules (and terminals) whose definitions name
/// one another, a definition being a line `name: ...` (`?name`, `!name`, `name.2` too) and
/// the `|` lines under it; quoted strings and `/regex/` literals are not names.
pub fn lark_depth(src: &str) -> usize {
    let mut names: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut bodies: Vec<String> = Vec::new();
    for line in src.lines() {
        let t = line.trim_start();
        if t.starts_with('|') {
            if let Some(b) = bodies.last_mut() {
                b.push(' ');
                b.push_str(t);
            }
            continue;
        }
        let Some((head, body)) = t.split_once(':') else { continue };
        let name = head.trim().trim_start_matches(['?', '!']);
        let name = name.split('.').next().unwrap_or(name);
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let next = bodies.len();
        let i = *names.entry(name).or_insert(next);
        if i == next {
            bodies.push(body.to_owned());
        } else {
            bodies[i].push(' ');
            bodies[i].push_str(body);
        }
    }
    let edges: Vec<Vec<usize>> = bodies
        .iter()
        .map(|b| {
            let mut out = Vec::new();
            let mut word = String::new();
            let mut quote: Option<char> = None;
            let mut escaped = false;
            for c in b.chars().chain(std::iter::once(' ')) {
                if let Some(q) = quote {
                    match (escaped, c) {
                        (true, _) => escaped = false,
                        (false, '\\') => escaped = true,
                        (false, c) if c == q => quote = None,
                        _ => {}
                    }
                    continue;
                }
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    continue;
                }
                if let Some(&j) = names.get(word.as_str()) {
                    out.push(j);
                }
                word.clear();
                if c == '"' || c == '/' {
                    quote = Some(c);
                }
            }
            out
        })
        .collect();
    longest_chain(&edges)
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
        assert_eq!(schema_depth(&tree), 6);
        assert!(g.constraint(&Constraint::Json(tree)).is_ok());
        // An error that quotes a megabyte of input is cut.
        let e = too_big(Constraint::Regex(format!("({}", "a".repeat(1 << 20))));
        assert!(e.len() <= 2003, "{} bytes", e.len());
    }

    #[test]
    fn depths_count_levels() {
        assert_eq!(schema_depth(&json!({"type": "object", "properties": {"a": {"type": "string"}}})), 3);
        assert_eq!(schema_depth(&json!({"type": "string"})), 1);
        assert_eq!(lark_depth("start: a | b\na: b \"a:b\"\nb: /[a-z]b/\n"), 3);
        assert_eq!(lark_depth("?start.2: x\n    | \"y\" x\nx: \"z\" start\n"), 2);
    }
}
