"""The live cross-check's workload (scripts/crosscheck_live_vs_sim.py): Poisson arrivals and
lognormal lengths, optionally in prefix groups, written as a Mooncake-style trace for the live
replay (tidegate.fleet.loadgen) and as a generic trace for the virtual run whose prefix hashes are
the block ids the live engines compute from the replayed texts; and the engines' prefix-cache
counters. Pure apart from the file it writes and the /metrics it reads.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tidegate.fleet import loadgen, traces
from tidegate.router.parse import MAX_PREFIX_BLOCKS
from tidegate.tokens import PREFIX_BLOCK_TOKENS, prefix_block_hashes

# Prefix-group hash ids start here: loadgen.make_prompt marks a unique suffix with the request's
# index, and a group's block with its id, so the two ranges must not meet.
GROUP_ID_BASE = 1 << 29
# Salts of the transport-floor probes (counted down from here): apart from both ranges above, so a
# probe's text is cached by no later request.
PROBE_SALT_BASE = GROUP_ID_BASE - 1
# The router hashes this many tokens of a prompt; longer prompts would give the live router fewer
# blocks than the virtual one.
MAX_SHARED_MODE_TOKENS = MAX_PREFIX_BLOCKS * PREFIX_BLOCK_TOKENS


def group_hashes(group: int, prefix_tokens: int) -> list[int]:
    """A prefix group's trace hash ids, one per loadgen.TRACE_HASH_BLOCK_TOKENS shared tokens."""
    per = prefix_tokens // loadgen.TRACE_HASH_BLOCK_TOKENS
    return [GROUP_ID_BASE + group * per + k for k in range(per)]


def write_workload(path: Path, n: int, rate: float, seed: int, prompt_mean: float, output_mean: float,
                   groups: int = 0, prefix_tokens: int = 0) -> None:
    """Poisson arrivals, lognormal lengths. With `groups`, a request's prompt is its group's
    `prefix_tokens` (its hash_ids) plus a lognormal suffix of mean `prompt_mean`."""
    if groups and (prefix_tokens < loadgen.TRACE_HASH_BLOCK_TOKENS or prefix_tokens % loadgen.TRACE_HASH_BLOCK_TOKENS
                   or prefix_tokens >= MAX_SHARED_MODE_TOKENS):
        raise ValueError(f"--prefix-tokens must be a multiple of {loadgen.TRACE_HASH_BLOCK_TOKENS} below "
                         f"{MAX_SHARED_MODE_TOKENS}, got {prefix_tokens}")
    rng = random.Random(seed)
    t = 0.0
    sigma = 0.6
    with open(path, "w") as f:
        for _ in range(n):
            t += rng.expovariate(rate)
            p = int(rng.lognormvariate(math.log(prompt_mean) - sigma**2 / 2, sigma))
            o = max(2, min(1000, int(rng.lognormvariate(math.log(output_mean) - sigma**2 / 2, sigma))))
            hashes: list[int] = []
            if groups:
                hashes = group_hashes(rng.randrange(groups), prefix_tokens)
                p = prefix_tokens + max(PREFIX_BLOCK_TOKENS, min(MAX_SHARED_MODE_TOKENS - prefix_tokens, p))
            else:
                p = max(16, min(8000, p))
            f.write(json.dumps({"timestamp": int(t * 1000), "input_length": p, "output_length": o,
                                "hash_ids": hashes}) + "\n")


def virtual_trace(trace: list[traces.TraceRequest]) -> list[dict]:
    """The workload for `tidegate simulate` (generic JSONL rows): each request's prefix hashes are
    the block ids a live engine computes from the text the replay sends it (request i is sent
    loadgen.make_prompt(tokens, i, its trace hashes))."""
    return [{"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
             "prefix_hashes": list(prefix_block_hashes(loadgen.make_prompt(r.prompt_tokens, i, r.prefix_hashes)))}
            for i, r in enumerate(trace)]


class CountersError(RuntimeError):
    """An engine's /metrics could not be read (unreachable, slow, an error status)."""


async def prefix_counters(engine_urls: list[str], timeout_s: float = 10.0) -> tuple[float, float]:
    """(queries, hits) in tokens, summed over the engines' /metrics. Each read is bounded by
    `timeout_s` (a stuck engine would otherwise hang the cross-check with its fleet up); a read
    that fails raises CountersError naming the engine: a partial sum would skew the hit rate."""
    queries = hits = 0.0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        for url in engine_urls:
            try:
                async with s.get(url + "/metrics") as r:
                    r.raise_for_status()
                    text = await r.text()
            except TimeoutError:
                raise CountersError(f"{url}/metrics: no answer within {timeout_s:g} s") from None
            except aiohttp.ClientError as exc:
                raise CountersError(f"{url}/metrics: {exc}") from exc
            for fam in text_string_to_metric_families(text):
                for sample in fam.samples:
                    if sample.name == "vllm:prefix_cache_queries_total":
                        queries += sample.value
                    elif sample.name == "vllm:prefix_cache_hits_total":
                        hits += sample.value
    return queries, hits
