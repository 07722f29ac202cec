"""Built-in routing policies of the registry (tidegate.policy.registry): Tidegate's own and the
baselines. One module per policy; formulas and sources in README.md."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tidegate.policy.baselines.clairvoyant import Clairvoyant
from tidegate.policy.baselines.least_kv import LeastKv
from tidegate.policy.baselines.least_request import LeastRequest
from tidegate.policy.baselines.llmd import LlmdEndpointPicker, LlmdTablePicker
from tidegate.policy.baselines.round_robin import RoundRobin
from tidegate.policy.baselines.sglang_cache_aware import SglangCacheAware
from tidegate.policy.baselines.tidegate_pick import TidegatePick
from tidegate.policy.baselines.uniform_random import UniformRandom

if TYPE_CHECKING:  # registry imports this module when it first needs a policy
    from tidegate.policy.registry import Policy

BUILTIN: dict[str, Callable[[], Policy]] = {
    "tidegate": TidegatePick,
    "round_robin": RoundRobin,
    "random": UniformRandom,
    "least_request": LeastRequest,
    "least_kv": LeastKv,
    "llmd": LlmdEndpointPicker,
    "llmd_table": LlmdTablePicker,
    "sglang_cache_aware": SglangCacheAware,
    "clairvoyant": Clairvoyant,
}

__all__ = ["BUILTIN", "Clairvoyant", "LeastKv", "LeastRequest", "LlmdEndpointPicker", "LlmdTablePicker", "RoundRobin",
           "SglangCacheAware", "TidegatePick", "UniformRandom"]
