"""Predicted TTFT and TPOT of one request on one replica, from load counted in tokens.

Pure: numbers in, numbers out; no clock, no I/O. The `tidegate` pick (slo_pick.py) feeds it the
load it sees per replica and decides; this module only predicts, so the simulator can report
how good the predictions were (see README.md for the formulas and why).

Engine model (vLLM-style continuous batching with chunked prefill, FCFS admission):

- one step runs every decoding sequence (one token each) plus up to `CHUNK_TOKENS` prefill tokens;
  its time is ``step_s(batch) + prefill_tokens / prefill_tps``;
- prefill is served in arrival order, so a new request's first token comes after every prefill
  token queued ahead of it plus its own uncached prompt;
- requests behind it do not delay its first token, but their prefill chunks share the steps of
  every sequence that is decoding meanwhile.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# Prefill tokens one engine step carries (vLLM's max_num_batched_tokens for chunked prefill on
# large GPUs). Only the count of steps a prefill spans depends on it.
CHUNK_TOKENS = 8192


@dataclass(frozen=True, slots=True)
class Rates:
    """How fast a replica computes: the figures the control plane fits from engine telemetry."""

    prefill_tps: float      # prefill tokens per second (compute-bound, marginal)
    step_base_s: float      # one decode step with an empty batch (weights read, launch overhead)
    step_per_seq_s: float   # added per sequence in the decode batch (its KV read, sampling)
    seats: float = 0.0      # the engine's max_num_seqs (RouteEntry.max_num_seqs); 0 = unknown

    def step_s(self, batch: float) -> float:
        return self.step_base_s + self.step_per_seq_s * max(0.0, batch)


# Used for a figure no replica of the pool reports (0 = not fitted yet). Deliberately slower than
# an 8B model on one H100 (~45k prefill tokens/s, ~8 ms + ~0.15 ms/seq steps): predicting too
# much latency makes the pick balance harder and trade less for cache affinity, the safe side.
DEFAULT_RATES = Rates(prefill_tps=25_000.0, step_base_s=0.010, step_per_seq_s=0.0003)


# A replica's own fitted figure replaces the pool's median only when it differs from it by more
# than this factor: a different GPU or parallelism (H100 vs A100 prefill: ~3x; H200 vs H100
# decode step: ~1.35x... ~1.5x with TP). Closer than that, per-replica fits of identical replicas
# differ by fitting noise (measured in the simulator: prefill 43k-50k tokens/s, per-sequence step
# 0.0001-0.7 ms across 4 identical replicas), and the median of the pool is the better estimate.
HETEROGENEOUS = 1.5


# Differences smaller than these are noise, not another kind of GPU: engines' inter-token latency
# histograms (what the base step is fitted from) start their buckets at 10 ms, so a fit cannot tell
# 0.05 ms from 1.4 ms; and a replica given its own tiny-but-larger figure would never be picked
# again on an idle fleet, so its fit could never be corrected (seen after an uncordon).
RESOLUTION = (1000.0, 1.0)   # prefill tokens/s, base step ms


def pool_rates(entries: Iterable) -> dict[str, Rates]:
    """Rates per replica id: the pool's median of each fitted figure (replicas of one pool serve
    one model, usually on one kind of hardware), or, for a replica whose prefill rate or base
    step differs from the median by more than HETEROGENEOUS and RESOLUTION (another kind of GPU), its own
    figures. The per-sequence step is the noisiest fit and never decides alone. DEFAULT_RATES's
    figure where no replica of the pool has one (<= 0 or non-finite = not fitted). Seats are each
    replica's own (an engine's setting, not a fit): none where unknown."""
    entries = list(entries)

    def known(v: float) -> bool:
        return math.isfinite(v) and v > 0

    names = ("prefill_tokens_per_s", "decode_step_base_ms", "decode_step_per_seq_ms")
    defaults = (DEFAULT_RATES.prefill_tps, DEFAULT_RATES.step_base_s * 1000.0, DEFAULT_RATES.step_per_seq_s * 1000.0)
    medians = []
    for name, default in zip(names, defaults, strict=True):
        vals = [v for v in (getattr(e, name, 0.0) for e in entries) if known(v)]
        medians.append(statistics.median(vals) if vals else default)
    out = {}
    for e in entries:
        own = [getattr(e, n, 0.0) for n in names]
        other_kind = any(known(v) and not (1 / HETEROGENEOUS <= v / m <= HETEROGENEOUS) and abs(v - m) > floor
                         for v, m, floor in zip(own[:2], medians[:2], RESOLUTION, strict=True))
        p, b, s = (v if other_kind and known(v) else m for v, m in zip(own, medians, strict=True))
        seats = getattr(e, "max_num_seqs", 0)
        out[e.replica_id] = Rates(p, b / 1000.0, s / 1000.0, float(seats) if seats > 0 else 0.0)
    return out


def unbacked_prefill(figures: Mapping[str, float], rel_se: Callable[[str], float],
                     settled: Callable[[str], bool] = lambda rid: False) -> dict[str, float]:
    """The replicas of one pool whose first fitted prefill rate claims a faster kind of GPU
    (`pool_rates`: over the pool's median by more than HETEROGENEOUS and RESOLUTION) without the
    evidence to back it, each with the pool's median to publish instead; `figures` are the pool's
    published rates (<= 0: none), `rel_se(id)` the fit's relative standard error
    (rates.RateEstimator.prefill_rel_se), `settled(id)` whether the replica's own figure has stood
    once already (the caller keeps that: FleetState), after which its fit is published as it moves.

    Backed: the median lies more than two standard errors below the figure (ln(figure / median) >
    2 x rel_se, the relative error being the log's to first order). A figure past the median by
    HETEROGENEOUS is what makes the router trust it over the median, and the budget adds it as it
    is; from a few windows it can be noise: a replica of 16 identical ones on a held-out RAG
    workload published 317,500 tokens/s (true ~47k) from its first windows, standard error 357 %,
    and took the prefill of seven (docs/BENCHMARKS.md, "Unbacked prefill rates"). Until backed, the
    median stands in for it, as it does for every replica that does not differ. Only the faster
    claim waits: overrated, a replica is flooded and its requests miss their SLOs; underrated, it
    gets less traffic until its fit settles. And only a first one: a new replica is far likelier
    to be of its pool's kind than its first windows are to be right, while a settled replica
    whose fit moves has changed (a throttled GPU: while its fit crosses over, its figures
    together are what steers traffic away; tests/unit/test_fleetsim_sim.py, the slowed replica)."""
    known = {rid: v for rid, v in figures.items() if math.isfinite(v) and v > 0}
    if len(known) < 2:
        return {}
    m = statistics.median(known.values())
    out = {}
    for rid, v in known.items():
        if v > m * HETEROGENEOUS and v - m > RESOLUTION[0] and not settled(rid):
            off = math.log(v / m)
            se = rel_se(rid)
            if not (math.isfinite(se) and off > 2.0 * se):
                out[rid] = m
    return out


def held_kv(prompt_tokens: float, output_tokens: float) -> float:
    """KV tokens a request in flight holds, counted over its life: its prompt (resident from its
    prefill) and half its output. It holds `prompt + generated` at any instant, and the sequences
    in flight on a replica are spread over their lives, so half their outputs is what they hold
    together on average. Counting each one's whole output from its dispatch, as a reservation,
    made replicas of long answers look full at half their real use: reasoning-style answers
    (~1,500 tokens, prompts ~300) on 16 x llama3-8b-h100 predicted a KV wait of 5-8 s on every
    replica while the engines had 20-30 % free, so the pick had no fitting replica and no
    admission budget had room (docs/BENCHMARKS.md, "KV held over a request's life")."""
    return max(0.0, prompt_tokens) + max(0.0, output_tokens) / 2.0


def pushed_out(stall_keys: Sequence[float], stalled_s: float, stall_s: float) -> float:
    """How many sequences a stall of `stall_s` seconds pushes past their TPOT target.

    Each sequence on a replica can absorb `slack * (output - 1)` seconds of other requests'
    prefill in its steps before its TPOT exceeds the target (slack = target - its own step time).
    Its key is that budget plus the replica's stall counter (`stalled_s`: prefill seconds placed
    there so far) when it arrived, so one counter serves every sequence: the sequence has missed
    once the counter passes its key. Keys are sorted; the ones in (stalled, stalled + stall] are
    those this prefill pushes out (those at or below `stalled_s` were pushed out before)."""
    if not stall_keys or stall_s <= 0:
        return 0.0
    return float(bisect.bisect_right(stall_keys, stalled_s + stall_s) - bisect.bisect_right(stall_keys, stalled_s))


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What is on a replica when the request would join, counted in tokens."""

    queued_prefill: float   # prefill tokens ahead of the request (dispatched, no first token yet)
    decoding: float         # sequences in the decode batch
    kv_used: float          # KV tokens held
    kv_capacity: float      # KV tokens in all; 0 = unknown (no KV wait is predicted)
    # The sequences that will decode while this request's prefill runs (those decoding and those
    # queued ahead of it): their stall keys, sorted, and the replica's stall counter (pushed_out).
    stall_keys: Sequence[float] = ()
    stalled_s: float = 0.0
    # How many sequences there each key stands for (>= 1): with N routers, the others' too, as
    # close to their targets as this router's (its share of the pool's load is its share there).
    per_key: float = 1.0
    # Requests in flight there (without a first token yet, and decoding): past the engine's seats
    # (Rates.seats) the last of them wait for running ones to finish.
    sequences: float = 0.0


@dataclass(frozen=True, slots=True)
class Prediction:
    replica_id: str
    cached_tokens: int      # prompt tokens expected to hit the replica's prefix cache
    prefill_tokens: int     # prompt tokens it must compute (>= 1)
    ttft_s: float
    tpot_s: float
    kv_wait_s: float        # part of ttft_s spent waiting for KV room
    pushed_out: float       # sequences there whose TPOT its prefill would push past the target
    cost: float             # SLO budget the placement consumes (see predict)
    # Inputs of admission's TPOT protection (tidegate/policy/admission.py):
    queued_prefill: float = 0.0         # prefill tokens already outstanding there (ahead of it)
    prefill_budget: float = math.inf    # outstanding prefill tokens one step may carry within the TPOT target
    prefill_tps: float = 0.0            # the replica's prefill rate
    # Whether this router may send a prompt over the prefill budget here when nothing is
    # outstanding (it "goes alone"). With peers, only to the replicas it owns (slo_pick._scan).
    sole: bool = True


def prefill_budget(rates: Rates, decoding: float, tpot_slo_s: float) -> float:
    """Prefill tokens one step may carry and still last at most the TPOT target, with `decoding`
    sequences in its batch: (tpot - step_s(decoding)) x prefill_tps, >= 0.

    The engine puts everything outstanding (up to CHUNK_TOKENS) into its next step, so keeping a
    replica's outstanding prefill within this bound keeps every step, hence every decoder's TPOT,
    within the target."""
    return max(0.0, (tpot_slo_s - rates.step_s(max(0.0, decoding))) * rates.prefill_tps)


def predict(replica_id: str, load: ReplicaLoad, rates: Rates, prompt_tokens: int, cached_tokens: int,
            output_tokens: float, remaining_output: float, ttft_slo_s: float, tpot_slo_s: float,
            left_output: float | None = None) -> Prediction:
    """TTFT and TPOT of a request of `prompt_tokens` (of which `cached_tokens` hit the cache) that
    will generate about `output_tokens`, joining `load`. `remaining_output` is the typical number
    of tokens a sequence decoding there still has to produce (over which prefill stretches it: a
    request's share, half the mean answer). `left_output` (None: `remaining_output`) is half the
    mean answer of the requests being sent, over which the running sequences free their seats and
    their KV (README.md §3: in a burst the answers that finish are the short ones, so a mean learned
    from them is short just when the seats are held longest).

        work    = queued_prefill + (prompt - cached)
        ttft    = work / prefill_tps + ceil(work / CHUNK_TOKENS) * step_s(decoding) + kv_wait + seat_wait
        kv_wait = shortfall / (kv_used / (left_output * step_s(decoding)))   when the KV
                  cannot hold work + output: decoders free their KV over their remaining steps
        seat_wait = (sequences + 1 - seats) * 2 * left_output * step_s(decoding) / min(decoding, seats)
                  when the request finds the engine's seats taken: it waits for that many of the
                  running sequences to finish, and they finish at min(decoding, seats) /
                  (mean answer x step) per second (Little's law; 2 * left_output is the mean
                  answer). The prefill of those admitted ahead of it is already in `work`.
        tpot    = step_s(decoding + 1) + (work / prefill_tps) / remaining_output
        stall   = (prompt - cached) / prefill_tps
        pushed  = sequences there whose remaining stall budget is within `stall` (pushed_out)
        cost    = ttft / ttft_slo + tpot / tpot_slo + pushed

    A sequence's TPOT is its decode time over its output tokens - 1, so a prefill of `stall`
    seconds that shares its steps adds stall / (output - 1) to it, and it misses its target once
    the prefill it has lived through exceeds slack * (output - 1). `cost` is the SLO budget the placement uses up: its
    own TTFT and TPOT as shares of their targets, plus one whole budget per request it pushes
    out of its TPOT target (a miss is a miss, however small the increment that caused it, and
    increments that leave everyone within the target cost nothing). The pick minimises it.
    """
    row = (replica_id, load.queued_prefill, load.decoding, load.kv_used, load.kv_capacity, load.stall_keys,
           load.stalled_s, load.per_key, rates, cached_tokens, load.sequences)
    return Prediction(*predict_rows((row,), prompt_tokens, output_tokens, remaining_output, ttft_slo_s, tpot_slo_s,
                                    left_output)[0])


def predict_rows(loads: Iterable[tuple], prompt_tokens: int, output_tokens: float, remaining_output: float,
                 ttft_slo_s: float, tpot_slo_s: float, left_output: float | None = None) -> list[tuple]:
    """`predict` for one request on many replicas, as plain tuples in Prediction's field order.

    Each load is (replica_id, queued_prefill, decoding, kv_used, kv_capacity, stall_keys, stalled_s,
    per_key, rates, cached_tokens, sequences): ReplicaLoad's fields in its order, the rates and the
    cached tokens before its last. What does not depend on the
    replica is computed once, step_s, prefill_budget and pushed_out are written out, and no object
    is built per candidate. `max(0.0, x)` is written `x if x > 0.0 else 0.0`, which returns the same
    value in every case (NaN and -0.0 included: both give 0.0), so the figures are bit-for-bit
    predict's as README.md states them (tests/unit/test_pick_equivalence.py keeps that version).
    The pick (slo_pick.TidegatePolicy._scan) writes these same formulas out once more inside its
    loop over the candidates, reading its own load state directly, so that it builds no load
    tuple per candidate (the router's per-request cost: docs/BENCHMARKS.md)."""
    prompt = int(prompt_tokens)
    output = output_tokens if output_tokens > 0.0 else 0.0
    remaining = remaining_output if remaining_output > 1.0 else 1.0
    left = remaining if left_output is None else (left_output if left_output > 1.0 else 1.0)
    ceil, bisect_right = math.ceil, bisect.bisect_right
    rows = []
    for (replica_id, queued, decoding, kv_used, kv_capacity, stall_keys, stalled_s, per_key, rates, cached,
         seqs) in loads:
        cached = int(cached)
        if cached > prompt - 1:
            cached = prompt - 1
        if cached < 0:
            cached = 0
        own = prompt - cached
        if own < 1:
            own = 1
        if not queued > 0.0:
            queued = 0.0
        work = queued + own
        batch = decoding if decoding > 0.0 else 0.0
        tps, base, per_seq = rates.prefill_tps, rates.step_base_s, rates.step_per_seq_s
        step = base + per_seq * batch
        prefill_s = work / tps
        ttft = prefill_s + ceil(work / CHUNK_TOKENS) * step
        kv_wait = 0.0
        if kv_capacity > 0:
            shortfall = work + output - (kv_capacity - (kv_used if kv_used > 0.0 else 0.0))
            if shortfall > 0:
                # The KV in use drains as its sequences finish, over about `left` steps each.
                drain_tps = (1.0 if 1.0 > kv_used else kv_used) / (left * step)
                kv_wait = shortfall / drain_tps
        ttft += kv_wait
        seats = rates.seats
        if seats > 0.0 and batch > 0.0:
            excess = seqs + 1.0 - seats
            if excess > 0.0:
                ttft += excess * 2.0 * left * step / (batch if batch < seats else seats)
        step_joined = base + per_seq * (batch + 1)     # step_s(batch + 1): the batch it joins
        tpot = step_joined + prefill_s / remaining
        stall = own / tps
        pushed = 0.0
        if stall_keys and not stall <= 0:   # pushed_out's test, NaN included
            pushed = float(bisect_right(stall_keys, stalled_s + stall) - bisect_right(stall_keys, stalled_s))
        pushed *= per_key if per_key > 1.0 else 1.0
        cost = ttft / ttft_slo_s + tpot / tpot_slo_s + pushed
        budget = (tpot_slo_s - step_joined) * tps       # prefill_budget(rates, batch + 1, tpot_slo_s)
        if not budget > 0.0:
            budget = 0.0
        rows.append((replica_id, cached, own, ttft, tpot, kv_wait, pushed, cost, queued, budget, tps))
    return rows
