"""What the seats and the KV free over (`left`) in the pick's predicted TTFT: half the mean expected
output of the requests the router sends, not half the mean of the answers that finished, which a
burst pulls down (tidegate/policy/README.md §3). Pure: the policy's hooks and a table; no fakes."""

from __future__ import annotations

import pytest

from tidegate.policy.predict import Rates, ReplicaLoad, predict
from tidegate.policy.registry import PoolSnapshot, RequestFeatures, RouteInfo
from tidegate.policy.slo_pick import DEFAULT_OUTPUT_TOKENS, EWMA_ALPHA, TidegatePolicy

SEATS = 4
FAST = dict(prefill_tokens_per_s=45_000.0, decode_step_base_ms=8.0, decode_step_per_seq_ms=0.15)
RATES = Rates(45_000.0, 0.008, 0.00015, float(SEATS))


def entry(rid: str) -> RouteInfo:
    return RouteInfo(replica_id=rid, weight=50.0, endpoint=f"http://{rid}", max_num_seqs=SEATS, **FAST)


def req(rid: str, out: int | None, prompt: int = 400) -> RequestFeatures:
    return RequestFeatures(prompt_tokens=prompt, max_tokens=out, req_id=rid)


def ewma(values: list[float]) -> float:
    mean = values[0]
    for v in values[1:]:
        mean += EWMA_ALPHA * (v - mean)
    return mean


def seat_full_ttft(running: list[int], waiting_on_a: int = 0) -> float:
    """The predicted TTFT on replica `a`, whose SEATS seats run answers of `running` max_tokens
    (first tokens seen)."""
    pol = TidegatePolicy()
    for i, out in enumerate(running):
        pol.on_dispatch(req(f"run{i}", out), "a")
        pol.on_first_token(req(f"run{i}", out), "a")
    for i in range(waiting_on_a):     # dispatched, no first token yet: they queue for the seats
        pol.on_dispatch(req(f"wait{i}", running[0], prompt=1), "a")
    preds = {p.replica_id: p for p in pol.predictions(PoolSnapshot((entry("a"), entry("b"))), req("new", 50))}
    return preds["a"].ttft_s


def expected_ttft(running: int, waiting_on_a: int, left: float) -> float:
    load = ReplicaLoad(queued_prefill=float(waiting_on_a), decoding=float(running), kv_used=0.0,
                       kv_capacity=0.0, sequences=float(running + waiting_on_a))
    return predict("a", load, RATES, 400, 0, 50.0, 1.0, 2.0, 0.1, left_output=left).ttft_s


@pytest.mark.parametrize(("sent", "waiting_on_a"), [
    # Four 1,000-token answers hold the four seats: 1,000 is the mean answer sent, 500 left.
    pytest.param([1000] * 4, 0, id="long-answers-hold-their-seats"),
    pytest.param([200, 400, 600, 800], 0, id="the-mean-of-the-answers-sent"),
    # Requests still waiting for their first token queue for the seats, one completion each.
    pytest.param([1000] * 4, 3, id="waiting-ones-queue-for-seats"),
])
def test_seat_wait_counts_the_mean_answer_sent(sent, waiting_on_a):
    want = expected_ttft(len(sent), waiting_on_a, ewma([float(x) for x in sent + [sent[0]] * waiting_on_a]) / 2)
    assert seat_full_ttft(sent, waiting_on_a) == pytest.approx(want, rel=1e-12)


def test_short_answers_finishing_move_the_learned_mean_not_what_the_seats_free_over():
    pol = TidegatePolicy()
    for i in range(8):
        pol.on_dispatch(req(f"run{i}", 1000), "a")
        pol.on_first_token(req(f"run{i}", 1000), "a")
    left = pol._left()
    for i in range(4):   # the short ones finish first, as in a burst
        pol.on_output(req(f"run{i}", 1000), "a", 8)
        pol.on_complete(req(f"run{i}", 1000), "a")
    assert pol._left() == left == 500
    assert pol._mean_output < DEFAULT_OUTPUT_TOKENS * 0.95   # what the seat wait used to count


def test_the_learned_mean_stands_in_before_anything_is_sent():
    pol = TidegatePolicy()
    assert pol._left() == DEFAULT_OUTPUT_TOKENS / 2
    pol.on_output(req("x", 1000), "a", 40)
    assert pol._left() == pytest.approx(pol._mean_output / 2)
    pol.on_dispatch(req("one", 3_000), "a")
    assert pol._left() == pytest.approx(3_000 * pol._cap_use / 2)
