"""Structured outputs against a real server on the default 135M model:
response_format json_object and json_schema, every output parsed and
validated with the `jsonschema` package over many schemas and seeds (the
model's own outputs would not validate), the official client's
chat.completions.parse with a Pydantic model, and 400s that name the
unsupported keyword."""
import datetime
import ipaddress
import json
import math
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, List, Literal, Optional, Tuple, Union

import jsonschema
import openai
import pydantic
import pytest

from server_util import Server


SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "email": {"type": "string", "maxLength": 40}},
        "required": ["name", "age", "email"], "additionalProperties": False},
    "enum_and_const": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "version": {"const": 2},
                       "ok": {"type": "boolean"}, "nothing": {"type": "null"}},
        "required": ["color", "version", "ok", "nothing"], "additionalProperties": False},
    "array_bounds": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                "minItems": 2, "maxItems": 4},
                       "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
        "required": ["tags", "scores"], "additionalProperties": False},
    "nested_refs": {
        "type": "object",
        "$defs": {"Address": {"type": "object",
                              "properties": {"city": {"type": "string"}, "zip": {"type": "string", "minLength": 5, "maxLength": 5}},
                              "required": ["city", "zip"], "additionalProperties": False}},
        "properties": {"home": {"$ref": "#/$defs/Address"},
                       "work": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}]}},
        "required": ["home", "work"], "additionalProperties": False},
    "optional_fields": {
        "type": "object",
        "properties": {"title": {"type": "string"}, "year": {"type": ["integer", "null"]},
                       "rating": {"type": "number"}},
        "required": ["title"]},
    "top_level_array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 5},
    "free_object": {"type": "object", "additionalProperties": {"type": "integer"}},
    # keywords beside enum, anyOf/oneOf and an unlisted required property (each was ignored or a 400)
    "siblings": {
        "type": "object",
        "properties": {"units": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit"]},
                       "code": {"oneOf": [{"type": "string"}, {"type": "null"}], "maxLength": 3},
                       "pet": {"type": "object", "anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]}},
        "required": ["units", "code", "pet", "extra"], "additionalProperties": {"type": "boolean"},
        "$defs": {"Pet": {"properties": {"legs": {"type": "integer"}}, "required": ["legs"]}}},
    # numeric limits (Pydantic's Field(ge=, le=, gt=, lt=)): the sampled digits are held within them
    "limits": {
        "type": "object",
        "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                       "year": {"type": "integer", "minimum": 1900, "exclusiveMaximum": 2100},
                       "share": {"type": "number", "minimum": 0, "maximum": 1},
                       "temperature": {"type": "number", "exclusiveMinimum": -273.15, "maximum": 60.5},
                       "debt": {"anyOf": [{"type": "integer", "maximum": -1}, {"type": "null"}]},
                       "minutes": {"type": "integer", "multipleOf": 15, "minimum": 0, "maximum": 120}},
        "required": ["stars", "year", "share", "temperature", "debt", "minutes"], "additionalProperties": False},
    # string formats, as Pydantic writes datetime, date, time, UUID and IPv4Address fields
    "formats": {
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "date-time"},
                       "alarm": {"type": "string", "format": "time"}, "id": {"type": "string", "format": "uuid"},
                       "host": {"type": "string", "format": "ipv4"}, "owner": {"type": "string", "format": "email"},
                       "server": {"type": "string", "format": "hostname"},
                       "docs": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083},
                       "seen": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]}},
        "required": ["day", "at", "alarm", "id", "host", "owner", "server", "docs", "seen"],
        "additionalProperties": False},
    # the rest of JSON Schema's formats, and one it does not define (an annotation)
    "more_formats": {
        "type": "object",
        "properties": {"wait": {"type": "string", "format": "duration"}, "v6": {"type": "string", "format": "ipv6"},
                       "ref": {"type": "string", "format": "uri-reference"}, "page": {"type": "string", "format": "iri"},
                       "link": {"type": "string", "format": "uri-template"},
                       "at": {"type": "string", "format": "json-pointer"},
                       "up": {"type": "string", "format": "relative-json-pointer"},
                       "rule": {"type": "string", "format": "regex"},
                       "site": {"type": "string", "format": "idn-hostname"},
                       "mail": {"type": "string", "format": "idn-email"},
                       "note": {"type": "string", "format": "x-free-text", "maxLength": 20}},
        "required": ["wait", "v6", "ref", "page", "link", "at", "up", "rule", "site", "mail", "note"],
        "additionalProperties": False},
    # patterns (ECMA-262; jsonschema checks them with Python's re): anchored, searched, with escapes
    "patterns": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
                       "phone": {"type": "string", "pattern": "^\\+?[0-9 ()-]{7,15}$"},
                       "slug": {"type": "string", "pattern": "^[a-z0-9]+(-[a-z0-9]+)*$"},
                       "quote": {"type": "string", "pattern": "^\"[^\"\\n]{1,20}\"$"},
                       "mentions": {"type": "string", "pattern": "@potserve"}},
        "required": ["code", "phone", "slug", "quote", "mentions"], "additionalProperties": False},
    # allOf: a $ref extended (as generators write inheritance) and a described $ref (as Pydantic v1 did)
    "all_of": {
        "allOf": [{"$ref": "#/$defs/Base"},
                  {"properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                  "owner": {"allOf": [{"$ref": "#/$defs/Person"}], "description": "who owns it"}},
                   "required": ["tags", "owner"]}],
        "$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}},
                           "required": ["id"]},
                  "Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                             "additionalProperties": False}}},
    # keywords SchemaStore's schemas use (each was a 400): constraints beside $ref, property counts and
    # names, patternProperties, and anyOf alternatives that overlap (an enum of suggestions or any string)
    "maps_and_unions": {
        "type": "object",
        "properties": {
            "labels": {"type": "object", "propertyNames": {"pattern": "^[a-z][a-z0-9-]{0,15}$"},
                       "additionalProperties": {"type": "string", "maxLength": 20}, "minProperties": 1,
                       "maxProperties": 3},
            "env": {"type": "object", "patternProperties": {"^[A-Z][A-Z0-9_]{0,15}$": {"type": "string"}},
                    "additionalProperties": False, "minProperties": 1},
            "limits": {"$ref": "#/$defs/Limits", "required": ["cpu"], "maxProperties": 2},
            "level": {"anyOf": [{"type": "string", "enum": ["debug", "info", "warn"]}, {"type": "string"}]},
            "retries": {"anyOf": [{"enum": [0, 1]}, {"const": 3}, {"type": "null"}]}},
        "required": ["labels", "env", "limits", "level", "retries"],
        "additionalProperties": False,
        "$defs": {"Limits": {"type": "object", "properties": {"cpu": {"type": "integer", "minimum": 1},
                                                              "memory": {"type": "string"}, "disk": {"type": "string"}}}}},
    "list_of_objects": {
        "type": "object",
        "properties": {"steps": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object", "properties": {"n": {"type": "integer"}, "text": {"type": "string"}},
            "required": ["n", "text"], "additionalProperties": False}}},
        "required": ["steps"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def client(plain_client):
    return plain_client


def parse(client, model, prompt, seed, max_tokens):
    """chat.completions.parse with a Pydantic model as response_format, at temperature 1: the response,
    its value parsed into the model."""
    r = client.chat.completions.parse(model="x", messages=[{"role": "user", "content": prompt}],
                                      response_format=model, temperature=1.0, seed=seed, max_tokens=max_tokens)
    assert isinstance(r.choices[0].message.parsed, model), r.choices[0].message.content
    return r


def ask(client, schema, seed, max_tokens=160):
    return client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Answer in JSON: describe something."}],
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}},
        temperature=1.0, seed=seed, max_tokens=max_tokens)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_compiling_a_costly_schema_does_not_hold_the_loop(plain_srv, route):
    """A schema compiles to a grammar off the event loop: a pattern whose DFA takes most of a
    second to refuse held every other request (a /health probe waited 5.6 s behind eight). A
    background response's, compiled before it is accepted (a bad one is a 400, not a stored
    failure), did too."""
    import threading
    import time
    import urllib.request
    costly = {"type": "string", "pattern": ".{0,1000}.{0,1000}.{0,1000}.{0,1000}"}
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": costly}}}
    if route == "/v1/responses":
        body = {"input": "x", "max_output_tokens": 1, "background": True,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": costly}}}
    waits, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            t = time.time()
            urllib.request.urlopen(plain_srv.url + "/health", timeout=60).read()
            waits.append(time.time() - t)
            time.sleep(0.01)
    th = threading.Thread(target=probe)
    th.start()
    t0 = time.time()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: plain_srv.request("POST", route, body), range(4)))
    took = time.time() - t0
    stop.set()
    th.join()
    assert all(st == 400 and "pattern" in err["error"]["message"] for st, err, _ in got), got
    print(f"4 costly schemas refused in {took:.2f} s; slowest /health {max(waits) * 1000:.0f} ms")
    assert max(waits) < max(0.25, took / 4), (max(waits), took)


def test_unconstrained_outputs_would_not_validate(client):
    """The reference point: without response_format the model writes prose."""
    bad = 0
    for seed in range(3):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Answer in JSON: describe something."}],
            temperature=1.0, seed=seed, max_tokens=60)
        try:
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS["person"])
        except (ValueError, jsonschema.ValidationError):
            bad += 1
    assert bad >= 2


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(client, name):
    schema = SCHEMAS[name]
    with ThreadPoolExecutor(4) as pool:  # the engine batches them
        results = list(pool.map(lambda seed: ask(client, schema, seed), range(4)))
    for r in results:
        text = r.choices[0].message.content
        value = json.loads(text)
        jsonschema.validate(value, schema)
        assert r.choices[0].finish_reason == "stop", text


def test_stop_strings_do_not_cut_the_value_open(client):
    """A stop string that occurs in JSON (agent frameworks pass "\\n" and the like) cut the value
    open ('{\\n  "name": "Meet a Prof"\\n\\n', finish_reason "stop"): stop strings do not apply under
    a grammar, so the value parses and validates, streamed or not."""
    schema = SCHEMAS["person"]
    for stop in ([","], ['"'], ["}"], ["\n", ":"]):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Make up a person."}], stop=stop, seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}},
            temperature=1.0, max_tokens=160)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        assert r.choices[0].finish_reason == "stop", (stop, r)
    parts = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Make up a person."}], stop=[","], seed=2, stream=True,
        response_format={"type": "json_object"}, temperature=1.0, max_tokens=160)
    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    assert isinstance(json.loads(text), dict), text


def test_short_max_tokens_still_closes_the_value(client):
    for seed in range(3):
        r = ask(client, SCHEMAS["list_of_objects"], seed, max_tokens=30)
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMAS["list_of_objects"])
        assert r.usage.completion_tokens <= 30


def test_every_max_tokens_from_the_shortest_value_closes_it(client):
    """Within max_tokens the value is always closed (docs/api.md), from the
    fewest tokens the shortest valid value takes: {"age":0,"name":""} is 8
    tokens here but 19 bytes, and a bound of one token per byte left a value
    cut open below 19 (e.g. '{\n  "name": "Bob",\n  "age":' at 12)."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}
    ask_bob = [{"role": "user", "content": "Describe a person named Bob, age 3. Respond in JSON."}]
    for temperature in (0, 1.0):
        for max_tokens in range(8, 25):
            r = client.chat.completions.create(model="x", messages=ask_bob, response_format=fmt, seed=1,
                                               temperature=temperature, max_tokens=max_tokens)
            text = r.choices[0].message.content
            jsonschema.validate(json.loads(text), schema)  # raises with the text when it is cut open
            assert r.usage.completion_tokens <= max_tokens
    # streamed, and through /v1/completions, the same
    for max_tokens in (10, 12):
        chunks = list(client.chat.completions.create(model="x", messages=ask_bob, response_format=fmt,
                                                     temperature=0, max_tokens=max_tokens, stream=True))
        jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), schema)
        r = client.completions.create(model="x", prompt="A person as JSON:", max_tokens=max_tokens, temperature=0,
                                      extra_body={"response_format": fmt})
        jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_the_value_is_closed_where_the_window_ends(tmp_path, fixtures):
    """Without max_tokens (or with more than the window holds) the answer ends when the context is
    full, and the value was cut open there ('...Skin-Skin-' after 8,155 tokens); its ending is now
    written in the room the window has left. The tiny model's window is 256 tokens."""
    s = Server(tmp_path / "d", "--model", fixtures / "tiny_llama.gguf").start()
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 30}}, "required": ["a"]}
    try:
        for words in (40, 60, 90):  # prompts of 81, 121 and 181 tokens
            for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}):
                st, body, _ = s.request("POST", "/v1/completions", {
                    "prompt": "ab " * words, "response_format": fmt, "temperature": 1.0, "seed": 3, "max_tokens": 4000})
                assert st == 200, body
                value = json.loads(body["choices"][0]["text"])  # raises when cut open
                if fmt["type"] == "json_schema":
                    jsonschema.validate(value, schema)
                assert body["usage"]["total_tokens"] <= 257, body["usage"]
    finally:
        s.stop()


def test_numbers_fit_a_double(client):
    """A number a double cannot hold (1.2E391 is valid JSON but inf in Python
    and JavaScript, an error in Go and Rust) is never generated: sampled top-level
    numbers, where the 135M model likes long exponents, all parse finite."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number"}, "strict": True}}
    for seed in range(10):
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Give JSON."}],
                                           response_format=fmt, temperature=1.0, seed=seed, max_tokens=60)
        text = r.choices[0].message.content
        v = json.loads(text)
        mantissa = text.lower().split("e")[0]
        assert math.isfinite(v) and (v != 0 or not any(d in mantissa for d in "123456789")), text


def test_greedy_is_deterministic_and_valid(client):
    a = ask(client, SCHEMAS["person"], 0).choices[0].message.content
    b = ask(client, SCHEMAS["person"], 1).choices[0].message.content
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Give me a person."}], temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}},
        max_tokens=120)
    r2 = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Give me a person."}], temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}},
        max_tokens=120)
    assert r.choices[0].message.content == r2.choices[0].message.content
    for t in (a, b, r.choices[0].message.content):
        jsonschema.validate(json.loads(t), SCHEMAS["person"])


def test_json_object_gives_an_object(client):
    for seed in range(4):
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Tell me about cats."}],
            response_format={"type": "json_object"}, temperature=1.0, seed=seed, max_tokens=120)
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_streamed_structured_output(client):
    chunks = list(client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "A person please."}], stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}},
        temperature=0.7, seed=5, max_tokens=120))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS["person"])


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class Review(pydantic.BaseModel):
    stars: int = pydantic.Field(ge=1, le=5)
    confidence: float = pydantic.Field(gt=0, lt=1)
    votes: Optional[int] = pydantic.Field(default=None, ge=0)


class MathReasoning(pydantic.BaseModel):
    steps: List[Step]
    final_answer: str
    confidence: Optional[int]
    kind: Literal["arithmetic", "algebra"]


def test_parse_with_a_pydantic_model(client):
    for seed in range(2):
        r = client.chat.completions.parse(
            model="x", messages=[{"role": "user", "content": "Solve 8x + 7 = -23"}],
            response_format=MathReasoning, temperature=0.8, seed=seed, max_tokens=200)
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, MathReasoning)
        assert parsed.kind in ("arithmetic", "algebra")


def test_parse_with_pydantic_field_limits(client):
    """Field(ge=, le=, gt=, lt=) are JSON Schema's minimum, maximum and exclusive limits: each was a 400
    ('minimum' is not supported); now every parsed value lies within them."""
    for seed in range(3):
        r = parse(client, Review, "Review the film Alien (1979).", seed, 120)
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, Review) and 1 <= parsed.stars <= 5 and 0 < parsed.confidence < 1, parsed
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content


def test_a_bounded_integer_alone_ends_at_its_last_digit(client):
    """A number standing alone as the whole value can always take one more digit, so it ran to
    max_tokens ("length"); within limits, the automaton knows when no digit may follow."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 1, "maximum": 10}}}
    for seed in range(4):
        r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Rate cats from 1 to 10."}],
                                           response_format=fmt, temperature=1.0, seed=seed, max_tokens=20)
        v = json.loads(r.choices[0].message.content)
        assert isinstance(v, int) and 1 <= v <= 10 and r.choices[0].finish_reason == "stop", r


class Point(pydantic.BaseModel):
    at: Tuple[float, float]
    label: Tuple[str, int, bool]


def test_parse_tuples(client):
    """Tuple fields are prefixItems (a 400 before); each position parses as its own type."""
    for seed in range(2):
        r = client.chat.completions.parse(model="x", messages=[{"role": "user", "content": "A point on a map."}],
                                          response_format=Point, temperature=1.0, seed=seed, max_tokens=80)
        assert isinstance(r.choices[0].message.parsed, Point), r.choices[0].message.content


class Ticket(pydantic.BaseModel):
    code: str = pydantic.Field(pattern=r"^[A-Z]{2,4}-[0-9]{1,5}$", max_length=7)
    tag: str = pydantic.Field(pattern=r"bug|feature", min_length=5, max_length=12)
    title: str


def test_patterns_validate_in_both_dialects(client):
    """Strings written under a pattern validate with Python's re (jsonschema) and with an ECMA-262
    engine (jsonschema_rs); Pydantic's Field(pattern=) parses."""
    import jsonschema_rs
    schema = SCHEMAS["patterns"]
    check = jsonschema_rs.validator_for(schema)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda seed: ask(client, schema, seed, max_tokens=200), range(6)))
    for r in results:
        value = json.loads(r.choices[0].message.content)
        jsonschema.validate(value, schema)
        assert check.is_valid(value) and r.choices[0].finish_reason == "stop", value
    r = client.chat.completions.parse(
        model="x", messages=[{"role": "user", "content": "Open a ticket about a broken login page."}],
        response_format=Ticket, temperature=1.0, seed=0, max_tokens=100)
    assert isinstance(r.choices[0].message.parsed, Ticket), r.choices[0].message.content


class Event(pydantic.BaseModel):
    day: datetime.date
    starts: datetime.datetime
    alarm: datetime.time
    id: uuid.UUID
    host: ipaddress.IPv4Address
    owner: pydantic.EmailStr
    docs: pydantic.HttpUrl


def test_formats_are_real_dates_times_and_addresses(client):
    """format date, time, date-time, uuid, ipv4, email, hostname and uri were a 400; the values written are
    real ones: a second validator that checks formats (jsonschema_rs, Rust), Python's own parsers
    and email-validator (what Pydantic's EmailStr uses) take them."""
    import email_validator
    import jsonschema_rs
    schema = SCHEMAS["formats"]
    check = jsonschema_rs.validator_for(schema, validate_formats=True)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda seed: ask(client, schema, seed, max_tokens=300), range(8)))
    for r in results:
        value = json.loads(r.choices[0].message.content)
        assert check.is_valid(value) and r.choices[0].finish_reason == "stop", value
        datetime.date.fromisoformat(value["day"])
        datetime.datetime.fromisoformat(value["at"])
        datetime.time.fromisoformat(value["alarm"])
        uuid.UUID(value["id"])
        ipaddress.IPv4Address(value["host"])
        email_validator.validate_email(value["owner"], check_deliverability=False)
    for seed in range(2):
        r = parse(client, Event, "Plan a server upgrade.", seed, 160)


class Job(pydantic.BaseModel):
    every: datetime.timedelta
    node: ipaddress.IPv6Address


def test_every_format_json_schema_defines(client):
    """duration, ipv6, uri-reference, iri, uri-template, json-pointer, relative-json-pointer, regex,
    idn-hostname and idn-email were a 400 (SchemaStore's schemas use several), and so was a format JSON Schema
    does not define, which validators ignore. Both validators (jsonschema with its format checkers, which
    use idna and jsonpointer here, and jsonschema_rs) take every value, and so do the parsers behind them."""
    import idna
    import jsonpointer
    import jsonschema_rs
    schema = SCHEMAS["more_formats"]
    check = jsonschema_rs.validator_for(schema, validate_formats=True)
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    duration = pydantic.TypeAdapter(datetime.timedelta)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda seed: ask(client, schema, seed, max_tokens=400), range(4)))
    for r in results:
        value = json.loads(r.choices[0].message.content)
        assert r.choices[0].finish_reason == "stop", value
        assert check.is_valid(value), (value, [e.message for e in check.iter_errors(value)])
        assert not list(checker.iter_errors(value)), value
        duration.validate_json(json.dumps(value["wait"]))
        ipaddress.IPv6Address(value["v6"])
        re.compile(value["rule"])
        jsonpointer.JsonPointer(value["at"])
        idna.encode(value["site"])
    parse(client, Job, "Schedule a backup job.", 0, 120)


class Cat(pydantic.BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(pydantic.BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Household(pydantic.BaseModel):
    pet: Union[Cat, Dog]                                                   # anyOf
    other: Annotated[Union[Cat, Dog], pydantic.Field(discriminator="pet_type")]  # oneOf + discriminator
    level: Union[Literal["low", "high"], str]                              # anyOf of an enum and any string


def test_unions_of_models_parse(client):
    """Pydantic unions of models (anyOf or oneOf of two objects, "Union[Cat, Dog]") were a 400 "two
    objects"; an enum beside any string too. Each output parses into the models and validates in both
    validators."""
    import jsonschema_rs
    schema = Household.model_json_schema()
    check = jsonschema_rs.validator_for(schema)
    kinds = set()
    for seed in range(6):
        r = parse(client, Household, "Describe a household's pets.", seed, 120)
        parsed = r.choices[0].message.parsed
        value = json.loads(r.choices[0].message.content)
        jsonschema.validate(value, schema)
        assert check.is_valid(value), value
        kinds.add(type(parsed.pet).__name__)
        kinds.add(type(parsed.other).__name__)
    assert kinds == {"Cat", "Dog"}, kinds  # both alternatives are reachable


class Listing(pydantic.BaseModel):
    features: set[Literal["garden", "pool", "garage", "cellar"]]
    rooms: frozenset[Literal[1, 2, 3, 4, 5]] = pydantic.Field(min_length=1)


def test_sets_of_choices_parse(client):
    """uniqueItems (Pydantic's set and frozenset) was a 400: a set of an enum's values writes each once."""
    schema = Listing.model_json_schema()
    for seed in range(4):
        r = parse(client, Listing, "Describe a house for sale.", seed, 100)
        value = json.loads(r.choices[0].message.content)
        jsonschema.validate(value, schema)
        assert len(set(map(json.dumps, value["features"]))) == len(value["features"]), value


class Section(pydantic.BaseModel):
    title: str
    subsections: List["Section"] = []


def test_recursive_models_parse(client):
    """A recursive model (a table of contents: sections of sections) was a 400 "recursive"; it is
    written four levels deep, and every output parses and validates."""
    schema = Section.model_json_schema()
    for seed in range(4):
        r = parse(client, Section, "Outline a book about rivers.", seed, 200)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    

def test_bad_response_formats_are_400s(client):
    msgs = [{"role": "user", "content": "Hi"}]
    cases = [({"type": "sound"}, "sound"),
             ("json", "response_format"),
             ({"type": "json_schema"}, "json_schema"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}}, "backreferences"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "not": {"const": 3}}}}, "'not'"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "multipleOf": 0.5}}}, "a fraction is not supported"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "allOf": [{"type": "string"}, {"type": "integer"}]}}}, "no type in common"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "type": "integer", "minimum": 3, "maximum": 2}}}, "no number lies within"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "type": "string", "maxLength": 1, "enum": ["aa", "b"]}}}, "'maxLength' beside enum"),
             ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
                 "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}, "required": ["next"]}},
                 "$ref": "#/$defs/N"}}}, "never ends"),
             # a name, as OpenAI requires (it answers "Missing required parameter")
             ({"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}, "name is required"),
             ({"type": "json_schema", "json_schema": {"name": "a b", "schema": {"type": "string"}}}, "1 to 64"),
             ({"type": "json_schema", "json_schema": {"name": "x" * 65, "schema": {"type": "string"}}}, "1 to 64")]
    for rf, needle in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="x", messages=msgs, response_format=rf, max_tokens=5)
        assert ei.value.body["param"] == "response_format", ei.value.body
        assert needle in ei.value.body["message"], ei.value.body
