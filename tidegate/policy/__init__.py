"""Pure policies: functions of an immutable snapshot, no I/O, no clock, no logging."""

from tidegate.policy.weights import (
    ROUTABLE_STATES,
    ReplicaDecision,
    ReplicaView,
    WeightPolicyConfig,
    compute_pool_tables,
    decide,
    routing_key,
)

__all__ = [
    "ROUTABLE_STATES",
    "ReplicaDecision",
    "ReplicaView",
    "WeightPolicyConfig",
    "compute_pool_tables",
    "decide",
    "routing_key",
]
