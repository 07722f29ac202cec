"""A vLLM-V1-like engine core: scheduler, paged KV cache with prefix caching, and step-time model.

Pure and clock-free: time is whatever the caller says it is. Two ways to drive it:

- ``step(now_s)`` runs one iteration starting at ``now_s`` and returns what every scheduled request
  got; the live server sleeps the step's duration on its event loop's clock.
- ``advance(until_s)`` runs, on the engine's own clock (``clock_s``), every step that *starts*
  before ``until_s`` and returns the ``RequestEvent``s (first token, finished, preempted, aborted);
  the virtual-time fleet simulator calls it. Each step starts where the previous one ended; an idle
  engine's clock jumps to the next waiting request's arrival. Stretches of pure decode steps are
  computed in closed form (see ``_fast_forward``), with the same results as step by step.

Each step (one forward pass), like vLLM V1's scheduler:

1. Running requests first, in admission order. Each is given the tokens it still has to compute
   (1 for a decode; the rest of its prompt for a partially prefilled one), capped by what is left
   of ``max_num_batched_tokens`` (chunked prefill). The KV cache must hold
   ``ceil((computed + new) / block_size)`` blocks for it; when it cannot, the most recently
   admitted running request is preempted (recompute: its blocks are released, its progress reset,
   and it goes back to the front of the waiting queue), until the request fits or is itself the
   victim. Preemptions are counted (``vllm:num_preemptions_total``).
2. If nothing was preempted in this step, waiting requests that have arrived (``arrival_s <=``
   step start) are admitted in FCFS order while tokens remain in the budget, fewer than
   ``max_num_seqs`` run, and their blocks fit. Requests should be added in arrival order.
3. Every scheduled request advances by its tokens. A request whose computed tokens reach its
   prompt plus the outputs so far samples one output token (the first one when its prefill
   completes). After exactly ``max_tokens`` outputs it finishes (the simulator has no EOS) and
   releases its blocks.

A preempted request keeps the tokens it already produced; on re-admission it recomputes prompt
and outputs as one prefill (minus what the prefix cache still holds), then continues, so its
output count still ends at ``max_tokens``. Recomputed tokens cost step time like any other and are
counted in ``recomputed_tokens_total``.

Automatic prefix caching (vLLM V1's KV cache manager, simplified):

- A request's ``prefix_hashes`` give one id per ``hash_block_tokens`` tokens of its prompt (16 by
  default, one per engine block; Mooncake traces give one per 512 tokens). ``hash_block_tokens``
  must be a multiple of ``block_size``: hash ``i`` covers engine blocks ``i * k .. i * k + k - 1``
  with ``k = hash_block_tokens // block_size``. Only *full* engine blocks of the prompt that some
  hash covers are cacheable. Ids are chained (block j's key depends on every id before it), so an
  id means "this block, after this exact prefix", as vLLM's block hashes do.
- When a prompt block has been computed in full it is registered in the cache (unless an equal
  block is already there; then the request keeps its own copy, as vLLM does). Cached blocks are
  shared by reference count: a request admitted later whose leading keys are resident takes a
  reference on each of them instead of computing them. At least the prompt's last token is always
  computed (a full hit recomputes the last block), so prefill tokens = prompt - hits, in whole
  blocks.
- A cached block whose reference count drops to zero stays resident and counts as *free* (KV
  usage excludes it, as in vLLM); blocks are evicted least-recently-released first when an
  allocation needs room. A request's blocks are released tail first, so its tail is evicted first.
- Each admission queries the cache: ``prefix_cache_queries_total`` += the request's tokens,
  ``prefix_cache_hits_total`` += the tokens it found resident (vLLM V1's counters).

Output blocks and uncovered prompt blocks are private to their request and freed at once.
"""

from __future__ import annotations

import enum
import math
import random
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from tidegate.errors import PromptTooLargeError, RequestError
from tidegate.simulator.profiles import Profile

DEFAULT_MAX_TOKENS = 256
EVENT_KINDS = ("first_token", "finished", "preempted", "aborted")
# vLLM's bounds for vllm:iteration_tokens_total (vllm/v1/metrics/loggers.py); +Inf is implied.
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False)
class _Request:
    req_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    prefix_hashes: tuple
    keys: tuple[int, ...] = ()  # chained cache keys of the prompt's cacheable blocks
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    held: list[int] = field(default_factory=list)  # cache keys this request holds a reference on
    num_private: int = 0  # blocks of its own (not in the prefix cache)
    num_registered: int = 0  # leading cacheable blocks already looked up or registered
    high_water: int = 0  # most tokens ever computed: below it, computing again is recompute
    computed_total: int = 0
    cached_tokens: int = 0  # prefix-cache hit tokens at its first admission
    first_token_s: float | None = None
    last_token_s: float | None = None
    scheduled_s: float | None = None  # start of the first step that scheduled it (vLLM's scheduled_ts)
    num_preemptions: int = 0
    stamp_s: float | None = None  # when its `stamp_output`-th output token was sampled

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV must exist before the next output can be sampled."""
        return self.prompt_tokens + self.num_output

    @property
    def num_blocks(self) -> int:
        return len(self.held) + self.num_private


@dataclass(frozen=True)
class RequestOutput:
    """What one request got from one step. Times are engine times (step start + duration)."""

    req_id: str
    new_tokens: int  # 0 (prefill chunk that did not complete) or 1
    num_output_tokens: int  # outputs so far, including this step's
    first_token: bool
    finished: bool
    finish_reason: str | None  # "length" when finished
    prompt_tokens: int
    ttft_s: float | None  # set on the first token
    itl_s: float | None  # set on later tokens: time since the previous token
    e2e_s: float | None  # set when finished
    # Set when finished: first token minus first scheduled (vLLM V1 observes
    # vllm:request_prefill_time_seconds for a request when it finishes).
    prefill_s: float | None = None


@dataclass(frozen=True)
class RequestEvent:
    """Something that happened to a request during ``advance``; ``t_s`` is engine time.
    kind: "first_token" (end of the step that sampled it), "finished" (end of its last step),
    "preempted" (start of the step that preempted it), "aborted" (when abort() was called)."""

    req_id: str
    kind: str
    t_s: float


@dataclass(frozen=True)
class RequestResult:
    """What became of a request that left the engine (finished or aborted). Times are engine times."""

    req_id: str
    status: Status
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float | None
    ttft_s: float | None
    finish_s: float | None  # None when aborted
    preemptions: int
    cached_tokens: int  # prompt tokens served by the prefix cache at first admission
    computed_tokens: int  # tokens computed for it, recomputation included
    # When its `stamp_output`-th output token was sampled (the engine's argument; None: off or
    # not reached). What a client timing that token sees, e.g. the router's early TPOT.
    stamp_s: float | None = None


@dataclass(frozen=True)
class StepResult:
    start_s: float
    duration_s: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    outputs: tuple[RequestOutput, ...]
    num_preempted: int
    preempted: tuple[str, ...]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def finished(self) -> tuple[str, ...]:
        return tuple(o.req_id for o in self.outputs if o.finished)


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    used_blocks: int  # held by requests; free-but-cached blocks are not counted (as in vLLM)
    num_gpu_blocks: int
    block_size: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    requests_finished_total: int
    requests_aborted_total: int
    cached_blocks: int = 0  # resident prefix-cache blocks, in use or free
    prefix_cache_queries_total: int = 0  # tokens looked up at admission
    prefix_cache_hits_total: int = 0  # tokens found resident at admission
    recomputed_tokens_total: int = 0  # tokens computed again after a preemption
    steps_total: int = 0
    # Per-step accounting as vLLM V1 exports it (the rate estimator's inputs): a step's tokens are
    # the prompt tokens of requests whose prefill completed in it plus the tokens it sampled
    # (vllm:iteration_tokens_total); iteration_tokens_counts[i] counts steps with at most
    # ITERATION_TOKENS_BUCKETS[i] such tokens (the last entry: more than the last bound).
    step_tokens_total: int = 0
    iteration_tokens_counts: tuple[int, ...] = ()
    itl_sum_s: float = 0.0  # sum over sampled non-first tokens of the time since the previous token
    itl_count: int = 0
    busy_s: float = 0.0  # summed step durations
    # vllm:request_prefill_time_seconds _sum/_count: per finished request, first token minus the
    # start of its first scheduled step (how long its prefill spanned, chunks and all).
    prefill_time_sum_s: float = 0.0
    prefill_time_count: int = 0

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_gpu_blocks

    @property
    def kv_free_tokens(self) -> int:
        return (self.num_gpu_blocks - self.used_blocks) * self.block_size


@dataclass
class _Counters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    queries: int = 0
    hits: int = 0
    recomputed: int = 0
    steps: int = 0
    step_tokens: int = 0
    itl_sum_s: float = 0.0
    itl_count: int = 0
    busy_s: float = 0.0
    prefill_time_sum_s: float = 0.0
    prefill_time_count: int = 0
    iteration_buckets: list[int] = field(default_factory=lambda: [0] * (len(ITERATION_TOKENS_BUCKETS) + 1))

    def count_step(self, tokens: int, duration_s: float, n: int = 1) -> None:
        """`n` steps of `tokens` (vLLM's per-step token count) lasting `duration_s` in all."""
        self.steps += n
        self.step_tokens += tokens * n
        self.busy_s += duration_s
        self.iteration_buckets[bisect_left(ITERATION_TOKENS_BUCKETS, tokens)] += n


class Engine:
    """One simulated engine replica. Not thread-safe; no asyncio, no clock.

    ``keep_results`` keeps a ``RequestResult`` per request that left the engine, until
    ``pop_result``; a long-running server passes False. ``stamp_output`` > 0 records in each
    result when that output token (1 = the first) was sampled. ``jitter_frac`` multiplies each step time
    by a uniform factor in [1 - j, 1 + j] (it disables the closed-form fast-forward of advance)."""

    def __init__(self, profile: Profile, rng: random.Random | None = None, jitter_frac: float = 0.0, *,
                 enable_prefix_caching: bool = True, keep_results: bool = True, stamp_output: int = 0) -> None:
        if not 0.0 <= jitter_frac < 1.0:
            raise ValueError("jitter_frac must be in [0, 1)")
        self._stamp = stamp_output
        self.profile = profile
        self.enable_prefix_caching = enable_prefix_caching
        self._rng = rng or random.Random(0)
        self._jitter = jitter_frac
        self._keep_results = keep_results
        self._requests: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._private = 0  # blocks held privately by requests
        self._ref: dict[int, int] = {}  # resident cached block key -> reference count
        self._lru: OrderedDict[int, None] = OrderedDict()  # keys with no reference, oldest release first
        self._c = _Counters()
        self._clock = 0.0
        self._pending: list[RequestEvent] = []
        self._results: dict[str, RequestResult] = {}

    # ------------------------------------------------------------------ requests

    @property
    def clock_s(self) -> float:
        """Engine time: the end of the last step (or the arrival it jumped to when idle)."""
        return self._clock

    def default_max_tokens(self, prompt_tokens: int) -> int:
        return max(1, min(DEFAULT_MAX_TOKENS, self.profile.max_model_len - prompt_tokens))

    def check_request(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise RequestError / PromptTooLargeError when the request cannot be served."""
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, int) or prompt_tokens < 1:
            raise RequestError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        cap = self.profile.kv_capacity_tokens
        if prompt_tokens > cap:
            raise PromptTooLargeError(
                f"prompt of {prompt_tokens} tokens is larger than the whole KV cache ({cap} tokens)"
            )
        limit = self.profile.max_model_len
        if prompt_tokens + max_tokens > limit:
            raise PromptTooLargeError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
                "completion). Please reduce the length of the prompt or completion."
            )

    def _cache_keys(self, prompt_tokens: int, prefix_hashes: Sequence[Hashable], hash_block_tokens: int) -> tuple:
        bs = self.profile.block_size
        if isinstance(hash_block_tokens, bool) or not isinstance(hash_block_tokens, int) or hash_block_tokens < 1 \
                or hash_block_tokens % bs:
            raise RequestError(f"hash_block_tokens must be a positive multiple of the block size {bs}, "
                               f"got {hash_block_tokens!r}")
        if not self.enable_prefix_caching or not prefix_hashes:
            return ()
        per = hash_block_tokens // bs
        n = min(prompt_tokens // bs, len(prefix_hashes) * per)
        keys = []
        parent: int | None = None
        for j in range(n):
            parent = hash((parent, prefix_hashes[j // per], j % per))
            keys.append(parent)
        return tuple(keys)

    def add_request(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int | None,
        arrival_s: float,
        prefix_hashes: Sequence[Hashable] = (),
        hash_block_tokens: int = 16,
    ) -> None:
        """Queue a request. `max_tokens` None means default_max_tokens(prompt_tokens).
        `prefix_hashes`: one prefix-block id per `hash_block_tokens` prompt tokens (see the module doc)."""
        if req_id in self._requests:
            raise RequestError(f"request id {req_id!r} is already in the engine")
        if max_tokens is None and isinstance(prompt_tokens, int):
            max_tokens = self.default_max_tokens(prompt_tokens)
        self.check_request(prompt_tokens, max_tokens)
        hashes = tuple(prefix_hashes)
        keys = self._cache_keys(prompt_tokens, hashes, hash_block_tokens)
        req = _Request(req_id, prompt_tokens, int(max_tokens), arrival_s, hashes, keys)
        self._requests[req_id] = req
        self._waiting.append(req)

    def abort(self, req_id: str, now_s: float | None = None) -> bool:
        """Drop a request and free its blocks. False when it is unknown or already done.
        The "aborted" event (returned by the next advance) is stamped `now_s`, else the engine clock."""
        req = self._requests.pop(req_id, None)
        if req is None:
            return False
        if req.status is Status.RUNNING:
            self._running.remove(req)
        elif req.status is Status.WAITING:
            self._waiting.remove(req)
        self._free(req)
        req.status = Status.ABORTED
        self._c.aborted += 1
        t = self._clock if now_s is None else now_s
        self._pending.append(RequestEvent(req_id, "aborted", t))
        self._record(req, None)
        return True

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def has_request(self, req_id: str) -> bool:
        return req_id in self._requests

    def next_step_s(self) -> float | None:
        """When the next step would start under advance(); None when there is nothing to do."""
        if self._running:
            return self._clock
        if self._waiting:
            return max(self._clock, self._waiting[0].arrival_s)
        return None

    def request_result(self, req_id: str) -> RequestResult | None:
        return self._results.get(req_id)

    def pop_result(self, req_id: str) -> RequestResult | None:
        return self._results.pop(req_id, None)

    def _record(self, req: _Request, finish_s: float | None) -> None:
        if not self._keep_results:
            return
        ttft = None if req.first_token_s is None else req.first_token_s - req.arrival_s
        self._results[req.req_id] = RequestResult(
            req.req_id, req.status, req.arrival_s, req.prompt_tokens, req.num_output, req.first_token_s, ttft,
            finish_s, req.num_preemptions, req.cached_tokens, req.computed_total, req.stamp_s)

    # ------------------------------------------------------------------ KV cache

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.profile.block_size)

    def _free_physical(self) -> int:
        return self.profile.num_gpu_blocks - self._private - len(self._ref)

    def _evict(self, n: int) -> None:
        for _ in range(n):
            key, _ = self._lru.popitem(last=False)
            del self._ref[key]

    def _allocate(self, req: _Request, total_tokens: int) -> bool:
        need = self._blocks_for(total_tokens) - req.num_blocks
        if need <= 0:
            return True
        free = self._free_physical()
        if need > free + len(self._lru):
            return False
        if need > free:
            self._evict(need - free)
        req.num_private += need
        self._private += need
        return True

    def _lookup(self, req: _Request) -> int:
        """Leading cacheable blocks of `req` resident in the cache, leaving at least one token to compute."""
        hits = 0
        ref = self._ref
        for key in req.keys:
            if key not in ref:
                break
            hits += 1
        return min(hits, (req.num_tokens - 1) // self.profile.block_size)

    def _admit_cost(self, req: _Request, budget: int) -> tuple[int, int, int] | None:
        """(hit blocks, tokens to schedule, blocks to allocate) when `req` can be admitted now, else None."""
        hits = self._lookup(req)
        bs = self.profile.block_size
        n = min(req.num_tokens - hits * bs, budget)
        need = self._blocks_for(hits * bs + n) - hits
        reclaimable = len(self._lru) - sum(1 for k in req.keys[:hits] if self._ref[k] == 0)
        if need > self._free_physical() + reclaimable:
            return None
        return hits, n, need

    def _take_hits(self, req: _Request, hits: int) -> None:
        for key in req.keys[:hits]:
            r = self._ref[key]
            if r == 0:
                del self._lru[key]
            self._ref[key] = r + 1
            req.held.append(key)
        req.num_registered = hits
        req.num_computed = hits * self.profile.block_size

    def _register_full_blocks(self, req: _Request) -> None:
        full = min(req.num_computed // self.profile.block_size, len(req.keys))
        for j in range(req.num_registered, full):
            key = req.keys[j]
            if key not in self._ref:
                self._ref[key] = 1
                req.held.append(key)
                req.num_private -= 1
                self._private -= 1
        if full > req.num_registered:
            req.num_registered = full

    def _free(self, req: _Request) -> None:
        self._private -= req.num_private
        req.num_private = 0
        for key in reversed(req.held):
            r = self._ref[key] - 1
            self._ref[key] = r
            if r == 0:
                self._lru[key] = None
        req.held = []
        req.num_registered = 0

    def _preempt(self, req: _Request) -> None:
        self._free(req)
        req.num_computed = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self._waiting.appendleft(req)
        self._c.preemptions += 1

    # ------------------------------------------------------------------ the step

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one iteration starting at `now_s`; the engine clock moves to its end."""
        return self._step(now_s, None)

    def _step(self, now_s: float, events: list[RequestEvent] | None) -> StepResult:
        p = self.profile
        budget = p.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        preempted: list[str] = []

        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            ok = True
            while not self._allocate(req, req.num_computed + n):
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim.req_id)
                if events is not None:
                    events.append(RequestEvent(victim.req_id, "preempted", now_s))
                if victim is req:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1

        if not preempted:
            while self._waiting and budget > 0 and len(self._running) < p.max_num_seqs:
                req = self._waiting[0]
                if req.arrival_s > now_s:
                    break
                admit = self._admit_cost(req, budget)
                if admit is None:
                    break
                hits, n, _ = admit
                self._take_hits(req, hits)
                if not self._allocate(req, req.num_computed + n):  # pragma: no cover - _admit_cost said it fits
                    raise AssertionError("admission check and allocation disagree")
                self._c.queries += req.num_tokens
                self._c.hits += req.num_computed
                if req.num_preemptions == 0:
                    req.cached_tokens = req.num_computed
                self._waiting.popleft()
                req.status = Status.RUNNING
                self._running.append(req)
                scheduled.append((req, n))
                budget -= n

        n_tokens = 0
        ctx = 0
        for req, n in scheduled:
            n_tokens += n
            ctx += req.num_computed + n
        duration_ms = p.cost.step_ms(n_tokens, ctx)
        if self._jitter and duration_ms > 0:
            duration_ms *= 1.0 + self._rng.uniform(-self._jitter, self._jitter)
        duration_s = duration_ms / 1000.0
        end_s = now_s + duration_s
        iteration_tokens = 0

        outputs: list[RequestOutput] = []
        prefill_tokens = decode_tokens = 0
        for req, n in scheduled:
            is_decode = n == 1 and req.num_output > 0 and req.num_computed + 1 == req.num_tokens
            if is_decode:
                decode_tokens += n
            else:
                prefill_tokens += n
            if req.scheduled_s is None:
                req.scheduled_s = now_s
            before = req.num_computed
            req.num_computed += n
            req.computed_total += n
            if before < req.high_water:
                self._c.recomputed += min(req.num_computed, req.high_water) - before
            if req.num_computed > req.high_water:
                req.high_water = req.num_computed
            if req.num_registered < len(req.keys):
                self._register_full_blocks(req)
            if req.num_computed < req.num_tokens:
                outputs.append(RequestOutput(req.req_id, 0, req.num_output, False, False, None,
                                             req.prompt_tokens, None, None, None))
                continue
            req.num_output += 1
            if req.num_output == self._stamp:
                req.stamp_s = end_s
            self._c.generation_tokens += 1
            first = req.num_output == 1
            ttft = itl = e2e = None
            iteration_tokens += 1
            if first:
                self._c.prompt_tokens += req.prompt_tokens
                iteration_tokens += req.prompt_tokens
                req.first_token_s = end_s
                ttft = end_s - req.arrival_s
                if events is not None:
                    events.append(RequestEvent(req.req_id, "first_token", end_s))
            else:
                itl = end_s - (req.last_token_s if req.last_token_s is not None else end_s)
                self._c.itl_sum_s += itl
                self._c.itl_count += 1
            req.last_token_s = end_s
            done = req.num_output >= req.max_tokens
            prefill_s = None
            if done:
                e2e = end_s - req.arrival_s
                if req.first_token_s is not None and req.scheduled_s is not None:
                    prefill_s = req.first_token_s - req.scheduled_s
                    self._c.prefill_time_sum_s += prefill_s
                    self._c.prefill_time_count += 1
                self._running.remove(req)
                self._free(req)
                req.status = Status.FINISHED
                del self._requests[req.req_id]
                self._c.finished += 1
                self._record(req, end_s)
                if events is not None:
                    events.append(RequestEvent(req.req_id, "finished", end_s))
            outputs.append(RequestOutput(req.req_id, 1, req.num_output, first, done,
                                         "length" if done else None, req.prompt_tokens, ttft, itl, e2e, prefill_s))

        if n_tokens:
            self._c.count_step(iteration_tokens, duration_s)
        self._clock = end_s
        return StepResult(
            start_s=now_s,
            duration_s=duration_s,
            num_scheduled_tokens=n_tokens,
            num_prefill_tokens=prefill_tokens,
            num_decode_tokens=decode_tokens,
            outputs=tuple(outputs),
            num_preempted=len(preempted),
            preempted=tuple(preempted),
        )

    # ------------------------------------------------------------------ virtual time

    def advance(self, until_s: float, *, fast: bool = True) -> list[RequestEvent]:
        """Run every step that starts before `until_s` on the engine clock; return what happened,
        in order (events of aborts since the last call first). `fast=False` runs step by step
        (the reference for the closed-form fast-forward)."""
        events = self._pending
        self._pending = []
        fast = fast and not self._jitter
        while True:
            if not self._running:
                if not self._waiting:
                    break
                arrival = self._waiting[0].arrival_s
                if arrival > self._clock:
                    if arrival >= until_s:
                        break
                    self._clock = arrival
            if self._clock >= until_s:
                break
            if fast and self._fast_forward(until_s):
                continue
            res = self._step(self._clock, events)
            if res.num_scheduled_tokens == 0:  # pragma: no cover - validated requests always fit an idle engine
                break
        return events

    def _fast_forward(self, until_s: float) -> bool:
        """Run k >= 1 pure-decode steps in closed form, when the next steps are all alike: every
        running request decodes one token, none finishes, nothing waiting can be admitted (or it
        has not arrived yet) and the new blocks they need fit without preempting. Each such step
        schedules R tokens and reads C0 + R*j tokens of context (j = 0, 1, ...), so its duration
        is a + b*(C0 + R*j) ms and the start of step j is t0 + S(j) with
        S(j) = j*(a + b*C0) + b*R*j*(j-1)/2 (an arithmetic series). k stops before the first
        finish, before the first step that would start at or after `until_s` (or the waiting
        head's arrival), and where the blocks run out. False when no such stretch starts here."""
        running = self._running
        p = self.profile
        r_count = len(running)
        if r_count == 0 or r_count > p.max_num_batched_tokens:
            return False
        left = math.inf
        ctx0 = 0
        for req in running:
            c = req.num_computed
            if req.num_output == 0 or c != req.prompt_tokens + req.num_output - 1 or c < req.high_water:
                return False
            rem = req.max_tokens - req.num_output
            if rem < left:
                left = rem
            ctx0 += c + 1
        k_cap = int(left) - 1  # the finishing step runs through _step
        if k_cap < 1:
            return False
        t0 = self._clock
        t_limit = until_s
        if self._waiting:
            head = self._waiting[0]
            if head.arrival_s > t0:
                t_limit = min(t_limit, head.arrival_s)
            elif r_count < p.max_num_seqs and p.max_num_batched_tokens - r_count > 0 \
                    and self._admit_cost(head, p.max_num_batched_tokens - r_count) is not None:
                return False

        cost = p.cost
        a = cost.overhead_ms + cost.linear_ms(r_count) + cost.lm_head_ms + cost.attn_base_ms
        b = cost.attn_ms_per_1k_ctx / 1000.0
        lin = a + b * ctx0  # ms, duration of step 0
        quad = b * r_count / 2.0  # S(j) = lin*j + quad*j*(j-1)

        def elapsed_ms(j: int) -> float:
            return lin * j + quad * j * (j - 1)

        budget_ms = (t_limit - t0) * 1000.0
        if math.isfinite(budget_ms) and (lin > 0 or quad > 0):
            # steps 0..k-1 must start before t_limit: the largest m = k-1 with S(m) < budget_ms.
            if quad > 0:
                bq = lin - quad
                m = int((-bq + math.sqrt(bq * bq + 4 * quad * budget_ms)) / (2 * quad))
            else:
                m = int(budget_ms / lin)
            m = max(0, min(m, k_cap))
            while m > 0 and t0 + elapsed_ms(m) / 1000.0 >= t_limit:
                m -= 1
            while m + 1 < k_cap and t0 + elapsed_ms(m + 1) / 1000.0 < t_limit:
                m += 1
            k = min(k_cap, m + 1)
        else:
            k = k_cap

        avail = self._free_physical() + len(self._lru)

        def blocks_needed(steps: int) -> int:
            total = 0
            for req in running:
                extra = self._blocks_for(req.num_computed + steps) - req.num_blocks
                if extra > 0:
                    total += extra
            return total

        if blocks_needed(k) > avail:
            lo, hi = 0, k  # blocks_needed(lo) fits, blocks_needed(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if blocks_needed(mid) <= avail:
                    lo = mid
                else:
                    hi = mid
            k = lo
        if k < 1:
            return False

        need = blocks_needed(k)
        free = self._free_physical()
        if need > free:
            self._evict(need - free)
        end_s = t0 + elapsed_ms(k) / 1000.0
        for req in running:
            extra = self._blocks_for(req.num_computed + k) - req.num_blocks
            if extra > 0:
                req.num_private += extra
                self._private += extra
            req.num_computed += k
            req.high_water = req.num_computed
            req.computed_total += k
            if 0 < self._stamp - req.num_output <= k:  # sampled by step j = stamp - num_output of these k
                req.stamp_s = t0 + elapsed_ms(self._stamp - req.num_output) / 1000.0
            req.num_output += k
            # The k tokens' gaps telescope: their sum is the time since the token before them.
            self._c.itl_sum_s += end_s - (req.last_token_s if req.last_token_s is not None else t0)
            req.last_token_s = end_s
        self._c.generation_tokens += k * r_count
        self._c.itl_count += k * r_count
        self._c.count_step(r_count, end_s - t0, k)
        self._clock = end_s
        return True

    # ------------------------------------------------------------------ stats

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            used_blocks=self._private + len(self._ref) - len(self._lru),
            num_gpu_blocks=self.profile.num_gpu_blocks,
            block_size=self.profile.block_size,
            prompt_tokens_total=self._c.prompt_tokens,
            generation_tokens_total=self._c.generation_tokens,
            preemptions_total=self._c.preemptions,
            requests_finished_total=self._c.finished,
            requests_aborted_total=self._c.aborted,
            cached_blocks=len(self._ref),
            prefix_cache_queries_total=self._c.queries,
            prefix_cache_hits_total=self._c.hits,
            recomputed_tokens_total=self._c.recomputed,
            steps_total=self._c.steps,
            step_tokens_total=self._c.step_tokens,
            iteration_tokens_counts=tuple(self._c.iteration_buckets),
            itl_sum_s=self._c.itl_sum_s,
            itl_count=self._c.itl_count,
            busy_s=self._c.busy_s,
            prefill_time_sum_s=self._c.prefill_time_sum_s,
            prefill_time_count=self._c.prefill_time_count,
        )

    def request_status(self, req_id: str) -> Status | None:
        req = self._requests.get(req_id)
        return req.status if req else None

    def cached_keys(self) -> frozenset[int]:
        """Keys of the resident prefix-cache blocks (for tests and introspection)."""
        return frozenset(self._ref)
