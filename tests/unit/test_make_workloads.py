"""scripts/make_workloads.py, the held-out workloads of docs/BENCHMARKS.md: seeded (the same
arguments write the same rows), arrivals in order, and each kind's lengths where its docstring
says they are."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
from module_file import SCRIPTS, load_module  # type: ignore[import-not-found]

MW = load_module(SCRIPTS / "make_workloads.py")


@pytest.mark.parametrize(("kind", "prompt_mean", "output_mean"), [
    ("shortchat", 150, 120),
    ("reasoning", 300, 1500),
    ("longshort", None, None),
    ("multiturn", None, None),
])
def test_seeded_ordered_and_sized_as_documented(kind, prompt_mean, output_mean):
    make = MW.KINDS.get(kind, MW.multiturn)
    rows = make(3000, 0)
    assert rows == make(3000, 0)
    assert rows != make(3000, 1)
    assert len(rows) == 3000
    arrivals = [r["arrival_s"] for r in rows]
    assert arrivals == sorted(arrivals)
    assert all(r["prompt_tokens"] >= 1 and r["output_tokens"] >= 1 for r in rows)
    if prompt_mean is not None:
        assert statistics.fmean(r["prompt_tokens"] for r in rows) == pytest.approx(prompt_mean, rel=0.1)
        assert statistics.fmean(r["output_tokens"] for r in rows) == pytest.approx(output_mean, rel=0.1)
        # Poisson at 10 req/s before --load rescales it
        assert len(rows) / arrivals[-1] == pytest.approx(10.0, rel=0.1)
        assert not any("prefix_hashes" in r for r in rows)


def test_cli_writes_the_rows_it_returns(tmp_path, monkeypatch):
    out = tmp_path / "w.jsonl"
    monkeypatch.setattr(sys, "argv", ["make_workloads.py", "shortchat", str(out), "--requests", "50", "--seed", "3"])
    assert MW.main() == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == MW.shortchat(50, 3)
