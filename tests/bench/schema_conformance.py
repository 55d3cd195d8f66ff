"""Structured outputs against JSON Schemas nobody on this project wrote.

Sources (installed from PyPI, pinned by `make bench-schemas`):
- SchemaStore's schemas as check-jsonschema vendors them, each whole and each
  of its `definitions`/`$defs` alone (carrying the definitions it reaches);
- the JSON Schemas Pydantic makes of the `openai` package's models.

Starts `build/potserve serve` on loopback (the default model) and sends each
schema as a chat `response_format`: temperature 0, then, when that is
answered, temperature 1 with seeds 1 and 2. Every 200 is parsed and validated
with `jsonschema` (Draft 2020-12 unless the schema names its draft) and with
`jsonschema_rs` asserting formats (ECMA-262 patterns, dates, emails); every
400 must name `response_format`. Prints the counts of each outcome and every
failure; exit status 1 when an answered output does not validate, a 400
names another param, or anything else came back (5xx, a hang, a crash).

    .venv/bin/python tests/bench/schema_conformance.py [--limit N] [--json-out FILE]
"""
import argparse
import collections
import copy
import glob
import inspect
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import jsonschema
import jsonschema_rs
from jsonschema import validators

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pointer_target(root, ref):
    """What a "#/a/b" pointer names in root, or None."""
    at = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(at, dict) and part in at:
            at = at[part]
        elif isinstance(at, list) and part.isdigit() and int(part) < len(at):
            at = at[int(part)]
        else:
            return None
    return at


def alone(root, container, name):
    """root[container][name] as a schema of its own, with the definitions it reaches
    (None when it points anywhere else in root)."""
    sub = copy.deepcopy(root[container][name])
    if not isinstance(sub, dict):
        return None
    seen, pending = set(), [sub]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        if not isinstance(node, dict):
            continue
        for key, value in list(node.items()):
            if key == "$ref" and isinstance(value, str) and value.startswith("#/") and value not in seen:
                seen.add(value)
                parts = value[2:].split("/")
                if parts[0] not in ("definitions", "$defs") or len(parts) < 2:
                    return None
                target = pointer_target(root, value)
                if target is None:
                    return None
                defs = sub.setdefault(parts[0], {})
                name_ = parts[1].replace("~1", "/").replace("~0", "~")
                defs.setdefault(name_, copy.deepcopy(root[parts[0]][name_]))
                pending.append(target)
            else:
                pending.append(value)
    return sub


def collect():
    import check_jsonschema
    import openai.types
    import openai.types.chat
    import openai.types.shared
    import pydantic
    found = []
    vendor = pathlib.Path(check_jsonschema.__file__).parent / "builtin_schemas" / "vendor"
    for path in sorted(glob.glob(str(vendor / "*.json"))):
        root = json.load(open(path, encoding="utf-8"))
        base = pathlib.Path(path).stem
        found.append((f"schemastore:{base}", root))
        for container in ("definitions", "$defs"):
            for name in sorted(root.get(container) or {}):
                sub = alone(root, container, name)
                if sub is not None:
                    found.append((f"schemastore:{base}#/{container}/{name}", sub))
    for module in (openai.types, openai.types.chat, openai.types.shared):
        for name, obj in sorted(vars(module).items()):
            if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj is not pydantic.BaseModel:
                try:
                    found.append((f"pydantic:{obj.__module__}.{name}", obj.model_json_schema()))
                except Exception:  # a model pydantic cannot describe: not a schema to test
                    pass
    return found


def collect_langchain():
    """Every Pydantic model langchain_core's modules define: schemas the compiled keywords were not
    chosen on (they were chosen on the refusals of collect()'s)."""
    import importlib
    import pkgutil
    import warnings
    import langchain_core
    import pydantic
    warnings.filterwarnings("ignore")
    found = []
    for info in pkgutil.walk_packages(langchain_core.__path__, "langchain_core."):
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional dependency missing: not a module to read
            continue
        for name, obj in sorted(vars(module).items()):
            if inspect.isclass(obj) and issubclass(obj, pydantic.BaseModel) and obj.__module__ == module.__name__:
                try:
                    found.append((f"langchain_core:{obj.__module__}.{name}", obj.model_json_schema()))
                except Exception:  # a model pydantic cannot describe: not a schema to test
                    pass
    return found


def ask(port, schema, temperature, seed, max_tokens):
    body = {"messages": [{"role": "user", "content": "Write an example JSON value for this schema."}],
            "max_tokens": max_tokens, "temperature": temperature, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def check(schema, status, body):
    """The outcome's name, and what was wrong (None when it kept the promise)."""
    if status == 400:
        err = body.get("error", {})
        return "400", None if err.get("param") == "response_format" else f"400 naming {err.get('param')}"
    if status != 200:
        return f"status {status}", json.dumps(body)[:200]
    choice = body["choices"][0]
    text = choice["message"]["content"]
    try:
        value = json.loads(text)
    except ValueError:
        return "200 not JSON", text[:200]
    cls = validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = [e.message for e in cls(schema).iter_errors(value)]
    if errors:
        return "200 invalid", f"{errors[0][:150]} in {text[:150]!r} ({choice['finish_reason']})"
    # a second validator, in Rust, that also asserts formats and reads patterns as ECMA-262
    try:
        rs = jsonschema_rs.validator_for(schema, validate_formats=True)
    except Exception:  # a schema it cannot compile: nothing to compare
        return f"200 valid, {choice['finish_reason']} (jsonschema_rs cannot read the schema)", None
    rs_errors = [e.message for e in rs.iter_errors(value)]
    if rs_errors:
        return "200 invalid for jsonschema_rs", f"{rs_errors[0][:150]} in {text[:150]!r}"
    return f"200 valid, {choice['finish_reason']}", None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(ROOT / "build" / "potserve"))
    ap.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--port", type=int, default=18790)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--limit", type=int, default=0, help="the first N schemas only")
    ap.add_argument("--match", default="", help="only the schemas whose name holds this text (e.g. buildkite)")
    ap.add_argument("--json-out")
    ap.add_argument("--langchain", action="store_true", help="langchain_core's Pydantic models instead")
    args = ap.parse_args()
    schemas = collect_langchain() if args.langchain else collect()
    schemas = [(name, schema) for name, schema in schemas if args.match in name]
    if args.limit:
        schemas = schemas[:args.limit]
    data = tempfile.mkdtemp(prefix="schema-conformance-")
    server = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", str(args.port), "--threads",
                               str(args.threads), "--data-dir", data, "--access-log", "false"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        counts, failures, answered = collections.Counter(), [], 0
        t0 = time.time()
        for name, schema in schemas:
            for temperature, seed in ((0, 0), (1, 1), (1, 2)):
                status, body = ask(args.port, schema, temperature, seed, args.max_tokens)
                outcome, wrong = check(schema, status, body)
                counts[outcome] += 1
                if wrong:
                    failures.append((name, temperature, seed, outcome, wrong))
                if status != 200:
                    break
            answered += status == 200
            if server.poll() is not None:
                failures.append((name, None, None, "server exited", server.stderr.read().decode()[-500:]))
                break
        summary = {"schemas": len(schemas), "schemas_answered": answered, "outcomes": dict(counts),
                   "failures": failures, "seconds": round(time.time() - t0)}
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(f"{len(schemas)} schemas ({sum(n.startswith('schemastore') for n, _ in schemas)} SchemaStore, "
          f"{sum(n.startswith('pydantic') for n, _ in schemas)} Pydantic), {answered} answered, "
          f"{summary['seconds']} s")
    for outcome, n in sorted(counts.items()):
        print(f"  {n:5d}  {outcome}")
    for f in failures:
        print("FAIL", *f)
    if args.json_out:
        pathlib.Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        json.dump(summary, open(args.json_out, "w"), indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
