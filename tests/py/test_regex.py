"""JSON Schema's `pattern` (engine/regex.c): the DFA a pattern compiles to, run
on strings drawn at random by build/regex_match, against Python's `re` (what
the `jsonschema` package validates patterns with). On ASCII strings the two
agree exactly (but for Python's $ before a final newline); on any string, what
the DFA takes Python takes too (\\d, \\w, \\s are ASCII here, '.' leaves out
every line terminator: a subset). Patterns no
DFA holds, or that the two dialects read differently, are refused."""
import json
import pathlib
import random
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "build" / "regex_match"

PATTERNS = [
    r"^\d{3}-\d{4}$", r"abc", r"^[a-z]+@[a-z]+\.(com|org)$", r"^(ab|cd)*e?$", r"x{2,3}y", r"^[^abc]{0,2}$",
    r"^a{0}b$", r"^(a|b){2,}$", r"^\w+\s\W$", r"^[a-c-]+$", r"[.]", r"^.{2}$", r"^(?:a|bc)+?$", r"^\(\)$",
    r"^[\d.]+$", r"^a|b$", r"^$", r"^(ab){1,2}c$", r"^[A-Z][a-z]*( [A-Z][a-z]*)*$", r"^x{1}{$",
    r"^\x41\u0042$", r"^[\]a]+$", r"^a{2}b{0,1}c{1,}$", r"^[à-ÿ]{2}$", r"^[^a]$", r"^[a-zé日]+$", r"日本",
    r"^[\u0100-\uffff]+$", r'^"\\\n\t/$', r"^[\s\S]{3}$", r"^[^\x00-\x7f]*$", r"^\+?[0-9 ()-]{7,15}$",
    r"^[A-Z]{2}\d{2}( ?\w{4}){2,7}$", r"(x|y|z)\1?", r"^\d*\.?\d+$",
]
ALPHABET = list("abcdexyzq-.@ ()AB12{,}]\"\\/\t\n\r") + ["é", "ÿ", "à", "日", "本", "\U0001F600", "Ā", "\u2028", "\x01"]


def run(pattern, strings):
    out = subprocess.run([str(TOOL), pattern], input="".join(json.dumps(s) + "\n" for s in strings),
                         capture_output=True, text=True, check=True).stdout
    return out


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if p != r"(x|y|z)\1?"])
def test_the_dfa_matches_what_python_matches(pattern):
    rng = random.Random(pattern)
    strings = {""}
    while len(strings) < 1500:
        strings.add("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8))))
    strings = sorted(strings)
    out = run(pattern, strings).split()
    assert len(out) == len(strings), out[:2]
    rx = re.compile(pattern)
    ascii_agree, taken = 0, 0
    for s, got in zip(strings, out):
        want = rx.search(s) is not None
        if got == "1":
            taken += 1
            assert want, (pattern, s)  # what is written always validates
        if s.isascii() and "\r" not in s and not s.endswith("\n"):  # Python's $ matches before a final newline too
            assert (got == "1") == want, (pattern, s, got)
            ascii_agree += 1
    assert ascii_agree > 100


@pytest.mark.parametrize("pattern,reason", [
    (r"(x|y|z)\1?", "backreferences"), (r"(?=a)b", "lookahead"), (r"(?<!a)b", "lookahead"), (r"\bx", r"\b"),
    (r"a**", "quantifier follows a quantifier"), (r"a{2}{3}", "quantifier follows a quantifier"), (r"(a", "not closed"), (r"a)", "not opened"), (r"[a", "not closed"),
    (r"\p{L}", "escape"), (r"a{3,2}", "out of order"), (r"x{,2}", "reads differently"), (r"[]a]", "reads differently"),
    (r"(?P<n>a)", "not ECMA-262"), (r"a^b", "^ and $"), (r"a{1001}", "above 1000"), (r"[z-a]", "out of order"),
    (r"((((a{20}){20}){20}){20})", "too large"), (r"a\01", "reads differently"), (r"^\x01$", None),
    ("(" * 30000 + "a" + ")" * 30000, "more than 100 deep"),  # (the recursive parser overflowed its stack)
    ("(" * 100 + "a" + ")" * 100, None)])
def test_what_no_dfa_holds_is_refused(pattern, reason):
    out = run(pattern, [])
    if reason is None:  # a DFA, but a JSON text cannot hold its string: the grammar refuses it (test_structured)
        assert not out.startswith("refused"), out
    else:
        assert out.startswith("refused") and reason in out, out
