#!/usr/bin/env python3
"""Write held-out workloads for `tidegate simulate --trace` (generic JSONL, one request a line:
arrival_s, prompt_tokens, output_tokens[, prefix_hashes]; one prefix hash per 64 prompt tokens,
tidegate.tokens.PREFIX_BLOCK_TOKENS, as `tidegate simulate` reads generic traces).

    scripts/make_workloads.py longshort OUT.jsonl [--requests N] [--seed S]
    scripts/make_workloads.py multiturn OUT.jsonl [--requests N] [--seed S]
    scripts/make_workloads.py rag OUT.jsonl [--requests N] [--seed S]
    scripts/make_workloads.py {shortchat,reasoning} OUT.jsonl [--requests N] [--seed S]

- longshort: 90% chat (prompt lognormal, mean ~700 tokens; output lognormal, mean ~250) and 10%
  documents (prompt uniform 16k-60k tokens, output lognormal mean ~300), Poisson arrivals at
  10 req/s (`--load` rescales). Unique prompts: no prefix hashes.
- shortchat: short chat turns (prompt lognormal, mean ~150 tokens; output lognormal, mean ~120),
  Poisson arrivals at 10 req/s, unique prompts: at its SLO capacity on 16 x llama3-8b-h100 the KV
  stays under 20 %; the engines' batch limit (`max_num_seqs`) binds, not their KV.
- reasoning: short prompts (mean ~300 tokens) and long answers (mean ~1,500, up to 8,000), Poisson
  at 10 req/s, unique prompts: decode-bound, the KV filling with outputs.
- multiturn: conversations of 2-12 turns on 8 applications, each with its own system prompt
  (300-3000 tokens); turn k's prompt is the previous turn's prompt + its answer + a new user
  message, so every turn extends the last one's prefix. Conversations start as a Poisson process
  at 1/s; a user thinks 5-60 s between turns (the arrival process is rescaled by `--load`).
- rag: retrieval-augmented questions over 2,000 documents (1k-12k tokens, lognormal, mean ~3,000)
  whose popularity is Zipf (s = 1.1: the hottest document is in ~1 request of 6); each prompt is
  a 256-token system prompt shared by all, one document, and a unique question (mean ~80 tokens);
  answers lognormal, mean ~200. Poisson arrivals at 10 req/s. Skewed, heavy prefixes: a policy
  that follows the cache without bounds melts the replicas of the hottest documents.

Seeded: the same arguments write the same file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from pathlib import Path

from tidegate.tokens import PREFIX_BLOCK_TOKENS as BLOCK


def _lognormal(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    mu = math.log(mean) - sigma ** 2 / 2
    return max(lo, min(hi, int(round(rng.lognormvariate(mu, sigma)))))


def longshort(n: int, seed: int) -> list[dict]:
    rng = random.Random(f"longshort/{seed}")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(10.0)
        if rng.random() < 0.1:
            p, o = rng.randint(16_000, 60_000), _lognormal(rng, 300, 0.8, 16, 2000)
        else:
            p, o = _lognormal(rng, 700, 1.0, 16, 8000), _lognormal(rng, 250, 1.0, 4, 2000)
        out.append({"arrival_s": round(t, 6), "prompt_tokens": p, "output_tokens": o})
    return out


def _poisson_chat(kind: str, n: int, seed: int, prompt: tuple[float, float, int, int],
                  output: tuple[float, float, int, int]) -> list[dict]:
    """Poisson arrivals at 10 req/s, unique prompts; lengths lognormal (mean, sigma, lo, hi)."""
    rng = random.Random(f"{kind}/{seed}")
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(10.0)
        out.append({"arrival_s": round(t, 6), "prompt_tokens": _lognormal(rng, *prompt),
                    "output_tokens": _lognormal(rng, *output)})
    return out


def shortchat(n: int, seed: int) -> list[dict]:
    return _poisson_chat("shortchat", n, seed, (150, 0.7, 8, 2000), (120, 0.8, 4, 1000))


def reasoning(n: int, seed: int) -> list[dict]:
    return _poisson_chat("reasoning", n, seed, (300, 0.8, 16, 4000), (1500, 0.9, 16, 8000))


def rag(n: int, seed: int) -> list[dict]:
    rng = random.Random(f"rag/{seed}")
    system = list(range(256 // BLOCK))                                # shared by every request
    docs = [_lognormal(rng, 3000, 0.7, 1000, 12_000) for _ in range(2000)]
    # cumulative once, not per draw (random.choices would accumulate 2,000 weights each call)
    cum = list(itertools.accumulate(1.0 / (k + 1) ** 1.1 for k in range(len(docs))))
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(10.0)
        d = rng.choices(range(len(docs)), cum_weights=cum)[0]
        question = _lognormal(rng, 80, 0.6, 8, 1000)
        tokens = 256 + docs[d] + question
        hashes = system + [(d + 1) * 10**6 + j for j in range(docs[d] // BLOCK)]
        fresh = (i + 1) * 10**12                                      # the question's own blocks
        while len(hashes) < tokens // BLOCK:
            fresh += 1
            hashes.append(fresh)
        out.append({"arrival_s": round(t, 6), "prompt_tokens": tokens,
                    "output_tokens": _lognormal(rng, 200, 0.8, 4, 2000), "prefix_hashes": hashes})
    return out


KINDS = {"longshort": longshort, "shortchat": shortchat, "reasoning": reasoning, "rag": rag}


def multiturn(n: int, seed: int) -> list[dict]:
    rng = random.Random(f"multiturn/{seed}")
    apps = [(i * 10**9, rng.randint(300, 3000)) for i in range(8)]     # (hash namespace, system tokens)
    rows: list[dict] = []
    conv = 0
    start = 0.0
    while len(rows) < n:
        start += rng.expovariate(1.0)
        conv += 1
        base, system = apps[rng.randrange(len(apps))]
        hashes = [base + i for i in range(system // BLOCK)]          # the app's shared system prompt
        tokens = system
        fresh = (conv << 20)                                          # ids private to this conversation
        t = start
        for _turn in range(rng.randint(2, 12)):
            user = _lognormal(rng, 200, 0.8, 8, 4000)
            tokens += user
            while len(hashes) < tokens // BLOCK:
                fresh += 1
                hashes.append(fresh)
            answer = _lognormal(rng, 250, 0.9, 4, 2000)
            rows.append({"arrival_s": round(t, 6), "prompt_tokens": tokens, "output_tokens": answer,
                         "prefix_hashes": list(hashes)})
            tokens += answer                                          # the answer joins the context
            t += rng.uniform(5.0, 60.0)
            if tokens > 100_000:
                break
    rows.sort(key=lambda r: r["arrival_s"])
    return rows[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=[*KINDS, "multiturn"], help="Which workload to write.")
    ap.add_argument("out", type=Path, help="Output JSONL file.")
    ap.add_argument("--requests", type=int, default=4000, help="Number of requests (default 4000).")
    ap.add_argument("--seed", type=int, default=0, help="Seed of every random choice (default 0).")
    args = ap.parse_args()
    rows = KINDS.get(args.kind, multiturn)(args.requests, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    print(f"wrote {len(rows)} requests to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
