"""The router's --tokenizer: exact prompt token counts from a tokenizer.json (router/prompt_tokens.py).

The tokenizer.json is made here with the `tokenizers` library itself: a word-level vocabulary with
a BOS token that the post-processor adds, so that counts with and without special tokens differ.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest
from router_harness import post_through_router  # type: ignore[import-not-found]
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tidegate.config import ConfigError
from tidegate.router import prompt_tokens
from tidegate.router.main import run as run_router
from tidegate.router.parse import BadRequest, parse_request
from tidegate.router.proxy import ProxySettings
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.simulator.server import create_app
from tidegate.tokens import count_chat_tokens, count_completion_prompt_tokens

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "away", ".", ","]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    vocab = {"[UNK]": 0, "<s>": 1} | {w: i + 2 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def counter(tokenizer_json: str) -> prompt_tokens.PromptCounter:
    return prompt_tokens.from_file(tokenizer_json)


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        ("the cat sat on the mat .", 1 + 7),          # BOS + words, as the engine counts a completion
        ("thecatsat", 1 + 1),                          # one unknown word: one token, not 9 bytes / 4
        (["the cat", " sat"], 1 + 3),                  # a list of strings is one prompt
        ([101, 7, 7, 3], 4),                           # token ids count themselves
    ],
    ids=["text", "unknown-word", "string-list", "token-ids"],
)
def test_completion_prompts_are_exact(counter: prompt_tokens.PromptCounter, prompt, tokens: int) -> None:
    assert counter.completion(prompt) == tokens


def test_chat_counts_content_exactly_and_keeps_the_template_estimate(counter: prompt_tokens.PromptCounter) -> None:
    messages = [{"role": "system", "content": "a dog ran away ."},
                {"role": "user", "content": [{"type": "text", "text": "the cat"}, {"type": "image_url"}],
                 "name": "cat"},
                {"role": "assistant", "content": None}]
    # content 5 + 2 + 0, name 1, framing 4 per message + 2: no BOS per message (the template's job).
    assert counter.chat(messages) == 5 + 2 + 0 + 1 + 3 * 4 + 2


def test_estimate_is_the_simulators_rule() -> None:
    messages = [{"role": "user", "content": "héllo there, how are you today?"}]
    assert prompt_tokens.ESTIMATE.chat(messages) == count_chat_tokens(messages)
    assert prompt_tokens.ESTIMATE.completion("x" * 41) == count_completion_prompt_tokens("x" * 41) == 11


def test_parse_request_uses_the_counter(counter: prompt_tokens.PromptCounter) -> None:
    body = json.dumps({"model": "m", "prompt": "the cat sat", "max_tokens": 3}).encode()
    assert parse_request("/v1/completions", body, counter=counter)[1].prompt_tokens == 4
    assert parse_request("/v1/completions", body)[1].prompt_tokens == 3  # ceil(11 bytes / 4)
    bad = json.dumps({"model": "m", "prompt": [1, "x"]}).encode()
    with pytest.raises(BadRequest, match="prompt must be"):
        parse_request("/v1/completions", bad, counter=counter)


def test_unusable_tokenizer_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a readable tokenizer.json"):
        prompt_tokens.from_file(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ConfigError, match="not a readable tokenizer.json"):
        prompt_tokens.from_file(str(tmp_path / "bad.json"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"tokenizer": "/nonexistent/tokenizer.json"}, "--tokenizer /nonexistent/tokenizer.json"),
        ({"engine_api_key": "m=env:TIDEGATE_TEST_UNSET_KEY"}, "engine API key of pool 'm'"),
    ],
    ids=["tokenizer", "engine-key"],
)
def test_router_refuses_to_start_without_its_files(flags: dict[str, str], message: str,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIDEGATE_TEST_UNSET_KEY", raising=False)
    args = argparse.Namespace(etcd="127.0.0.1:2379", config=None, log_json=True, **flags)
    assert run_router(args) == 2
    assert message in capsys.readouterr().err


class RecordingPolicy:
    """Picks the first candidate and records the prompt tokens the router measured."""

    name = "recording"

    def __init__(self) -> None:
        self.prompt_tokens: list[int] = []

    def pick(self, snapshot, request, rng):  # type: ignore[no-untyped-def]
        from tidegate.policy import registry

        self.prompt_tokens.append(request.prompt_tokens)
        cands = snapshot.candidates()
        return registry.make_pick(cands[0], "first", 0.0, len(cands)) if cands else None


async def test_the_proxy_routes_on_the_tokenizers_count(counter: prompt_tokens.PromptCounter,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from aiohttp import web

    from tidegate.policy import registry

    policy = RecordingPolicy()
    monkeypatch.setattr(registry, "create", lambda name: policy)
    app = create_app(Engine(get_profile("tiny-h100"), random.Random(0)), "m", speedup=50.0)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    payload = {"model": "m", "prompt": "the cat sat on the mat .", "max_tokens": 2}
    try:
        for settings in (ProxySettings(prompt_counter=counter), ProxySettings()):
            assert await post_through_router(url, settings, "/v1/completions", payload) == 200
    finally:
        await runner.cleanup()
    assert policy.prompt_tokens == [8, 6]  # BOS + 7 words; ceil(24 bytes / 4)
