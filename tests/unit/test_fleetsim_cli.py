"""`tidegate simulate` through its real entry point, and its argument handling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tidegate.fleetsim import main as simulate
from tidegate.fleetsim.sim import Slowdown
from tidegate.router.main import RouterConfig
from tidegate.simulator.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidegate.cli.main", "simulate", *args, "--log-level", "warning"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_end_to_end_json_schema(tmp_path):
    out = tmp_path / "out.json"
    proc = _run("--workload", "poisson", "--rate", "5", "--requests", "80", "--replicas", "2",
                "--policy", "tidegate", "--policy", "round_robin", "--load", "0.2,0.6",
                "--slo-ttft", "2000ms", "--slo-tpot", "0.1s", "--seed", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "round_robin" in proc.stdout and "goodput" in proc.stdout
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["load"]) for r in runs] == [("tidegate", 0.2), ("round_robin", 0.2),
                                                         ("tidegate", 0.6), ("round_robin", 0.6)]
    for r in runs:
        assert {"policy", "load", "requests", "goodput_rps", "slo_attainment", "slo_attainment_by_class", "ttft_ms",
                "tpot_ms", "queue_ms", "rejected", "preemptions", "replicas"} <= set(r)
        for k in ("ttft_ms", "tpot_ms", "queue_ms"):
            assert set(r[k]) == {"p50", "p95", "p99"}
            assert r[k]["p50"] <= r[k]["p95"] <= r[k]["p99"]
        assert r["requests"] == 80 and r["slo"] == {"ttft_ms": 2000.0, "tpot_ms": 100.0}
        assert 0 <= r["slo_attainment"] <= 1 and set(r["slo_attainment_by_class"]) == {"default"}
        assert len(r["replicas"]) == 2
        for rep in r["replicas"]:
            assert {"id", "utilisation", "peak_kv", "requests"} <= set(rep)
            assert 0 <= rep["utilisation"] <= 1 and 0 <= rep["peak_kv"] <= 1
        assert sum(rep["requests"] for rep in r["replicas"]) + r["rejected"] == 80
    # Same seed, same figures: the run is deterministic through the CLI too.
    out2 = tmp_path / "again.json"
    proc = _run("--workload", "poisson", "--rate", "5", "--requests", "80", "--replicas", "2",
                "--policy", "tidegate", "--policy", "round_robin", "--load", "0.2,0.6",
                "--slo-ttft", "2000ms", "--slo-tpot", "0.1s", "--seed", "3", "--json", str(out2))
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in json.loads(out2.read_text())["runs"]]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in runs]


def test_load_and_rate_scale_exclude_each_other():
    proc = _run("--requests", "5", "--load", "0.5", "--rate-scale", "2")
    assert proc.returncode == 2 and "not both" in proc.stderr


def test_unknown_policy_lists_valid_ones():
    proc = _run("--policy", "nope", "--requests", "5")
    assert proc.returncode == 2
    assert "unknown policy 'nope'" in proc.stderr and "sglang_cache_aware" in proc.stderr


@pytest.mark.parametrize(("text", "bare", "seconds"), [("2s", "s", 2.0), ("2000ms", "s", 2.0), ("2", "s", 2.0),
                                                         ("100ms", "ms", 0.1), ("0.1s", "ms", 0.1), ("100", "ms", 0.1)])
def test_durations(text, bare, seconds):
    assert simulate.parse_duration(text, bare) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "-1s", "0ms"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        simulate.parse_duration(text, "s")


def test_fleet_profiles():
    h100, h200 = get_profile("llama3-8b-h100"), get_profile("llama3-8b-h200")
    assert simulate.fleet_profiles([], None) == [h100] * 4
    assert simulate.fleet_profiles(["llama3-8b-h200"], 3) == [h200] * 3
    assert simulate.fleet_profiles(["llama3-8b-h100:2", "llama3-8b-h200:1"], None) == [h100, h100, h200]
    for bad in (["llama3-8b-h100", "llama3-8b-h200"], ["llama3-8b-h100:2", "llama3-8b-h200"],
                ["llama3-8b-h100:x"]):
        with pytest.raises(ValueError):
            simulate.fleet_profiles(bad, None)
    with pytest.raises(ValueError, match="does not match"):
        simulate.fleet_profiles(["llama3-8b-h100:2"], 3)


@pytest.mark.parametrize("spec, want", [
    (None, ()),
    ("2:2.5", (Slowdown(1, 2.5), Slowdown(2, 2.5))),
    ("1:3@20", (Slowdown(2, 3.0, 20.0),)),
    ("3:1.5@0", (Slowdown(0, 1.5), Slowdown(1, 1.5), Slowdown(2, 1.5))),
])
def test_slow_replicas_are_the_last_ones(spec, want):
    assert simulate.slowdowns(spec, 3) == want


@pytest.mark.parametrize("spec", ["2", "0:2", "4:2", "1:1", "1:0.5", "1:x", "x:2", "1:100", "1:2@-1", "1:2@x",
                                  "1:2@inf"])
def test_slow_replicas_refuses_what_it_cannot_mean(spec):
    with pytest.raises(ValueError, match="--slow-replicas"):
        simulate.slowdowns(spec, 3)


def test_slow_replicas_flag_reaches_the_fleet(tmp_path):
    from tidegate.cli.main import main

    args = ["simulate", "--requests", "300", "--rate", "40", "--replicas", "2", "--policy", "round_robin",
            "--log-level", "warning", "--json"]
    assert main([*args, str(tmp_path / "healthy.json")]) == 0
    assert main([*args, str(tmp_path / "slow.json"), "--slow-replicas", "1:3"]) == 0

    def busy_s(name: str) -> list[float]:
        run = json.loads((tmp_path / f"{name}.json").read_text())["runs"][0]
        return [r["utilisation"] * run["makespan_s"] for r in run["replicas"]]

    healthy, slow = busy_s("healthy"), busy_s("slow")
    # round_robin splits the requests alike; only the slowed replica spends longer on its share
    assert slow[0] == pytest.approx(healthy[0], rel=0.1)
    assert slow[1] > 2 * healthy[1]
    assert main(["simulate", "--requests", "5", "--replicas", "3", "--slow-replicas", "4:2",
                 "--log-level", "warning"]) == 2


def test_plot_without_matplotlib_says_what_to_install(monkeypatch):
    from tidegate.fleetsim import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(plot.PlotUnavailableError, match=r"pip install 'tidegate\[plot\]'"):
        plot.Plotter(Path("unused"))


def test_plot_flag_without_matplotlib_exits_2(monkeypatch, tmp_path, capsys):
    from tidegate.cli.main import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc = main(["simulate", "--requests", "5", "--plot", str(tmp_path / "plots"), "--log-level", "warning"])
    assert rc == 2
    assert "matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()


def test_plot_writes_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from tidegate.cli.main import main

    rc = main(["simulate", "--requests", "40", "--rate", "4", "--replicas", "2", "--load", "0.3,0.6",
               "--policy", "tidegate,random", "--plot", str(tmp_path), "--log-level", "warning"])
    assert rc == 0
    names = {p.name for p in tmp_path.glob("*.png")}
    assert {"attainment_vs_load.png", "ttft_cdf_load0.3.png", "ttft_cdf_load0.6.png",
            "replica_load_tidegate_load0.3.png", "replica_load_random_load0.6.png"} <= names


def test_routers_and_spread_through_the_cli(tmp_path):
    out = tmp_path / "r.json"
    proc = _run("--requests", "60", "--rate", "5", "--replicas", "2", "--policy", "llmd", "--routers", "1,3",
                "--router-spread", "hash", "--max-requests", "40", "--load", "0.3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [(r["policy"], r["routers"], r["requests"]) for r in doc["runs"]] == [("llmd", 1, 40), ("llmd", 3, 40)]
    for r in doc["runs"]:
        assert {"prefix_hit_rate", "client_errors", "offered_rps", "seed"} <= set(r)
    est = doc["capacity_estimate"]
    assert est["method"] == "closed_loop" and est["fleet_rps"] > 0 and est["littles_law_rps"] > 0
    assert _run("--requests", "5", "--router-spread", "sticky").returncode == 2
    assert _run("--requests", "5", "--routers", "0").returncode == 2


def test_find_capacity_json(tmp_path):
    out = tmp_path / "cap.json"
    proc = _run("--requests", "120", "--rate", "5", "--replicas", "2", "--policy", "least_request,round_robin",
                "--find-capacity", "--attainment", "0.9", "--seeds", "2", "--jobs", "2", "--slo-ttft", "1s",
                "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "SLO capacity rps" in proc.stdout
    doc = json.loads(out.read_text())
    rows = {r["policy"]: r for r in doc["capacity"]}
    assert set(rows) == {"least_request", "round_robin"}
    for r in rows.values():
        assert {"policy", "slo_capacity_rps", "load", "attainment", "routers", "seeds"} <= set(r)
        assert r["seeds"] == [0, 1] and r["routers"] == 1
        assert r["slo_capacity_rps_min"] <= r["slo_capacity_rps"] <= r["slo_capacity_rps_max"]
        assert r["attainment"] >= 0.9 and r["slo_capacity_rps"] > 0
        assert r["load"] == pytest.approx(r["slo_capacity_rps"] / doc["capacity_estimate"]["fleet_rps"], abs=1e-3)
    # Every run of the searches is in "runs", with the same 120 requests at each rate.
    assert doc["runs"] and all(r["requests"] == 120 for r in doc["runs"])
    # Each finished search was also appended as it completed (per seed, before aggregation).
    progress = [json.loads(line) for line in (tmp_path / "cap.json.progress.jsonl").read_text().splitlines()]
    assert sorted((r["policy"], r["seed"]) for r in progress) == [("least_request", 0), ("least_request", 1),
                                                                  ("round_robin", 0), ("round_robin", 1)]
    assert _run("--requests", "5", "--find-capacity", "--load", "0.5").returncode == 2


def test_class_mix_through_the_cli(tmp_path):
    out = tmp_path / "c.json"
    proc = _run("--requests", "200", "--rate", "5", "--replicas", "2", "--policy", "least_request", "--load", "0.5",
                "--class-mix", "critical=0.2,standard=0.5,sheddable=0.3", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert set(run["slo_attainment_by_class"]) == {"critical", "standard", "sheddable"}
    assert _run("--requests", "5", "--class-mix", "gold=1").returncode == 2


def test_bench_tables_renders_a_capacity_table(tmp_path):
    doc = {"capacity_estimate": {"method": "closed_loop", "fleet_rps": 100.0, "littles_law_rps": 90.0},
           "runs": [],
           "capacity": [
               {"policy": "a", "routers": 1, "slo_capacity_rps": 50.0, "load": 0.5, "attainment": 0.96},
               {"policy": "b", "routers": 1, "slo_capacity_rps": 80.0, "load": 0.8, "attainment": 0.951,
                "capped": True},
               {"policy": "a", "routers": 4, "slo_capacity_rps": 45.0, "load": 0.45, "attainment": 0.97,
                "slo_capacity_rps_min": 44.0, "slo_capacity_rps_max": 46.0}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_tables.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "### trace"
    assert lines[2].startswith("| policy | 1 router: rps (load) | att. | 4 routers: rps (load) | att. |")
    assert lines[4] == "| b | ≥80.0 (0.80) | 95.1% | - | - |"   # best 1-router capacity first
    assert lines[5] == "| a | 50.0 (0.50) | 96.0% | 45.0 ± 1.0 (0.45) | 97.0% |"
    assert "Load 1.0 = 100.0 req/s" in proc.stdout


def test_peer_reports_default_to_the_live_routers_100ms_and_0_turns_them_off():
    assert simulate._sim_config(simulate.SimulateConfig(), 4).peer_interval_s == RouterConfig().peer_load_interval_s
    assert simulate._sim_config(simulate.SimulateConfig(peer_ms=250), 4).peer_interval_s == 0.25
    assert simulate._sim_config(simulate.SimulateConfig(peer_ms=0), 4).peer_interval_s == 0.0
    for bad in ("-1", "nan"):
        proc = _run("--requests", "5", "--peer-ms", bad)
        assert proc.returncode == 2 and "peer" in proc.stderr, proc.stderr


def test_repeated_replica_ids_are_refused_before_any_work():
    with pytest.raises(ValueError, match="repeated: a"):
        simulate.SimulateConfig(replica_ids="a,a,b")
    # a nonexistent trace is never opened: the ids are refused first, by name
    proc = _run("--trace", "/nonexistent/trace.csv", "--replicas", "3", "--replica-ids", "a,b,a")
    assert proc.returncode == 2 and "repeated: a" in proc.stderr and "nonexistent" not in proc.stderr


def test_rate_lag_windows_reaches_the_control_planes_rate_fit():
    from tidegate.fleetsim.sim import _fleet_state
    from tidegate.policy.rates import RateEstimatorConfig
    from tidegate.policy.weights import WeightPolicyConfig

    assert simulate._sim_config(simulate.SimulateConfig(), 1).rates is None  # the estimator's own default
    cfg = simulate._sim_config(simulate.SimulateConfig(rate_lag_windows=0), 1)
    assert cfg.rates == RateEstimatorConfig(lag_windows=0.0)  # the lead term on 1 s windows
    before = simulate._sim_config(simulate.SimulateConfig(rate_lag_windows=10, rate_lead=False), 1)
    assert before.rates == RateEstimatorConfig(lag_windows=10.0, lead=False)  # the fit before the lead term
    no_lead = simulate._sim_config(simulate.SimulateConfig(rate_lead=False), 1)
    assert no_lead.rates == RateEstimatorConfig(lead=False)
    assert _fleet_state(WeightPolicyConfig(), lambda: 0.0, cfg.rates).rate_config is cfg.rates
    with pytest.raises(ValueError):
        simulate.SimulateConfig(rate_lag_windows=-1)


def test_rates_csv_shows_the_fit_published_as_runs_go(tmp_path):
    """--rates-csv: one row per replica per delivered table; the fitted figures start unknown (0)
    and are published once the control plane's fit rests on enough report windows."""
    import csv

    out = tmp_path / "rates.csv"
    proc = _run("--workload", "poisson", "--rate", "20", "--requests", "400", "--replicas", "2",
                "--policy", "tidegate", "--load", "0.8", "--seed", "1", "--rates-csv", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(out.open()))
    assert rows and list(rows[0]) == list(simulate.RATES_CSV_HEADER)
    assert {r["replica"] for r in rows} == {"replica-00", "replica-01"}
    assert {(r["policy"], r["load"], r["routers"], r["seed"]) for r in rows} == {("tidegate", "0.8", "1", "1")}
    times = [float(r["delivered_s"]) for r in rows]
    assert times == sorted(times)
    assert float(rows[0]["decode_step_base_ms"]) == 0.0  # nothing fitted before the first reports
    published = [r for r in rows if float(r["prefill_tokens_per_s"]) > 0]
    assert published and all(float(r["decode_step_base_ms"]) > 0 for r in published)


def test_rates_csv_needs_runs_in_this_process(tmp_path):
    proc = _run("--requests", "5", "--find-capacity", "--rates-csv", str(tmp_path / "r.csv"))
    assert proc.returncode == 2 and "--rates-csv" in proc.stderr
    assert not (tmp_path / "r.csv").exists()


def test_router_offset_reaches_the_simulation_and_rejects_negatives():
    assert simulate._sim_config(simulate.SimulateConfig(), 4).router_offset == 0
    assert simulate._sim_config(simulate.SimulateConfig(router_offset=3), 4).router_offset == 3
    proc = _run("--requests", "5", "--router-offset", "-1")
    assert proc.returncode == 2 and "router" in proc.stderr, proc.stderr
