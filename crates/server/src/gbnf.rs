//! GBNF (llama.cpp's `grammars/README.md` notation, which SGLang's `ebnf` field and vLLM's
//! `grammar` take through xgrammar) rewritten into llguidance's Lark dialect
//! (llguidance `docs/syntax.md`), so one grammar engine serves both notations.
//!
//! The mapping: `name ::= body` becomes `g_name: body` on one line (Lark names are lower case;
//! `-` becomes `_`), `root` is the start rule, string literals are re-quoted as JSON strings,
//! character classes `[...]` become regexes `/[...]/` (in Lark, brackets mean "optional"), `.`
//! becomes any character, and `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` pass through (llguidance
//! accepts GBNF repetition). `#` starts a comment.

/// Rewrites a GBNF grammar into llguidance Lark.
///
/// # Errors
/// An unterminated literal or class, a stray character, a grammar with no `root` rule, in
/// words that name the offset.
pub fn to_lark(src: &str) -> Result<String, String> {
    let chars: Vec<char> = src.chars().collect();
    let mut rules: Vec<(String, Vec<String>)> = Vec::new();
    let mut i = 0;
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    while i < chars.len() {
        let c = chars[i];
        match c {
            '#' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            c if c.is_whitespace() => i += 1,
            '"' => {
                let start = i;
                i += 1;
                let mut lit = String::new();
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!("unterminated string literal at offset {start}"));
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let (ch, used) =
                                escape(&chars[i..]).ok_or_else(|| format!("bad escape at offset {}", i - 1))?;
                            lit.push(ch);
                            i += used;
                        }
                        c => lit.push(c),
                    }
                }
                let rule = rules.last_mut().ok_or_else(|| format!("a literal before any rule at offset {start}"))?;
                rule.1.push(serde_json::to_string(&lit).map_err(|e| e.to_string())?);
            }
            '[' => {
                let start = i;
                let mut class = String::from("[");
                i += 1;
                loop {
                    let Some(&c) = chars.get(i) else {
                        return Err(format!("unterminated character class at offset {start}"));
                    };
                    i += 1;
                    match c {
                        ']' if class.len() > 1 && class != "[^" => break,
                        '\\' => {
                            let (ch, used) =
                                escape(&chars[i..]).ok_or_else(|| format!("bad escape at offset {}", i - 1))?;
                            i += used;
                            class.push_str(&regex_char(ch));
                        }
                        '^' if class == "[" => class.push('^'),
                        '-' => class.push('-'),
                        c => class.push_str(&regex_char(c)),
                    }
                }
                class.push(']');
                let rule = rules.last_mut().ok_or_else(|| format!("a class before any rule at offset {start}"))?;
                rule.1.push(format!("/{class}/"));
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                let rule = rules.last_mut().ok_or_else(|| format!("{c:?} before any rule at offset {i}"))?;
                rule.1.push(c.to_string());
                i += 1;
            }
            '{' => {
                let start = i;
                let mut rep = String::new();
                while i < chars.len() && chars[i] != '}' {
                    if !(chars[i].is_ascii_digit() || chars[i] == ',' || chars[i] == '{' || chars[i] == ' ') {
                        return Err(format!("bad repetition at offset {start}"));
                    }
                    if chars[i] != ' ' {
                        rep.push(chars[i]);
                    }
                    i += 1;
                }
                if i == chars.len() {
                    return Err(format!("unterminated repetition at offset {start}"));
                }
                i += 1;
                rep.push('}');
                let rule = rules.last_mut().ok_or_else(|| format!("a repetition before any rule at offset {start}"))?;
                rule.1.push(rep);
            }
            '.' => {
                let rule = rules.last_mut().ok_or_else(|| format!("'.' before any rule at offset {i}"))?;
                rule.1.push("/(?s:.)/".to_owned());
                i += 1;
            }
            c if name_char(c) => {
                let start = i;
                while i < chars.len() && name_char(chars[i]) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                if chars[j..].starts_with(&[':', ':', '=']) {
                    rules.push((rule_name(&name), Vec::new()));
                    i = j + 3;
                } else {
                    let rule = rules.last_mut().ok_or_else(|| format!("{name:?} before any rule at offset {start}"))?;
                    rule.1.push(rule_name(&name));
                }
            }
            c => return Err(format!("unexpected {c:?} at offset {i}")),
        }
    }
    if !rules.iter().any(|r| r.0 == "g_root") {
        return Err("the grammar has no root rule (root ::= ...)".to_owned());
    }
    let mut out = String::from("start: g_root\n");
    for (name, body) in rules {
        if body.is_empty() {
            return Err(format!("rule {} is empty", name.trim_start_matches("g_")));
        }
        out.push_str(&name);
        out.push_str(": ");
        out.push_str(&body.join(" "));
        out.push('\n');
    }
    Ok(out)
}

fn rule_name(gbnf: &str) -> String {
    let body: String =
        gbnf.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
    format!("g_{body}")
}

/// One escape after `\`: the character and how many input characters it used.
fn escape(s: &[char]) -> Option<(char, usize)> {
    let hex = |n: usize| -> Option<(char, usize)> {
        let h: String = s.get(1..=n)?.iter().collect();
        char::from_u32(u32::from_str_radix(&h, 16).ok()?).map(|c| (c, n + 1))
    };
    match s.first()? {
        'n' => Some(('\n', 1)),
        't' => Some(('\t', 1)),
        'r' => Some(('\r', 1)),
        'x' => hex(2),
        'u' => hex(4),
        'U' => hex(8),
        &c => Some((c, 1)),
    }
}

/// A character as a Rust-regex class member.
fn regex_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '&' | '~' => format!("\\{c}"),
        '/' => "\\/".to_owned(),
        c if c.is_control() => format!("\\x{{{:x}}}", c as u32),
        c => c.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::to_lark;

    #[test]
    fn rewrites_llama_cpp_notation() {
        let g = r#"
            # a list of numbers
            root   ::= "[" ws (num ("," ws num)*)? "]"
            num    ::= "-"? [0-9]+ ("." [0-9]{1,3})?
            ws     ::= [ \t\n]*
            name-x ::= [^"\\] | "\u00e9\n"
        "#;
        let l = to_lark(g).expect("converts");
        assert_eq!(
            l,
            "start: g_root\n\
             g_root: \"[\" g_ws ( g_num ( \",\" g_ws g_num ) * ) ? \"]\"\n\
             g_num: \"-\" ? /[0-9]/ + ( \".\" /[0-9]/ {1,3} ) ?\n\
             g_ws: /[ \\x{9}\\x{a}]/ *\n\
             g_name_x: /[^\"\\\\]/ | \"é\\n\"\n"
        );
        for (bad, why) in [("root ::= \"a", "unterminated"), ("x ::= \"a\"", "root"), ("root ::= [a-", "unterminated")]
        {
            assert!(to_lark(bad).is_err_and(|e| e.contains(why)), "{bad}");
        }
    }
}
