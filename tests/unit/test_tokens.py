from __future__ import annotations

import pytest

from tidegate.tokens import (
    PREFIX_BLOCK_BYTES,
    PREFIX_BLOCK_TOKENS,
    chat_prompt,
    completion_prompt,
    count_chat_tokens,
    count_completion_prompt_tokens,
    count_prompt_tokens,
    engine_block_ids,
    prefix_block_hashes,
    prefix_bytes,
    prefix_text,
)

B, T = PREFIX_BLOCK_BYTES, PREFIX_BLOCK_TOKENS


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 1), ("a", 1), ("abcd", 1), ("abcde", 2), ("x" * 4000, 1000), ("é" * 4, 2), ("日本", 2)],
)
def test_text_rule(text, expected):
    assert count_prompt_tokens(text) == expected


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], 2),
        ([{"role": "user", "content": "hi"}], 2 + 4 + 1),
        ([{"role": "system", "content": "abcdefgh"}, {"role": "user", "content": "abcd"}], 2 + 6 + 5),
        ([{"role": "assistant", "content": None}], 6),
        ([{"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}], 7),
        ([{"role": "user", "content": "", "name": "bobby"}], 2 + 4 + 2),
    ],
)
def test_chat_rule(messages, expected):
    assert count_chat_tokens(messages) == expected


def test_completion_prompt_forms():
    assert count_completion_prompt_tokens("abcdefgh") == 2
    assert count_completion_prompt_tokens([1, 2, 3]) == 3
    assert count_completion_prompt_tokens(["abcd", "efgh"]) == 2
    with pytest.raises(TypeError):
        count_completion_prompt_tokens([])
    with pytest.raises(TypeError):
        count_chat_tokens([{"role": "user", "content": 5}])


@pytest.mark.parametrize(
    ("hashes", "block_size", "expected"),
    [
        ((1, 2, 3, 4), T // 4, ((1, 2, 3, 4), T)),   # four 16-token KV blocks per id
        ((1, 2, 3, 4), T // 8, ((1, 2, 3, 4), T)),   # eight KV blocks per id
        ((1, 2, 3, 4), 2 * T, ((2, 4), 2 * T)),      # every 2nd chained id names its 2T tokens
        ((1, 2, 3, 4, 5), 3 * T, ((3,), 3 * T)),     # a partial 3T-token block is not cacheable
        ((), 2 * T, ((), 2 * T)),
    ],
)
def test_engine_block_ids(hashes, block_size, expected):
    assert engine_block_ids(hashes, block_size) == expected


def _common(a: tuple, b: tuple) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize(
    ("a", "b", "shared_blocks"),
    [
        ("s" * 10 * B + "one", "s" * 10 * B + "two", 10),
        ("s" * (10 * B - 1) + "one", "s" * (10 * B - 1) + "two", 9),  # the 10th block differs in its last byte
        ("s" * 10 * B, "s" * 10 * B, 10),
        ("é" * B, "é" * B + "x", 2),                   # blocks are bytes, not characters
        ("abc", "abc", 0),                               # no whole block
        ("t" * B * 300, "t" * B * 300, 300),            # no cap unless asked for one
    ],
)
def test_prefix_block_hashes_share_exactly_the_common_whole_blocks(a, b, shared_blocks):
    ha, hb = prefix_block_hashes(a), prefix_block_hashes(b)
    assert _common(ha, hb) == shared_blocks
    assert all(0 <= h < 2**63 for h in ha)
    assert prefix_block_hashes(a, 4) == ha[:4]


PARTS = [{"type": "text", "text": "abcd" * 70}, {"type": "image_url", "text": "not read"}, "ef" * 100,
         {"text": "typeless parts are text"}, {"type": "text", "text": 5}]
CHATS = [
    [{"role": "system", "content": "rules " * 12000}, {"role": "user", "content": "hi " * 50}],
    [{"role": "user", "content": PARTS, "name": "bob"}, {"role": "assistant", "content": None}],
    [{"role": "user", "content": "日本語のテキスト" * 90}, {"role": "tool", "content": []}],
]
PROMPTS = ["document " * 8000, ["chapter one " * 40, "chapter two " * 40], [1, 2, 3], "é" * 300]


@pytest.mark.parametrize("messages", CHATS, ids=["long", "parts", "multibyte"])
def test_a_chat_counts_and_blocks_the_same_content(messages):
    """One content rule: a list of parts reads as the string of its text parts, for the count and
    for the blocks alike; the one-pass form gives what the separate ones give."""
    as_strings = [{**m, "content": "abcd" * 70 + "ef" * 100 + "typeless parts are text"}
                  if isinstance(m.get("content"), list) and m["content"] else m for m in messages]
    tokens, data = chat_prompt(messages)
    assert tokens == count_chat_tokens(messages) == count_chat_tokens(as_strings)
    assert data == prefix_bytes({"messages": messages}, True) == prefix_bytes({"messages": as_strings}, True)
    assert data.decode() == prefix_text({"messages": messages}, True)
    assert b"not read" not in data


@pytest.mark.parametrize("prompt", PROMPTS, ids=["string", "strings", "token-ids", "multibyte"])
def test_a_completion_prompt_counts_and_blocks_the_same_text(prompt):
    tokens, data = completion_prompt(prompt)
    assert tokens == count_completion_prompt_tokens(prompt)
    assert data == prefix_bytes({"prompt": prompt}, False)
    assert (data == b"") == (not isinstance(prompt, str) and isinstance(prompt[0], int))


def test_a_request_the_count_refuses_has_no_blocks():
    assert prefix_bytes({"messages": [{"role": "user", "content": 5}]}, True) == b""
    assert prefix_bytes({"messages": "hi"}, True) == b""
    assert prefix_bytes({"prompt": "\ud800" * 300}, False) == b""   # not valid Unicode
    assert prefix_bytes({"prompt": []}, False) == b""


def test_block_ids_are_pinned():
    """Ids are a contract between processes and builds (the router predicts, the simulated engine
    caches): XXH3-64 chained by its seed, top 63 bits. A change here changes every id."""
    assert prefix_block_hashes("a" * 2 * B) == (2300679671508256889, 768189889651470421)
    assert prefix_block_hashes(b"a" * 2 * B) == prefix_block_hashes("a" * 2 * B)


@pytest.mark.parametrize(("path", "payload"),
                         [("/v1/chat/completions", {"model": "m", "messages": m}) for m in CHATS]
                         + [("/v1/completions", {"model": "m", "prompt": p}) for p in PROMPTS])
def test_router_and_engine_cut_the_same_blocks(path, payload):
    """The router's ids (capped), from the bytes its count encoded, are the leading ids the
    simulated engine hashes from the same request (simulator.server: prefix_bytes of the body)."""
    import json

    from tidegate.router.parse import MAX_PREFIX_BLOCKS, parse_request, request_prefix_hashes
    from tidegate.router.prompt_tokens import PromptCounter

    chat = path == "/v1/chat/completions"
    engine = prefix_block_hashes(prefix_bytes(payload, chat))
    body, features = parse_request(path, json.dumps(payload).encode())
    assert body.prefix is not None                      # the estimate's count made the bytes
    assert request_prefix_hashes(path, body) == engine[:MAX_PREFIX_BLOCKS]
    assert request_prefix_hashes(path, payload) == engine[:MAX_PREFIX_BLOCKS]
    # With a tokenizer counting, the bytes are made on demand from the payload: the same ids.
    counted = PromptCounter(text_tokens=len, prompt_tokens=len, source="fake-len")
    body, _ = parse_request(path, json.dumps(payload).encode(), counter=counted)
    assert body.prefix is None and request_prefix_hashes(path, body) == engine[:MAX_PREFIX_BLOCKS]
    if payload.get("messages") is CHATS[0] or payload.get("prompt") is PROMPTS[0]:
        assert len(engine) > MAX_PREFIX_BLOCKS
