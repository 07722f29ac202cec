"""Per-pool engine credentials (router/credentials.py) and the proxy sending them, over real HTTP to
the simulator started with an API key (as vLLM's --api-key)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from router_harness import post_through_router  # type: ignore[import-not-found]

from tidegate.config import ConfigError, load
from tidegate.router import credentials
from tidegate.router.main import RouterConfig
from tidegate.router.proxy import ProxySettings
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.simulator.server import create_app

MODEL = "m"
KEY = "sk-engine-7f3a"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


# ------------------------------------------------------------------------------------ spec and loading


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("", ()),
        ("m=env:VLLM_API_KEY", (("m", "env", "VLLM_API_KEY"),)),
        (" *=file:/run/secrets/k , big=env:BIG_KEY ", (("*", "file", "/run/secrets/k"), ("big", "env", "BIG_KEY"))),
        ("m=file:/a=b:c", (("m", "file", "/a=b:c"),)),
    ],
    ids=["empty", "env", "any-and-pool", "path-with-separators"],
)
def test_parse_spec(spec: str, want: tuple[tuple[str, str, str], ...]) -> None:
    got = credentials.parse_spec(spec)
    assert tuple((c.pool, c.kind, c.where) for c in got) == want


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("m", "expected POOL=file:PATH"),
        ("m=VLLM_API_KEY", "expected POOL=file:PATH"),
        ("m=s3:bucket/key", "expected POOL=file:PATH"),
        ("=env:K", "expected POOL=file:PATH"),
        ("m=env:", "expected POOL=file:PATH"),
        ("m=env:not-a-name", "not an environment variable name"),
        ("m=env:A,m=env:B", "given twice"),
    ],
    ids=["no-source", "no-kind", "bad-kind", "no-pool", "empty-var", "bad-var", "twice"],
)
def test_parse_spec_rejects(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        credentials.parse_spec(spec)
    with pytest.raises(ConfigError, match="engine_api_key"):
        load(RouterConfig, "router", {"engine_api_key": spec}, environ={})


def test_load_reads_files_and_env_and_prefers_the_pools_own(tmp_path: Path) -> None:
    (tmp_path / "key").write_text(f"  {KEY}\n")
    creds = credentials.load(credentials.parse_spec(f"big=file:{tmp_path / 'key'},*=env:ANY_KEY"),
                             {"ANY_KEY": "sk-any"})
    assert creds.authorization("big") == f"Bearer {KEY}"
    assert creds.authorization("small") == "Bearer sk-any"
    assert credentials.load((), {}).authorization("big") is None
    assert KEY not in repr(creds) and "sk-any" not in repr(creds)


@pytest.mark.parametrize(
    ("spec", "env", "match"),
    [
        ("m=env:UNSET", {}, "pool 'm': env:UNSET is empty or unset"),
        ("m=env:BLANK", {"BLANK": "  "}, "pool 'm': env:BLANK is empty or unset"),
        ("m=file:/nonexistent/key", {}, "pool 'm': cannot read file:/nonexistent/key"),
        ("m=env:TWO", {"TWO": "a\nb"}, "control characters"),
        ("m=env:CR", {"CR": "a\rb"}, "control characters"),
        ("m=env:TAB", {"TAB": "a\tb"}, "control characters"),
        ("m=env:NUL", {"NUL": "a\x00b"}, "control characters"),
        ("m=env:K,*=env:EMPTY", {"K": "sk", "EMPTY": ""}, "pool '\\*': env:EMPTY is empty or unset"),
    ],
    ids=["unset", "blank", "no-file", "newline", "carriage-return", "tab", "nul", "empty-catch-all"],
)
def test_load_errors_name_pool_and_source_never_the_key(spec: str, env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        credentials.load(credentials.parse_spec(spec), env)
    assert "a\nb" not in str(info.value)


@pytest.mark.parametrize("value", ["", "Bearer ", "Bearer   ", "sk-no-scheme"], ids=["empty", "no-key", "blank-key",
                                                                                     "no-scheme"])
def test_an_empty_credential_is_a_config_error_not_a_fall_through(value: str) -> None:
    """Built by hand (not through load()), an empty entry would have read as "no credential" and
    sent the catch-all's key, or none, to that pool's engines: it is refused instead."""
    with pytest.raises(ConfigError, match="pool 'm'"):
        credentials.EngineCredentials({"m": value, credentials.ANY_POOL: "Bearer sk-any"})


def test_a_pools_own_entry_wins_and_others_fall_back_to_the_catch_all() -> None:
    creds = credentials.EngineCredentials({"m": "Bearer sk-m", credentials.ANY_POOL: "Bearer sk-any"})
    assert (creds.authorization("m"), creds.authorization("other")) == ("Bearer sk-m", "Bearer sk-any")
    assert credentials.EngineCredentials({"m": "Bearer sk-m"}).authorization("other") is None


# ------------------------------------------------------------------------- over HTTP, to the simulator


@pytest.fixture
async def sim_url() -> AsyncIterator[str]:
    app = create_app(Engine(get_profile("tiny-h100"), random.Random(0)), MODEL, speedup=50.0, api_key=KEY)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_sim_requires_its_api_key_on_v1_only(sim_url: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(sim_url + "/v1/chat/completions", json=CHAT) as r:
            assert (r.status, await r.json()) == (401, {"error": "Unauthorized"})
        async with http.post(sim_url + "/v1/chat/completions", json=CHAT,
                             headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with http.post(sim_url + "/v1/chat/completions", json=CHAT,
                             headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status == 200
        for path in ("/health", "/metrics"):
            async with http.get(sim_url + path) as r:
                assert r.status == 200


@pytest.mark.parametrize(
    ("spec", "env", "client_auth", "status"),
    [
        ("", {}, None, 401),                                   # no credential: the engine refuses
        ("", {}, f"Bearer {KEY}", 401),                       # the client's header is never forwarded
        ("m=env:K", {"K": KEY}, "Bearer client-token", 200),  # the pool's own credential replaces it
        ("*=env:K", {"K": KEY}, None, 200),                   # the catch-all covers pools without one
        ("m=env:BAD,*=env:K", {"K": KEY, "BAD": "nope"}, None, 401),  # the pool's own wins over *
    ],
    ids=["none", "client-key-dropped", "pool-key", "any-pool-key", "pool-key-first"],
)
async def test_router_sends_the_pools_credential(sim_url: str, spec: str, env: dict[str, str],
                                                 client_auth: str | None, status: int) -> None:
    creds = credentials.load(credentials.parse_spec(spec), env)
    headers = {"Authorization": client_auth} if client_auth else {}
    status_got = await post_through_router(sim_url, ProxySettings(engine_credentials=creds), "/v1/chat/completions",
                                           CHAT, headers)
    assert status_got == status
