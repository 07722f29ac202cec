"""Requests to replay: trace files (Azure CSV, Mooncake JSONL, generic CSV/JSONL) and synthetic
workloads (Poisson or Gamma arrivals, heavy-tailed lengths). Pure apart from reading the file.

Generic format (by header / first-line keys): ``arrival_s, prompt_tokens, output_tokens`` and
optionally ``prefix_hashes`` (JSONL: a list; CSV: ids separated by spaces) and ``priority`` (a
class name such as "interactive", or an integer; integers are passed to policies as the request
priority, names map to 0). Arrivals are made relative to the first request.

Generic traces' prefix hashes cover tidegate.tokens.PREFIX_BLOCK_TOKENS (64) prompt tokens each,
as the router and `tidegate sim` cut prompt text; Mooncake's cover 512. Priority classes: when a
trace has none, every request is in class "default".
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path

from tidegate.fleet import traces
from tidegate.fleet.traces import TraceError, TraceRequest
from tidegate.tokens import PREFIX_BLOCK_TOKENS

DEFAULT_CLASS = "default"


@dataclass(frozen=True, slots=True)
class SimRequest:
    index: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple = ()
    klass: str = DEFAULT_CLASS
    priority: int = 0
    hash_block_tokens: int = PREFIX_BLOCK_TOKENS  # prompt tokens per prefix hash (Mooncake: 512)

    @property
    def req_id(self) -> str:
        return f"r{self.index}"


def _priority(raw: object) -> tuple[str, int]:
    if raw is None or raw == "":
        return DEFAULT_CLASS, 0
    text = str(raw).strip()
    try:
        return text, int(text)
    except ValueError:
        return text, 0


def _generic_row(path: Path, where: str, row: dict) -> tuple[float, int, int, tuple, str, int]:
    try:
        hashes = row.get("prefix_hashes") or ()
        if isinstance(hashes, str):
            hashes = tuple(int(h) for h in hashes.split())
        klass, prio = _priority(row.get("priority"))
        p, o = int(row["prompt_tokens"]), int(row["output_tokens"])
        t = float(row["arrival_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"{path}:{where}: {type(exc).__name__}: {exc}") from None
    if p < 1 or o < 0 or not math.isfinite(t):
        raise TraceError(f"{path}:{where}: need prompt_tokens >= 1, output_tokens >= 0 and a finite arrival_s")
    return t, p, max(1, o), tuple(hashes), klass, prio


def load_generic(path: Path, limit: int | None = None) -> list[SimRequest]:
    rows: list[tuple[float, int, int, tuple, str, int]] = []
    try:
        with open(path, newline="") as f:
            if path.suffix == ".jsonl":
                for lineno, line in enumerate(f, start=1):
                    if limit is not None and len(rows) >= limit:
                        break
                    if line.strip():
                        try:
                            obj = json.loads(line)
                        except ValueError as exc:
                            raise TraceError(f"{path}:{lineno}: {exc}") from None
                        rows.append(_generic_row(path, str(lineno), obj))
            else:
                for lineno, row in enumerate(islice(csv.DictReader(f), limit), start=2):
                    rows.append(_generic_row(path, str(lineno), row))
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    return [SimRequest(i, t - t0, p, o, h, k, pr) for i, (t, p, o, h, k, pr) in enumerate(rows)]


def _is_generic(path: Path) -> bool:
    try:
        with open(path, newline="") as f:
            first = f.readline()
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    if path.suffix == ".jsonl":
        try:
            return "arrival_s" in json.loads(first)
        except ValueError:
            return False
    return "arrival_s" in [c.strip() for c in first.split(",")]


MOONCAKE_BLOCK_TOKENS = 512


def from_trace(reqs: Sequence[TraceRequest], hash_block_tokens: int = PREFIX_BLOCK_TOKENS) -> list[SimRequest]:
    return [SimRequest(i, r.arrival_s, r.prompt_tokens, r.output_tokens, tuple(r.prefix_hashes),
                       hash_block_tokens=hash_block_tokens)
            for i, r in enumerate(reqs)]


def load(path: Path, limit: int | None = None) -> list[SimRequest]:
    """Any supported trace file: generic CSV/JSONL (has an ``arrival_s`` column), Mooncake JSONL,
    Azure or BurstGPT CSV (tidegate.fleet.traces). `limit`: only the file's first `limit` requests
    are read (traces.load)."""
    path = Path(path)
    if _is_generic(path):
        return load_generic(path, limit)
    block = MOONCAKE_BLOCK_TOKENS if path.suffix == ".jsonl" else 16
    return from_trace(traces.load(path, limit), block)


def as_trace(reqs: Sequence[SimRequest]) -> list[TraceRequest]:
    """For tidegate.fleet.capacity.estimate."""
    return [TraceRequest(r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_hashes) for r in reqs]


def native_rate(reqs: Sequence[SimRequest]) -> float:
    """Requests per second over the arrival span (the count when it is zero): requests / span, the
    denominator of the results' offered_rps and goodput_rps."""
    if len(reqs) < 2:
        return float(len(reqs))
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    return len(reqs) / span if span > 0 else float(len(reqs))


def scale_arrivals(reqs: Sequence[SimRequest], factor: float) -> list[SimRequest]:
    """Arrivals `factor` times as dense (factor 2 = twice the rate)."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"rate factor must be positive and finite, got {factor}")
    return [replace(r, arrival_s=r.arrival_s / factor) for r in reqs]


# Gateway API Inference Extension criticalities as integer priorities (higher = more important,
# < 0 = sheddable), the convention `RequestFeatures.priority` follows.
CLASS_PRIORITY = {"critical": 1, "standard": 0, "sheddable": -1}


def parse_class_mix(text: str) -> dict[str, float]:
    """'critical=0.2,standard=0.5,sheddable=0.3' -> shares normalised to sum to 1."""
    mix: dict[str, float] = {}
    for item in text.split(","):
        name, sep, share = item.strip().partition("=")
        name = name.strip()
        if not sep or name not in CLASS_PRIORITY:
            raise ValueError(f"class mix item {item.strip()!r}: want NAME=SHARE with NAME one of "
                             f"{', '.join(CLASS_PRIORITY)}")
        try:
            value = float(share)
        except ValueError:
            raise ValueError(f"class mix item {item.strip()!r}: SHARE must be a number") from None
        if not (value >= 0 and math.isfinite(value)) or name in mix:
            raise ValueError(f"class mix item {item.strip()!r}: SHARE must be >= 0 and each class given once")
        mix[name] = value
    total = sum(mix.values())
    if not total > 0:
        raise ValueError("class mix: the shares must not all be 0")
    return {k: v / total for k, v in mix.items()}


def assign_classes(reqs: Sequence[SimRequest], mix: dict[str, float], seed: int) -> list[SimRequest]:
    """Each request gets a class drawn from `mix` (seeded; independent of arrival times, so a load
    sweep keeps every request's class) and that class's priority."""
    rng = random.Random(f"classes/{seed}")
    names = list(mix)
    weights = [mix[n] for n in names]
    return [replace(r, klass=k, priority=CLASS_PRIORITY[k])
            for r, k in zip(reqs, rng.choices(names, weights, k=len(reqs)), strict=True)]


def cut(reqs: Sequence[SimRequest], duration_s: float | None) -> list[SimRequest]:
    """Requests arriving before `duration_s` (all when None)."""
    if duration_s is None:
        return list(reqs)
    return [r for r in reqs if r.arrival_s < duration_s]


# ---------------------------------------------------------------------------- synthetic


@dataclass(frozen=True)
class SyntheticSpec:
    arrivals: str = "poisson"        # poisson | gamma
    rate_rps: float = 10.0
    requests: int = 1000
    burstiness: float = 4.0          # gamma: squared coefficient of variation of inter-arrival times
    lengths: str = "lognormal"       # lognormal | pareto
    prompt_mean: float = 1024.0
    output_mean: float = 256.0
    sigma: float = 1.0               # lognormal shape
    alpha: float = 1.8               # pareto shape (> 1)
    max_prompt: int = 16384
    max_output: int = 2048

    def __post_init__(self) -> None:
        if self.arrivals not in ("poisson", "gamma"):
            raise ValueError(f"arrivals must be poisson or gamma, got {self.arrivals!r}")
        if self.lengths not in ("lognormal", "pareto"):
            raise ValueError(f"lengths must be lognormal or pareto, got {self.lengths!r}")
        if not (self.rate_rps > 0 and self.requests >= 1 and self.burstiness > 0 and self.alpha > 1):
            raise ValueError("need rate > 0, requests >= 1, burstiness > 0 and alpha > 1")


def _length(rng: random.Random, spec: SyntheticSpec, mean: float, cap: int) -> int:
    if spec.lengths == "lognormal":
        mu = math.log(mean) - spec.sigma ** 2 / 2
        x = rng.lognormvariate(mu, spec.sigma)
    else:
        xm = mean * (spec.alpha - 1) / spec.alpha
        x = xm * rng.paretovariate(spec.alpha)
    return max(1, min(cap, int(round(x))))


def synthetic_lengths(spec: SyntheticSpec, seed: int) -> list[tuple[int, int]]:
    """(prompt, output) per request; independent of the arrival rate, so a load sweep replays the
    same requests at different rates."""
    rng = random.Random(f"lengths/{seed}")
    return [(_length(rng, spec, spec.prompt_mean, spec.max_prompt), _length(rng, spec, spec.output_mean,
                                                                            spec.max_output))
            for _ in range(spec.requests)]


def unit_gaps(spec: SyntheticSpec, seed: int) -> list[float]:
    """Inter-arrival gaps of a rate-1 process (divide by the rate)."""
    rng = random.Random(f"arrivals/{seed}")
    if spec.arrivals == "poisson":
        return [rng.expovariate(1.0) for _ in range(spec.requests)]
    k = 1.0 / spec.burstiness  # shape; mean k * theta = 1
    return [rng.gammavariate(k, 1.0 / k) for _ in range(spec.requests)]


def synthetic(spec: SyntheticSpec, seed: int) -> list[SimRequest]:
    lengths = synthetic_lengths(spec, seed)
    gaps = unit_gaps(spec, seed)
    out: list[SimRequest] = []
    t = 0.0
    for i, ((p, o), g) in enumerate(zip(lengths, gaps, strict=True)):
        if i:
            t += g / spec.rate_rps
        out.append(SimRequest(i, t, p, o))
    return out
