"""The seat wait in the predicted TTFT: past the engine's max_num_seqs a request waits for running
sequences to finish (predict.predict, tidegate/policy/README.md §3). Pure: no fakes needed."""

from __future__ import annotations

import pytest

from tidegate.policy.predict import Rates, ReplicaLoad, pool_rates, predict
from tidegate.policy.registry import RouteInfo

STEP_BASE, PER_SEQ = 0.008, 0.0001


def rates(seats: float) -> Rates:
    return Rates(prefill_tps=40_000.0, step_base_s=STEP_BASE, step_per_seq_s=PER_SEQ, seats=seats)


def ttft(seats: float, sequences: float, decoding: float = 4.0, remaining: float = 100.0) -> float:
    load = ReplicaLoad(queued_prefill=0.0, decoding=decoding, kv_used=0.0, kv_capacity=0.0, sequences=sequences)
    return predict("r", load, rates(seats), 400, 0, 50.0, remaining, 2.0, 0.1).ttft_s


STEP4 = STEP_BASE + PER_SEQ * 4   # the decode step with 4 sequences


@pytest.mark.parametrize(("seats", "sequences", "decoding", "remaining", "extra_s"), [
    pytest.param(0, 500, 4, 100, 0.0, id="seats-unknown"),
    pytest.param(8, 4, 4, 100, 0.0, id="seats-free"),
    pytest.param(5, 4, 4, 100, 0.0, id="the-last-seat-is-its-own"),
    # 6 in flight on 4 seats: it waits for 3 of the 4 running to finish, at 4 / (200 x step) per second.
    pytest.param(4, 6, 4, 100, 3 * 200 * STEP4 / 4, id="three-completions"),
    # Twice the answer length: completions come half as often.
    pytest.param(4, 6, 4, 200, 3 * 400 * STEP4 / 4, id="longer-answers-wait-longer"),
    # The router counts more decoding than seats (peers' reports): the engine runs `seats` of them.
    pytest.param(2, 5, 4, 100, 4 * 200 * STEP4 / 2, id="decoding-over-seats"),
    pytest.param(4, 6, 0, 100, 0.0, id="nothing-decoding-no-rate"),
])
def test_seat_wait(seats, sequences, decoding, remaining, extra_s):
    assert ttft(seats, sequences, decoding, remaining) - ttft(0, sequences, decoding, remaining) == \
        pytest.approx(extra_s, abs=1e-12)


def test_seat_wait_grows_with_the_queue_for_seats():
    waits = [ttft(4, n) for n in range(0, 12)]
    assert waits == sorted(waits) and waits[-1] > waits[3]


def test_pool_rates_take_each_replicas_own_seats():
    entries = [RouteInfo(replica_id="a", weight=1.0, max_num_seqs=256), RouteInfo(replica_id="b", weight=1.0),
               RouteInfo(replica_id="c", weight=1.0, max_num_seqs=-4)]
    got = pool_rates(entries)
    assert (got["a"].seats, got["b"].seats, got["c"].seats) == (256.0, 0.0, 0.0)
