#!/usr/bin/env python3
"""Goldens of real chat templates rendered by HF transformers, for
`crates/tokenizer/tests/it/templates.rs`.

    $PEERS/venv/bin/python scripts/goldens/chat_template_golden.py \\
        --out crates/tokenizer/tests/fixtures/chat_template_golden.json

The templates are llama.cpp's `models/templates/*.jinja` as vendored in the llama-cpp-python
0.3.36 source distribution (`$PEERS/src/llama_cpp_python-0.3.36`, unpacked by
../shared/peers/setup.sh; the Rust test fetches the same files with pip). Each is rendered with
`transformers.utils.chat_template_utils.render_jinja_template`, what `apply_chat_template(...,
tokenize=False)` calls (jinja2 with `trim_blocks` and `lstrip_blocks`, HF's `tojson`,
`raise_exception`, `strftime_now`), on fixed conversations: a system prompt and a user turn,
several turns, a tool definition with an assistant tool call and the tool's result, and the
template's own switches (`enable_thinking` for Qwen3 and SmolLM3). `date_string` is fixed so
Llama 3.x's date line does not depend on the day; gpt-oss's `strftime_now` date is the day the
script ran (the test compares it as a date). The fixture stores each template's file name
and SHA-256, the messages, tools and variables as passed, and HF's output.
"""
import argparse
import hashlib
import json
import os
from pathlib import Path

PEERS = Path(os.environ.get("PEERS", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparrow-peers"))
TEMPLATES = PEERS / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "models" / "templates"
# Templates llama.cpp does not vendor, kept beside the fixture (Phi-4-mini's, from its
# tokenizer_config.json); the test looks there first.
OWN_TEMPLATES = Path(__file__).resolve().parents[2] / "crates" / "tokenizer" / "tests" / "fixtures" / "templates"

# (file, bos_token, eos_token): the special tokens each model's tokenizer config states.
FILES = [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>"),
    ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "", "<|im_end|>"),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
    ("microsoft-Phi-4-mini-instruct.jinja", "<|endoftext|>", "<|endoftext|>"),
    # The MoE families' templates: gpt-oss's harmony and GLM-4.6's.
    ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
    ("GLM-4.6.jinja", "", "<|endoftext|>"),
    # DeepSeek-V3.1's (tool calls in its `<｜tool▁calls▁begin｜>` block, `thinking` off by default).
    ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
                           "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = [
    ("system and user", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three prime numbers."},
    ], None, {}),
    ("turns", [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Say 'ok' twice,\nthen stop."},
    ], None, {}),
    ("tool call and result", [
        {"role": "system", "content": "Use tools when they help."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "{\"temp_c\": 21}", "tool_call_id": "call00001", "name": "get_weather"},
    ], [WEATHER], {}),
    ("tools offered", [
        {"role": "user", "content": "Weather in Oslo, in f?"},
    ], [WEATHER], {}),
    # The reasoning a parser returned, sent back (Qwen3 re-renders the last turn's as <think>).
    ("reasoning sent back", [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two and two."},
        {"role": "user", "content": "And 3 + 3?"},
        {"role": "assistant", "content": "6.", "reasoning_content": "Three and three make six."},
    ], None, {}),
    # Phi-4-mini's model card: the tools as a JSON string on the system message.
    ("tools on the system message", [
        {"role": "system", "content": "You are a helpful assistant with some tools.", "tools": json.dumps([WEATHER])},
        {"role": "user", "content": "Weather in Oslo?"},
    ], None, {}),
    ("thinking off", [
        {"role": "user", "content": "2 + 2?"},
    ], None, {"enable_thinking": False}),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template
    cases = []
    for name, bos, eos in FILES:
        text = ((OWN_TEMPLATES if (OWN_TEMPLATES / name).exists() else TEMPLATES) / name).read_text()
        for conv, messages, tools, extra in CONVERSATIONS:
            # With and without the generation prompt where a conversation ends on a reply.
            for gen in ([True, False] if conv in ("turns", "tool call and result", "reasoning sent back") else [True]):
                kwargs = {"bos_token": bos, "eos_token": eos, "date_string": "26 Jul 2024", **extra}
                try:
                    out = render_jinja_template([messages], tools=tools, chat_template=text,
                                                add_generation_prompt=gen, **kwargs)[0][0]
                    err = None
                except Exception as e:  # noqa: BLE001 - a template's own refusal is a golden too
                    out, err = None, f"{type(e).__name__}: {e}"
                cases.append({"template": name, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                              "conversation": conv, "messages": messages, "tools": tools,
                              "add_generation_prompt": gen, "variables": kwargs, "rendered": out, "error": err})
    out = {"reference": f"transformers {transformers.__version__} render_jinja_template (jinja2)",
           "generator": "scripts/goldens/chat_template_golden.py", "cases": cases}
    a.out.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {a.out}: {len(cases)} cases, {sum(c['error'] is not None for c in cases)} refusals")


if __name__ == "__main__":
    main()
