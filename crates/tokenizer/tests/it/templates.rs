//! Real chat templates of the families we serve (Qwen2.5, Qwen3, Llama 3.1/3.2, SmolLM3,
//! Phi-3.5, Phi-4-mini, Mistral Nemo) render exactly as HF transformers renders them: llama.cpp's vendored
//! `models/templates/*.jinja` (fetched with the llama-cpp-python 0.3.36 sdist), the conversations
//! and HF's output in `fixtures/chat_template_golden.json` from
//! `scripts/goldens/chat_template_golden.py` (transformers' `render_jinja_template`): system
//! prompts, several turns, tools offered, an assistant tool call with its result, with and
//! without the generation prompt, Qwen3's and SmolLM3's `enable_thinking`, reasoning sent back,
//! and tools on the system message (Phi-4-mini's way).

use sparrow_tokenizer::{render_template, ChatMessage};

#[test]
fn family_templates_render_as_hf_does() {
    use sha2::{Digest, Sha256};
    let dir =
        sparrow_assets::ensure_sdist_dir(sparrow_assets::LLAMA_CPP_MODELS).expect("llama.cpp models (pip download)");
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template_golden.json");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
    let mut bad = Vec::new();
    let cases = g["cases"].as_array().expect("cases");
    for c in cases {
        let name = c["template"].as_str().expect("template");
        // Phi-4-mini's template is not vendored by llama.cpp: it is kept beside the fixture.
        let own = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates").join(name);
        let file = if own.exists() { own } else { dir.join("templates").join(name) };
        let text = std::fs::read_to_string(&file).expect("template file");
        let sha: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha, c["sha256"].as_str().expect("sha"), "{name}: not the template HF rendered");
        let messages: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).expect("messages");
        let tools = c["tools"].as_array().map(|_| &c["tools"]);
        let mut vars = c["variables"].as_object().expect("variables").clone();
        let bos = vars.remove("bos_token").and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        let eos = vars.remove("eos_token").and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
        let gen = c["add_generation_prompt"].as_bool().expect("flag");
        let got = render_template(&text, &messages, tools, &vars, gen, (&bos, &eos));
        let what = format!("{name} / {} / gen {gen}", c["conversation"].as_str().unwrap_or("?"));
        // gpt-oss's template writes `strftime_now("%Y-%m-%d")`: the day HF rendered it and the
        // day this runs differ, so that one date is compared as a date, not a day.
        let (got, want) = (got.map(|g| undated(&g)), c["rendered"].as_str().map(undated));
        match (got, want.as_deref()) {
            (Ok(g), Some(w)) if g == w => {}
            (Ok(g), Some(w)) => bad.push(format!("{what}:\n--- ours\n{g}\n--- HF\n{w}")),
            (Err(e), Some(_)) => bad.push(format!("{what}: ours failed: {e}")),
            (Ok(_), None) => bad.push(format!("{what}: HF refused ({}), ours rendered", c["error"])),
            (Err(_), None) => {}
        }
    }
    assert!(bad.is_empty(), "{} of {} renderings differ:\n{}", bad.len(), cases.len(), bad.join("\n\n"));
}

/// `text` with the date after each "Current date: " replaced by `<date>`, once it is checked to
/// be a `YYYY-MM-DD` date.
fn undated(text: &str) -> String {
    const TAG: &str = "Current date: ";
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(TAG) {
        let date = &rest[i + TAG.len()..(i + TAG.len() + 10).min(rest.len())];
        let is_date = date.len() == 10
            && date.chars().enumerate().all(|(k, ch)| if k == 4 || k == 7 { ch == '-' } else { ch.is_ascii_digit() });
        assert!(is_date, "not a date after {TAG:?}: {date:?}");
        out.push_str(&rest[..i + TAG.len()]);
        out.push_str("<date>");
        rest = &rest[i + TAG.len() + 10..];
    }
    out.push_str(rest);
    out
}

/// `strftime` against Python's `datetime.fromtimestamp(s, timezone.utc).strftime(...)` at the
/// epoch, a leap day, a Saturday evening and the last second of 2099.
#[test]
fn strftime_is_pythons() {
    let f = "%Y-%m-%d %H:%M:%S %A %a %B %b %%";
    for (secs, want) in [
        (0, "1970-01-01 00:00:00 Thursday Thu January Jan %"),
        (951_782_400, "2000-02-29 00:00:00 Tuesday Tue February Feb %"),
        (1_796_501_753, "2026-12-05 20:15:53 Saturday Sat December Dec %"),
        (4_102_444_799, "2099-12-31 23:59:59 Thursday Thu December Dec %"),
    ] {
        assert_eq!(sparrow_tokenizer::strftime(f, secs).as_deref(), Ok(want), "{secs}");
    }
    assert!(sparrow_tokenizer::strftime("%j", 0).is_err(), "an unsupported directive is an error");
}

/// The start-up check (`check_template`: a plain conversation, one with tools and a tool
/// call, a 64-turn one, under the check's fuel, output cap and memory budget) passes every real
/// template of the golden set without a refusal or a warning.
#[test]
fn family_templates_pass_the_start_up_check() {
    let dir =
        sparrow_assets::ensure_sdist_dir(sparrow_assets::LLAMA_CPP_MODELS).expect("llama.cpp models (pip download)");
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_template_golden.json");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
    let mut names: Vec<&str> =
        g["cases"].as_array().expect("cases").iter().filter_map(|c| c["template"].as_str()).collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 8, "{names:?}");
    let mut warned = Vec::new();
    for name in names {
        let own = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates").join(name);
        let file = if own.exists() { own } else { dir.join("templates").join(name) };
        let text = std::fs::read_to_string(&file).expect("template file");
        match sparrow_tokenizer::check_template(&text, ("<s>", "</s>"), name) {
            Ok(None) => {}
            Ok(Some(w)) => warned.push(format!("{name}: {w}")),
            Err(e) => panic!("{name} refused by the start-up check: {e}"),
        }
    }
    assert!(warned.is_empty(), "{warned:#?}");
}
