"""One simulated replica on the virtual clock: an `simulator.engine.Engine` driven up to a time.

`advance(until_s)` runs the engine until its clock reaches `until_s` and returns the request
events (first token, finished, preempted) that happened by then, in time order. It uses the
engine's own `advance` when the engine has one (the fast path), else steps it: a step that
starts before `until_s` runs whole, and what it produced after `until_s` is held back until a
later call reaches that time, so no event is seen before it happens.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tidegate.policy.tpot_plan import EARLY_TOKENS
from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import Profile


@dataclass(frozen=True, slots=True)
class Event:
    kind: str          # "first_token" | "finished" | "preempted"
    req_id: str
    t_s: float


class SimReplica:
    def __init__(self, replica_id: str, profile: Profile, rng: random.Random, start_s: float = 0.0,
                 use_engine_advance: bool = True) -> None:
        self.replica_id = replica_id
        self.profile = profile
        # The router times a request's first EARLY_TOKENS gaps (its early TPOT: tpot_plan.py).
        self.engine = Engine(profile, rng, stamp_output=EARLY_TOKENS + 1)
        self.t = start_s                       # when the engine can start its next step
        self._busy_s = 0.0                     # summed step durations (step path)
        self._idle_s = 0.0                     # engine clock jumps over idle gaps (native path)
        self.peak_kv = 0.0
        self._held: list[Event] = []
        self._native = use_engine_advance and callable(getattr(self.engine, "advance", None))
        self._slow: tuple[float, Profile] | None = None  # (from when, the profile it runs at then)

    def slow_down(self, at_s: float, factor: float) -> None:
        """From `at_s` on, every step lasts `factor` times what the profile says (a degraded GPU).
        A step already running at `at_s` ends at the old speed."""
        slow = dataclasses.replace(self.profile, cost=self.profile.cost.scaled(factor))
        if at_s <= self.t:
            self._set_profile(slow)
        else:
            self._slow = (at_s, slow)

    def _set_profile(self, profile: Profile) -> None:
        self.profile = profile
        self.engine.profile = profile

    @property
    def busy_s(self) -> float:
        """Engine time spent in steps."""
        if self._native:
            return max(0.0, self.engine.clock_s - self._idle_s)
        return self._busy_s

    @property
    def native_advance(self) -> bool:
        return self._native

    def submit(self, req_id: str, prompt_tokens: int, max_tokens: int, arrival_s: float,
               prefix_hashes: tuple = (), hash_block_tokens: int = 16) -> None:
        """Raises tidegate.errors.RequestError / PromptTooLargeError when the engine refuses it."""
        eng = self.engine
        idle = not eng.has_work()
        eng.add_request(req_id, prompt_tokens, max_tokens, arrival_s, prefix_hashes, hash_block_tokens)
        if self._native:
            # An idle engine's clock jumps to the arrival: that gap is not busy time.
            if idle and arrival_s > eng.clock_s:
                self._idle_s += arrival_s - eng.clock_s
        elif self.t < arrival_s:
            self.t = arrival_s

    def solo_prefill_s(self, tokens: int) -> float:
        """How long `tokens` of prompt take alone on an idle engine, in chunks of the step budget."""
        p = self.profile
        done, total = 0, 0.0
        tokens = max(1, tokens)
        while done < tokens:
            n = min(p.max_num_batched_tokens, tokens - done)
            done += n
            total += p.cost.step_ms(n, done)
        return total / 1000.0

    def note_kv(self) -> float:
        kv = self.engine.stats().kv_usage
        if kv > self.peak_kv:
            self.peak_kv = kv
        return kv

    def idle_until(self, t: float) -> bool:
        """True when advancing to `t` can produce nothing (no step starts before t, nothing held)."""
        if self._held:
            return False
        if self._native:
            nxt = self.engine.next_step_s()
            return nxt is None or nxt >= t
        return not self.engine.has_work()

    def advance(self, until_s: float) -> list[Event]:
        events: list[Event] = []
        if self._slow is not None and until_s > self._slow[0]:
            at_s, slow = self._slow
            self._slow = None
            events = self.advance(at_s)
            self._set_profile(slow)
        if self._native:
            return events + self._advance_native(until_s)
        return events + self._advance_steps(until_s)

    def _advance_native(self, until_s: float) -> list[Event]:
        eng = self.engine
        raw = eng.advance(until_s)
        self.t = max(self.t, eng.clock_s)
        events = [Event(e.kind, e.req_id, e.t_s) for e in raw if e.kind in ("first_token", "finished", "preempted")]
        if self._held:
            events = self._held + events
            self._held = []
        out = [e for e in events if e.t_s <= until_s]
        self._held = [e for e in events if e.t_s > until_s]
        return out

    def _advance_steps(self, until_s: float) -> list[Event]:
        out: list[Event] = []
        if self._held:
            keep: list[Event] = []
            for e in self._held:
                (out if e.t_s <= until_s else keep).append(e)
            self._held = keep
        eng = self.engine
        while self.t < until_s and eng.has_work():
            res = eng.step(self.t)
            start, end = res.start_s, res.start_s + res.duration_s
            self._busy_s += res.duration_s
            dest = out if end <= until_s else self._held
            for rid in res.preempted:
                (out if start <= until_s else self._held).append(Event("preempted", rid, start))
            for o in res.outputs:
                if o.first_token:
                    dest.append(Event("first_token", o.req_id, end))
                if o.finished:
                    dest.append(Event("finished", o.req_id, end))
            if res.num_prefill_tokens or res.num_preempted:
                self.note_kv()
            if not res.num_scheduled_tokens:
                self.t = until_s  # nothing fits and nothing runs: try again later
                break
            self.t = end
        if self.t < until_s and not eng.has_work():
            self.t = until_s
        return out
