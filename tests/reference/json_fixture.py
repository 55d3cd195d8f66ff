"""The command line the JSON reference recorders share:

    RECORDER MODEL OUT.json           record from llama.cpp and write OUT.json
    RECORDER MODEL OUT.json --check   record again and compare with OUT.json
"""
import argparse
import json


def main(record, failing, count):
    """record(model) -> the fixture's object; failing(ref, got) -> the names of the items that
    differ; count(obj) -> how many items it has. Returns the exit status."""
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    got = record(a.model)
    if not a.check:
        with open(a.out, "w") as f:
            json.dump(got, f, indent=1)
            f.write("\n")
        print(f"wrote {a.out}: {count(got)} prompts")
        return 0
    with open(a.out) as f:
        ref = json.load(f)
    bad = failing(ref, got)
    print(f"{count(got) - len(bad)} passed, {len(bad)} failed {bad}")
    return 1 if bad else 0
