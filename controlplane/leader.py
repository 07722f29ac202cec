"""Leadership of one control-plane instance: campaign, lead until lost, campaign again.

Only the leader ingests telemetry and publishes routing tables; every instance serves the
admin API. A fresh `Election` (fresh lease) is made for each term.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from tidegate.store.election import Election

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
