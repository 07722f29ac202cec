"""A `tidegate up` fleet for end-to-end tests, and what they do with it: the operations CLI
through its real entry point, distinct prompts, completions through the router."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from etcd_records import etcd_json  # type: ignore[import-not-found]

from tidegate.fleet import endpoints
from tidegate.fleet.up import Fleet, UpConfig

WORDS = ("tide", "gate", "river", "stone", "harbour", "lantern", "meadow", "signal", "copper", "orbit")


class Cli:
    """`python -m tidegate.cli.main ...` as a subprocess that finds the fleet through `home`'s
    endpoints file, as it does after `tidegate up` (no TIDEGATE_* overrides from the caller)."""

    def __init__(self, home: Path) -> None:
        self.env = dict(os.environ, TIDEGATE_HOME=str(home), COLUMNS="200")
        for k in ("TIDEGATE_TOKEN", "TIDEGATE_CONTROLPLANE", "TIDEGATE_TOKEN_FILE", "TIDEGATE_ENDPOINTS_FILE"):
            self.env.pop(k, None)

    def __call__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
                 ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tidegate.cli.main", *args], capture_output=True, text=True,
                              env={**self.env, **(env or {})}, timeout=timeout)

    def json(self, *args: str) -> Any:
        r = self(*args, "-o", "json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@contextlib.contextmanager
def up_fleet(tmp_path: Path, etcd: str, model: str, *, replicas: int = 1, profile: str = "llama3-8b-h100"
             ) -> Iterator[tuple[Fleet, dict[str, Any], Cli]]:
    """A started fleet on `etcd` (run files under tmp_path/run) and a CLI pointed at it (its
    endpoints file under tmp_path/home); stopped on exit. The default profile is a real step-time
    model (not "instant"), so the control plane can fit engine rates."""
    cfg = UpConfig(replicas=replicas, model=model, profile=profile, etcd=(etcd,), run_dir=tmp_path / "run",
                   report_interval_s=0.5, ready_timeout_s=60)
    with Fleet(cfg) as fl:
        info = fl.start()
        endpoints.write(tmp_path / "home" / "endpoints.json", info)
        yield fl, info, Cli(tmp_path / "home")


def distinct_prompts(seed: int, n: int, words: int) -> list[str]:
    """`n` prompts of `words` numbered words: no two share a prefix, so none hits the prefix
    cache and each is real prefill work for the engine."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) + str(rng.randrange(10_000)) for _ in range(words)) for _ in range(n)]


def fitted_entries(etcd: str, model: str, replicas: int) -> list[dict] | None:
    """The pool's routing-table entries in etcd, read once, when they carry fitted engine rates for
    `replicas` replicas; else None."""
    entries = etcd_json(etcd, f"/tidegate/v1/tables/{model}").get("replicas", [])
    fitted = len(entries) == replicas and all(
        e.get("prefillTokensPerS", 0) > 0 and e.get("decodeStepBaseMs", 0) > 0 and e.get("decodeStepPerSeqMs", 0) > 0
        for e in entries)
    return entries if fitted else None


def fitted_rates(etcd: str, model: str, replicas: int) -> bool:
    """True once the pool's routing table in etcd carries fitted engine rates for `replicas` replicas."""
    return fitted_entries(etcd, model, replicas) is not None


def warm_rates(router_url: str, etcd: str, model: str, replicas: int, prompts: int = 240, clients: int = 8) -> None:
    """Distinct long prompts through the router from `clients` closed-loop clients, started apart
    and with answers of different lengths, until every replica's rates are fitted (or `prompts` are
    sent; callers then assert `fitted_rates`). The rate fit wants seconds of traffic, not one burst:
    its token thresholds and 5 report windows with decode timing (RateEstimatorConfig.min_windows).
    Not in waves: a prompt that arrives while others decode slows their tokens, which is what the
    fit reads; a wave's prompts prefill with nothing decoding, and the fit took prefill for free
    (343,000 tokens/s against the profile's 47,600; scripts/probe_live_rates.py)."""
    sent = itertools.count()
    done = threading.Event()

    def client(i: int) -> None:
        time.sleep(0.06 * i)
        for k in itertools.count():
            if done.is_set() or next(sent) >= prompts:
                return
            complete(router_url, model, distinct_prompts(7 + 1000 * i + k, 1, 500)[0], 16 + (7 * k + 13 * i) % 64)

    with ThreadPoolExecutor(max_workers=clients) as pool:
        running = [pool.submit(client, i) for i in range(clients)]
        while not all(f.done() for f in running):
            if fitted_rates(etcd, model, replicas):
                done.set()
            time.sleep(0.25)
        for f in running:
            f.result()   # a failed completion fails the caller


def complete(router_url: str, model: str, prompt: str, max_tokens: int = 48) -> None:
    """One completion through the router; it must succeed."""
    req = urllib.request.Request(router_url + "/v1/completions", method="POST",
                                 data=json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        resp.read()
