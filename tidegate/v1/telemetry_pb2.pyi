import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from tidegate.v1 import records_pb2 as _records_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentMessage(_message.Message):
    __slots__ = ("hello", "report")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: Report
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[Report, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("ack", "directive")
    ACK_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVE_FIELD_NUMBER: _ClassVar[int]
    ack: Ack
    directive: Directive
    def __init__(self, ack: _Optional[_Union[Ack, _Mapping]] = ..., directive: _Optional[_Union[Directive, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("replica_id", "pool", "endpoint", "region", "zone", "gpu_indices", "engine_kind", "agent_version", "protocol_version", "capabilities", "report_interval_ms", "prior_prefill_tokens_per_s", "prior_decode_step_base_ms", "prior_decode_step_per_seq_ms")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KIND_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PRIOR_DECODE_STEP_BASE_MS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_DECODE_STEP_PER_SEQ_MS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    pool: str
    endpoint: str
    region: str
    zone: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    engine_kind: str
    agent_version: str
    protocol_version: int
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    report_interval_ms: int
    prior_prefill_tokens_per_s: float
    prior_decode_step_base_ms: float
    prior_decode_step_per_seq_ms: float
    def __init__(self, replica_id: _Optional[str] = ..., pool: _Optional[str] = ..., endpoint: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., engine_kind: _Optional[str] = ..., agent_version: _Optional[str] = ..., protocol_version: _Optional[int] = ..., capabilities: _Optional[_Iterable[str]] = ..., report_interval_ms: _Optional[int] = ..., prior_prefill_tokens_per_s: _Optional[float] = ..., prior_decode_step_base_ms: _Optional[float] = ..., prior_decode_step_per_seq_ms: _Optional[float] = ...) -> None: ...

class LatencySummary(_message.Message):
    __slots__ = ("p50_ms", "p95_ms", "p99_ms", "count")
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    p50_ms: float
    p95_ms: float
    p99_ms: float
    count: float
    def __init__(self, p50_ms: _Optional[float] = ..., p95_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., count: _Optional[float] = ...) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("healthy", "error", "num_requests_running", "num_requests_waiting", "kv_cache_usage", "num_gpu_blocks", "block_size", "kv_capacity_tokens", "kv_free_tokens", "prompt_tokens_total", "generation_tokens_total", "preemptions_total", "ttft", "itl", "e2e", "window_s", "prompt_tokens_per_s", "generation_tokens_per_s", "has_kv_capacity", "work", "max_num_seqs")
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_GPU_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_CAPACITY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_FREE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TTFT_FIELD_NUMBER: _ClassVar[int]
    ITL_FIELD_NUMBER: _ClassVar[int]
    E2E_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    HAS_KV_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    healthy: bool
    error: str
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    num_gpu_blocks: int
    block_size: int
    kv_capacity_tokens: int
    kv_free_tokens: int
    prompt_tokens_total: float
    generation_tokens_total: float
    preemptions_total: float
    ttft: LatencySummary
    itl: LatencySummary
    e2e: LatencySummary
    window_s: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    has_kv_capacity: bool
    work: EngineWork
    max_num_seqs: int
    def __init__(self, healthy: _Optional[bool] = ..., error: _Optional[str] = ..., num_requests_running: _Optional[int] = ..., num_requests_waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., num_gpu_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., kv_capacity_tokens: _Optional[int] = ..., kv_free_tokens: _Optional[int] = ..., prompt_tokens_total: _Optional[float] = ..., generation_tokens_total: _Optional[float] = ..., preemptions_total: _Optional[float] = ..., ttft: _Optional[_Union[LatencySummary, _Mapping]] = ..., itl: _Optional[_Union[LatencySummary, _Mapping]] = ..., e2e: _Optional[_Union[LatencySummary, _Mapping]] = ..., window_s: _Optional[float] = ..., prompt_tokens_per_s: _Optional[float] = ..., generation_tokens_per_s: _Optional[float] = ..., has_kv_capacity: _Optional[bool] = ..., work: _Optional[_Union[EngineWork, _Mapping]] = ..., max_num_seqs: _Optional[int] = ...) -> None: ...

class EngineWork(_message.Message):
    __slots__ = ("interval_s", "steps", "step_tokens", "prompt_tokens", "cached_prompt_tokens", "generation_tokens", "itl_sum_s", "itl_count", "busy_s", "prefill_time_sum_s", "prefill_time_count", "finished_requests")
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ITL_SUM_S_FIELD_NUMBER: _ClassVar[int]
    ITL_COUNT_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TIME_SUM_S_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TIME_COUNT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    steps: float
    step_tokens: float
    prompt_tokens: float
    cached_prompt_tokens: float
    generation_tokens: float
    itl_sum_s: float
    itl_count: float
    busy_s: float
    prefill_time_sum_s: float
    prefill_time_count: float
    finished_requests: float
    def __init__(self, interval_s: _Optional[float] = ..., steps: _Optional[float] = ..., step_tokens: _Optional[float] = ..., prompt_tokens: _Optional[float] = ..., cached_prompt_tokens: _Optional[float] = ..., generation_tokens: _Optional[float] = ..., itl_sum_s: _Optional[float] = ..., itl_count: _Optional[float] = ..., busy_s: _Optional[float] = ..., prefill_time_sum_s: _Optional[float] = ..., prefill_time_count: _Optional[float] = ..., finished_requests: _Optional[float] = ...) -> None: ...

class GpuStats(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_total_bytes", "memory_used_bytes", "utilization_pct", "ecc_uncorrected_volatile", "ecc_corrected_volatile", "retired_pages_pending", "lost", "error", "temperature_c", "power_w", "xid_events", "row_remap_failed")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    ROW_REMAP_FAILED_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_pct: float
    ecc_uncorrected_volatile: int
    ecc_corrected_volatile: int
    retired_pages_pending: int
    lost: bool
    error: str
    temperature_c: float
    power_w: float
    xid_events: _containers.RepeatedScalarFieldContainer[int]
    row_remap_failed: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., utilization_pct: _Optional[float] = ..., ecc_uncorrected_volatile: _Optional[int] = ..., ecc_corrected_volatile: _Optional[int] = ..., retired_pages_pending: _Optional[int] = ..., lost: _Optional[bool] = ..., error: _Optional[str] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., xid_events: _Optional[_Iterable[int]] = ..., row_remap_failed: _Optional[bool] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("seq", "sent_at", "engine", "gpu_telemetry_available", "gpu_telemetry_error", "gpus", "simulated_gpu")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GPU_TELEMETRY_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    GPU_TELEMETRY_ERROR_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_GPU_FIELD_NUMBER: _ClassVar[int]
    seq: int
    sent_at: _timestamp_pb2.Timestamp
    engine: EngineStats
    gpu_telemetry_available: bool
    gpu_telemetry_error: str
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStats]
    simulated_gpu: bool
    def __init__(self, seq: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., engine: _Optional[_Union[EngineStats, _Mapping]] = ..., gpu_telemetry_available: _Optional[bool] = ..., gpu_telemetry_error: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[GpuStats, _Mapping]]] = ..., simulated_gpu: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "state", "weight", "controlplane_id")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANE_ID_FIELD_NUMBER: _ClassVar[int]
    seq: int
    state: _records_pb2.ReplicaState
    weight: float
    controlplane_id: str
    def __init__(self, seq: _Optional[int] = ..., state: _Optional[_Union[_records_pb2.ReplicaState, str]] = ..., weight: _Optional[float] = ..., controlplane_id: _Optional[str] = ...) -> None: ...

class Directive(_message.Message):
    __slots__ = ("kind", "report_interval_ms", "reason", "leader_address")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Directive.Kind]
        KIND_SET_REPORT_INTERVAL: _ClassVar[Directive.Kind]
        KIND_RECONNECT_ELSEWHERE: _ClassVar[Directive.Kind]
    KIND_UNSPECIFIED: Directive.Kind
    KIND_SET_REPORT_INTERVAL: Directive.Kind
    KIND_RECONNECT_ELSEWHERE: Directive.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    kind: Directive.Kind
    report_interval_ms: int
    reason: str
    leader_address: str
    def __init__(self, kind: _Optional[_Union[Directive.Kind, str]] = ..., report_interval_ms: _Optional[int] = ..., reason: _Optional[str] = ..., leader_address: _Optional[str] = ...) -> None: ...
