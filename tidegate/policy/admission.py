"""Admission at the router: dispatch now, hold in a bounded per-class queue, or reject with a reason.

Pure: predictions, the request's class and deadline, and an injected `now` in; a decision out.
The queue object holds only what it is given (no clock, no I/O, no RNG), so the live router
(asyncio) and the virtual-time simulator run the same code. Formulas and reasons: README.md,
"Admission".

Inputs per request, from the `tidegate` pick's predictions (predict.py) on every candidate:
its predicted TTFT there, the prefill tokens already outstanding there and that replica's
prefill budget (what one step may carry within the TPOT target: TPOT protection).

    open         = {r : kv_wait_r == 0  and  (queued_r + prefill_r <= budget_r
                        or (pushed_out_r == 0  and  ((queued_r == 0 and sole_r)  or  cached_r > 0)))}
                   (guard on; only where the KV cache is predicted to hold the prompt and its
                   expected output, else the engine preempts running sequences as their decodes
                   grow; over its budget, a replica is open only where the pick predicts the
                   prefill pushes no sequence past the TPOT target, and only when nothing is
                   outstanding there (a prompt larger than the budget goes alone) or it holds the
                   request's prefix (held back from it, the request would go where the whole
                   prompt is prefilled). sole_r: with peer routers, only the router owning r may
                   send one alone there (peer_load.owned_replicas): every router sees r idle
                   until the next report, and each sent one)
    ttft_best    = min_r TTFT_r;    ttft_open = min_{r in open} TTFT_r
    predicted    = sum_r min(prefill_tps_r, budget_r / tpot_slo)  (guard on; else sum_r prefill_tps_r)
    drain        = (served + predicted * 0.1 s) / (held_s + 0.1 s): the prefill tokens/s the queue
                   is measured to drain while requests wait (served: tokens dispatched while
                   something was held; held_s: the time something was; both decayed over the TTFT
                   target), the prediction a prior worth 0.1 s (it counts only prefill, while the
                   engines' steps also carry the decodes, so it overstates the drain under load)
    ahead_k      = prefill tokens queued here of class k, before the request; for k > c (a higher
                   class) plus what the largest peer holds of the classes above c beyond this
                   router's own (`_peer_ahead`: c does not go while a peer holds them, see "Class
                   order across routers"; the largest, as peers drain in parallel)
    arriving_k   = prefill tokens/s of class k arriving (admitted or not), a moving average over
                   the TTFT target, less its held tokens / that horizon (those are already ahead)
    wait(c)      = (ahead_c + own) / drain          (its class ahead of it, then its own prefill)
    wait(>=c)    = (sum_{k >= c} ahead_k + own) / (drain - sum_{k > c} arriving_k - shorter_c(own))
                   (higher classes ahead, and those arriving meanwhile, go first; inf when they
                   alone take the whole drain)
    shorter_c(s) = prefill tokens/s of class c arriving in prompts of a smaller size bucket than
                   s (SIZE_STEPS buckets per doubling), less its held tokens / the horizon: shorter
                   first (see below)
    remaining    = deadline - now - ttft_margin
    ttft_margin  = max(0, q_0.95(realized - predicted TTFT))   over the router's latest 1,024
                   dispatches (`observe_ttft`: realized = first token - dispatch, predicted = the
                   ttft_open it was dispatched on; 0 until 32 are in; `ttft_quantile`, None: off)

Shorter first. Under overload somebody of a class must be refused, and a long prompt takes the
prefill of several short ones: refusing it keeps more requests within their deadlines for the
same drain. The shed test (rule 3) therefore counts the class's shorter prompts arriving meanwhile
as served before it, as it counts the higher classes; held requests still go FIFO within a class,
so the order of those admitted and the promise made at arrival stay as they were, and the long
prompt is refused at arrival, not later. It only bites when the shorter prompts alone nearly take
the drain. Measured at 1.5x capacity with classes (docs/BENCHMARKS.md, "Shorter first"): Azure
code standard +2.4 to +3.0 points and rejections within 50 ms 95.8-96.9 -> 98.3-98.6 %, Mooncake
standard +1 point, conversation unchanged; SLO capacity with admission Mooncake +5 %,
conversation -1.6 % (one search step: at capacity it refuses some long prompts that would have
made it). Reordering held requests shortest first instead (tried) gained conversation 4 points of
standard but answered 12-14 % of rejections late: overtaken long prompts missed the deadline their
admission had promised.

The TTFT margin is why a request is not dispatched on a prediction that leaves it less slack than
the predictions' usual error: sent, it would mostly miss its deadline anyway, and the prefill and
decode it takes are what the requests behind it needed. Rejected (`deadline_unmeetable`), it
frees them. Measured, not chosen: it is the error of the decision's own input (the best open
replica's predicted TTFT, which the pick may not even choose), so it grows where predictions are
worse (several routers, each blind to its peers' last placements) and is 0 where they are exact;
0.95 is the attainment an SLO-capacity figure asks of a rate. The last start of a held request
(deadline - its predicted TTFT - ttft_margin) decides urgency and its peers' critical slack alike.
Measured with classes at the loads that were 1.5x the SLO capacity before it (docs/BENCHMARKS.md,
"TTFT margin"): Azure conversation standard 84.2 -> 86.3 % (4 routers 81.8 -> 85.9 %), Azure code
86.9 -> 87.4 % (4 routers 85.3 -> 87.4 %), Mooncake unchanged within its seeds' spread; it also
raises the SLO capacity with admission (conversation +5 %).

Higher classes refused. A `sheddable` request is shed at arrival while a class above it had a
request refused for want of capacity within the horizon (the TTFT target): shed, queue_full, a
held request's timeout or late deadline. Not `deadline_unmeetable` at arrival, which weighs a
request's own deadline against its own class's queue (a client's tight deadline header must not
shed the classes below it). Why: the other rules admit a lower class whenever a replica is open
and its queue is empty, and under overload that happens in the lulls of a bursty arrival stream;
a request admitted then decodes for seconds and takes the steps the higher class's next burst
needed. The refusal is the measured sign that the pool cannot carry the higher classes' demand,
and the TTFT target is the horizon their arrival rates are averaged over. Only the lowest class:
`standard` carries an SLO promise too, and shed for `critical` refusals (which with several
routers include those of peers' imprecision) it lost 3.6 points with 4 routers (Mooncake at 1.5x,
seed 1). Measured at 1.5x capacity with classes (docs/BENCHMARKS.md, "Critical requests plan on
their first tokens"): with the early TPOT plan, Mooncake `standard` 83.6-89.4 -> 87.4-89.8 % over
six seeds (`sheddable` 10.8-14.3 -> 0.9-2.2 %).

On arrival of a request of class c:
0. c is the lowest class and a class above it was refused for want of capacity within the
   horizon -> reject `shed`;
1. nothing of class >= c is queued, no peer router holds a class above c (`on_peer_held`),
   `open` not empty, the router's budget share has room (`within_budget`) and
   ttft_open <= remaining -> dispatch;
2. wait(c) + ttft_best > remaining                   -> reject `deadline_unmeetable`;
3. wait(>=c) + ttft_best > remaining                 -> reject `shed` (higher classes go first);
4. below critical and over its class's fraction of the budget share -> reject `shed` (the rest
   of the share is the higher classes');
5. its class queue holds max_queue[c]                 -> reject `queue_full`;
6. otherwise hold it.

Holding is a commitment: every rejection should come at arrival. While held (`sweep`, then
`pump`, whenever capacity may have freed): past its max wait -> `queue_timeout`; wait(c) from
its place + its last predicted TTFT past its deadline -> `deadline_unmeetable` (the higher
classes do not shed it later: it goes first when urgent), but only within `decide_s` of its
arrival (`--admission-decide`, 50 ms by default; None: at any time). Held longer, it is
committed: it is not rejected for its deadline any more, and once it cannot meet it (its last
start has passed) it goes as soon as a replica is open for it, over the router's budget share
if need be. So every rejection but a max-wait timeout comes within `decide_s`, and the arrival
decision has to be right: committing, a request's wait counts every held request as ahead of it
(each is served by its own, earlier deadline), and adds the error its class's waits have shown,
at `wait_quantile`, against their predictions at arrival:

    wait'(c)     = wait over all held tokens + own  +  q_{wait_quantile}(actual - predicted wait)_c

(the error of the latest 256 held requests of the class, dropped once nothing of it was held or
measured for its max wait: see `_expire_margin`; measured, Azure code at 1.5x capacity:
a ratio margin or none cost standard requests 8-13 points, served late instead of rejected
late). Candidates to dispatch: unless the
critical head has less than 2 x `urgent_s` of slack, the class heads within `urgent_s` of their
last start (deadline - predicted TTFT), earliest first; then the head in class order (FIFO
within a class), unless a peer router holds a class above it. One is
dispatched once a replica is open for it, the router's budget share has room for it and its
TTFT there fits the remaining deadline.

Class order across routers. Each router orders only its own queue, and every router sees the same
replicas open (peers' load reports, peer_load.py): without more, a router holding only sheddable
requests fills a replica that another router's held standard request was waiting for (measured,
Azure code at 1.5x capacity, 4 routers: standard 88.5 -> 78.9 %, sheddable 22.4 -> 36.8 %,
critical 100 -> 99.2 %). So routers also tell each other what they hold (`held_report`:
prefill tokens per class and the slack of their critical head; `on_peer_held`; `forget_peer`
when a peer's presence ends), and
- a request does not go at arrival, nor as the head in class order, while a peer holds a higher
  class: it goes when that peer's requests have gone or when it is urgent itself (so a stale or
  lost report delays a request by at most its slack, never past its deadline). A peer holding
  the *same* class does not hold it back: every router would wait for another's head, and none
  would go (measured: standard 43.7 %); only its older heads do, for a while ("Arrival order
  across routers" below);
- the critical-slack rule spans the routers: while a peer's critical head has less than
  2 x `urgent_s` of slack (its last start as reported: the receiver's clock at delivery plus the
  slack sent), only this router's own critical head may go. Without it, urgent lower-class
  heads at the other routers took the capacity (Azure conversation at 2x capacity, 4 routers:
  critical 93.0 % against 99.7 % with one router; with it 99.1 %).
The wait estimates stay this router's own (its drain is measured on its own dispatches, which
the gate already slows), except that a request's wait at arrival counts the higher classes its
peers hold beyond this router's own (ahead_k above): the gate keeps it back until they go, and
without them the prediction was half a second short at the start of a burst, so requests were
held that could only go late (Azure conversation at 1.5x capacity, 4 routers, seed 1: 174
standard requests served past their deadline, 2 with it; standard 84.2 -> 86.5 %;
docs/BENCHMARKS.md, "Peers' held classes in the wait").

Arrival order across routers. Within a class each router serves its own queue first come first
served, but across routers nothing did: a router whose queue had just emptied sent its new
arrivals at once, past requests its peers had held for a second, onto the replicas they were
waiting for. Those then waited longer than their routers had predicted, the committing margin
grew, and the routers shed more at arrival than one router does (Azure conversation at 1.5x
capacity, 4 routers, seed 3: standard 82.1-83.9 % in all four assignments of requests to routers,
against 86.6 % with one). So each report also carries, per class held, its head's age and prefill
(`HeldReport.heads`), and a request does not go, at arrival (rule 1) or as the head in class
order, while a peer's head of its class has been held longer than it by more than the gate:

    gate = max(peer_fifo_share x the TTFT target, 2 x peer_report_s)

It goes when the peer's report shows that head gone, when it is urgent itself, or when it has
yielded for PEER_FIFO_YIELD (2) gates (peer_queues.py, which keeps the peers' reports). A peer's
head that can go goes at its router's next look, and its next report says so; one still held after
that waits for room this request does not need (its prefix's replica, KV room). So may a larger
head, so only a peer's head no larger than the request counts (a replica's prefill budget, an idle
replica of its own router's). Holding this one back for those would idle the room it fits
(Mooncake, 4 routers at 1.5x capacity: standard 0.6 points lower without the yield limit over 64
runs, 1.3 lower without the size rule over 8).

The gate's floor: a report is up to `peer_report_s` old, so a head that went after it still looks
held; with a narrower gate routers wait on each other's stale heads (conversation at a gate of
0.03 s: standard 55.7 % on seed 3). Only fresh reports count: a peer holding something reports
every interval, and one silent for two report ages (frozen, cut off) holds nobody back while its
presence lasts. The share and the yield limit are measured, not derived (docs/BENCHMARKS.md,
"Arrival order across routers"). One router has no peers and decides as before.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tidegate.policy.classes import CLASSES, CRITICAL, SHEDDABLE, STANDARD
from tidegate.policy.peer_queues import PEER_FIFO_SHARE, HeldReport, PeerQueues
from tidegate.policy.predict import Prediction

DISPATCH, HOLD, REJECT = "dispatch", "hold", "reject"
QUEUE_FULL, DEADLINE_UNMEETABLE, SHED, QUEUE_TIMEOUT = "queue_full", "deadline_unmeetable", "shed", "queue_timeout"
REASONS = (QUEUE_FULL, DEADLINE_UNMEETABLE, SHED, QUEUE_TIMEOUT)
# Retry-After bounds, seconds (HTTP wants whole seconds; beyond a minute the estimate means little).
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S = 1, 60
_RANK = {name: i for i, name in enumerate(CLASSES)}  # 0 = served first
# Requests held per class by default. The deadline and the max wait decide who waits; the count
# only bounds memory, and a router holds no more requests than it has client connections (8,192
# by default, router.frontdoor). 1,024 refused a 16-replica fleet serving ~2,300 short chats/s
# (held a fraction of a second each) at loads its engines met (docs/BENCHMARKS.md, "Queue length").
DEFAULT_MAX_QUEUE = 8192
# Arrival rates by prompt size, for the shorter-first shed (AdmissionQueue._shorter_tps): buckets
# a quarter of a doubling wide (a prompt and one 19 % longer may share one), up to 2**24 tokens.
SIZE_STEPS = 4
SIZE_BUCKETS = 24 * SIZE_STEPS + 1
# Weight of the predicted drain against the measured one, in seconds of observation: a tenth of
# a second of waiting already outweighs it (a 2 s TTFT target leaves time for ~20 such estimates).
SERVICE_PRIOR_S = 0.1
# Admission commits a request held this long (AdmissionConfig.decide_s; the 50 ms answer).
DEFAULT_DECIDE_S = 0.05
# Waits measured per class for the committing margin (AdmissionConfig.decide_s): the latest few
# hundred, a second or two of an overloaded router's holds; the quantile is taken every 16th.
WAIT_SAMPLES, WAIT_EVERY = 256, 16
# TTFT errors kept for the TTFT margin (as the TPOT plan margin keeps its TPOT errors: about a
# thousand requests, refreshed every 16th), and how many it needs before it applies.
TTFT_SAMPLES, TTFT_EVERY, TTFT_MIN_SAMPLES = 1024, 16, 32


@dataclass(frozen=True)
class ClassLimits:
    max_queue: int          # requests of the class held at once (0: never hold one)
    max_wait_s: float       # longest a request of the class is held

    def __post_init__(self) -> None:
        if self.max_queue < 0 or not (self.max_wait_s >= 0 and math.isfinite(self.max_wait_s)):
            raise ValueError("admission: max_queue must be >= 0 and max_wait_s finite and >= 0")


@dataclass(frozen=True)
class AdmissionConfig:
    """Per-class queue bounds and whether TPOT protection (the prefill budget) holds requests."""

    limits: Mapping[str, ClassLimits] = field(default_factory=lambda: {
        c: ClassLimits(DEFAULT_MAX_QUEUE, 30.0) for c in (CRITICAL, STANDARD, SHEDDABLE)})
    tpot_guard: bool = True
    # A held request within this much of the last moment its dispatch still meets its deadline
    # (deadline - predicted TTFT) is urgent and goes before the class order: two engine steps at a
    # 100 ms TPOT target, the time a replica's prefill budget takes to open for it.
    urgent_s: float = 0.2
    # How long admission may take to decide (None: no limit). A request held this long is
    # committed: it is no longer rejected for its deadline (only past its class's max wait, or
    # when its client leaves) and goes once a replica is open for it, late if it must, so a client
    # that has waited gets its answer, not a 429 after the wait. The price: a request is held only
    # when its wait, as its class's waits have measured against their predictions at
    # `wait_quantile`, still fits its deadline (late ones cost the capacity that on-time ones need).
    # 50 ms by default: a client told no is told at once (measured at 1.5x capacity: every
    # rejection within 50 ms against 93-95 % without, for a point or two of `standard` on some
    # traces; docs/BENCHMARKS.md, "Committing by default").
    decide_s: float | None = DEFAULT_DECIDE_S
    wait_quantile: float = 0.9
    # The TTFT margin: every deadline test adds the error of the router's latest predictions
    # (realized TTFT after dispatch minus the TTFT the dispatch counted on) at this quantile, so
    # that a request sent with less slack than the predictions' usual error is rejected instead
    # of served late (None: no margin). See AdmissionQueue.observe_ttft.
    ttft_quantile: float | None = 0.95
    # Arrival order across routers: a request does not go, at arrival or as its queue's head,
    # while a peer router's head of its class, no larger than it, has been held longer than it by
    # this share of the TTFT target (None: off). See "Arrival order across routers".
    peer_fifo_share: float | None = PEER_FIFO_SHARE
    # How stale a peer's held report may be when it arrives: its report interval plus its delivery
    # (the router's 50 ms peer load interval and an etcd watch). The order above never holds a
    # request back for less than twice this: a peer's head that went after its report still looks
    # held until the next one, and a narrower gate has routers waiting on each other's stale heads.
    peer_report_s: float = 0.055

    def __post_init__(self) -> None:
        if set(self.limits) != set(CLASSES):
            raise ValueError(f"admission: limits needed for exactly the classes {', '.join(CLASSES)}")
        if not (self.urgent_s >= 0 and math.isfinite(self.urgent_s)):
            raise ValueError("admission: urgent_s must be finite and >= 0")
        if self.decide_s is not None and not (self.decide_s >= 0 and math.isfinite(self.decide_s)):
            raise ValueError("admission: decide_s must be finite and >= 0 (or None: no limit)")
        if not 0 < self.wait_quantile < 1:
            raise ValueError("admission: wait_quantile must be in (0, 1)")
        if self.ttft_quantile is not None and not 0 < self.ttft_quantile < 1:
            raise ValueError("admission: ttft_quantile must be in (0, 1) (or None: no margin)")
        if self.peer_fifo_share is not None and not 0 < self.peer_fifo_share < 1:
            raise ValueError("admission: peer_fifo_share must be in (0, 1) (or None: off)")
        if not (self.peer_report_s >= 0 and math.isfinite(self.peer_report_s)):
            raise ValueError("admission: peer_report_s must be finite and >= 0")


def parse_class_values(text: str, what: str, unit: str = "") -> dict[str, float]:
    """'100' (every class) or 'critical=100,standard=50,sheddable=10' (the others keep no value).
    `unit` 's': values may end in 's' or 'ms'. Raises ValueError naming `what`."""
    out: dict[str, float] = {}

    def number(raw: str) -> float:
        t = raw.strip().lower()
        scale = 1.0
        if unit == "s" and t.endswith("ms"):
            t, scale = t[:-2], 0.001
        elif unit == "s" and t.endswith("s"):
            t = t[:-1]
        try:
            v = float(t) * scale
        except ValueError:
            raise ValueError(f"{what}: {raw.strip()!r} is not a number") from None
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError(f"{what}: {raw.strip()!r} must be finite and >= 0")
        return v

    text = text.strip()
    if "=" not in text:
        v = number(text)
        return dict.fromkeys(CLASSES, v)
    for item in text.split(","):
        name, _, raw = item.partition("=")
        name = name.strip().lower()
        if name not in _RANK or name in out:
            raise ValueError(f"{what}: {item.strip()!r}: want CLASS=VALUE, each of {', '.join(CLASSES)} at most once")
        out[name] = number(raw)
    return out


def check_flag(field_name: str, value: str) -> str:
    """A config validator for the `admission_queue` / `admission_max_wait` / `admission_decide` /
    `admission_ttft_margin` flags (ValueError if bad)."""
    if field_name.endswith("queue"):
        config_from_text(value, "30s")
    elif field_name.endswith("decide"):
        parse_decide(value)
    elif field_name.endswith("ttft_margin"):
        parse_quantile(value)
    else:
        config_from_text("1024", value)
    return value


def parse_decide(text: str) -> float | None:
    """'50ms', '0.05s', '0.05' (seconds) or 'off' (None) -> AdmissionConfig.decide_s."""
    if text.strip().lower() in ("off", "none"):
        return None
    if "=" in text:
        raise ValueError("admission decide time: one duration for every class, or 'off'")
    return parse_class_values(text, "admission decide time", unit="s")[CRITICAL]


def parse_quantile(text: str) -> float | None:
    """'0.95' or 'off' (None) -> AdmissionConfig.ttft_quantile."""
    t = text.strip().lower()
    if t in ("off", "none"):
        return None
    try:
        q = float(t)
    except ValueError:
        raise ValueError(f"admission TTFT margin: {text.strip()!r} is not a quantile in (0, 1) or 'off'") from None
    if not 0 < q < 1:
        raise ValueError(f"admission TTFT margin: {text.strip()!r} is not a quantile in (0, 1) or 'off'")
    return q


def config_from_text(queue: str, wait: str, tpot_guard: bool = True, decide: str = "50ms",
                     ttft_margin: str = "0.95") -> AdmissionConfig:
    """From the router's / simulator's flags (see parse_class_values); unnamed classes keep the defaults."""
    base = AdmissionConfig().limits
    lengths = parse_class_values(queue, "admission queue length")
    waits = parse_class_values(wait, "admission max wait", unit="s")
    limits = {c: ClassLimits(int(lengths.get(c, base[c].max_queue)), waits.get(c, base[c].max_wait_s))
              for c in CLASSES}
    return AdmissionConfig(limits=limits, tpot_guard=tpot_guard, decide_s=parse_decide(decide),
                           ttft_quantile=parse_quantile(ttft_margin))


@dataclass(frozen=True, slots=True)
class Placement:
    """What admission reads of one request's predictions (see `placement`)."""

    ttft_s: float                   # best predicted TTFT over the candidates (inf: none)
    open: frozenset[str]            # replicas whose prefill budget admits the request now
    open_ttft_s: float              # best predicted TTFT over `open` (inf: none)
    prefill_tps: float              # the pool's drain: prefill tokens/s it takes in within the TPOT target
    prefill_tokens: float           # the request's own uncached prefill where it is best placed
    # This router's share of the pool's admission budget (admission_budget.RouterBudget.allows)
    # has room for it now. Part of the dispatch decision, not a gate before the queue: a request
    # over budget waits in its class queue like one with no open replica.
    within_budget: bool = True


def drain_tps(p: Prediction, tpot_guard: bool, tpot_s: float | None) -> float:
    """Prefill tokens/s a replica takes in: with the guard, one budget per step of at most the
    TPOT target (budget / tpot); a replica with no budget takes one prompt at a time at its rate."""
    rate = max(0.0, p.prefill_tps)
    if tpot_guard and tpot_s and 0 < p.prefill_budget < math.inf:
        return min(rate, p.prefill_budget / tpot_s)
    return rate


def placement(preds: Sequence[Prediction], tpot_guard: bool = True, tpot_s: float | None = None,
              within_budget: bool = True) -> Placement:
    """From the pick's predictions on every candidate (an empty list: nothing can serve it);
    `tpot_s`: the request's TPOT target (the drain under the guard); `within_budget`: whether
    the router's share of the pool's admission budget has room for the request now."""
    if not preds:
        return Placement(math.inf, frozenset(), math.inf, 0.0, 0.0, within_budget)
    best = _best(preds)
    # Over its prefill budget, a replica is open only where the pick predicts the prefill pushes no
    # sequence there past its TPOT target: one holding the prefix, or one with no prefill
    # outstanding. An idle-queue replica used to be open to any prompt: on Mooncake at 1.5x
    # capacity that placed 1,880 prompts of ~15k uncached tokens whose predicted pushed_out summed
    # to 375, and 331 sequences missed TPOT (docs/BENCHMARKS.md, "Mooncake: the prefix index ...").
    # And only where the KV cache has room for the prompt and its expected output (kv_wait 0):
    # an engine admits a prompt whose blocks fit now and preempts running sequences when their
    # decodes outgrow the cache (long/short mix at 1.5x capacity, one router: 148-618 preemptions
    # in 8,000 requests, critical 94-99 %; with the test none, 99.3-99.6 %).
    open_ = [p for p in preds
             if not tpot_guard or (p.kv_wait_s <= 0 and (
                 p.queued_prefill + p.prefill_tokens <= p.prefill_budget
                 or (p.pushed_out <= 0 and ((p.queued_prefill <= 0 and p.sole) or p.cached_tokens > 0))))]
    return Placement(best.ttft_s, frozenset(p.replica_id for p in open_),
                     min((p.ttft_s for p in open_), default=math.inf),
                     sum(drain_tps(p, tpot_guard, tpot_s) for p in preds), float(best.prefill_tokens),
                     within_budget)


def own_prefill(preds: Sequence[Prediction], prompt_tokens: float) -> float:
    """The prefill a request brings where it is best placed (its prompt less what that replica's
    prefix cache holds: Placement.prefill_tokens); its whole prompt when nothing is predicted.
    What the admission budget counts of its prompt, prefill and KV alike: the pick's own KV
    rule (slo_pick.TidegatePolicy.on_dispatch) counts a cached prefix as resident already, shared
    by every request that holds it."""
    if not preds:
        return max(0.0, float(prompt_tokens))
    return float(_best(preds).prefill_tokens)


def _best(preds: Sequence[Prediction]) -> Prediction:
    """The candidate predicted to answer first (ties by replica id): where a request is best placed."""
    return min(preds, key=lambda p: (p.ttft_s, p.replica_id))


@dataclass(frozen=True, slots=True)
class Decision:
    action: str                     # dispatch | hold | reject
    reason: str = ""                # for reject: one of REASONS
    retry_after_s: int = 0          # for reject: the Retry-After header, whole seconds
    open: frozenset[str] = frozenset()  # for dispatch: replicas the pick may choose from
    ttft_s: float = 0.0             # for dispatch: the TTFT it counted on (observe_ttft's prediction)


@dataclass(slots=True)
class Held:
    key: object
    cls: str
    prefill_tokens: float
    arrival_s: float
    deadline_s: float               # absolute: arrival + the request's TTFT target
    expire_s: float                 # absolute: arrival + its class's max wait
    ttft_s: float                   # its best predicted TTFT, as last predicted
    wait_s: float = 0.0             # its wait as predicted at arrival (the measured error's base)


def size_bucket(tokens: float) -> int:
    """A prompt's size bucket: SIZE_STEPS per doubling of its prefill tokens."""
    return min(SIZE_BUCKETS - 1, int(SIZE_STEPS * math.log2(max(1.0, tokens))))


def class_rank(cls: str) -> int:
    return _RANK[cls]


class AdmissionQueue:
    """The router's held requests (one queue per pool), in class order, FIFO within a class."""

    def __init__(self, cfg: AdmissionConfig | None = None) -> None:
        self.cfg = cfg or AdmissionConfig()
        self._q: dict[str, deque[Held]] = {c: deque() for c in CLASSES}
        self._tokens: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
        self._keys: dict[object, Held] = {}
        self._rate = 0.0  # the pool's drain, as last predicted
        # The measured service rate: prefill tokens dispatched while requests were held (the
        # queue is backlogged, so dispatches are limited by capacity, not by arrivals), over the
        # time held requests waited, both decayed over the horizon (see _service_rate).
        self._served = 0.0
        self._backlogged_s = 0.0
        self._served_at: float | None = None
        self._arriving: dict[str, float] = dict.fromkeys(CLASSES, 0.0)  # admitted prefill tokens/s
        self._arrived_s: float | None = None
        self._first_arrival_s: float | None = None  # when the arrival rates began to fill (_filled)
        self._horizon_s = 1.0
        # The same arrivals per class and prompt size bucket (size_bucket), each bucket decayed
        # lazily from its own last update; and the prefill tokens held per class and bucket.
        self._by_size: dict[str, list[float]] = {c: [0.0] * SIZE_BUCKETS for c in CLASSES}
        self._by_size_at: dict[str, list[float]] = {c: [0.0] * SIZE_BUCKETS for c in CLASSES}
        self._held_by_size: dict[str, list[float]] = {c: [0.0] * SIZE_BUCKETS for c in CLASSES}
        # Committing (decide_s): per class, the latest held requests' actual minus predicted
        # waits, and their value at wait_quantile, added to a new request's predicted wait.
        self._errors: dict[str, deque[float]] = {c: deque(maxlen=WAIT_SAMPLES) for c in CLASSES}
        self._margin: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
        self._measured: dict[str, int] = dict.fromkeys(CLASSES, 0)
        self._measured_at: dict[str, float] = dict.fromkeys(CLASSES, -math.inf)
        # The TTFT margin (AdmissionConfig.ttft_quantile): the latest dispatches' realized minus
        # predicted TTFTs, and their value at the quantile, refreshed every TTFT_EVERY.
        self._ttft_errors: deque[float] = deque(maxlen=TTFT_SAMPLES)
        self._ttft_since = 0
        self.ttft_margin = 0.0
        # What the peer routers' queues hold (the rules across routers).
        self._peers = PeerQueues(self.cfg.peer_fifo_share, self.cfg.peer_report_s)
        # Per class: when a request of it was last refused for want of capacity (see "Higher
        # classes refused").
        self._refused_at: dict[str, float] = dict.fromkeys(CLASSES, -math.inf)

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def lengths(self) -> dict[str, int]:
        return {c: len(q) for c, q in self._q.items()}

    def held(self) -> Iterator[Held]:
        """In dispatch order."""
        for c in CLASSES:
            yield from self._q[c]

    def head(self) -> Held | None:
        for c in CLASSES:
            if self._q[c]:
                return self._q[c][0]
        return None

    def next_expiry(self) -> float | None:
        """The earliest max-wait expiry of a held request (FIFO per class: the heads')."""
        return min((q[0].expire_s for q in self._q.values() if q), default=None)

    def held_report(self, now: float) -> HeldReport:
        """What this router tells its peers about its queue (see "Class order across routers")."""
        crit = self._q[CRITICAL]
        return HeldReport({c: self._tokens[c] for c in CLASSES if self._q[c] and self._tokens[c] > 0},
                          self._last_start(crit[0]) - now if crit else None,
                          {c: (max(0.0, now - q[0].arrival_s), q[0].prefill_tokens)
                           for c, q in self._q.items() if q})

    def on_peer_held(self, peer: str, report: HeldReport, now: float) -> None:
        """A peer router's latest `held_report`, received at `now` (replaces its previous one)."""
        self._peers.on_report(peer, report, now)

    def forget_peer(self, peer: str) -> None:
        """A peer is gone (its presence expired): what it held no longer holds ours back."""
        self._peers.forget(peer)

    def _peer_held_longer(self, cls: str, arrival_s: float, tokens: float, now: float) -> bool:
        """Arrival order across routers: a peer's older head of this class holds the request back."""
        return self._peers.held_longer(cls, arrival_s, tokens, now, self._horizon_s)

    def _peer_ahead(self, rank: int) -> float:
        """What peers hold of the classes above rank `rank` beyond this router's own (PeerQueues.ahead)."""
        return self._peers.ahead(rank, self._tokens)

    def _observe(self, now: float) -> None:
        """Advances the service-rate estimate to `now`: the queue's state (held or empty) holds
        since the last call, as only calls change it."""
        if self._served_at is not None and now > self._served_at:
            dt = now - self._served_at
            keep = math.exp(-dt / self._horizon_s)
            self._served *= keep
            # time held, decayed continuously over the interval: integral of exp(-(now - t) / H)
            held = self._horizon_s * (1.0 - keep) if self._keys else 0.0
            self._backlogged_s = self._backlogged_s * keep + held
        self._served_at = now if self._served_at is None else max(self._served_at, now)

    def _dispatched(self, tokens: float) -> None:
        if self._keys:  # capacity-limited: something waits
            self._served += max(0.0, tokens)

    def _service_rate(self) -> float:
        """The pool's drain as measured while requests waited, with the predicted drain as a prior
        worth SERVICE_PRIOR_S of observation: the prediction alone counts only prefill, while the
        engines' steps also carry the decodes, so it overstates what leaves the queue under load."""
        return (self._served + self._rate * SERVICE_PRIOR_S) / (self._backlogged_s + SERVICE_PRIOR_S)

    def _wait_s(self, tokens: float, above: int = 0, shorter_tps: float = 0.0) -> float:
        """Time to drain `tokens` ahead when the classes ranked before `above` keep arriving, and
        `shorter_tps` more prefill tokens/s that go first (see _shorter_tps)."""
        if tokens <= 0:
            return 0.0
        # Arrivals still held are already in `tokens`: only the rest of each class's rate comes extra.
        rate = self._service_rate() - shorter_tps
        if above:  # (the sweep's per-request waits count no arrivals: no exp for them)
            filled = self._filled(self._arrived_s or 0.0)
            rate -= sum(max(0.0, self._arriving[c] / filled - self._tokens[c] / self._horizon_s)
                        for c in CLASSES[:above])
        return tokens / rate if rate > 0 else math.inf

    def _shorter_tps(self, cls: str, tokens: float, now: float) -> float:
        """Prefill tokens/s of class `cls` arriving in prompts of smaller size buckets than
        `tokens`, less what of them is held (already ahead): the demand the shorter-first shed
        serves before a prompt of this size."""
        rates, at, held = self._by_size[cls], self._by_size_at[cls], self._held_by_size[cls]
        horizon = self._horizon_s
        arriving = held_tokens = 0.0
        for i in range(size_bucket(tokens)):
            if rates[i]:
                arriving += rates[i] * math.exp(-max(0.0, now - at[i]) / horizon)
            held_tokens += held[i]
        return max(0.0, arriving / self._filled(now) - held_tokens / horizon)

    def _filled(self, now: float) -> float:
        """What the arrival rates (moving sums over the horizon) have filled of their steady value:
        1 - exp(-t / horizon) after t seconds of arrivals. Committing divides the rates by it,
        because an admission is then final: a router that starts under overload would otherwise
        count the higher classes' arrivals at a tenth of their rate in its first 0.2 s (2 s
        target) and hold lower-class requests that can only go late, while it sheds critical ones
        behind them (the unit-scale overload of tests/unit/test_fleetsim_admission.py: critical
        89 % and 29 requests late, against 96 % and none corrected). Without committing, a held
        request found too late is still rejected then, and the sum's slow start is left alone.
        One arrival is not yet a rate: the first starts the clock and is not counted (_count), and
        the first SERVICE_PRIOR_S count as filled, so that two arrivals close together are not
        read as a flood."""
        if self.cfg.decide_s is None or self._first_arrival_s is None:
            return 1.0
        t = max(SERVICE_PRIOR_S, now - self._first_arrival_s)
        return 1.0 - math.exp(-t / self._horizon_s)

    def _decay(self, now: float) -> None:
        if self._arrived_s is not None and now > self._arrived_s:
            keep = math.exp(-(now - self._arrived_s) / self._horizon_s)
            for c in CLASSES:
                self._arriving[c] *= keep
        self._arrived_s = now if self._arrived_s is None else max(self._arrived_s, now)

    def _count(self, cls: str, tokens: float, horizon_s: float, now: float) -> None:
        """An arriving request (admitted or not): its prefill joins its class's arrival rate, and
        its size bucket's, moving averages over the TTFT target (the horizon its successors' fate
        is decided in)."""
        if horizon_s > 0:
            self._horizon_s = horizon_s
        if self._first_arrival_s is None:
            self._first_arrival_s = now
            if self.cfg.decide_s is not None:
                return  # it starts the clock of the corrected rates (_filled): the rate is what follows it
        rate = max(0.0, tokens) / self._horizon_s
        self._arriving[cls] += rate
        b = size_bucket(tokens)
        rates, at = self._by_size[cls], self._by_size_at[cls]
        rates[b] = rates[b] * math.exp(-max(0.0, now - at[b]) / self._horizon_s) + rate
        at[b] = now

    def _retry_after(self, backlog_s: float) -> int:
        if not math.isfinite(backlog_s):
            return RETRY_AFTER_MAX_S
        return int(min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(backlog_s))))

    # ------------------------------------------------------------------ deciding

    def arrive(self, key: object, cls: str, now: float, deadline_s: float, place: Placement) -> Decision:
        """A new request of class `cls` whose TTFT must come by `deadline_s` (absolute)."""
        rank = _RANK[cls]
        if place.prefill_tps > 0:
            self._rate = place.prefill_tps
        self._decay(now)
        self._observe(now)
        remaining = deadline_s - now
        # Every arrival counts, admitted or not: the lower classes get what the higher ones'
        # demand leaves over, not what their admitted part does (which shrinks as they are
        # crowded out, and would let the lower classes crowd them out further).
        self._count(cls, place.prefill_tokens, remaining, now)
        before = (any(self._q[c] for c in CLASSES[:rank + 1]) or self._peers.holds_above(rank)
                  or self._peer_held_longer(cls, now, max(1.0, place.prefill_tokens), now))
        ttft_m = self.ttft_margin
        if rank == len(CLASSES) - 1 and any(now - self._refused_at[c] < self._horizon_s for c in CLASSES[:rank]):
            # A higher class was refused for want of capacity within the horizon: what this one
            # would take, that class needs (see "Higher classes refused"). Not noted as a refusal:
            # no class reads the lowest one's.
            return Decision(REJECT, SHED, self._retry_after(self._horizon_s))
        if not before and place.open and place.within_budget and place.open_ttft_s + ttft_m <= remaining:
            self._dispatched(place.prefill_tokens)
            return Decision(DISPATCH, open=place.open, ttft_s=place.open_ttft_s)
        # It waits for the prefill ahead of it and for its own prefill's worth of budget to free.
        own = max(1.0, place.prefill_tokens)
        own_wait = self._wait_s(self._tokens[cls] + own)
        # Shorter first: the shed test also counts its class's shorter prompts arriving meanwhile
        # as served before it (see "Shorter first" in the README), so that when the backlog cannot
        # take every prompt, the long ones are refused now, at arrival, and not the short ones later.
        shorter = self._shorter_tps(cls, own, now)
        if self.cfg.decide_s is None:
            all_wait = self._wait_s(sum(self._tokens[c] for c in CLASSES[:rank + 1]) + own + self._peer_ahead(rank),
                                    rank, shorter)
            predicted = all_wait
        else:
            # Every held request is a commitment served by its deadline, which comes before this
            # one's (same target, earlier arrival): the lower classes held are ahead of it too.
            predicted = self._wait_s(sum(self._tokens.values()) + own + self._peer_ahead(rank), rank, shorter)
            self._expire_margin(cls, now)
            own_wait += self._margin[cls]
            all_wait = predicted + self._margin[cls]
        if own_wait + place.ttft_s + ttft_m > remaining:
            # Its own deadline against its own class's queue, not capacity kept for others: a
            # client's tight deadline header must not shed the classes below it.
            return self._refused(cls, now, Decision(REJECT, DEADLINE_UNMEETABLE, self._retry_after(
                all_wait + place.ttft_s - remaining)), capacity=False)
        if all_wait + place.ttft_s + ttft_m > remaining:
            return self._refused(cls, now, Decision(REJECT, SHED,
                                                    self._retry_after(all_wait + place.ttft_s - remaining)))
        if rank > 0 and not place.within_budget:
            # Over its class's fraction of the router's budget share: the rest is kept for the
            # higher classes, so it would go only once they leave room, which under overload they
            # do not before its deadline (measured: such requests were rejected at it).
            return self._refused(cls, now, Decision(REJECT, SHED, self._retry_after(all_wait + place.ttft_s)))
        limit = self.cfg.limits[cls]
        if len(self._q[cls]) >= limit.max_queue or limit.max_wait_s <= 0:
            return self._refused(cls, now, Decision(REJECT, QUEUE_FULL, self._retry_after(all_wait)))
        if key in self._keys:
            raise ValueError("admission: key already held")
        h = Held(key, cls, max(1.0, place.prefill_tokens), now, deadline_s, now + limit.max_wait_s, place.ttft_s,
                 predicted)
        self._q[cls].append(h)
        self._tokens[cls] += h.prefill_tokens
        self._held_by_size[cls][size_bucket(h.prefill_tokens)] += h.prefill_tokens
        self._keys[key] = h
        return Decision(HOLD)

    def _refused(self, cls: str, now: float, d: Decision, capacity: bool = True) -> Decision:
        """A refusal of class `cls`; `capacity`: for want of capacity (see "Higher classes refused")."""
        if capacity and now > self._refused_at[cls]:
            self._refused_at[cls] = now
        return d

    def sweep(self, now: float) -> list[tuple[Held, Decision]]:
        """Rejects the held requests that timed out or can no longer meet their deadline from
        their place in the queue; returns them (removed) with their decisions."""
        out: list[tuple[Held, Decision]] = []
        ahead_all = 0.0
        self._decay(now)
        self._observe(now)
        for c in CLASSES:
            ahead_own = 0.0
            keep: deque[Held] = deque()
            for h in self._q[c]:
                if now >= h.expire_s:
                    out.append((h, Decision(REJECT, QUEUE_TIMEOUT, self._retry_after(self._wait_s(ahead_all)))))
                    continue
                remaining = h.deadline_s - now
                # Once held it is not shed for the higher classes ahead of it or arriving: it goes
                # first when urgent, so only its own class ahead of it can make it too late. Once
                # committed, not even that.
                t_own = self._wait_s(ahead_own + h.prefill_tokens) + h.ttft_s + self.ttft_margin
                if t_own > remaining and not self.committed(h, now):
                    out.append((h, Decision(REJECT, DEADLINE_UNMEETABLE, self._retry_after(t_own - remaining))))
                    continue
                keep.append(h)
                ahead_own += h.prefill_tokens
            self._q[c] = keep
            ahead_all += ahead_own
        for h, d in out:  # held too long, or too late from its place: capacity it did not get
            self._refused(h.cls, now, d)
            self._forget(h)
        return out

    def _urgent(self, h: Held, now: float) -> bool:
        return now >= self._last_start(h) - self.cfg.urgent_s

    def _last_start(self, h: Held) -> float:
        """The last moment its dispatch still meets its deadline, as predicted (with the TTFT margin)."""
        return h.deadline_s - h.ttft_s - self.ttft_margin

    def committed(self, h: Held, now: float) -> bool:
        """Held for `decide_s` or longer: served, late if it must, never rejected for its deadline."""
        return self.cfg.decide_s is not None and now - h.arrival_s >= self.cfg.decide_s

    def candidates(self, now: float) -> list[Held]:
        """Whom to try next, in order: the urgent class heads (within `urgent_s` of their last
        moment to be dispatched in time), earliest first, then the head in class order. Nothing
        goes before a held critical request with less than two urgency windows of slack left, this
        router's or a peer's: promoting lower classes past critical ones regardless cost critical
        requests their deadline (Azure conversation at 1.5x capacity: 100 -> 97.6 %; one window:
        99.2 %)."""
        head = self.head()
        crit = self._q[CRITICAL]
        if crit and self._last_start(crit[0]) - now < 2 * self.cfg.urgent_s:
            return [head]  # type: ignore[list-item]
        # A peer's critical head short of slack: only ours may go. One more than two windows past
        # its last start went or was rejected, or, committed (decide_s), waits to go late, when
        # holding this router back no longer saves its deadline: a report that has not caught up
        # with that does not stop this router. (Our own late committed head still goes first.)
        if self._peers.critical_near(now, 2 * self.cfg.urgent_s):
            return [head] if crit else []  # type: ignore[list-item]
        urgent = sorted((q[0] for q in self._q.values() if q and self._urgent(q[0], now)),
                        key=lambda h: (self._last_start(h), _RANK[h.cls], h.arrival_s))
        if (head is None or head in urgent or self._peers.holds_above(_RANK[head.cls])
                or self._peer_held_longer(head.cls, head.arrival_s, head.prefill_tokens, now)):
            return urgent
        return urgent + [head]

    def try_head(self, now: float, place: Placement) -> tuple[Held, Decision] | None:
        """The head with its fresh predictions: dispatched (removed), rejected (removed), or
        still held (None is returned only when nothing is held)."""
        h = self.head()
        return None if h is None else self.try_held(h, now, place)

    def try_held(self, h: Held, now: float, place: Placement) -> tuple[Held, Decision]:
        """A class head (see `candidates`) with its fresh predictions: dispatched (removed),
        rejected (removed) or still held."""
        if not self._q[h.cls] or self._q[h.cls][0] is not h:
            raise ValueError("admission: only the head of a class queue may be tried")
        if place.prefill_tps > 0:
            self._rate = place.prefill_tps
        self._observe(now)
        h.ttft_s = place.ttft_s
        remaining = h.deadline_s - now - self.ttft_margin  # what its predicted TTFT may take
        if now >= h.expire_s:
            d = Decision(REJECT, QUEUE_TIMEOUT, self._retry_after(place.ttft_s))
        elif place.open and place.within_budget and place.open_ttft_s <= remaining:
            d = Decision(DISPATCH, open=place.open, ttft_s=place.open_ttft_s)
        elif place.ttft_s > remaining and self.committed(h, now):
            # Late: served all the same (decide_s), and over the router's budget share: it was
            # admitted within the share, which has moved since, and waiting for it would end in
            # a rejection at its max wait (measured: 147 sheddable requests after 30 s, Azure
            # conversation at 1.5x capacity).
            if not place.open:
                return h, Decision(HOLD)
            d = Decision(DISPATCH, open=place.open, ttft_s=place.open_ttft_s)
        elif place.ttft_s > remaining:
            d = Decision(REJECT, DEADLINE_UNMEETABLE, self._retry_after(place.ttft_s - remaining))
        else:
            return h, Decision(HOLD)
        if d.action == DISPATCH:
            self._dispatched(h.prefill_tokens)
            if self.cfg.decide_s is not None:
                self._measured_wait(h, now)
        else:
            self._refused(h.cls, now, d)
        self._q[h.cls].popleft()
        self._forget(h)
        return h, d

    def observe_ttft(self, predicted_s: float, realized_s: float) -> None:
        """A dispatched request's first token: `realized_s` after it was sent, where the dispatch
        counted on `predicted_s` (its Decision's ttft_s). Sets the TTFT margin."""
        q = self.cfg.ttft_quantile
        if q is None or not (math.isfinite(predicted_s) and math.isfinite(realized_s) and realized_s >= 0):
            return
        self._ttft_errors.append(realized_s - predicted_s)
        self._ttft_since += 1
        if self._ttft_since >= TTFT_EVERY and len(self._ttft_errors) >= TTFT_MIN_SAMPLES:
            self._ttft_since = 0
            ranked = sorted(self._ttft_errors)
            self.ttft_margin = max(0.0, ranked[int(q * (len(ranked) - 1))])

    def _measured_wait(self, h: Held, now: float) -> None:
        """A held request goes: its actual wait against the one predicted at its arrival."""
        if h.wait_s <= 0 or not math.isfinite(h.wait_s):
            return
        r = self._errors[h.cls]
        r.append((now - h.arrival_s) - h.wait_s)
        self._measured[h.cls] += 1
        self._measured_at[h.cls] = now
        if self._measured[h.cls] % WAIT_EVERY == 0:
            ranked = sorted(r)
            self._margin[h.cls] = max(0.0, ranked[min(len(ranked) - 1, int(self.cfg.wait_quantile * len(ranked)))])

    def _expire_margin(self, cls: str, now: float) -> None:
        """Drops the class's measured errors once nothing of it has been held, nor measured, for
        its max wait: the queue they describe has turned over. Without this a margin larger than
        the class's TTFT target would stay for good: every request of the class that has to wait
        is rejected at arrival, so none is held, none is measured, and the margin never falls."""
        if (self._margin[cls] > 0 and not self._q[cls]
                and now - self._measured_at[cls] > self.cfg.limits[cls].max_wait_s):
            self._errors[cls].clear()
            self._margin[cls] = 0.0
            self._measured[cls] = 0

    def remove(self, key: object) -> bool:
        """A held request that left (client disconnect): gone at once."""
        h = self._keys.get(key)
        if h is None:
            return False
        self._q[h.cls].remove(h)
        self._forget(h)
        return True

    def _forget(self, h: Held) -> None:
        self._keys.pop(h.key, None)
        if self._q[h.cls]:
            self._tokens[h.cls] = max(0.0, self._tokens[h.cls] - h.prefill_tokens)
            held = self._held_by_size[h.cls]
            b = size_bucket(h.prefill_tokens)
            held[b] = max(0.0, held[b] - h.prefill_tokens)
        else:  # nothing of its class held: no rounding left over
            self._tokens[h.cls] = 0.0
            self._held_by_size[h.cls] = [0.0] * SIZE_BUCKETS


def pump(queue: AdmissionQueue, now: float, predict: Callable[[Held], Placement],
         dispatch: Callable[[Held, Decision], None], reject: Callable[[Held, Decision], None],
         max_dispatch: int | None = None) -> None:
    """What a router does whenever capacity may have freed (a first token, a completion, a new
    table, a timer): reject what can no longer make it, then dispatch the candidates (urgent
    heads, then class order) while one can go: one that cannot does not block the next (at most
    `max_dispatch`; the live router sends one at a time, so the next prediction sees it
    dispatched). `predict(held)` gives a candidate's fresh placement."""
    for h, d in queue.sweep(now):
        reject(h, d)
    sent = 0
    while max_dispatch is None or sent < max_dispatch:
        for h in queue.candidates(now):
            h, d = queue.try_held(h, now, predict(h))
            if d.action != HOLD:
                break
        else:
            return  # nothing held, or nothing can go yet
        if d.action == DISPATCH:
            dispatch(h, d)
            sent += 1
        else:
            reject(h, d)
