"""`tidegate top`: a live view of pools and replicas, refreshed every second."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from rich.console import Console
from rich.live import Live

from tidegate.ops import exitcodes, topview
from tidegate.ops.client import AdminError
from tidegate.ops.commands.base import Context, add_common_flags, execute, sleep_or_stop, usage_error
from tidegate.ops.durations import parse_duration
from tidegate.v1 import admin_pb2


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", default="1s", help="Refresh period (default 1s).")
    parser.add_argument("--once", action="store_true", help="Print one frame and exit (for scripts and tests).")
    add_common_flags(parser, output=())


async def _top(ctx: Context) -> int:
    tty = sys.stdout.isatty()
    # Not a terminal: no colour codes and a fixed width, so the output is plain and stable.
    console = Console(width=None if tty else 200, no_color=not tty, highlight=False)
    pools = admin_pb2.ListPoolsResponse()
    replicas = admin_pb2.ListReplicasResponse()

    async def fetch() -> admin_pb2.ListReplicasResponse:
        nonlocal pools, replicas
        pools = await ctx.client.list_pools()
        replicas = await ctx.client.list_replicas()
        return replicas

    def header(error: str = "") -> str:
        now = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        leader = "leader" if replicas.leader else "standby"
        return f"tidegate top  {now} UTC  control plane {replicas.controlplane_id or '?'} ({leader}) " \
               f"at {ctx.client.address}"

    if ctx.args.once:
        await fetch()
        console.print(topview.frame(pools, replicas, header=header(), width=console.width))
        return exitcodes.OK

    with Live(topview.frame(pools, replicas, header="connecting..."), console=console,
              refresh_per_second=4, screen=tty, transient=False) as live:
        while True:
            error = ""
            try:
                await fetch()
            except AdminError as e:
                if e.exit_code in (exitcodes.AUTH, exitcodes.USAGE):
                    raise
                error = str(e)  # keep the last frame and say the data is stale
            live.update(topview.frame(pools, replicas, header=header(), error=error, width=console.width))
            if await sleep_or_stop(ctx.stop, ctx.args.interval_s):
                return exitcodes.OK


def run(args: argparse.Namespace) -> int:
    try:
        args.interval_s = parse_duration(args.interval)
    except ValueError as e:
        return usage_error(args, str(e))
    if args.interval_s <= 0:
        return usage_error(args, "--interval must be positive")
    return execute(args, _top)
