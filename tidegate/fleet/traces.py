"""Request traces for replay, in the formats public LLM traces are published in:

- Azure LLM inference CSV, `TIMESTAMP,ContextTokens,GeneratedTokens`: the 2023 release
  (Splitwise; naive wall-clock timestamps with 7 fractional digits) and the 2024 week-long
  release (DynamoLLM; timestamps with a UTC offset, e.g. `2024-05-10 00:00:00.009930+00:00`);
- BurstGPT CSV, `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`
  (seconds from the trace's start; failed requests carry 0 response tokens);
- Mooncake JSONL, `{"timestamp": ms, "input_length", "output_length", "hash_ids"}` (the
  FAST'25 release's conversation, tool-agent and synthetic traces alike).

A trace is a list of `TraceRequest(arrival_s, prompt_tokens, output_tokens)` with arrivals
relative to the first request. Token counts of 0 (a request the trace logged without a prompt
or an answer) replay as 1 token, so no row is dropped; a negative or non-numeric one is an error
that names its line.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from itertools import islice
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
    """Seconds since the epoch of an Azure timestamp. A timestamp without an offset (the 2023
    release) is read as UTC, not local time, so that a replay does not depend on the machine's
    zone (a daylight-saving change inside a trace would otherwise move its arrivals by an hour)."""
    dt = datetime.fromisoformat(text.strip())
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def _tokens(value: object) -> int:
    """A token count from a CSV cell or a JSON number, "374" or "374.0" alike (tables re-saved by
    pandas carry floats); 0 replays as 1 (see the module's docstring)."""
    x = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
    if not (math.isfinite(x) and x >= 0 and x == int(x)):
        raise ValueError(f"token count {value!r} is not a whole number >= 0")
    return max(1, int(x))


def _load_csv(path: Path, columns: tuple[str, str, str], ts: Callable[[str], float],
              limit: int | None = None) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or not set(columns) <= {c.strip() for c in reader.fieldnames}:
                raise TraceError(f"{path}: expected columns {list(columns)}, got {reader.fieldnames}")
            reader.fieldnames = [c.strip() for c in reader.fieldnames]
            t_col, p_col, o_col = columns
            for lineno, row in enumerate(islice(reader, limit), start=2):
                try:
                    t = ts(row[t_col])
                    p, o = _tokens(row[p_col]), _tokens(row[o_col])
                except (ValueError, TypeError) as exc:
                    raise TraceError(f"{path}:{lineno}: {exc}") from None
                out.append(TraceRequest(t, p, o))
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None
    if not out:
        raise TraceError(f"{path}: no requests")
    # Arrivals relative to the earliest (a trace need not be sorted; until here they are absolute
    # times); the sort is stable, so requests logged at the same instant keep their order.
    t_min = min(r.arrival_s for r in out)
    return sorted((TraceRequest(r.arrival_s - t_min, r.prompt_tokens, r.output_tokens) for r in out),
                  key=lambda r: r.arrival_s)


def _seconds(value: str | float) -> float:
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"timestamp {value!r} is not finite")
    return x


def load_azure_csv(path: Path, limit: int | None = None) -> list[TraceRequest]:
    return _load_csv(path, AZURE_COLUMNS, _parse_ts, limit)


def load_burstgpt_csv(path: Path, limit: int | None = None) -> list[TraceRequest]:
    return _load_csv(path, BURSTGPT_COLUMNS, _seconds, limit)


def load_mooncake_jsonl(path: Path, limit: int | None = None) -> list[TraceRequest]:
    out: list[TraceRequest] = []
    try:
        with open(path) as f:
            for lineno, line in enumerate(f, start=1):
                if limit is not None and len(out) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    out.append(TraceRequest(_seconds(row["timestamp"]) / 1000.0, _tokens(row["input_length"]),
                                            _tokens(row["output_length"]),
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


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="") as f:
            return [c.strip() for c in next(csv.reader([f.readline()]), [])]
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from None


def load(path: Path, limit: int | None = None) -> list[TraceRequest]:
    """By extension and header: .jsonl is Mooncake-style; a CSV with BurstGPT's columns is
    BurstGPT; any other CSV must be Azure's (the error names the columns expected).

    `limit`: read only the file's first `limit` requests. The published traces are in time order,
    so these are its earliest; the week-long Azure files hold tens of millions of rows, which
    read whole would take minutes and gigabytes to replay a few thousand."""
    if path.suffix == ".jsonl":
        return load_mooncake_jsonl(path, limit)
    if set(BURSTGPT_COLUMNS) <= set(_header(path)):
        return load_burstgpt_csv(path, limit)
    return load_azure_csv(path, limit)
