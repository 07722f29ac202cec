"""Property tests of the router's request parsing: any bytes, any JSON, any OpenAI-shaped body
either parse or raise the documented `BadRequest` (a 400 at the edge), never anything else."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidegate.errors import RequestError
from tidegate.router.parse import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DEFAULT_MAX_JSON_DEPTH,
    BadRequest,
    ParsedBody,
    decode_json,
    parse_request,
    request_prefix_hashes,
)

PATHS = st.sampled_from([CHAT_PATH, COMPLETIONS_PATH])
# Every code point, lone surrogates included (hypothesis leaves those out of text() by default).
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=20)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | ANY_TEXT
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(ANY_TEXT, inner, max_size=4), max_leaves=20)


def _dumps(v: Any) -> bytes:
    # ensure_ascii escapes lone surrogates as \udXXX, as a hostile client would send them
    return json.dumps(v, ensure_ascii=True).encode()


def _valid_unicode(v: Any) -> bool:
    try:
        json.dumps(v, ensure_ascii=False).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check(path: str, body: bytes) -> None:
    try:
        payload, features = parse_request(path, body)
    except BadRequest as exc:
        assert isinstance(exc, RequestError) and str(exc)
        return
    assert isinstance(payload, ParsedBody) and isinstance(payload.payload, dict)
    assert isinstance(features.model, str) and features.model
    assert isinstance(features.prompt_tokens, int) and features.prompt_tokens >= 1
    assert features.max_tokens is None or isinstance(features.max_tokens, int)
    request_prefix_hashes(path, payload)  # must not raise on anything parse_request accepted


@settings(max_examples=300, deadline=None)
@given(PATHS, st.binary(max_size=200))
def test_any_bytes(path: str, body: bytes):
    _check(path, body)


@settings(max_examples=300, deadline=None)
@given(PATHS, JSON_VALUES)
def test_any_json(path: str, value: Any):
    _check(path, _dumps(value))


MESSAGE = st.fixed_dictionaries({"role": JSON_VALUES}, optional={
    "content": JSON_VALUES | ANY_TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": JSON_VALUES})),
    "name": JSON_VALUES,
})
OPENAI_BODY = st.fixed_dictionaries(
    {"model": st.just("m") | JSON_VALUES},
    optional={
        "messages": st.lists(MESSAGE | JSON_VALUES, max_size=3) | JSON_VALUES,
        "prompt": ANY_TEXT | st.lists(st.integers(), max_size=5) | st.lists(ANY_TEXT, max_size=3) | JSON_VALUES,
        "max_tokens": JSON_VALUES,
        "max_completion_tokens": JSON_VALUES,
        "stream": JSON_VALUES,
        "temperature": JSON_VALUES,
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PATHS, OPENAI_BODY)
def test_openai_shaped_bodies(path: str, body: dict[str, Any]):
    raw = _dumps(body)
    _check(path, raw)
    if not _valid_unicode(body):
        try:
            parse_request(path, raw)
        except BadRequest:
            return
        raise AssertionError("a body with a lone surrogate was accepted")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.sampled_from(["[", '{"a":']))
def test_nesting_depth_is_bounded(depth: int, opener: str):
    closer = "]" if opener == "[" else "}"
    body = (opener * depth + "1" + closer * depth).encode()
    try:
        decode_json(body)
    except BadRequest as exc:
        assert depth > DEFAULT_MAX_JSON_DEPTH, exc
        return
    assert depth <= DEFAULT_MAX_JSON_DEPTH


def test_deep_but_flat_bodies_are_fine():
    # many brackets, little depth: the walk runs and accepts
    body = json.dumps({"model": "m", "prompt": [[1]] * 200}).encode()
    assert decode_json(body)["model"] == "m"


def test_lone_surrogates_and_bad_utf8_are_bad_requests():
    for raw in (b'{"model":"m","prompt":"\\ud800"}', b'{"model":"m","prompt":"\\uDFFF x"}',
                b'{"\\ud800":1,"model":"m","prompt":"x"}', b'{"model":"m","prompt":"\xff"}',
                '{"model":"m","prompt":"x"}'.encode("utf-16")):
        try:
            parse_request(COMPLETIONS_PATH, raw)
        except BadRequest:
            continue
        raise AssertionError(raw)
    # a surrogate pair is one valid character
    _, f = parse_request(COMPLETIONS_PATH, b'{"model":"m","prompt":"\\ud83d\\ude00"}')
    assert f.prompt_tokens == 1
