"""The repository's docs link to each other by file and heading: every relative
link in README.md and docs/ must name a file that exists and, for a Markdown
file, a heading it has (anchors made the way GitHub makes them), so a renamed
heading cannot leave a dead link behind."""
import re

from conftest import ROOT

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6}) (.*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def doc_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield n, line


def slug(heading):
    """GitHub's anchor for a heading: link text kept, code marks and punctuation
    dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if m:
            s = slug(m.group(2))
            out.add(s if s not in seen else f"{s}-{seen[s]}")
            seen[s] = seen.get(s, 0) + 1
    return out


def test_slug_matches_github():
    assert slug("Whole words (`whole_words`, `--whole-words 1`; off by default)") == \
        "whole-words-whole_words---whole-words-1-off-by-default"
    assert slug("Qwen 1.5B over six TEST documents at 32K, two trials") == \
        "qwen-15b-over-six-test-documents-at-32k-two-trials"


def test_every_relative_link_resolves():
    cache, dead = {}, []
    for doc in doc_files():
        for n, line in prose_lines(doc):
            for target in LINK.findall(line):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, mailto: …
                    continue
                path, _, frag = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                where = f"{doc.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    dead.append(f"{where} (no such file)")
                elif frag and dest.suffix == ".md":
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if frag not in cache[dest]:
                        dead.append(f"{where} (no such heading)")
    assert not dead, "dead links:\n" + "\n".join(dead)
