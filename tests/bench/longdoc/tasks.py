"""RULER-style tasks over natural haystacks (issue 22): generators, document
assembly and exact-match scorers; pure Python (tests/py/test_longdoc_tasks.py).

Five tasks, each with its needles (sentences inserted as their own paragraphs)
and one question:

- single: one pass key (5-7 digits); answer: the key;
- multikey: four "special magic numbers" for four different words; the
  question names one; answer: its number;
- multivalue: four codes for one word; answer: all four numbers;
- vartrack: VAR A = n, then VAR B = VAR A, VAR C = VAR B, VAR D = VAR C
  spread after it; answer: n, the value of D;
- fact: a person lives in a city, stated once in words; answer: the city.

A document carries the needles of all five tasks: task t sits at depth
DEPTHS[(t + rotation) % 3], so three rotations put every task at every depth
and one prefilled document answers five questions.
"""
import random
import re

TASKS = ("single", "multikey", "multivalue", "vartrack", "fact")
DEPTHS = (0.1, 0.5, 0.9)
# where a task's needles go relative to its depth (as shares of the document);
# the needle the answer depends on first
OFFSETS = {"single": [0.0], "multikey": [0.0, -0.04, 0.03, 0.06], "multivalue": [0.0, 0.02, 0.04, 0.06],
           "vartrack": [0.0, 0.02, 0.04, 0.06], "fact": [0.0]}
SHARED_DEPTH_SHIFT = 0.01  # the second task at the same depth
WORDS = ["apple", "anchor", "badger", "bicycle", "candle", "canyon", "dolphin", "engine", "falcon", "garden",
         "harbor", "island", "jacket", "kettle", "lantern", "meadow", "needle", "orchard", "pepper", "quartz",
         "rabbit", "saddle", "teapot", "umbrella", "violin", "walnut", "yogurt", "zebra", "blanket", "compass"]
FIRST = ["Amelia", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiroshi", "Ingrid", "Jonas",
         "Kamala", "Lucas", "Marta", "Nikolai", "Olga", "Pavel", "Rosa", "Stefan", "Tamsin", "Viktor"]
LAST = ["Albescu", "Brennan", "Castillo", "Dufresne", "Eriksen", "Fontaine", "Gallagher", "Horvath",
        "Iwasaki", "Jankowski", "Kowalczyk", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrakis"]
CITIES = ["Lisbon", "Krakow", "Nairobi", "Montreal", "Osaka", "Valparaiso", "Tbilisi", "Reykjavik", "Marrakesh",
          "Ljubljana", "Cordoba", "Tallinn", "Brisbane", "Hanoi", "Bergen", "Porto", "Seville", "Dresden",
          "Winnipeg", "Mombasa"]
HINT = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.")


def number(rng):
    """A key of 5 to 7 digits."""
    digits = rng.choice((5, 6, 7))
    return str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))


def var_name(rng):
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(5))


def make_task(kind, rng):
    """{kind, needles: [sentence], question, answer (str, or a list for
    multivalue)}; the first needle is the one at the task's depth."""
    if kind == "single":
        k = number(rng)
        return dict(kind=kind, needles=[f"The pass key is {k}. Remember it. {k} is the pass key."],
                    question="What is the pass key? Answer with the number only.", answer=k)
    if kind == "multikey":
        words = rng.sample(WORDS, 4)
        keys = [number(rng) for _ in words]
        return dict(kind=kind, needles=[f"The special magic number for {w} is {k}." for w, k in zip(words, keys)],
                    question=f"What is the special magic number for {words[0]}? Answer with the number only.",
                    answer=keys[0])
    if kind == "multivalue":
        w = rng.choice(WORDS)
        vals = []
        while len(vals) < 4:
            v = number(rng)
            if v not in vals:
                vals.append(v)
        return dict(kind=kind, needles=[f"One of the special codes for {w} is {v}." for v in vals],
                    question=f"What are all the special codes for {w}? Answer with the four numbers only, "
                             "separated by commas.", answer=vals)
    if kind == "vartrack":
        names = []
        while len(names) < 4:
            n = var_name(rng)
            if n not in names:
                names.append(n)
        k = number(rng)
        needles = [f"VAR {names[0]} = {k}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        return dict(kind=kind, needles=needles,
                    question=f"Follow the VAR assignments in the text. What is the value of VAR {names[3]}? "
                             "Answer with the number only.", answer=k)
    if kind == "fact":
        who, city = f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.choice(CITIES)
        return dict(kind=kind, needles=[f"{who} moved to {city} many years ago and still lives there."],
                    question=f"In which city does {who} live? Answer with the city name only.", answer=city)
    raise ValueError(f"unknown task {kind!r} (known: {', '.join(TASKS)})")


def numbers_in(text):
    """The numbers of an answer in order; a thousands separator inside a
    number ("1,234,567") does not split it, a comma and a space do."""
    return re.findall(r"\d+", re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", text))


def score(task, answer):
    """Exact match: the first number is the key (single, multikey, vartrack;
    so "261099" for 26109 misses), every one of the four values is returned
    (multivalue), the city is named as a word (fact)."""
    kind, want = task["kind"], task["answer"]
    if kind == "multivalue":
        return set(want) <= set(numbers_in(answer))
    if kind == "fact":
        return re.search(rf"\b{re.escape(want.lower())}\b", answer.lower()) is not None
    got = numbers_in(answer)
    return bool(got) and got[0] == want


def depth_of(task_index, rotation):
    return DEPTHS[(task_index + rotation) % len(DEPTHS)]


def placements(tasks, rotation):
    """[(share of the document, task index, needle index)] for every needle,
    the task's depth plus its offsets, kept inside (0.01, 0.985)."""
    out, seen = [], set()
    for t, task in enumerate(tasks):
        d = depth_of(t, rotation)
        shift = SHARED_DEPTH_SHIFT if d in seen else 0.0
        seen.add(d)
        for i, off in enumerate(OFFSETS[task["kind"]]):
            out.append((min(0.985, max(0.01, d + shift + off)), t, i))
    return sorted(out)


def build_document(paragraphs, tokens_per_byte, length, tasks, rotation, hint=False):
    """A document of about `length` tokens: paragraphs in order until the
    estimate (bytes x tokens_per_byte) reaches it, each task's needles as
    paragraphs of their own at the unit boundary nearest their share of the
    haystack's bytes. Returns (text, needles) where needles[t][i] is the
    (start, end) byte range of task t's needle i in the text."""
    units, total = [], 0
    for p in paragraphs:
        if total * tokens_per_byte >= length:
            break
        units.append(p)
        total += len(p.encode()) + 2
    else:
        raise ValueError(f"the split holds about {int(total * tokens_per_byte)} tokens, fewer than {length}")
    cum = [0]
    for u in units:
        cum.append(cum[-1] + len(u.encode()) + 2)
    at_boundary = {}
    for share, t, i in placements(tasks, rotation):
        target = share * cum[-1]
        b = min(range(1, len(units)), key=lambda j: abs(cum[j] - target))
        at_boundary.setdefault(b, []).append((t, i))
    parts, pos = [], 0
    needles = [[None] * len(task["needles"]) for task in tasks]

    def put(text):
        nonlocal pos
        parts.append(text)
        start = pos
        pos += len(text.encode())
        return start

    if hint:
        put(HINT + "\n\n")
    for j, u in enumerate(units):
        for t, i in at_boundary.get(j, []):
            s = put(tasks[t]["needles"][i])
            needles[t][i] = (s, pos)
            put("\n\n")
        put(u + "\n\n")
    return "".join(parts), needles


def document_plan(seed, split, length, trial, rotation):
    """The tasks of one document (their needles, questions, answers), the
    same for every policy: seeded by everything but the policy."""
    rng = random.Random(f"{seed}:{split}:{length}:{trial}:{rotation}")
    return [make_task(k, rng) for k in TASKS]
