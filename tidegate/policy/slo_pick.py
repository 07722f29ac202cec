"""`tidegate`: the router's pick by predicted SLO fit, with load counted in tokens and prefix
affinity that pays only while it helps. Formulas and reasons: README.md.

Pipeline per request (pure: snapshot + request + rng in, pick out):

1. candidates  routable (weight > 0) and not excluded (registry.PoolSnapshot.candidates);
2. load        per replica, in tokens: this router's own in-flight work (fed by its hooks)
               plus what its peer routers last reported there (`on_peer_load`); before any
               peer reports, its own scaled to the pool's by its share of the table's in-flight;
3. predict     TTFT, TPOT and the SLO budget the placement uses up (predict.py) on each
               candidate, with the prompt tokens expected to hit that replica's prefix cache
               (affinity.PrefixIndex) taken off its prefill;
4. fit         keep the candidates predicted to meet both targets with KV room to spare, or
               holding part of the prompt (else relax: KV room, then TPOT, then TTFT; README.md);
5. band        keep those whose cost is within BAND_C of the cheapest (bounded load);
6. choose      prompts with prefix blocks: in the band, the replica with the most cached tokens;
               among those, when the prefix is cached somewhere, the lowest cost (within
               COST_RESOLUTION); then the prefix's home (rendezvous order over its first blocks,
               the same on every router), then the lowest cost; prompts without blocks: the
               lowest cost, ties at random.

Router-local state (one instance per router and pool) is fed by the hooks: `on_dispatch` counts
the request's predicted prefill as queued on its replica and teaches the prefix index,
`on_first_token` moves it from the prefill queue to the decode batch, `on_complete` forgets it.
A router that never calls `on_first_token` keeps counting a request's prefill as queued until it
completes: predictions are then pessimistic for that replica, never optimistic.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter

from tidegate.policy.affinity import PrefixBlocks, PrefixIndex
from tidegate.policy.peer_load import (
    NO_PEER_LOAD,
    LearnedBlocks,
    PeerPins,
    PeerReport,
    PeerSum,
    ReleasedBlocks,
    ReplicaLoadReport,
    owned_replicas,
    placed_since,
    sum_peers,
)
from tidegate.policy.pick import Pick
from tidegate.policy.predict import (
    CHUNK_TOKENS,
    DEFAULT_RATES,
    Prediction,
    Rates,
    held_kv,
    pool_rates,
    pushed_out,
)
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo, SloTargets, make_pick
from tidegate.policy.tpot_plan import TpotPlan, TpotPlanConfig

# Bounded load: affinity (cache reuse, the prefix's home) may cost at most this factor of the
# cheapest placement, as consistent hashing with bounded loads caps a bin at c = 1.25 x average.
BAND_C = 1.25
# Costs closer than this (1 % of an SLO budget: 20 ms of a 2 s TTFT target) are ties, chosen at
# random. The predictions are not finer than that (fitted rates are off by a few percent), and
# picking the strictly cheapest of equals would starve a replica whose fit is stale or noisy: it
# would never get the traffic that corrects its fit (seen after an uncordon on an idle fleet).
COST_RESOLUTION = 0.01
# Output length assumed when the request does not say (max_tokens) and nothing was seen yet.
DEFAULT_OUTPUT_TOKENS = 256
# Weight of the newest sample in the running means (prefill per request, output).
EWMA_ALPHA = 1.0 / 64
# Smallest share of the pool's requests a router assumes it carries (at most 64 routers' worth).
MIN_SHARE = 1.0 / 64
# Prefix blocks one report carries per replica at most (a report every 100 ms of a
# router placing 60k-token prompts at 50/s is ~47k blocks of 64 tokens; past this, peers miss some
# and their affinity is a little weaker, never wrong).
MAX_LEARNED_KEYS = 65_536
# Stall budgets a report carries per replica at most: the smallest, those a placement can push out.
MAX_REPORTED_BUDGETS = 256


@dataclass(slots=True)
class _Flight:
    replica_id: str
    prefill: float      # predicted uncached prompt tokens, counted as queued until the first token
    kv: float           # KV tokens it holds over its life (predict.held_kv)
    stall_key: float    # its key among the replica's stall keys (predict.pushed_out)
    blocks: PrefixBlocks | None = None   # its prefix blocks, pinned in the index until it completes
    guessed: bool = False   # its key is among the guessed ones (no max_tokens: see on_dispatch)
    started: bool = False
    plan_tpot_s: float = 0.0   # the TPOT its stall budget was planned to (on_tpot compares)


@dataclass(slots=True)
class _Own:
    """This router's requests on one replica."""

    queued: float = 0.0     # prefill tokens of those without a first token
    waiting: int = 0
    decoding: int = 0
    kv: float = 0.0
    # Prefill seconds placed there while these requests were in flight (scaled to the pool's),
    # and each request's stall key, sorted (predict.pushed_out).
    stalled_s: float = 0.0
    stall_keys: list[float] = field(default_factory=list)
    # The keys of requests without max_tokens, from the mean output (on_dispatch): admission's
    # open rule counts them, the pick's cost and the peers' reports do not.
    guess_keys: list[float] = field(default_factory=list)
    # Peers' sequences there: their stall budgets as keys on our counter (on_peer_load), per peer,
    # and every key there sorted (ours and theirs; None = to rebuild).
    peer_keys: dict[str, list[float]] = field(default_factory=dict)
    merged: list[float] | None = None

    def all_keys(self) -> list[float]:
        if not self.peer_keys:
            return self.stall_keys
        if self.merged is None:
            self.merged = sorted(chain(self.stall_keys, *self.peer_keys.values()))
        return self.merged


# A replica with none of this router's requests on it (read only).
_IDLE = _Own()
# The pick's rows are (cost, cached, replica id, ttft, tpot, kv_wait) (TidegatePolicy._scan).
_COST, _CACHED = itemgetter(0), itemgetter(1)


@dataclass(frozen=True, slots=True)
class _Candidates:
    """The candidates of one table and exclusion set, with what the pick reads of each."""

    entries: tuple[RouteInfo, ...]
    exclude: frozenset[str]
    # id, prefill tokens/s, base step s, per-sequence step s, KV capacity, KV used by the table
    # (read only where the capacity is known, > 0), seats (0 = unknown): the rates' figures
    # unpacked once per table, not per pick.
    rows: list[tuple[str, float, float, float, float, float, float]]
    table: int                                           # running + waiting over the candidates
    by_id: dict[str, RouteInfo]                          # every entry of the table


class TidegatePolicy:
    name = "tidegate"
    uses_prefix_hashes = True  # the router computes RequestFeatures.prefix_hashes only for such policies

    def __init__(self, slo: SloTargets | None = None, band_c: float = BAND_C,
                 tpot_plan: TpotPlanConfig | None = None) -> None:
        if not band_c >= 1.0:
            raise ValueError("band_c must be >= 1")
        self.slo = slo or SloTargets()
        self.band_c = band_c
        # Realized TPOT over the TPOT planned at dispatch, of requests whose router enforces the
        # plan (on_tpot: admission), and the margin their quantile sets (tpot_plan.py).
        self._tpot_plan = TpotPlan(tpot_plan or TpotPlanConfig())
        self._index = PrefixIndex()
        self._own: dict[str, _Own] = {}
        # waiting + decoding summed over self._own, kept by the hooks (_own_share reads it per pick).
        self._inflight = 0
        self._flights: dict[tuple[object, str], _Flight] = {}
        self._seen = 0
        self._mean_prefill = 0.0
        # Mean output length, learned from finished requests only (on_output): what a request
        # expects (its max_tokens) is not what it writes.
        self._mean_output = float(DEFAULT_OUTPUT_TOKENS)
        # Observed output / max_tokens: clients set max_tokens as a cap, often far above the answer.
        self._cap_use = 1.0
        # Mean expected output of the requests this router dispatched (None: none yet): _left.
        self._sent_output: float | None = None
        self._share = 1.0   # this router's share of the pool's in-flight, at the last pick
        self._tpot_slo_s = self.slo.tpot_s
        self._capacity: dict[str, float] = {}   # KV tokens per replica, from the last table seen
        self._last: tuple[RequestFeatures, PrefixBlocks] | None = None
        self._table: tuple[tuple[RouteInfo, ...], dict[str, Rates]] | None = None
        self._cands: _Candidates | None = None
        # Prefill seconds this router has placed per replica (monotonic; its load report carries
        # it), and its peers' last reports with their sum per replica (peer_load.py).
        self._placed: dict[str, float] = {}
        self._peers: dict[str, Mapping[str, ReplicaLoadReport]] = {}
        self._peer_sum: dict[str, PeerSum] = {}
        # Blocks this router's requests used since its last report, per replica, and those of its
        # requests that finished since (for peers, who pin the first until the second), and the
        # peers' blocks pinned here for their running requests.
        self._learned: dict[str, tuple[list[int], float]] = {}
        self._released: dict[str, list[int]] = {}
        self._peer_pins = PeerPins()
        # This router's id as its peers' reports name it (bind_router), and the replicas it owns
        # among them (peer_load.owned_replicas) for the peers and the table they were computed for.
        self._router_id: str | None = None
        # (None when the peer set changed since: on_peer_load, forget_peer).
        self._owned: tuple[tuple[RouteInfo, ...], frozenset[str]] | None = None

    # ------------------------------------------------------------------ prediction

    def _blocks(self, request: RequestFeatures) -> PrefixBlocks:
        last = self._last
        if last is not None and last[0] is request:
            return last[1]
        blocks = PrefixBlocks(request.prefix_hashes, request.prompt_tokens, request.prefix_block_tokens)
        self._last = (request, blocks)
        return blocks

    def _output(self, request: RequestFeatures) -> float:
        """Expected output tokens. Clients set max_tokens as a cap, often far above what the model
        writes, so it is scaled by the share of the cap finished requests actually used."""
        if request.max_tokens:
            return max(1.0, float(request.max_tokens) * self._cap_use)
        return self._mean_output

    def _left(self) -> float:
        """Half the mean answer of the requests this router sends (their expected outputs, an EWMA
        over dispatches; the learned mean before any): the seats and the KV free at
        running / (2 * left * step) per second (Little's law). Not `_mean_output`, learned from the
        answers that finished: while a burst fills the replicas the short answers finish first,
        which pulls that mean down just when the running sequences hold the seats and the KV
        longest (48 x H100, Azure conversation at load 1.482, its last seconds: a learned mean of
        70-79 tokens against the trace's 211, while the engines' running sequences had 165-174
        left; README.md §3)."""
        sent = self._sent_output
        return (self._mean_output if sent is None else sent) / 2

    def expected_output(self, request: RequestFeatures) -> float:
        """Output tokens the request is expected to write (registry.expected_output: the admission
        budget counts requests with it)."""
        return self._output(request)

    def _own_share(self, table: int) -> float:
        """This router's share of the pool's in-flight requests: its own in-flight count over the
        table's running + waiting (`table`), both summed over the pool (one replica's noise does
        not decide), clamped to [MIN_SHARE, 1]. About 1 with one router, about 1/N with N alike."""
        own = self._inflight
        if table <= 0 or own <= 0:
            return 1.0
        return min(1.0, max(MIN_SHARE, own / table))

    def _rates(self, snapshot: PoolSnapshot) -> dict[str, Rates]:
        """Rates and KV capacities change only with the table: computed once per table object."""
        cached = self._table
        if cached is not None and cached[0] is snapshot.entries:
            return cached[1]
        rates = pool_rates(snapshot.entries)
        for e in snapshot.entries:
            self._capacity[e.replica_id] = float(e.kv_capacity_tokens)
        self._table = (snapshot.entries, rates)
        return rates

    def _candidates(self, snapshot: PoolSnapshot) -> _Candidates:
        """What the pick reads of the table, computed once per table object and exclusion set
        (the table is immutable; a router reuses it until the next publish). As before this
        cache, a table without candidates does not replace the rates and capacities that
        on_dispatch reads (self._table), and a cached table with candidates is that table."""
        cached = self._cands
        if cached is not None and cached.entries is snapshot.entries and cached.exclude == snapshot.exclude:
            return cached
        cands = snapshot.candidates()
        rates = self._rates(snapshot) if cands else {}
        rows = []
        table = 0
        for e in cands:
            cap = float(max(0, e.kv_capacity_tokens))
            # _load's KV: the table's figure takes part only when the capacity is known.
            reported = cap - max(0, e.kv_free_tokens) if cap > 0 else 0.0
            r = rates[e.replica_id]
            rows.append((e.replica_id, r.prefill_tps, r.step_base_s, r.step_per_seq_s, cap, reported, r.seats))
            table += max(0, e.running) + max(0, e.waiting)
        self._cands = _Candidates(snapshot.entries, snapshot.exclude, rows, table,
                                  {e.replica_id: e for e in snapshot.entries})
        return self._cands

    def _scan(self, snapshot: PoolSnapshot, request: RequestFeatures,
              full: bool) -> tuple[list[tuple], list[tuple], float]:
        """Every candidate's prediction, in replica-id order; those predicted to meet both targets
        with KV room to spare, and their least cost (inf: none). `full`: rows in Prediction's field
        order (`predictions`; no fitting ones); else only what the pick decides on, (cost, cached,
        replica id, ttft, tpot, kv_wait). Sets what on_dispatch reads of the last pick.

        A replica's load is this router's own in-flight work there, scaled up to the whole
        pool's: own / share. Own counts are exact and fresh but only this router's part; the
        table counts everyone's but is a report (1 s) plus a publish old, older than a queue of
        prefills takes to move. With the requests spread evenly over N routers that run this same
        pick, every router sees the same mix and makes the same kind of choices (the same prefix
        homes above all), so the pool's load on a replica is about N times this router's. KV,
        which moves slowly, takes the larger of that and the table's figure. Others' sequences
        there count as ours times (scale - 1), as close to their targets (per_key = scale).
        With peers' reports, their load is added to ours instead (ours exact and fresh, theirs a
        report old), and our stall keys include theirs (per_key = 1).

        The prediction is predict.predict's (README.md), written out here once per candidate:
        this loop is most of the router's per-request cost, so what does not depend on the
        replica is computed once per request (or per table: `_candidates`), no object or load
        tuple is built per candidate, `max(0.0, x)` is written `x if x > 0.0 else 0.0` (the same
        value in every case, NaN and -0.0 included), and a term that is 0.0 whenever it is
        skipped is not added (the sums it would enter are > 0 or NaN, so adding 0.0 changes
        nothing). The figures are predict's bit for bit: tests/unit/test_pick_equivalence.py
        checks every field against the plain formulation."""
        cands = self._candidates(snapshot)
        if not cands.rows:
            return [], [], math.inf
        slo = snapshot.slo or self.slo
        # The TPOT the pick plans to: the target over the margin past plans needed (1 without
        # admission, whose router never reports realized TPOTs: on_tpot).
        ttft_slo, tpot_slo = slo.ttft_s, slo.tpot_s / self._tpot_plan.margin_for(request.priority)
        blocks = self._blocks(request)
        out = self._output(request)
        output = out if out > 0.0 else 0.0
        remaining = max(1.0, self._mean_output / 2)
        left = max(1.0, self._left())
        share = self._own_share(cands.table)
        self._share, self._tpot_slo_s = share, tpot_slo
        cached_of = self._index.cached_tokens_all(blocks).get
        own_of = self._own.get
        if self._peers:
            peer_of, scale, per_key = self._peer_sum.get, 1.0, 1.0
        else:
            peer_of, scale = None, 1.0 / share
            per_key = scale if scale > 1.0 else 1.0
        # With peers, a replica idle to every router's view is open over its budget to one of them
        # only, the one owning it: all see it idle alike until the next report, and each sent a
        # long prompt there "alone" (Mooncake at 1.5x capacity, 4 routers: peers' outstanding
        # prefill on the chosen replica 7.0k tokens on average where the router counted 2.8k;
        # TPOT plan margins pinned at their 2.0 cap; critical 93.8 %, 99.0 % with the rule).
        mine = self._mine(self._router_id) if full and peer_of is not None and self._router_id is not None else None
        prompt = int(request.prompt_tokens)
        top = prompt - 1
        tiny = prompt < 1
        ceil, bisect_right, idle = math.ceil, bisect.bisect_right, _IDLE
        rows: list[tuple] = []
        fit: list[tuple] = []
        # The fitting ones' costs are finite (ttft and tpot within finite targets), so this is
        # min() over them, the same value.
        best = math.inf
        for rid, tps, base, per_seq, cap, reported, seats in cands.rows:
            own = own_of(rid, idle)
            if peer_of is None:
                queued, batch, keys = own.queued * scale, own.decoding * scale, own.stall_keys
            else:
                peer = peer_of(rid, NO_PEER_LOAD)
                queued, batch, keys = own.queued + peer.queued_prefill, own.decoding + peer.decoding, own.all_keys()
            # max(0, min(cached, prompt - 1)) and max(1, prompt - cached): cached_tokens_all's
            # figures are >= 0, so only prompts under 1 token need more than the first clamp.
            cached = cached_of(rid, 0)
            if cached > top:
                cached = top
            u = prompt - cached           # uncached prompt tokens, >= 1
            if tiny:
                cached, u = 0, 1
            if not queued > 0.0:
                queued = 0.0
            work = queued + u
            if not batch > 0.0:
                batch = 0.0
            step = base + per_seq * batch
            prefill_s = work / tps
            ttft = prefill_s + ceil(work / CHUNK_TOKENS) * step
            kv_wait = 0.0
            if cap > 0:   # then the table's KV figure is known
                kv = own.kv * scale if peer_of is None else own.kv + peer.kv
                kv_used = reported if reported > kv else kv   # max(kv, reported)
                shortfall = work + output - (cap - (kv_used if kv_used > 0.0 else 0.0))
                if shortfall > 0:
                    # The KV in use drains as its sequences finish, over about `left` steps each.
                    kv_wait = shortfall / ((1.0 if 1.0 > kv_used else kv_used) / (left * step))
                    ttft += kv_wait
            if seats > 0.0 and batch > 0.0:   # past the engine's seats: the wait for a running one to finish
                n = own.waiting + own.decoding
                excess = (n * scale if peer_of is None else n + peer.sequences) + 1.0 - seats
                if excess > 0.0:
                    ttft += excess * 2.0 * left * step / (batch if batch < seats else seats)
            step_joined = base + per_seq * (batch + 1)     # step_s(batch + 1): the batch it joins
            tpot = step_joined + prefill_s / remaining
            cost = ttft / ttft_slo + tpot / tpot_slo
            pushed = 0.0
            if keys:
                stall = u / tps
                if not stall <= 0:   # pushed_out's test, NaN included
                    stalled = own.stalled_s
                    # (an int times a float: the float product of float(int), bit for bit)
                    pushed = (bisect_right(keys, stalled + stall) - bisect_right(keys, stalled)) * per_key
                    cost += pushed
            if full:
                if own.guess_keys:   # admission's open rule counts the guessed keys too (on_dispatch)
                    pushed += pushed_out(own.guess_keys, own.stalled_s, u / tps) * per_key
                budget = (tpot_slo - step_joined) * tps    # prefill_budget(rates, batch + 1, tpot_slo)
                if not budget > 0.0:
                    budget = 0.0
                rows.append((rid, cached, u, ttft, tpot, kv_wait, pushed, cost, queued, budget, tps,
                             mine is None or rid in mine))
            else:
                row = (cost, cached, rid, ttft, tpot, kv_wait)
                rows.append(row)
                # KV room is waived where the replica holds part of the prompt: there it adds only
                # its uncached tail to the KV (its TTFT carries the wait for room), where elsewhere
                # it would take its whole prompt's KV and prefill (README.md §4).
                if ttft <= ttft_slo and tpot <= tpot_slo and (kv_wait <= 0 or cached > 0):
                    fit.append(row)
                    if cost < best:
                        best = cost
        return rows, fit, best

    def predictions(self, snapshot: PoolSnapshot, request: RequestFeatures) -> list[Prediction]:
        """One per candidate, in replica-id order: what `pick` decides on."""
        return [Prediction(*row) for row in self._scan(snapshot, request, True)[0]]

    # ------------------------------------------------------------------ decision

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None:
        # Rows (cost, cached, replica id, ttft, tpot, kv_wait); `fit` meet both targets with KV room.
        preds, fit, best = self._scan(snapshot, request, False)
        if not preds:
            return None
        assert self._cands is not None  # _scan just set it
        by_id = self._cands.by_id
        if len(preds) == 1:
            return make_pick(by_id[preds[0][2]], "only_candidate", preds[0][0], 1)
        reason = "slo_fit"
        if not fit:
            # the targets the scan just planned this request to
            ttft_slo, tpot_slo = (snapshot.slo or self.slo).ttft_s, self._tpot_slo_s
            ttft_ok = [p for p in preds if p[3] <= ttft_slo]
            fit = [p for p in ttft_ok if p[4] <= tpot_slo]
            if not fit:
                # The request's own first token first; then its decoders' TPOT; then the least bad.
                fit, reason = ttft_ok, "no_tpot_fit"
            if not fit:
                fit, reason = [p for p in preds if p[4] <= tpot_slo], "no_ttft_fit"
            if not fit:
                fit, reason = preds, "no_fit"
            best = min(map(_COST, fit))
        blocks = self._blocks(request)
        if blocks.home_key is not None:
            limit = self.band_c * best
            band = [p for p in fit if p[0] <= limit]
            # The most cached tokens first: only those can win, so the others' ranks are not
            # computed (the min below keeps the first of equals, as one over all of them would).
            most = max(map(_CACHED, band))
            band = [p for p in band if p[1] == most]
            if most > 0 and len(band) > 1:
                # The prefix is cached on each of these alike: the request reuses as much on any of
                # them, so the predicted cost decides (as a home rank would not: it sent every new
                # conversation of an app to the one replica its shared system prompt ranks first,
                # which then held them for all their turns; README.md §6). The home rank orders only
                # the ties, and a prefix cached nowhere yet (most = 0), where it makes routers agree.
                least = min(map(_COST, band))
                band = [p for p in band if p[0] <= least + COST_RESOLUTION]
            key, rank = blocks.home_key, self._index.rank
            if len(band) == 1:
                chosen = band[0]
            elif most == 0 and self._router_id is not None and self._peers:
                # Cached nowhere, with peers: its own replicas first, then the home order (below).
                mine = self._mine(self._router_id)
                chosen = min(band, key=lambda p: (p[2] not in mine, -rank(p[2], key), p[0]))
            else:
                chosen = min(band, key=lambda p: (-rank(p[2], key), p[0]))
        else:
            ties = [p for p in fit if p[0] <= best + COST_RESOLUTION]
            if self._router_id is not None and self._peers:
                # With peers, the cheapest of its own replicas within the bounded-load band: between
                # two peer reports the routers, blind to each other's latest placements, all see the
                # same cheapest replica and stack their prompts on it (peer_load.owned_replicas).
                mine = self._mine(self._router_id)
                limit = self.band_c * best
                own = [p for p in fit if p[0] <= limit and p[2] in mine]
                if own:
                    least = min(map(_COST, own))
                    ties = [p for p in own if p[0] <= least + COST_RESOLUTION]
            chosen = ties[rng.randrange(len(ties))] if len(ties) > 1 else ties[0]
        return make_pick(by_id[chosen[2]], reason, chosen[0], len(preds))

    # ------------------------------------------------------------------ router-local state (hooks)

    @staticmethod
    def _key(request: RequestFeatures, replica_id: str) -> tuple[object, str]:
        # The router and the simulator hand the same RequestFeatures object to every hook of one
        # attempt; req_id, when set, survives copies.
        return (request.req_id or id(request), replica_id)

    def on_dispatch(self, request: RequestFeatures, replica_id: str) -> None:
        blocks = self._blocks(request)
        cached = self._index.cached_tokens(replica_id, blocks)
        prefill = float(max(1, request.prompt_tokens - cached))
        out = self._output(request)
        # The KV it adds there: its cached prefix is resident already, shared by every request
        # that holds it (the engine counts those blocks once), so only its uncached prompt and
        # its output take new room, the output as it grows (held_kv). A new request's own fit
        # still asks room for its whole output (_scan: it holds all of it at its end).
        kv = held_kv(prefill, out)
        sent = self._sent_output
        self._sent_output = out if sent is None else sent + EWMA_ALPHA * (out - sent)
        self._seen += 1
        if self._seen == 1:
            self._mean_prefill = prefill
        else:
            self._mean_prefill += EWMA_ALPHA * (prefill - self._mean_prefill)
        own = self._own.get(replica_id)
        if own is None:  # (not setdefault: that would build an _Own on every dispatch)
            own = self._own[replica_id] = _Own()
        own.queued += prefill
        own.waiting += 1
        self._inflight += 1
        own.kv += kv
        rates = self._table[1].get(replica_id, DEFAULT_RATES) if self._table is not None else DEFAULT_RATES
        placed = prefill / rates.prefill_tps
        self._placed[replica_id] = self._placed.get(replica_id, 0.0) + placed
        # Its prefill stalls everyone there. With peers' reports, their prefills are added when
        # reported (on_peer_load); without, they are assumed to be ours scaled to the pool's.
        decoding: float
        if self._peers:
            peer = self._peer_sum.get(replica_id, NO_PEER_LOAD)
            own.stalled_s += placed
            decoding = own.decoding + peer.decoding
        else:
            scale = 1.0 / self._share
            own.stalled_s += placed * scale
            decoding = own.decoding * scale
        # What it can absorb from prefills placed after it before its TPOT misses the target.
        slack = self._tpot_slo_s - rates.step_s(decoding + 1)
        key = own.stalled_s + max(0.0, slack) * max(0.0, out - 1.0)
        # A request without max_tokens has the mean output as its length, wrong for most
        # sequences where outputs spread from a few tokens to hundreds (Mooncake: p10 4, median
        # 69, mean 149). In the pick's cost such keys did worse than none (SLO capacity with
        # --hide-max-tokens, 16 x H100, seed 0: Azure code 78.1 -> 79.4, conversation 300.1 ->
        # 315.2, Mooncake 44.5 -> 47.5), so the cost counts only keys of known lengths. Admission's
        # open rule still counts them: without them, replicas over their prefill budget opened to
        # long prompts beside short answers nobody counted (Mooncake at 1.5x capacity, no
        # max_tokens: critical 90.7 -> 67.7 %). docs/BENCHMARKS.md, "Requests without max_tokens".
        guessed = not request.max_tokens
        if guessed:
            bisect.insort(own.guess_keys, key)
        else:
            bisect.insort(own.stall_keys, key)
            own.merged = None
        self._flights[self._key(request, replica_id)] = _Flight(replica_id, prefill, kv, key, blocks,
                                                                plan_tpot_s=self._tpot_slo_s, guessed=guessed)
        # Bounded by the replica's KV capacity, as its prefix cache is, and resident while it runs.
        self._index.learn(replica_id, blocks, self._capacity.get(replica_id, 0.0), pin=True)
        # Peers get every block it uses there, not only those new to this index: a block reused is
        # recent in the engine's cache again, and a peer that never hears of the reuse ages it in
        # its own index and evicts it first, keeping in its stead blocks the engine has dropped
        # (Mooncake at 47.5 req/s, 4 routers, sent only new blocks: 3.1M prompt tokens predicted
        # cached that were not, against 0.15M with one router; sent every block: 2.4M, 1.3M more
        # tokens really hit).
        if blocks.keys:
            pending = self._learned.get(replica_id)
            if pending is None or pending[1] != blocks.tokens_per_block:
                pending = self._learned[replica_id] = ([], blocks.tokens_per_block)
            if len(pending[0]) < MAX_LEARNED_KEYS:
                pending[0].extend(blocks.keys)

    # ------------------------------------------------------------------ peers (peer_load.py)

    def bind_router(self, router_id: str) -> None:
        """This router's id as its peers' reports name it. With peers, the pick prefers the
        replicas this router owns among them (owned_replicas) within the bounded-load band."""
        if router_id != self._router_id:
            self._owned = None
        self._router_id = router_id

    def _mine(self, router_id: str) -> frozenset[str]:
        assert self._cands is not None  # called from _scan, after _candidates
        entries = self._cands.entries
        owned = self._owned
        if owned is None or owned[0] is not entries:
            mine = owned_replicas(router_id, frozenset(self._peers), [e.replica_id for e in entries])
            owned = self._owned = (entries, mine)
        return owned[1]

    def take_report(self) -> PeerReport:
        """This router's own load per replica and the prefix blocks its requests used there since
        the last report (new or reused: on_dispatch), for its peers (on_peer_load). Taking it
        empties the blocks: each report carries those of its own span."""
        loads = {}
        for rid, placed in self._placed.items():
            own = self._own.get(rid, _IDLE)
            at = bisect.bisect_right(own.stall_keys, own.stalled_s)
            budgets = tuple(k - own.stalled_s for k in own.stall_keys[at:at + MAX_REPORTED_BUDGETS])
            loads[rid] = ReplicaLoadReport(max(0.0, own.queued), own.waiting, own.decoding, max(0.0, own.kv), placed,
                                           tuple(b for b in budgets if b > 0.0))
        learned = tuple(LearnedBlocks(rid, tuple(keys), tpb) for rid, (keys, tpb) in self._learned.items())
        released = tuple(ReleasedBlocks(rid, tuple(keys)) for rid, keys in self._released.items())
        self._learned, self._released = {}, {}
        return PeerReport(loads, learned, released)

    def on_peer_load(self, router_id: str, report: PeerReport) -> None:
        """A peer's latest report: from now on its load is added to ours, the prefill it placed
        since its previous report stalls our sequences there, and the blocks it placed are in
        our index (they are in the replica's cache whoever sent them), pinned until it reports
        their requests finished."""
        for rid, placed in placed_since(self._peers.get(router_id), report.loads).items():
            own = self._own.get(rid)
            if own is not None:
                own.stalled_s += placed
        # Its sequences' budgets become keys on our counter, from where it stands now.
        for rid, own in list(self._own.items()):
            if router_id in own.peer_keys and rid not in report.loads:
                del own.peer_keys[router_id]
                own.merged = None
                if own.waiting == 0 and own.decoding == 0 and not own.peer_keys:
                    del self._own[rid]
        for rid, r in report.loads.items():
            if r.budgets or router_id in self._own.get(rid, _IDLE).peer_keys:
                own = self._own.setdefault(rid, _Own())
                own.peer_keys[router_id] = [own.stalled_s + b for b in r.budgets]
                own.merged = None
        if router_id not in self._peers:
            self._owned = None   # a new peer: the replicas this router owns change
        self._peers[router_id] = dict(report.loads)
        self._peer_sum = sum_peers(self._peers.values())
        # Its requests' blocks are pinned here while they run, as the engine pins them, and
        # released when they finish (peer_load.PeerPins says why); in the report's order: a
        # request that started and finished within one interval is pinned, then released.
        pins, index = self._peer_pins, self._index
        for b in report.learned:
            index.learn_keys(b.replica_id, b.keys, b.tokens_per_block, self._capacity.get(b.replica_id, 0.0), pin=True)
            pins.pin(router_id, b.replica_id, b.keys)
        for rel in report.released:
            index.release_keys(rel.replica_id, pins.unpin(router_id, rel.replica_id, rel.keys))
        for rid, stale in pins.settle(router_id, report.loads).items():
            index.release_keys(rid, stale)

    def forget_peer(self, router_id: str) -> None:
        """A peer is gone (its presence expired): its load no longer counts and the blocks it
        pinned here become evictable."""
        for rid, keys in self._peer_pins.drop(router_id).items():
            self._index.release_keys(rid, keys)
        if self._peers.pop(router_id, None) is not None:
            self._peer_sum = sum_peers(self._peers.values())
            self._owned = None
        for rid, own in list(self._own.items()):
            if own.peer_keys.pop(router_id, None) is not None:
                own.merged = None
                if own.waiting == 0 and own.decoding == 0 and not own.peer_keys:
                    del self._own[rid]

    def on_first_token(self, request: RequestFeatures, replica_id: str) -> None:
        f = self._flights.get(self._key(request, replica_id))
        if f is None or f.started:
            return
        f.started = True
        own = self._own[replica_id]
        before = own.waiting + own.decoding
        own.queued = max(0.0, own.queued - f.prefill)
        own.waiting = max(0, own.waiting - 1)
        own.decoding += 1
        self._inflight += own.waiting + own.decoding - before

    def on_output(self, request: RequestFeatures, replica_id: str, output_tokens: int) -> None:
        """Learn how long outputs really are: their mean and the share of max_tokens they use."""
        del replica_id
        n = float(max(1, output_tokens))
        if request.max_tokens:  # an engine writes at most the cap: a report of more counts as the cap
            n = min(n, float(request.max_tokens))
            self._cap_use += EWMA_ALPHA * (n / float(request.max_tokens) - self._cap_use)
        self._mean_output += EWMA_ALPHA * (n - self._mean_output)

    @property
    def tpot_plan(self) -> TpotPlan:
        """The realized-over-planned TPOT window and its margins (read them, do not feed them)."""
        return self._tpot_plan

    @property
    def tpot_margin(self) -> float:
        """What the TPOT target is divided by when planning (1: no margin; tpot_plan.py)."""
        return self._tpot_plan.margin

    def enforce_tpot_plan(self) -> None:
        """The router enforces this policy's TPOT plan (admission): see TpotPlan.enforce."""
        self._tpot_plan.enforce()

    def on_tpot(self, request: RequestFeatures, replica_id: str, tpot_s: float,
                early_tpot_s: float | None = None) -> None:
        """A request's realized TPOT (seconds per output token after the first) and its early TPOT
        (over its first tpot_plan.EARLY_TOKENS gaps; None: not timed), reported by a router that
        enforces the plan (admission) before on_complete; ignored for a request this policy did
        not place or without a plan."""
        f = self._flights.get(self._key(request, replica_id))
        if f is not None:
            self._tpot_plan.observe(tpot_s, f.plan_tpot_s, early_tpot_s)

    def on_complete(self, request: RequestFeatures, replica_id: str) -> None:
        f = self._flights.pop(self._key(request, replica_id), None)
        if f is None:
            return
        self._tpot_plan.completed()
        own = self._own[replica_id]
        before = own.waiting + own.decoding
        if f.started:
            own.decoding = max(0, own.decoding - 1)
        else:
            own.queued = max(0.0, own.queued - f.prefill)
            own.waiting = max(0, own.waiting - 1)
        self._inflight += own.waiting + own.decoding - before
        own.kv = max(0.0, own.kv - f.kv)
        if f.blocks is not None:
            self._index.release(replica_id, f.blocks)
            if f.blocks.keys:   # peers pinned them when told (take_report): they release them too
                done = self._released.setdefault(replica_id, [])
                if len(done) < MAX_LEARNED_KEYS:
                    done.extend(f.blocks.keys)
        keys = own.guess_keys if f.guessed else own.stall_keys
        i = bisect.bisect_left(keys, f.stall_key)
        if i < len(keys) and keys[i] == f.stall_key:
            del keys[i]
            if not f.guessed:
                own.merged = None
        if own.waiting == 0 and own.decoding == 0 and not own.peer_keys:
            del self._own[replica_id]  # nothing left: no float drift carried forward
