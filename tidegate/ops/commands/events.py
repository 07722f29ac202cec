"""`tidegate events [--follow] [--replica ID]`: the audit trail (who did what, and why)."""

from __future__ import annotations

import argparse
import asyncio
import json

from tidegate.aio import cancel_and_wait
from tidegate.ops import exitcodes, render
from tidegate.ops.commands.base import Context, add_common_flags, execute
from tidegate.v1 import records_pb2


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--follow", action="store_true",
                        help="Keep printing new events until interrupted (JSON: one object per line).")
    parser.add_argument("--replica", default="", metavar="ID", help="Only events of this replica.")
    parser.add_argument("--limit", type=int, default=100, help="At most this many past events (default 100).")
    add_common_flags(parser)


async def _events(ctx: Context) -> int:
    a = ctx.args
    json_out = a.output == "json"
    resp = await ctx.client.list_events(a.replica, a.limit)
    events = list(resp.events)
    if not a.follow:
        ctx.out(render.dumps(render.events_json(events)) if json_out else render.events_table(events))
        return exitcodes.OK

    seen = {render.event_key(e) for e in events}

    def emit(e: records_pb2.Event) -> None:
        ctx.out(json.dumps(render.event_json(e), sort_keys=True) if json_out else render.event_line(e))

    for e in sorted(events, key=lambda e: (e.at.seconds, e.at.nanos)):
        emit(e)

    async def consume() -> None:
        async for e in ctx.client.watch_events(a.replica):
            k = render.event_key(e)
            if k not in seen:
                seen.add(k)
                emit(e)

    task = asyncio.create_task(consume())
    stopper = asyncio.create_task(ctx.stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    await cancel_and_wait({task, stopper} - done)
    if task in done:
        task.result()  # raises AdminError (auth, ...) for the caller to map
    return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    return execute(args, _events)
