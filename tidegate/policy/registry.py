"""Routing policies by name: Tidegate's own and the baselines it is measured against.

A policy is an object with one pure method over a snapshot,

    pick(snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None

and optional router-local hooks the router calls after a pick and when a request ends:

    on_dispatch(request, replica_id)      # after the request was sent to replica_id
    on_first_token(request, replica_id)   # its first token came back
    on_complete(request, replica_id)      # it finished, failed or was cancelled
    on_output(request, replica_id, n)     # it finished normally after producing n output tokens

A policy that reads `RequestFeatures.prefix_hashes` says so with a class attribute
`uses_prefix_hashes = True`; the live router hashes prompts only for those (it is per-request work).

State that a policy keeps between requests (round-robin cursor, prefix trees) lives in the
policy object, so one router = one policy instance; there are no globals, no I/O, no clock.
`create(name)` returns a fresh instance; an unknown name raises `UnknownPolicyError` listing
the valid names. Each policy only ever picks a *candidate*: an entry with a finite weight > 0
(the control plane's "routable") whose id is not in `snapshot.exclude`; baselines use the
weight only as that eligibility filter. Formulas and sources: baselines/README.md.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tidegate.policy.pick import Pick, routable


class UnknownPolicyError(ValueError):
    """The policy name is not registered; the message lists the valid ones."""


@dataclass(frozen=True, slots=True)
class RouteInfo:
    """One routing-table entry as the router sees it (the fields of tidegate.v1.RouteEntry it reads)."""

    replica_id: str
    weight: float
    state: int = 0
    kv_free_tokens: int = 0
    kv_capacity_tokens: int = 0
    running: int = 0
    waiting: int = 0
    endpoint: str = ""
    ttft_p95_ms: float = 0.0
    itl_p95_ms: float = 0.0
    # Fitted engine rates from the control plane (0 = unknown; see RouteEntry in records.proto).
    prefill_tokens_per_s: float = 0.0
    decode_step_base_ms: float = 0.0
    decode_step_per_seq_ms: float = 0.0
    max_num_seqs: int = 0   # the engine's seats (RouteEntry.max_num_seqs); 0 = unknown

    @classmethod
    def from_entry(cls, e) -> RouteInfo:
        """From a `tidegate.v1.RouteEntry` (or anything with its field names)."""
        return cls(replica_id=e.replica_id, weight=e.weight, state=e.state, kv_free_tokens=e.kv_free_tokens,
                   kv_capacity_tokens=e.kv_capacity_tokens, running=e.running, waiting=e.waiting,
                   endpoint=e.endpoint.rstrip("/"), ttft_p95_ms=e.ttft_p95_ms, itl_p95_ms=e.itl_p95_ms,
                   prefill_tokens_per_s=e.prefill_tokens_per_s, decode_step_base_ms=e.decode_step_base_ms,
                   decode_step_per_seq_ms=e.decode_step_per_seq_ms, max_num_seqs=e.max_num_seqs)

    @property
    def kv_usage(self) -> float:
        """Used KV fraction from the table; 0 when the capacity is unknown."""
        if self.kv_capacity_tokens <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.kv_free_tokens / self.kv_capacity_tokens))


@dataclass(frozen=True, slots=True)
class LiveLoad:
    """Exact engine state at the instant of the pick. Only a simulator can fill it; only the
    `clairvoyant` reference reads it (policies that do set `reads_live_state = True`)."""

    running: int
    waiting: int
    kv_free_tokens: int
    kv_capacity_tokens: int


@dataclass(frozen=True, slots=True)
class SloTargets:
    """The pool's latency targets: time to first token and time per output token, seconds.
    Policies that pick by predicted SLO fit (`tidegate`) read them; the rest ignore them."""

    ttft_s: float = 2.0
    tpot_s: float = 0.1

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ttft_s) and self.ttft_s > 0 and math.isfinite(self.tpot_s) and self.tpot_s > 0):
            raise ValueError("SLO targets must be finite and positive")


@dataclass(frozen=True)
class PoolSnapshot:
    entries: tuple[RouteInfo, ...]
    inflight: Mapping[str, int] = field(default_factory=dict)  # this router's own in-flight per replica
    exclude: frozenset[str] = frozenset()                        # replicas already tried for this request
    live: Mapping[str, LiveLoad] | None = None                   # clairvoyant only
    slo: SloTargets | None = None                                # None: the policy's own default

    def candidates(self) -> list[RouteInfo]:
        """Routable, not excluded, in replica-id order (so a seeded RNG gives reproducible picks)."""
        return sorted((e for e in self.entries if routable(e.weight) and e.replica_id not in self.exclude),
                      key=lambda e: e.replica_id)

    def load(self, replica_id: str) -> int:
        return max(0, int(self.inflight.get(replica_id, 0)))


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    prompt_tokens: int
    max_tokens: int | None = None
    prefix_hashes: tuple = ()            # one id per prefix block; equal ids = same prefix
    priority: int = 0                    # higher is more important; < 0 is sheddable (GIE convention)
    req_id: str = ""
    true_output_tokens: int | None = None  # only the `clairvoyant` reference may read it
    # Prompt tokens per prefix hash: the router's text blocks (tidegate.tokens.PREFIX_BLOCK_TOKENS),
    # or 0 when the hashes cover the prompt evenly (traces: Mooncake's 512-token ids).
    prefix_block_tokens: int = 0


@runtime_checkable
class Policy(Protocol):
    name: str

    def pick(self, snapshot: PoolSnapshot, request: RequestFeatures, rng: random.Random) -> Pick | None: ...


def make_pick(entry: RouteInfo, reason: str, score: float, candidates: int) -> Pick:
    return Pick(entry.replica_id, entry.endpoint, reason, score, candidates)


def notify(policy: object, hook: str, request: RequestFeatures, replica_id: str) -> None:
    """Call an optional hook (on_dispatch / on_first_token / on_complete) when the policy has it."""
    fn = getattr(policy, hook, None)
    if fn is not None:
        fn(request, replica_id)


def expected_output(policy: object, request: RequestFeatures) -> float:
    """The output tokens a request is expected to write: the policy's own estimate when it keeps
    one (`expected_output`: the `tidegate` pick scales max_tokens by the share of the cap answers
    used, or takes the mean answer when there is none), else the request's max_tokens (0 without)."""
    fn = getattr(policy, "expected_output", None)
    if fn is not None:
        return float(fn(request))
    return float(request.max_tokens or 0)


def notify_output(policy: object, request: RequestFeatures, replica_id: str, output_tokens: int) -> None:
    """Tell a policy that has `on_output` how many tokens a request produced (after on_complete)."""
    fn = getattr(policy, "on_output", None)
    if fn is not None and output_tokens >= 0:
        fn(request, replica_id, output_tokens)


def enforce_tpot_plan(policy: object) -> None:
    """Tell a policy with a TPOT plan that its router enforces it (admission applies to it); the
    router calls it once per policy instance, before the first request it admits."""
    fn = getattr(policy, "enforce_tpot_plan", None)
    if fn is not None:
        fn()


def notify_tpot(policy: object, request: RequestFeatures, replica_id: str, tpot_s: float,
                early_tpot_s: float | None = None) -> None:
    """Tell a policy that has `on_tpot` a finished request's realized TPOT and its early TPOT
    (over its first tpot_plan.EARLY_TOKENS gaps; None when not timed), before on_complete. Only
    routers that enforce the policy's TPOT plan (admission) call it (tpot_plan.py)."""
    fn = getattr(policy, "on_tpot", None)
    if fn is not None and tpot_s >= 0:
        fn(request, replica_id, tpot_s, early_tpot_s)


_FACTORIES: dict[str, Callable[[], Policy]] = {}


def register(name: str, factory: Callable[[], Policy]) -> None:
    if name in _FACTORIES:
        raise ValueError(f"policy {name!r} is already registered")
    _FACTORIES[name] = factory


def names() -> list[str]:
    _load_builtins()
    return sorted(_FACTORIES)


def create(name: str) -> Policy:
    """A fresh instance of the named policy (its own router-local state)."""
    _load_builtins()
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicyError(f"unknown policy {name!r}; valid policies: {', '.join(sorted(_FACTORIES))}") from None
    return factory()


def _load_builtins() -> None:
    if _FACTORIES:
        return
    # Imported here, not at module import, so the baselines can import this module's types.
    from tidegate.policy.baselines import BUILTIN

    for n, f in BUILTIN.items():
        register(n, f)
