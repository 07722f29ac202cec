"""Admission budgets shared by two real routers through a real etcd (a `tidegate up` fleet plus a
second router process): the leader publishes the pool's budget and one share per live router;
a burst of held-open requests (a real step-time profile, 1,500 tokens each) split evenly over
both routers fills the budget (at least 90 % of it admitted; at most 110 % of it held at once by
the two routers together, read from their /metrics gauges while the burst runs: the prefill unit
gives its room back at each first token), the rest answered 429 `budget_exhausted` at once; a
router killed with SIGKILL drops out of the split when its presence lease expires, and its share
goes back to the other, which shows it on /metrics."""

from __future__ import annotations

import json
import math
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from etcd_records import etcd_json  # type: ignore[import-not-found]
from livefleet import Cli, distinct_prompts, fitted_rates, up_fleet, warm_rates  # type: ignore[import-not-found]
from polling import wait_until  # type: ignore[import-not-found]
from prometheus_client.parser import text_string_to_metric_families

from tidegate.fleet.up import Fleet
from tidegate.policy.predict import held_kv
from tidegate.tokens import count_completion_prompt_tokens

pytestmark = pytest.mark.e2e

MODEL = "budget-model"
MAX_TOKENS = 1500
ROUTER_TTL_S = 10   # router/main.py PRESENCE_TTL_S


@pytest.fixture
def fleet(fresh_etcd: Any, tmp_path: Path) -> Iterator[tuple[Fleet, dict[str, Any], Cli, str]]:
    with up_fleet(tmp_path, fresh_etcd.endpoint, MODEL) as (fl, info, cli):
        yield fl, info, cli, fl.add_router("router-1")


def _budget(info: dict[str, Any]) -> dict[str, Any]:
    return etcd_json(info["etcd"], f"/tidegate/v1/admission/{MODEL}")


def _send(url: str, prompt: str, max_tokens: int = MAX_TOKENS) -> tuple[int, float, float, float]:
    """(status, when it was sent, when its first token came, when it ended; inf: no token)."""
    # Streamed, so the router's first-byte timeout (60 s) runs to the first token, not to the end
    # of an answer written beside ~200 others on one engine (~60 s here).
    req = urllib.request.Request(url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                  "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            first = resp.readline()
            first_at = time.monotonic() if first.startswith(b"data:") else math.inf
            resp.read()
            return resp.status, sent, first_at, time.monotonic()
    except urllib.error.HTTPError as e:
        if e.code == 429:
            assert e.headers["Retry-After"] and e.headers["X-Tidegate-Reject-Reason"] == "budget_exhausted"
            assert json.loads(e.read())["error"]["code"] == "budget_exhausted"
        return e.code, sent, math.inf, time.monotonic()


def _peak(spans: list[tuple[float, float]]) -> int:
    """The most of these (start, end) intervals open at one moment."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def _capacity(total: dict[str, float], fraction: float, prompt_tokens: int) -> tuple[float, str]:
    """Requests of this size the whole budget admits, and the unit that binds. The simulated
    engine writes exactly max_tokens, so the policy expects MAX_TOKENS of output, and a request in
    flight counts its prompt and half of that in the KV unit (predict.held_kv)."""
    per = {"prefillTokens": prompt_tokens, "kvTokens": held_kv(prompt_tokens, MAX_TOKENS), "sequences": 1}
    return min((total.get(unit, 0.0) * fraction / size, unit) for unit, size in per.items())


def test_two_routers_share_one_budget(fleet: tuple[Fleet, dict[str, Any], Cli, str]) -> None:
    fl, info, cli, second_url = fleet

    # Engine rates are fitted from telemetry (no profile prior here): give the fit some evidence
    # while the pool has no SLO, hence no budget.
    warm_rates(info["router_url"], info["etcd"], MODEL, replicas=1)
    assert fitted_rates(info["etcd"], MODEL, 1)
    r = cli("pool", "set-slo", MODEL, "--ttft", "2s", "--tpot", "100ms")   # from now on, a budget
    assert r.returncode == 0, r.stderr

    def both_listed() -> bool:
        b = _budget(info)
        return "total" in b and set(b.get("shareByRouter", {})) == {"router-0", "router-1"}
    try:
        wait_until(both_listed, 30, "a budget with a share for each router")
    except AssertionError as e:
        raise AssertionError(f"{e}: {_budget(info)}") from None
    # The budget follows the engine rates the control plane is still fitting; a burst sent while
    # it moves is judged against a figure already replaced (CI: 58 admitted against 51.4 read
    # 3 s after start). Wait until two reads a second apart agree.
    budget = _budget(info)
    for _ in range(20):
        time.sleep(1.0)
        again = _budget(info)
        if again.get("total") == budget.get("total"):
            break
        budget = again
    shares = budget["shareByRouter"]
    total = budget["total"]
    assert sum(s["prefillTokens"] for s in shares.values()) == pytest.approx(total["prefillTokens"], rel=1e-6)

    prompts = distinct_prompts(11, 300, 400)
    size = max(count_completion_prompt_tokens(p) for p in prompts)
    expected, unit = _capacity(total, budget["classFraction"]["standard"], size)
    # The budget follows the fitted engine rates, which vary from run to run. Its prefill unit is the
    # fitted prefill rate times the TTFT target: ~50-70k tokens/s here, so ~100-140 of these prompts
    # in 2 s (with 250 ms, ~6: the test once passed on prefill rates the fit had pinned at its bound,
    # and the KV unit bound instead).
    assert 20 <= expected <= 250, (expected, total, size)
    n = (int(expected) + 40) // 2 * 2   # a burst that overruns the budget by about 40 requests
    urls = [info["router_url"], second_url] * (n // 2)
    # The leader rewrites the budget whenever the fitted rates move it, and the two reads above
    # agreeing does not stop the next write (CI once: 145 admitted against 125.3 read before the
    # burst). So the budget is also read while the burst is decided, and the upper bound is the
    # largest the routers can have enforced: the most that was published from before the burst
    # until its last request was answered or had its first token (what came later, moved by the
    # burst's own telemetry, decided nothing).
    published: list[tuple[float, dict[str, Any]]] = []
    # What both routers hold of the budget, from their own gauges (the ledger each enforces),
    # summed: (when, {unit: tokens}). Read every 20 ms, as long as the burst is in flight.
    held: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()

    def read_budgets() -> None:
        while not stop.is_set():
            b = _budget(info)
            if "total" in b:
                published.append((time.monotonic(), b))
            stop.wait(0.1)

    def read_held() -> None:
        while not stop.is_set():
            both = [_gauges(u) for u in (info["router_url"], second_url)]
            held.append((time.monotonic(), {u: sum(g.get(("tidegate_router_admission_budget_held", u), 0.0)
                                                   for g in both) for u in _UNITS.values()}))
            stop.wait(0.02)
    readers = [threading.Thread(target=read_budgets, daemon=True), threading.Thread(target=read_held, daemon=True)]
    for r in readers:
        r.start()
    try:
        with ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(_send, urls, prompts[:n]))
    finally:
        stop.set()
        for r in readers:
            r.join(timeout=15)
    decided = max(first if code == 200 else end for code, _, first, end in answers)
    in_force = [round(_capacity(b["total"], b["classFraction"]["standard"], size)[0], 1)
                for at, b in published if at <= decided]
    high = max([expected, *in_force])
    codes = [code for code, *_ in answers]
    admitted = codes.count(200)
    # What the budget bounds is the room in flight at once: a request's prefill gives its room back
    # at its first token, its KV at its end. A burst from threads takes a while to send, and the
    # prefill that finishes meanwhile is room for its later requests (~15 of ~125 on this machine).
    # The bound is read where it is enforced: both routers' ledgers, summed (their gauges), against
    # the largest budget in force, in the unit that binds.
    budget_units = [b["total"].get(unit, 0.0) * b["classFraction"]["standard"]
                    for b in [budget, *(b for at, b in published if at <= decided)]]
    held_peak = max((h[_UNITS[unit]] for at, h in held if at <= decided), default=0.0)
    # The clients' view as a cross-check: from before a request is sent to after its first token
    # is read, each interval a little longer than the router's hold (by the threads' scheduling:
    # 129 requests against a bound of 127.4 once, on a loaded machine), so its bound is looser.
    release = 2 if unit == "prefillTokens" else 3
    peak = _peak([(a[1], a[release]) for a in answers if a[0] == 200])
    print(f"admission budget: {admitted} admitted of {n}; both routers held at most {held_peak:.0f} {unit} against "
          f"a budget of at most {max(budget_units):.0f} ({held_peak / max(budget_units):.1%}); clients saw at "
          f"most {peak} in flight at once; the budget admits {expected:.1f} before the burst, at most {high:.1f} "
          f"while it was decided ({size} prompt tokens each; {len(held)} readings of the routers)")
    assert set(codes) <= {200, 429}, codes
    assert admitted < n, (admitted, n, budget)   # the budget refused part of the burst
    assert admitted >= 0.9 * expected, (admitted, expected, budget)
    assert len(held) >= 10 and held_peak >= 0.5 * budget_units[0], (len(held), held_peak, budget_units)  # it was read
    assert held_peak <= 1.1 * max(budget_units), (held_peak, budget_units, in_force, budget)
    assert peak <= 1.25 * high, (peak, admitted, high, in_force, budget)
    assert codes[0::2].count(200) > 0 and codes[1::2].count(200) > 0

    # One router dies without a goodbye: its lease expires and the other gets the whole budget.
    child = fl.child("router-1")
    assert child.proc is not None
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(timeout=10)

    def alone() -> bool:
        b = _budget(info)
        return set(b.get("shareByRouter", {})) == {"router-0"}
    wait_until(alone, ROUTER_TTL_S + 10, "the dead router's share to return")
    b = _budget(info)
    assert b["shareByRouter"]["router-0"]["prefillTokens"] == pytest.approx(b["total"]["prefillTokens"], rel=1e-6)

    # The router shows the share it enforces, and what it holds of it, on /metrics.
    def scraped_share() -> bool:
        share = _budget(info)["shareByRouter"]["router-0"]["prefillTokens"]
        got = _gauges(info["router_url"])
        return got.get(("tidegate_router_admission_budget_share", "prefill_tokens")) == pytest.approx(share, rel=1e-6)
    wait_until(scraped_share, 10, "the router's share on /metrics")
    assert ("tidegate_router_admission_budget_held", "sequences") in _gauges(info["router_url"])


_UNITS = {"prefillTokens": "prefill_tokens", "kvTokens": "kv_tokens", "sequences": "sequences"}  # record: gauge


def _gauges(url: str) -> dict[tuple[str, str], float]:
    """The router's admission budget gauges for MODEL, by (name, unit)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, s.labels["unit"]): s.value for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("tidegate_router_admission_budget_") and s.labels.get("model") == MODEL}
