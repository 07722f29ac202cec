"""Engine `/metrics` text -> one `EngineSample`, whatever the engine (pure).

Supported names, as signal: vLLM V1 / vLLM V0 / SGLang (checked against the engines' own docs),
then TGI (text-generation-inference, names from its router/src/server.rs) after the list:

- running requests: vllm:num_requests_running (V1 and V0) / sglang:num_running_reqs
- waiting requests: vllm:num_requests_waiting (V1 and V0) / sglang:num_queue_reqs
- KV usage 0..1: vllm:kv_cache_usage_perc / vllm:gpu_cache_usage_perc / sglang:token_usage
- KV capacity: vllm:cache_config_info labels num_gpu_blocks and block_size (V1 and V0) /
  sglang:max_total_num_tokens (reported as blocks of one token)
- TTFT histogram: vllm:time_to_first_token_seconds / sglang:time_to_first_token_seconds
- ITL histogram: vllm:inter_token_latency_seconds / vllm:time_per_output_token_seconds /
  sglang:inter_token_latency_seconds, else sglang:time_per_output_token_seconds
- E2E histogram: vllm:e2e_request_latency_seconds / sglang:e2e_request_latency_seconds
- counters: vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:num_preemptions_total /
  sglang:prompt_tokens_total, sglang:generation_tokens_total (SGLang has no preemption counter)

For the control plane's rate estimator (cumulative; the collector turns them into deltas):

- engine steps and their tokens: vllm:iteration_tokens_total _count/_sum (V1 and V0) / none in
  SGLang
- decode time seen by tokens: the ITL histogram's _sum/_count (same name as the ITL buckets)
- prefix-cache hit tokens: vllm:prefix_cache_hits_total, else the deprecated
  vllm:gpu_prefix_cache_hits_total (V1; V0 has only a hit-rate gauge) / sglang:cached_tokens_total
  (summed over its cache_source label)
- busy time: none in vLLM / sglang:gpu_execution_seconds_total (summed over its category label;
  recent SGLang only)
- how long prefills span: vllm:request_prefill_time_seconds _sum/_count (V1 and V0: first token
  minus first scheduled, per finished request) / none in SGLang
- requests finished: the E2E histogram's _count (every dialect)

The engine's limit on running sequences, where it exports one: sglang:max_running_requests
(older SGLang releases); vLLM does not export max_num_seqs (the agent's --engine-max-num-seqs).

TGI exports far less, and only per-request histograms (metrics-exporter-prometheus, no `_total`):

- running / waiting: tgi_batch_current_size / tgi_queue_size
- ITL histogram: tgi_request_mean_time_per_token_duration (each request's *mean* time per token,
  so its percentiles are over requests, not tokens); E2E histogram: tgi_request_duration
- prompt / generation token counters: the _sum of tgi_request_input_length /
  tgi_request_generated_tokens (cumulative, so they behave as counters)
- not exported: KV usage and capacity (has_kv_capacity stays false; the control plane then sizes
  the replica from its running/waiting counts), TTFT (TGI has no TTFT histogram; its queue and
  prefill durations are separate histograms that cannot be added per request), preemptions,
  prefix-cache hits, engine-step token counts and a token-weighted decode time (the rate estimator
  falls back to its prior for those)

Where a name has several candidates the first present one wins (V1 before V0). The dialect is
detected from the metric prefixes (vllm:, then sglang:, then tgi_) unless the caller names it.

Parsing works on *sample* names, not family names: prometheus_client's parser strips
`_total` from counter family names (and a counter without a TYPE line keeps it), so the sample
name is the only stable key.

Several label sets (vLLM V1 data-parallel `engine="0"`, `engine="1"`, ...) are summed, except
the KV usage fraction, which is averaged (a sum of fractions is meaningless). When a model name
is given, samples whose `model_name` (or SGLang's older `name`) label names another model are
dropped; samples without such a label (e.g. vllm:cache_config_info) are kept.

It lives in the shared core, not in the agent, because the agent, the fleet simulator and the
demo all read engine pages by these rules (layering: pyproject.toml [tool.importlinter]).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tidegate.errors import TidegateError


class TelemetryParseError(TidegateError):
    """The engine's /metrics text could not be parsed or holds no known engine metric."""


# Cumulative histogram: ((upper_bound, cumulative_count), ...) sorted by bound, +Inf last.
Buckets = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class EngineSample:
    engine: str                       # "vllm", "sglang" or "tgi" (the dialect parsed)
    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None     # 0..1; None when the engine does not export it
    num_gpu_blocks: int = 0           # 0 when unknown
    block_size: int = 0               # tokens per block; 0 when unknown
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    preemptions_total: float | None = None
    ttft: Buckets = ()
    itl: Buckets = ()
    e2e: Buckets = ()
    itl_sum_s: float | None = None
    itl_count: float | None = None
    steps_total: float | None = None          # engine iterations
    step_tokens_total: float | None = None
    prefix_cache_hits_total: float | None = None  # tokens
    busy_seconds_total: float | None = None
    prefill_time_sum_s: float | None = None   # summed prefill durations of finished requests
    prefill_time_count: float | None = None
    finished_total: float | None = None       # requests finished: the E2E histogram's _count
    max_running: int = 0                      # the engine's limit on running sequences; 0 = not exported

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def has_kv_capacity(self) -> bool:
        return self.kv_capacity_tokens > 0


@dataclass(frozen=True)
class _Names:
    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]
    ttft: tuple[str, ...]
    itl: tuple[str, ...]
    e2e: tuple[str, ...]
    prompt: tuple[str, ...]
    generation: tuple[str, ...]
    preemptions: tuple[str, ...]
    iterations: tuple[str, ...]
    cache_hits: tuple[str, ...]
    busy: tuple[str, ...]
    # Histograms whose _sum/_count are token-weighted decode time (the ITL's, except in TGI).
    work_itl: tuple[str, ...]
    # Histograms of each request's prefill duration (first token minus first scheduled).
    prefill_time: tuple[str, ...]
    prefix: str


_VLLM = _Names(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ttft=("vllm:time_to_first_token_seconds",),
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    e2e=("vllm:e2e_request_latency_seconds",),
    prompt=("vllm:prompt_tokens_total",),
    generation=("vllm:generation_tokens_total",),
    preemptions=("vllm:num_preemptions_total",),
    iterations=("vllm:iteration_tokens_total",),
    cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    busy=(),
    work_itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    prefill_time=("vllm:request_prefill_time_seconds",),
    prefix="vllm:",
)

_SGLANG = _Names(
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    ttft=("sglang:time_to_first_token_seconds",),
    itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e=("sglang:e2e_request_latency_seconds",),
    prompt=("sglang:prompt_tokens_total",),
    generation=("sglang:generation_tokens_total",),
    preemptions=(),
    iterations=(),
    cache_hits=("sglang:cached_tokens_total",),
    busy=("sglang:gpu_execution_seconds_total",),
    work_itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    prefill_time=(),
    prefix="sglang:",
)

_TGI = _Names(
    running=("tgi_batch_current_size",),
    waiting=("tgi_queue_size",),
    kv_usage=(),
    ttft=(),
    itl=("tgi_request_mean_time_per_token_duration",),
    e2e=("tgi_request_duration",),
    prompt=("tgi_request_input_length_sum",),
    generation=("tgi_request_generated_tokens_sum",),
    preemptions=(),
    iterations=(),
    cache_hits=(),
    busy=(),
    work_itl=(),
    prefill_time=(),
    prefix="tgi_",
)

# Detection order: a page holding several dialects (a proxy's aggregate) is read as the first.
DIALECTS: dict[str, _Names] = {"vllm": _VLLM, "sglang": _SGLANG, "tgi": _TGI}

_MODEL_LABELS = ("model_name", "name")


def _keep(labels: dict[str, str], model: str | None) -> bool:
    if not model:
        return True
    for key in _MODEL_LABELS:
        if key in labels:
            return labels[key] == model
    return True


def _index(text: str, model: str | None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """sample name -> [(labels, value)], model-filtered."""
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if _keep(s.labels, model):
                    out[s.name].append((s.labels, float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        # The parser reports garbage with assorted built-in exceptions; one error type for callers.
        raise TelemetryParseError(f"engine /metrics is not Prometheus text: {exc}") from None
    return out


def _first(idx: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str]) -> str | None:
    for name in names:
        if idx.get(name):
            return name
    return None


def _sum(idx: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str]) -> float | None:
    name = _first(idx, names)
    if name is None:
        return None
    return sum(v for _, v in idx[name] if math.isfinite(v))


def _mean(idx: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str]) -> float | None:
    name = _first(idx, names)
    if name is None:
        return None
    vals = [v for _, v in idx[name] if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def _buckets(idx: dict[str, list[tuple[dict[str, str], float]]], names: Iterable[str]) -> Buckets:
    for name in names:
        rows = idx.get(name + "_bucket")
        if not rows:
            continue
        per_le: dict[float, float] = defaultdict(float)
        for labels, value in rows:
            try:
                le = float(labels["le"])
            except (KeyError, ValueError):
                continue
            per_le[le] += value
        return tuple(sorted(per_le.items()))
    return ()


def _hist_sum_count(idx: dict[str, list[tuple[dict[str, str], float]]],
                    names: Iterable[str]) -> tuple[float | None, float | None]:
    """(_sum, _count) of the first histogram in `names` that has buckets (so they match the buckets)."""
    for name in names:
        if idx.get(name + "_bucket") or idx.get(name + "_count"):
            return _sum(idx, (name + "_sum",)), _sum(idx, (name + "_count",))
    return None, None


def _int_label(labels: dict[str, str], key: str) -> int:
    try:
        return int(float(labels.get(key, "0")))
    except ValueError:
        return 0


def _dialect(idx: dict[str, list[tuple[dict[str, str], float]]], dialect: str,
             model: str | None) -> tuple[str, _Names]:
    who = f" for model {model!r}" if model else ""
    if dialect == "auto":
        for engine, names in DIALECTS.items():
            if any(k.startswith(names.prefix) for k in idx):
                return engine, names
        raise TelemetryParseError(f"engine /metrics holds no vLLM, SGLang or TGI metrics{who}")
    chosen = DIALECTS.get(dialect)
    if chosen is None:
        raise ValueError(f"unknown metrics dialect {dialect!r}; expected auto, {', '.join(DIALECTS)}")
    if not any(k.startswith(chosen.prefix) for k in idx):
        raise TelemetryParseError(f"engine /metrics holds no {dialect} metrics ({chosen.prefix}*){who}")
    return dialect, chosen


def parse_metrics(text: str, model: str | None = None, dialect: str = "auto") -> EngineSample:
    """Parse one scrape. Raises TelemetryParseError on garbage or when no engine metric is found.

    `dialect` is "auto" (detect from the metric prefixes) or one of DIALECTS."""
    idx = _index(text, model)
    engine, names = _dialect(idx, dialect, model)

    running = _sum(idx, names.running)
    waiting = _sum(idx, names.waiting)
    kv_usage = _mean(idx, names.kv_usage)
    if running is None and waiting is None and kv_usage is None:
        who = f" for model {model!r}" if model else ""
        raise TelemetryParseError(f"engine /metrics lacks running/waiting/KV usage metrics{who}")

    num_blocks, block_size = 0, 0
    if engine == "vllm":
        for labels, _ in idx.get("vllm:cache_config_info", []):
            num_blocks += _int_label(labels, "num_gpu_blocks")
            block_size = max(block_size, _int_label(labels, "block_size"))
    elif engine == "sglang":
        # SGLang exports its token pool size directly: treat it as blocks of one token.
        tokens = _sum(idx, ("sglang:max_total_num_tokens",))
        if tokens:
            num_blocks, block_size = int(tokens), 1
    if num_blocks <= 0 or block_size <= 0:
        num_blocks, block_size = 0, 0

    if kv_usage is not None:
        kv_usage = min(1.0, max(0.0, kv_usage))
    itl_sum, itl_count = _hist_sum_count(idx, names.work_itl)
    step_tokens, steps = _hist_sum_count(idx, names.iterations)
    prefill_sum, prefill_count = _hist_sum_count(idx, names.prefill_time)
    _, finished = _hist_sum_count(idx, names.e2e)
    seats = _sum(idx, ("sglang:max_running_requests",)) if engine == "sglang" else None
    return EngineSample(
        engine=engine,
        running=int(running or 0),
        waiting=int(waiting or 0),
        kv_usage=kv_usage,
        num_gpu_blocks=num_blocks,
        block_size=block_size,
        prompt_tokens_total=_sum(idx, names.prompt),
        generation_tokens_total=_sum(idx, names.generation),
        preemptions_total=_sum(idx, names.preemptions),
        ttft=_buckets(idx, names.ttft),
        itl=_buckets(idx, names.itl),
        e2e=_buckets(idx, names.e2e),
        itl_sum_s=itl_sum,
        itl_count=itl_count,
        steps_total=steps,
        step_tokens_total=step_tokens,
        prefix_cache_hits_total=_sum(idx, names.cache_hits),
        busy_seconds_total=_sum(idx, names.busy),
        prefill_time_sum_s=prefill_sum,
        prefill_time_count=prefill_count,
        finished_total=finished,
        max_running=int(seats) if seats is not None and math.isfinite(seats) and seats >= 1 else 0,
    )
