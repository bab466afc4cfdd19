//! The tool-call format chosen from the chat template (`sparrow_server::tools::detect`), over
//! every template llama.cpp vendors (`models/templates/*.jinja`, fetched with the
//! llama-cpp-python 0.3.36 sdist). The table says, for each, the `--tool-call-parser` an SGLang
//! user would pass for that model ("-": none of ours reads its format, or it has none), read
//! from the template's own tool-call rendering; a template missing from the table fails, so a
//! new one is classified by hand.

use sparrow_server::tools::detect;

const EXPECTED: &[(&str, &str)] = &[
    ("Apertus-8B-Instruct.jinja", "-"),
    ("Apriel-1.6-15b-Thinker-fixed.jinja", "-"),
    ("Bielik-11B-v3.0-Instruct.jinja", "qwen25"),
    ("ByteDance-Seed-OSS.jinja", "-"),
    ("Cohere2MoE.jinja", "-"),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "-"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "-"),
    ("GLM-4.6.jinja", "glm45"),
    ("GLM-4.7-Flash.jinja", "glm45"),
    ("GigaChat3-10B-A1.8B.jinja", "-"),
    ("GigaChat3.1-10B-A1.8B.jinja", "-"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "-"),
    ("Kimi-K2-Instruct.jinja", "-"),
    ("Kimi-K2-Thinking.jinja", "-"),
    ("Kimi-K3.jinja", "-"),
    ("LFM2-8B-A1B.jinja", "-"),
    ("LFM2.5-8B-A1B.jinja", "-"),
    ("LFM2.5-Instruct.jinja", "-"),
    ("MiMo-VL.jinja", "qwen25"),
    ("MiniMax-M1.jinja", "-"),
    ("MiniMax-M2.jinja", "-"),
    ("MiniMax-M3.jinja", "-"),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "-"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "qwen3_coder"),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "-"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "qwen25"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "qwen25"),
    ("Qwen-QwQ-32B.jinja", "qwen25"),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen25"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen25"),
    ("Qwen3-Coder.jinja", "qwen3_coder"),
    ("Qwen3.5-4B.jinja", "qwen3_coder"),
    ("Reka-Edge.jinja", "qwen25"),
    ("Spark2.5.jinja", "glm45"),
    ("StepFun3.5-Flash.jinja", "qwen3_coder"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseekv3"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "deepseekv3"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseekv31"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "-"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "-"),
    ("deepseek-ai-DeepSeek-V4.jinja", "-"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", "phi4_mini"),
    ("google-gemma-2-2b-it.jinja", "-"),
    ("google-gemma-4-31B-it-interleaved.jinja", "-"),
    ("google-gemma-4-31B-it.jinja", "-"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "-"),
    ("ibm-granite-granite-4.0.jinja", "qwen25"),
    ("ibm-granite-granite-4.1.jinja", "qwen25"),
    ("inclusionai-ling-3.0-flash.jinja", "glm45"),
    ("llama-cpp-deepseek-r1.jinja", "deepseekv3"),
    ("llama-cpp-rwkv-world.jinja", "-"),
    ("meetkai-functionary-medium-v3.1.jinja", "-"),
    ("meetkai-functionary-medium-v3.2.jinja", "-"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "-"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "-"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "-"),
    ("moonshotai-Kimi-K2.jinja", "-"),
    ("muse-glimmer.jinja", "-"),
    ("openai-gpt-oss-120b.jinja", "gpt-oss"),
    ("openbmb-MiniCPM5-1B.jinja", "-"),
    ("poolside-Laguna-S-2.1.jinja", "glm45"),
    ("poolside-Laguna-XS-2.1.jinja", "glm45"),
    ("poolside-Laguna-XS.2.jinja", "glm45"),
    ("tencent-Hy3.jinja", "-"),
    ("unsloth-Apriel-1.5.jinja", "-"),
    ("unsloth-mistral-Devstral-Small-2507.jinja", "-"),
    ("upstage-Solar-Open-100B.jinja", "-"),
];

/// The vendored templates' directory and their file names, sorted.
fn templates() -> (std::path::PathBuf, Vec<String>) {
    let dir = sparrow_assets::ensure_sdist_dir(sparrow_assets::LLAMA_CPP_MODELS)
        .expect("llama.cpp models (pip download)")
        .join("templates");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("templates dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    names.sort();
    (dir, names)
}

#[test]
fn every_vendored_template_gets_its_format() {
    let (dir, names) = templates();
    assert!(names.len() >= 70, "{} templates in {}", names.len(), dir.display());
    let mut bad = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).expect("template");
        let d = detect(&text);
        let got = d.parser.map_or("-", |p| p.name());
        match EXPECTED.iter().find(|(n, _)| n == name) {
            Some((_, want)) if *want == got => {}
            Some((_, want)) => bad.push(format!("{name}: chose {got} ({}), expected {want}", d.why)),
            None => bad.push(format!("{name}: not in the table (chose {got}: {})", d.why)),
        }
    }
    // Phi-4-mini's template is not vendored by llama.cpp: the tokenizer's fixture keeps it.
    let phi = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tokenizer/tests/fixtures/templates/microsoft-Phi-4-mini-instruct.jinja");
    let d = detect(&std::fs::read_to_string(phi).expect("Phi-4-mini template"));
    if d.parser.map(|p| p.name()) != Some("phi4_mini") {
        bad.push(format!("Phi-4-mini: {d:?}"));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The reasoning parser chosen from the same templates: the templates that write reasoning
/// tags, with the `--reasoning-parser` an SGLang user would pass (every other template gets
/// none).
/// A prompt that ends inside an opened `<think>` (QwQ's, Qwen 3.5's and Nemotron's when thinking
/// is on) starts the answer inside the reasoning whatever the parser (`chat::opens_think`).
const REASONING: &[(&str, &str)] = &[
    ("Bielik-11B-v3.0-Instruct.jinja", "qwen3"),
    ("GLM-4.6.jinja", "glm45"),
    ("GLM-4.7-Flash.jinja", "glm45"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "qwen3"),
    ("Kimi-K2-Thinking.jinja", "qwen3"),
    ("LFM2.5-8B-A1B.jinja", "qwen3"),
    ("MiniMax-M2.jinja", "deepseek-r1"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", "qwen3"),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "qwen3"),
    ("Qwen-QwQ-32B.jinja", "qwen3"),
    ("Qwen-Qwen3-0.6B.jinja", "qwen3"),
    ("Qwen3.5-4B.jinja", "qwen3"),
    ("Reka-Edge.jinja", "qwen3"),
    ("Spark2.5.jinja", "glm45"),
    ("StepFun3.5-Flash.jinja", "deepseek-r1"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek-r1"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "qwen3"),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-v3"),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "deepseek-v3"),
    ("deepseek-ai-DeepSeek-V4-Flash-0731.jinja", "deepseek-v3"),
    ("deepseek-ai-DeepSeek-V4.jinja", "deepseek-v3"),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "qwen3"),
    ("inclusionai-ling-3.0-flash.jinja", "glm45"),
    ("llama-cpp-deepseek-r1.jinja", "deepseek-r1"),
    ("llama-cpp-rwkv-world.jinja", "qwen3"),
    ("openai-gpt-oss-120b.jinja", "gpt-oss"),
    ("openbmb-MiniCPM5-1B.jinja", "qwen3"),
    ("poolside-Laguna-S-2.1.jinja", "glm45"),
    ("poolside-Laguna-XS-2.1.jinja", "glm45"),
    ("poolside-Laguna-XS.2.jinja", "glm45"),
];

#[test]
fn every_vendored_template_gets_its_reasoning_parser() {
    let (dir, names) = templates();
    let mut bad = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).expect("template");
        let d = sparrow_server::tools::detect_reasoning(&text);
        let got = d.parser.map_or("-", |p| p.name());
        let want = REASONING.iter().find(|(n, _)| n == name).map_or("-", |(_, w)| *w);
        if got != want {
            bad.push(format!("    (\"{name}\", \"{got}\"), // expected {want}: {}", d.why));
        }
    }
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}
