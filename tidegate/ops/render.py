"""Output of the operations commands: plain aligned tables for people, stable JSON for scripts.

Pure functions of the admin API's messages (and of `now` where an age is shown). The JSON
shapes are documented in docs/OPERATIONS.md ("JSON output"); change them only additively.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from tidegate.ops.durations import format_duration
from tidegate.ops.selectors import state_name
from tidegate.v1 import admin_pb2, records_pb2

API_VERSION = "tidegate/v1"


# ---------------------------------------------------------------- primitives


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces (kubectl style); no trailing spaces."""
    rows = [list(map(str, r)) for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for r in [list(headers), *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    return "\n".join(lines)


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


def fmt_bytes(n: int) -> str:
    if n <= 0:
        return "0"
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def fmt_count(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    if n >= 1000:
        return f"{n / 1000:.1f}k"
    return f"{n:.0f}"


def fmt_ms(ms: float) -> str:
    if ms <= 0:
        return "-"
    return f"{ms / 1000:.2f}s" if ms >= 1000 else f"{ms:.0f}ms"


def fmt_pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def timestamp_iso(ts: timestamp_pb2.Timestamp) -> str | None:
    """RFC 3339 UTC with milliseconds, or None for an unset timestamp."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    t = ts.ToDatetime(tzinfo=dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _proto_dict(msg: Any) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


# ---------------------------------------------------------------- replicas


def gpu_mem(s: admin_pb2.ReplicaSummary) -> str:
    if not s.gpu_telemetry_available or s.gpu_memory_total_bytes == 0:
        return "n/a"
    return f"{fmt_bytes(s.gpu_memory_used_bytes)}/{fmt_bytes(s.gpu_memory_total_bytes)}"


REPLICA_HEADERS = ("ID", "POOL", "REGION/ZONE", "STATE", "WEIGHT", "KV", "QUEUE(REQ/TOK)", "RUNNING",
                   "TTFT-P95", "ITL-P95", "GPU-MEM", "REPORT-AGE")
REPLICA_WIDE = ("ENDPOINT", "REASON")


def replica_row(s: admin_pb2.ReplicaSummary, wide: bool = False) -> list[str]:
    row = [s.replica_id, s.pool, f"{s.region}/{s.zone}", state_name(s.state), f"{s.weight:.2f}",
           fmt_pct(s.kv_cache_usage), f"{s.waiting}/{fmt_count(s.queued_prefill_tokens)}", str(s.running),
           fmt_ms(s.ttft_p95_ms), fmt_ms(s.itl_p95_ms), gpu_mem(s), format_duration(s.report_age_s)]
    if wide:
        row += [s.endpoint, s.reason or "-"]
    return row


def replicas_table(resp: admin_pb2.ListReplicasResponse, wide: bool = False) -> str:
    headers = REPLICA_HEADERS + (REPLICA_WIDE if wide else ())
    rows = [replica_row(s, wide) for s in sorted(resp.replicas, key=lambda s: (s.pool, s.replica_id))]
    if not rows:
        return "No replicas."
    return table(headers, rows)


def replica_json(s: admin_pb2.ReplicaSummary) -> dict[str, Any]:
    return {
        "id": s.replica_id, "pool": s.pool, "region": s.region, "zone": s.zone, "endpoint": s.endpoint,
        "state": state_name(s.state), "weight": s.weight, "kv_cache_usage": s.kv_cache_usage,
        "waiting": s.waiting, "queued_prefill_tokens": s.queued_prefill_tokens, "running": s.running,
        "max_num_seqs": s.max_num_seqs,
        "ttft_p95_ms": s.ttft_p95_ms, "itl_p95_ms": s.itl_p95_ms,
        "gpu_telemetry_available": s.gpu_telemetry_available,
        "gpu_memory_used_bytes": s.gpu_memory_used_bytes, "gpu_memory_total_bytes": s.gpu_memory_total_bytes,
        "report_age_s": s.report_age_s, "reason": s.reason,
    }


def replicas_json(resp: admin_pb2.ListReplicasResponse) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "ReplicaList", "controlplane_id": resp.controlplane_id,
            "leader": resp.leader,
            "replicas": [replica_json(s) for s in sorted(resp.replicas, key=lambda s: (s.pool, s.replica_id))]}


# ---------------------------------------------------------------- pools and budgets


def budget_json(b: records_pb2.DisruptionBudget) -> dict[str, Any]:
    return {"scope": b.scope, "min_available": b.min_available or None,
            "max_unavailable": b.max_unavailable or None, "actor": b.actor,
            "updated_at": timestamp_iso(b.updated_at)}


def budget_text(b: records_pb2.DisruptionBudget) -> str:
    if b.min_available:
        return f"{b.scope} min-available {b.min_available}"
    if b.max_unavailable:
        return f"{b.scope} max-unavailable {b.max_unavailable}"
    return f"{b.scope} (empty)"


def budgets_table(resp: admin_pb2.ListBudgetsResponse) -> str:
    if not resp.budgets:
        return "No disruption budgets."
    rows = [[b.scope, b.min_available or "-", b.max_unavailable or "-", b.actor or "-",
             timestamp_iso(b.updated_at) or "-"] for b in sorted(resp.budgets, key=lambda b: b.scope)]
    return table(("SCOPE", "MIN-AVAILABLE", "MAX-UNAVAILABLE", "ACTOR", "UPDATED"), rows)


def budgets_json(resp: admin_pb2.ListBudgetsResponse) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "BudgetList",
            "budgets": [budget_json(b) for b in sorted(resp.budgets, key=lambda b: b.scope)]}


def states_text(by_state: dict[str, int] | Any) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(dict(by_state).items()) if v) or "-"


def _slo(p: admin_pb2.PoolSummary) -> str:
    return "-" if p.slo_attainment < 0 else fmt_pct(p.slo_attainment)


def slo_text(slo: records_pb2.PoolSlo) -> str:
    """"2.00s/100ms": the TTFT and TPOT targets."""
    return f"{fmt_ms(slo.ttft_s * 1000)}/{fmt_ms(slo.tpot_s * 1000)}"


def slo_json(slo: records_pb2.PoolSlo) -> dict[str, Any]:
    return {"pool": slo.pool, "ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "actor": slo.actor,
            "updated_at": timestamp_iso(slo.updated_at)}


def scale_json(r: records_pb2.ScaleRecommendation) -> dict[str, Any]:
    return {"recommended_replicas": r.recommended_replicas or None, "current_replicas": r.current_replicas,
            "binding": r.binding, "reason": r.reason, "headroom": r.headroom,
            "prompt_tokens_per_s": r.prompt_tokens_per_s, "generation_tokens_per_s": r.generation_tokens_per_s,
            "computed_at": timestamp_iso(r.computed_at)}


def pool_row(p: admin_pb2.PoolSummary) -> list[str]:
    total = sum(p.replicas_by_state.values())
    return [p.pool, str(total), str(p.available), states_text(p.replicas_by_state), f"{p.total_weight:.2f}",
            f"{p.demand_rps:.1f}", slo_text(p.slo) if p.HasField("slo") else "-", _slo(p),
            str(p.recommended_replicas) if p.recommended_replicas else "-",
            "; ".join(budget_text(b) for b in p.budgets) or "-", str(p.generation)]


POOL_HEADERS = ("POOL", "REPLICAS", "AVAILABLE", "STATES", "WEIGHT", "DEMAND(RPS)", "TTFT/TPOT", "SLO",
                "RECOMMENDED", "BUDGETS", "GEN")


def pools_table(resp: admin_pb2.ListPoolsResponse) -> str:
    if not resp.pools:
        return "No pools."
    return table(POOL_HEADERS, [pool_row(p) for p in sorted(resp.pools, key=lambda p: p.pool)])


def pool_json(p: admin_pb2.PoolSummary) -> dict[str, Any]:
    return {"pool": p.pool, "generation": p.generation, "replicas": sum(p.replicas_by_state.values()),
            "replicas_by_state": dict(sorted(p.replicas_by_state.items())), "available": p.available,
            "total_weight": p.total_weight, "demand_rps": p.demand_rps,
            "slo_attainment": None if p.slo_attainment < 0 else p.slo_attainment,
            "recommended_replicas": p.recommended_replicas,
            "slo": slo_json(p.slo) if p.HasField("slo") else None,
            "scale": scale_json(p.scale) if p.HasField("scale") else None,
            "budgets": [budget_json(b) for b in p.budgets]}


def slos_table(slos: Sequence[records_pb2.PoolSlo]) -> str:
    if not slos:
        return "No pool SLOs."
    rows = [[s.pool, fmt_ms(s.ttft_s * 1000), fmt_ms(s.tpot_s * 1000), s.actor or "-",
             timestamp_iso(s.updated_at) or "-"] for s in sorted(slos, key=lambda s: s.pool)]
    return table(("POOL", "TTFT", "TPOT", "ACTOR", "UPDATED"), rows)


def slos_json(slos: Sequence[records_pb2.PoolSlo]) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "PoolSloList",
            "slos": [slo_json(s) for s in sorted(slos, key=lambda s: s.pool)]}


def pools_json(resp: admin_pb2.ListPoolsResponse) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "PoolList",
            "pools": [pool_json(p) for p in sorted(resp.pools, key=lambda p: p.pool)]}


# ---------------------------------------------------------------- events


def event_json(e: records_pb2.Event) -> dict[str, Any]:
    return {"at": timestamp_iso(e.at), "kind": e.kind, "replica_id": e.replica_id, "pool": e.pool,
            "actor": e.actor, "reason": e.reason}


def event_row(e: records_pb2.Event) -> list[str]:
    return [timestamp_iso(e.at) or "-", e.kind, e.replica_id or "-", e.actor or "-", e.reason or "-"]


EVENT_HEADERS = ("TIME", "KIND", "REPLICA", "ACTOR", "REASON")


def _by_time(events: Sequence[records_pb2.Event]) -> list[records_pb2.Event]:
    return sorted(events, key=lambda e: (e.at.seconds, e.at.nanos))


def events_table(events: Sequence[records_pb2.Event]) -> str:
    if not events:
        return "No events."
    return table(EVENT_HEADERS, [event_row(e) for e in _by_time(events)])


def event_line(e: records_pb2.Event) -> str:
    """One event for `events --follow` (space-separated, reason last)."""
    return "  ".join(event_row(e))


def events_json(events: Sequence[records_pb2.Event]) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "EventList", "events": [event_json(e) for e in _by_time(events)]}


def event_key(e: records_pb2.Event) -> tuple[int, int, str, str, str, str]:
    """Identity of an event, to drop repeats when a watch is reopened."""
    return (e.at.seconds, e.at.nanos, e.kind, e.replica_id, e.actor, e.reason)


# ---------------------------------------------------------------- describe


def intent_json(i: records_pb2.ReplicaIntent) -> dict[str, Any]:
    return {"replica_id": i.replica_id, "cordoned": i.cordoned, "draining": i.draining,
            "drain_deadline": timestamp_iso(i.drain_deadline), "grace_period_s": i.grace_period_s,
            "force": i.force, "reason": i.reason,
            "actor": i.actor, "created_at": timestamp_iso(i.created_at)}


def detail_json(d: admin_pb2.ReplicaDetail) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "ReplicaDetail", "summary": replica_json(d.summary),
            "hello": _proto_dict(d.hello) if d.HasField("hello") else None,
            "last_report": _proto_dict(d.last_report) if d.HasField("last_report") else None,
            "intent": intent_json(d.intent) if d.HasField("intent") and d.intent.replica_id else None,
            "reasons": list(d.reasons), "events": [event_json(e) for e in d.events]}


def _kv(pairs: Sequence[tuple[str, str]], indent: int = 0) -> list[str]:
    width = max((len(k) for k, _ in pairs), default=0) + 1
    return [" " * indent + f"{k + ':':<{width}} {v}".rstrip() for k, v in pairs]


def describe_text(d: admin_pb2.ReplicaDetail) -> str:
    s = d.summary
    out = _kv([
        ("Replica", s.replica_id), ("Pool", s.pool), ("Region/zone", f"{s.region}/{s.zone}"),
        ("Endpoint", s.endpoint), ("State", state_name(s.state)), ("Weight", f"{s.weight:.3f}"),
        ("Reason", s.reason or "-"), ("Last report", f"{format_duration(s.report_age_s)} ago"),
    ])
    out.append("Reasons:")
    out += [f"  - {r}" for r in d.reasons] or ["  (none)"]
    out.append("Load:")
    out += _kv([("KV cache use", fmt_pct(s.kv_cache_usage)),
                ("Waiting", f"{s.waiting} requests, {s.queued_prefill_tokens} prefill tokens"),
                ("Running", f"{s.running} of {s.max_num_seqs} seats" if s.max_num_seqs > 0 else str(s.running)),
                ("TTFT P95", fmt_ms(s.ttft_p95_ms)),
                ("ITL P95", fmt_ms(s.itl_p95_ms)), ("GPU memory", gpu_mem(s))], indent=2)
    out.append("Intent:")
    if d.HasField("intent") and d.intent.replica_id:
        i = d.intent
        what = "draining" if i.draining else "cordoned" if i.cordoned else "none"
        pairs = [("What", what), ("Reason", i.reason or "-"), ("Actor", i.actor or "-"),
                 ("Since", timestamp_iso(i.created_at) or "-")]
        if i.draining:
            pairs += [("Deadline", timestamp_iso(i.drain_deadline) or "-"), ("Force", str(i.force).lower())]
        out += _kv(pairs, indent=2)
    else:
        out.append("  (none)")
    out.append("Hello:")
    if d.HasField("hello"):
        h = d.hello
        out += _kv([("Engine", h.engine_kind or "-"), ("Agent version", h.agent_version or "-"),
                    ("GPU indices", ",".join(map(str, h.gpu_indices)) or "-"),
                    ("Capabilities", ",".join(h.capabilities) or "-"),
                    ("Report interval", f"{h.report_interval_ms}ms")], indent=2)
    else:
        out.append("  (none)")
    out.append("Last report:")
    if d.HasField("last_report"):
        r = d.last_report
        e = r.engine
        out += _kv([("Seq", str(r.seq)), ("Sent at", timestamp_iso(r.sent_at) or "-"),
                    ("Engine healthy", str(e.healthy).lower() + (f" ({e.error})" if e.error else "")),
                    ("KV tokens", f"{e.kv_free_tokens} free of {e.kv_capacity_tokens}"),
                    ("Preemptions", f"{e.preemptions_total:.0f} total"),
                    ("Throughput", f"{e.prompt_tokens_per_s:.0f} prompt tok/s, "
                                   f"{e.generation_tokens_per_s:.0f} gen tok/s"),
                    ("GPU telemetry", ("simulated" if r.simulated_gpu else "nvml")
                     if r.gpu_telemetry_available else f"unavailable ({r.gpu_telemetry_error or '-'})")],
                    indent=2)
        for g in r.gpus:
            flags = []
            if g.lost:
                flags.append("LOST")
            if g.ecc_uncorrected_volatile:
                flags.append(f"ecc_uncorrected={g.ecc_uncorrected_volatile}")
            if g.xid_events:
                flags.append("xid=" + ",".join(map(str, g.xid_events)))
            if g.row_remap_failed:
                flags.append("ROW-REMAP-FAILED")
            if g.retired_pages_pending:
                flags.append("reset-pending")
            if g.error:
                flags.append(f"error={g.error}")
            out.append(f"  GPU {g.index}: {g.name or '-'} mem {fmt_bytes(g.memory_used_bytes)}/"
                       f"{fmt_bytes(g.memory_total_bytes)} util {g.utilization_pct:.0f}% "
                       f"{g.temperature_c:.0f}C {' '.join(flags)}".rstrip())
    else:
        out.append("  (none)")
    out.append("Events:")
    if d.events:
        out += ["  " + line for line in events_table(list(d.events)).splitlines()]
    else:
        out.append("  (none)")
    return "\n".join(out)


# ---------------------------------------------------------------- intents and drains


def intent_results_text(verb: str, resp: admin_pb2.IntentResponse) -> str:
    if not resp.results:
        return "No replicas matched."
    lines = []
    for r in resp.results:
        msg = r.message or (f"{verb}ed" if r.changed else "unchanged")
        if r.refused and not msg.lower().startswith("refused"):
            msg = f"refused: {msg}"
        lines.append(f"replica/{r.replica_id} {msg}")
    return "\n".join(lines)


def intent_results_json(action: str, dry_run: bool, resp: admin_pb2.IntentResponse) -> dict[str, Any]:
    return {"api_version": API_VERSION, "kind": "IntentResult", "action": action, "dry_run": dry_run,
            "results": [{"replica_id": r.replica_id, "changed": r.changed, "refused": r.refused,
                         "message": r.message} for r in resp.results]}


def progress_json(p: admin_pb2.DrainProgress) -> dict[str, Any]:
    return {"replica_id": p.replica_id, "state": state_name(p.state), "running": p.running,
            "waiting": p.waiting, "router_inflight": p.router_inflight, "deadline": timestamp_iso(p.deadline),
            "done": p.done}


def progress_line(p: admin_pb2.DrainProgress, remaining_s: float) -> str:
    if p.done:
        return f"replica/{p.replica_id} {state_name(p.state)}: done"
    return (f"replica/{p.replica_id} {state_name(p.state)}: running={p.running} waiting={p.waiting} "
            f"router_inflight={p.router_inflight} ({format_duration(max(0.0, remaining_s))} left)")


def drain_json(resp: admin_pb2.IntentResponse, progress: Sequence[admin_pb2.DrainProgress], *,
               dry_run: bool, timed_out: bool) -> dict[str, Any]:
    out = intent_results_json("drain", dry_run, resp)
    out["kind"] = "DrainResult"
    out["timed_out"] = timed_out
    out["progress"] = [progress_json(p) for p in progress]
    return out
