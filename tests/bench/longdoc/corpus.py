"""Non-repetitive natural haystacks for the long-document bench (issue 22).

Paragraphs come from two independent sources shipped as Debian packages
(`make longdoc-data` installs them):

- jargon-text: the Jargon File 4.4.7 (public domain), one unit per entry;
- debian-reference-en: the Debian Reference 2.100 (GPL-2+), plain-text
  edition, one unit per paragraph; its ASCII tables are kept as rows of
  cells (numbers, commands, file names), their ruling lines dropped.

Every unit appears once in the pool (exact duplicates are removed). A stable
hash of each unit's text puts it in the TUNE split (about a third) or the
TEST split (the rest), so a knob tuned on TUNE documents is judged on text it
never saw. A document is a shuffle of one split's units, cut to length: no
paragraph appears twice in one document.

A third source, held out from both splits (the HELDOUT split), checks that
what holds on the two above holds on text of another domain and authors that
no knob was chosen on:

- python3.11-doc: the Python 3.11 documentation (PSF licence), its
  reStructuredText sources, one unit per prose paragraph (code, directives,
  headings and tables left out, inline markup reduced to its text).
"""
import gzip
import hashlib
import pathlib
import random
import re

SOURCES = {
    "jargon": pathlib.Path("/usr/share/doc/jargon-text/jargon.txt.gz"),
    "debref": pathlib.Path("/usr/share/debian-reference/debian-reference.en.txt.gz"),
}
HELDOUT_SOURCES = {
    "pydoc": pathlib.Path("/usr/share/doc/python3.11/html/_sources"),
}
SPLITS = ("tune", "test", "heldout")
MIN_CHARS, MAX_CHARS = 120, 2400  # a unit long enough to be prose, short enough to place needles finely


def _squash(lines):
    return re.sub(r"\s+", " ", " ".join(x.strip() for x in lines)).strip()


def jargon_units(text):
    """One unit per Jargon File entry (`:headword: pos.` and its paragraphs),
    from the lexicon on (the front matter is skipped)."""
    units, cur = [], None
    for line in text.splitlines():
        m = re.match(r"^\s{3}:([^:]+):(.*)$", line)
        if m:
            if cur:
                units.append(cur)
            cur = [f"{m.group(1)}:{m.group(2)}"]
        elif cur is not None:
            cur.append(line)
    if cur:
        units.append(cur)
    return [_squash(u) for u in units]


def _table_row(line):
    return " | ".join(c.strip() for c in line.strip().strip("|").split("|"))


def debref_units(text):
    """Paragraphs of the Debian Reference (blank-line separated), without
    the table of contents and headings; a table becomes one unit whose rows
    are its cells joined by ' | ' (continuation lines merged cell by cell is
    beyond plain text, so each printed row stays a row)."""
    units = []
    for block in re.split(r"\n\s*\n", text):
        lines = [x for x in block.splitlines() if x.strip()]
        if not lines:
            continue
        if all(re.match(r"^\s*[|+]", x) for x in lines):
            rows = [_table_row(x) for x in lines if not re.match(r"^\s*[|+][-+=|\s]*$", x)]
            units.append("\n".join(r for r in rows if r.strip(" |")))
            continue
        if all(re.match(r"^\s*(\d+\.)+\d*\.?\s", x) for x in lines):  # table of contents, headings
            continue
        units.append(_squash(lines))
    return units


def _rest_text(line):
    """A reStructuredText line's text: roles, literals, links and emphasis reduced to their words."""
    line = re.sub(r":[\w:.-]+:`(?:[^`<]*<)?~?([^`>]*)>?`", r"\1", line)  # :func:`sorted`; :ref:`text <label>`: label
    line = re.sub(r"`([^`<]*?)\s*<[^`>]*>`_+", r"\1", line)             # `text <url>`_
    line = re.sub(r"``([^`]*)``", r"\1", line)
    line = re.sub(r"`([^`]*)`_*", r"\1", line)
    return re.sub(r"(?<!\w)\*\*?([^*]+?)\*\*?(?!\w)", r"\1", line)


def pydoc_units(root):
    """One unit per prose paragraph of the Python documentation's sources
    (tutorial, how-tos, FAQ, language and library reference, what's new):
    blank-line separated blocks that start at the margin and are not a
    directive, a comment, a heading, a field list or a table."""
    units = []
    for part in ("tutorial", "howto", "faq", "reference", "library", "whatsnew"):
        for path in sorted((root / part).glob("*.rst.txt")):
            for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace")):
                lines = block.splitlines()
                if not lines or lines[0][:1].isspace() or lines[0].startswith(("..", ":", "|", "+", ">>>")):
                    continue
                if any(re.match(r"^([=\-~^*#\"'+`])\1{2,}\s*$", x) for x in lines):  # a heading's rule
                    continue
                units.append(_squash(_rest_text(x) for x in lines))
    return units


def split_of(unit):
    """TUNE for about a third of the units, TEST for the rest; stable across
    machines and runs (a hash of the text, not a random draw)."""
    return "tune" if hashlib.sha1(unit.encode()).digest()[0] % 3 == 0 else "test"


def load_units(sources=SOURCES, heldout=HELDOUT_SOURCES):
    """[(source, split, text)] of every usable unit, each text once (the held-out
    sources' units, read last, in the HELDOUT split; absent ones are skipped)."""
    readers = {"jargon": jargon_units, "debref": debref_units, "pydoc": pydoc_units}
    seen, out = set(), []
    for name, path in {**sources, **{k: v for k, v in heldout.items() if v.exists()}}.items():
        if not path.exists():
            raise FileNotFoundError(f"{path} missing: run `make longdoc-data` (Debian package of source {name})")
        units = (readers[name](path) if path.is_dir() else
                 readers[name](gzip.open(path, "rt", encoding="utf-8", errors="replace").read()))
        for u in units:
            if not (MIN_CHARS <= len(u) <= MAX_CHARS) or u in seen:
                continue
            if sum(c.isalpha() for c in u) < 0.5 * len(u):  # code listings, ASCII art
                continue
            seen.add(u)
            out.append((name, "heldout" if name in heldout else split_of(u), u))
    return out


def shuffled(units, split, seed):
    """The texts of one split in a seeded order (sources interleaved)."""
    pool = [t for _, s, t in units if s == split]
    random.Random(f"{split}:{seed}").shuffle(pool)
    return pool
