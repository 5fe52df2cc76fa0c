"""Property tests over the server's request parsing (issue 10 item 6): any bytes, any JSON value,
any body built from a route's own fields with values of any type, mutated well-formed bodies, odd
headers (API key, Content-Length, user) and query strings, on every route. Each answer is a
well-formed success or a 4xx whose JSON error names the problem, never a 500; and the well-formed
requests that follow get what they got alone. The targets live in tests/fuzz/server_targets.py
(atheris runs them on demand: `python tests/fuzz/fuzz_parsers.py server`)."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")

from _budget import examples  # noqa: E402
from fuzz import server_targets as S  # noqa: E402
from fuzz.mutate import mutate  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from aicirt.serve import protocol as P  # noqa: E402

FAST = dict(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text with everything JSON can carry, lone surrogates included (they arrive as `\udcff` escapes).
_ANY_TEXT = st.text(st.characters(exclude_categories=[]), max_size=12)
# One string in ten holds surrogates: more, and nearly every JSON tree would stop at that check.
TEXT = st.one_of(*[_ANY_TEXT] * 9,
                 st.text(st.characters(categories=["Cs"]) | st.sampled_from("ab "), min_size=1, max_size=4))
SCALARS = st.none() | st.booleans() | st.integers() | st.integers(-3, 300) | st.floats() | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=12)
JSON_ROUTES = ["/v1/run", "/v1/completions", "/v1/chat/completions", "/v1/controllers/tags"]
MODELS = {"/v1/run": P.RunRequest, "/v1/completions": P.CompletionRequest,
          "/v1/chat/completions": P.ChatRequest, "/v1/controllers/tags": P.TagRequest}


def encode(value: object, ascii_only: bool) -> bytes:
    # NaN and Infinity go out as JSON's non-standard words; surrogates as escapes or raw bytes
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


# --- the parser alone: fast, many examples ---------------------------------------------------------
@settings(max_examples=examples(400), deadline=None)
@given(st.sampled_from(list(MODELS.values())), st.binary(max_size=200) | JSON.map(lambda v: encode(v, True)))
def test_parse_gives_a_request_or_a_400(model, raw):
    """`protocol.parse` returns a request whose derived values all work, or ApiError(400)."""
    try:
        body = P.parse(model, raw)
    except P.ApiError as e:
        assert e.status == 400 and e.message.strip()
        return
    if isinstance(body, P._Sampling):
        body.arg_bytes()
        try:
            body.sampling(8, 1.0)
        except ValueError:
            pass                                        # the server answers 400 (Server.prepare)
    if isinstance(body, P._OpenAI):
        try:
            body.check_unsupported()
        except P.ApiError as e:
            assert e.status == 400
        assert isinstance(body.include_usage, bool)
    for text in [getattr(body, "text", ""), getattr(body, "prompt", "")]:
        if isinstance(text, str):
            text.encode("utf-8")                        # what the tokenizer will do with it
    for m in getattr(body, "messages", []):
        m.text.encode("utf-8")


@pytest.mark.parametrize("raw, needle", [
    (b'{"prompt": "\\udcff"}', "prompt: the string holds a lone surrogate \\udcff"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800"}]}', "messages.0.content: the string holds a lone"),
    (b'{"controller_arg": {"\\udfff": 1}}', "controller_arg: a key holds a lone surrogate \\udfff"),
    (b"[" * 5000 + b"]" * 5000, "nested deeper than 128 levels"),
    (b'{"a": ' + b"[" * 200 + b"]" * 200 + b"}", "a.0.0.0"),
    (b'{"seed": ' + b"7" * 5000 + b"}", "invalid JSON body: Exceeds the limit (4300 digits)"),
    (b'{"temperature": NaN}', "invalid JSON body: NaN is not JSON"),
    (b'{"controller_arg": [-Infinity]}', "invalid JSON body: -Infinity is not JSON"),
    (b'{"seed": -1}', "seed: Input should be greater than or equal to 0"),
])
def test_what_the_fuzzer_found_is_a_400_naming_it(raw, needle):
    """Each of these was a 500 (UnicodeEncodeError, RecursionError, ValueError) or a 400 that did
    not name the field, before the parser checked for them."""
    with pytest.raises(P.ApiError) as e:
        P.parse(P.RunRequest, raw)
    assert e.value.status == 400 and needle in e.value.message, e.value.message


# --- the app in-process ----------------------------------------------------------------------------
@settings(**FAST)
@given(st.binary(max_size=300))
def test_raw_bytes_on_every_route(data):
    S.raw_request(data)


@settings(**FAST)
@given(st.sampled_from(JSON_ROUTES), JSON, st.booleans())
def test_any_json_value_on_every_json_route(path, value, ascii_only):
    S.request("POST", path, encode(value, ascii_only))
    S.check_healthy()


def _fields():
    """Valid values for each of the routes' own fields (a body then garbles a few of them)."""
    part = st.fixed_dictionaries({"type": st.just("text"), "text": TEXT})
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer"])},
                                    optional={"content": TEXT | st.lists(part, max_size=2) | st.none(),
                                              "name": TEXT})
    tokens = st.integers(1, 24)
    prompt = TEXT.filter(bool)
    return {
        "controller": st.sampled_from(["regex", "yesno", "choice", "countdown", "splice", "json"])
        | st.builds(S.module_id),
        "controller_arg": TEXT | JSON, "prompt": prompt | st.lists(prompt, min_size=1, max_size=1),
        "max_tokens": tokens, "max_completion_tokens": tokens, "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 10 ** 30), "seed": st.integers(0, 2 ** 70),
        "chat": st.booleans(), "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | JSON}),
        "n": st.sampled_from([1, None]), "stop": st.sampled_from([None, "", []]),
        "logprobs": st.sampled_from([None, False, 0]), "echo": st.sampled_from([False, None]),
        "messages": st.lists(message, min_size=1, max_size=3), "model": TEXT, "user": TEXT,
        "module_id": st.builds(S.module_id) | st.just("0" * 64),
        "tags": st.lists(st.sampled_from(["fuzz-a", "fuzz.b", "1bad", "x" * 80]) | TEXT, min_size=1, max_size=3),
    }


FIELDS = _fields()
#: Each route's fields, the required ones first.
ROUTE_FIELDS = {
    "/v1/run": (["controller"], ["controller_arg", "prompt", "max_tokens", "temperature", "top_p", "top_k",
                                 "seed", "chat"]),
    "/v1/completions": (["prompt"], ["controller", "controller_arg", "max_tokens", "temperature", "top_p",
                                     "top_k", "seed", "stream", "stream_options", "n", "stop", "logprobs", "echo",
                                     "model", "user"]),
    "/v1/chat/completions": (["messages"], ["controller", "controller_arg", "max_tokens",
                                            "max_completion_tokens", "temperature", "stream", "stream_options",
                                            "stop", "seed", "model"]),
    "/v1/controllers/tags": (["module_id", "tags"], []),
}


@st.composite
def route_body(draw):
    """A body of a route's own fields, valid but for up to two garbled (any JSON) or dropped."""
    path = draw(st.sampled_from(JSON_ROUTES))
    required, optional = ROUTE_FIELDS[path]
    names = required + draw(st.lists(st.sampled_from(optional), unique=True, max_size=len(optional))) \
        if optional else list(required)
    garbled = draw(st.lists(st.sampled_from(names), max_size=draw(st.sampled_from([0, 0, 1, 2]))))
    body = {n: draw(JSON if n in garbled else FIELDS[n]) for n in names}
    if draw(st.integers(0, 5)) == 0:
        del body[draw(st.sampled_from(names))]
    if path != "/v1/controllers/tags" and "max_tokens" not in garbled:
        body["max_tokens"] = draw(st.integers(1, 12))       # bounded runs
    return path, body


@settings(**FAST)
@given(route_body(), st.booleans())
def test_bodies_of_the_routes_own_fields(case, ascii_only):
    path, body = case
    S.request("POST", path, encode(body, ascii_only))
    S.check_healthy()


@st.composite
def mutated_body(draw):
    path = draw(st.sampled_from(JSON_ROUTES))
    good = {"/v1/run": {"controller": "regex", "controller_arg": "[a-z]+", "prompt": "Hi ", "max_tokens": 6},
            "/v1/completions": {"prompt": "Hi ", "max_tokens": 6, "stream": True, "controller": "yesno"},
            "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6},
            "/v1/controllers/tags": {"module_id": S.module_id(), "tags": ["fuzz-tag"]}}[path]
    inserts = st.sampled_from([b"\\udcff", b"[", b"{", b"NaN", b"1e999", b"\x00", b"\xff", b'"', b"\\"])
    return path, mutate(draw, json.dumps(good).encode(), inserts=inserts, overwrites=st.integers(0, 255))


@settings(**FAST)
@given(mutated_body())
def test_mutated_well_formed_bodies(case):
    S.request("POST", *case)
    S.check_healthy()


HEADER = st.binary(max_size=24).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F))


@settings(**FAST)
@given(st.sampled_from([("GET", "/v1/models", b""), ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 2}'),
                        ("POST", "/v1/controllers/tags", b'{"module_id": "x", "tags": ["t"]}')]),
       st.dictionaries(st.sampled_from([b"api-key", b"authorization", b"x-aicirt-user", b"content-type"]), HEADER,
                       max_size=4),
       st.sampled_from([b"", b"api-key", b"authorization"]), TEXT)
def test_odd_headers_and_query_strings(route, headers, right, query):
    """Keys as given (anything, or right beside odd others), users, content types, queries."""
    method, path, body = route
    if right == b"authorization":
        headers[right] = b"Bearer " + S.KEY.encode()
    elif right:
        headers[right] = S.KEY.encode()
    r = S.request(method, path, body, headers, quote(query.encode("utf-8", "surrogatepass"), safe="=&?"))
    if not right and b"api-key" not in headers and b"authorization" not in headers:
        assert r.status_code == 401


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=20) | st.builds(S.module_id))
def test_delete_any_name(name):
    S.request("DELETE", "/v1/controllers/" + quote(name.encode(), safe=""))
    S.check_healthy()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200).map(lambda b: b"\0asm\x01\0\0\0" + b) | st.binary(max_size=64))
def test_uploads_of_any_bytes(data):
    S.request("POST", "/v1/controllers", data)
    S.check_healthy()


@pytest.mark.parametrize("declared", [b"\xb2", b"\xb9\xb9", b"-1", b"1e9", b"99999999999999999999", b" 12", b""])
def test_any_content_length_header(declared):
    """Sent as given (the HTTP client would replace it): a Latin-1 digit such as '²' passed
    str.isdigit() and then failed in int(), a 500."""
    c = S.client()

    async def call():
        sent: list[dict] = []
        chunks = [{"type": "http.request", "body": b'{"module_id": "x", "tags": ["t"]}', "more_body": False}]

        async def receive():
            return chunks.pop(0) if chunks else {"type": "http.disconnect"}

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/controllers/tags", "raw_path": b"/v1/controllers/tags",
                 "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("testserver", 80),
                 "headers": [(b"content-length", declared), (b"api-key", S.KEY.encode())]}
        await c.app(scope, receive, send)
        return sent

    sent = c.portal.call(call)
    status = sent[0]["status"]
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert status in (400, 413) and body["message"], (status, body)
    S.check_healthy()
