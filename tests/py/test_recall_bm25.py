"""`potserve recall` (engine/recall.c) against an independent BM25: rank_bm25's
Okapi BM25 with Lucene's idf, over the passages the C code cut, on real text
(the long-document bench's corpus, Debian packages) and the bench's questions.
The passages themselves are checked for what they must be: in order, apart,
at most 1,024 bytes, covering every non-space byte of the document."""
import json
import math
import random
import sys

import pytest
from rank_bm25 import BM25Okapi

from conftest import ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))
import corpus  # noqa: E402
import tasks  # noqa: E402

PASSAGE_BYTES, MAX_TERMS, MAX_WORD = 1024, 64, 64


class LuceneBM25(BM25Okapi):
    """rank_bm25's Okapi BM25 (term frequency and length normalisation) with
    Lucene's always-positive idf, ln(1 + (N - df + 0.5) / (df + 0.5))."""

    def _calc_idf(self, nd):
        for word, df in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - df + 0.5) / (df + 0.5))


# the code points that part words though they are not ASCII (docs/methods.md, "Recall")
SEPARATORS = ({0xA0, 0xAB, 0xBB, 0xFEFF} | set(range(0x2000, 0x2070)) | set(range(0x3000, 0x3040)) |
              set(range(0xFF01, 0xFF10)) | set(range(0xFF1A, 0xFF21)) | set(range(0xFF3B, 0xFF41)) |
              set(range(0xFF5B, 0xFF66)))


def word_spans(b):
    """engine/recall.h's words as byte spans: runs of ASCII letters and digits and of every other
    character but the separators above (a byte that is not UTF-8 counts as a word's)."""
    spans, i, start = [], 0, None
    while i <= len(b):
        n, word = 1, False
        if i < len(b):
            if b[i] < 0x80:
                word = chr(b[i]).isalnum()
            else:
                for k in (2, 3, 4):
                    try:
                        ch = b[i:i + k].decode("utf-8")
                    except UnicodeDecodeError:
                        continue
                    n, word = k, ord(ch) not in SEPARATORS
                    break
                else:
                    word = True
        if word and start is None:
            start = i
        elif not word and start is not None:
            spans.append((start, i))
            start = None
        i += n
    return spans


def words(b):
    """The words, ASCII lower-cased, compared on their first 64 bytes."""
    return [b[s:e].lower()[:MAX_WORD] for s, e in word_spans(b)]


def query(question):
    out = []
    for w in words(question.encode()):
        if w not in out and len(out) < MAX_TERMS:
            out.append(w)
    return out


def sentence_around(doc, start, end, at):
    """engine/recall.c's sentence of the passage doc[start:end] around byte at:
    cut after ". ", "! ", "? " or a line break."""
    i = at
    while i > start and doc[i - 1:i] != b"\n" and not (i - start >= 2 and doc[i - 1:i] == b" "
                                                      and doc[i - 2:i - 1] in (b".", b"!", b"?")):
        i -= 1
    j = at
    while j < end and doc[j:j + 1] != b"\n" and not (doc[j:j + 1] in (b".", b"!", b"?") and
                                                    (j + 1 == end or doc[j + 1:j + 2] in (b" ", b"\n"))):
        j += 1
    return i, (j + 1 if j < end else end)


def first_word_at(doc, start, end, w):
    for s, e in word_spans(doc[start:end]):
        if doc[start + s:start + e].lower()[:MAX_WORD] == w:
            return start + s
    return start


def chain_of_links(doc, ps, order, q):
    """The links (docs/methods.md, "Recall"), written out again: from the best
    passage holding one of the question's rarest words, the sentence holding
    it; a word of it the question lacks, in exactly one other passage, leads
    there, at most 4 times. Indices into ps, in the order followed."""
    sets = [set(words(doc[p["start"]:p["start"] + p["len"]])) for p in ps]
    df = {w: sum(w in x for x in sets) for w in q}
    held = [w for w in q if df[w]]
    if not held:
        return []
    low = min(df[w] for w in held)
    start = next(i for i in order if any(df[w] == low and w in sets[i] for w in q))
    rare = next(w for w in q if df[w] == low and w in sets[start])
    p = ps[start]
    s, e = sentence_around(doc, p["start"], p["start"] + p["len"], first_word_at(doc, p["start"], p["start"] + p["len"], rare))
    chain = [start]
    while len(chain) <= 4:
        cand = []
        for w in words(doc[s:e]):
            if w not in q and w not in cand and len(cand) < MAX_TERMS:
                cand.append(w)
        nxt = None
        for w in cand:
            holders = [i for i in order if w in sets[i]]
            others = [i for i in holders if i not in chain]
            if len(holders) == 2 and others:
                nxt, via = others[0], w
                break
        if nxt is None:
            break
        chain.append(nxt)
        p = ps[nxt]
        s, e = sentence_around(doc, p["start"], p["start"] + p["len"], first_word_at(doc, p["start"], p["start"] + p["len"], via))
    return chain


def recall_scores(doc, question):
    p = run("recall", "-q", question, "--scores", input=doc, check=True)
    return [json.loads(x) for x in p.stdout.decode().splitlines()]


@pytest.fixture(scope="module")
def document():
    units = [t for _, split, t in corpus.load_units() if split == "test"]
    rng = random.Random(7)
    rng.shuffle(units)
    rng2 = random.Random(8)
    plan = [tasks.make_task(k, rng2) for k in tasks.TASKS]
    paras = units[:400]
    for t in plan:  # the needles as paragraphs of their own, as the bench puts them
        for n in t["needles"]:
            paras.insert(rng.randrange(len(paras)), n)
    return "\n\n".join(paras).encode(), plan, units[400:420]


def test_passages_cover_the_document_in_order(document):
    doc, _, _ = document
    ps = recall_scores(doc, "anything")
    assert len(ps) > 400  # at least one a paragraph; the long ones cut
    at = 0
    for p in ps:
        assert 0 < p["len"] <= PASSAGE_BYTES
        assert p["start"] >= at
        gap = doc[at:p["start"]]
        assert gap.strip() == b"", gap[:80]  # only white space between passages
        text = doc[p["start"]:p["start"] + p["len"]]
        assert text == text.strip()
        assert b"\n\n" not in text  # never across a paragraph break
        text.decode()  # never a cut inside a UTF-8 character
        at = p["start"] + p["len"]
    assert doc[at:].strip() == b""


def test_scores_match_an_independent_bm25(document):
    doc, plan, extra = document
    questions = [t["question"] for t in plan] + [u[:200] for u in extra[:10]] + \
        ["Wie heißt der Paketmanager? apt-get", "How do I configure the kernel's boot parameters in GRUB?"]
    for q in questions:
        ps = recall_scores(doc, q)
        ref = LuceneBM25([words(doc[p["start"]:p["start"] + p["len"]]) for p in ps], k1=1.2, b=0.75)
        want = ref.get_scores(query(q))
        assert [p["words"] for p in ps] == ref.doc_len
        for p, w in zip(ps, want):
            assert p["score"] == pytest.approx(w, rel=1e-9, abs=1e-12), q
        # the choice: the best that fit in 4,096 bytes, the chain's links right after its first
        # passage; laid out in reverse (the default, best-last) or in document order
        order = sorted(range(len(ps)), key=lambda i: (-want[i], i))
        chain = chain_of_links(doc, ps, order, query(q)) if want[order[0]] > 0 else []
        chosen, used = [], 0
        for i in order:
            if want[i] <= 0:
                break
            if i in chain[1:]:
                continue
            for j in (chain if chain and chain[0] == i else [i]):
                if ps[j]["len"] <= 4096 - used:
                    chosen.append(j)
                    used += ps[j]["len"]
        for flags, layout in (((), chosen[::-1]), (("--order", "document"), sorted(chosen))):
            got = run("recall", "-q", q, *flags, input=doc, check=True).stdout.decode()
            body = "\n\n".join(doc[ps[i]["start"]:ps[i]["start"] + ps[i]["len"]].decode() for i in layout)
            assert got == f"Passages of the document that share words with the question:\n\n{body}\n\n{q}\n"


def test_the_bench_questions_find_their_needles(document):
    """What recall is for: every single-hop question's needle is among its
    passages (vartrack's chain is not single-hop: only its last link, named in
    the question, must be there)."""
    doc, plan, _ = document
    for t in plan:
        got = run("recall", "-q", t["question"], input=doc, check=True).stdout.decode()
        needles = t["needles"] if t["kind"] != "vartrack" else t["needles"][-1:]
        for n in needles:
            assert n in got, (t["kind"], n)


def test_bad_input_gets_a_clear_error():
    p = run("recall", input=b"text")
    assert p.returncode == 2 and b"--question is required" in p.stderr
    p = run("recall", "-q", "x", "--bytes", "-3", input=b"text")
    assert p.returncode == 2 and b"--bytes" in p.stderr
    p = run("recall", "-q", "x", "--order", "random", input=b"text")
    assert p.returncode == 2 and b"--order is best-last or document" in p.stderr
    # garbage bytes are text like any other: no crash, the question comes back
    p = run("recall", "-q", "q", input=bytes(range(256)) * 50, check=True)
    assert p.stdout.endswith(b"q\n")
