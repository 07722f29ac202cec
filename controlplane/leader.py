"""Leadership of one control-plane instance: campaign, lead until lost, campaign again.

Only the leader ingests telemetry and publishes routing tables; every instance serves the
admin API. A fresh `Election` (fresh lease) is made for each term.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from tidegate import codec
from tidegate.errors import StoreError
from tidegate.store.api import Fence
from tidegate.store.election import Election, leader_value
from tidegate.store.etcd import EtcdStore
from tidegate.v1 import records_pb2

log = structlog.get_logger(__name__)


class Leadership:
    def __init__(
        self,
        make_election: Callable[[], Election],
        on_elected: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        self._make = make_election
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._current: Election | None = None
        self._stopping = False

    @property
    def is_leader(self) -> bool:
        el = self._current
        return el is not None and el.is_leader and not self._stopping

    def fence(self) -> Fence | None:
        """The current term's fence, None when not leading."""
        el = self._current
        return el.fence if el is not None and not self._stopping else None

    def step_down(self, reason: str) -> None:
        """A fenced write was refused: this term is over; `run()` campaigns again."""
        el = self._current
        if el is not None:
            el.step_down(reason)

    async def run(self) -> None:
        while not self._stopping:
            election = self._make()
            self._current = election
            try:
                await election.campaign()
                if self._stopping:
                    break
                log.info("leader_elected")
                self._on_elected()
                await election.lost.wait()
                log.warning("leader_lost")
            finally:
                self._on_lost()
                if not self._stopping:
                    with contextlib.suppress(Exception):
                        await election.close()

    async def stop(self) -> None:
        """Resign (fast handover to a standby) and close."""
        self._stopping = True
        el = self._current
        if el is None:
            return
        try:
            if el.is_leader:
                await asyncio.wait_for(el.resign(), 3.0)
        except Exception as e:  # best effort on the way out
            log.warning("resign_failed", error=str(e) or type(e).__name__)
        with contextlib.suppress(Exception):
            await el.close()


class LeaderWatch:
    """Who leads, polled from etcd every `interval_s`: `record` is the leader's LeaderRecord,
    None while nobody leads *or etcd does not answer* (then we do not know). A standby names
    this address when it refuses an agent, and a deposed leader sends its agents there, so
    agents reach the new leader at once instead of after their backoff."""

    def __init__(self, store: EtcdStore, name: str, self_id: str, *, interval_s: float = 0.5,
                 timeout_s: float = 1.0) -> None:
        self._store = store
        self._name = name
        self._self_id = self_id
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self.record: records_pb2.LeaderRecord | None = None
        self.last_leader_id = ""  # the last leader seen (kept while etcd does not answer)

    def elected(self) -> None:
        """We lead now (no need to wait for the next poll)."""
        self.last_leader_id = self._self_id

    def redirect(self, is_leader: bool) -> str | None:
        """What the telemetry service does with agents: None = serve them (we lead, or we led
        last and nobody else is known to lead: keep the fleet through an etcd outage); "" =
        refuse, leader unknown; "host:port" = refuse and send them to that leader."""
        if is_leader:
            return None
        rec = self.record
        if rec is not None and rec.controlplane_id != self._self_id:
            return rec.admin_address
        return None if self.last_leader_id == self._self_id else ""

    async def poll(self) -> None:
        try:
            value = await leader_value(self._store, self._name, self._timeout_s)
        except StoreError:
            self.record = None
            return
        if value is None:
            self.record = None
            return
        try:
            rec = codec.decode(value, records_pb2.LeaderRecord)
        except codec.DecodeError:
            self.record = None
            return
        if rec.controlplane_id != self.last_leader_id:
            log.info("leader_observed", controlplane_id=rec.controlplane_id, address=rec.admin_address)
        self.record = rec
        self.last_leader_id = rec.controlplane_id

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(self._interval_s)
