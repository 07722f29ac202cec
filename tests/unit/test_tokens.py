from __future__ import annotations

import pytest

from tidegate.tokens import (
    PREFIX_BLOCK_BYTES,
    PREFIX_BLOCK_TOKENS,
    count_chat_tokens,
    count_completion_prompt_tokens,
    count_prompt_tokens,
    engine_block_ids,
    prefix_block_hashes,
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


def test_router_and_engine_cut_the_same_blocks():
    """The router's ids (capped) are the leading ids the engine hashes from the same request."""
    from tidegate.router.parse import MAX_PREFIX_BLOCKS, request_prefix_hashes

    chat = {"messages": [{"role": "system", "content": "rules " * 12000}, {"role": "user", "content": "hi " * 50}]}
    completion = {"prompt": "document " * 8000}
    for path, payload, is_chat in (("/v1/chat/completions", chat, True), ("/v1/completions", completion, False)):
        engine = prefix_block_hashes(prefix_text(payload, is_chat))
        assert len(engine) > MAX_PREFIX_BLOCKS
        assert request_prefix_hashes(path, payload) == engine[:MAX_PREFIX_BLOCKS]
