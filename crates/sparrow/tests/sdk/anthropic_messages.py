"""The Anthropic Python SDK's Messages API against `sparrow serve` (argv[1]: its port; argv[2]:
its --api-key, sent as `x-api-key` as the SDK does).

Prints one JSON object of what the SDK returned; the Rust test asserts on it. Streams are read
through the SDK's own event models and accumulated by its `MessageStream`.
"""
import json, sys
import anthropic

from typing import Literal
from pydantic import BaseModel

client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{sys.argv[1]}", api_key=sys.argv[2])
model = "sparrow"
out = {}
T0 = {"temperature": 0}  # the SDK no longer has the field; the API still takes it
Q = [{"role": "user", "content": "What is the capital of France?"}]

plain = client.messages.create(model=model, max_tokens=24, extra_body=T0, messages=Q)
out["plain"] = plain.model_dump(exclude={"id"})
types, text = [], ""
with client.messages.stream(model=model, max_tokens=24, extra_body=T0, messages=Q) as stream:
    for ev in stream:
        types.append(ev.type)
        if ev.type == "text":
            text += ev.text
    final = stream.get_final_message()
out["streamed"] = {"types": types, "text": text, "final": final.model_dump(exclude={"id"})}

# The same request through raw events (create(stream=True)): every event parses.
raw_types = [ev.type for ev in client.messages.create(model=model, max_tokens=8, extra_body=T0, messages=Q,
                                                        stream=True)]
out["raw_types"] = raw_types

# A stop sequence is reported as such.
stopped = client.messages.create(model=model, max_tokens=40, extra_body=T0, messages=Q, stop_sequences=[","])
out["stopped"] = {"reason": stopped.stop_reason, "seq": stopped.stop_sequence,
                  "text": "".join(b.text for b in stopped.content if b.type == "text")}

# Tools: a forced call, its result sent back, the answer.
tools = [{"name": "get_weather", "description": "Current weather of a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                           "required": ["city", "unit"], "additionalProperties": False}}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.messages.create(model=model, max_tokens=80, extra_body=T0, messages=ask, tools=tools,
                               tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
uses = [b for b in first.content if b.type == "tool_use"]
follow = ask + [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": "21 degrees"}
                                             for u in uses]}]
second = client.messages.create(model=model, max_tokens=24, extra_body=T0, messages=follow, tools=tools,
                                tool_choice={"type": "none"})
with client.messages.stream(model=model, max_tokens=80, extra_body=T0, messages=ask, tools=tools,
                            tool_choice={"type": "any"}) as stream:
    json_pieces = sum(1 for ev in stream if ev.type == "input_json")
    streamed_call = stream.get_final_message()
out["tools"] = {"first_reason": first.stop_reason, "uses": [{"name": u.name, "input": u.input} for u in uses],
                "second": second.model_dump(exclude={"id"}),
                "streamed": streamed_call.model_dump(exclude={"id"}), "json_pieces": json_pieces}
# Structured output through the SDK's own helper (output_config.format). The SDK moves length
# and range constraints out of the schema into descriptions, so the model has none.
class City(BaseModel):
    name: Literal["Paris", "Lyon", "Nice"]
    coastal: bool

parsed = client.messages.parse(model=model, max_tokens=120, extra_body=T0, output_format=City,
                               messages=[{"role": "user", "content": "Describe a French city."}])
out["parsed"] = {"city": parsed.parsed_output.model_dump(), "reason": parsed.stop_reason}
out["count"] = client.messages.count_tokens(model=model, messages=Q).input_tokens
out["count_tools"] = client.messages.count_tokens(model=model, messages=ask, tools=tools,
                                                  tool_choice={"type": "any"}).input_tokens

# Errors in Anthropic's shape, before any stream byte.
def err(**kw):
    try:
        client.messages.create(model=model, **kw)
        return "ok"
    except anthropic.APIStatusError as e:
        return {"status": e.status_code, "type": e.body["error"]["type"], "message": e.body["error"]["message"]}
def raw(body):
    import urllib.request, urllib.error
    req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/v1/messages", data=json.dumps(body).encode(),
                                 headers={"x-api-key": sys.argv[2], "anthropic-version": "2023-06-01",
                                          "anthropic-beta": "tools-2024-04-04", "content-type": "application/json"})
    try:
        urllib.request.urlopen(req)
        return "ok"
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": json.loads(e.read())}
out["no_max_tokens"] = raw({"model": model, "messages": Q})
out["bad_role"] = raw({"model": model, "max_tokens": 8, "stream": True, "messages": [{"role": "robot", "content": "x"}]})
out["bad_block"] = err(max_tokens=8, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
out["bad_stream"] = err(max_tokens=8, messages=Q, stream=True, extra_body={"temperature": "hot"})
try:
    anthropic.Anthropic(base_url=f"http://127.0.0.1:{sys.argv[1]}", api_key="wrong").messages.create(
        model=model, max_tokens=8, messages=Q)
    out["wrong_key"] = "ok"
except anthropic.AuthenticationError as e:
    out["wrong_key"] = {"status": e.status_code, "type": e.body["error"]["type"]}
print(json.dumps(out))
