"""The live cross-check's shared-prefix workload (tidegate.fleet.crosscheck, used by
scripts/crosscheck_live_vs_sim.py): the prompt texts the live replay sends share exactly their
group's prefix, byte for byte; the block ids the virtual run is given are the ones a live engine
(and the router) computes from those texts; and an engine fed those ids hits exactly the shared
blocks."""

from __future__ import annotations

import itertools
import os
import random
from pathlib import Path

import pytest

from tidegate.fleet import crosscheck as xc
from tidegate.fleet import loadgen, traces
from tidegate.router.parse import request_prefix_hashes
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import get_profile
from tidegate.tokens import (
    PREFIX_BLOCK_BYTES,
    PREFIX_BLOCK_TOKENS,
    count_prompt_tokens,
    engine_block_ids,
    prefix_block_hashes,
    prefix_bytes,
)

# (groups, shared prefix tokens, mean suffix tokens)
CASES = [
    (0, 1024, 300),     # no groups: no two prompts share a block
    (1, 512, 100),      # one group, the smallest prefix
    (4, 1024, 300),
    (8, 2048, 400),
    (3, 3584, 2000),    # suffixes cut so that the prompt stays within the router's hashed tokens
]
IDS = [f"groups={g},prefix={p},suffix={m}" for g, p, m in CASES]


def _workload(tmp_path: Path, groups: int, prefix_tokens: int, mean: float,
              n: int = 40) -> tuple[list[traces.TraceRequest], list[str]]:
    path = tmp_path / "workload.jsonl"
    xc.write_workload(path, n, 10.0, 3, mean, 50, groups, prefix_tokens)
    trace = traces.load(path)
    # What loadgen.replay sends request i.
    return trace, [loadgen.make_prompt(r.prompt_tokens, i, r.prefix_hashes) for i, r in enumerate(trace)]


@pytest.mark.parametrize(("groups", "prefix_tokens", "mean"), CASES, ids=IDS)
def test_prompts_share_exactly_their_group_prefix(tmp_path: Path, groups: int, prefix_tokens: int,
                                                  mean: float) -> None:
    trace, texts = _workload(tmp_path, groups, prefix_tokens, mean)
    shared = prefix_tokens * 4  # bytes: one filler token is 4 bytes
    assert len({r.prefix_hashes for r in trace}) == max(1, groups)
    for r, text in zip(trace, texts, strict=True):
        assert count_prompt_tokens(text) == r.prompt_tokens
        if groups:
            assert prefix_tokens + PREFIX_BLOCK_TOKENS <= r.prompt_tokens <= xc.MAX_SHARED_MODE_TOKENS
    for (ra, a), (rb, b) in itertools.combinations(zip(trace, texts, strict=True), 2):
        common = len(os.path.commonprefix([a, b]))
        if groups and ra.prefix_hashes == rb.prefix_hashes:
            assert a[:shared] == b[:shared]
            assert common < shared + PREFIX_BLOCK_BYTES  # the suffixes part within their first block
        else:
            assert common < PREFIX_BLOCK_BYTES


@pytest.mark.parametrize(("groups", "prefix_tokens", "mean"), CASES, ids=IDS)
def test_virtual_hashes_are_the_live_engines_and_routers(tmp_path: Path, groups: int, prefix_tokens: int,
                                                         mean: float) -> None:
    trace, texts = _workload(tmp_path, groups, prefix_tokens, mean)
    rows = xc.virtual_trace(trace)
    block_size = get_profile("llama3-8b-h100").block_size
    for r, text, row in zip(trace, texts, rows, strict=True):
        body = {"model": "m", "prompt": text}
        # As `tidegate sim` hashes what it receives (simulator.server._generate, SimServer.submit).
        live = engine_block_ids(prefix_block_hashes(prefix_bytes(body, False)), block_size)
        assert live == (tuple(row["prefix_hashes"]), PREFIX_BLOCK_TOKENS)   # generic traces' tokens per id
        assert request_prefix_hashes("/v1/completions", body) == live[0]
        assert len(live[0]) == r.prompt_tokens // PREFIX_BLOCK_TOKENS
        assert (row["arrival_s"], row["prompt_tokens"], row["output_tokens"]) == \
            (r.arrival_s, r.prompt_tokens, r.output_tokens)


@pytest.mark.parametrize(("groups", "prefix_tokens", "mean"), CASES, ids=IDS)
def test_an_engine_hits_exactly_the_shared_blocks(tmp_path: Path, groups: int, prefix_tokens: int,
                                                  mean: float) -> None:
    """One request at a time on one engine with room for all: each request after the first of its
    group finds the group's prefix cached, and nothing else."""
    trace, _ = _workload(tmp_path, groups, prefix_tokens, mean)
    engine = Engine(get_profile("llama3-8b-h100"), random.Random(0))
    seen: set[tuple[int, ...]] = set()
    expected = 0
    for i, (r, row) in enumerate(zip(trace, xc.virtual_trace(trace), strict=True)):
        engine.add_request(f"r{i}", r.prompt_tokens, 1, engine.clock_s, row["prefix_hashes"], PREFIX_BLOCK_TOKENS)
        engine.advance(engine.clock_s + 10.0)
        if groups and r.prefix_hashes in seen:
            expected += prefix_tokens
        seen.add(r.prefix_hashes)
    assert engine.stats().prefix_cache_hits_total == expected
    assert (expected > 0) == (groups > 0)


@pytest.mark.parametrize("prefix_tokens", [0, 100, 1000, xc.MAX_SHARED_MODE_TOKENS, xc.MAX_SHARED_MODE_TOKENS + 1024])
def test_bad_prefix_length_is_refused(tmp_path: Path, prefix_tokens: int) -> None:
    with pytest.raises(ValueError, match="--prefix-tokens must be a multiple of 512"):
        xc.write_workload(tmp_path / "w.jsonl", 10, 5.0, 1, 300, 50, 2, prefix_tokens)
