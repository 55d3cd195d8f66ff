"""Notes taken while reading: a question-agnostic memory screened before
building it. The model reads a bench document chunk by chunk (about 1K
tokens each) and writes short notes of the facts each chunk states, without
knowing any question (a gist memory in the manner of ReadAgent); then each of
the document's five questions is asked over all the notes together. Two
figures per document: how many of the needles the notes still carry (every
number, VAR name, key word or city of a needle written in them: what a
memory of these notes holds, though a question may still be answered from
part of it, as a chain's value from its first line) and how many questions
the model answers from the notes (scored as the bench scores, tasks.score).

  .venv/bin/python tests/bench/longdoc/notes_screen.py --out build/fscreen -m MODEL --split tune --length 32768

reads the documents run.py wrote to OUT/work/ (doc_SPLIT_LENGTH_TRIAL_ROT.txt)
and rebuilds their plans with tasks.document_plan (run.py's default seed).
One `potserve generate` call per chunk: the chunk is prefilled again there,
which an engine version would not need (the chunk is in its KV already), so
the time it prints is an upper bound on the decoding such a memory costs.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

import tasks

ROOT = pathlib.Path(__file__).resolve().parents[3]
NOTE_PROMPT = ("Here is a passage from a long document.\n\n<passage>\n{}\n</passage>\n\n"
               "Write brief notes of the specific facts this passage states (names, places, dates, numbers, "
               "codes, definitions), one short line each, most distinctive first. No commentary.")
ASK_PROMPT = "Here are notes taken while reading a long document.\n\n<notes>\n{}\n</notes>\n\n{}"


def generate(a, prompt, n):
    out = subprocess.run([str(ROOT / "build" / "potserve"), "generate", "-m", a.model, "-t", str(a.threads),
                          "--chat", "-n", str(n), "-p", prompt], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def chunks(text, size):
    """Byte ranges of about `size` bytes, cut at paragraph ends where one is near."""
    out, s = [], 0
    while s < len(text):
        e = min(len(text), s + size)
        if e < len(text):
            p = text.rfind(b"\n\n", s + size // 2, e)
            if p > 0:
                e = p + 2
        out.append((s, e))
        s = e
    return out


def salient(needle):
    """The words a note must carry for a needle to survive in it: its numbers,
    its VAR names, its key word (the word before "is"), its person and city."""
    words = re.findall(r"\d+|VAR [A-Z]+", needle)
    m = re.search(r"for (\w+) is", needle)
    if m:
        words.append(m.group(1))
    m = re.match(r"(\w+ \w+) moved to (.+?) many years", needle)
    if m:
        words += [m.group(1).split()[1], m.group(2)]
    return [w.removeprefix("VAR ") for w in words]


def carried(needle, notes):
    return all(re.search(rf"\b{re.escape(w)}\b", notes) for w in salient(needle))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a run.py --tasks output folder holding work/doc_*.txt")
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--split", default="tune")
    ap.add_argument("--length", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=1, help="run.py's --seed")
    ap.add_argument("--chunk-bytes", type=int, default=4000)
    ap.add_argument("--note-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-docs", type=int, default=3)
    a = ap.parse_args()
    paths = sorted((pathlib.Path(a.out) / "work").glob(f"doc_{a.split}_{a.length}_*_*.txt"))[:a.max_docs]
    if not paths:
        sys.exit(f"no doc_{a.split}_{a.length}_*.txt under {a.out}/work (run run.py --tasks there first)")
    total = {"needles": 0, "carried": 0, "questions": 0, "hits": 0, "note_tokens": 0}
    for path in paths:
        trial, rot = (int(x) for x in path.stem.split("_")[-2:])
        plan = tasks.document_plan(a.seed, a.split, a.length, trial, rot)
        text = path.read_bytes()
        t0 = time.time()
        notes = [generate(a, NOTE_PROMPT.format(text[s:e].decode(errors="replace")), a.note_tokens)
                 for s, e in chunks(text, a.chunk_bytes)]
        note_s = time.time() - t0
        joined = "\n".join(notes)
        n_tok = len(subprocess.run([str(ROOT / "build" / "potserve"), "tokenize", "-m", a.model], input=joined,
                                   capture_output=True, text=True, check=True).stdout.split())
        row = {"doc": path.name, "chunks": len(notes), "note_tokens": n_tok, "note_s": round(note_s),
               "tasks": {}}
        for task in plan:
            needed = task["needles"][:1] if task["kind"] == "multikey" else task["needles"]
            have = [carried(n, joined) for n in task["needles"]]
            answer = generate(a, ASK_PROMPT.format(joined, task["question"]), 40)
            hit = tasks.score(task, answer)
            row["tasks"][task["kind"]] = {"carried": f"{sum(have)}/{len(have)}",
                                          "answerable": all(carried(n, joined) for n in needed),
                                          "hit": hit, "answer": answer[:80]}
            total["needles"] += len(have)
            total["carried"] += sum(have)
            total["questions"] += 1
            total["hits"] += hit
        total["note_tokens"] += n_tok
        print(json.dumps(row), flush=True)
    print(json.dumps(total), flush=True)


if __name__ == "__main__":
    main()
