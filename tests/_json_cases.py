"""JSONSchemaBench MaskBench cases (tests/data/jsonschema, gzipped JSON lines) for the `json` controller's tests and bench.

An instance is checked as the engine would generate it: compact JSON, UTF-8 (no \\u escapes for
non-ASCII), object keys in the order the controller writes them (the schema's `properties`
order, then required keys it does not list, then the others as in the instance).
"""
from __future__ import annotations

import functools
import gzip
import json
import random
import warnings
from pathlib import Path

import numpy as np

from aicirt import StepInput

SLICES = ["Github_trivial", "Github_easy", "Glaiveai2K", "Handwritten", "Synthesized"]
#: In the checkout, so the tests that read it run (never skip) wherever the repository is.
DATA = Path(__file__).resolve().parent / "data" / "jsonschema"


@functools.cache
def load_slice(name: str) -> tuple[dict, ...]:
    """A MaskBench slice by name, or "hard": the cases of HARD below."""
    if name == "hard":
        return tuple(hard_cases())
    with gzip.open(DATA / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def _meta(n_optional: int) -> dict:
    """A Kubernetes-ObjectMeta-like object: `n_optional` optional properties, none required."""
    names = ["annotations", "clusterName", "creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp",
             "finalizers", "generateName", "generation", "labels", "managedFields", "name", "namespace",
             "ownerReferences", "resourceVersion", "selfLink", "uid"]
    props = {n: {"type": "string"} for n in names}
    props.update({f"x{i}": {"type": "integer"} for i in range(n_optional - len(names))})
    props["labels"] = {"type": "object", "additionalProperties": {"type": "string"}}
    return {"type": "object", "properties": props}


def hard_cases() -> list[dict]:
    """Hard cases of this project's own, in the slices' format ({id, schema, tests}): objects with
    dozens of optional properties before the first required one, oneOf whose branches overlap on
    values that are no objects, patternProperties covering required keys, int64 bounds, enum
    beside long maxLength, patterns and formats with length bounds, long bounded strings."""
    def case(name, schema, valid, invalid):
        return {"id": f"hard---{name}", "schema": schema,
                "tests": [{"description": "", "valid": True, "data": d} for d in valid] +
                         [{"description": "", "valid": False, "data": d} for d in invalid]}
    deploy = {"type": "object", "properties": {"metadata": _meta(48), "apiVersion": {"type": "string"},
                                               "kind": {"const": "Deployment"}, "spec": {"type": "object"}},
              "required": ["kind"], "additionalProperties": False}
    kind = [{"properties": {"kind": {"const": k}, "children": {"type": "array"}}, "required": ["kind"]} for k in "ab"]
    return [
        case("object_meta_48", deploy,
             [{"kind": "Deployment"}, {"metadata": {"name": "web", "labels": {"app": "web"}, "x40": 3},
                                       "kind": "Deployment", "spec": {}}],
             [{"metadata": {"name": 1}, "kind": "Deployment"}, {"kind": "Service"}, {"metadata": {}}]),
        case("optional_200", {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(200)},
                              "additionalProperties": False},
             [{}, {"p0": 1, "p199": 2}, {"p7": 1, "p8": 2, "p150": 3}], [{"p0": "x"}, {"q": 1}]),
        case("one_of_no_type", {"oneOf": kind}, [{"kind": "a"}, {"kind": "b", "children": [7]}],
             [7, "s", None, [7], {"kind": "c"}]),
        case("pattern_required", {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
                                  "required": ["name"], "additionalProperties": False},
             [{"name": 1}, {"name": 1, "abc": 2}], [{"abc": 2}, {"name": "x"}, {"name": 1, "X": 2}]),
        case("pattern_other_keys", {"type": "object", "properties": {"id": {"type": "string"}},
                                    "patternProperties": {"^x-": {"type": "integer"}}},
             [{"id": "a", "x-a": 1, "other": [1]}, {"zzz": 1}], [{"x-b": "s"}, {"id": 1}]),
        case("int64", {"type": "integer", "minimum": -9223372036854775808, "maximum": 9223372036854775807},
             [9223372036854775807, -9223372036854775808, 0], [9223372036854775808, 1.5]),
        case("enum_max_length_64", {"type": "array", "items": {"type": "string", "enum": ["red", "green"],
                                                               "maxLength": 64}},
             [["red", "green"], []], [["blue"]]),
        case("pattern_max_length_50", {"type": "string", "pattern": "^[A-Za-z0-9]+(-[A-Za-z0-9]+)*$", "maxLength": 50},
             ["example-org", "a-b-c", "x" * 50], ["-a", "x" * 51]),
        case("pattern_unanchored_max_length_4", {"type": "string", "pattern": "ab", "maxLength": 4},
             ["ab", "xab", "abxx"], ["a", "abxxx"]),
        # length bounds a pattern or format does not imply, long ones included (counted machines)
        case("pattern_unanchored_max_length_255", {"type": "string", "pattern": "ab", "maxLength": 255},
             ["some words " * 20 + "ab" + "x" * 20, "ab" + "y" * 253], ["x" * 254 + "ab", "xy"]),
        case("pattern_min_length", {"type": "string", "pattern": "^https?://", "minLength": 11},
             ["http://a.io", "https://example.org/a/b"], ["http://a.i", "ftp://example.org"]),
        case("email_max_length_40", {"type": "object", "properties": {"email": {"type": "string", "format": "email",
                                                                                "maxLength": 40}},
                                     "required": ["email"]},
             [{"email": "john.doe@example.com"}], [{"email": "a" * 40 + "@b.cc"}, {"email": "john"}]),
        case("string_max_length_5000", {"type": "string", "minLength": 300, "maxLength": 5000},
             ["lorem ipsum dolor " * 40], ["short", "x" * 5001]),
    ]


def sample(name: str, n: int, seed: int = 0) -> list[dict]:
    cases = list(load_slice(name))
    random.Random(seed).shuffle(cases)
    return cases[:n]


def _resolve(root, ref: str):
    if not ref.startswith("#"):
        return None
    node = root
    for seg in ref[1:].split("/")[1:]:
        seg = seg.replace("~1", "/").replace("~0", "~")
        from urllib.parse import unquote
        seg = unquote(seg)
        if isinstance(node, list):
            node = node[int(seg)]
        elif isinstance(node, dict) and seg in node:
            node = node[seg]
        else:
            return None
    return node


def _validates(schema, data, root) -> bool:
    import warnings

    import jsonschema
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=__name__)
    try:
        cls = jsonschema.validators.validator_for(root)
        full = dict(root) if isinstance(root, dict) else root
        if isinstance(full, dict) and isinstance(schema, dict):
            sub = dict(schema)
            for k in ("definitions", "$defs"):
                if k in root:
                    sub.setdefault(k, root[k])
            schema = sub
        resolver_root = root
        v = cls(schema, resolver=jsonschema.RefResolver.from_schema(resolver_root))
        return v.is_valid(data)
    except Exception:
        return False


def _key_order(schema, data, root, depth=0) -> list[str]:
    """Property names in the order the controller writes them, for the branch `data` takes: the
    listed properties (own, then allOf parts'), then those of the anyOf/oneOf branches taken,
    then required names that none of them lists (as the controller merges allOf and distributes
    siblings into branches)."""
    plain, alt, req = _orders(schema, data, root, depth)
    return _merge_orders(_merge_orders(plain, alt), req)


def _orders(schema, data, root, depth) -> tuple[list[str], list[str], list[str]]:
    if depth > 20 or not isinstance(schema, dict):
        return [], [], []
    plain: list[str] = []
    alt: list[str] = []
    req: list[str] = [k for k in schema.get("required", []) or [] if isinstance(k, str)]

    def take(p, a, r):
        nonlocal plain, alt, req
        plain, alt, req = _merge_orders(plain, p), _merge_orders(alt, a), _merge_orders(req, r)

    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        if target is not None:
            take(*_orders(target, data, root, depth + 1))
    if isinstance(schema.get("properties"), dict):
        plain = _merge_orders(plain, list(schema["properties"]))
    for part in schema.get("allOf", []) or []:
        take(*_orders(part, data, root, depth + 1))
    for kw in ("oneOf", "anyOf"):
        for branch in schema.get(kw, []) or []:
            if _validates(branch, data, root):
                p, a, r = _orders(branch, data, root, depth + 1)
                take([], _merge_orders(p, a), r)
                break
    return plain, alt, req


def _merge_orders(a: list[str], b: list[str]) -> list[str]:
    return a + [k for k in b if k not in a]


def _applicable(schema, data, root, own, depth=0) -> list:
    """The subschemas `own(schema)` names, over `schema` and what applies with it: its $ref
    target, its allOf parts and the anyOf/oneOf branch `data` takes."""
    out: list = []
    if depth > 20 or not isinstance(schema, dict):
        return out
    if "$ref" in schema:
        t = _resolve(root, schema["$ref"])
        if t is not None:
            out += _applicable(t, data, root, own, depth + 1)
    out += own(schema)
    for part in schema.get("allOf", []) or []:
        out += _applicable(part, data, root, own, depth + 1)
    for kw in ("oneOf", "anyOf"):
        for alt in schema.get(kw, []) or []:
            if _validates(alt, data, root):
                out += _applicable(alt, data, root, own, depth + 1)
                break
    return out


def _sub(schema, key, data, root):
    """The schemas that apply to property `key`."""
    def own(s):
        props = s.get("properties")
        if isinstance(props, dict) and key in props:
            return [props[key]]
        return [s["additionalProperties"]] if isinstance(s.get("additionalProperties"), dict) else []
    return _applicable(schema, data, root, own)


def _items(schema, i, data, root):
    """The schemas that apply to item `i`."""
    def own(s):
        items, prefix = s.get("items"), s.get("prefixItems")
        if isinstance(items, list):
            prefix, items = items, s.get("additionalItems")
        if isinstance(prefix, list) and i < len(prefix):
            return [prefix[i]]
        return [items] if isinstance(items, dict) else []
    return _applicable(schema, data, root, own)


def ordered(schemas: list, data, root, depth=0):
    """`data` with object keys reordered as the controller writes them under `schemas` (all apply)."""
    if depth > 60:
        return data
    if isinstance(data, dict):
        order: list[str] = []
        for s in schemas:
            order = _merge_orders(order, _key_order(s, data, root))
        keys = [k for k in order if k in data] + [k for k in data if k not in order]
        return {k: ordered([x for s in schemas for x in _sub(s, k, data, root)], data[k], root, depth + 1) for k in keys}
    if isinstance(data, list):
        return [ordered([x for s in schemas for x in _items(s, i, data, root)], v, root, depth + 1) for i, v in enumerate(data)]
    return data


def given_text(data) -> bytes:
    """The instance as given (compact, UTF-8, object keys in the data's own order)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def instance_text(schema, data) -> bytes:
    """The instance as the controller would write it (compact, UTF-8, schema key order)."""
    return json.dumps(ordered([schema], data, schema), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


class VocabTokenizer:
    """The aicirt Tokenizer protocol over a token-bytes list; encode is longest-match (any split
    is a valid token sequence for a controller) unless `encode` is given."""

    def __init__(self, token_bytes: list[bytes], eos: int, encode=None):
        self.token_bytes, self.eos_token_id, self.vocab_size = token_bytes, eos, len(token_bytes)
        self._encode = encode

    def encode(self, text: str) -> list[int]:
        from _vocabs import greedy_tokenize
        return self._encode(text) if self._encode else greedy_tokenize(self.token_bytes, text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        from _vocabs import greedy_tokenize
        return self._encode(data.decode("utf-8")) if self._encode else greedy_tokenize(self.token_bytes, data)

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids if i < self.vocab_size)


class Checker:
    """Drives the `json` controller through aicirt.Runtime, one schema at a time: compile (the
    first call), then each instance token by token under the masks, backtracking to the prompt
    between instances. Records the controller's own time per call (`inside_us`) and the time
    through submit -> wait (`wall_us`)."""

    PROMPT = "Answer: "
    WAIT_S = 300.0      # for one result: a hang guard, not a timing promise

    def __init__(self, tok: VocabTokenizer, wasm: bytes, options: bytes = b"\0fast_forward=0"):
        import aicirt
        self.tok, self.options = tok, options
        limits = aicirt.Limits(first_call_timeout_s=60.0, call_timeout_s=10.0, soft_deadline_s=10.0)
        self.rt = aicirt.Runtime(tok, limits=limits, workers=1)
        self.ctrl = self.rt.load(wasm)
        self.prompt = tok.encode(self.PROMPT)
        self.inside_us: list[float] = []
        self.wall_us: list[float] = []

    def close(self):
        self.rt.close()

    def _submit(self, seq, toks, sampled, record=True):
        import time
        t0 = time.perf_counter()
        # every result must come: wait as long as a busy machine may need (it returns when done;
        # the 10 s soft deadline alone was passed by a first call over Qwen2's vocabulary at load 20)
        out = self.rt.submit([StepInput(seq, self.prompt + toks, sampled)]).wait(self.WAIT_S)
        dt = (time.perf_counter() - t0) * 1e6
        r = out.results[0]
        if r.status != "ok":
            raise RuntimeError(f"controller error: {r.error} {r.logs}")
        mask = None
        if r.branches:
            row = r.branches[0].mask_row
            mask = None if row is None else out.masks[row]
        if record and r.branches:
            self.inside_us.append(r.elapsed_us)
            self.wall_us.append(dt)
        return r, mask

    def open(self, schema) -> tuple[object, str | None, float]:
        """(sequence, error log or None, first-call µs)."""
        arg = json.dumps(schema, ensure_ascii=False).encode("utf-8") + self.options
        req = self.rt.new_request(self.ctrl, arg=arg)
        seq = req.spawn()
        r, _ = self._submit(seq, [], None, record=False)
        err = None if r.branches else ("".join(r.logs).strip() or "stopped without a log line")
        return (req, seq), err, r.elapsed_us

    def accepts(self, handle, text: bytes, tokens: list[int] | None = None) -> tuple[bool, int]:
        """(accepted: every token allowed and the end allowed (EOS, or the controller stops),
        tokens taken). `tokens`: the text already tokenized. Runs on a fork of the compiled
        sequence, which stays at the prompt."""
        req, seq = handle
        toks = self.tok.encode_bytes(text) if tokens is None else tokens
        eos = self.tok.eos_token_id
        child = seq.fork()
        try:
            r, mask = self._submit(child, [], None, record=False)
            taken = 0
            for k, t in enumerate(toks):
                if not r.branches or mask is None or not (int(mask[t >> 5]) >> (t & 31)) & 1:
                    return False, taken
                r, mask = self._submit(child, toks[:k + 1], t)
                taken += 1
            end = not r.branches or (mask is not None and (int(mask[eos >> 5]) >> (eos & 31)) & 1)
            return bool(end), taken
        finally:
            child.close()

    def close_handle(self, handle):
        req, seq = handle
        seq.close()
        req.close()


def check_case(checker: Checker, case: dict) -> dict:
    """MaskBench's check of one case: compiled (or the error), and per instance the verdict."""
    handle, err, first_us = checker.open(case["schema"])
    out = {"id": case["id"], "error": err, "first_us": first_us, "valid": [], "invalid": []}
    try:
        if err is None:
            for t in case["tests"]:
                try:
                    text = instance_text(case["schema"], t["data"])
                except (ValueError, RecursionError):
                    continue
                ok, _ = checker.accepts(handle, text)
                (out["valid"] if t["valid"] else out["invalid"]).append((ok, text))
    finally:
        checker.close_handle(handle)
    return out


def sample_document(checker, handle, rng, max_tokens=150, closing_after=20):
    """Random logits, sampled under the masks; past `closing_after` tokens, tokens that close
    something (quotes, brackets, EOS) are preferred so that most documents end. None if
    unfinished."""
    req, seq = handle
    vocab, eos = checker.tok.token_bytes, checker.tok.eos_token_id
    child = seq.fork()
    toks: list[int] = []
    try:
        r, mask = checker._submit(child, [], None, record=False)
        for _ in range(max_tokens):
            if not r.branches:
                return b"".join(vocab[t] for t in toks)
            if mask is None:       # fast-forward: take the splice
                sp = r.branches[0].splices[0]
                toks = toks[:len(toks) - sp.backtrack] + list(sp.ff_tokens)
                r, mask = checker._submit(child, toks, None, record=False)
                continue
            allowed = np.nonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))[0]
            if len(toks) > closing_after:
                closing = [t for t in allowed if t == eos or (vocab[t][:1] in (b'"', b"]", b"}", b","))]
                allowed = closing or allowed
            t = int(rng.choice(allowed))
            if t == eos:
                return b"".join(vocab[t] for t in toks)
            toks.append(t)
            r, mask = checker._submit(child, toks, t, record=False)
        return None
    finally:
        child.close()


def sampled_documents_validate(checker, cases, per_schema=2, max_tokens=150):
    """Documents sampled under the masks of each case's schema validate with `jsonschema`; how many
    were sampled (unfinished ones are not counted)."""
    import jsonschema
    rng = np.random.default_rng(0)
    done = 0
    for case in cases:
        handle, err, _ = checker.open(case["schema"])
        try:
            if err is not None:
                continue
            for _ in range(per_schema):
                doc = sample_document(checker, handle, rng, max_tokens=max_tokens)
                if doc is None:
                    continue
                data = json.loads(doc.decode("utf-8"))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cls = jsonschema.validators.validator_for(case["schema"])
                    errors = list(cls(case["schema"]).iter_errors(data))
                assert not errors, (case["id"], doc[:300], errors[0].message[:200])
                done += 1
        finally:
            checker.close_handle(handle)
    return done
