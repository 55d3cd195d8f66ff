#!/usr/bin/env python3
"""llama.cpp side of the CPU benchmark (tests/bench/bench_cpu.py), in its own
process so that its peak RSS is its own.

    python llama_worker.py MODEL N_CTX THREADS [N_SEQ_MAX]

Loads MODEL with llama-cpp-python (f16 KV, flash attention off, n_batch and
n_ubatch 512, THREADS threads for both prefill and decode), prints one JSON
line {"ready": true, "load_s", "base_rss" (RSS before loading), ...}, then answers one JSON line per request line on stdin:

  {"op": "gen", "tokens": [...], "n": N}
      clears the KV cache, times the prefill of `tokens` (llm.eval) and then N
      greedy tokens: the first is sampled from the prefill's logits, each
      further one costs one single-token eval, and the last one is not
      evaluated -- the same count and clock as `potserve generate -v`
      (decode time from the end of the prefill to the N-th sampled token).
      -> {"n_prompt", "prompt_s", "n_gen", "decode_s", "ids"}
  {"op": "batch", "prompts": [[...], ...], "n": N}
      N greedy tokens for each prompt at once, one sequence id each, every
      decode step one llama_decode of all sequences (needs N_SEQ_MAX; the
      end-of-sequence token is banned so that every sequence runs N tokens).
      -> {"prefill_s", "decode_s", "n_gen"}: n_gen tokens in all, decode_s
      from the end of the prompts' prefill to the last sampled token.
  {"op": "rss"}  -> {"vm_hwm", "vm_rss"} in bytes (/proc/self/status)
  {"op": "quit"}
"""
import importlib
import json
import os
import sys
import time

import numpy as np
import llama_cpp

if os.environ.get("POTSERVE_LLAMA_NO_EXTRA_BUFTS") == "1":
    # llama.cpp's AMX kernels fault on some Xeon VMs: weights stay in plain
    # CPU buffers (tests/reference/lcpp.py patches the default parameters)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
    importlib.import_module("lcpp")  # (imported for what it patches)


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


class Worker:
    def __init__(self, model, n_ctx, threads, n_seq_max=1):
        kw = {}
        if n_seq_max > 1:
            kw["n_seq_max"] = n_seq_max
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, n_batch=512, n_ubatch=512,
                                   flash_attn=False, type_k=llama_cpp.GGML_TYPE_F16,
                                   type_v=llama_cpp.GGML_TYPE_F16, verbose=False, **kw)
        if n_seq_max > 1:
            # Llama() does not pass n_seq_max on; rebuild the context with it
            self.llm.context_params.n_seq_max = n_seq_max
            self.llm.context_params.kv_unified = False  # a KV stream per sequence
            self.llm._ctx.close()
            self.llm._ctx = llama_cpp._internals.LlamaContext(
                model=self.llm._model, params=self.llm.context_params, verbose=False)
        self.ctx = self.llm._ctx.ctx
        self.n_vocab = self.llm.n_vocab()
        self.n_ctx = n_ctx
        self.eos = self.llm.token_eos()

    def argmax(self, i=-1, ban_eos=False):
        p = llama_cpp.llama_get_logits_ith(self.ctx, i)
        logits = np.ctypeslib.as_array(p, shape=(self.n_vocab,))
        if ban_eos:
            logits = logits.copy()
            logits[self.eos] = -np.inf
        return int(np.argmax(logits))

    def clear(self):
        self.llm.reset()
        mem = llama_cpp.llama_get_memory(self.ctx)
        llama_cpp.llama_memory_clear(mem, True)

    def gen(self, tokens, n):
        llm = self.llm
        self.clear()
        t0 = time.perf_counter()
        llm.eval(tokens)
        t1 = time.perf_counter()
        ids = []
        if n > 0:
            tok = self.argmax()
            ids.append(tok)
            for _ in range(n - 1):
                llm.eval([tok])
                tok = self.argmax()
                ids.append(tok)
        t2 = time.perf_counter()
        return {"n_prompt": len(tokens), "prompt_s": t1 - t0, "n_gen": len(ids),
                "decode_s": t2 - t1, "ids": ids}

    def batch(self, prompts, n, ban_eos=True):
        """Greedy decoding of len(prompts) sequences (sequence ids 0..), every
        decode step one llama_decode of all of them; the end-of-sequence token
        is banned (as in tests/bench/bench_batch.c) so each runs n tokens."""
        self.clear()
        n_seq = len(prompts)
        b = llama_cpp.llama_batch_init(max(512, n_seq), 0, 1)

        def decode(entries):  # entries: (token, pos, seq, want_logits)
            b.n_tokens = len(entries)
            for i, (tok, pos, seq, out) in enumerate(entries):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, int(out)
                b.seq_id[i][0] = seq
            if llama_cpp.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")

        try:
            t0 = time.perf_counter()
            toks = []
            for s, p in enumerate(prompts):  # the prompts are short: one decode each
                decode([(t, j, s, j == len(p) - 1) for j, t in enumerate(p)])
                toks.append(self.argmax(-1, ban_eos))
            t1 = time.perf_counter()
            pos = [len(p) for p in prompts]
            n_gen = n_seq
            for _ in range(n - 1):
                decode([(toks[s], pos[s], s, True) for s in range(n_seq)])
                toks = [self.argmax(s, ban_eos) for s in range(n_seq)]
                pos = [x + 1 for x in pos]
                n_gen += n_seq
            t2 = time.perf_counter()
        finally:
            llama_cpp.llama_batch_free(b)
        return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "n_gen": n_gen}


def main():
    model, n_ctx, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    n_seq_max = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    base_rss = status_bytes("VmRSS")  # Python, numpy and llama_cpp before the model
    t0 = time.perf_counter()
    w = Worker(model, n_ctx, threads, n_seq_max)
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - t0, "base_rss": base_rss,
                      "llama_cpp": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "gen":
            res = w.gen(req["tokens"], req["n"])
        elif op == "batch":
            res = w.batch(req["prompts"], req["n"])
        elif op == "rss":
            res = {"vm_hwm": status_bytes("VmHWM"), "vm_rss": status_bytes("VmRSS")}
        elif op == "quit":
            break
        else:
            res = {"error": f"unknown op {op}"}
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
