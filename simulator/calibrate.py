"""`tidegate sim calibrate`: the cost model's step times next to measured reference points.

Reference data ships in simulator/calibration/ (see its README for sources and licenses):

- llama3-8b-h100 / llama3-8b-h200: every row of derived_decode_step_llama3_8b_bf16.csv (a decode
  step of ``batch`` sequences with ``context_per_seq`` tokens of context each:
  ``cost.decode_step_ms``), and the 1k-token prefill chunk (``cost.step_ms(1024, 1024)``);
  tolerance 10%.
- llama3-70b-tp4-h100: the Llama2-70B TP4 H100 rows of splitwise's perf_model.csv, averaged over
  their repetitions per (prompt size, batch size, output size). The model side runs the real
  engine: ``batch`` requests of ``prompt_size`` tokens arrive together; "prompt" is when the last
  of them has its first token (the whole batch's prompts, chunked by max_num_batched_tokens), and
  "token" the mean decode step time after that, over the decode steps the measurement ran;
  tolerance 15%.

Pure apart from reading the packaged CSV files; the CLI wrapper prints the table.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources

from tidegate.simulator.engine import Engine
from tidegate.simulator.profiles import Profile, ProfileError, get_profile

TOL_8B = 0.10
TOL_SPLITWISE = 0.15


@dataclass(frozen=True)
class CalibrationPoint:
    profile: str
    point: str
    reference_ms: float
    model_ms: float
    tolerance: float

    @property
    def rel_error(self) -> float:
        return (self.model_ms - self.reference_ms) / self.reference_ms

    @property
    def ok(self) -> bool:
        return abs(self.rel_error) <= self.tolerance


def _rows(name: str) -> list[dict[str, str]]:
    text = resources.files("tidegate.simulator").joinpath(f"calibration/{name}").read_text()
    return list(csv.DictReader(io.StringIO(text)))


def _check_8b(profile: Profile, gpu: str) -> list[CalibrationPoint]:
    cost = profile.cost
    out = []
    for r in _rows("derived_decode_step_llama3_8b_bf16.csv"):
        if r["gpu"] != gpu:
            continue
        batch, ctx = int(r["batch"]), int(r["context_per_seq"])
        out.append(CalibrationPoint(profile.name, f"decode b={batch} ctx={ctx}", float(r["estimated_step_ms"]),
                                    cost.decode_step_ms(batch, ctx), TOL_8B))
    for r in _rows("prefill_llama3_8b_bf16.csv"):
        if r["gpu"] != gpu:
            continue
        tokens, ctx = int(r["tokens"]), int(r["context_tokens"])
        out.append(CalibrationPoint(profile.name, f"prefill chunk {tokens}", float(r["reference_ms"]),
                                    cost.step_ms(tokens, ctx), TOL_8B))
    return out


def engine_batch_times(profile: Profile, prompt: int, batch: int, decode_steps: int) -> tuple[float, float | None]:
    """(ms until every prompt of the batch has its first token, mean ms per decode step after)."""
    engine = Engine(profile)
    for i in range(batch):
        engine.add_request(f"c{i}", prompt, decode_steps + 1, 0.0)
    engine.advance(math.inf)
    results = [engine.request_result(f"c{i}") for i in range(batch)]
    firsts = [r.first_token_s for r in results if r is not None and r.first_token_s is not None]
    ends = [r.finish_s for r in results if r is not None and r.finish_s is not None]
    prompt_s = max(firsts)
    token_ms = (max(ends) - prompt_s) * 1000.0 / decode_steps if decode_steps else None
    return prompt_s * 1000.0, token_ms


def splitwise_points() -> list[tuple[int, int, int, int, float, float]]:
    """(prompt_size, batch_size, token_size, decode_steps, prompt_ms, token_ms) means per point."""
    groups: dict[tuple[int, int, int], list[tuple[float, float, float]]] = defaultdict(list)
    for r in _rows("splitwise_llama2_70b_h100_tp4.csv"):
        key = (int(r["prompt_size"]), int(r["batch_size"]), int(r["token_size"]))
        groups[key].append((float(r["prompt_time"]), float(r["token_time"]), float(r["e2e_time"])))
    out = []
    for (p, b, t), vals in sorted(groups.items()):
        n = len(vals)
        prompt_ms = sum(v[0] for v in vals) / n
        token_ms = sum(v[1] for v in vals) / n
        e2e_ms = sum(v[2] for v in vals) / n
        # e2e = prompt + steps x token; long outputs stopped early in the measurement (see README).
        steps = max(1, min(t - 1, round((e2e_ms - prompt_ms) / token_ms)))
        out.append((p, b, t, steps, prompt_ms, token_ms))
    return out


def _check_splitwise(profile: Profile) -> list[CalibrationPoint]:
    out = []
    for p, b, t, steps, prompt_ms, token_ms in splitwise_points():
        model_prompt, model_token = engine_batch_times(profile, p, b, steps)
        label = f"prompt={p} batch={b} out={t}"
        out.append(CalibrationPoint(profile.name, f"{label} prompt", prompt_ms, model_prompt, TOL_SPLITWISE))
        out.append(CalibrationPoint(profile.name, f"{label} token", token_ms, model_token or 0.0, TOL_SPLITWISE))
    return out


# profile name -> how to check it against its reference data
REFERENCES: dict[str, Callable[[Profile], list[CalibrationPoint]]] = {
    "llama3-8b-h100": lambda p: _check_8b(p, "H100"),
    "llama3-8b-h200": lambda p: _check_8b(p, "H200"),
    "llama3-70b-tp4-h100": _check_splitwise,
}


def calibrate(names: list[str] | None = None) -> list[CalibrationPoint]:
    """Every reference point of the named profiles (all with reference data when None)."""
    points: list[CalibrationPoint] = []
    for name in names or list(REFERENCES):
        if name not in REFERENCES:
            raise ProfileError(f"profile {name!r} has no reference data; profiles with reference data: "
                               f"{', '.join(REFERENCES)}")
        points += REFERENCES[name](get_profile(name))
    return points


def render_table(points: list[CalibrationPoint]) -> str:
    head = ("profile", "point", "reference ms", "model ms", "rel error", "ok")
    rows = [(p.profile, p.point, f"{p.reference_ms:.2f}", f"{p.model_ms:.2f}", f"{p.rel_error:+.1%}",
             "ok" if p.ok else f"FAIL (>{p.tolerance:.0%})") for p in points]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [head, *rows]]
    failed = sum(1 for p in points if not p.ok)
    lines.append(f"{len(points)} points, {failed} outside tolerance")
    return "\n".join(lines)


def run_cli(profile: str | None, as_json: bool) -> int:
    """Print the table (or JSON); 0 when every point is within tolerance, 1 otherwise, 2 on bad input."""
    try:
        points = calibrate([profile] if profile else None)
    except ProfileError as exc:
        print(f"tidegate sim calibrate: {exc}", file=sys.stderr)
        return 2
    ok = all(p.ok for p in points)
    if as_json:
        doc = {"ok": ok, "points": [{**asdict(p), "rel_error": p.rel_error, "ok": p.ok} for p in points]}
        print(json.dumps(doc, indent=2))
    else:
        print(render_table(points))
    return 0 if ok else 1
