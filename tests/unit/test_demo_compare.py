"""`tidegate demo --compare`: flag parsing, the side-by-side table, refusals in the report, the
TTFT chart (pure parts; tests/e2e/test_demo_compare.py runs it against real processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidegate.cli.main import build_parser, main
from tidegate.config import ConfigError, load
from tidegate.fleet import report, ttft_chart
from tidegate.fleet.demo import DemoConfig, draw_classes
from tidegate.fleet.report import RequestResult


def _cfg(*argv: str) -> DemoConfig:
    args = build_parser(only="demo").parse_args(["demo", *argv])
    return load(DemoConfig, "demo", args, None)


@pytest.mark.parametrize(("argv", "expected"), [
    ((), ["tidegate"]),
    (("--compare", "round_robin"), ["tidegate", "round_robin"]),
    (("--compare", "round_robin, least_request,tidegate,round_robin"), ["tidegate", "round_robin", "least_request"]),
    (("--policy", "least_kv", "--compare", "tidegate"), ["least_kv", "tidegate"]),
], ids=["no-compare", "one", "dedup-and-spaces", "other-first"])
def test_compare_policies_in_order(argv: tuple[str, ...], expected: list[str]) -> None:
    assert _cfg(*argv).policies() == expected


def test_plot_settle_and_pool_slo_flags() -> None:
    cfg = _cfg("--compare", "random", "--plot", "charts", "--settle-s", "0", "--pool-slo")
    assert cfg.plot == Path("charts") and cfg.settle_s == 0 and cfg.pool_slo
    assert not _cfg().pool_slo
    assert _cfg().outlier_latency_factor == 0  # off in the demo (tidegate/fleet/demo.py says why)


@pytest.mark.parametrize("value", ["bogus", "round_robin,nope", ","])
def test_unknown_compare_policy_is_a_config_error_naming_the_valid_ones(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _cfg("--compare", value)
    assert "compare" in str(exc.value)
    if value != ",":
        assert "round_robin" in str(exc.value) and "valid policies" in str(exc.value)


def test_bad_compare_exits_2_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--compare", "bogus"]) == 2
    assert "unknown policy 'bogus'" in capsys.readouterr().err


def test_class_mix_is_validated_and_drawn_the_same_for_every_run() -> None:
    assert _cfg("--class-mix", "critical=1,standard=3").class_mix == "critical=1,standard=3"
    with pytest.raises(ConfigError, match="class_mix"):
        _cfg("--class-mix", "vip=1")
    a, b = draw_classes("critical=1,standard=3", 400), draw_classes("critical=1,standard=3", 400)
    assert a == b and a is not None and set(a) == {"critical", "standard"}
    assert 50 < a.count("critical") < 150
    assert draw_classes(None, 10) is None


def test_build_reports_attainment_per_class() -> None:
    rep = _rep("tidegate", [_ok(0.1, klass="critical"), _ok(5.0, klass="critical"),
                            _ok(0.1, klass="sheddable"), _refused(429, "shed", klass="sheddable"),
                            _refused(429, "shed", klass="sheddable")])
    assert rep["classes"] == {"critical": {"sent": 2, "in_slo": 1, "slo_attainment": 0.5},
                              "sheddable": {"sent": 3, "in_slo": 1, "slo_attainment": 0.3333}}
    assert "classes" not in _rep("tidegate", [_ok(0.1)])


def _ok(ttft_s: float, tpot_s: float = 0.02, sent_s: float = 0.0, klass: str = "") -> RequestResult:
    return RequestResult(ok=True, ttft_s=ttft_s, tpot_s=tpot_s, output_tokens=10, status=200, sent_s=sent_s,
                         klass=klass)


def _refused(status: int, reason: str = "", error: str = "", klass: str = "") -> RequestResult:
    return RequestResult(ok=False, ttft_s=None, tpot_s=None, output_tokens=0, status=status, reason=reason,
                         error=error or f"http {status}", klass=klass)


def _rep(policy: str, results: list[RequestResult]) -> dict:
    rep = report.build(results, sent=len(results), duration_s=20.0, slo_ttft_ms=1000, slo_tpot_ms=100,
                       replicas=[{"id": "replica-0", "requests": 1, "prompt_tokens": 1, "generation_tokens": 1,
                                  "preemptions": 2, "peak_kv_usage": 0.5, "peak_waiting": 0}],
                       rate_rps=1.0, rate_basis="test", window_s=10.0)
    return {"policy": policy, **rep}


def test_build_separates_refusals_from_errors_and_counts_goodput_per_arrival_second() -> None:
    rep = _rep("tidegate", [_ok(0.1), _ok(0.2), _ok(3.0), _refused(429, "deadline_unmeetable"),
                            _refused(429, "deadline_unmeetable"), _refused(429), _refused(503),
                            _refused(0, error="ClientConnectorError")])
    assert rep["rejected"] == {"deadline_unmeetable": 2, "unknown": 1}
    assert rep["unavailable"] == 1
    assert rep["errors"] == {"ClientConnectorError": 1}
    assert report.errors_count(rep) == 1
    assert rep["goodput_rps"] == 0.2      # 2 in SLO / 10 s of arrivals (not the 20 s wall time)
    assert rep["throughput_rps"] == 0.3
    assert rep["slo_attainment"] == 0.25  # a refused request misses its SLO


def test_render_compare_puts_policies_side_by_side() -> None:
    a = _rep("tidegate", [_ok(0.1), _ok(0.2), _refused(429, "shed")])
    b = _rep("round_robin", [_ok(0.1), _ok(5.0), _ok(6.0)])
    lines = report.render_compare([a, b]).splitlines()
    header = next(line for line in lines if "tidegate" in line and "round_robin" in line)
    assert header.index("tidegate") < header.index("round_robin")

    def cells(label: str) -> list[str]:
        line = next(x for x in lines if x.startswith(label))
        return line[len(label):].split()

    assert cells("SLO attainment") == ["66.7%", "33.3%"]
    assert cells("goodput req/s") == ["0.20", "0.10"]
    assert cells("429 shed") == ["1", "0"]
    assert cells("503 no capacity") == ["0", "0"]
    assert cells("errors") == ["0", "0"]
    assert cells("TTFT p99 ms")[1] == "5980.0"
    assert cells("preemptions") == ["2", "2"]


def test_single_run_report_names_its_policy_and_refusals() -> None:
    text = report.render(_rep("least_kv", [_ok(0.1), _refused(429, "shed"), _refused(503)]))
    assert "policy         least_kv" in text
    assert "rejected       429 shed: 1, 503: 1" in text


def test_render_compare_shows_per_class_attainment_when_runs_have_classes() -> None:
    a = {**_rep("tidegate", [_ok(0.1)]), "classes": {"critical": {"slo_attainment": 1.0}}}
    b = {**_rep("round_robin", [_ok(0.1)]), "classes": {"critical": {"slo_attainment": 0.5}}}
    line = next(x for x in report.render_compare([a, b]).splitlines() if "attainment critical" in x)
    assert line.split()[-2:] == ["100.0%", "50.0%"]


def test_windowed_p95_per_bucket() -> None:
    pts = ttft_chart.ttft_points([_ok(0.1, sent_s=0.5), _ok(0.3, sent_s=1.0), _ok(2.0, sent_s=4.5),
                                  _refused(429, "shed")])
    assert pts == [(0.5, 100.0), (1.0, 300.0), (4.5, 2000.0)]
    assert ttft_chart.windowed_p95(pts, bucket_s=2.0) == [(1.0, pytest.approx(290.0)), (5.0, 2000.0)]


def test_html_chart_is_self_contained_with_a_line_per_policy() -> None:
    page = ttft_chart.render_html({"tidegate": [(0.0, 50.0), (3.0, 80.0)], "<rr>": [(1.0, 9000.0)]},
                                  2000.0, "TTFT")
    assert page.count("<polyline") == 2
    assert "&lt;rr&gt;" in page and "<rr>" not in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_write_chart_creates_the_file(tmp_path: Path) -> None:
    path = ttft_chart.write(tmp_path / "out", {"tidegate": [(0.0, 50.0)], "round_robin": []}, 2000.0, "TTFT")
    assert path.parent == tmp_path / "out" and path.stat().st_size > 0
    assert path.suffix in {".png", ".html"}


def test_up_passes_policy_and_outlier_factor_through(tmp_path: Path) -> None:
    from tidegate.fleet.up import Fleet, UpConfig

    fleet = Fleet(UpConfig(run_dir=tmp_path, policy="round_robin", outlier_latency_factor=0))
    flags = fleet._router_flags()
    assert flags[flags.index("--policy") + 1] == "round_robin"
    assert fleet._controlplane_flags() == ["--outlier-latency-factor", "0"]
    assert Fleet(UpConfig(run_dir=tmp_path / "b"))._controlplane_flags() == []
    with pytest.raises(ValueError, match="valid policies"):
        UpConfig(policy="nope")
