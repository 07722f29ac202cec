"""The simulator validates sampling fields as vLLM does: lax pydantic types, then SamplingParams ranges."""

from __future__ import annotations

import math
import random
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.simulator.server import create_app
from tidegate.simulator.validate import SamplingError, check_sampling

MODEL = "m"


@pytest.mark.parametrize("fields,param", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": [0.5]}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"seed": "x"}, "seed"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", 1]}, "stop"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"user": 1}, "user"),
    ({"ignore_eos": "maybe"}, "ignore_eos"),
], ids=lambda v: str(v))
def test_bad_fields(fields: dict[str, Any], param: str):
    with pytest.raises(SamplingError) as info:
        check_sampling(fields, chat=True, max_tokens=fields.get("max_tokens"))
    assert info.value.param == param and str(info.value)


@pytest.mark.parametrize("fields", [
    {},
    {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "seed": 7},
    {"temperature": "0.5", "top_k": 3.0, "seed": "11"},   # lax, like vLLM's pydantic model
    {"temperature": None, "stop": "\n", "presence_penalty": -2, "frequency_penalty": 2},
    {"stop": ["a", "b"], "repetition_penalty": 1.1, "min_tokens": 3, "max_tokens": 3},
    {"unknown_field": {"any": "thing"}},                  # extra fields are allowed
], ids=lambda v: str(v))
def test_good_fields(fields: dict[str, Any]):
    check_sampling(fields, chat=True, max_tokens=fields.get("max_tokens"))


def test_logprobs_differ_between_chat_and_completions():
    check_sampling({"logprobs": True, "top_logprobs": 5}, chat=True, max_tokens=None)
    with pytest.raises(SamplingError):
        check_sampling({"logprobs": True, "top_logprobs": 21}, chat=True, max_tokens=None)
    check_sampling({"logprobs": 3}, chat=False, max_tokens=None)
    with pytest.raises(SamplingError):
        check_sampling({"logprobs": -1}, chat=False, max_tokens=None)


ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                   max_leaves=8)
FIELDS = st.sampled_from(["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                          "repetition_penalty", "seed", "stop", "min_tokens", "logprobs", "top_logprobs", "user"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELDS, ANY, max_size=4), st.booleans())
def test_any_value_is_accepted_or_a_sampling_error(fields: dict[str, Any], chat: bool):
    try:
        check_sampling(fields, chat=chat, max_tokens=None)
    except SamplingError as exc:
        assert exc.param in set(fields)


async def test_server_answers_vllm_error_body():
    app = create_app(Engine(get_profile("tiny-h100"), random.Random(0)), MODEL, speedup=50.0)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(base + "/v1/chat/completions", json={**chat, "temperature": "hot"}) as r:
                assert r.status == 400
                assert await r.json() == {"error": {
                    "message": "1 validation error: temperature: Input should be a valid number, unable to parse "
                               "string as a number", "type": "BadRequestError", "param": "temperature", "code": 400}}
            async with http.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x", "top_p": 2}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "top_p"
            bad_text = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
            async with http.post(base + "/v1/chat/completions", data=bad_text) as r:
                assert r.status == 400
            async with http.post(base + "/v1/completions", data=b"[" * 100_000 + b"]" * 100_000) as r:
                assert r.status == 400
            async with http.post(base + "/v1/chat/completions", json={**chat, "temperature": "0.2"}) as r:
                assert r.status == 200
    finally:
        await runner.cleanup()
