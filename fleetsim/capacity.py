"""What `--load 1.0` means: the fleet's saturation throughput on the workload's own lengths.

Measured, not derived: one engine of the profile (`simulator.engine.Engine`, the same code the
fleet runs) is kept full in a closed loop with requests whose (prompt, output) lengths are drawn
at random, with replacement, from the workload (client errors left out), and its completions per
second are counted:

- the loop keeps `2 * max_num_seqs` requests in the engine (running or waiting), and submits a
  fresh draw whenever one finishes, so the scheduler always has work queued and the batch is as
  full as the step budget, `max_num_seqs` and the KV cache allow;
- the first `warmup` completions (one turnover of the running batch, at least 100) are skipped:
  a closed loop started empty first finishes its short requests;
- then it counts `measure` completions (at least 1,000, and 3 turnovers) and divides by the
  virtual time they took;
- fleet capacity = that rate × the replicas of the profile, summed over profiles.

No prefix hashes are replayed: drawing with replacement would repeat whole prompts and invent
cache hits, and the hits a fleet gets depend on routing. So load 1.0 is the rate one replica
per `1/replicas` of the traffic sustains *without* prefix-cache help; a cache-aware policy can
hold SLOs beyond it on prefix-heavy traces. It counts prefill/decode interference and KV limits
as the engine does, which the Little's-law formula of `tidegate.fleet.capacity` did not (that one
stays for `tidegate demo`, and for comparison in the results' `capacity_estimate`).

Figures are cached per (profile, workload lengths, seed) within a process.

`search_capacity` is the SLO-capacity search behind `tidegate simulate --find-capacity`: the
highest load at which the attainment still reaches the target, by bracketing and bisection.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tidegate.fleetsim.workload import SimRequest
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import Profile

MIN_WARMUP = 100
MIN_MEASURE = 1000
STEP_S = 0.05            # how often the loop refills the engine (virtual seconds)
MAX_VIRTUAL_S = 4 * 3600.0

_cache: dict[tuple, float] = {}


def fits(profile: Profile, prompt_tokens: int, output_tokens: int) -> bool:
    return prompt_tokens <= profile.kv_capacity_tokens and prompt_tokens + output_tokens <= profile.max_model_len


def saturation_rps(profile: Profile, lengths: Sequence[tuple[int, int]], seed: int = 0) -> float:
    """Completed requests per second of one engine kept full with draws from `lengths`."""
    pool = [(p, o) for p, o in lengths if fits(profile, p, o)]
    if not pool:
        raise ValueError(f"no request of the workload fits profile {profile.name!r}")
    key = (profile.name, len(pool), hash(tuple(pool)), seed)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    rng = random.Random(f"saturation/{seed}")
    eng = Engine(profile, random.Random(f"saturation-engine/{seed}"), keep_results=False)
    backlog = 2 * profile.max_num_seqs
    n = 0

    def submit(t: float) -> None:
        nonlocal n
        p, o = pool[rng.randrange(len(pool))]
        eng.add_request(f"s{n}", p, o, t)
        n += 1

    for _ in range(backlog):
        submit(0.0)
    done = 0
    peak_running = 0
    t = 0.0
    warm_at: float | None = None
    warm_done = 0
    warmup = MIN_WARMUP
    while t < MAX_VIRTUAL_S:
        t += STEP_S
        for ev in eng.advance(t):
            if ev.kind != "finished":
                continue
            done += 1
            submit(ev.t_s)
            if warm_at is None and done >= warmup:
                warm_at, warm_done = ev.t_s, done
            elif warm_at is not None and done - warm_done >= max(MIN_MEASURE, 3 * peak_running) \
                    and ev.t_s > warm_at:
                rate = (done - warm_done) / (ev.t_s - warm_at)
                _cache[key] = rate
                return rate
        running = eng.stats().running
        if running > peak_running:
            peak_running = running
            warmup = max(MIN_WARMUP, peak_running)
    raise ValueError(f"profile {profile.name!r}: the closed loop completed only {done} requests "
                     f"in {MAX_VIRTUAL_S:.0f} virtual seconds")


def fleet_saturation_rps(profiles: Sequence[Profile], reqs: Sequence[SimRequest], seed: int = 0) -> float:
    """Sum over the replicas of each one's closed-loop saturation rate on `reqs`' lengths."""
    if not reqs:
        raise ValueError("empty workload")
    lengths = [(r.prompt_tokens, r.output_tokens) for r in reqs]
    return sum(saturation_rps(p, lengths, seed) * k for p, k in profile_groups(profiles))


def profile_groups(profiles: Sequence[Profile]) -> list[tuple[Profile, int]]:
    """(profile, replicas) per distinct profile, in first-seen order."""
    groups: dict[str, tuple[Profile, int]] = {}
    for p in profiles:
        groups[p.name] = (p, groups.get(p.name, (p, 0))[1] + 1)
    return list(groups.values())


# ---------------------------------------------------------------------------- SLO capacity search


@dataclass(frozen=True)
class Capacity:
    load: float                 # highest load found with attainment >= target (0: none down to lo_limit)
    attainment: float           # measured at `load` (at lo_limit when load is 0)
    probes: tuple[tuple[float, float], ...]   # (load, attainment) in the order measured
    capped: bool = False        # still >= target at hi_limit: the capacity is at least `load`


SEARCH_LO_LIMIT = 0.05
SEARCH_HI_LIMIT = 8.0


def search_capacity(measure: Callable[[float], float], target: float, *, start: float = 1.0, tol: float = 0.02,
                    grow: float = 1.3, lo_limit: float = SEARCH_LO_LIMIT, hi_limit: float = SEARCH_HI_LIMIT
                    ) -> Capacity:
    """The highest load x with measure(x) >= target, to within `tol` of x (hi - lo <= tol * lo).

    Brackets from `start` by factors of `grow` (up while it passes, down while it fails), then
    bisects in log space. Assumes attainment falls with load; each load is measured once."""
    if not (0 < target <= 1 and tol > 0 and grow > 1 and 0 < lo_limit <= start <= hi_limit):
        raise ValueError("need 0 < target <= 1, tol > 0, grow > 1 and 0 < lo_limit <= start <= hi_limit")
    seen: dict[float, float] = {}
    probes: list[tuple[float, float]] = []

    def m(x: float) -> float:
        if x not in seen:
            seen[x] = measure(x)
            probes.append((x, seen[x]))
        return seen[x]

    x = start
    lo: float | None
    hi: float | None
    if m(x) >= target:
        lo, hi = x, None
        while hi is None:
            if lo >= hi_limit:
                return Capacity(lo, seen[lo], tuple(probes), capped=True)
            x = min(hi_limit, lo * grow)
            if m(x) >= target:
                lo = x
            else:
                hi = x
    else:
        lo, hi = None, x
        while lo is None:
            if hi <= lo_limit:
                return Capacity(0.0, seen[hi], tuple(probes))
            x = max(lo_limit, hi / grow)
            if m(x) >= target:
                lo = x
            else:
                hi = x
    assert lo is not None and hi is not None  # the loops above end only with both bracketed
    while hi - lo > tol * lo:
        x = math.sqrt(lo * hi)
        if m(x) >= target:
            lo = x
        else:
            hi = x
    return Capacity(lo, seen[lo], tuple(probes))
