#!/usr/bin/env python3
"""Re-reading through the real server (issue 22): one task document of the
natural TEST split uploaded to a session with the server's default pot, then
each question asked twice, from the session's question-agnostic pot and with
`"reread": true`; prints one JSON line per answer (hit, latency, tokens
re-read per second) and appends them to OUT/reread.jsonl.

    .venv/bin/python tests/bench/longdoc/reread_bench.py -m MODEL --length 32768
        [--trial 0] [--rotation 0] [--ask single,fact] [--budget 2048] [--threads 1]
"""
import argparse
import json
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "py"))
import corpus  # noqa: E402
import tasks  # noqa: E402
from server_util import Server  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--split", default="test")
    ap.add_argument("--trial", type=int, default=0)
    ap.add_argument("--rotation", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ask", default=",".join(tasks.TASKS))
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens-per-byte", type=float, default=0,
                    help="length estimate (default: OUT/calibration.json, which run.py --tasks writes)")
    ap.add_argument("--out", default=str(ROOT / "build" / "longdoc_nat"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    if not a.tokens_per_byte:  # the same documents as run.py's
        cal = json.loads((out / "calibration.json").read_text())
        a.tokens_per_byte = cal[f"{pathlib.Path(a.model).name}:{a.split}"]
    plan = tasks.document_plan(a.seed, a.split, a.length, a.trial, a.rotation)
    paras = corpus.shuffled(corpus.load_units(), a.split, f"{a.seed}:{a.trial}:{a.rotation}")
    text, _ = tasks.build_document(paras, a.tokens_per_byte, a.length, plan, a.rotation)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as data:
        import server_util
        server_util.MODEL = a.model
        srv = Server(data, "--budget-tokens", str(a.budget), "--threads", str(a.threads))
        srv.start()
        try:
            st, sess, _ = srv.request("POST", "/v1/sessions", {})
            t0 = time.time()
            st, up, _ = srv.request("POST", f"/v1/sessions/{sess['id']}/chunks?final=true", raw=text.encode(),
                                    headers={"Content-Type": "text/plain; charset=utf-8"}, timeout=7200)
            upload_s = time.time() - t0
            assert st == 200, up
            for t, task in enumerate(plan):
                if task["kind"] not in a.ask.split(","):
                    continue
                for reread in (False, True):
                    body = {"model": "x", "max_tokens": 40, "temperature": 0, "session": sess["id"],
                            "reread": reread, "messages": [{"role": "user", "content": task["question"]}]}
                    t1 = time.time()
                    st, r, _ = srv.request("POST", "/v1/chat/completions", body, timeout=7200)
                    assert st == 200, r
                    ans = r["choices"][0]["message"]["content"]
                    row = dict(model=pathlib.Path(a.model).name, split=a.split, length=a.length, trial=a.trial,
                               rotation=a.rotation, task=task["kind"], depth=tasks.depth_of(t, a.rotation),
                               reread=reread, hit=tasks.score(task, ans), answer=ans, expected=task["answer"],
                               seconds=time.time() - t1, doc_tokens=up["tokens_ingested"],
                               upload_tokens_per_s=up["tokens_ingested"] / upload_s, budget=a.budget,
                               threads=a.threads)
                    if reread:
                        row.update(reread_seconds=r["reread"]["seconds"],
                                   reread_tokens_per_s=r["reread"]["tokens"] / r["reread"]["seconds"])
                    print(json.dumps(row), flush=True)
                    with open(out / "reread.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
