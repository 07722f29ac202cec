"""Request traces for replay: the Azure LLM inference CSV (shipped sample or any file).

A trace is a list of `TraceRequest(arrival_s, prompt_tokens, output_tokens)` with
arrivals relative to the first request.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path


class TraceError(ValueError):
    """A trace file is missing, empty or malformed; the message names the line."""


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()


def shipped_sample() -> Path:
    return Path(str(resources.files("tidegate") / "data" / "azure_conv_sample.csv"))


def _parse_ts(text: str) -> float:
    # Azure timestamps carry 7 fractional digits; datetime takes at most 6.
    head, _, frac = text.strip().partition(".")
    dt = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def load_azure_csv(path: Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
            if reader.fieldnames is None or not need <= set(reader.fieldnames):
                raise TraceError(f"{path}: expected columns {sorted(need)}, got {reader.fieldnames}")
            t0 = None
            for lineno, row in enumerate(reader, start=2):
                try:
                    t = _parse_ts(row["TIMESTAMP"])
                    p, o = int(row["ContextTokens"]), int(row["GeneratedTokens"])
                except (ValueError, TypeError) as exc:
                    raise TraceError(f"{path}:{lineno}: {exc}") from None
                if p < 1 or o < 0:
                    raise TraceError(f"{path}:{lineno}: token counts must be positive")
                t0 = t if t0 is None else t0
                out.append(TraceRequest(t - t0, p, max(1, o)))
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    if not out:
        raise TraceError(f"{path}: no requests")
    out.sort(key=lambda r: r.arrival_s)
    return out


def load_mooncake_jsonl(path: Path) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    out.append(TraceRequest(float(row["timestamp"]) / 1000.0, int(row["input_length"]),
                                            max(1, int(row["output_length"])),
                                            tuple(int(h) for h in row.get("hash_ids", ()))))
                except (ValueError, KeyError, TypeError) as exc:
                    raise TraceError(f"{path}:{lineno}: {exc}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    if not out:
        raise TraceError(f"{path}: no requests")
    t0 = min(r.arrival_s for r in out)
    return sorted((TraceRequest(r.arrival_s - t0, r.prompt_tokens, r.output_tokens, r.prefix_hashes)
                   for r in out), key=lambda r: r.arrival_s)


def load(path: Path) -> list[TraceRequest]:
    """By extension: .jsonl is Mooncake-style, anything else the Azure CSV."""
    return load_mooncake_jsonl(path) if path.suffix == ".jsonl" else load_azure_csv(path)
