"""Load and prefix blocks that other routers of a pool report, so each router's pick sees the
pool's load and caches and not only its own share of them.

A stateless router knows exactly what it sent and nothing of what its peers sent. Scaling its
own figures up by its share of the pool (slo_pick's fallback) is right on average and wrong per
replica: with N routers, each one's sample of a replica's load is 1/N of it, and N times a small
sample is a noisy estimate (measured: 4 routers lost 19-37 % of one router's SLO capacity).
Routers therefore publish their own per-replica load every few hundred milliseconds (live: under
their leased presence; fleetsim: the same record on the virtual clock) and add their peers' last
report to their own, exact, fresh figures. The same holds for the prefix index: a router learns
where prefixes are cached from its own dispatches, so with requests spread round-robin over N
routers each knows about 1/N of the pool's caches. Reports therefore also carry the prefix
blocks the router's requests used on each replica since its previous report (new there or
reused: a reuse makes them recent in the engine's cache, which peers' indexes must see to evict
what the engine evicts), which peers add to their own index pinned, and those of its requests
that finished since, which peers release there: the engine cannot evict a block a running
request uses, whichever router sent it (PeerPins).

Pure data and arithmetic: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tidegate.policy.affinity import id_hash


@dataclass(frozen=True, slots=True)
class ReplicaLoadReport:
    """One router's requests on one replica, as it counts them."""

    queued_prefill: float = 0.0   # predicted uncached prompt tokens without a first token yet
    waiting: int = 0              # its requests there without a first token
    decoding: int = 0             # its requests there that are decoding
    kv: float = 0.0               # KV tokens its requests hold (predict.held_kv: prompt + half the output)
    # Prefill seconds it has placed there since it started (monotonic): what stalls every
    # sequence decoding there, whoever sent it. Peers take the difference between two reports.
    placed_s: float = 0.0
    # Stall budgets left to its sequences there (seconds of others' prefill each can still absorb
    # within its TPOT target; predict.pushed_out), ascending: the ones at risk, so that peers count
    # exactly the sequences a placement pushes out, not a multiple of their own.
    budgets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        for name in ("queued_prefill", "kv", "placed_s"):
            v = getattr(self, name)
            if not (v >= 0.0 and v != float("inf")):
                raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
        if self.waiting < 0 or self.decoding < 0:
            raise ValueError("waiting and decoding must be >= 0")
        if not all(0.0 < b < float("inf") for b in self.budgets) or list(self.budgets) != sorted(self.budgets):
            raise ValueError("budgets must be finite, > 0 and ascending")


@dataclass(frozen=True, slots=True)
class PeerSum:
    """The peers' load on one replica, summed over the peers."""

    queued_prefill: float = 0.0
    sequences: int = 0            # waiting + decoding
    decoding: int = 0
    kv: float = 0.0


NO_PEER_LOAD = PeerSum()


def sum_peers(reports: Iterable[Mapping[str, ReplicaLoadReport]]) -> dict[str, PeerSum]:
    """Per replica id, the sum of the given routers' reports."""
    acc: dict[str, list[float]] = {}
    for report in reports:
        for rid, r in report.items():
            a = acc.setdefault(rid, [0.0, 0, 0, 0.0])
            a[0] += r.queued_prefill
            a[1] += r.waiting + r.decoding
            a[2] += r.decoding
            a[3] += r.kv
    return {rid: PeerSum(a[0], int(a[1]), int(a[2]), a[3]) for rid, a in acc.items()}


def placed_since(old: Mapping[str, ReplicaLoadReport] | None,
                 new: Mapping[str, ReplicaLoadReport]) -> dict[str, float]:
    """Prefill seconds a peer placed on each replica between two of its reports. A replica new
    in the report counts nothing (its earlier placements are not known to have overlapped ours);
    a counter that went backwards (the peer restarted) counts nothing either."""
    if old is None:
        return {}
    out = {}
    for rid, r in new.items():
        before = old.get(rid)
        if before is not None and r.placed_s > before.placed_s:
            out[rid] = r.placed_s - before.placed_s
    return out


@dataclass(frozen=True, slots=True)
class LearnedBlocks:
    """Prefix blocks a router placed on a replica that its index did not hold there before."""

    replica_id: str
    keys: tuple[int, ...]       # chained block keys (affinity.PrefixBlocks.keys), in prompt order
    tokens_per_block: float

    def __post_init__(self) -> None:
        if not (self.tokens_per_block > 0.0 and self.tokens_per_block != float("inf")):
            raise ValueError(f"tokens_per_block must be finite and > 0, got {self.tokens_per_block!r}")


@dataclass(frozen=True, slots=True)
class ReleasedBlocks:
    """Prefix blocks of a router's requests on a replica that finished: each key as often as one
    of its requests had used it (reported in `LearnedBlocks`)."""

    replica_id: str
    keys: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PeerReport:
    """What a router tells its peers: its load per replica, the blocks its requests used since
    last time, and those of its requests that finished since (peers hold a peer's blocks pinned
    in their index from the first to the second, as the engine holds them: PeerPins)."""

    loads: Mapping[str, ReplicaLoadReport]
    learned: tuple[LearnedBlocks, ...] = ()
    released: tuple[ReleasedBlocks, ...] = ()


class PeerPins:
    """Which prefix blocks each peer's running requests pin on each replica, in this router's
    index: key -> how many of its requests use it (each `LearnedBlocks` key once per request).

    Why: the engine keeps a block while any request uses it, whoever routed the request, and
    frees it least recently released first. A peer's blocks entered as released at once (evictable
    here) were evicted here while the engine still held them, and kept here in the stead of blocks
    the engine had dropped (Mooncake, 4 routers: 2.4M prompt tokens predicted cached that were
    not, 1 router 0.15M). Bounded: a release is applied only to what the peer pinned; a replica
    where the peer reports nothing in flight has none of its pins left (a lost or truncated
    release does not leave a pin behind); a forgotten peer's pins all go (`drop`)."""

    __slots__ = ("_pins",)

    def __init__(self) -> None:
        self._pins: dict[str, dict[str, dict[int, int]]] = {}   # peer -> replica -> key -> uses

    def pin(self, peer: str, replica_id: str, keys: Iterable[int]) -> None:
        held = self._pins.setdefault(peer, {}).setdefault(replica_id, {})
        for k in keys:
            held[k] = held.get(k, 0) + 1

    def unpin(self, peer: str, replica_id: str, keys: Sequence[int]) -> list[int]:
        """The keys of `keys` the peer had pinned there, now no longer: what to release in the
        index (in the given order, so that a request's tail goes first)."""
        held = self._pins.get(peer, {}).get(replica_id)
        if not held:
            return []
        out = []
        for k in keys:
            n = held.get(k)
            if n is None:
                continue    # never pinned here (its learned keys were cut off, or lost): nothing to undo
            out.append(k)
            if n > 1:
                held[k] = n - 1
            else:
                del held[k]
        return out

    def settle(self, peer: str, loads: Mapping[str, ReplicaLoadReport]) -> dict[str, list[int]]:
        """After a peer's report: per replica, the pins it still holds where it reports no request
        in flight (their release was lost or cut off), dropped and returned to be released."""
        reps = self._pins.get(peer)
        if not reps:
            return {}
        out = {}
        for rid in list(reps):
            r = loads.get(rid)
            if r is None or r.waiting + r.decoding == 0:
                held = reps.pop(rid)
                if held:
                    out[rid] = _each_use(held)
        if not reps:
            del self._pins[peer]
        return out

    def drop(self, peer: str) -> dict[str, list[int]]:
        """A peer is forgotten: every pin it held, per replica, to be released."""
        reps = self._pins.pop(peer, {})
        return {rid: _each_use(held) for rid, held in reps.items() if held}

    def count(self, peer: str | None = None) -> int:
        """Pins held (by one peer or all): for tests and bounds."""
        peers = [peer] if peer is not None else list(self._pins)
        return sum(n for p in peers for held in self._pins.get(p, {}).values() for n in held.values())


def _each_use(held: Mapping[int, int]) -> list[int]:
    """Each pinned key once per request using it: what releases them all in the index."""
    return [k for k, n in held.items() for _ in range(n)]


def owned_replicas(router_id: str, peers: Iterable[str], replica_ids: Iterable[str]) -> frozenset[str]:
    """The replicas this router owns among the pool's routers (itself and the peers it hears
    from): the replicas in the order of their id hashes, dealt out in turn to the routers in id
    order. Every router computes the same split from the same ids, each replica has one owner and
    each router about as many (a rendezvous split gave 8, 4, 2 and 2 of 16 replicas to 4 routers).

    Why (slo_pick's choice within the bounded-load band): routers that run the same pick between
    two peer reports see the same cheapest replicas and, blind to each other's latest placements,
    stack their prompts on them. Azure code at 91 req/s: of the prompt tokens the other routers
    had placed in the previous 55 ms, 4 routers put 8.9 % on the replica they chose, one router
    5.6 % (6.4 % at random). Each router preferring its own replicas within the band keeps
    concurrent routers apart; what it learns from its own placements it sees at once."""
    routers = sorted({router_id, *peers})
    k, n = routers.index(router_id), len(routers)
    ordered = sorted(replica_ids, key=lambda rid: (id_hash(rid), rid))
    return frozenset(ordered[k::n])
