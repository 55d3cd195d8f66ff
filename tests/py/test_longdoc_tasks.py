"""The natural haystacks and RULER-style tasks of the long-document bench
(tests/bench/longdoc/corpus.py, tasks.py): the corpus has no repeated unit
and enough text in each split, documents hold every needle once at its depth,
and the exact-match scorers accept the answer and refuse near misses."""
import collections
import random
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))
import corpus  # noqa: E402
import tasks  # noqa: E402

UNITS = corpus.load_units()


def test_corpus_two_sources_both_splits_no_repeats():
    texts = [t for _, _, t in UNITS]
    assert len(texts) == len(set(texts))
    by = collections.Counter((src, split) for src, split, _ in UNITS)
    for src in corpus.SOURCES:
        for split in ("tune", "test"):
            assert by[(src, split)] > 100, by
    # the held-out source (when `make longdoc-data` installed it) is all HELDOUT, and only it
    held = {src for src, path in corpus.HELDOUT_SOURCES.items() if path.exists()}
    assert {src for src, split, _ in UNITS if split == "heldout"} == held
    assert all(split == "heldout" for src, split, _ in UNITS if src in held)
    # 128K tokens without repeats: English runs about 4 bytes a token in these
    # models' vocabularies; the smaller TUNE split must still hold 128K
    for split in ("tune", "test") + (("heldout",) if held else ()):
        assert sum(len(t.encode()) for _, s, t in UNITS if s == split) > 4.0 * 131072


def test_splits_are_stable_and_disjoint():
    tune = {t for _, s, t in UNITS if s == "tune"}
    test = {t for _, s, t in UNITS if s == "test"}
    assert not tune & test
    assert all(corpus.split_of(t) == "tune" for t in list(tune)[:50])
    assert corpus.shuffled(UNITS, "test", 3) == corpus.shuffled(UNITS, "test", 3)
    assert corpus.shuffled(UNITS, "test", 3) != corpus.shuffled(UNITS, "test", 4)


def test_corpus_parsers():
    jargon = "front matter\n   :foo: n.\n\n   A thing.\n   More.\n\n   :bar baz: adj.\n\n   Other.\n"
    assert corpus.jargon_units(jargon) == ["foo: n. A thing. More.", "bar baz: adj. Other."]
    ref = ("1.2.3. A heading\n\n   Some prose\n   wrapped here.\n\n"
           "   +------+-----+\n   |cmd   |what |\n   |------+-----|\n   |ls    |list |\n   +------+-----+\n")
    assert corpus.debref_units(ref) == ["Some prose wrapped here.", "cmd | what\nls | list"]


def test_held_out_parser(tmp_path):
    """The Python documentation's reStructuredText: prose paragraphs with their markup read
    as text (a cross-reference as its label); headings, directives, code, field lists and
    tables left out."""
    (tmp_path / "howto").mkdir()
    (tmp_path / "howto" / "x.rst.txt").write_text(
        ".. _label:\n\nSorting HOW TO\n**************\n\n:Author: A. Person\n\n"
        "Python lists have a built-in :meth:`list.sort` method and\nthe ``sorted`` *function*; see\n"
        "`the guide <https://example.org>`_ and :ref:`keys <sortinghowto>`.\n\n"
        ".. doctest::\n\n    >>> sorted([2, 1])\n    [1, 2]\n\n+---+---+\n| a | b |\n+---+---+\n\n"
        "Basics\n======\n\nA **simple** sort.\n")
    assert corpus.pydoc_units(tmp_path) == [
        "Python lists have a built-in list.sort method and the sorted function; see the guide and sortinghowto.",
        "A simple sort."]


def test_document_needles_once_at_depth_and_no_repeated_paragraph():
    paras = corpus.shuffled(UNITS, "test", 7)
    for rot in range(3):
        plan = tasks.document_plan(1, "test", 32768, 0, rot)
        text, needles = tasks.build_document(paras, 0.25, 32768, plan, rot)
        raw = text.encode()
        body = [p for p in text.split("\n\n") if p]
        assert len(body) == len(set(body))
        for t, task in enumerate(plan):
            for i, (a, b) in enumerate(needles[t]):
                sentence = task["needles"][i]
                assert raw[a:b].decode() == sentence and text.count(sentence) == 1
            share = needles[t][0][0] / len(raw)
            assert abs(share - tasks.depth_of(t, rot)) < 0.03, (task["kind"], share)
    # three rotations put every task at every depth
    cells = {(k, tasks.depth_of(t, r)) for r in range(3) for t, k in enumerate(tasks.TASKS)}
    assert len(cells) == len(tasks.TASKS) * len(tasks.DEPTHS)


def test_hint_is_optional_and_short_split_is_an_error():
    paras = corpus.shuffled(UNITS, "test", 1)
    plan = tasks.document_plan(1, "test", 4096, 0, 0)
    assert not tasks.build_document(paras, 0.25, 4096, plan, 0)[0].startswith(tasks.HINT)
    assert tasks.build_document(paras, 0.25, 4096, plan, 0, hint=True)[0].startswith(tasks.HINT)
    try:
        tasks.build_document(paras[:10], 0.25, 131072, plan, 0)
    except ValueError as e:
        assert "fewer than 131072" in str(e)
    else:
        raise AssertionError("a split shorter than the document must be refused")


def test_trials_split_between_runs_build_the_same_documents(tmp_path):
    # `run.py --from-trial K` (trials split between runs or machines) must ask the very documents
    # the whole run would: each document is seeded by its trial and rotation, not by its order
    import argparse
    import run

    def docs(first):
        work = tmp_path / str(first)
        work.mkdir()
        a = argparse.Namespace(seed=1, rotations="", hint=False, trials=3, from_trial=first)
        return run.task_docs(a, "test", 4096, UNITS, 0.25, work)
    whole, tail = docs(0), docs(2)
    assert [d[0] for d in tail] == ["test:4096:2:0", "test:4096:2:1", "test:4096:2:2"]
    assert [(d[0], d[1].read_text(), d[3]) for d in tail] == [(d[0], d[1].read_text(), d[3]) for d in whole[6:]]


def test_task_generators():
    rng = random.Random(5)
    for _ in range(50):
        for kind in tasks.TASKS:
            t = tasks.make_task(kind, rng)
            answers = t["answer"] if kind == "multivalue" else [t["answer"]]
            if kind != "fact":
                assert all(a.isdigit() and 5 <= len(a) <= 7 for a in answers)
                assert all(any(a in n for n in t["needles"]) for a in answers)
            assert not any(a in t["question"] for a in answers)
    vt = tasks.make_task("vartrack", random.Random(1))
    names = [n.split()[1] for n in vt["needles"]]
    assert vt["needles"][0].endswith(f"= {vt['answer']}.") and len(set(names)) == 4
    assert all(n == f"VAR {b} = VAR {a}." for n, a, b in zip(vt["needles"][1:], names, names[1:]))
    assert names[3] in vt["question"]


def test_scorers_exact_match():
    single = {"kind": "single", "answer": "26109"}
    assert tasks.score(single, "The pass key is 26109.")
    assert not tasks.score(single, "261099")
    assert not tasks.score(single, "2610")
    assert not tasks.score(single, "The pass key is 5. Or 26109.")
    assert tasks.score({"kind": "single", "answer": "1234567"}, "1,234,567")
    mv = {"kind": "multivalue", "answer": ["11111", "222222", "3333333", "44444"]}
    assert tasks.score(mv, "11111, 222222, 3333333, 44444")
    assert tasks.score(mv, "- 44444\n- 11111\n- 222222\n- 3333333")
    assert not tasks.score(mv, "11111, 222222, 3333333")
    assert not tasks.score(mv, "11111, 222222, 3333333, 44444".replace("44444", "44445"))
    fact = {"kind": "fact", "answer": "Porto"}
    assert tasks.score(fact, "porto.") and tasks.score(fact, "She lives in Porto")
    assert not tasks.score(fact, "Portofino") and not tasks.score(fact, "Lisbon")
    vt = {"kind": "vartrack", "answer": "44705"}
    assert tasks.score(vt, "The value of VAR SQJPD is 44705.") and not tasks.score(vt, "VAR 2 is 44705")
