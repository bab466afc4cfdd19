"""The OpenAI Python SDK's Responses API against `sparrow serve` (argv[1]: its port; argv[2]: its
--api-key).

Prints one JSON object of what the SDK returned; the Rust test asserts on it. Every streamed
event is parsed by the SDK into its own event models (an unknown or malformed event raises).
"""
import json, sys
from typing import List, Literal
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

client = OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key=sys.argv[2])
model = client.models.list().data[0].id
out = {}
Q = "What is the capital of France?"

# Plain text, non-streamed and streamed (typed events, in order, numbered).
plain = client.responses.create(model=model, input=Q, max_output_tokens=24, temperature=0)
out["plain"] = {"text": plain.output_text, "status": plain.status, "usage": plain.usage.model_dump(),
                "incomplete": plain.incomplete_details and plain.incomplete_details.reason}
types, seqs, text, final = [], [], "", None
for ev in client.responses.create(model=model, input=Q, max_output_tokens=24, temperature=0, stream=True):
    types.append(ev.type)
    seqs.append(ev.sequence_number)
    if ev.type == "response.output_text.delta":
        text += ev.delta
    if ev.type in ("response.completed", "response.incomplete"):
        final = ev.response
out["streamed"] = {"types": types, "seqs": seqs, "text": text, "final_text": final.output_text,
                   "status": final.status, "usage": final.usage.model_dump()}

# Logprobs (`include` + `top_logprobs`): one entry per output token, streamed and not.
LP = dict(include=["message.output_text.logprobs"], top_logprobs=2, max_output_tokens=8, temperature=0)
lp_plain = client.responses.create(model=model, input=Q, **LP)
lp_stream = []
for ev in client.responses.create(model=model, input=Q, stream=True, **LP):
    if ev.type == "response.output_text.delta":
        lp_stream += [(l.token, l.logprob) for l in ev.logprobs]
part = lp_plain.output[0].content[0]
out["logprobs"] = {"plain": [(l.token, l.logprob, len(l.top_logprobs)) for l in part.logprobs],
                   "streamed": lp_stream, "tokens": lp_plain.usage.output_tokens}
lp_chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": Q}], max_tokens=8,
                                         temperature=0, logprobs=True, top_logprobs=2)
out["logprobs"]["chat"] = [(t.token, t.logprob) for t in lp_chat.choices[0].logprobs.content]

# Chat and Responses lower into one request: the same greedy answer.
chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": Q}], max_tokens=24,
                                      temperature=0)
out["chat_text"] = chat.choices[0].message.content

# Structured output with a pydantic model, non-streamed (.parse) and streamed (.stream).
class City(BaseModel):
    name: Literal["Paris", "Lyon", "Nice"]
    population: int = Field(ge=1000, le=99999999)
    tags: List[Literal["old", "big", "sunny"]] = Field(min_length=1, max_length=3)

parsed = client.responses.parse(model=model, input="Describe a French city.", text_format=City,
                                max_output_tokens=120, temperature=0)
out["parsed"] = {"city": parsed.output_parsed.model_dump(), "status": parsed.status}
with client.responses.stream(model=model, input="Describe a French city.", text_format=City,
                             max_output_tokens=120, temperature=0) as stream:
    n_events = sum(1 for _ in stream)
    fin = stream.get_final_response()
out["parsed_stream"] = {"city": fin.output_parsed.model_dump(), "events": n_events,
                        "output": [o.model_dump(exclude={"id"}) for o in fin.output],
                        "nonstream_output": [o.model_dump(exclude={"id"}) for o in parsed.output]}

# A function tool across a call -> output -> answer loop, the history sent back as items.
tools = [{"type": "function", "name": "get_weather", "description": "Current weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                         "required": ["city", "unit"], "additionalProperties": False}}]
history = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.responses.create(model=model, input=history, tools=tools, tool_choice="required",
                                max_output_tokens=80, temperature=0)
calls = [o for o in first.output if o.type == "function_call"]
history += [o.model_dump(exclude_none=True) for o in first.output]
history += [{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temp": 21})} for c in calls]
second = client.responses.create(model=model, input=history, tools=tools, tool_choice="none",
                                 max_output_tokens=24, temperature=0)
# The same loop through previous_response_id: only the new items are sent.
chained = client.responses.create(model=model, previous_response_id=first.id, tools=tools, tool_choice="none",
    input=[{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temp": 21})} for c in calls],
    max_output_tokens=24, temperature=0)
out["tools"] = {"calls": [{"name": c.name, "args": json.loads(c.arguments), "call_id": c.call_id} for c in calls],
                "first_status": first.status, "second": second.output_text, "chained": chained.output_text,
                "chained_prev": chained.previous_response_id}
# Streamed calls: arguments in pieces, folded by the SDK.
with client.responses.stream(model=model, input="What is the weather in Paris?", tools=tools,
                             tool_choice={"type": "function", "name": "get_weather"},
                             max_output_tokens=80, temperature=0) as stream:
    pieces = sum(1 for ev in stream if ev.type == "response.function_call_arguments.delta")
    fc = [o for o in stream.get_final_response().output if o.type == "function_call"]
out["streamed_call"] = {"pieces": pieces, "name": fc[0].name, "args": json.loads(fc[0].arguments)}

# Stored responses: retrieve, delete, then 404 in OpenAI's shape.
got = client.responses.retrieve(first.id)
out["retrieved_same"] = got.model_dump() == first.model_dump()
client.responses.delete(first.id)
try:
    client.responses.retrieve(first.id)
    out["after_delete"] = "found"
except openai.NotFoundError as e:
    out["after_delete"] = e.status_code
try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_nope")
    out["unknown_prev"] = "ok"
except openai.NotFoundError as e:
    out["unknown_prev"] = e.status_code
try:
    client.responses.create(model=model, input=[{"type": "message", "role": "user", "content": 7}])
    out["bad_input"] = "ok"
except openai.BadRequestError as e:
    out["bad_input"] = {"status": e.status_code, "param": e.body.get("param"), "message": e.body.get("message")}
print(json.dumps(out))
