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

    /// Inputs past each limit fail to compile with llguidance's reason; the same shapes a size
    /// smaller compile.
    #[test]
    fn explore() {
        let g = grammars();
        for r in ["(abcdefgh){200000}", "(a|b)*a(a|b){40}", "[a-z]{1000}[0-9]{1000}", "((a|b|c|d){100}){100}", "(.*a){200}"] {
            let t = std::time::Instant::now();
            let res = g.constraint(&Constraint::Regex(r.into()));
            eprintln!("REGEX {r}: {:?} {:?}", res.as_ref().err(), t.elapsed());
        }
        for n in [10_000usize, 100_000, 300_000] {
            let values: Vec<String> = (0..n).map(|i| format!("v{i}")).collect();
            let t = std::time::Instant::now();
            let res = g.constraint(&Constraint::Json(json!({"enum": values})));
            eprintln!("ENUM {n}: {:?} {:?}", res.as_ref().err().map(|e| &e[..e.len().min(300)]), t.elapsed());
        }
        for depth in [30usize, 60, 120] {
            let mut s = json!({"type": "string"});
            for _ in 0..depth { s = json!({"type": "object", "properties": {"a": s}, "required": ["a"]}); }
            let t = std::time::Instant::now();
            let res = std::thread::Builder::new().stack_size(2 << 20).spawn({ let g = grammars(); move || g.constraint(&Constraint::Json(s)).err() }).expect("spawn").join();
            eprintln!("DEEP {depth}: {:?} {:?}", res.map(|e| e.map(|e| e[..e.len().min(200)].to_string())), t.elapsed());
        }
        for n in [100usize, 150] {
            let mut defs = serde_json::Map::new();
            for i in 0..n { defs.insert(format!("d{i}"), json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}}})); }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            let s = json!({"$defs": defs, "$ref": "#/$defs/d0"});
            let t = std::time::Instant::now();
            let res = std::thread::Builder::new().stack_size(2 << 20).spawn({ let g = grammars(); move || g.constraint(&Constraint::Json(s)).err() }).expect("spawn").join();
            eprintln!("REFS {n}: {:?} {:?}", res.map(|e| e.map(|e| e[..e.len().min(200)].to_string())), t.elapsed());
        }
        for n in [100usize, 1000, 10000] {
            let mut g2 = String::from("start: r0\n");
            for i in 0..n { g2.push_str(&format!("r{i}: \"a\" r{}\n", i + 1)); }
            g2.push_str(&format!("r{n}: \"b\"\n"));
            let _ = g2;
            let nested = format!("start: {}\"a\"{}\n", "(".repeat(n), ")".repeat(n));
            let res = std::thread::Builder::new().stack_size(2 << 20).spawn({ let g = grammars(); move || g.constraint(&Constraint::Lark(nested)).err() }).expect("spawn").join();
            eprintln!("LARKNEST {n}: {:?}", res.map(|e| e.map(|e| e[..e.len().min(200)].to_string())));
            let rx = format!("{}a{}", "(".repeat(n), ")".repeat(n));
            let res = std::thread::Builder::new().stack_size(2 << 20).spawn({ let g = grammars(); move || g.constraint(&Constraint::Regex(rx)).err() }).expect("spawn").join();
            eprintln!("RXNEST {n}: {:?}", res.map(|e| e.map(|e| e[..e.len().min(200)].to_string())));
        }
        let alts: Vec<String> = (0..100_000).map(|i| format!("w{i}")).collect();
        let t = std::time::Instant::now();
        let res = g.constraint(&Constraint::Regex(alts.join("|")));
        eprintln!("ALTS: {:?} {:?}", res.as_ref().err(), t.elapsed());
    }

    #[test]
    fn grammars_past_the_limits_fail_with_the_limit_named() {
        let g = grammars();
        let too_big = |c: Constraint| g.constraint(&c).err().expect("past the limit");
        let e = too_big(Constraint::Regex("(abcdefgh){200000}".into()));
        assert!(e.contains("too big"), "{e}");
        assert!(g.constraint(&Constraint::Regex("(abcdefgh){20}".into())).is_ok());
        let values: Vec<String> = (0..300_000).map(|i| format!("v{i}")).collect();
        let e = too_big(Constraint::Json(json!({"enum": values})));
        assert!(e.contains("too big"), "{e}");
        assert!(e.len() < 1000, "a terse error, not the grammar: {} bytes", e.len());
        let values: Vec<String> = (0..300).map(|i| format!("v{i}")).collect();
        assert!(g.constraint(&Constraint::Json(json!({"enum": values}))).is_ok());
    }
}
