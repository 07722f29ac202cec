"""Chaos: the control plane and etcd fail under steady load; no table is worse than the last.

A real local fleet as `tidegate up` starts it (a private etcd, two control planes, three
simulated replicas with their agents, a router) serves steady light load (2 clients, ~15
requests/s). Every routing-table write is recorded through a watch, so the whole history is
checked, not samples. Figures are printed (pytest -s) and recorded in docs/RELIABILITY.md:

- `kill -9` of the leading control plane: 0 failed requests; the standby publishes a complete
  table (every replica routable) within 5 s, and every agent reported to it before that.
- etcd frozen (SIGSTOP) for 60 s, then resumed: 0 failed requests; no table ever has fewer
  routable replicas than were reporting (3); a table is published within 5 s of the resume.
- `kill -9` of one agent: its replica gets no request dispatched later than the stale timeout
  (3 s) plus one tick and the watch (1 s) after the kill, and no request fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleetkit import (  # type: ignore[import-not-found]
    Fleet,
    SteadyLoad,
    TableLog,
    child,
    fleet,
    routable,
    wait_until,
)

from tidegate.fleet.procs import Child

pytestmark = pytest.mark.e2e

ALL = {"replica-0", "replica-1", "replica-2"}
FAILOVER_GOAL_S = 5.0
ETCD_PAUSE_S = 60.0
RECOVERY_GOAL_S = 5.0
STANDBY_CASE_PAUSE_S = 15.0    # long enough for every lease to lapse (election TTL 3 s, presence 5 s)
STALE_AFTER_S = 3.0          # the control plane's default --stale-after-s
PROPAGATION_S = 1.0          # one decision tick (0.5 s), etcd -> router watch, a request in flight


def _leader_and_standby(fl: Fleet, log: TableLog) -> tuple[Child, str]:
    """The leading control plane's process (from the last table's leader id) and the other's id."""
    writes = log.all()
    assert writes, "no table was published"
    leader = writes[-1].table.leader_id
    return child(fl, "controlplane-" + leader[-1]), {"cp-0": "cp-1", "cp-1": "cp-0"}[leader]


def _log_events(path: Path, event: str) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == event:
            out.append(rec)
    return out


def _all_heard(path: Path) -> bool:
    """Whether the control plane logging to `path` had heard every replica of the last table by
    the end of its latest warm-up or carry-over (controlplane.term logs both when they change)."""
    last = None
    for rec in _log_events(path, "term_warm") + _log_events(path, "term_carrying"):
        if last is None or rec["timestamp"] >= last["timestamp"]:
            last = rec
    if last is None:
        return False
    return last["not_heard"] == 0 if last["event"] == "term_warm" else last["carried"] == []


@contextlib.contextmanager
def _under_load(etcd: Any, tmp: Path) -> Iterator[tuple[Fleet, TableLog, SteadyLoad]]:
    """The fleet, its table history and steady load, once a complete table is out and load runs."""
    with fleet(etcd.endpoint, tmp / "run") as (fl, info), TableLog(etcd.endpoint) as log, \
            SteadyLoad(info["router_url"]) as load:
        wait_until(lambda: bool(log.all()) and routable(log.all()[-1].table) == ALL, 30, "a complete table")
        wait_until(lambda: len(load.snapshot()) >= 20, 30, "the load to run")
        yield fl, log, load


def test_leader_kill_9(fresh_etcd: Any, tmp_path: Path) -> None:
    with _under_load(fresh_etcd, tmp_path) as (fl, log, load):
        victim, standby = _leader_and_standby(fl, log)
        killed_at = time.monotonic()
        os.killpg(victim.pid, signal.SIGKILL)

        def complete_from_standby() -> bool:
            return any(w.table.leader_id == standby and routable(w.table) == ALL for w in log.since(killed_at))

        wait_until(complete_from_standby, 30, "a complete table from the standby")
        first = next(w for w in log.since(killed_at) if w.table.leader_id == standby)
        failover_s = first.seen_at - killed_at
        time.sleep(2.0)  # load keeps running on the new leader's table

    standby_log = child(fl, "controlplane-" + standby[-1]).log_path
    warm = _log_events(standby_log, "term_warm")
    outcomes = load.snapshot()
    failed = [o for o in outcomes if o.status != 200]
    print(f"\nleader kill -9: first table from the standby after {failover_s:.2f}s, "
          f"{len(routable(first.table))}/3 routable; agents all heard {warm[-1]['term_age_s'] if warm else '?'}s "
          f"into the term; requests {len(outcomes)}, failed {len(failed)}")
    assert routable(first.table) == ALL, "the standby's first table must be complete"
    assert failover_s <= FAILOVER_GOAL_S, failover_s
    assert _all_heard(standby_log), "every agent must have reported to the new leader"
    assert failed == [], failed[:5]


def test_etcd_paused_60s(fresh_etcd: Any, tmp_path: Path) -> None:
    with _under_load(fresh_etcd, tmp_path) as (fl, log, load):
        paused_at = time.monotonic()
        os.kill(fresh_etcd.pid, signal.SIGSTOP)
        try:
            time.sleep(ETCD_PAUSE_S)
        finally:
            os.kill(fresh_etcd.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        wait_until(lambda: bool(log.since(resumed_at)), 30, "a table after etcd resumed")
        first_after = log.since(resumed_at)[0]
        time.sleep(3.0)

    history = [w for w in log.all() if w.seen_at >= paused_at - 5]
    outcomes = load.snapshot()
    failed = [o for o in outcomes if o.status != 200]
    during = [o for o in outcomes if paused_at <= o.dispatched_at <= resumed_at]
    recovery_s = first_after.seen_at - resumed_at
    print(f"\netcd SIGSTOP {ETCD_PAUSE_S:.0f}s: {len(history)} table writes around the outage, smallest routable "
          f"set {min(len(routable(w.table)) for w in history)}/3; first table {recovery_s:.2f}s after resume "
          f"(leader {first_after.table.leader_id}); requests {len(outcomes)} ({len(during)} during the pause), "
          f"failed {len(failed)}")
    assert all(routable(w.table) == ALL for w in history), [(w.mod_revision, sorted(routable(w.table)))
                                                            for w in history]
    assert recovery_s <= RECOVERY_GOAL_S, recovery_s
    assert during, "the load must have run through the pause"
    assert failed == [], failed[:5]


def test_etcd_paused_then_the_standby_wins(fresh_etcd: Any, tmp_path: Path) -> None:
    """The hard case of an etcd outage: the instance holding the agents is not the one elected
    afterwards (here it is frozen while etcd comes back). The new leader restores the last table,
    holds or carries it while the old leader, seeing the new one, sends the agents over."""
    with _under_load(fresh_etcd, tmp_path) as (fl, log, load):
        old_child, new = _leader_and_standby(fl, log)
        paused_at = time.monotonic()
        os.kill(fresh_etcd.pid, signal.SIGSTOP)
        try:
            time.sleep(STANDBY_CASE_PAUSE_S)
            old_child.signal(signal.SIGSTOP)
        finally:
            os.kill(fresh_etcd.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
        try:
            wait_until(lambda: any(w.table.leader_id == new for w in log.since(resumed_at)), 20,
                       "a table from the new leader")
        finally:
            old_child.signal(signal.SIGCONT)
        time.sleep(4.0)

    history = [w for w in log.all() if w.seen_at >= paused_at - 5]
    first_new = next(w for w in log.since(resumed_at) if w.table.leader_id == new)
    new_log = child(fl, "controlplane-" + new[-1]).log_path
    carried = [e for e in _log_events(new_log, "term_carrying") if e["carried"]]
    failed = load.failures()
    print(f"\netcd SIGSTOP {STANDBY_CASE_PAUSE_S:.0f}s, old leader frozen at the resume: first table from the new "
          f"leader {first_new.seen_at - resumed_at:.2f}s after resume; smallest routable set "
          f"{min(len(routable(w.table)) for w in history)}/3; {len(carried[0]['carried']) if carried else 0} "
          f"entries carried from {carried[0]['term_age_s'] if carried else '-'}s into the term; "
          f"failed {len(failed)}")
    assert all(routable(w.table) == ALL for w in history), [(w.table.leader_id, sorted(routable(w.table)))
                                                            for w in history]
    assert _all_heard(new_log), "the agents must have moved to the new leader"
    assert failed == [], failed[:5]


def test_agent_kill_9(fresh_etcd: Any, tmp_path: Path) -> None:
    with _under_load(fresh_etcd, tmp_path) as (fl, log, load):
        killed_at = time.monotonic()
        os.killpg(child(fl, "agent-1").pid, signal.SIGKILL)
        wait_until(lambda: any("replica-1" not in routable(w.table) for w in log.since(killed_at)), 20,
                   "replica-1 to lose its weight")
        time.sleep(3.0)

    zeroed = next(w for w in log.since(killed_at) if "replica-1" not in routable(w.table))
    outcomes = load.snapshot()
    to_victim = [o for o in outcomes if o.replica == "replica-1" and o.dispatched_at >= killed_at]
    last = max((o.dispatched_at - killed_at for o in to_victim), default=0.0)
    failed = [o for o in outcomes if o.status != 200]
    after = [o for o in outcomes if o.dispatched_at >= killed_at + STALE_AFTER_S + PROPAGATION_S]
    print(f"\nagent kill -9: weight 0 published {zeroed.seen_at - killed_at:.2f}s after the kill; last request to "
          f"its replica dispatched {last:.2f}s after; {len(after)} requests later all elsewhere; "
          f"requests {len(outcomes)}, failed {len(failed)}")
    assert last <= STALE_AFTER_S + PROPAGATION_S, last
    assert after and all(o.replica != "replica-1" for o in after)
    assert failed == [], failed[:5]
