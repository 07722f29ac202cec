"""A vLLM-V1-like engine core: scheduler, paged KV cache and step-time model, driven step by step.

Pure and clock-free: the caller passes the time at which each step starts and gets back how long
the step takes; the live server sleeps that long, a virtual-time fleet simulator just adds it.

Each step (one forward pass), like vLLM V1's scheduler without prefix caching:

1. Running requests first, in admission order. Each is given the tokens it still has to compute
   (1 for a decode; the rest of its prompt for a partially prefilled one), capped by what is left
   of ``max_num_batched_tokens`` (chunked prefill). The KV cache must hold
   ``ceil((computed + new) / block_size)`` blocks for it; when it cannot, the most recently
   admitted running request is preempted (recompute: its blocks are freed, its progress reset, and
   it goes back to the front of the waiting queue), until the request fits or is itself the victim.
2. If nothing was preempted in this step, waiting requests are admitted in FCFS order while
   tokens remain in the budget, fewer than ``max_num_seqs`` run, and their blocks fit.
3. Every scheduled request advances by its tokens. A request whose computed tokens reach its
   prompt plus the outputs so far samples one output token (the first one when its prefill
   completes). After exactly ``max_tokens`` outputs it finishes (the simulator has no EOS) and
   frees its blocks.

A preempted request keeps the tokens it already produced; on re-admission it recomputes prompt
and outputs as one prefill, then continues, so its output count still ends at ``max_tokens``.
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from dataclasses import dataclass

from simulator.profiles import Profile
from tidegate.errors import PromptTooLargeError, RequestError

DEFAULT_MAX_TOKENS = 256


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class _Request:
    req_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    prefix_hashes: tuple
    status: Status = Status.WAITING
    num_computed: int = 0
    num_output: int = 0
    num_blocks: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV must exist before the next output can be sampled."""
        return self.prompt_tokens + self.num_output


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
    used_blocks: int
    num_gpu_blocks: int
    block_size: int
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    requests_finished_total: int
    requests_aborted_total: int

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


class Engine:
    """One simulated engine replica. Not thread-safe; no asyncio, no clock."""

    def __init__(self, profile: Profile, rng: random.Random | None = None, jitter_frac: float = 0.0) -> None:
        if not 0.0 <= jitter_frac < 1.0:
            raise ValueError("jitter_frac must be in [0, 1)")
        self.profile = profile
        self._rng = rng or random.Random(0)
        self._jitter = jitter_frac
        self._requests: dict[str, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._used_blocks = 0
        self._c = _Counters()

    # ------------------------------------------------------------------ requests

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

    def add_request(
        self,
        req_id: str,
        prompt_tokens: int,
        max_tokens: int | None,
        arrival_s: float,
        prefix_hashes: tuple = (),
    ) -> None:
        """Queue a request. `max_tokens` None means default_max_tokens(prompt_tokens).
        `prefix_hashes` is kept for a later prefix-cache model; it does not change scheduling yet."""
        if req_id in self._requests:
            raise RequestError(f"request id {req_id!r} is already in the engine")
        if max_tokens is None and isinstance(prompt_tokens, int):
            max_tokens = self.default_max_tokens(prompt_tokens)
        self.check_request(prompt_tokens, max_tokens)  # type: ignore[arg-type]
        req = _Request(req_id, prompt_tokens, int(max_tokens), arrival_s, tuple(prefix_hashes))  # type: ignore[arg-type]
        self._requests[req_id] = req
        self._waiting.append(req)

    def abort(self, req_id: str) -> bool:
        """Drop a request and free its blocks. False when it is unknown or already done."""
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
        return True

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def has_request(self, req_id: str) -> bool:
        return req_id in self._requests

    # ------------------------------------------------------------------ KV cache

    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.profile.block_size)

    def _allocate(self, req: _Request, total_tokens: int) -> bool:
        need = self._blocks_for(total_tokens) - req.num_blocks
        if need <= 0:
            return True
        if self._used_blocks + need > self.profile.num_gpu_blocks:
            return False
        req.num_blocks += need
        self._used_blocks += need
        return True

    def _free(self, req: _Request) -> None:
        self._used_blocks -= req.num_blocks
        req.num_blocks = 0

    def _preempt(self, req: _Request) -> None:
        self._free(req)
        req.num_computed = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self._waiting.appendleft(req)
        self._c.preemptions += 1

    # ------------------------------------------------------------------ the step

    def step(self, now_s: float) -> StepResult:
        """Schedule and run one iteration starting at `now_s`."""
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
                n = min(req.num_tokens - req.num_computed, budget)
                if not self._allocate(req, req.num_computed + n):
                    break
                self._waiting.popleft()
                req.status = Status.RUNNING
                self._running.append(req)
                scheduled.append((req, n))
                budget -= n

        n_tokens = sum(n for _, n in scheduled)
        ctx = sum(req.num_computed + n for req, n in scheduled)
        duration_ms = p.cost.step_ms(n_tokens, ctx)
        if self._jitter and duration_ms > 0:
            duration_ms *= 1.0 + self._rng.uniform(-self._jitter, self._jitter)
        duration_s = duration_ms / 1000.0
        end_s = now_s + duration_s

        outputs: list[RequestOutput] = []
        prefill_tokens = decode_tokens = 0
        for req, n in scheduled:
            is_decode = n == 1 and req.num_output > 0 and req.num_computed + 1 == req.num_tokens
            if is_decode:
                decode_tokens += n
            else:
                prefill_tokens += n
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                outputs.append(RequestOutput(req.req_id, 0, req.num_output, False, False, None,
                                             req.prompt_tokens, None, None, None))
                continue
            req.num_output += 1
            self._c.generation_tokens += 1
            first = req.num_output == 1
            ttft = itl = e2e = None
            if first:
                self._c.prompt_tokens += req.prompt_tokens
                req.first_token_s = end_s
                ttft = end_s - req.arrival_s
            else:
                itl = end_s - (req.last_token_s if req.last_token_s is not None else end_s)
            req.last_token_s = end_s
            done = req.num_output >= req.max_tokens
            if done:
                e2e = end_s - req.arrival_s
                self._running.remove(req)
                self._free(req)
                req.status = Status.FINISHED
                del self._requests[req.req_id]
                self._c.finished += 1
            outputs.append(RequestOutput(req.req_id, 1, req.num_output, first, done,
                                         "length" if done else None, req.prompt_tokens, ttft, itl, e2e))

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

    # ------------------------------------------------------------------ stats

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            used_blocks=self._used_blocks,
            num_gpu_blocks=self.profile.num_gpu_blocks,
            block_size=self.profile.block_size,
            prompt_tokens_total=self._c.prompt_tokens,
            generation_tokens_total=self._c.generation_tokens,
            preemptions_total=self._c.preemptions,
            requests_finished_total=self._c.finished,
            requests_aborted_total=self._c.aborted,
        )

    def request_status(self, req_id: str) -> Status | None:
        req = self._requests.get(req_id)
        return req.status if req else None
