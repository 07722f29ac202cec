"""`tidegate pool`: target parsing and the SLO columns of `get pools` (pure; the RPCs are e2e)."""

from __future__ import annotations

import pytest
from google.protobuf import timestamp_pb2

from tidegate.cli.main import main
from tidegate.ops import exitcodes, render
from tidegate.ops.commands.pool import parse_target
from tidegate.v1 import admin_pb2, records_pb2

TARGETS = [
    # id, text, seconds or None for an error
    ("seconds", "2s", 2.0),
    ("millis", "100ms", 0.1),
    ("bare-seconds", "1.5", 1.5),
    ("compound", "1s500ms", 1.5),
    ("one-hour", "1h", 3600.0),
    ("zero", "0s", None),
    ("negative", "-1", None),
    ("garbage", "fast", None),
    ("too-long", "2h", None),
]


@pytest.mark.parametrize(("text", "expected"), [t[1:] for t in TARGETS], ids=[t[0] for t in TARGETS])
def test_parse_target(text: str, expected: float | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="--ttft"):
            parse_target("--ttft", text)
    else:
        assert parse_target("--ttft", text) == pytest.approx(expected)


@pytest.mark.parametrize("argv", [["pool", "set-slo", "m", "--ttft", "2s", "--tpot", "0"],
                                  ["pool", "set-slo", "m", "--ttft", "soon", "--tpot", "100ms"],
                                  ["pool", "set-slo", " ", "--ttft", "2s", "--tpot", "100ms"]])
def test_bad_arguments_are_usage_errors_before_any_call(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == exitcodes.USAGE
    assert "tidegate pool:" in capsys.readouterr().err


def slo() -> records_pb2.PoolSlo:
    return records_pb2.PoolSlo(pool="m", ttft_s=2.0, tpot_s=0.1, actor="sre:alice",
                               updated_at=timestamp_pb2.Timestamp(seconds=1_700_000_000))


def test_get_pools_shows_slo_and_recommendation() -> None:
    p = admin_pb2.PoolSummary(pool="m", available=2, slo_attainment=-1, recommended_replicas=5)
    p.replicas_by_state["ready"] = 2
    p.slo.CopyFrom(slo())
    p.scale.CopyFrom(records_pb2.ScaleRecommendation(pool="m", recommended_replicas=5, current_replicas=2,
                                                     binding="prefill", reason="why", headroom=0.8))
    bare = admin_pb2.PoolSummary(pool="n", slo_attainment=-1)
    resp = admin_pb2.ListPoolsResponse(pools=[p, bare])
    lines = render.pools_table(resp).splitlines()
    header = lines[0].split()
    row_m, row_n = (dict(zip(header, line.split(), strict=True)) for line in lines[1:])
    assert row_m["TTFT/TPOT"] == "2.00s/100ms" and row_m["RECOMMENDED"] == "5"
    assert row_n["TTFT/TPOT"] == "-" and row_n["RECOMMENDED"] == "-"
    doc = render.pools_json(resp)
    m, n = doc["pools"]
    assert m["slo"] == {"pool": "m", "ttft_s": 2.0, "tpot_s": 0.1, "actor": "sre:alice",
                        "updated_at": "2023-11-14T22:13:20.000Z"}
    assert m["scale"]["recommended_replicas"] == 5 and m["scale"]["binding"] == "prefill"
    assert n["slo"] is None and n["scale"] is None and n["recommended_replicas"] == 0


def test_slos_table_and_json() -> None:
    assert render.slos_table([]) == "No pool SLOs."
    lines = render.slos_table([slo()]).splitlines()
    assert lines[0].split() == ["POOL", "TTFT", "TPOT", "ACTOR", "UPDATED"]
    assert lines[1].split() == ["m", "2.00s", "100ms", "sre:alice", "2023-11-14T22:13:20.000Z"]
    assert render.slos_json([slo()])["kind"] == "PoolSloList"
