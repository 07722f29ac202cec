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
    ("rag", None, 200),
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
    if output_mean is not None:
        assert statistics.fmean(r["output_tokens"] for r in rows) == pytest.approx(output_mean, rel=0.1)
    if prompt_mean is not None:
        assert statistics.fmean(r["prompt_tokens"] for r in rows) == pytest.approx(prompt_mean, rel=0.1)
        # Poisson at 10 req/s before --load rescales it
        assert len(rows) / arrivals[-1] == pytest.approx(10.0, rel=0.1)
        assert not any("prefix_hashes" in r for r in rows)


def test_cli_writes_the_rows_it_returns(tmp_path, monkeypatch):
    out = tmp_path / "w.jsonl"
    monkeypatch.setattr(sys, "argv", ["make_workloads.py", "shortchat", str(out), "--requests", "50", "--seed", "3"])
    assert MW.main() == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == MW.shortchat(50, 3)


def test_rag_prompts_share_the_system_prompt_and_a_skewed_set_of_documents():
    rows = MW.rag(4000, 0)
    block = MW.BLOCK
    system = 256 // block
    assert len(rows) / rows[-1]["arrival_s"] == pytest.approx(10.0, rel=0.1)
    heads = [tuple(r["prefix_hashes"][:system]) for r in rows]
    assert len(set(heads)) == 1                                   # one system prompt for all
    docs = [r["prefix_hashes"][system] for r in rows]
    counts = sorted((docs.count(d) for d in set(docs)), reverse=True)
    assert 0.1 < counts[0] / len(rows) < 0.25                     # Zipf: the hottest ~1 in 6
    assert len(counts) > 500                                      # and a long tail
    for r in rows:
        assert len(r["prefix_hashes"]) == r["prompt_tokens"] // block
    # a question's blocks are its own: no block id outside the system prompt and the documents repeats
    own = [h for r in rows for h in r["prefix_hashes"] if h >= 10**12]
    assert len(own) == len(set(own))
