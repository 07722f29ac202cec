"""The etcd key layout. Every key Tidegate writes lives under one versioned prefix.

    /tidegate/v1/tables/<pool>              RoutingTable (one key per pool; written by the leader)
    /tidegate/v1/replicas/<replica_id>      ReplicaPresence (leased by the control plane holding the stream)
    /tidegate/v1/routers/<router_id>        RouterPresence (leased by the router)
    /tidegate/v1/router-load/<router_id>    RouterLoad (leased by the router; binary protobuf, for its peers)
    /tidegate/v1/intents/<replica_id>       ReplicaIntent (SRE cordon/drain; no lease, survives restarts)
    /tidegate/v1/events/<ts>-<n>            Event (audit trail; no lease)
    /tidegate/v1/budgets/<scope>            DisruptionBudget (scope "pool:<name>" or "region:<name>")
    /tidegate/v1/slos/<pool>                PoolSlo (SRE targets; the leader copies them into the table)
    /tidegate/v1/scale/<pool>               ScaleRecommendation (written by the leader)
    /tidegate/v1/admission/<pool>           AdmissionBudget (per-router shares; written by the leader)
    /tidegate/v1/election/controlplane      etcd Election name (values: LeaderRecord)
    /tidegate/v1/faults/<replica_id>        FaultRecord (ejection and backoff; written by the leader, fenced)

Values are protobuf JSON (see `tidegate.codec`), except RouterLoad: binary, written ~10 times a second.
The router-load prefix is deliberately not under routers/: what lists router presences (the control
plane's WatchCache on ROUTERS) must not see load records.
"""

from __future__ import annotations

PREFIX = "/tidegate/v1/"
TABLES = PREFIX + "tables/"
REPLICAS = PREFIX + "replicas/"
ROUTERS = PREFIX + "routers/"
ROUTER_LOADS = PREFIX + "router-load/"
INTENTS = PREFIX + "intents/"
EVENTS = PREFIX + "events/"
BUDGETS = PREFIX + "budgets/"
ELECTION = PREFIX + "election/controlplane"
FAULTS = PREFIX + "faults/"
SLOS = PREFIX + "slos/"
SCALE = PREFIX + "scale/"
ADMISSION = PREFIX + "admission/"


def table(pool: str) -> str:
    return TABLES + pool


def replica(replica_id: str) -> str:
    return REPLICAS + replica_id


def router(router_id: str) -> str:
    return ROUTERS + router_id


def router_load(router_id: str) -> str:
    return ROUTER_LOADS + router_id


def intent(replica_id: str) -> str:
    return INTENTS + replica_id


def fault(replica_id: str) -> str:
    return FAULTS + replica_id


def leaf(prefix: str, key: str) -> str:
    """The part of `key` after `prefix` (e.g. the pool name of a table key)."""
    if not key.startswith(prefix):
        raise ValueError(f"key {key!r} is not under {prefix!r}")
    return key[len(prefix):]


def budget(scope: str) -> str:
    return BUDGETS + scope


def slo(pool: str) -> str:
    return SLOS + pool


def scale(pool: str) -> str:
    return SCALE + pool


def admission(pool: str) -> str:
    return ADMISSION + pool
