"""Router overhead benchmark: the real `tidegate router` process in front of an instant upstream.

Layout (Linux, `taskset`): the router alone on `--router-core`; the instant upstream and the load
generator share `--load-core` (both cost far less per request than the router). A real etcd holds
one routing table of `--replicas` entries, all pointing at the upstream. Three measurements:

(a) throughput: `wrk` (closed loop, `--connections`) sends tiny non-streamed chat completions for
    `--duration` s; requests/s, the router's CPU seconds per request (utime + stime from
    /proc/PID/stat) and requests per router CPU second ("per core"), next to wrk straight to the
    upstream (which shows the generator and upstream are not the limit).
(b) added latency: an open-loop client at a fixed `--rate` (evenly spaced sends), alternating
    blocks straight to the upstream and through the router, so machine noise hits both alike;
    P50/P90/P99 of each and the difference.
(c) streaming: `--stream-connections` concurrent streamed requests of `--chunks` SSE chunks, one
    every `--chunk-interval-ms` (so they reach the router one by one, as an engine's tokens do);
    router CPU per chunk, marginal (minus the CPU of a tiny request, spread over the chunks) and
    total.

`--baseline-cmd CMD` starts a second router (e.g. another checkout's `tidegate`) on the same core,
etcd and upstream and measures it alongside: closed-loop runs alternate between the two
(`--rounds N` each, medians reported) and the fixed-rate client's blocks rotate over upstream,
router and baseline, so that a shared machine's noise hits both alike.

`--peer NAME=CMD` (repeatable) measures another project's router the same way, alongside: CMD is
formatted with `{upstream}` (the instant upstream's URL), `{port}` and `{metrics_port}` (free
ports for it: both peers below open a Prometheus listener on a fixed default port), e.g.
`--peer "vllm-router=vllm-router --worker-urls {upstream} --policy round_robin --host 127.0.0.1
--port {port}"`. It is pinned to the router core too, so its figures are per core as well.

Prints a table and writes JSON (`--json`). Without `wrk` on PATH (apt-get install wrk), (a) and
(c) fall back to a Python closed-loop client, which is then likely the limit in (a).

    .venv/bin/python scripts/bench_router.py [--duration 10] [--rate 500] [--json PATH] \\
        [--router-arg=--policy=round_robin ...]

Subcommands `upstream` and `rate` are the helper processes it starts itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
STREAM = {**TINY, "stream": True}
CHAT_PATH = "/v1/chat/completions"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# ---------------------------------------------------------------------------------------------
# The instant upstream: HTTP/1.1 keep-alive on a bare asyncio protocol (uvloop when installed),
# so that it costs a small fraction of what the router does per request.

_COMPLETION = json.dumps({
    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}).encode()
_PLAIN_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
               + str(len(_COMPLETION)).encode() + b"\r\n\r\n")
_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse_chunk(i: int) -> bytes:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
             "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
    return _chunked(b"data: " + json.dumps(chunk).encode() + b"\n\n")


_SSE_TAIL = _chunked(b'data: {"id":"c1","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
                     b'"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n'
                     b"data: [DONE]\n\n") + b"0\r\n\r\n"
_STREAM_FLAG = re.compile(rb'"stream"\s*:\s*true')
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


class _Upstream(asyncio.Protocol):
    def __init__(self, chunks: int, interval_s: float) -> None:
        self._buf = b""
        self._chunks = [_sse_chunk(i) for i in range(chunks)]
        self._interval_s = interval_s
        self._transport: asyncio.Transport | None = None
        self._streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  (uvloop's is no asyncio.Transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while not self._streaming:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            m = _CONTENT_LENGTH.search(self._buf, 0, end + 2)
            total = end + 4 + (int(m.group(1)) if m else 0)
            if len(self._buf) < total:
                return
            body, self._buf = self._buf[end + 4:total], self._buf[total:]
            assert self._transport is not None
            if _STREAM_FLAG.search(body):
                self._streaming = True
                self._transport.write(_SSE_HEAD)
                self._send_chunk(0)
            else:
                self._transport.write(_PLAIN_HEAD + _COMPLETION)

    def _send_chunk(self, i: int) -> None:
        t = self._transport
        if t is None:
            return
        if i == len(self._chunks):
            t.write(_SSE_TAIL)
            self._streaming = False
            self.data_received(b"")  # a pipelined request may wait
            return
        t.write(self._chunks[i])
        asyncio.get_running_loop().call_later(self._interval_s, self._send_chunk, i + 1)


def _use_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def upstream_main(args: argparse.Namespace) -> int:
    _use_uvloop()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Upstream(args.chunks, args.chunk_interval_ms / 1000),
                                          "127.0.0.1", 0, backlog=4096)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()

    asyncio.run(serve())
    return 0


# ---------------------------------------------------------------------------------------------
# Python load generators (the fixed-rate client, and closed loop when wrk is missing).


async def _post(session: Any, url: str, body: bytes) -> int:
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        return resp.status


def rate_main(args: argparse.Namespace) -> int:
    """Open loop at args.rate per second, alternating blocks between the targets; JSON
    {target: [latency seconds, ...]} and the count of failures, into args.out."""
    import aiohttp
    _use_uvloop()
    targets = args.targets.split(",")
    body = json.dumps(TINY).encode()

    async def run() -> dict[str, Any]:
        lat: dict[str, list[float]] = {t: [] for t in targets}
        failures = 0
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False))
        pending: set[asyncio.Task[None]] = set()

        async def one(target: str) -> None:
            nonlocal failures
            t0 = time.perf_counter()
            try:
                status = await _post(session, target + CHAT_PATH, body)
            except Exception:  # noqa: BLE001  (counted and reported, never hidden)
                status = 0
            if status == 200:
                lat[target].append(time.perf_counter() - t0)
            else:
                failures += 1

        # warm the connection pools (not recorded)
        for t in targets:
            for _ in range(20):
                await _post(session, t + CHAT_PATH, body)
        loop = asyncio.get_running_loop()
        period = 1.0 / args.rate
        per_block = max(1, int(args.block_s * args.rate))
        total = int(args.duration * args.rate) * len(targets)
        start = loop.time()
        for i in range(total):
            target = targets[(i // per_block) % len(targets)]
            delay = start + i * period - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(target))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)
        await session.close()
        return {"latency_s": lat, "failures": failures}

    result = asyncio.run(run())
    # To a file, not stdout: through the pipe, some runs' JSON (hundreds of KiB) reached the parent
    # cut at 64 KiB with the client's exit status 0 (not reproduced outside the bench).
    Path(args.out).write_text(json.dumps(result))
    return 0


def closed_main(args: argparse.Namespace) -> int:
    """Closed loop with args.connections workers for args.duration s (the fallback without wrk)."""
    import aiohttp
    _use_uvloop()
    body = json.dumps(STREAM if args.stream else TINY).encode()

    async def run() -> dict[str, Any]:
        done = errors = 0
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        deadline = time.perf_counter() + args.duration

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < deadline:
                try:
                    ok = await _post(session, args.target + CHAT_PATH, body) == 200
                except Exception:  # noqa: BLE001
                    ok = False
                done += ok
                errors += not ok

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.connections)))
        wall = time.perf_counter() - t0
        await session.close()
        return {"requests": done, "errors": errors, "wall_s": wall}

    print(json.dumps(asyncio.run(run())), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The driver.


def _cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _syn_retransmits() -> int:
    """The machine's TCP SYN retransmissions so far (a dropped connect costs a 1 s retransmit)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True)).get("TCPSynRetrans", 0))
    return 0


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _pin(core: int | None) -> list[str]:
    """taskset to `core`, and `nice` at BENCH_NICE when set (--nice: the bench's processes ahead of
    the machine's other work, as on dedicated cores; a negative value needs root)."""
    nice = os.environ.get("BENCH_NICE")
    prefix = ["nice", "-n", nice] if nice else []
    return [*prefix, "taskset", "-c", str(core)] if core is not None and shutil.which("taskset") else prefix


def _output(argv: list[str]) -> str:
    """stdout of a helper command; its stderr in the error when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.wrk = shutil.which("wrk")

    def spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / log, "wb") as err:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            if p.stdout is not None:
                p.stdout.close()

    def start_upstream(self) -> str:
        a = self.args
        p = self.spawn([*_pin(a.load_core), sys.executable, __file__, "upstream", "--chunks", str(a.chunks),
                        "--chunk-interval-ms", str(a.chunk_interval_ms)], "upstream.log")
        line = p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit("upstream did not start: " + (self.tmp / "upstream.log").read_text()[-2000:])
        return f"http://127.0.0.1:{json.loads(line)['port']}"

    def start_router(self, etcd: str, command: str | None, log: str = "router.log") -> tuple[str, int]:
        a = self.args
        cmd = shlex.split(command) if command else [str(Path(sys.executable).with_name("tidegate"))]
        p = self.spawn([*_pin(a.router_core), *cmd, "router", "--etcd", etcd, "--port", "0", "--seed", "1",
                        "--log-json", *a.router_arg], log)
        line = p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SystemExit("router did not start: " + (self.tmp / log).read_text()[-2000:])
        url = f"http://127.0.0.1:{json.loads(line)['port']}"
        deadline = time.monotonic() + 20
        while True:  # ready once /health says the tables are synced
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read())["pools"].get("m", {}).get("routable"):
                        return url, p.pid
            if time.monotonic() > deadline:
                raise SystemExit("router never synced: " + (self.tmp / log).read_text()[-2000:])
            time.sleep(0.1)

    def start_peer(self, name: str, command: str, upstream: str) -> tuple[str, int]:
        """Another project's router in front of the same upstream; ready once it answers a tiny
        request with 200."""
        port, metrics_port = _free_port(), _free_port()  # the peers take no "--port 0"
        log = f"peer-{name}.log"
        argv = shlex.split(command.format(upstream=upstream, port=port, metrics_port=metrics_port))
        p = self.spawn([*_pin(self.args.router_core), *argv], log)
        url = f"http://127.0.0.1:{port}"
        req = urllib.request.Request(url + CHAT_PATH, data=json.dumps(TINY).encode(),
                                     headers={"Content-Type": "application/json"})
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(req, timeout=2) as r:
                    if r.status == 200:
                        return url, p.pid
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"peer {name} did not start: " + (self.tmp / log).read_text()[-2000:])
            time.sleep(0.2)

    def closed_loop(self, url: str, connections: int, duration: float, stream: bool) -> dict[str, Any]:
        """requests, errors, wall_s of a closed-loop run against `url`."""
        if self.wrk:
            script = self.tmp / ("stream.lua" if stream else "tiny.lua")
            body = json.dumps(STREAM if stream else TINY)
            script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                              'wrk.headers["Content-Type"] = "application/json"\n')
            out = _output([*_pin(self.args.load_core), self.wrk, "-t1", f"-c{connections}",
                           f"-d{max(1, round(duration))}s", "-s", str(script), url + CHAT_PATH])
            n = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
            if n is None:
                raise SystemExit("cannot read wrk's output:\n" + out)
            wall = float(n.group(2)) * (0.001 if n.group(3) == "ms" else 1)
            bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
            sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
            errors = (int(bad.group(1)) if bad else 0) + (sum(map(int, sock.groups())) if sock else 0)
            return {"requests": int(n.group(1)), "errors": errors, "wall_s": wall, "client": "wrk"}
        out = _output([*_pin(self.args.load_core), sys.executable, __file__, "closed", "--target", url,
                       "--connections", str(connections), "--duration", str(duration),
                       *(["--stream"] if stream else [])])
        return {**json.loads(out), "client": "python"}

    def measured(self, url: str, pid: int, connections: int, duration: float, stream: bool) -> dict[str, Any]:
        cpu0 = _cpu_s(pid)
        t0 = time.monotonic()
        r = self.closed_loop(url, connections, duration, stream)
        wall = time.monotonic() - t0
        cpu = _cpu_s(pid) - cpu0
        return {**r, "rps": r["requests"] / r["wall_s"], "router_cpu_s": cpu, "router_cpu_frac": cpu / wall,
                "router_cpu_us_per_request": 1e6 * cpu / max(1, r["requests"])}

    def run(self) -> dict[str, Any]:
        from tidegate.etcd_server import EmbeddedEtcd

        a = self.args
        result: dict[str, Any] = {"loadavg_start": _loadavg(), "cores": os.cpu_count(), "config": {
            k: v for k, v in vars(a).items() if k not in ("cmd", "func")}, "client": "wrk" if self.wrk else "python"}
        with EmbeddedEtcd(log_path=self.tmp / "etcd.log") as etcd:
            try:  # from the first start: a failed one must not leave the others running
                upstream = self.start_upstream()
                asyncio.run(_put_table(etcd.endpoint, upstream, a.replicas))
                urls = {"router": self.start_router(etcd.endpoint, a.router_cmd)}
                if a.baseline_cmd:
                    urls["baseline"] = self.start_router(etcd.endpoint, a.baseline_cmd, "baseline.log")
                for spec in a.peer:
                    name, _, command = spec.partition("=")
                    urls[name] = self.start_peer(name, command, upstream)
                for url, _ in urls.values():  # warm-up: connection pools, code paths, the policy's state
                    self.closed_loop(url, a.connections, 2, stream=False)
                phases = set(a.phases.split(","))
                figures: dict[str, dict[str, Any]] = {name: {} for name in urls}
                if "throughput" in phases:
                    direct = self.closed_loop(upstream, a.connections, a.duration, stream=False)
                    result["direct"] = {**direct, "rps": direct["requests"] / direct["wall_s"]}
                    for name, t in self.rounds(urls, a.connections, stream=False).items():
                        figures[name]["throughput"] = t
                if "latency" in phases:
                    for name, lat in self.latency(upstream, urls).items():
                        figures[name]["latency"] = lat
                if "stream" in phases:
                    for name, st in self.rounds(urls, a.stream_connections, stream=True).items():
                        st["router_cpu_us_per_chunk"] = st["router_cpu_us_per_request"] / a.chunks
                        if "throughput" in figures[name]:
                            extra_us = st["router_cpu_us_per_request"] - figures[name]["throughput"][
                                "router_cpu_us_per_request"]
                            st["router_cpu_us_per_chunk_marginal"] = extra_us / a.chunks
                        figures[name]["stream"] = st
                result.update(figures["router"])
                if "baseline" in figures:
                    result["baseline"] = figures["baseline"]
                result["peers"] = {name: figures[name] for name in urls if name not in ("router", "baseline")}
            finally:
                self.close()
        result["loadavg_end"] = _loadavg()
        return result

    def rounds(self, urls: dict[str, tuple[str, int]], connections: int, stream: bool) -> dict[str, dict[str, Any]]:
        """`--rounds` closed-loop runs per router, alternating between the routers (so machine noise
        hits each alike); per router the run with the median CPU per request, and every run's."""
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
        names = list(urls)
        for i in range(self.args.rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                url, pid = urls[name]
                runs[name].append(self.measured(url, pid, connections, self.args.duration, stream))
        out = {}
        for name, rs in runs.items():
            rs.sort(key=lambda r: r["router_cpu_us_per_request"])
            out[name] = {**rs[len(rs) // 2], "rounds_cpu_us_per_request": [r["router_cpu_us_per_request"] for r in rs]}
        return out

    def latency(self, upstream: str, urls: dict[str, tuple[str, int]]) -> dict[str, dict[str, Any]]:
        """The fixed-rate client over the upstream and every router, in alternating blocks."""
        a = self.args
        cpu0 = {name: _cpu_s(pid) for name, (_, pid) in urls.items()}
        t0, syn0 = time.monotonic(), _syn_retransmits()
        targets = [upstream, *(url for url, _ in urls.values())]
        out_path = self.tmp / "rate.json"
        _output([*_pin(a.load_core), sys.executable, __file__, "rate", "--targets", ",".join(targets),
                 "--rate", str(a.rate), "--duration", str(a.latency_duration), "--block-s", str(a.block_s),
                 "--out", str(out_path)])
        wall = time.monotonic() - t0
        data = json.loads(out_path.read_text())

        def stats(xs: list[float]) -> dict[str, Any]:
            return {"n": len(xs), "p50_ms": 1e3 * statistics.median(xs), "p90_ms": 1e3 * _percentile(xs, 0.9),
                    "p99_ms": 1e3 * _percentile(xs, 0.99), "max_ms": 1e3 * max(xs),
                    "over_100ms": sum(1 for x in xs if x > 0.1)}

        direct = stats(data["latency_s"][upstream])
        result = {}
        for name, (url, pid) in urls.items():
            r: dict[str, Any] = {"rate": a.rate, "failures": data["failures"],
                                 "router_cpu_frac": (_cpu_s(pid) - cpu0[name]) / wall,
                                 "syn_retransmits_machine": _syn_retransmits() - syn0,
                                 "direct": direct, "router": stats(data["latency_s"][url])}
            for q in ("p50_ms", "p90_ms", "p99_ms"):
                r["added_" + q] = r["router"][q] - direct[q]
            result[name] = r
        return result


async def _put_table(etcd: str, upstream: str, replicas: int) -> None:
    from tidegate import codec, keys
    from tidegate.store.etcd import EtcdStore
    from tidegate.v1.records_pb2 import RouteEntry, RoutingTable

    t = RoutingTable(pool="m", generation=1, schema_version=1)
    t.computed_at.GetCurrentTime()
    for i in range(replicas):
        t.replicas.append(RouteEntry(replica_id=f"r{i}", endpoint=upstream, weight=1.0, state=2))
    store = EtcdStore([etcd])
    await store.connect()
    try:
        await store.put(keys.table("m"), codec.encode(t))
    finally:
        await store.close()


def _rows(r: dict[str, Any], chunks: int, label: str) -> list[tuple[str, str]]:
    rows = []
    if "throughput" in r:
        t = r["throughput"]
        rows += [
            (f"{label}: tiny requests/s",
             f"{t['rps']:,.0f} (router CPU {100 * t['router_cpu_frac']:.0f}%, {t['errors']} errors)"),
            (f"{label}: router CPU per tiny request", f"{t['router_cpu_us_per_request']:.0f} us"
             + (f" (median of {len(t['rounds_cpu_us_per_request'])})" if len(t["rounds_cpu_us_per_request"]) > 1
                else "")),
            (f"{label}: tiny requests per router CPU second", f"{1e6 / t['router_cpu_us_per_request']:,.0f}"),
        ]
    if "latency" in r:
        lat = r["latency"]
        rows += [
            (f"{label}: latency at {lat['rate']:.0f} rps, P50 / P99",
             f"{lat['router']['p50_ms']:.2f} / {lat['router']['p99_ms']:.2f} ms ({lat['failures']} errors)"),
            (f"{label}: added latency P50 / P99", f"+{lat['added_p50_ms']:.2f} / +{lat['added_p99_ms']:.2f} ms"),
        ]
    if "stream" in r:
        s = r["stream"]
        marginal = s.get("router_cpu_us_per_chunk_marginal")
        rows += [
            (f"{label}: streamed, {chunks} chunks, requests/s",
             f"{s['rps']:,.1f} (router CPU {100 * s['router_cpu_frac']:.0f}%, {s['errors']} errors)"),
            (f"{label}: router CPU per streamed chunk (all / marginal)",
             f"{s['router_cpu_us_per_chunk']:.1f} / " + (f"{marginal:.1f} us" if marginal is not None else "-")),
        ]
    return rows


def report(r: dict[str, Any]) -> str:
    rows = []
    if "direct" in r:
        rows.append(("straight to upstream: tiny requests/s", f"{r['direct']['rps']:,.0f}"))
    if "latency" in r:
        d = r["latency"]["direct"]
        rows.append((f"straight to upstream: latency at {r['latency']['rate']:.0f} rps, P50 / P99",
                     f"{d['p50_ms']:.2f} / {d['p99_ms']:.2f} ms"))
    rows += _rows(r, r["config"]["chunks"], "router")
    if "baseline" in r:
        rows += _rows(r["baseline"], r["config"]["chunks"], "baseline")
    for name, figures in r.get("peers", {}).items():
        rows += _rows(figures, r["config"]["chunks"], name)
    rows.append(("load average start / end", f"{r['loadavg_start']} / {r['loadavg_end']}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    up = sub.add_parser("upstream", help="(internal) the instant upstream")
    up.add_argument("--chunks", type=int, default=50)
    up.add_argument("--chunk-interval-ms", type=float, default=1.0)
    up.set_defaults(func=upstream_main)
    rt = sub.add_parser("rate", help="(internal) the fixed-rate client")
    rt.add_argument("--targets", required=True)
    rt.add_argument("--rate", type=float, default=500)
    rt.add_argument("--duration", type=float, default=20)
    rt.add_argument("--block-s", type=float, default=1.0)
    rt.add_argument("--out", required=True, help="where the JSON goes")
    rt.set_defaults(func=rate_main)
    cl = sub.add_parser("closed", help="(internal) closed-loop client without wrk")
    cl.add_argument("--target", required=True)
    cl.add_argument("--connections", type=int, default=64)
    cl.add_argument("--duration", type=float, default=10)
    cl.add_argument("--stream", action="store_true")
    cl.set_defaults(func=closed_main)

    ap.add_argument("--duration", type=float, default=10, help="seconds of each closed-loop run")
    ap.add_argument("--connections", type=int, default=64, help="wrk connections for the throughput run")
    ap.add_argument("--rate", type=float, default=500, help="requests/s of the added-latency run")
    ap.add_argument("--latency-duration", type=float, default=20,
                    help="seconds of the added-latency run per target (alternating blocks)")
    ap.add_argument("--block-s", type=float, default=1.0, help="length of one direct/router block")
    ap.add_argument("--chunks", type=int, default=50, help="SSE chunks per streamed answer")
    ap.add_argument("--chunk-interval-ms", type=float, default=1.0, help="upstream pause between chunks")
    ap.add_argument("--stream-connections", type=int, default=16, help="concurrent streamed requests")
    ap.add_argument("--replicas", type=int, default=4, help="table entries (all the same upstream)")
    ap.add_argument("--router-core", type=int, default=1)
    ap.add_argument("--load-core", type=int, default=0, help="core of the upstream and load generators")
    ap.add_argument("--router-arg", action="append", default=[],
                    help="extra flag for `tidegate router` (repeat), e.g. --router-arg=--policy=round_robin")
    ap.add_argument("--phases", default="throughput,latency,stream", help="which measurements, comma-separated")
    ap.add_argument("--nice", type=int, help="run router, upstream and load generators at this nice value "
                                          "(e.g. -10, as root: ahead of other work on a shared machine)")
    ap.add_argument("--baseline-cmd", help="a second router, run by this command, measured alongside (its runs "
                                            "alternate with the first's): e.g. another checkout's tidegate")
    ap.add_argument("--peer", action="append", default=[], metavar="NAME=CMD",
                    help="another project's router, measured alongside (repeat); CMD is formatted with "
                         "{upstream}, {port} and {metrics_port}")
    ap.add_argument("--rounds", type=int, default=1, help="closed-loop runs per router (the median is reported)")
    ap.add_argument("--router-cmd", help="command that stands for `tidegate` (default: the venv's), e.g. to "
                                         "compare with another checkout")
    ap.add_argument("--keep-logs", type=Path, help="copy the router's, upstream's and etcd's logs here")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    for spec in getattr(args, "peer", []):
        name, eq, command = spec.partition("=")
        if not eq or not name or not command.strip() or name in ("router", "baseline"):
            ap.error(f"--peer wants NAME=CMD with a NAME other than router or baseline: {spec!r}")
    if getattr(args, "nice", None) is not None:
        os.environ["BENCH_NICE"] = str(args.nice)
    if args.cmd:
        return int(args.func(args))
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        try:
            result = Bench(args, Path(tmp)).run()
        finally:
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for log in Path(tmp).glob("*.log"):
                    shutil.copy(log, args.keep_logs / log.name)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
