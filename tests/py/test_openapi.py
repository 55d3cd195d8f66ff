"""api/openapi.json: served at GET /openapi.json, covering every route, and
Schemathesis (property-based, from the document) against a real server:
examples, coverage, fuzzing and stateful phases (the document's links chain
create session -> upload -> read/retention -> delete), every check but
positive_data_acceptance (see SCHEMATHESIS_EXCLUDED)."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from server_util import Server

KEY = "schemathesis-key-0123"
DOC = ROOT / "api" / "openapi.json"
MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))
# positive_data_acceptance expects every schema-valid request to succeed; the
# server refuses some with 4xx by limits a schema cannot state: the model's
# window and vocabulary (budget_tokens, token ids), keep_tokens < budget_tokens,
# text that is not UTF-8 in an octet-stream upload, JSON that jansson does not
# take (NUL in object keys, integers beyond 64 bits).
SCHEMATHESIS_EXCLUDED = "positive_data_acceptance"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, fixtures):
    # the tiny fixture model: the contract, not the model, is under test, and
    # its answers take milliseconds (the default model's held each worker seconds)
    s = Server(tmp_path_factory.mktemp("data"), "--model", fixtures / "tiny_llama.gguf", "--api-key", KEY,
               "--budget-tokens", "64",
               "--request-timeout", "2", "--access-log", "false", "--max-sessions-per-key", "1000")
    s.start()
    yield s
    assert s.stop() == 0


def test_served_document_is_api_openapi_json(srv):
    st, body, hdrs = srv.request("GET", "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})
    assert st == 200 and hdrs["Content-Type"] == "application/json"
    assert body == json.loads(DOC.read_text())
    st, body, hdrs = srv.request("POST", "/openapi.json", {}, {"Authorization": f"Bearer {KEY}"})
    assert st == 405 and hdrs["Allow"] == "GET, HEAD" and body["error"]["code"] == "method_not_allowed"


def test_document_names_every_route_of_the_router():
    """Each route the router classifies (server/router.c) has a path here, and
    each documented operation's method is one the router dispatches."""
    doc = json.loads(DOC.read_text())
    src = (ROOT / "server" / "router.c").read_text()
    routes = {r for r in re.findall(r'return (?:\*body = [^,]+, )?"(/[^"]*)"', src)
              if " (" not in r}  # "/ (page)" and the like: pages, not API
    paths = {re.sub(r"\{(session|response|conversation|file)_id\}", "{id}", p).replace("/{model}", "") for p in doc["paths"]}
    assert routes <= paths, routes - paths
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            assert "200" in op["responses"] or "201" in op["responses"], (path, method)
            errs = [c for c in op["responses"] if c >= "400" and (path, c) != ("/health", "503")]  # {"status": ...}
            assert all(op["responses"][c] == {"$ref": "#/components/responses/Error"} for c in errs), (path, method)


@pytest.fixture(scope="module")
def schemathesis_run(srv, tmp_path_factory):
    """Every operation, stateful links included: (exit status, report, output, failure blocks)."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    report = tmp / "report.json"
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{srv.url}/openapi.json",
           "-H", f"Authorization: Bearer {KEY}", "--checks", "all", "--exclude-checks", SCHEMATHESIS_EXCLUDED,
           "--max-examples", str(MAX_EXAMPLES), "--seed", "21", "--workers", "1", "--request-timeout", "60",
           "--report", "json", "--report-json-path", str(report), "--no-color"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp)
    out = p.stdout + p.stderr
    print(out[-6000:])
    res = json.loads(report.read_text())
    blocks = re.split(r"\n(?=- ST\d+ )", out.split("= FAILURES =", 1)[1].split("= SUMMARY =")[0]) \
        if "= FAILURES =" in out else []
    blocks = [b for b in blocks if b.startswith("- ST")]
    print(f"schemathesis: {res['test_cases']['generated']} cases generated, "
          f"{res['test_cases']['with_failures']} with failures; phases {res['phases']}")
    return p.returncode, res, out, blocks


def test_schemathesis_finds_nothing(schemathesis_run):
    """Every check passes (issue 21's header/?seq disagreement and X-Chunk-Seq
    wrap, once failures here, are fixed)."""
    rc, res, out, blocks = schemathesis_run
    assert res["phases"]["stateful"]["status"] in ("success", "failure"), res["phases"]
    assert res["test_cases"]["generated"] >= 200, res["test_cases"]
    assert not res["errors"], out[-8000:]
    # a 503 request_timeout is documented (the server's 2 s request_timeout on a loaded
    # machine: no token yet); Schemathesis counts every 5xx as a server error
    real = [b for b in blocks if not (b.startswith("- ST101 Server error") and "[503]" in b
                                      and '"code":"request_timeout"' in b)]
    assert not real, "\n".join(real)[:8000]
    assert blocks or not res["failures"], out[-8000:]
    assert rc == 0 or blocks, out[-3000:]
