"""The replay's prompt texts (tidegate.fleet.loadgen.make_prompt): exact token counts by the
simulator's rule, and prefix sharing only where the trace says so (its prefix hashes), judged by
the chained block ids the engine and the router compute from the text."""

from __future__ import annotations

import pytest

from tidegate.fleet.loadgen import TRACE_HASH_BLOCK_TOKENS, make_prompt
from tidegate.tokens import PREFIX_BLOCK_TOKENS, count_prompt_tokens, prefix_block_hashes

B = TRACE_HASH_BLOCK_TOKENS


@pytest.mark.parametrize("tokens, salt, hashes", [
    (1, None, ()), (1, 3, ()), (2, 3, ()), (3, 3, ()), (4000, 7, ()),
    (B - 1, 7, (11,)), (B, 7, (11,)), (B + 1, 7, (11,)), (3 * B + 5, 7, (11, 12)), (5, 7, (11, 12)),
])
def test_token_count_is_exact(tokens: int, salt: int | None, hashes: tuple[int, ...]) -> None:
    assert count_prompt_tokens(make_prompt(tokens, salt, hashes)) == tokens


# (a, b, blocks the two prompts share by the engine's block ids)
CASES = [
    ("no salt: everything is shared", (2000, None, ()), (2000, None, ()), 2000 // PREFIX_BLOCK_TOKENS),
    ("different salts, no hashes: nothing", (2000, 1, ()), (2000, 2, ()), 0),
    ("salts a power of 32 apart: nothing", (2000, 1, ()), (2000, 1 + 32 ** 3, ()), 0),
    ("same first hash, then different: one trace block", (3 * B, 1, (5, 6)), (3 * B, 2, (5, 7)),
     B // PREFIX_BLOCK_TOKENS),
    ("same two hashes, different salts: two trace blocks", (3 * B, 1, (5, 6)), (3 * B, 2, (5, 6)),
     2 * B // PREFIX_BLOCK_TOKENS),
    ("different first hash: nothing", (3 * B, 1, (5, 6)), (3 * B, 1, (4, 6)), 0),
]


@pytest.mark.parametrize("name, a, b, shared", CASES, ids=[c[0] for c in CASES])
def test_prompts_share_exactly_the_trace_blocks(name: str, a: tuple, b: tuple, shared: int) -> None:
    ha, hb = prefix_block_hashes(make_prompt(*a)), prefix_block_hashes(make_prompt(*b))
    common = 0
    for x, y in zip(ha, hb, strict=False):
        if x != y:
            break
        common += 1
    assert common == shared


@pytest.mark.parametrize("n", [0, 5, 1234])
def test_a_salt_never_reads_as_a_trace_hash(n: int) -> None:
    """A replay salts request n's own text with n, while trace hash ids are small integers too
    (Mooncake's count from 0): request n's unique suffix must not match the block of hash n."""
    own = prefix_block_hashes(make_prompt(2 * B, n, ()))
    other = prefix_block_hashes(make_prompt(2 * B, n + 1, (n,)))
    assert own[0] != other[0]
    after = prefix_block_hashes(make_prompt(3 * B, n, (7,)))       # the suffix after a shared block
    other = prefix_block_hashes(make_prompt(3 * B, n + 1, (7, n)))
    assert after[B // PREFIX_BLOCK_TOKENS] != other[B // PREFIX_BLOCK_TOKENS]
