"""Fitted engine rates reach etcd: a `tidegate up` fleet (etcd, control plane, simulated engines
with agents, router; real processes on 127.0.0.1) serves requests through the router, and the
routing table in etcd gains each serving replica's prefill rate and decode step model, learnt
from the engines' /metrics alone (no profile reaches the control plane)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livefleet import fitted_entries, up_fleet, warm_rates  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

MODEL = "sim-model"


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    with up_fleet(tmp_path, fresh_etcd.endpoint, MODEL, replicas=2) as (_fleet, info, _cli):
        yield info


def test_serving_replicas_publish_fitted_rates(fleet: dict[str, Any]) -> None:
    # Distinct long prompts (no prefix-cache hits) in rounds until both replicas publish.
    warm_rates(fleet["router_url"], fleet["etcd"], MODEL, replicas=2)
    seen: list[list[dict[str, Any]]] = []

    def published() -> bool:
        entries = fitted_entries(fleet["etcd"], MODEL, 2)
        if entries is not None:
            seen.append(entries)
        return bool(seen)

    wait_until(published, timeout=20.0, what="nonzero fitted rates for both replicas in the etcd table")
    # The bounds are checked on the table that showed both, read once: a second read raced the
    # next rewrite once in CI (one replica's prefill figure absent there; 2026-12-05).
    for e in seen[0]:
        # Bounded, physical figures (the simulated H100 steps take ~7-12 ms); not an accuracy check.
        assert 0.05 <= e["decodeStepBaseMs"] <= 5_000
        assert 10 <= e["prefillTokensPerS"] <= 1e7
