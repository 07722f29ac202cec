"""What the sequences running on a replica still have to write (`running_left`), which sets how long
they hold their seats and their KV in the pick's predicted TTFT: half the mean expected output of
this router's requests past their first token, not half the mean of the answers that finished
(tidegate/policy/README.md §2-3). Pure: the policy's hooks and a table; no fakes needed."""

from __future__ import annotations

import pytest

from tidegate.policy.predict import Rates, ReplicaLoad, predict
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import DEFAULT_OUTPUT_TOKENS, TidegatePolicy

SEATS = 4
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)
RATES = Rates(45_000.0, 0.008, 0.00015, float(SEATS))


def entry(rid: str) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=50.0, endpoint=f"http://{rid}", max_num_seqs=SEATS, **FAST)


def req(rid: str, out: int | None, prompt: int = 400) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, req_id=rid)


def seat_full_ttft(running: list[int], finished_short: int, waiting_on_a: int = 0) -> float:
    """The predicted TTFT on replica `a` whose SEATS seats run answers of `running` max_tokens
    (their first tokens seen), after `finished_short` 8-token answers finished on `b`."""
    pol = TidegatePolicy()
    for i, out in enumerate(running):
        pol.on_dispatch(req(f"run{i}", out), "a")
        pol.on_first_token(req(f"run{i}", out), "a")
    for i in range(waiting_on_a):                 # dispatched, no first token yet: not running
        pol.on_dispatch(req(f"wait{i}", 4_000, prompt=1), "a")
    for i in range(finished_short):
        short = req(f"short{i}", 8)
        pol.on_dispatch(short, "b")
        pol.on_first_token(short, "b")
        pol.on_output(short, "b", 8)
        pol.on_complete(short, "b")
    preds = {p.replica_id: p for p in pol.predictions(PoolSnapshot((entry("a"), entry("b"))), req("new", 50))}
    return preds["a"].ttft_s


def expected_ttft(running: list[int], waiting_on_a: int, left: float) -> float:
    load = ReplicaLoad(queued_prefill=float(waiting_on_a), decoding=float(len(running)), kv_used=0.0,
                       kv_capacity=0.0, sequences=float(len(running) + waiting_on_a))
    return predict("a", load, RATES, 400, 0, 50.0, 1.0, 2.0, 0.1, running_left=left).ttft_s


@pytest.mark.parametrize(("running", "finished_short", "waiting_on_a", "left"), [
    # Four 1,000-token answers hold the four seats: each is taken to be halfway, 500 left.
    pytest.param([1000] * 4, 0, 0, 500.0, id="long-answers-hold-their-seats"),
    # Short answers finishing elsewhere teach the mean answer, not what these have left.
    pytest.param([1000] * 4, 300, 0, 500.0, id="short-answers-finishing-do-not-shorten-it"),
    pytest.param([200, 400, 600, 800], 0, 0, 250.0, id="the-mean-of-the-running"),
    # Requests still waiting for their first token are not running: they add to the queue for seats.
    pytest.param([1000] * 4, 0, 3, 500.0, id="waiting-ones-queue-for-seats"),
])
def test_seat_wait_counts_what_the_running_sequences_have_left(running, finished_short, waiting_on_a, left):
    assert seat_full_ttft(running, finished_short, waiting_on_a) == pytest.approx(
        expected_ttft(running, waiting_on_a, left), rel=1e-12)


def test_the_mean_answer_stands_in_before_anything_runs_and_after_all_finished():
    pol = TidegatePolicy()
    snap = PoolSnapshot((entry("a"),))
    assert pol._running_left() == DEFAULT_OUTPUT_TOKENS / 2
    r = req("one", 3_000)
    pol.on_dispatch(r, "a")
    assert pol._running_left() == DEFAULT_OUTPUT_TOKENS / 2      # dispatched, not running yet
    pol.on_first_token(r, "a")
    assert pol._running_left() == 1_500
    pol.on_output(r, "a", 40)
    pol.on_complete(r, "a")
    assert pol._running_left() == pytest.approx(pol._mean_output / 2)
    assert pol._running == 0 and pol._running_output == 0.0
    assert pol.predictions(snap, req("next", 10))[0].ttft_s > 0


def test_a_completion_without_a_first_token_leaves_the_running_set_alone():
    pol = TidegatePolicy()
    started, never = req("started", 1_000), req("never", 9_000)
    for r in (started, never):
        pol.on_dispatch(r, "a")
    pol.on_first_token(started, "a")
    pol.on_complete(never, "a")          # a router that never saw its first token
    pol.on_first_token(started, "a")     # a second first token is ignored
    assert pol._running_left() == 500
    pol.on_complete(started, "a")
    pol.on_complete(started, "a")        # and a second completion
    assert pol._running == 0 and pol._running_output == 0.0
