"""Decode speed with and without a JSON-schema constraint (response_format).

Starts `build/potserve serve` on loopback with the default model and, run
after run, alternates one streamed chat request of each kind with the same
prompt: unconstrained, response_format json_object, a json_schema with
nested objects, arrays, enums and free strings, and the same schema with
numeric limits (minimum, maximum, exclusiveMinimum). Decode tokens/s of a request
= (completion tokens - 1) / (time from its first content chunk to its last),
so the prefill is left out; reports the median of each kind and its ratio to
unconstrained, and how often the mask had to be built. The constrained runs pay the sampler's check of each token
against the automaton and, when the model's choice is not allowed, the
vocabulary-trie walk that builds the mask.

    .venv/bin/python tests/bench/constrained.py [--runs 5] [--max-tokens 200] [--threads 2]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import threading
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "chapters": {"type": "array", "minItems": 2, "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "summary": {"type": "string"},
                           "mood": {"enum": ["happy", "sad", "tense"]}, "pages": {"type": "integer"}},
            "required": ["name", "summary", "mood", "pages"], "additionalProperties": False}},
        "rating": {"type": "number"},
    },
    "required": ["title", "chapters", "rating"], "additionalProperties": False,
}

# the same with numeric limits: each digit is checked against them (engine/grammar.c, number_rest)
LIMITED = json.loads(json.dumps(SCHEMA))
LIMITED["properties"]["chapters"]["items"]["properties"]["pages"].update(minimum=1, maximum=2000)
LIMITED["properties"]["rating"].update(exclusiveMinimum=0, maximum=5)

KINDS = {
    "unconstrained": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA}},
    "json_schema_limits": {"type": "json_schema", "json_schema": {"name": "book", "schema": LIMITED}},
}


def start(model, threads):
    p = subprocess.Popen([str(ROOT / "build" / "potserve"), "serve", "--model", model, "--port", "0",
                          "--data-dir", "/tmp/potserve-bench-constrained", "--threads", str(threads),
                          "--access-log=false"], stderr=subprocess.PIPE, text=True)
    port = []
    ready = threading.Event()

    def read():
        for line in p.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                port.append(int(m.group(1)))
                ready.set()
    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(120):
        p.kill()
        raise SystemExit("server did not start")
    return p, f"http://127.0.0.1:{port[0]}"


def one(url, rf, max_tokens, seed):
    body = {"messages": [{"role": "user", "content": "Describe a book you like, in JSON, with its chapters."}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    if rf:
        body["response_format"] = rf
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first = last = None
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            if j["choices"] and j["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    if not first or last == first or tokens < 2:
        return None
    return (tokens - 1) / (last - first), tokens


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        m = re.search(rf"^{name} (\S+)$", r.read().decode(), re.M)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    p, url = start(a.model, a.threads)
    try:
        one(url, None, 8, 0)  # warm-up
        rates = {k: [] for k in KINDS}
        lengths = {k: [] for k in KINDS}
        for run in range(a.runs):
            for kind, rf in KINDS.items():
                got = one(url, rf, a.max_tokens, run)
                if got:
                    rates[kind].append(got[0])
                    lengths[kind].append(got[1])
        masked = metric(url, "potserve_grammar_masked_steps_total")
        constrained = metric(url, "potserve_constrained_tokens_total")
        base = statistics.median(rates["unconstrained"])
        for kind in KINDS:
            med = statistics.median(rates[kind])
            print(f"{kind:14s} decode {med:7.1f} tok/s  ratio {med / base:5.3f}  "
                  f"(runs {len(rates[kind])}, tokens/run median {statistics.median(lengths[kind]):.0f})")
        print(f"constrained tokens {constrained:.0f}, of which the sampler's first draw was refused "
              f"(mask built) {masked:.0f} ({100 * masked / max(constrained, 1):.1f} %)")
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
