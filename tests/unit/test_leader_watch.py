"""LeaderWatch.redirect: what the telemetry service does with agents, by what etcd said last."""

from __future__ import annotations

import pytest

from tidegate.controlplane.leader import LeaderWatch
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2


def watch(record: str | None, last: str) -> LeaderWatch:
    w = LeaderWatch(EtcdStore(["127.0.0.1:1"]), "/e", "me")  # never connected: no I/O here
    w.record = None if record is None else records_pb2.LeaderRecord(controlplane_id=record,
                                                                    admin_address=f"{record}:1")
    w.last_leader_id = last
    return w


CASES = [
    # id, is_leader, record (who leads per etcd), last leader seen, expected
    ("we lead: serve", True, "me", "me", None),
    ("we lead, etcd not answering: serve", True, None, "me", None),
    ("etcd down, we led last: keep the fleet", False, None, "me", None),
    ("our old key still there, lease lapsing: keep", False, "me", "me", None),
    ("another leads: send agents there", False, "other", "other", "other:1"),
    ("another led last, etcd down: refuse, leader unknown", False, None, "other", ""),
    ("nobody ever seen: refuse", False, None, "", ""),
]


@pytest.mark.parametrize(("is_leader", "record", "last", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_redirect(is_leader: bool, record: str | None, last: str, expected: str | None) -> None:
    assert watch(record, last).redirect(is_leader) == expected


def test_elected_marks_us_as_the_last_leader() -> None:
    w = watch(None, "other")
    w.elected()
    assert w.redirect(False) is None
