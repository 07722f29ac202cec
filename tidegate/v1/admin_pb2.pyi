import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from tidegate.v1 import records_pb2 as _records_pb2
from tidegate.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Selector(_message.Message):
    __slots__ = ("replica_ids", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, replica_ids: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReplicaSummary(_message.Message):
    __slots__ = ("replica_id", "pool", "region", "zone", "endpoint", "state", "weight", "kv_cache_usage", "waiting", "queued_prefill_tokens", "running", "ttft_p95_ms", "itl_p95_ms", "gpu_memory_used_bytes", "gpu_memory_total_bytes", "report_age_s", "reason", "gpu_telemetry_available", "max_num_seqs")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TTFT_P95_MS_FIELD_NUMBER: _ClassVar[int]
    ITL_P95_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPORT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GPU_TELEMETRY_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pool: str
    region: str
    zone: str
    endpoint: str
    state: _records_pb2.ReplicaState
    weight: float
    kv_cache_usage: float
    waiting: int
    queued_prefill_tokens: int
    running: int
    ttft_p95_ms: float
    itl_p95_ms: float
    gpu_memory_used_bytes: int
    gpu_memory_total_bytes: int
    report_age_s: float
    reason: str
    gpu_telemetry_available: bool
    max_num_seqs: int
    def __init__(self, replica_id: _Optional[str] = ..., pool: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., endpoint: _Optional[str] = ..., state: _Optional[_Union[_records_pb2.ReplicaState, str]] = ..., weight: _Optional[float] = ..., kv_cache_usage: _Optional[float] = ..., waiting: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., running: _Optional[int] = ..., ttft_p95_ms: _Optional[float] = ..., itl_p95_ms: _Optional[float] = ..., gpu_memory_used_bytes: _Optional[int] = ..., gpu_memory_total_bytes: _Optional[int] = ..., report_age_s: _Optional[float] = ..., reason: _Optional[str] = ..., gpu_telemetry_available: _Optional[bool] = ..., max_num_seqs: _Optional[int] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ("pool", "region", "state")
    POOL_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    region: str
    state: _records_pb2.ReplicaState
    def __init__(self, pool: _Optional[str] = ..., region: _Optional[str] = ..., state: _Optional[_Union[_records_pb2.ReplicaState, str]] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas", "controlplane_id", "leader")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaSummary]
    controlplane_id: str
    leader: bool
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaSummary, _Mapping]]] = ..., controlplane_id: _Optional[str] = ..., leader: _Optional[bool] = ...) -> None: ...

class DescribeReplicaRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class ReplicaDetail(_message.Message):
    __slots__ = ("summary", "hello", "last_report", "intent", "reasons", "events")
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    summary: ReplicaSummary
    hello: _telemetry_pb2.Hello
    last_report: _telemetry_pb2.Report
    intent: _records_pb2.ReplicaIntent
    reasons: _containers.RepeatedScalarFieldContainer[str]
    events: _containers.RepeatedCompositeFieldContainer[_records_pb2.Event]
    def __init__(self, summary: _Optional[_Union[ReplicaSummary, _Mapping]] = ..., hello: _Optional[_Union[_telemetry_pb2.Hello, _Mapping]] = ..., last_report: _Optional[_Union[_telemetry_pb2.Report, _Mapping]] = ..., intent: _Optional[_Union[_records_pb2.ReplicaIntent, _Mapping]] = ..., reasons: _Optional[_Iterable[str]] = ..., events: _Optional[_Iterable[_Union[_records_pb2.Event, _Mapping]]] = ...) -> None: ...

class PoolSummary(_message.Message):
    __slots__ = ("pool", "replicas_by_state", "generation", "total_weight", "demand_rps", "slo_attainment", "recommended_replicas", "budgets", "available", "slo", "scale")
    class ReplicasByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    DEMAND_RPS_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    replicas_by_state: _containers.ScalarMap[str, int]
    generation: int
    total_weight: float
    demand_rps: float
    slo_attainment: float
    recommended_replicas: int
    budgets: _containers.RepeatedCompositeFieldContainer[_records_pb2.DisruptionBudget]
    available: int
    slo: _records_pb2.PoolSlo
    scale: _records_pb2.ScaleRecommendation
    def __init__(self, pool: _Optional[str] = ..., replicas_by_state: _Optional[_Mapping[str, int]] = ..., generation: _Optional[int] = ..., total_weight: _Optional[float] = ..., demand_rps: _Optional[float] = ..., slo_attainment: _Optional[float] = ..., recommended_replicas: _Optional[int] = ..., budgets: _Optional[_Iterable[_Union[_records_pb2.DisruptionBudget, _Mapping]]] = ..., available: _Optional[int] = ..., slo: _Optional[_Union[_records_pb2.PoolSlo, _Mapping]] = ..., scale: _Optional[_Union[_records_pb2.ScaleRecommendation, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolSummary]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolSummary, _Mapping]]] = ...) -> None: ...

class CordonRequest(_message.Message):
    __slots__ = ("selector", "reason", "dry_run", "force")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    selector: Selector
    reason: str
    dry_run: bool
    force: bool
    def __init__(self, selector: _Optional[_Union[Selector, _Mapping]] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class UncordonRequest(_message.Message):
    __slots__ = ("selector", "reason", "dry_run")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    selector: Selector
    reason: str
    dry_run: bool
    def __init__(self, selector: _Optional[_Union[Selector, _Mapping]] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("selector", "reason", "dry_run", "force", "timeout_s", "grace_period_s")
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    selector: Selector
    reason: str
    dry_run: bool
    force: bool
    timeout_s: float
    grace_period_s: float
    def __init__(self, selector: _Optional[_Union[Selector, _Mapping]] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., force: _Optional[bool] = ..., timeout_s: _Optional[float] = ..., grace_period_s: _Optional[float] = ...) -> None: ...

class IntentResult(_message.Message):
    __slots__ = ("replica_id", "changed", "message", "refused")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    changed: bool
    message: str
    refused: bool
    def __init__(self, replica_id: _Optional[str] = ..., changed: _Optional[bool] = ..., message: _Optional[str] = ..., refused: _Optional[bool] = ...) -> None: ...

class IntentResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[IntentResult]
    def __init__(self, results: _Optional[_Iterable[_Union[IntentResult, _Mapping]]] = ...) -> None: ...

class DrainStatusRequest(_message.Message):
    __slots__ = ("replica_ids",)
    REPLICA_IDS_FIELD_NUMBER: _ClassVar[int]
    replica_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainProgress(_message.Message):
    __slots__ = ("replica_id", "state", "running", "waiting", "router_inflight", "deadline", "done")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    ROUTER_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    state: _records_pb2.ReplicaState
    running: int
    waiting: int
    router_inflight: int
    deadline: _timestamp_pb2.Timestamp
    done: bool
    def __init__(self, replica_id: _Optional[str] = ..., state: _Optional[_Union[_records_pb2.ReplicaState, str]] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., router_inflight: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., done: _Optional[bool] = ...) -> None: ...

class DrainStatusResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[DrainProgress]
    def __init__(self, replicas: _Optional[_Iterable[_Union[DrainProgress, _Mapping]]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("replica_id", "limit")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    limit: int
    def __init__(self, replica_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_records_pb2.Event]
    def __init__(self, events: _Optional[_Iterable[_Union[_records_pb2.Event, _Mapping]]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class SetBudgetRequest(_message.Message):
    __slots__ = ("budget", "delete")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    budget: _records_pb2.DisruptionBudget
    delete: bool
    def __init__(self, budget: _Optional[_Union[_records_pb2.DisruptionBudget, _Mapping]] = ..., delete: _Optional[bool] = ...) -> None: ...

class SetBudgetResponse(_message.Message):
    __slots__ = ("budget", "message")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    budget: _records_pb2.DisruptionBudget
    message: str
    def __init__(self, budget: _Optional[_Union[_records_pb2.DisruptionBudget, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class ListBudgetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBudgetsResponse(_message.Message):
    __slots__ = ("budgets",)
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[_records_pb2.DisruptionBudget]
    def __init__(self, budgets: _Optional[_Iterable[_Union[_records_pb2.DisruptionBudget, _Mapping]]] = ...) -> None: ...

class SetPoolSloRequest(_message.Message):
    __slots__ = ("slo", "clear")
    SLO_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    slo: _records_pb2.PoolSlo
    clear: bool
    def __init__(self, slo: _Optional[_Union[_records_pb2.PoolSlo, _Mapping]] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetPoolSloResponse(_message.Message):
    __slots__ = ("slo", "message")
    SLO_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    slo: _records_pb2.PoolSlo
    message: str
    def __init__(self, slo: _Optional[_Union[_records_pb2.PoolSlo, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class GetPoolSloRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class GetPoolSloResponse(_message.Message):
    __slots__ = ("slos",)
    SLOS_FIELD_NUMBER: _ClassVar[int]
    slos: _containers.RepeatedCompositeFieldContainer[_records_pb2.PoolSlo]
    def __init__(self, slos: _Optional[_Iterable[_Union[_records_pb2.PoolSlo, _Mapping]]] = ...) -> None: ...
