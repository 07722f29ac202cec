"""Open-loop trace replay through the router over real HTTP (streamed completions).

Each request is sent at its (scaled) arrival time whatever the fleet's state,
like real users; TTFT is measured to the first streamed token, TPOT as the mean
gap between the later tokens.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from tidegate.fleet.report import RequestResult
from tidegate.fleet.traces import TraceRequest

# Why the router refused a request (429): admission's reasons, budget_exhausted.
REJECT_REASON_HEADER = "x-tidegate-reject-reason"
PRIORITY_HEADER = "x-tidegate-priority"
# One "token" of filler text; the simulator's documented rule counts it as one token.
_WORD = "tok "
# Tokens per prefix hash in traces that carry them (Mooncake's hash_ids stand for 512-token blocks).
TRACE_HASH_BLOCK_TOKENS = 512
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
# Starts a salt's mark: no hash mark starts so (its letters are outside _ALPHABET), so request n's
# own text never reads as the block of trace hash n (Mooncake's hash ids count from 0, like salts).
_SALT_WORD = "SLT "


def _word(n: int) -> str:
    """A 4-byte word (one token by the simulator's rule) naming n modulo 32**3."""
    return "".join(_ALPHABET[(n >> s) & 31] for s in (10, 5, 0)) + " "


def _mark(n: int) -> list[str]:
    """Two words that name n (up to 2**30): enough to make a block of text unique."""
    return [_word(n >> 15), _word(n)]


def make_prompt(tokens: int, salt: int | None = None, prefix_hashes: tuple[int, ...] = ()) -> str:
    """Text that the simulator's token-count rule (ceil(utf-8 bytes / 4)) counts as `tokens`.

    Without `salt` every prompt is the same filler, so every prompt shares its prefix with every
    other one and prefix caches hit on everything. A replay passes a salt per request so that only
    what the trace says is shared is shared: each of the trace's prefix hashes becomes a
    512-token block that starts with words naming the hash, and the rest starts with words naming
    the salt (marked as one, so that it never reads as a hash)."""
    tokens = max(1, tokens)
    if salt is None:
        return _WORD * tokens
    words: list[str] = []
    for h in prefix_hashes:
        if len(words) >= tokens:
            break
        words += _mark(h) + [_WORD] * (TRACE_HASH_BLOCK_TOKENS - 2)
    words = words[:tokens]
    if len(words) < tokens:
        words += [_SALT_WORD, *_mark(salt)]
    return "".join(words[:tokens]) + _WORD * (tokens - len(words))


@dataclass
class Progress:
    sent: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def inflight(self) -> int:
        return self.sent - self.completed - self.failed


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: TraceRequest,
               progress: Progress, timeout_s: float, sent_s: float = 0.0, klass: str = "",
               seq: int = 0) -> RequestResult:
    body = {
        "model": model,
        "prompt": make_prompt(req.prompt_tokens, seq, req.prefix_hashes),
        "max_tokens": req.output_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    t0 = time.perf_counter()
    first: float | None = None
    last: float | None = None
    tokens = 0
    try:
        async with session.post(url + "/v1/completions", json=body, headers={PRIORITY_HEADER: klass} if klass else None,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                await resp.read()
                return _fail(progress, f"http {resp.status}", resp.status, sent_s, klass,
                             resp.headers.get(REJECT_REASON_HEADER, ""))
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    data = event.strip()
                    if not data.startswith(b"data:"):
                        continue
                    data = data[5:].strip()
                    if data == b"[DONE]":
                        continue
                    msg = json.loads(data)
                    if "error" in msg:
                        return _fail(progress, "stream error", 200, sent_s, klass)
                    for choice in msg.get("choices", []):
                        if choice.get("text"):
                            now = time.perf_counter()
                            first = now if first is None else first
                            last = now
                            tokens += 1
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        return _fail(progress, type(exc).__name__, 0, sent_s, klass)
    if first is None or tokens < req.output_tokens:
        return _fail(progress, "short stream", 200, sent_s, klass)
    progress.completed += 1
    tpot = (last - first) / (tokens - 1) if last is not None and tokens > 1 else None
    return RequestResult(ok=True, ttft_s=first - t0, tpot_s=tpot, output_tokens=tokens, status=200, sent_s=sent_s,
                         klass=klass)


def _fail(progress: Progress, error: str, status: int, sent_s: float, klass: str,
          reason: str = "") -> RequestResult:
    progress.failed += 1
    return RequestResult(ok=False, ttft_s=None, tpot_s=None, output_tokens=0, error=error, status=status,
                         sent_s=sent_s, reason=reason, klass=klass)


async def replay(url: str, model: str, trace: Sequence[TraceRequest], *, time_scale: float,
                 duration_s: float, request_timeout_s: float = 300.0,
                 on_tick: Callable[[Progress, float], None] | None = None,
                 classes: Sequence[str] | None = None) -> tuple[list[RequestResult], int]:
    """Send `trace` with arrivals divided by `time_scale`, stopping new sends after
    `duration_s`, then wait for what is in flight. Returns results and the count sent.
    `classes[i]`, when given, is request i's priority class (sent as x-tidegate-priority)."""
    progress = Progress()
    tasks: list[asyncio.Task[RequestResult]] = []
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def ticker() -> None:
            while True:
                await asyncio.sleep(1.0)
                if on_tick:
                    on_tick(progress, time.perf_counter() - start)

        tick = asyncio.create_task(ticker())
        try:
            for i, req in enumerate(trace):
                at = req.arrival_s / time_scale
                if at > duration_s:
                    break
                delay = at - (time.perf_counter() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                progress.sent += 1
                tasks.append(asyncio.create_task(_one(session, url, model, req, progress, request_timeout_s,
                                                      time.perf_counter() - start,
                                                      classes[i] if classes is not None else "", i)))
            results = list(await asyncio.gather(*tasks))
        finally:
            tick.cancel()
    return results, progress.sent


def progress_printer(duration_s: float) -> Callable[[Progress, float], None]:
    tty = sys.stderr.isatty()
    last_line = [0.0]

    def show(p: Progress, elapsed: float) -> None:
        phase = "sending" if elapsed <= duration_s else "draining"
        line = (f"[{elapsed:5.0f}s/{duration_s:.0f}s {phase}] sent {p.sent}  completed {p.completed}"
                f"  failed {p.failed}  in flight {p.inflight}")
        if tty:
            print("\r" + line + " " * 8, end="", file=sys.stderr, flush=True)
        elif elapsed - last_line[0] >= 10:
            last_line[0] = elapsed
            print(line, file=sys.stderr, flush=True)

    return show
