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
        match (got, c["rendered"].as_str()) {
            (Ok(g), Some(w)) if g == w => {}
            (Ok(g), Some(w)) => bad.push(format!("{what}:\n--- ours\n{g}\n--- HF\n{w}")),
            (Err(e), Some(_)) => bad.push(format!("{what}: ours failed: {e}")),
            (Ok(_), None) => bad.push(format!("{what}: HF refused ({}), ours rendered", c["error"])),
            (Err(_), None) => {}
        }
    }
    assert!(bad.is_empty(), "{} of {} renderings differ:\n{}", bad.len(), cases.len(), bad.join("\n\n"));
}
