#!/usr/bin/env python3
"""Re-reading through the real server (issue 22): each task document of the
natural split (trial T, rotations R: three documents, five questions each)
uploaded to a session with the server's default pot; its questions asked
from the session's question-agnostic pot (--agnostic), then all at once with
`"reread": true`, so that they share one pass over the log (the server's
--reread-share: rows or pots), and with --solo each alone too. Prints one
JSON line per answer (hit, pass, latency, tokens re-read per second),
appends them to OUT/reread.jsonl, and ends with hits/questions and Wilson
intervals per mode.

    .venv/bin/python tests/bench/longdoc/reread_bench.py -m MODEL --length 32768
        [--trial 0] [--rotations 0,1,2] [--ask single,...] [--share rows|pots] [--solo] [--agnostic]
        [--backend cpu|cuda]
"""
import argparse
import concurrent.futures
import json
import pathlib
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "py"))
import corpus  # noqa: E402
import run  # noqa: E402
import tasks  # noqa: E402
from server_util import Server  # noqa: E402


def ask(srv, sid, question, reread):
    body = {"model": "x", "max_tokens": 40, "temperature": 0, "session": sid, "reread": reread,
            "messages": [{"role": "user", "content": question}]}
    t0 = time.time()
    st, r, _ = srv.request("POST", "/v1/chat/completions", body, timeout=7200)
    assert st == 200, r
    return r, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--split", default="test")
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--rotations", default="0,1,2")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ask", default=",".join(tasks.TASKS))
    ap.add_argument("--share", default="rows", choices=("rows", "pots"))
    ap.add_argument("--solo", action="store_true", help="also re-read for each question alone")
    ap.add_argument("--agnostic", action="store_true", help="also ask the session's own pot")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="cpu", help="cpu, or cuda (POTSERVE_BIN naming a make CUDA=1 binary)")
    ap.add_argument("--out", default=str(ROOT / "build" / "longdoc_nat"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tpb = run.tokens_per_byte(SimpleNamespace(model=a.model), a.split, out)  # run.py's documents
    rows = []
    with tempfile.TemporaryDirectory() as data:
        import server_util
        server_util.MODEL = a.model
        srv = Server(data, "--backend", a.backend, "--budget-tokens", str(a.budget), "--threads", str(a.threads),
                     "--reread-share", a.share, "--reread-gather-ms", "1000",
                     "--recall", "false")  # --agnostic asks the pot alone (run.py's infinipot-recall has recall)
        srv.start()
        try:
            for rot in map(int, a.rotations.split(",")):
                plan = tasks.document_plan(a.seed, a.split, a.length, a.trial, rot)
                paras = corpus.shuffled(corpus.load_units(), a.split, f"{a.seed}:{a.trial}:{rot}")
                text, _ = tasks.build_document(paras, tpb, a.length, plan, rot)
                st, sess, _ = srv.request("POST", "/v1/sessions", {})
                t0 = time.time()
                st, up, _ = srv.request("POST", f"/v1/sessions/{sess['id']}/chunks?final=true", raw=text.encode(),
                                        headers={"Content-Type": "text/plain; charset=utf-8"}, timeout=7200)
                upload_s = time.time() - t0
                assert st == 200, up
                asked = [(t, task) for t, task in enumerate(plan) if task["kind"] in a.ask.split(",")]
                base = dict(model=pathlib.Path(a.model).name, split=a.split, length=a.length, trial=a.trial,
                            rotation=rot, doc_tokens=up["tokens_ingested"],
                            upload_tokens_per_s=up["tokens_ingested"] / upload_s, budget=a.budget,
                            threads=a.threads, backend=a.backend)
                answers = []  # (mode, t, response, seconds)
                if a.agnostic:
                    answers += [("agnostic", t, *ask(srv, sess["id"], task["question"], False)) for t, task in asked]
                with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
                    futs = [(t, pool.submit(ask, srv, sess["id"], task["question"], True)) for t, task in asked]
                    answers += [(f"shared-{a.share}", t, *f.result()) for t, f in futs]
                if a.solo:
                    answers += [("solo", t, *ask(srv, sess["id"], task["question"], True)) for t, task in asked]
                for mode, t, r, seconds in answers:
                    task = plan[t]
                    ans = r["choices"][0]["message"]["content"]
                    row = dict(base, mode=mode, task=task["kind"], depth=tasks.depth_of(t, rot),
                               hit=tasks.score(task, ans), answer=ans, expected=task["answer"], seconds=seconds)
                    if "reread" in r:
                        rr = r["reread"]
                        row.update(reread=rr, reread_tokens_per_s=rr["tokens"] / rr["seconds"],
                                   question_tokens_per_s=rr["tokens"] * rr["questions"] / rr["seconds"])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    with open(out / "reread.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
        finally:
            srv.stop()
    for mode in dict.fromkeys(r["mode"] for r in rows):
        cell = [r for r in rows if r["mode"] == mode]
        k, n = sum(r["hit"] for r in cell), len(cell)
        lo, hi = run.wilson(k, n)
        speed = [r["reread_tokens_per_s"] for r in cell if "reread_tokens_per_s" in r]
        tps = f", {min(speed):.0f}-{max(speed):.0f} tokens re-read/s" if speed else ""
        print(f"{mode} {a.length}: {k}/{n} ({100 * k / n:.0f} %, {100 * lo:.0f}-{100 * hi:.0f}){tps}")


if __name__ == "__main__":
    main()
