"""Human tables and the stable JSON of the operations commands."""

from __future__ import annotations

import json

import pytest
from google.protobuf import timestamp_pb2
from rich.console import Console

from tidegate.ops import render, topview
from tidegate.v1 import admin_pb2, records_pb2, telemetry_pb2

RS = records_pb2.ReplicaState
GiB = 1 << 30


def ts(seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=123_000_000)


def summary(rid: str = "replica-0", **kw: object) -> admin_pb2.ReplicaSummary:
    base: dict[str, object] = dict(
        replica_id=rid, pool="m", region="eu", zone="eu-a", endpoint="http://10.0.0.1:8000",
        state=RS.REPLICA_STATE_READY, weight=0.5, kv_cache_usage=0.42, waiting=3, queued_prefill_tokens=12_345,
        running=7, ttft_p95_ms=180.0, itl_p95_ms=22.4, gpu_memory_used_bytes=60 * GiB,
        gpu_memory_total_bytes=80 * GiB, report_age_s=0.8, reason="kv free 58%", gpu_telemetry_available=True)
    base.update(kw)
    return admin_pb2.ReplicaSummary(**base)  # type: ignore[arg-type]


def test_table_aligns_columns_without_trailing_spaces() -> None:
    out = render.table(("A", "LONGER"), [["xyz", "1"], ["x", ""]])
    assert out.splitlines() == ["A    LONGER", "xyz  1", "x"]


def test_replicas_table() -> None:
    resp = admin_pb2.ListReplicasResponse(replicas=[
        summary("replica-1", state=RS.REPLICA_STATE_CORDONED, weight=0.0, gpu_telemetry_available=False,
                ttft_p95_ms=0.0, itl_p95_ms=1500.0, report_age_s=75),
        summary("replica-0")])
    lines = render.replicas_table(resp).splitlines()
    assert lines[0].split() == ["ID", "POOL", "REGION/ZONE", "STATE", "WEIGHT", "KV", "QUEUE(REQ/TOK)", "RUNNING",
                                "TTFT-P95", "ITL-P95", "GPU-MEM", "REPORT-AGE"]
    assert lines[1].split() == ["replica-0", "m", "eu/eu-a", "ready", "0.50", "42%", "3/12k", "7", "180ms",
                                "22ms", "60.0G/80.0G", "800ms"]
    assert lines[2].split() == ["replica-1", "m", "eu/eu-a", "cordoned", "0.00", "42%", "3/12k", "7", "-",
                                "1.50s", "n/a", "1m15s"]
    wide = render.replicas_table(resp, wide=True).splitlines()
    assert wide[0].split()[-2:] == ["ENDPOINT", "REASON"]
    assert wide[1].endswith("http://10.0.0.1:8000  kv free 58%")
    assert render.replicas_table(admin_pb2.ListReplicasResponse()) == "No replicas."


def test_replicas_json_schema() -> None:
    resp = admin_pb2.ListReplicasResponse(replicas=[summary()], controlplane_id="cp-0", leader=True)
    doc = json.loads(render.dumps(render.replicas_json(resp)))
    assert doc["api_version"] == "tidegate/v1" and doc["kind"] == "ReplicaList"
    assert doc["controlplane_id"] == "cp-0" and doc["leader"] is True
    r = doc["replicas"][0]
    assert set(r) == {"id", "pool", "region", "zone", "endpoint", "state", "weight", "kv_cache_usage", "waiting",
                      "queued_prefill_tokens", "running", "max_num_seqs", "ttft_p95_ms", "itl_p95_ms",
                      "gpu_telemetry_available",
                      "gpu_memory_used_bytes", "gpu_memory_total_bytes", "report_age_s", "reason"}
    assert r["state"] == "ready" and r["queued_prefill_tokens"] == 12_345 and r["gpu_memory_total_bytes"] == 80 * GiB


def pool() -> admin_pb2.PoolSummary:
    p = admin_pb2.PoolSummary(pool="m", generation=7, total_weight=1.5, demand_rps=12.34, slo_attainment=-1,
                              recommended_replicas=3, available=2,
                              budgets=[records_pb2.DisruptionBudget(scope="pool:m", min_available="2")])
    p.replicas_by_state["ready"] = 2
    p.replicas_by_state["cordoned"] = 1
    return p


def test_pools_table_and_json() -> None:
    resp = admin_pb2.ListPoolsResponse(pools=[pool()])
    lines = render.pools_table(resp).splitlines()
    assert lines[1].split("  ")[0] == "m"
    assert "cordoned=1 ready=2" in lines[1] and "pool:m min-available 2" in lines[1]
    doc = render.pools_json(resp)
    assert doc["kind"] == "PoolList"
    p = doc["pools"][0]
    assert p["replicas"] == 3 and p["replicas_by_state"] == {"cordoned": 1, "ready": 2}
    assert p["slo_attainment"] is None  # -1 (unknown) becomes null
    assert p["budgets"] == [{"scope": "pool:m", "min_available": "2", "max_unavailable": None, "actor": "",
                             "updated_at": None}]


def event(kind: str = "cordon", at: int = 1_700_000_000) -> records_pb2.Event:
    return records_pb2.Event(at=ts(at), kind=kind, replica_id="replica-0", pool="m", actor="sre:local-operator",
                             reason="kernel upgrade")


def test_events() -> None:
    lines = render.events_table([event()]).splitlines()
    assert lines[0].split() == ["TIME", "KIND", "REPLICA", "ACTOR", "REASON"]
    assert lines[1].split(None, 4) == ["2023-11-14T22:13:20.123Z", "cordon", "replica-0", "sre:local-operator",
                                       "kernel upgrade"]
    assert render.events_json([event()])["events"][0] == {
        "at": "2023-11-14T22:13:20.123Z", "kind": "cordon", "replica_id": "replica-0", "pool": "m",
        "actor": "sre:local-operator", "reason": "kernel upgrade"}
    assert render.event_key(event()) == render.event_key(event())
    assert render.event_key(event()) != render.event_key(event(at=1))
    assert render.events_table([]) == "No events."


def detail() -> admin_pb2.ReplicaDetail:
    report = telemetry_pb2.Report(seq=4, simulated_gpu=True, gpu_telemetry_available=True, gpus=[
        telemetry_pb2.GpuStats(index=0, name="H100", memory_used_bytes=GiB, memory_total_bytes=80 * GiB,
                               xid_events=[79], lost=True),
        telemetry_pb2.GpuStats(index=1, name="H200", row_remap_failed=True),
        telemetry_pb2.GpuStats(index=2, name="H200", retired_pages_pending=1)])
    return admin_pb2.ReplicaDetail(
        summary=summary(state=RS.REPLICA_STATE_DRAINING), reasons=["draining", "kv free 58%"],
        hello=telemetry_pb2.Hello(replica_id="replica-0", engine_kind="vllm", capabilities=["nvml"]),
        last_report=report,
        intent=records_pb2.ReplicaIntent(replica_id="replica-0", cordoned=True, draining=True, reason="r",
                                         actor="sre:a", created_at=ts(1_700_000_000)),
        events=[event("drain")])


def test_describe_text_has_every_section() -> None:
    text = render.describe_text(detail())
    for needle in ("Replica:     replica-0", "State:       draining", "  - kv free 58%", "What:     draining",
                   "Actor:    sre:a", "Engine:          vllm", "GPU telemetry:  simulated",
                   "GPU 0: H100 mem 1.0G/80.0G", "LOST", "xid=79", "drain  replica-0  sre:local-operator",
                   "ROW-REMAP-FAILED", "reset-pending"):
        assert needle in text, needle


def test_describe_json() -> None:
    doc = json.loads(render.dumps(render.detail_json(detail())))
    assert doc["kind"] == "ReplicaDetail"
    assert doc["summary"]["state"] == "draining"
    assert doc["intent"]["draining"] is True and doc["intent"]["created_at"] == "2023-11-14T22:13:20.123Z"
    assert doc["hello"]["engine_kind"] == "vllm"  # protobuf JSON with the proto's field names
    assert doc["last_report"]["gpus"][0]["xid_events"] == [79]
    assert doc["events"][0]["kind"] == "drain"
    empty = render.detail_json(admin_pb2.ReplicaDetail(summary=summary()))
    assert empty["intent"] is None and empty["hello"] is None and empty["last_report"] is None


def test_intent_results() -> None:
    resp = admin_pb2.IntentResponse(results=[
        admin_pb2.IntentResult(replica_id="replica-0", changed=True, message="cordoned"),
        admin_pb2.IntentResult(replica_id="replica-1", changed=False, message="already cordoned"),
        admin_pb2.IntentResult(replica_id="replica-2", refused=True,
                               message="budget pool:m min-available 2 would be broken")])
    assert render.intent_results_text("cordon", resp).splitlines() == [
        "replica/replica-0 cordoned", "replica/replica-1 already cordoned",
        "replica/replica-2 refused: budget pool:m min-available 2 would be broken"]
    doc = render.intent_results_json("cordon", True, resp)
    assert doc["kind"] == "IntentResult" and doc["action"] == "cordon" and doc["dry_run"] is True
    assert doc["results"][2] == {"replica_id": "replica-2", "changed": False, "refused": True,
                                 "message": "budget pool:m min-available 2 would be broken"}
    assert render.intent_results_text("cordon", admin_pb2.IntentResponse()) == "No replicas matched."


def test_drain_progress() -> None:
    p = admin_pb2.DrainProgress(replica_id="replica-0", state=RS.REPLICA_STATE_DRAINING, running=2, waiting=1,
                                router_inflight=3)
    assert render.progress_line(p, 65) == \
        "replica/replica-0 draining: running=2 waiting=1 router_inflight=3 (1m05s left)"
    done = admin_pb2.DrainProgress(replica_id="replica-0", state=RS.REPLICA_STATE_DRAINED, done=True)
    assert render.progress_line(done, 3) == "replica/replica-0 drained: done"
    doc = render.drain_json(admin_pb2.IntentResponse(), [p], dry_run=False, timed_out=True)
    assert doc["kind"] == "DrainResult" and doc["timed_out"] is True
    assert doc["progress"][0] == {"replica_id": "replica-0", "state": "draining", "running": 2, "waiting": 1,
                                  "router_inflight": 3, "deadline": None, "done": False}


def test_top_frame_renders_plain_text() -> None:
    console = Console(width=200, no_color=True, force_terminal=False, record=True)
    frame = topview.frame(admin_pb2.ListPoolsResponse(pools=[pool()]),
                          admin_pb2.ListReplicasResponse(replicas=[summary()], controlplane_id="cp-0"),
                          header="tidegate top", error="UNAVAILABLE: gone")
    console.print(frame)
    text = console.export_text()
    assert "tidegate top  (UNAVAILABLE: gone)" in text
    assert "Pools" in text and "Replicas" in text
    assert "replica-0" in text and "kv free 58%" in text and "\x1b[" not in text


def test_top_frame_compact_on_a_narrow_terminal() -> None:
    console = Console(width=80, no_color=True, force_terminal=False, record=True)
    console.print(topview.frame(admin_pb2.ListPoolsResponse(pools=[pool()]),
                                admin_pb2.ListReplicasResponse(replicas=[summary("replica-12")]),
                                header="t", width=console.width))
    text = console.export_text()
    assert "replica-12" in text and "ready" in text and "…" not in text
    assert "REASON" not in text and "GPU-MEM" not in text


@pytest.mark.parametrize(("seats", "line"), [
    pytest.param(256, "Running:      7 of 256 seats", id="seats-known"),
    pytest.param(0, "Running:      7\n", id="seats-unknown"),
])
def test_describe_shows_the_engines_seats(seats: int, line: str) -> None:
    text = render.describe_text(admin_pb2.ReplicaDetail(summary=summary(running=7, max_num_seqs=seats)))
    assert line in text
    assert render.replica_json(summary(max_num_seqs=seats))["max_num_seqs"] == seats
