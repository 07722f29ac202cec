"""Admission budgets shared by routers: what a pool can absorb within its SLO, split among the
live routers by their demand, enforced by each router locally (no per-request coordination).

Pure: no I/O, no clock, no logging. The control plane calls `pool_total` and `split` on every
tick and publishes the shares (`AdmissionBudget` at /tidegate/v1/admission/<pool>); each
router keeps a `RouterBudget` per pool, fed with its own share, and asks it before it sends a
request. The simulator can run the same code.

Units, counted per request by the router (`Tokens`):
- prefill_tokens: prompt tokens of requests that have not had their first token yet, less the
  prefix the router predicts cached where the request is best placed (admission.own_prefill);
- kv_tokens: that prompt + half the expected output of every request in flight (what it adds over
  its life, predict.held_kv: a cached prefix is resident already, shared by every request holding
  it, as the pick counts it; counting whole prompts shed a multi-turn chat workload whose
  conversations share a 2k-token system prompt at 55 % of the capacity without admission, with the
  engines' KV 33 % full; the output as the policy expects it, registry.expected_output: clients
  set max_tokens as a cap, and counting the cap shed conversation traffic at 51-73 % of the
  capacity when every client sent 4,096-16,384);
- sequences: requests in flight.

Pool total, over the routable replicas with fitted rates (each scaled by its SLO feedback
multiplier, tidegate.policy.feedback):

    prefill_tokens = sum prefill_tokens_per_s * ttft_target          (queued prefill drains in time)
    sequences      = sum min((tpot_target - step_base) / step_per_seq,   (decode step within TPOT)
                             seats + completions_per_s * ttft_target)    (seats, where known)
    kv_tokens      = sum kv_capacity_tokens                           (KV bound)

`seats` is the engine's max_num_seqs (reported by the agent: its --engine-max-num-seqs, or
SGLang's max_running_requests); sequences past it wait in the engine's own queue, where class
order is lost, and leave it at the engine's measured completion rate, so more than a TTFT
target's worth of completions past the seats would wait there past their deadline. Unknown
seats: no such bound.

A pool without an SLO, or with a routable replica whose rates are unknown, has no total
(None): routers then admit without a budget. Every figure is finite and >= 0.

Split (`split`), per unit independently: `floor_fraction` of the total is split evenly (an
idle router can start at once); the rest goes max-min fair by demand (water-filling: no
router gets more than it asked while another wants more), and what demand leaves over is
split evenly. Shares sum to the total exactly; only live routers (a presence key: its lease
holds) take part, so a router whose lease expired gives its share back on the next tick.

Enforcement (`RouterBudget.allows_tokens`, asked by the router's admission queue as part of its dispatch decision,
tidegate.policy.admission): a request of class c is dispatched while, on every unit,
held + request <= share * class_fraction[c] (critical 1.0, standard 1.0, sheddable 0.5 by
default: the lowest class stops first and leaves room for the others; a critical request over
the share waits for room, a lower one is shed: tidegate.policy.admission, rule 4). A router holding
nothing for the pool admits one request whatever its size, so a request larger than a share
cannot starve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tidegate.policy.classes import CLASSES, CRITICAL, SHEDDABLE, STANDARD
from tidegate.policy.predict import held_kv

# Sheddable 0.5, not 0.7: at 0.7 sheddable requests took the share standard ones needed (Azure
# conversation at 1.5x SLO capacity, 16 replicas: standard 80.9 % -> 88.9 % at 0.5, goodput
# 361 -> 363 req/s, critical 100 % both; docs/BENCHMARKS.md, "Admission and overload").
# Standard 1.0, not 0.9 (since the sequences unit counts the engines' seats): what keeps room for
# critical is that a critical request over the share waits for it while a standard one is shed,
# and that held critical requests go first; a tenth of the seats held back besides cost
# conversation's standard class 4-5 points at 1.5x capacity (docs/BENCHMARKS.md, "Seats").
DEFAULT_CLASS_FRACTION = {CRITICAL: 1.0, STANDARD: 1.0, SHEDDABLE: 0.5}
_MAX = 1e15   # any figure past this is garbage; clamp so sums stay finite


@dataclass(frozen=True)
class Tokens:
    prefill_tokens: float = 0.0
    kv_tokens: float = 0.0
    sequences: float = 0.0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(self.prefill_tokens + other.prefill_tokens, self.kv_tokens + other.kv_tokens,
                      self.sequences + other.sequences)

    def __sub__(self, other: Tokens) -> Tokens:
        return Tokens(self.prefill_tokens - other.prefill_tokens, self.kv_tokens - other.kv_tokens,
                      self.sequences - other.sequences)

    def scaled(self, k: float) -> Tokens:
        return Tokens(self.prefill_tokens * k, self.kv_tokens * k, self.sequences * k)

    def clean(self) -> Tokens:
        """Every figure finite, >= 0 and bounded."""
        return Tokens(_clean(self.prefill_tokens), _clean(self.kv_tokens), _clean(self.sequences))

    def values(self) -> tuple[float, float, float]:
        return (self.prefill_tokens, self.kv_tokens, self.sequences)

    @staticmethod
    def of(values: Iterable[float]) -> Tokens:
        p, k, s = values
        return Tokens(p, k, s)

    @staticmethod
    def request(prompt_tokens: float, output_tokens: float = 0.0) -> Tokens:
        """One request's tokens: `prompt_tokens` the prompt it brings to prefill (less its cached
        prefix where the router predicts one: admission.own_prefill), `output_tokens` the answer it
        is expected to write (the policy's estimate: registry.expected_output), not its
        max_tokens, which clients set as a cap."""
        p = max(0.0, float(prompt_tokens))
        return Tokens(p, held_kv(p, output_tokens), 1.0)


@dataclass(frozen=True)
class BudgetConfig:
    floor_fraction: float = 0.1            # of the total, split evenly before demand counts
    class_fraction: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_CLASS_FRACTION))

    def __post_init__(self) -> None:
        if not (0 <= self.floor_fraction <= 1):
            raise ValueError("floor_fraction must be in [0, 1]")
        if set(self.class_fraction) != set(CLASSES):
            raise ValueError(f"class_fraction needs exactly the classes {', '.join(CLASSES)}")
        if any(not (0 < v <= 1) for v in self.class_fraction.values()):
            raise ValueError("every class fraction must be in (0, 1]")


@dataclass(frozen=True)
class ReplicaCapacity:
    replica_id: str
    routable: bool
    prefill_tokens_per_s: float = 0.0
    decode_step_base_ms: float = 0.0
    decode_step_per_seq_ms: float = 0.0
    kv_capacity_tokens: float = 0.0
    multiplier: float = 1.0                # SLO feedback
    seats: float = 0.0                     # the engine's max_num_seqs; 0 = unknown
    completions_per_s: float = 0.0         # requests it finishes per second, measured


def replica_total(r: ReplicaCapacity, ttft_s: float, tpot_s: float) -> Tokens | None:
    """What one replica absorbs within the targets; None when its rates are unknown."""
    if not (_pos(r.prefill_tokens_per_s) and _pos(r.decode_step_per_seq_ms) and math.isfinite(r.decode_step_base_ms)):
        return None
    m = r.multiplier if math.isfinite(r.multiplier) and 0 < r.multiplier <= 1 else 1.0
    seqs = max(0.0, (tpot_s * 1000.0 - max(0.0, r.decode_step_base_ms)) / r.decode_step_per_seq_ms)
    if _pos(r.seats):
        # The engine runs at most `seats` sequences; the rest wait in its own queue, first come
        # first served whatever their class, and a seat frees at each completion: beyond what the
        # completions of one TTFT target seat, a request waits there past its target.
        drain = r.completions_per_s if _pos(r.completions_per_s) else 0.0
        seqs = min(seqs, r.seats + drain * ttft_s)
    kv = r.kv_capacity_tokens if _pos(r.kv_capacity_tokens) else 0.0
    return Tokens(r.prefill_tokens_per_s * ttft_s, kv, seqs).clean().scaled(m)


def pool_total(replicas: Iterable[ReplicaCapacity], ttft_s: float, tpot_s: float) -> tuple[Tokens | None, str]:
    """(total, reason). None: no budget (no SLO, no routable replica, or rates unknown)."""
    if not (_pos(ttft_s) and _pos(tpot_s)):
        return None, "no SLO targets"
    total = Tokens()
    n = 0
    for r in replicas:
        if not r.routable:
            continue
        t = replica_total(r, ttft_s, tpot_s)
        if t is None:
            return None, f"rates of {r.replica_id} not fitted yet"
        total += t
        n += 1
    if n == 0:
        return None, "no routable replica"
    total = total.clean()
    return total, (f"{n} replicas: prefill {total.prefill_tokens:.0f} tokens in {ttft_s:g}s, "
                   f"{total.sequences:.0f} sequences within {tpot_s * 1000:g}ms/token, kv {total.kv_tokens:.0f}")


def split(total: Tokens, demand: Mapping[str, Tokens], cfg: BudgetConfig) -> dict[str, Tokens]:
    """Each live router's share (keys of `demand`); sums to `total` on every unit."""
    routers = sorted(demand)
    if not routers:
        return {}
    total = total.clean()
    columns = [_waterfill(t, [_clean(demand[r].values()[i]) for r in routers], cfg.floor_fraction)
               for i, t in enumerate(total.values())]
    return {r: Tokens.of(col[j] for col in columns) for j, r in enumerate(routers)}


def _waterfill(total: float, wants: list[float], floor_fraction: float) -> list[float]:
    n = len(wants)
    floor = total * floor_fraction / n
    rest = total - floor * n
    got = [0.0] * n
    left = n
    for j in sorted(range(n), key=lambda j: wants[j]):
        fair = rest / left
        g = min(max(0.0, wants[j] - floor), fair)
        got[j] = g
        rest -= g
        left -= 1
    even = rest / n
    return [floor + g + even for g in got]


class RouterBudget:
    """One router's view of one pool's budget: its share and what it holds. Not thread-safe;
    the router's event loop owns it. No share (None) admits everything."""

    def __init__(self, class_fraction: Mapping[str, float] | None = None) -> None:
        self.share: Tokens | None = None
        self.class_fraction = dict(class_fraction or DEFAULT_CLASS_FRACTION)
        self.held = Tokens()
        self.queued = Tokens()     # waiting in this router's admission queue (they want in too): enqueue/dequeue
        self._wanted = Tokens()    # refused since the last demand() call

    def set_share(self, share: Tokens | None, class_fraction: Mapping[str, float] | None = None) -> None:
        self.share = share.clean() if share is not None else None
        if class_fraction:
            self.class_fraction.update({k: v for k, v in class_fraction.items()
                                        if k in CLASSES and math.isfinite(v) and 0 < v <= 1})

    def allows_tokens(self, cls: str, t: Tokens) -> bool:
        """May a request of class `cls` and tokens `t` (Tokens.request) start now? Pure check:
        records nothing."""
        if self.share is None or self.held.sequences <= 0:
            return True
        f = self.class_fraction.get(cls, self.class_fraction.get(STANDARD, 1.0))
        after = self.held + t
        return all(a <= s * f + 1e-9 for a, s in zip(after.values(), self.share.values(), strict=True))

    def enqueue(self, t: Tokens) -> None:
        """A request now waits in this router's admission queue: it counts in the demand."""
        self.queued += t

    def dequeue(self, t: Tokens) -> None:
        """A waiting request left the queue (dispatched, rejected or gone)."""
        self.queued = Tokens.of(max(0.0, v) for v in (self.queued - t).values())

    def refused_tokens(self, t: Tokens) -> None:
        """A request that wanted in and was turned away: counts in the next demand."""
        self._wanted += t

    def acquire_tokens(self, t: Tokens) -> Hold:
        self.held += t
        return Hold(self, t)

    def demand(self) -> Tokens:
        """What this router wants in flight: held now + queued now + refused since the last call
        (that part then resets)."""
        out = (self.held + self.queued + self._wanted).clean()
        self._wanted = Tokens()
        return out


class Hold:
    """What one admitted request holds; `first_token()` ends its prefill, `release()` ends it
    (idempotent: call it in a finally)."""

    def __init__(self, budget: RouterBudget, tokens: Tokens) -> None:
        self._budget = budget
        self._tokens = tokens
        self._prefill = True
        self._done = False

    # Both run once per request on the router's hot path: one Tokens built each, no temporaries.
    def first_token(self) -> None:
        if self._prefill and not self._done:
            self._prefill = False
            held = self._budget.held
            self._budget.held = Tokens(held.prefill_tokens - self._tokens.prefill_tokens, held.kv_tokens,
                                       held.sequences)

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        held, t = self._budget.held, self._tokens
        prefill = held.prefill_tokens - t.prefill_tokens if self._prefill else held.prefill_tokens
        self._budget.held = Tokens(max(0.0, prefill), max(0.0, held.kv_tokens - t.kv_tokens),
                                   max(0.0, held.sequences - t.sequences))


def _pos(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _clean(x: float) -> float:
    if not math.isfinite(x) or x <= 0:
        return 0.0
    return min(x, _MAX)
