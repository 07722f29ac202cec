import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_JOINING: _ClassVar[ReplicaState]
    REPLICA_STATE_READY: _ClassVar[ReplicaState]
    REPLICA_STATE_DEGRADED: _ClassVar[ReplicaState]
    REPLICA_STATE_CORDONED: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINED: _ClassVar[ReplicaState]
    REPLICA_STATE_EJECTED: _ClassVar[ReplicaState]
    REPLICA_STATE_STALE: _ClassVar[ReplicaState]
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_JOINING: ReplicaState
REPLICA_STATE_READY: ReplicaState
REPLICA_STATE_DEGRADED: ReplicaState
REPLICA_STATE_CORDONED: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState
REPLICA_STATE_DRAINED: ReplicaState
REPLICA_STATE_EJECTED: ReplicaState
REPLICA_STATE_STALE: ReplicaState

class RouteEntry(_message.Message):
    __slots__ = ("replica_id", "endpoint", "region", "zone", "state", "weight", "kv_capacity_tokens", "kv_free_tokens", "running", "waiting", "ttft_p95_ms", "itl_p95_ms", "reason", "prefill_tokens_per_s", "decode_step_base_ms", "decode_step_per_seq_ms", "max_num_seqs")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_FREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    TTFT_P95_MS_FIELD_NUMBER: _ClassVar[int]
    ITL_P95_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_PER_SEQ_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    endpoint: str
    region: str
    zone: str
    state: ReplicaState
    weight: float
    kv_capacity_tokens: int
    kv_free_tokens: int
    running: int
    waiting: int
    ttft_p95_ms: float
    itl_p95_ms: float
    reason: str
    prefill_tokens_per_s: float
    decode_step_base_ms: float
    decode_step_per_seq_ms: float
    max_num_seqs: int
    def __init__(self, replica_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., weight: _Optional[float] = ..., kv_capacity_tokens: _Optional[int] = ..., kv_free_tokens: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., ttft_p95_ms: _Optional[float] = ..., itl_p95_ms: _Optional[float] = ..., reason: _Optional[str] = ..., prefill_tokens_per_s: _Optional[float] = ..., decode_step_base_ms: _Optional[float] = ..., decode_step_per_seq_ms: _Optional[float] = ..., max_num_seqs: _Optional[int] = ...) -> None: ...

class RoutingTable(_message.Message):
    __slots__ = ("pool", "generation", "computed_at", "leader_id", "replicas", "schema_version", "slo")
    POOL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    pool: str
    generation: int
    computed_at: _timestamp_pb2.Timestamp
    leader_id: str
    replicas: _containers.RepeatedCompositeFieldContainer[RouteEntry]
    schema_version: int
    slo: PoolSlo
    def __init__(self, pool: _Optional[str] = ..., generation: _Optional[int] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leader_id: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[RouteEntry, _Mapping]]] = ..., schema_version: _Optional[int] = ..., slo: _Optional[_Union[PoolSlo, _Mapping]] = ...) -> None: ...

class ReplicaPresence(_message.Message):
    __slots__ = ("replica_id", "pool", "endpoint", "region", "zone", "controlplane_id", "connected_at")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pool: str
    endpoint: str
    region: str
    zone: str
    controlplane_id: str
    connected_at: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., pool: _Optional[str] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., controlplane_id: _Optional[str] = ..., connected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RouterPresence(_message.Message):
    __slots__ = ("router_id", "region", "url", "updated_at", "inflight_by_replica", "table_generation_by_pool", "consecutive_errors_by_replica", "demand_by_pool")
    class InflightByReplicaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class TableGenerationByPoolEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ConsecutiveErrorsByReplicaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DemandByPoolEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TokenBudget
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TokenBudget, _Mapping]] = ...) -> None: ...
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_BY_REPLICA_FIELD_NUMBER: _ClassVar[int]
    TABLE_GENERATION_BY_POOL_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_ERRORS_BY_REPLICA_FIELD_NUMBER: _ClassVar[int]
    DEMAND_BY_POOL_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    region: str
    url: str
    updated_at: _timestamp_pb2.Timestamp
    inflight_by_replica: _containers.ScalarMap[str, int]
    table_generation_by_pool: _containers.ScalarMap[str, int]
    consecutive_errors_by_replica: _containers.ScalarMap[str, int]
    demand_by_pool: _containers.MessageMap[str, TokenBudget]
    def __init__(self, router_id: _Optional[str] = ..., region: _Optional[str] = ..., url: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., inflight_by_replica: _Optional[_Mapping[str, int]] = ..., table_generation_by_pool: _Optional[_Mapping[str, int]] = ..., consecutive_errors_by_replica: _Optional[_Mapping[str, int]] = ..., demand_by_pool: _Optional[_Mapping[str, TokenBudget]] = ...) -> None: ...

class TokenBudget(_message.Message):
    __slots__ = ("prefill_tokens", "kv_tokens", "sequences")
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    prefill_tokens: float
    kv_tokens: float
    sequences: float
    def __init__(self, prefill_tokens: _Optional[float] = ..., kv_tokens: _Optional[float] = ..., sequences: _Optional[float] = ...) -> None: ...

class AdmissionBudget(_message.Message):
    __slots__ = ("pool", "total", "share_by_router", "class_fraction", "computed_at", "leader_id", "reason")
    class ShareByRouterEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TokenBudget
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TokenBudget, _Mapping]] = ...) -> None: ...
    class ClassFractionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SHARE_BY_ROUTER_FIELD_NUMBER: _ClassVar[int]
    CLASS_FRACTION_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    pool: str
    total: TokenBudget
    share_by_router: _containers.MessageMap[str, TokenBudget]
    class_fraction: _containers.ScalarMap[str, float]
    computed_at: _timestamp_pb2.Timestamp
    leader_id: str
    reason: str
    def __init__(self, pool: _Optional[str] = ..., total: _Optional[_Union[TokenBudget, _Mapping]] = ..., share_by_router: _Optional[_Mapping[str, TokenBudget]] = ..., class_fraction: _Optional[_Mapping[str, float]] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leader_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaderRecord(_message.Message):
    __slots__ = ("controlplane_id", "admin_address", "elected_at")
    CONTROLPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ELECTED_AT_FIELD_NUMBER: _ClassVar[int]
    controlplane_id: str
    admin_address: str
    elected_at: _timestamp_pb2.Timestamp
    def __init__(self, controlplane_id: _Optional[str] = ..., admin_address: _Optional[str] = ..., elected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ReplicaIntent(_message.Message):
    __slots__ = ("replica_id", "cordoned", "draining", "drain_deadline", "force", "reason", "actor", "created_at", "grace_period_s")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CORDONED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    DRAIN_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    cordoned: bool
    draining: bool
    drain_deadline: _timestamp_pb2.Timestamp
    force: bool
    reason: str
    actor: str
    created_at: _timestamp_pb2.Timestamp
    grace_period_s: float
    def __init__(self, replica_id: _Optional[str] = ..., cordoned: _Optional[bool] = ..., draining: _Optional[bool] = ..., drain_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., force: _Optional[bool] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., grace_period_s: _Optional[float] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("at", "kind", "replica_id", "pool", "actor", "reason")
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    kind: str
    replica_id: str
    pool: str
    actor: str
    reason: str
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[str] = ..., replica_id: _Optional[str] = ..., pool: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DisruptionBudget(_message.Message):
    __slots__ = ("scope", "min_available", "max_unavailable", "actor", "updated_at")
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    MIN_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MAX_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    scope: str
    min_available: str
    max_unavailable: str
    actor: str
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, scope: _Optional[str] = ..., min_available: _Optional[str] = ..., max_unavailable: _Optional[str] = ..., actor: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PoolSlo(_message.Message):
    __slots__ = ("pool", "ttft_s", "tpot_s", "actor", "updated_at")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TPOT_S_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    ttft_s: float
    tpot_s: float
    actor: str
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, pool: _Optional[str] = ..., ttft_s: _Optional[float] = ..., tpot_s: _Optional[float] = ..., actor: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ScaleRecommendation(_message.Message):
    __slots__ = ("pool", "recommended_replicas", "current_replicas", "binding", "reason", "headroom", "prompt_tokens_per_s", "generation_tokens_per_s", "computed_at", "leader_id")
    POOL_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BINDING_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTED_AT_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    pool: str
    recommended_replicas: int
    current_replicas: int
    binding: str
    reason: str
    headroom: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    computed_at: _timestamp_pb2.Timestamp
    leader_id: str
    def __init__(self, pool: _Optional[str] = ..., recommended_replicas: _Optional[int] = ..., current_replicas: _Optional[int] = ..., binding: _Optional[str] = ..., reason: _Optional[str] = ..., headroom: _Optional[float] = ..., prompt_tokens_per_s: _Optional[float] = ..., generation_tokens_per_s: _Optional[float] = ..., computed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., leader_id: _Optional[str] = ...) -> None: ...

class FaultRecord(_message.Message):
    __slots__ = ("replica_id", "ejected", "cause", "permanent", "ejected_at", "readmit_at", "ejections", "last_readmit_at", "controlplane_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    EJECTED_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    EJECTED_AT_FIELD_NUMBER: _ClassVar[int]
    READMIT_AT_FIELD_NUMBER: _ClassVar[int]
    EJECTIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_READMIT_AT_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    ejected: bool
    cause: str
    permanent: bool
    ejected_at: _timestamp_pb2.Timestamp
    readmit_at: _timestamp_pb2.Timestamp
    ejections: int
    last_readmit_at: _timestamp_pb2.Timestamp
    controlplane_id: str
    def __init__(self, replica_id: _Optional[str] = ..., ejected: _Optional[bool] = ..., cause: _Optional[str] = ..., permanent: _Optional[bool] = ..., ejected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., readmit_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ejections: _Optional[int] = ..., last_readmit_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., controlplane_id: _Optional[str] = ...) -> None: ...

class RouterLoad(_message.Message):
    __slots__ = ("router_id", "updated_at", "pools")
    class PoolsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: PoolLoad
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[PoolLoad, _Mapping]] = ...) -> None: ...
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    updated_at: _timestamp_pb2.Timestamp
    pools: _containers.MessageMap[str, PoolLoad]
    def __init__(self, router_id: _Optional[str] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pools: _Optional[_Mapping[str, PoolLoad]] = ...) -> None: ...

class PoolLoad(_message.Message):
    __slots__ = ("replicas", "learned", "held", "released")
    class ReplicasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReplicaLoad
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReplicaLoad, _Mapping]] = ...) -> None: ...
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEARNED_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.MessageMap[str, ReplicaLoad]
    learned: _containers.RepeatedCompositeFieldContainer[LearnedBlocks]
    held: HeldLoad
    released: _containers.RepeatedCompositeFieldContainer[ReleasedBlocks]
    def __init__(self, replicas: _Optional[_Mapping[str, ReplicaLoad]] = ..., learned: _Optional[_Iterable[_Union[LearnedBlocks, _Mapping]]] = ..., held: _Optional[_Union[HeldLoad, _Mapping]] = ..., released: _Optional[_Iterable[_Union[ReleasedBlocks, _Mapping]]] = ...) -> None: ...

class HeldLoad(_message.Message):
    __slots__ = ("tokens", "critical_slack_s", "heads")
    class TokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class HeadsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: HeldHead
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[HeldHead, _Mapping]] = ...) -> None: ...
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CRITICAL_SLACK_S_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.ScalarMap[str, float]
    critical_slack_s: float
    heads: _containers.MessageMap[str, HeldHead]
    def __init__(self, tokens: _Optional[_Mapping[str, float]] = ..., critical_slack_s: _Optional[float] = ..., heads: _Optional[_Mapping[str, HeldHead]] = ...) -> None: ...

class HeldHead(_message.Message):
    __slots__ = ("age_s", "prefill_tokens")
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    age_s: float
    prefill_tokens: float
    def __init__(self, age_s: _Optional[float] = ..., prefill_tokens: _Optional[float] = ...) -> None: ...

class ReplicaLoad(_message.Message):
    __slots__ = ("queued_prefill", "waiting", "decoding", "kv", "placed_s", "budgets")
    QUEUED_PREFILL_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    DECODING_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    PLACED_S_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    queued_prefill: float
    waiting: int
    decoding: int
    kv: float
    placed_s: float
    budgets: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, queued_prefill: _Optional[float] = ..., waiting: _Optional[int] = ..., decoding: _Optional[int] = ..., kv: _Optional[float] = ..., placed_s: _Optional[float] = ..., budgets: _Optional[_Iterable[float]] = ...) -> None: ...

class LearnedBlocks(_message.Message):
    __slots__ = ("replica_id", "keys", "tokens_per_block")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    tokens_per_block: float
    def __init__(self, replica_id: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ..., tokens_per_block: _Optional[float] = ...) -> None: ...

class ReleasedBlocks(_message.Message):
    __slots__ = ("replica_id", "keys")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replica_id: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...
