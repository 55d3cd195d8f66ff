"""/v1/embeddings against a real server on the default model: the vectors
against llama.cpp's (tests/fixtures/ref_embeddings.npz, recorded by
tests/reference/record_embeddings.py: pooling "mean", normalised) and the
float64 numpy forward pass; the official client (base64, its default) and
LangChain's OpenAIEmbeddings; batches, token-id inputs, errors, and work that
stops when its client leaves."""
import json
import socket
import sys
import time

import numpy as np
import openai
import pytest

from conftest import REF, ROOT
from server_util import Server, metric

sys.path.insert(0, str(ROOT / "tests" / "reference"))
import record_embeddings  # noqa: E402  (the texts the fixture was recorded from)

TEXTS = record_embeddings.TEXTS


@pytest.fixture(scope="module")
def srv(plain_srv):
    return plain_srv


@pytest.fixture(scope="module")
def client(plain_client):
    return plain_client


@pytest.fixture(scope="module")
def ref():
    return np.load(REF / "ref_embeddings.npz")


def embed(srv, inp, **kw):
    st, body, _ = srv.request("POST", "/v1/embeddings", dict(kw, input=inp))
    assert st == 200, body
    return body


def vectors(body):
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    return np.array([d["embedding"] for d in body["data"]])


def test_embeddings_match_llama_cpp(srv, ref):
    """Every text of the fixture in one request: the same tokens as llama.cpp, and vectors
    within cosine 0.9995 of its (measured: 0.99987 at least; llama.cpp against float64
    numpy is 0.99967 at least on the same texts)."""
    body = embed(srv, TEXTS)
    assert body["object"] == "list" and body["model"]
    ours = vectors(body)
    assert ours.shape == (len(TEXTS), 576)
    n_tokens = 0
    for i, text in enumerate(TEXTS):
        st, tok, _ = srv.request("POST", "/tokenize", {"content": text, "add_special": True})
        assert tok["tokens"] == ref[f"ids_{i}"].tolist(), text
        n_tokens += len(tok["tokens"])
        theirs = ref[f"embedding_{i}"].astype(np.float64)
        assert abs(np.linalg.norm(ours[i]) - 1) < 1e-5
        assert ours[i] @ theirs >= 0.9995, (i, ours[i] @ theirs)
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert len(ref[f"ids_{len(TEXTS) - 1}"]) > 512  # one text spans several forwards


def test_embeddings_match_float64_numpy(srv, ref):
    import numpy_forward
    weights = numpy_forward.load(str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    for i in range(4):
        ids = ref[f"ids_{i}"].tolist()
        want = numpy_forward.embedding(None, ids, weights)
        got = vectors(embed(srv, ids))[0]
        assert got @ want >= 0.9995, (i, got @ want)


def test_inputs_as_token_ids_batches_and_singles_agree(srv, ref):
    together = vectors(embed(srv, TEXTS[:5]))
    for i in range(5):
        alone = vectors(embed(srv, TEXTS[i]))[0]
        by_ids = vectors(embed(srv, [ref[f"ids_{i}"].tolist()]))[0]
        np.testing.assert_allclose(alone, together[i], atol=2e-4)
        np.testing.assert_array_equal(by_ids, alone)
    one_ids = vectors(embed(srv, ref["ids_0"].tolist()))[0]  # a single input as a flat id array
    np.testing.assert_array_equal(one_ids, vectors(embed(srv, TEXTS[0]))[0])


def test_the_official_client_base64_and_float(srv, client):
    """The SDK asks for base64 unless told otherwise and decodes it: the same float32s."""
    b64 = client.embeddings.create(model="x", input=TEXTS[:3])
    flt = client.embeddings.create(model="x", input=TEXTS[:3], encoding_format="float")
    assert b64.object == "list" and b64.usage.prompt_tokens == flt.usage.prompt_tokens > 0
    for a, b in zip(b64.data, flt.data):
        assert a.object == "embedding" and len(a.embedding) == 576
        np.testing.assert_array_equal(np.float32(a.embedding), np.float32(b.embedding))
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="x", input="hello", dimensions=256)
    assert e.value.body["param"] == "dimensions"


def test_langchain_embeddings(srv, client):
    from langchain_openai import OpenAIEmbeddings
    # (check_embedding_ctx_length=False: else LangChain sends tiktoken's ids, OpenAI's vocabulary)
    lc = OpenAIEmbeddings(base_url=srv.url + "/v1", api_key="none", model="x", check_embedding_ctx_length=False)
    docs = ["Paris is the capital and largest city of France.",
            "The mitochondrion is the powerhouse of the cell.",
            "SELECT name FROM users WHERE age > 30;"]
    got = np.array(lc.embed_documents(docs))
    want = vectors(embed(srv, docs))
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(lc.embed_query(docs[0]), want[0], atol=2e-4)


@pytest.mark.parametrize("body,param,code", [
    ({}, "input", "missing_field"),
    ({"input": None}, "input", "missing_field"),
    ({"input": ""}, "input", "invalid_value"),
    ({"input": []}, "input", "invalid_value"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": {"text": "a"}}, "input", "invalid_type"),
    ({"input": ["a", ""]}, "input", "invalid_value"),
    ({"input": ["a", 1]}, "input", "invalid_type"),
    ({"input": [[1, 2], "a"]}, "input", "invalid_type"),
    ({"input": [[1], []]}, "input", "invalid_value"),
    ({"input": [1, -1]}, "input", "invalid_value"),
    ({"input": [1, 49152]}, "input", "invalid_value"),
    ({"input": [1, 2.5]}, "input", "invalid_value"),
    ({"input": ["a"] * 2049}, "input", "invalid_value"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"input": "a", "encoding_format": 1}, "encoding_format", "invalid_type"),
    ({"input": "a", "dimensions": 64}, "dimensions", "unsupported_value"),
    ({"input": "a", "dimensions": 0}, "dimensions", "invalid_value"),
    ({"input": "a", "dimensions": "576"}, "dimensions", "invalid_type"),
    ({"input": "word " * 9000}, "input", "context_length_exceeded"),
    ({"input": [[7] * 8193]}, "input", "context_length_exceeded"),
])
def test_bad_requests_are_400s_naming_the_field(srv, body, param, code):
    st, err, _ = srv.request("POST", "/v1/embeddings", body)
    assert st == 400, err
    assert err["error"]["param"] == param and err["error"]["code"] == code, err


def test_what_is_accepted(srv):
    """dimensions equal to the model's own, model and user are taken; GET is a 405."""
    assert len(vectors(embed(srv, "a", dimensions=576, model="anything", user="u"))[0]) == 576
    st, _, hdrs = srv.request("GET", "/v1/embeddings")
    assert st == 405 and hdrs["Allow"] == "POST"
    st, err, _ = srv.request("POST", "/v1/embeddings", raw=b"[1, 2")
    assert st == 400 and err["error"]["code"] == "invalid_json"


def test_a_question_is_answered_while_a_long_input_is_read(srv, client):
    """An input of 8,000 tokens (the window is 8,192) is read in engine tasks of about 1,024
    tokens, so a short completion sent once the reading has begun ends after a few of them (5
    measured here), not after the input. (Its client then leaves: the rest of the input, a
    minute of reading on a 2-core VM, is not read; test_work_stops_when_the_client_leaves.)"""
    n = 8000
    body = json.dumps({"input": [[(k * 31) % 49000 + 100 for k in range(n)]]}).encode()
    t0 = metric(srv, "potserve_tokens_embedded_total")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall((f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    deadline = time.time() + 60
    while time.time() < deadline and metric(srv, "potserve_tokens_embedded_total") == t0:
        time.sleep(0.02)
    r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=3, temperature=0)
    read_by_then = metric(srv, "potserve_tokens_embedded_total") - t0
    sock.close()
    assert r.choices[0].text
    # its steps, each after one task of about 1,024 tokens (read whole, the input would have
    # come first: 8,000)
    assert 0 < read_by_then <= 7000, read_by_then
    last, deadline = None, time.time() + 120  # (the reading stops; the next test finds the engine free)
    while time.time() < deadline and metric(srv, "potserve_tokens_embedded_total") != last:
        last = metric(srv, "potserve_tokens_embedded_total")
        time.sleep(1)


def test_work_stops_when_the_client_leaves(srv, client):
    """A request of 200K tokens (minutes here) stops within a group of 1,024 tokens of its
    client leaving, and the engine answers the next request."""
    body = json.dumps({"input": ["the river ran past the mill " * 170] * 200}).encode()
    req = (f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    t0 = metric(srv, "potserve_tokens_embedded_total")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    start = time.time()
    sock.sendall(req)
    deadline, first_group = start + 60, None
    while time.time() < deadline and (now := metric(srv, "potserve_tokens_embedded_total")) < t0 + 2000:
        if first_group is None and now > t0:
            first_group = time.time()  # (the tokenizing of the megabyte is behind it)
        time.sleep(0.1)
    assert metric(srv, "potserve_tokens_embedded_total") >= t0 + 2000  # it is reading
    # a group's time: from the first group counted to the second (both at once: half of all)
    group_s = time.time() - first_group if first_group else (time.time() - start) / 2
    sock.close()
    stopped, deadline = None, time.time() + 60  # the group under way ends; then nothing more
    while time.time() < deadline:
        time.sleep(max(1.0, 3 * group_s))
        now = metric(srv, "potserve_tokens_embedded_total")
        if now == stopped:
            break
        stopped = now
    assert metric(srv, "potserve_tokens_embedded_total") == stopped
    assert stopped - t0 < 60000  # far from the 200K asked for
    assert client.embeddings.create(model="x", input="hello").data[0].embedding


# ---- models that say how to pool: the tiny embedding fixtures of tests/make_fixtures.py -------

@pytest.mark.parametrize("name,pooling", [("embed_qwen3_last", "last"), ("embed_llama_cls", "cls")])
def test_a_models_pooling_type_is_followed(tmp_path, fixtures, ref, name, pooling):
    """A file with pooling_type last (EOS appended, as Qwen3-Embedding's say) or cls: each
    input's vector is that token's hidden state, as llama.cpp's and the float64 forward's."""
    import numpy_forward
    path = fixtures / f"{name}.gguf"
    srv = Server(tmp_path / "data", "--model", path).start()
    try:
        st, models, _ = srv.request("GET", "/v1/models")
        assert models["data"][0]["meta"]["embedding_pooling"] == pooling
        texts = record_embeddings.FIXTURE_TEXTS
        ours = vectors(embed(srv, texts))
        weights = numpy_forward.load(str(path))
        for i, text in enumerate(texts):
            ids = ref[f"{name}_ids_{i}"].tolist()
            st, tok, _ = srv.request("POST", "/tokenize", {"content": text, "add_special": True})
            assert tok["tokens"] == ids
            hidden = numpy_forward.hidden(str(path), ids, weights)
            row = hidden[-1] if pooling == "last" else hidden[0]
            want, mean = row / np.linalg.norm(row), numpy_forward.embedding(None, ids, weights)
            assert ours[i] @ ref[f"{name}_embedding_{i}"] >= 0.9999, (text, ours[i] @ ref[f"{name}_embedding_{i}"])
            assert ours[i] @ want >= 0.9999
            if len(ids) > 1:
                assert ours[i] @ mean < 0.99  # (pooled otherwise, it would not be that row)
        # three inputs of 200 tokens: the third is read in two forwards (512 tokens each at most)
        long = [[(k * 7 + j) % 299 for k in range(200)] for j in range(3)]
        together = vectors(embed(srv, long))
        for j in range(3):
            np.testing.assert_allclose(together[j], vectors(embed(srv, [long[j]]))[0], atol=1e-5)
    finally:
        assert srv.stop() == 0


def test_request_timeout_bounds_the_reading(tmp_path):
    """request_timeout bounds an embeddings request as it bounds a generation: a 503
    request_timeout with Retry-After, and the engine stops reading its inputs."""
    srv = Server(tmp_path / "data", "--request-timeout", "1").start()
    try:
        t = time.time()
        st, err, hdrs = srv.request("POST", "/v1/embeddings", {"input": ["the river ran past the mill " * 170] * 200})
        assert st == 503 and err["error"]["code"] == "request_timeout" and hdrs["Retry-After"] == "1", err
        assert time.time() - t < 30
        stopped, deadline = None, time.time() + 30  # the task under way ends; none follows
        while time.time() < deadline:
            now = metric(srv, "potserve_tokens_embedded_total")
            if now == stopped:
                break
            stopped = now
            time.sleep(2)
        assert 0 < stopped < 60000 and metric(srv, "potserve_tokens_embedded_total") == stopped
        assert len(vectors(embed(srv, "hello"))[0]) == 576  # a short one is read within the second
    finally:
        assert srv.stop() == 0


def test_the_inputs_pots_count_against_pot_memory_limit(tmp_path):
    """The pots an embeddings request holds count in pot_memory while it runs, as every pot
    does: 422 when they could never fit, 429 with Retry-After while others hold the room."""
    srv = Server(tmp_path / "data", "--pot-memory-limit", "100M", "--prompt-cache-entries", "0").start()
    try:
        st, err, _ = srv.request("POST", "/v1/embeddings", {"input": [[7] * 8000]})  # about 196 MB of pots
        assert st == 422 and err["error"]["code"] == "pot_too_large" and err["error"]["param"] == "input", err
        import threading
        first = {}
        th = threading.Thread(target=lambda: first.update(r=srv.request("POST", "/v1/embeddings",
                                                                          {"input": [[7] * 3000]})))
        th.start()  # about 74 MB while it runs, and another 37 MB do not fit beside it in 100 MB
        deadline = time.time() + 60
        while time.time() < deadline and metric(srv, "potserve_pot_memory_bytes") == 0:
            time.sleep(0.02)
        assert metric(srv, "potserve_pot_memory_bytes") > 50e6
        st, err, hdrs = srv.request("POST", "/v1/embeddings", {"input": [[7] * 1500]})
        assert st == 429 and err["error"]["code"] == "insufficient_memory" and "Retry-After" in hdrs, err
        th.join()
        assert first["r"][0] == 200
        assert metric(srv, "potserve_pot_memory_bytes") == 0
        assert srv.request("POST", "/v1/embeddings", {"input": [[7] * 3000]})[0] == 200
    finally:
        assert srv.stop() == 0
